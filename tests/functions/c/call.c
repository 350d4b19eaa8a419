#include <staccato.h>
#include <string.h>

/* Input "<function>:<data>": calls <function> with <data>, returns its output
 * or fails with the callee's error kind and message. */
int staccato_handle(staccato_ctx *ctx, const uint8_t *input, size_t input_len) {
    const uint8_t *colon = memchr(input, ':', input_len);
    if (!colon) return staccato_set_error(ctx, "input must be <function>:<data>"), 1;
    char name[65];
    size_t nlen = (size_t)(colon - input);
    if (nlen == 0 || nlen > 64) return staccato_set_error(ctx, "bad function name"), 1;
    memcpy(name, input, nlen);
    name[nlen] = 0;
    staccato_result r = {0};
    int rc = staccato_call(ctx, name, colon + 1, input_len - nlen - 1, &r);
    if (rc != STACCATO_OK) {
        staccato_set_error(ctx, "call to %s failed (kind %d): %s", name, rc, r.data ? (const char *)r.data : "");
        staccato_result_free(&r);
        return 1;
    }
    staccato_set_output(ctx, r.data, r.len);
    staccato_result_free(&r);
    return 0;
}
