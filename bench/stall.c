/* How often this guest takes a vCPU away: a busy loop pinned to one vCPU
 * reads the clock back to back for a while and counts the gaps between
 * two reads over 1 ms and over 2.5 ms (time the loop did not run: the
 * host, or something else on the guest, had the vCPU). Run one per vCPU
 * on an otherwise idle machine:
 *
 *   gcc -O2 -o /tmp/stall bench/stall.c
 *   (/tmp/stall 0 10 & /tmp/stall 1 10; wait)
 *
 * BENCHMARKS.md ("On an Intel guest") quotes it next to the mixed run's
 * tail. */
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s CPU SECONDS\n", argv[0]);
        return 2;
    }
    int cpu = atoi(argv[1]);
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0) {
        perror("sched_setaffinity");
        return 1;
    }
    double end = now_s() + atof(argv[2]), last = now_s(), max = 0;
    long over1 = 0, over2_5 = 0;
    for (;;) {
        double t = now_s(), gap = t - last;
        last = t;
        over1 += gap > 1e-3;
        over2_5 += gap > 2.5e-3;
        if (gap > max)
            max = gap;
        if (t > end)
            break;
    }
    printf("cpu %d: gaps over 1 ms %ld, over 2.5 ms %ld, longest %.2f ms\n", cpu, over1, over2_5, max * 1e3);
    return 0;
}
