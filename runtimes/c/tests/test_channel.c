/*
 * test_channel.c - how a receive waits (src/channel.c): it spins only while
 * messages come quickly.  A writer thread plays the engine, sending one
 * message after each of a list of gaps; the channel's count of spin passes
 * tells which receives spun.  Usage: test_channel.  Last line: "N passed,
 * N failed".
 */
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "channel.h"

/* The spin budget; the quiet threshold is 10 x 20 ms. */
#define SPIN_US 20000L
/* Gaps before each message, ms. */
static const long gaps_ms[] = {300, 60, 60};
#define N (sizeof gaps_ms / sizeof gaps_ms[0])

static int engine_fd; /* the engine's end of 1.e2w */

static void *engine(void *arg)
{
    (void)arg;
    uint8_t msg[STC_MSG_LEN];
    memset(msg, 0, sizeof msg);
    for (size_t i = 0; i < N; i++) {
        struct timespec ts = {.tv_sec = 0, .tv_nsec = gaps_ms[i] * 1000000L};
        while (nanosleep(&ts, &ts) != 0) {
        }
        if (write(engine_fd, msg, sizeof msg) != (ssize_t)sizeof msg) {
            perror("write");
            exit(2);
        }
    }
    return NULL;
}

static int passed, failed;

static void check(int ok, const char *what, uint64_t yields)
{
    if (ok) {
        passed++;
        return;
    }
    failed++;
    printf("FAIL %s (%llu spin passes)\n", what, (unsigned long long)yields);
}

int main(void)
{
    char dir[] = "/tmp/stc-test-channel-XXXXXX";
    if (mkdtemp(dir) == NULL) {
        perror("mkdtemp");
        return 2;
    }
    char e2w[PATH_MAX], w2e[PATH_MAX];
    if (stc_chan_path(e2w, sizeof e2w, dir, 1, "e2w") < 0 || stc_chan_path(w2e, sizeof w2e, dir, 1, "w2e") < 0 ||
        mkfifo(e2w, 0600) < 0 || mkfifo(w2e, 0600) < 0) {
        perror("fifos");
        return 2;
    }
    /* Both held open by the engine, as the protocol says (O_RDWR: no
     * waiting for the other end). */
    engine_fd = open(e2w, O_RDWR);
    int engine_rx = open(w2e, O_RDWR);
    stc_chan c;
    if (engine_fd < 0 || engine_rx < 0 || stc_chan_open(&c, dir, 1, SPIN_US) < 0) {
        perror("open");
        return 2;
    }
    pthread_t t;
    pthread_create(&t, NULL, engine, NULL);
    uint64_t yields[N];
    uint8_t msg[STC_MSG_LEN];
    for (size_t i = 0; i < N; i++) {
        uint64_t y0 = c.spin_yields;
        if (stc_chan_recv(&c, msg) != 1) {
            perror("stc_chan_recv");
            return 2;
        }
        yields[i] = c.spin_yields - y0;
    }
    pthread_join(t, NULL);
    /* 1: nothing before it, so it spins (then blocks); it waited 300 ms,
     *    over 10 x the budget.
     * 2: after that quiet wait it blocks at once.
     * 3: the wait before it (60 ms) was within 10 x the budget: it spins. */
    check(yields[0] > 0, "the first receive spins", yields[0]);
    check(yields[1] == 0, "a receive after a wait over 10x the spin budget blocks at once", yields[1]);
    check(yields[2] > 0, "a receive after a wait within 10x the spin budget spins again", yields[2]);
    stc_chan_close(&c);
    close(engine_fd);
    close(engine_rx);
    unlink(e2w);
    unlink(w2e);
    rmdir(dir);
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
