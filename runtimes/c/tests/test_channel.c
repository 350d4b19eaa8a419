/*
 * test_channel.c - how a receive waits (src/channel.c): it spins only while
 * messages come quickly.  A writer thread plays the engine, sending one
 * message after each of a list of gaps; 5 and 10 ms into each gap it looks
 * at the receiving thread's state in /proc: a spinning receive is running or
 * runnable (R), one blocked in poll() sleeps (S).  Usage: test_channel.
 * Last line: "N passed, N failed".
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

static int engine_fd;        /* the engine's end of 1.e2w */
static pid_t receiver_tid;   /* set before the writer starts */
static int spun[N];          /* the receiver was seen running in gap i */

static void sleep_ms(long ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

/* The state letter of the receiving thread (R, S, ...), or '?'. */
static char receiver_state(void)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/self/task/%d/stat", (int)receiver_tid);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return '?';
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *p = strrchr(buf, ')'); /* after "pid (comm)" */
    return p && p[1] == ' ' ? p[2] : '?';
}

static void *engine(void *arg)
{
    (void)arg;
    uint8_t msg[STC_MSG_LEN];
    memset(msg, 0, sizeof msg);
    for (size_t i = 0; i < N; i++) {
        /* Within the spin budget (20 ms) of the receive's start. */
        sleep_ms(5);
        spun[i] = receiver_state() == 'R';
        sleep_ms(5);
        spun[i] |= receiver_state() == 'R';
        sleep_ms(gaps_ms[i] - 10);
        if (write(engine_fd, msg, sizeof msg) != (ssize_t)sizeof msg) {
            perror("write");
            exit(2);
        }
    }
    return NULL;
}

static int passed, failed;

static void check(int ok, const char *what)
{
    if (ok) {
        passed++;
        return;
    }
    failed++;
    printf("FAIL %s\n", what);
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
    receiver_tid = gettid();
    pthread_t t;
    pthread_create(&t, NULL, engine, NULL);
    uint8_t msg[STC_MSG_LEN];
    for (size_t i = 0; i < N; i++) {
        if (stc_chan_recv(&c, msg) != 1) {
            perror("stc_chan_recv");
            return 2;
        }
    }
    pthread_join(t, NULL);
    /* 1: nothing before it, so it spins (then blocks); it waited 300 ms,
     *    over 10 x the budget.
     * 2: after that quiet wait it blocks at once.
     * 3: the wait before it (60 ms) was within 10 x the budget: it spins. */
    check(spun[0], "the first receive spins");
    check(!spun[1], "a receive after a wait over 10x the spin budget blocks at once");
    check(spun[2], "a receive after a wait within 10x the spin budget spins again");
    stc_chan_close(&c);
    close(engine_fd);
    close(engine_rx);
    unlink(e2w);
    unlink(w2e);
    rmdir(dir);
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
