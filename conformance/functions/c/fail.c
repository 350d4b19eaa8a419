/* conf-c-fail: fails (nonzero return) with "conformance failure: <input>". */
#include <staccato.h>

int staccato_handle(staccato_ctx *ctx, const uint8_t *input, size_t input_len)
{
    staccato_set_error(ctx, "conformance failure: %.*s", (int)input_len, (const char *)input);
    return 1;
}
