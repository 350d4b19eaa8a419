/* conf-c-log: writes "conformance log <input>" with staccato_log; returns "ok". */
#include <staccato.h>

int staccato_handle(staccato_ctx *ctx, const uint8_t *input, size_t input_len)
{
    staccato_log(ctx, "conformance log %.*s", (int)input_len, (const char *)input);
    return staccato_set_output(ctx, "ok", 2);
}
