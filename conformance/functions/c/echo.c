/* conf-c-echo: output = input. */
#include <staccato.h>

int staccato_handle(staccato_ctx *ctx, const uint8_t *input, size_t input_len)
{
    return staccato_set_output(ctx, input, input_len);
}
