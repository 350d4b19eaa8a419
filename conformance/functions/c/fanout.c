/* conf-c-fanout: 16 internal calls to conf-c-echo at once, one pthread each
 * (inputs "0" .. "15"); returns the outputs as a JSON list of strings, in
 * input order.  Fails if any call fails. */
#include <pthread.h>

#include "conf.h"

#define CALLS 16

typedef struct {
    staccato_ctx *ctx;
    int index;
    int kind;
    staccato_result res;
} call_slot;

static void *run_call(void *arg)
{
    call_slot *s = arg;
    char input[16];
    int n = snprintf(input, sizeof input, "%d", s->index);
    s->kind = staccato_call(s->ctx, "conf-c-echo", input, (size_t)n, &s->res);
    return NULL;
}

int staccato_handle(staccato_ctx *ctx, const uint8_t *input, size_t input_len)
{
    (void)input;
    (void)input_len;
    call_slot slots[CALLS];
    pthread_t threads[CALLS];
    int started = 0;
    for (; started < CALLS; started++) {
        slots[started] = (call_slot){.ctx = ctx, .index = started};
        if (pthread_create(&threads[started], NULL, run_call, &slots[started]) != 0)
            break;
    }
    for (int i = 0; i < started; i++)
        pthread_join(threads[i], NULL);

    int rc = 0;
    conf_buf b = {0};
    conf_puts(&b, "[");
    for (int i = 0; i < started; i++) {
        call_slot *s = &slots[i];
        if (s->kind != STACCATO_OK && rc == 0) {
            staccato_set_error(ctx, "call %d to conf-c-echo failed (%s): %s", i, conf_kind_name(s->kind),
                               s->res.data ? (const char *)s->res.data : "");
            rc = 1;
        }
        conf_puts(&b, i ? ", " : "");
        conf_put_json_string(&b, s->res.data, s->res.len);
        staccato_result_free(&s->res);
    }
    conf_puts(&b, "]");
    if (started < CALLS && rc == 0) {
        staccato_set_error(ctx, "could only start %d threads", started);
        rc = 1;
    }
    if (rc != 0) {
        free(b.data);
        return rc;
    }
    return conf_output(ctx, &b);
}
