#include <ctype.h>
#include <staccato.h>
#include <stdlib.h>

/* Upper-cases its input. */
int staccato_handle(staccato_ctx *ctx, const uint8_t *input, size_t input_len) {
    uint8_t *out = malloc(input_len ? input_len : 1);
    if (!out) {
        staccato_set_error(ctx, "out of memory");
        return 1;
    }
    for (size_t i = 0; i < input_len; i++) out[i] = (uint8_t)toupper(input[i]);
    staccato_set_output(ctx, out, input_len);
    free(out);
    return 0;
}
