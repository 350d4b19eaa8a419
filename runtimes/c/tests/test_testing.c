/*
 * test_testing.c - libstaccato-testing runs a handler as the runtime would:
 * its output, its error, the calls it makes answered by stubs.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "staccato_testing.h"

static int failures;
#define CHECK(c)                                                    \
    do {                                                            \
        if (!(c)) {                                                 \
            fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, #c); \
            failures++;                                             \
        }                                                           \
    } while (0)

/* The handler under test: "fail" fails; "call:NAME" calls NAME with
 * "ping" and answers what it got; anything else is echoed. */
static int handler(staccato_ctx *ctx, const uint8_t *in, size_t len)
{
    if (len == 4 && memcmp(in, "fail", 4) == 0) {
        staccato_set_error(ctx, "refused %d", 7);
        return 1;
    }
    if (len > 5 && memcmp(in, "call:", 5) == 0) {
        char name[STACCATO_NAME_MAX + 1] = {0};
        memcpy(name, in + 5, len - 5 < STACCATO_NAME_MAX ? len - 5 : STACCATO_NAME_MAX);
        staccato_result r;
        int kind = staccato_call(ctx, name, "ping", 4, &r);
        if (kind != STACCATO_OK) {
            staccato_set_error(ctx, "%s failed (%d): %s", name, kind, r.data ? (char *)r.data : "");
            staccato_result_free(&r);
            return 1;
        }
        staccato_set_output(ctx, r.data, r.len);
        staccato_result_free(&r);
        return 0;
    }
    staccato_log(ctx, "echo %zu bytes, %lld us left", len, (long long)staccato_remaining_us(ctx));
    return staccato_set_output(ctx, in, len);
}

/* The handler, 2 ms late. */
static int late_handler(staccato_ctx *ctx, const uint8_t *in, size_t len)
{
    struct timespec ms = {0, 2000000};
    nanosleep(&ms, NULL);
    return handler(ctx, in, len);
}

static int trace_handler(staccato_ctx *ctx, const uint8_t *in, size_t len)
{
    (void)in;
    (void)len;
    char buf[300];
    int n = snprintf(buf, sizeof buf, "%s %s %s", staccato_trace_id(ctx), staccato_traceparent(ctx),
                     staccato_tracestate(ctx));
    return staccato_set_output(ctx, buf, (size_t)n);
}

static int pong(const uint8_t *in, size_t len, staccato_result *out, void *arg)
{
    (void)in;
    (void)len;
    return staccato_fake_reply(out, STACCATO_OK, arg, strlen(arg));
}

static int down(const uint8_t *in, size_t len, staccato_result *out, void *arg)
{
    (void)in;
    (void)len;
    (void)arg;
    return staccato_fake_reply(out, STACCATO_ERR_TIMEOUT, "too slow", 8);
}

int main(void)
{
    staccato_fake_callee callees[] = {{"other", pong, "pong!"}, {"down", down, NULL}};
    staccato_test_options o = {.function = "t", .call_id = 42, .timeout_us = 2000000, .callees = callees,
                               .n_callees = 2};
    staccato_test_result r;

    CHECK(staccato_test_run(handler, (const uint8_t *)"hi", 2, &o, &r) == STACCATO_OK);
    CHECK(r.returned == 0 && r.output_len == 2 && memcmp(r.output, "hi", 2) == 0 && r.n_calls == 0);
    staccato_test_result_free(&r);

    CHECK(staccato_test_run(handler, (const uint8_t *)"fail", 4, &o, &r) == STACCATO_ERR_FUNCTION_ERROR);
    CHECK(r.returned == 1 && r.error && strcmp(r.error, "refused 7") == 0 && r.output == NULL);
    staccato_test_result_free(&r);

    CHECK(staccato_test_run(handler, (const uint8_t *)"call:other", 10, &o, &r) == STACCATO_OK);
    CHECK(r.output_len == 5 && memcmp(r.output, "pong!", 5) == 0);
    CHECK(r.n_calls == 1 && strcmp(r.calls[0].function, "other") == 0 && r.calls[0].input_len == 4 &&
          memcmp(r.calls[0].input, "ping", 4) == 0);
    staccato_test_result_free(&r);

    CHECK(staccato_test_run(handler, (const uint8_t *)"call:down", 9, &o, &r) == STACCATO_ERR_FUNCTION_ERROR);
    CHECK(r.error && strstr(r.error, "down failed (5): too slow"));
    staccato_test_result_free(&r);

    CHECK(staccato_test_run(handler, (const uint8_t *)"call:nobody", 11, &o, &r) == STACCATO_ERR_FUNCTION_ERROR);
    CHECK(r.error && strstr(r.error, "nobody failed (1): no fake for function nobody"));
    staccato_test_result_free(&r);

    /* A deadline already passed: the call is not made. */
    staccato_test_options late = o;
    late.timeout_us = 1;
    CHECK(staccato_test_run(late_handler, (const uint8_t *)"call:other", 10, &late, &r) ==
          STACCATO_ERR_FUNCTION_ERROR);
    CHECK(r.error && strstr(r.error, "(5)") && r.n_calls == 0);
    staccato_test_result_free(&r);

    /* No options: call id 1, no deadline, no callees. */
    CHECK(staccato_test_run(handler, (const uint8_t *)"", 0, NULL, &r) == STACCATO_OK);
    CHECK(r.output_len == 0 && r.output && r.output[0] == 0);
    staccato_test_result_free(&r);

    /* A trace context given, none, a malformed one. */
    const char *tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    staccato_test_options traced = {.traceparent = tp, .tracestate = "k=v"};
    CHECK(staccato_test_run(trace_handler, NULL, 0, &traced, &r) == STACCATO_OK);
    CHECK(r.output && strcmp((char *)r.output, "4bf92f3577b34da6a3ce929d0e0e4736 "
                                               "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01 k=v") == 0);
    staccato_test_result_free(&r);
    CHECK(staccato_test_run(trace_handler, NULL, 0, NULL, &r) == STACCATO_OK);
    CHECK(r.output && strcmp((char *)r.output, "  ") == 0);
    staccato_test_result_free(&r);
    /* Given as the runtime would give it: version 00, the sampled bit only. */
    traced.traceparent = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-03";
    traced.tracestate = NULL;
    CHECK(staccato_test_run(trace_handler, NULL, 0, &traced, &r) == STACCATO_OK);
    CHECK(r.output && strcmp((char *)r.output, "4bf92f3577b34da6a3ce929d0e0e4736 "
                                               "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01 ") == 0);
    staccato_test_result_free(&r);
    traced.traceparent = "00-short";
    CHECK(staccato_test_run(trace_handler, NULL, 0, &traced, &r) == STACCATO_ERR_BAD_REQUEST);
    CHECK(r.error && strstr(r.error, "traceparent"));
    staccato_test_result_free(&r);

    printf("libstaccato-testing: %s\n", failures ? "FAILED" : "ok");
    return failures != 0;
}
