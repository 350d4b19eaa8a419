/*
 * test_handler.c - handler library for tests/test_host.py.  The input picks
 * the behaviour:
 *
 *   !fail:MSG            fail with MSG (staccato_set_error)
 *   !faildefault         fail without a message
 *   !crash               segfault
 *   !info                output "call=<hex> parent=<hex> deadline=<n> remaining=<n>"
 *   !log:MSG             staccato_log(MSG), output "logged"
 *   !big:N               output N bytes 'a'..'z' repeating
 *   !call:NAME:INPUT     staccato_call(NAME, INPUT); output "kind=K;" + result data
 *   !callbig:NAME:N      same with an N-byte input 'a'..'z' repeating
 *   !call2:NAME          two calls to NAME with empty input; output "kind=K1,K2"
 *   !fanout:N:R:NAME     N pthreads at once, thread i making R calls in a row to
 *                        NAME with input "i.r"; output one line per call, in
 *                        thread then call order: "i.r kind=K;" + result data
 *   !bench:N:NAME        N calls to NAME with empty input, timed one by one;
 *                        output "calls=N p50_ns=.. p90_ns=.. p99_ns=.. max_ns=.." (bench_engine.c)
 *   anything else        echo the input
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <staccato.h>

static int has_prefix(const uint8_t *in, size_t len, const char *prefix)
{
    size_t n = strlen(prefix);
    return len >= n && memcmp(in, prefix, n) == 0;
}

/* Copies in[0..len) into a NUL-terminated string (inputs here are small). */
static char *cstr(const uint8_t *in, size_t len)
{
    char *s = malloc(len + 1);
    if (s != NULL) {
        memcpy(s, in, len);
        s[len] = 0;
    }
    return s;
}

static uint8_t *pattern(size_t n)
{
    uint8_t *p = malloc(n + 1);
    for (size_t i = 0; p != NULL && i < n; i++)
        p[i] = (uint8_t)('a' + i % 26);
    return p;
}

/* Sets the output to "kind=K;" followed by the result data. */
static int output_result(staccato_ctx *ctx, int kind, const staccato_result *r)
{
    char head[32];
    int n = snprintf(head, sizeof head, "kind=%d;", kind);
    uint8_t *buf = malloc((size_t)n + r->len + 1);
    if (buf == NULL)
        return 1;
    memcpy(buf, head, (size_t)n);
    if (r->len > 0)
        memcpy(buf + n, r->data, r->len);
    int rc = staccato_set_output(ctx, buf, (size_t)n + r->len);
    free(buf);
    return rc;
}

/* !call:NAME:INPUT and !callbig:NAME:N */
static int do_call(staccato_ctx *ctx, char *args, int big)
{
    char *sep = strchr(args, ':');
    if (sep == NULL)
        return staccato_set_error(ctx, "usage: NAME:ARG"), 1;
    *sep = 0;
    const char *name = args, *arg = sep + 1;
    size_t len = big ? strtoull(arg, NULL, 10) : strlen(arg);
    uint8_t *input = big ? pattern(len) : (uint8_t *)arg;
    staccato_result r;
    int kind = staccato_call(ctx, name, input, len, &r);
    if (kind != r.error_kind)
        return staccato_set_error(ctx, "return value %d != error_kind %d", kind, r.error_kind), 1;
    int rc = output_result(ctx, kind, &r);
    staccato_result_free(&r);
    if (big)
        free(input);
    return rc;
}

/* !fanout: one thread's share. */
typedef struct fan_thread {
    staccato_ctx *ctx;
    const char *name;
    int index, rounds;
    char *out; /* its lines, malloc'd */
    size_t out_len;
} fan_thread;

static void *fan_run(void *arg)
{
    fan_thread *t = arg;
    for (int r = 0; r < t->rounds; r++) {
        char input[32];
        int n = snprintf(input, sizeof input, "%d.%d", t->index, r);
        staccato_result res;
        int kind = staccato_call(t->ctx, t->name, input, (size_t)n, &res);
        char *grown = realloc(t->out, t->out_len + (size_t)n + res.len + 32);
        if (grown == NULL) {
            staccato_result_free(&res);
            break;
        }
        t->out = grown;
        t->out_len += (size_t)sprintf(t->out + t->out_len, "%s kind=%d;", input, kind);
        if (res.len > 0)
            memcpy(t->out + t->out_len, res.data, res.len);
        t->out_len += res.len;
        t->out[t->out_len++] = '\n';
        staccato_result_free(&res);
    }
    return NULL;
}

/* !fanout:N:R:NAME */
static int do_fanout(staccato_ctx *ctx, char *args)
{
    int n = 0, rounds = 0, used = 0;
    if (sscanf(args, "%d:%d:%n", &n, &rounds, &used) != 2 || used == 0 || n < 1 || n > 256 || rounds < 1)
        return staccato_set_error(ctx, "usage: !fanout:N:R:NAME"), 1;
    fan_thread *ts = calloc((size_t)n, sizeof *ts);
    pthread_t *ids = calloc((size_t)n, sizeof *ids);
    if (ts == NULL || ids == NULL)
        return 1;
    int started = 0;
    for (; started < n; started++) {
        ts[started] = (fan_thread){.ctx = ctx, .name = args + used, .index = started, .rounds = rounds};
        if (pthread_create(&ids[started], NULL, fan_run, &ts[started]) != 0)
            break;
    }
    size_t total = 0;
    for (int i = 0; i < started; i++) {
        pthread_join(ids[i], NULL);
        total += ts[i].out_len;
    }
    char *out = malloc(total + 1);
    size_t len = 0;
    for (int i = 0; i < started; i++) {
        if (out != NULL && ts[i].out_len > 0)
            memcpy(out + len, ts[i].out, ts[i].out_len);
        len += ts[i].out_len;
        free(ts[i].out);
    }
    int rc = started < n ? (staccato_set_error(ctx, "started only %d threads", started), 1)
             : out == NULL ? 1
                           : staccato_set_output(ctx, out, len);
    free(out);
    free(ts);
    free(ids);
    return rc;
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* !bench:N:NAME */
static int do_bench(staccato_ctx *ctx, char *args)
{
    char *sep = strchr(args, ':');
    size_t n = strtoull(args, NULL, 10);
    if (sep == NULL || n == 0)
        return staccato_set_error(ctx, "usage: !bench:N:NAME"), 1;
    uint64_t *lat = malloc(n * sizeof *lat);
    if (lat == NULL)
        return 1;
    for (size_t i = 0; i < n; i++) {
        uint64_t t0 = now_ns();
        int kind = staccato_call(ctx, sep + 1, NULL, 0, NULL);
        lat[i] = now_ns() - t0;
        if (kind != 0) {
            free(lat);
            return staccato_set_error(ctx, "call %zu failed with kind %d", i, kind), 1;
        }
    }
    qsort(lat, n, sizeof *lat, cmp_u64);
    char buf[160];
    int len = snprintf(buf, sizeof buf, "calls=%zu p50_ns=%llu p90_ns=%llu p99_ns=%llu max_ns=%llu", n,
                       (unsigned long long)lat[n / 2], (unsigned long long)lat[n * 9 / 10],
                       (unsigned long long)lat[n * 99 / 100], (unsigned long long)lat[n - 1]);
    free(lat);
    return staccato_set_output(ctx, buf, (size_t)len);
}

static int dispatch(staccato_ctx *ctx, const uint8_t *input, size_t len, char *arg)
{
    if (has_prefix(input, len, "!fail:"))
        return staccato_set_error(ctx, "%s", arg + 5), 1;
    if (has_prefix(input, len, "!faildefault"))
        return 2;
    if (has_prefix(input, len, "!crash")) {
        volatile uintptr_t addr = 0; /* volatile: the compiler cannot see the NULL */
        *(volatile int *)addr = 1;
        return 0;
    }
    if (has_prefix(input, len, "!info")) {
        char buf[160];
        int n = snprintf(buf, sizeof buf, "call=%016llx parent=%016llx deadline=%lld remaining=%lld",
                         (unsigned long long)staccato_call_id(ctx), (unsigned long long)staccato_parent_call_id(ctx),
                         (long long)staccato_deadline_us(ctx), (long long)staccato_remaining_us(ctx));
        return staccato_set_output(ctx, buf, (size_t)n);
    }
    if (has_prefix(input, len, "!trace")) {
        char buf[800];
        int n = snprintf(buf, sizeof buf, "id=%s parent=%s state=%s len=%zu", staccato_trace_id(ctx),
                         staccato_traceparent(ctx), staccato_tracestate(ctx), len);
        return staccato_set_output(ctx, buf, (size_t)n);
    }
    if (has_prefix(input, len, "!log:")) {
        staccato_log(ctx, "%s", arg + 4);
        return staccato_set_output(ctx, "logged", 6);
    }
    if (has_prefix(input, len, "!big:")) {
        size_t n = strtoull(arg + 4, NULL, 10);
        uint8_t *p = pattern(n);
        int rc = staccato_set_output(ctx, p, n);
        free(p);
        return rc;
    }
    if (has_prefix(input, len, "!callbig:"))
        return do_call(ctx, arg + 8, 1);
    if (has_prefix(input, len, "!call:"))
        return do_call(ctx, arg + 5, 0);
    if (has_prefix(input, len, "!call2:")) {
        int k1 = staccato_call(ctx, arg + 6, NULL, 0, NULL);
        int k2 = staccato_call(ctx, arg + 6, NULL, 0, NULL);
        char buf[32];
        int n = snprintf(buf, sizeof buf, "kind=%d,%d", k1, k2);
        return staccato_set_output(ctx, buf, (size_t)n);
    }
    if (has_prefix(input, len, "!fanout:"))
        return do_fanout(ctx, arg + 7);
    if (has_prefix(input, len, "!bench:"))
        return do_bench(ctx, arg + 6);
    return staccato_set_output(ctx, input, len);
}

int staccato_handle(staccato_ctx *ctx, const uint8_t *input, size_t len)
{
    if (len == 0 || input[0] != '!')
        return staccato_set_output(ctx, input, len); /* echo, also for binary data */
    char *arg = cstr(input, len);
    if (arg == NULL)
        return 1;
    int rc = dispatch(ctx, input, len, arg + 1);
    free(arg);
    return rc;
}
