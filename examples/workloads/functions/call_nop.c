#include <staccato.h>
#include <stdio.h>
#include <time.h>

static unsigned long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (unsigned long long)t.tv_sec * 1000000000ull + (unsigned long long)t.tv_nsec;
}

/* Calls nop-c once through the engine (an internal call) and returns that
 * call's latency in nanoseconds as text. Its own external latency is an
 * external call plus an internal one; the internal part is also in
 * invocations.csv (nop-c rows whose parent_call_id is this call). */
int staccato_handle(staccato_ctx *ctx, const uint8_t *input, size_t input_len) {
    (void)input; (void)input_len;
    staccato_result r = {0};
    unsigned long long t0 = now_ns();
    int rc = staccato_call(ctx, "nop-c", "", 0, &r);
    unsigned long long t1 = now_ns();
    staccato_result_free(&r);
    if (rc != STACCATO_OK) return staccato_set_error(ctx, "nop-c failed with kind %d", rc), 1;
    char out[32];
    int n = snprintf(out, sizeof out, "%llu", t1 - t0);
    staccato_set_output(ctx, out, (size_t)n);
    return 0;
}
