/* conf-c-deadline: the context's fields as JSON
 * {"call_id": "<16 hex>", "parent_call_id": "<16 hex>", "deadline_us": N, "remaining_ms": X}. */
#include "conf.h"

int staccato_handle(staccato_ctx *ctx, const uint8_t *input, size_t input_len)
{
    (void)input;
    (void)input_len;
    char remaining[32] = "null"; /* no deadline */
    int64_t left_us = staccato_remaining_us(ctx);
    if (left_us >= 0)
        snprintf(remaining, sizeof remaining, "%.3f", (double)left_us / 1000.0);
    char out[256];
    int n = snprintf(out, sizeof out,
                     "{\"call_id\": \"%016llx\", \"parent_call_id\": \"%016llx\", \"deadline_us\": %lld, "
                     "\"remaining_ms\": %s}",
                     (unsigned long long)staccato_call_id(ctx), (unsigned long long)staccato_parent_call_id(ctx),
                     (long long)staccato_deadline_us(ctx), remaining);
    return staccato_set_output(ctx, out, (size_t)n);
}
