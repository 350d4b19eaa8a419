#include <staccato.h>
#include <stdlib.h>
#include <string.h>

/* Echoes its input behind $ECHO_PREFIX (so the test sees env reach the function). */
int staccato_handle(staccato_ctx *ctx, const uint8_t *input, size_t input_len) {
    const char *prefix = getenv("ECHO_PREFIX");
    size_t plen = prefix ? strlen(prefix) : 0;
    uint8_t *out = malloc(plen + input_len + 1);
    if (!out) return staccato_set_error(ctx, "out of memory"), 1;
    if (plen) memcpy(out, prefix, plen);
    if (input_len) memcpy(out + plen, input, input_len);
    staccato_set_output(ctx, out, plen + input_len);
    free(out);
    return 0;
}
