/*
 * bench_engine.c - measures the internal-call latency of staccato-c-host
 * without the real engine.  It plays a minimal engine in C: starts the host
 * with build/test_handler.so, creates workers 1 and 2, dispatches
 * "!bench:N:nop" to worker 1 and forwards each of its Invokes to worker 2 as
 * a Dispatch (and the Completion back), i.e. the same four FIFO hops as a
 * real internal call.  Everything is pinned to one CPU to model one vCPU.
 *
 * Usage: bench_engine HOST HANDLER_SO [CALLS [SPIN_US]]
 * Prints the handler's own measurement: calls=N p50_ns=.. p90_ns=.. ...
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "wire.h"

typedef struct {
    int e2w, w2e;
    uint32_t id;
} chan;

static char ipc[256];
static pid_t host_pid;

static void die(const char *what)
{
    fprintf(stderr, "bench_engine: %s: %s\n", what, strerror(errno));
    if (host_pid > 0)
        kill(host_pid, SIGKILL); /* its workers follow (PR_SET_PDEATHSIG) */
    exit(1);
}

static chan make_chan(uint32_t id)
{
    char e2w[300], w2e[300];
    snprintf(e2w, sizeof e2w, "%s/%u.e2w", ipc, (unsigned)id);
    snprintf(w2e, sizeof w2e, "%s/%u.w2e", ipc, (unsigned)id);
    if (mkfifo(e2w, 0600) < 0 || mkfifo(w2e, 0600) < 0)
        die("mkfifo");
    chan c = {open(e2w, O_RDWR | O_CLOEXEC), open(w2e, O_RDONLY | O_NONBLOCK | O_CLOEXEC), id};
    if (c.e2w < 0 || c.w2e < 0)
        die("open fifo");
    return c;
}

static void send_msg(chan *c, stc_header h, const void *inline_bytes)
{
    uint8_t msg[STC_MSG_LEN];
    if (h.kind != STC_CREATE_WORKER)
        h.worker_id = c->id;
    if (stc_encode(&h, inline_bytes, msg) != STC_WIRE_OK)
        die("encode");
    if (write(c->e2w, msg, sizeof msg) != (ssize_t)sizeof msg)
        die("write");
}

/* Blocking receive (the engine sleeps in epoll; poll is the same here). */
static void recv_msg(chan *c, uint8_t msg[STC_MSG_LEN], stc_header *h)
{
    struct pollfd p = {.fd = c->w2e, .events = POLLIN};
    for (;;) {
        ssize_t n = read(c->w2e, msg, STC_MSG_LEN);
        if (n == (ssize_t)STC_MSG_LEN)
            break;
        if (n == 0) {
            errno = EPIPE;
            die("worker closed its channel");
        }
        if (n > 0 || errno != EAGAIN)
            die("read");
        if (poll(&p, 1, 5000) == 0) {
            errno = ETIMEDOUT;
            die("waiting for a message");
        }
    }
    if (stc_decode(msg, STC_MSG_LEN, h) != STC_WIRE_OK)
        die("decode");
}

/* poll() reports nothing on a FIFO that never had a writer, unlike read(). */
static void wait_first(chan *c)
{
    struct pollfd p = {.fd = c->w2e, .events = POLLIN};
    if (poll(&p, 1, 5000) != 1) {
        errno = ETIMEDOUT;
        die("waiting for a hello");
    }
}

static pid_t start_host(const char *host, const char *handler, const char *spin)
{
    pid_t pid = fork();
    if (pid == 0) {
        setenv("STACCATO_FUNCTION", "bench", 1);
        setenv("STACCATO_IPC_DIR", ipc, 1);
        setenv("STACCATO_HANDLER", handler, 1);
        setenv("STACCATO_SPIN_US", spin, 1);
        execl(host, host, (char *)NULL);
        _exit(127);
    }
    return pid;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s HOST HANDLER_SO [CALLS [SPIN_US]]\n", argv[0]);
        return 2;
    }
    const char *calls = argc > 3 ? argv[3] : "20000";
    const char *spin = argc > 4 ? argv[4] : "0";
    char handler[4096];
    if (realpath(argv[2], handler) == NULL)
        die(argv[2]);

    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(0, &one);
    if (sched_setaffinity(0, sizeof one, &one) < 0) /* inherited by the host and its workers */
        die("sched_setaffinity");

    char tmpl[] = "/tmp/staccato-bench-XXXXXX";
    if (mkdtemp(tmpl) == NULL)
        die("mkdtemp");
    snprintf(ipc, sizeof ipc, "%s/bench", tmpl);
    char shm[300];
    snprintf(shm, sizeof shm, "%s/shm", ipc);
    if (mkdir(ipc, 0700) < 0 || mkdir(shm, 0700) < 0)
        die("mkdir");

    chan ch0 = make_chan(0), w1 = make_chan(1), w2 = make_chan(2);
    pid_t host = host_pid = start_host(argv[1], handler, spin);
    uint8_t msg[STC_MSG_LEN];
    stc_header h;
    wait_first(&ch0);
    recv_msg(&ch0, msg, &h); /* LauncherHello */
    /* A worker's w2e reads as end of file until the worker opens it, so
     * wait for it to be readable before the first read. */
    send_msg(&ch0, (stc_header){.kind = STC_CREATE_WORKER, .worker_id = 1}, NULL);
    wait_first(&w1);
    recv_msg(&w1, msg, &h);
    send_msg(&ch0, (stc_header){.kind = STC_CREATE_WORKER, .worker_id = 2}, NULL);
    wait_first(&w2);
    recv_msg(&w2, msg, &h);

    char cmd[64];
    int cmd_len = snprintf(cmd, sizeof cmd, "!bench:%s:nop", calls);
    uint64_t bench_id = 1ull << 63 | 1;
    send_msg(&w1, (stc_header){.kind = STC_DISPATCH, .call_id = bench_id, .payload_len = (uint32_t)cmd_len}, cmd);
    for (;;) {
        recv_msg(&w1, msg, &h);
        if (h.kind != STC_INVOKE)
            break;
        /* Forward the Invoke to worker 2, and its result back to worker 1. */
        stc_header inv = h;
        send_msg(&w2, (stc_header){.kind = STC_DISPATCH, .call_id = inv.call_id, .parent_call_id = inv.parent_call_id},
                 NULL);
        recv_msg(&w2, msg, &h);
        send_msg(&w1, (stc_header){.kind = STC_COMPLETION, .call_id = inv.call_id}, NULL);
    }
    if (h.kind == STC_COMPLETION)
        printf("spin_us=%s %.*s\n", spin, (int)h.payload_len, (const char *)msg + STC_HEADER_LEN);
    else
        printf("bench failed: %.*s\n", (int)h.payload_len, (const char *)msg + STC_HEADER_LEN);

    close(ch0.e2w); /* the launcher exits, its workers die with it */
    waitpid(host, NULL, 0);
    char rm[400];
    snprintf(rm, sizeof rm, "rm -rf '%s'", tmpl);
    return system(rm) == 0 && h.kind == STC_COMPLETION ? 0 : 1;
}
