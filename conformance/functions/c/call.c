/* conf-c-call: input "<target>:<data>"; calls <target> with <data> and
 * returns its output, or, when the call fails, returns (successfully)
 * {"error_kind": "<kind name>", "message": "<callee message>"}. */
#include "conf.h"

int staccato_handle(staccato_ctx *ctx, const uint8_t *input, size_t input_len)
{
    const uint8_t *colon = input_len ? memchr(input, ':', input_len) : NULL;
    size_t name_len = colon ? (size_t)(colon - input) : 0;
    if (colon == NULL || name_len == 0 || name_len > STACCATO_NAME_MAX) {
        staccato_set_error(ctx, "input must be <target>:<data> with a 1 to %d byte target", STACCATO_NAME_MAX);
        return 1;
    }
    char name[STACCATO_NAME_MAX + 1];
    memcpy(name, input, name_len);
    name[name_len] = 0;
    staccato_result r;
    int kind = staccato_call(ctx, name, colon + 1, input_len - name_len - 1, &r);
    int rc;
    if (kind == STACCATO_OK) {
        rc = staccato_set_output(ctx, r.data, r.len);
    } else {
        conf_buf b = {0};
        conf_puts(&b, "{\"error_kind\": ");
        conf_put_json_string(&b, conf_kind_name(kind), strlen(conf_kind_name(kind)));
        conf_puts(&b, ", \"message\": ");
        conf_put_json_string(&b, r.data, r.len);
        conf_puts(&b, "}");
        rc = conf_output(ctx, &b);
    }
    staccato_result_free(&r);
    return rc;
}
