#include <staccato.h>

/* Does nothing: external calls measure the gateway + engine path. */
int staccato_handle(staccato_ctx *ctx, const uint8_t *input, size_t input_len) {
    (void)ctx; (void)input; (void)input_len;
    return 0;
}
