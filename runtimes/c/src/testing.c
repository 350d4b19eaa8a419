/*
 * testing.c - libstaccato-testing: the staccato_* API for a unit test
 * (include/staccato_testing.h). One invocation at a time per process;
 * staccato_call is thread-safe, as in the runtime.
 */
#define _GNU_SOURCE
#include "staccato_testing.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct staccato_ctx {
    const staccato_test_options *o;
    uint64_t call_id;
    int64_t deadline_us;
    uint8_t *output;
    size_t output_len;
    int output_error; /* a failed staccato_set_output */
    char *error;
    pthread_mutex_t calls_lock;
    staccato_test_call *calls;
    size_t n_calls;
    char trace_id[33];
    char traceparent[56]; /* as the runtime gives it: version 00, flag bit 0 */
};

static int64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static uint8_t *copy(const void *data, size_t len)
{
    uint8_t *p = malloc(len + 1);
    if (!p)
        return NULL;
    if (len)
        memcpy(p, data, len);
    p[len] = 0;
    return p;
}

int staccato_set_output(staccato_ctx *ctx, const void *data, size_t len)
{
    uint8_t *p = copy(data, len);
    if (!p) {
        ctx->output_error = STACCATO_ERR_OUT_OF_MEMORY;
        return STACCATO_ERR_OUT_OF_MEMORY;
    }
    free(ctx->output);
    ctx->output = p;
    ctx->output_len = len;
    ctx->output_error = 0;
    return 0;
}

int staccato_set_error(staccato_ctx *ctx, const char *fmt, ...)
{
    free(ctx->error);
    ctx->error = NULL;
    if (!fmt)
        return 0;
    va_list ap;
    va_start(ap, fmt);
    int n = vasprintf(&ctx->error, fmt, ap);
    va_end(ap);
    if (n < 0) {
        ctx->error = NULL;
        return STACCATO_ERR_OUT_OF_MEMORY;
    }
    return 0;
}

uint64_t staccato_call_id(const staccato_ctx *ctx) { return ctx->call_id; }
uint64_t staccato_parent_call_id(const staccato_ctx *ctx) { (void)ctx; return 0; }
int64_t staccato_deadline_us(const staccato_ctx *ctx) { return ctx->deadline_us; }
const char *staccato_trace_id(const staccato_ctx *ctx) { return ctx->trace_id; }
const char *staccato_traceparent(const staccato_ctx *ctx) { return ctx->traceparent; }
const char *staccato_tracestate(const staccato_ctx *ctx)
{
    return ctx->o->traceparent && ctx->o->tracestate ? ctx->o->tracestate : "";
}

/* vv-<32 hex>-<16 hex>-<2 hex>, lower case. */
static int traceparent_ok(const char *t)
{
    if (strlen(t) != 55 || t[2] != '-' || t[35] != '-' || t[52] != '-')
        return 0;
    for (size_t i = 0; i < 55; i++) {
        if (i != 2 && i != 35 && i != 52 && !((t[i] >= '0' && t[i] <= '9') || (t[i] >= 'a' && t[i] <= 'f')))
            return 0;
    }
    return 1;
}

int64_t staccato_remaining_us(const staccato_ctx *ctx)
{
    if (!ctx->deadline_us)
        return -1;
    int64_t left = ctx->deadline_us - now_us();
    return left > 0 ? left : 0;
}

void staccato_log(staccato_ctx *ctx, const char *fmt, ...)
{
    const char *fn = ctx && ctx->o && ctx->o->function ? ctx->o->function : "test";
    fprintf(stderr, "[%s %016llx] ", fn, (unsigned long long)(ctx ? ctx->call_id : 0));
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt ? fmt : "", ap);
    va_end(ap);
    fputc('\n', stderr);
}

int staccato_fake_reply(staccato_result *out, int kind, const void *data, size_t len)
{
    out->error_kind = kind;
    out->data = copy(data, len);
    out->len = out->data ? len : 0;
    return kind;
}

void staccato_result_free(staccato_result *out)
{
    if (!out)
        return;
    free(out->data);
    out->data = NULL;
    out->len = 0;
}

int staccato_call(staccato_ctx *ctx, const char *function, const void *input, size_t input_len,
                  staccato_result *out)
{
    staccato_result local = {0};
    staccato_result *r = out ? out : &local;
    memset(r, 0, sizeof *r);
    size_t name_len = function ? strlen(function) : 0;
    if (name_len == 0 || name_len > STACCATO_NAME_MAX || (!input && input_len > 0)) {
        const char *m = "bad function name or input";
        staccato_fake_reply(r, STACCATO_ERR_BAD_REQUEST, m, strlen(m));
        int k = r->error_kind;
        staccato_result_free(&local);
        return k;
    }
    if (ctx->deadline_us && now_us() >= ctx->deadline_us) {
        const char *m = "the deadline has passed";
        staccato_fake_reply(r, STACCATO_ERR_TIMEOUT, m, strlen(m));
        staccato_result_free(&local);
        return STACCATO_ERR_TIMEOUT;
    }
    pthread_mutex_lock(&ctx->calls_lock);
    staccato_test_call *calls = realloc(ctx->calls, (ctx->n_calls + 1) * sizeof *calls);
    if (calls) {
        ctx->calls = calls;
        staccato_test_call *c = &calls[ctx->n_calls++];
        memcpy(c->function, function, name_len + 1);
        c->input = copy(input, input_len);
        c->input_len = input_len;
    }
    pthread_mutex_unlock(&ctx->calls_lock);
    int kind = STACCATO_ERR_NOT_FOUND;
    int found = 0;
    for (size_t i = 0; i < ctx->o->n_callees; i++) {
        const staccato_fake_callee *f = &ctx->o->callees[i];
        if (f->name && strcmp(f->name, function) == 0) {
            kind = f->fn(input, input_len, r, f->arg);
            r->error_kind = kind;
            found = 1;
            break;
        }
    }
    if (!found) {
        char m[128];
        int n = snprintf(m, sizeof m, "no fake for function %s", function);
        staccato_fake_reply(r, STACCATO_ERR_NOT_FOUND, m, (size_t)n);
    }
    staccato_result_free(&local);
    return kind;
}

int staccato_test_run(int (*handler)(staccato_ctx *, const uint8_t *, size_t), const uint8_t *input,
                      size_t input_len, const staccato_test_options *options, staccato_test_result *r)
{
    static const staccato_test_options none = {0};
    staccato_ctx ctx = {.o = options ? options : &none};
    ctx.call_id = ctx.o->call_id ? ctx.o->call_id : 1;
    ctx.deadline_us = ctx.o->timeout_us > 0 ? now_us() + ctx.o->timeout_us : 0;
    pthread_mutex_init(&ctx.calls_lock, NULL);
    memset(r, 0, sizeof *r);
    if (ctx.o->traceparent) {
        if (!traceparent_ok(ctx.o->traceparent)) {
            pthread_mutex_destroy(&ctx.calls_lock);
            r->error_kind = STACCATO_ERR_BAD_REQUEST;
            r->error = (char *)copy("traceparent is not 00-<32 hex>-<16 hex>-<2 hex>", 47);
            return r->error_kind;
        }
        const char *t = ctx.o->traceparent;
        memcpy(ctx.trace_id, t + 3, 32);
        int sampled = (t[54] >= '0' && t[54] <= '9' ? t[54] - '0' : t[54] - 'a' + 10) & 1;
        snprintf(ctx.traceparent, sizeof ctx.traceparent, "00-%.32s-%.16s-0%d", t + 3, t + 36, sampled);
    }
    r->returned = handler(&ctx, input, input_len);
    pthread_mutex_destroy(&ctx.calls_lock);
    r->calls = ctx.calls;
    r->n_calls = ctx.n_calls;
    if (ctx.output_error) {
        r->error_kind = ctx.output_error;
        free(ctx.output);
        free(ctx.error);
        r->error = (char *)copy("setting the output failed", 25);
    } else if (r->returned != 0) {
        r->error_kind = STACCATO_ERR_FUNCTION_ERROR;
        free(ctx.output);
        if (ctx.error) {
            r->error = ctx.error;
        } else if (asprintf(&r->error, "handler returned %d", r->returned) < 0) {
            r->error = NULL;
        }
    } else {
        free(ctx.error);
        r->output = ctx.output ? ctx.output : copy("", 0);
        r->output_len = ctx.output ? ctx.output_len : 0;
    }
    return r->error_kind;
}

void staccato_test_result_free(staccato_test_result *r)
{
    free(r->output);
    free(r->error);
    for (size_t i = 0; i < r->n_calls; i++)
        free(r->calls[i].input);
    free(r->calls);
    memset(r, 0, sizeof *r);
}
