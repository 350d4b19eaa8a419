/* The floor of a design where calls pass through a middle process: a relay
 * that does nothing but move bytes between its callers and a worker
 * process, the way Staccato's engine sits between a client and a
 * function's worker. What it costs over `plain` (or over a pipe round trip)
 * is what the extra process costs on this machine before any FaaS work:
 * two more context switches, two pipe transfers, the relay's waits.
 *
 *   relay http PORT
 *       An HTTP/1.1 keep-alive server on loopback: each request head is
 *       sent to the worker as a 64-byte message on a pipe; the worker's
 *       64-byte reply, read back through the same epoll set, becomes an
 *       empty 200. Measure it with `alternate`, beside `plain`.
 *   relay pipe CALLS
 *       Three processes on pipes, no sockets: a caller writes 64 bytes to
 *       the relay, the relay to the worker, and back. Prints p50/p99 of
 *       the caller's round trips, and of a direct caller-worker round trip
 *       (two processes, the pipe floor) measured in turn with it.
 *
 * Both wait as Staccato's engine does when nothing spins: a blocking
 * epoll_wait, which a middle process serving many callers needs.
 * `staccato bench micro` measures relays of its own (crates/bench/src/
 * floor.rs) that block on one read at a time instead: less than any
 * multiplexing relay can do. Pin with taskset to compare on one vCPU.
 */
#define _GNU_SOURCE
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"

#define MSG 64

static int full(ssize_t r) { return r == MSG; }

/* Reads MSG bytes from `in`, writes them to `out`, until end of file. */
static void echo(int in, int out) {
    char m[MSG];
    while (full(read(in, m, MSG)))
        if (!full(write(out, m, MSG))) break;
    _exit(0);
}

/* Forks an echo process; *to and *from are the parent's ends. The echo
 * keeps no other descriptor of its parent's, so each pipe ends when the
 * process that uses it does. */
static void spawn_echo(int *to, int *from) {
    int a[2], b[2];
    if (pipe(a) || pipe(b)) { perror("pipe"); exit(1); }
    pid_t pid = fork();
    if (pid < 0) { perror("fork"); exit(1); }
    if (pid == 0) {
        for (int fd = 3; fd < 1024; fd++)
            if (fd != a[0] && fd != b[1]) close(fd);
        echo(a[0], b[1]);
    }
    close(a[0]);
    close(b[1]);
    *to = a[1];
    *from = b[0];
}

static int http(int port) {
    int to_worker, from_worker;
    spawn_echo(&to_worker, &from_worker);
    int ep, l = listen_loopback(port, &ep);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = from_worker};
    epoll_ctl(ep, EPOLL_CTL_ADD, from_worker, &ev);
    static const char resp[] = "HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
    static char buf[65536];
    /* One worker, one call at a time: the connection waiting for it. */
    int waiting = -1;
    for (;;) {
        struct epoll_event evs[64];
        int n = epoll_wait(ep, evs, 64, -1);
        for (int i = 0; i < n; i++) {
            int fd = evs[i].data.fd;
            if (fd == l) {
                accept_into(l, ep);
            } else if (fd == from_worker) {
                char m[MSG];
                if (!full(read(from_worker, m, MSG))) return 1;
                if (waiting >= 0 && write(waiting, resp, sizeof resp - 1) < 0) close(waiting);
                waiting = -1;
            } else {
                ssize_t r = read(fd, buf, sizeof buf - 1);
                if (r <= 0) {
                    if (fd == waiting) waiting = -1; /* its answer goes nowhere */
                    close(fd);
                    continue;
                }
                /* For closed-loop clients whose requests each arrive in
                 * one read (as `alternate` sends them): one request at a
                 * time, one read each. */
                char m[MSG] = {0};
                memcpy(m, buf, r < MSG ? (size_t)r : MSG);
                waiting = fd;
                if (!full(write(to_worker, m, MSG))) return 1;
            }
        }
    }
}

/* The relay of `relay pipe`: callers' messages to the worker and back. */
static void pipe_relay(int from_caller, int to_caller) {
    int to_worker, from_worker;
    spawn_echo(&to_worker, &from_worker);
    int ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = from_caller};
    epoll_ctl(ep, EPOLL_CTL_ADD, from_caller, &ev);
    ev.data.fd = from_worker;
    epoll_ctl(ep, EPOLL_CTL_ADD, from_worker, &ev);
    char m[MSG];
    for (;;) {
        struct epoll_event evs[8];
        int n = epoll_wait(ep, evs, 8, -1);
        for (int i = 0; i < n; i++) {
            int fd = evs[i].data.fd;
            if (!full(read(fd, m, MSG))) {
                close(to_worker);
                wait(NULL);
                _exit(0);
            }
            if (!full(write(fd == from_caller ? to_worker : to_caller, m, MSG))) _exit(1);
        }
    }
}

static int pipes(int calls) {
    int a[2], b[2];
    if (pipe(a) || pipe(b)) { perror("pipe"); return 1; }
    pid_t relay = fork();
    if (relay < 0) { perror("fork"); return 1; }
    if (relay == 0) {
        close(a[1]);
        close(b[0]);
        pipe_relay(a[0], b[1]);
    }
    close(a[0]);
    close(b[1]);
    int to_relay = a[1], from_relay = b[0], to_echo, from_echo;
    spawn_echo(&to_echo, &from_echo);
    double *via = calloc(calls, sizeof(double)), *direct = calloc(calls, sizeof(double));
    char m[MSG] = {1};
    for (int i = -calls / 10; i < calls; i++) {
        double t0 = now_us();
        if (!full(write(to_relay, m, MSG)) || !full(read(from_relay, m, MSG))) return 1;
        double t1 = now_us();
        if (!full(write(to_echo, m, MSG)) || !full(read(from_echo, m, MSG))) return 1;
        double t2 = now_us();
        if (i >= 0) {
            via[i] = t1 - t0;
            direct[i] = t2 - t1;
        }
    }
    qsort(via, calls, sizeof(double), cmp_double);
    qsort(direct, calls, sizeof(double), cmp_double);
    printf("through a relay process  p50 %6.2f  p99 %6.2f  n %d\n", rank(via, calls, 500), rank(via, calls, 990), calls);
    printf("direct (two processes)   p50 %6.2f  p99 %6.2f  n %d\n", rank(direct, calls, 500), rank(direct, calls, 990),
           calls);
    close(to_relay);
    close(to_echo);
    while (wait(NULL) > 0) {}
    return 0;
}

int main(int argc, char **argv) {
    signal(SIGPIPE, SIG_IGN);
    if (argc == 3 && strcmp(argv[1], "http") == 0) return http(atoi(argv[2]));
    if (argc == 3 && strcmp(argv[1], "pipe") == 0 && atoi(argv[2]) > 0) return pipes(atoi(argv[2]));
    fprintf(stderr, "usage: relay http PORT | relay pipe CALLS\n");
    return 2;
}
