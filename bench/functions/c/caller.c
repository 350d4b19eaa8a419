#include <staccato.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* Input "<n>:<function>": calls <function> n times with an empty input and
 * returns each call's latency in nanoseconds as n little-endian u32. */
int staccato_handle(staccato_ctx *ctx, const uint8_t *input, size_t input_len) {
    char buf[96] = {0};
    memcpy(buf, input, input_len < sizeof buf - 1 ? input_len : sizeof buf - 1);
    char *colon = strchr(buf, ':');
    if (!colon) return staccato_set_error(ctx, "input must be <n>:<function>"), 1;
    *colon = 0;
    long n = strtol(buf, NULL, 10);
    if (n <= 0 || n > 1000000) return staccato_set_error(ctx, "bad n"), 1;
    uint32_t *lat = malloc((size_t)n * sizeof *lat);
    if (!lat) return staccato_set_error(ctx, "out of memory"), 1;
    for (long i = 0; i < n; i++) {
        staccato_result r = {0};
        uint64_t t0 = now_ns();
        int rc = staccato_call(ctx, colon + 1, "", 0, &r);
        uint64_t t1 = now_ns();
        staccato_result_free(&r);
        if (rc != STACCATO_OK) {
            free(lat);
            return staccato_set_error(ctx, "call %ld failed with kind %d", i, rc), 1;
        }
        lat[i] = (uint32_t)(t1 - t0);
    }
    staccato_set_output(ctx, lat, (size_t)n * sizeof *lat);
    free(lat);
    return 0;
}
