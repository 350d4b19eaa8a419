/* conf-c-chain-deadline: calls conf-c-deadline (input ignored) and returns
 * its output unchanged; the callee inherits this invocation's deadline. */
#include <staccato.h>

int staccato_handle(staccato_ctx *ctx, const uint8_t *input, size_t input_len)
{
    (void)input;
    (void)input_len;
    staccato_result r;
    int kind = staccato_call(ctx, "conf-c-deadline", NULL, 0, &r);
    int rc = kind == STACCATO_OK ? staccato_set_output(ctx, r.data, r.len)
                                 : (staccato_set_error(ctx, "conf-c-deadline failed (kind %d): %s", kind,
                                                       r.data ? (const char *)r.data : ""),
                                    1);
    staccato_result_free(&r);
    return rc;
}
