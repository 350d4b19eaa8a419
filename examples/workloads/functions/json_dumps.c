#include <staccato.h>
#include <stdio.h>
#include <time.h>

#ifndef WORK_NS
#define WORK_NS 5000000L /* 5 ms of CPU per call */
#endif

static long cpu_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (long)t.tv_sec * 1000000000L + t.tv_nsec;
}

/* A json_dumps stand-in with a fixed cost: formats a small JSON document
 * repeatedly until this thread has used WORK_NS of CPU. */
int staccato_handle(staccato_ctx *ctx, const uint8_t *input, size_t input_len) {
    (void)input;
    char buf[256];
    int n = 0;
    unsigned long rounds = 0;
    long t0 = cpu_ns();
    do {
        for (int i = 0; i < 64; i++, rounds++)
            n = snprintf(buf, sizeof buf, "{\"id\":%lu,\"name\":\"item-%lu\",\"price\":%.2f,\"input_bytes\":%zu}",
                         rounds, rounds, rounds * 1.25, input_len);
    } while (cpu_ns() - t0 < WORK_NS);
    staccato_set_output(ctx, buf, (size_t)n);
    return 0;
}
