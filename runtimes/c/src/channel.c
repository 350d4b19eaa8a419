/* channel.c - FIFO channel I/O; see channel.h. */
#include "channel.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

_Static_assert(STC_MSG_LEN <= PIPE_BUF, "message writes must be atomic");


uint64_t stc_mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

uint64_t stc_realtime_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

int stc_chan_path(char *buf, size_t cap, const char *dir, uint32_t id, const char *suffix)
{
    int n = snprintf(buf, cap, "%s/%u.%s", dir, (unsigned)id, suffix);
    if (n < 0 || (size_t)n >= cap) {
        errno = ENAMETOOLONG;
        return -1;
    }
    return 0;
}

int stc_chan_open(stc_chan *c, const char *ipc_dir, uint32_t id, long spin_us)
{
    char path[PATH_MAX];
    c->rfd = c->wfd = -1;
    c->spin_us = spin_us;
    c->last_wait_ns = 0;
    c->spin_yields = 0;
    /* Opened blocking as the protocol says (the engine holds e2w O_RDWR, so
     * this returns at once); switched to O_NONBLOCK only if receives spin. */
    if (stc_chan_path(path, sizeof path, ipc_dir, id, "e2w") < 0)
        return -1;
    c->rfd = open(path, O_RDONLY | O_CLOEXEC);
    if (c->rfd < 0)
        return -1;
    /* Without spinning, a plain blocking read() is the cheapest wait: one
     * syscall per message instead of read/EAGAIN, poll, read. */
    if (spin_us > 0) {
        int fl = fcntl(c->rfd, F_GETFL);
        if (fl < 0 || fcntl(c->rfd, F_SETFL, fl | O_NONBLOCK) < 0)
            goto fail;
    }
    if (stc_chan_path(path, sizeof path, ipc_dir, id, "w2e") < 0)
        goto fail;
    c->wfd = open(path, O_WRONLY | O_CLOEXEC);
    if (c->wfd < 0)
        goto fail;
    return 0;
fail:;
    int saved = errno;
    stc_chan_close(c);
    errno = saved;
    return -1;
}

void stc_chan_close(stc_chan *c)
{
    if (c->rfd >= 0)
        close(c->rfd);
    if (c->wfd >= 0)
        close(c->wfd);
    c->rfd = c->wfd = -1;
}

/* read() that keeps retrying on EAGAIN for up to spin_us microseconds, so a
 * reply arriving soon is picked up without the cost of sleeping in poll()
 * and being woken.  Returns like read(); -1/EAGAIN once the spin is over. */
static ssize_t read_spinning(int fd, void *buf, size_t len, long spin_us, uint64_t *yields)
{
    ssize_t n = read(fd, buf, len);
    if (n >= 0 || errno != EAGAIN || spin_us <= 0)
        return n;
    uint64_t end = stc_mono_ns() + (uint64_t)spin_us * 1000u;
    for (;;) {
        /* Yield, not pause: the message we wait for is usually produced on
         * this same vCPU (by the engine or the callee), so give it the CPU;
         * when nothing else is runnable, yield returns at once and this
         * vCPU stays awake instead of halting (a wake-up IPI costs ~20 us
         * on this kind of guest). */
        sched_yield();
        ++*yields;
        n = read(fd, buf, len);
        if (n >= 0 || errno != EAGAIN)
            return n;
        /* Each pass yields (a syscall), so reading the clock every pass is
         * cheap in comparison and keeps the spin within spin_us. */
        if (stc_mono_ns() >= end) {
            errno = EAGAIN;
            return -1;
        }
    }
}

static int wait_readable(int fd)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    for (;;) {
        int r = poll(&p, 1, -1);
        if (r >= 0)
            return 0; /* readable or hung up: the next read() tells which */
        if (errno != EINTR)
            return -1;
    }
}

/* A receive spins only while messages come quickly: when the last one took
 * more than SPIN_QUIET_X times the spin budget to arrive, the next receive
 * blocks at once.  At a low rate a spin catches nothing, and it does harm:
 * a worker still spinning after its reply keeps the engine's vCPU busy when
 * the engine answers the client, so the kernel wakes the client on another
 * vCPU, and each call then wakes a halted vCPU twice (BENCHMARKS.md, "On an
 * Intel guest"). */
#define SPIN_QUIET_X 10u

int stc_chan_recv(stc_chan *c, uint8_t msg[STC_MSG_LEN])
{
    size_t got = 0;
    long spin = c->spin_us;
    uint64_t t0 = 0;
    if (spin > 0) {
        if (c->last_wait_ns > (uint64_t)spin * 1000u * SPIN_QUIET_X)
            spin = 0;
        t0 = stc_mono_ns();
    }
    while (got < STC_MSG_LEN) {
        ssize_t n = read_spinning(c->rfd, msg + got, STC_MSG_LEN - got, spin, &c->spin_yields);
        spin = 0; /* spin once per message; after blocking the data is there */
        if (n > 0) {
            got += (size_t)n;
        } else if (n == 0) {
            if (got == 0)
                return 0;
            errno = EPROTO; /* writer vanished mid-message */
            return -1;
        } else if (errno == EAGAIN) {
            if (wait_readable(c->rfd) < 0)
                return -1;
        } else if (errno != EINTR) {
            return -1;
        }
    }
    if (c->spin_us > 0)
        c->last_wait_ns = stc_mono_ns() - t0;
    return 1;
}

int stc_chan_send(stc_chan *c, uint8_t msg[STC_MSG_LEN])
{
    stc_set_send_ts(msg, stc_mono_ns());
    for (;;) {
        ssize_t n = write(c->wfd, msg, STC_MSG_LEN);
        if (n == (ssize_t)STC_MSG_LEN)
            return 0;
        if (n < 0 && errno == EINTR)
            continue;
        if (n >= 0)
            errno = EIO; /* short write: impossible for <= PIPE_BUF on a pipe */
        return -1;
    }
}
