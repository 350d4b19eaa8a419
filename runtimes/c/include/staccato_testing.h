/*
 * staccato_testing.h - run a C (or C++) handler once, without an engine, in
 * a unit test.
 *
 * libstaccato-testing provides the staccato_* API of staccato.h (which the
 * host process provides in production) for one test process: link the
 * handler's source, the test and the library into a program.
 *
 *     #include <staccato_testing.h>
 *
 *     static int upper(const uint8_t *in, size_t len, staccato_result *out, void *arg)
 *     {
 *         (void)arg;
 *         return staccato_fake_reply(out, STACCATO_OK, in, len);   // echo
 *     }
 *
 *     int main(void)
 *     {
 *         staccato_fake_callee callees[] = {{"other", upper, NULL}};
 *         staccato_test_options o = {.function = "hello", .callees = callees, .n_callees = 1};
 *         staccato_test_result r;
 *         staccato_test_run(staccato_handle, (const uint8_t *)"x", 1, &o, &r);
 *         int ok = r.error_kind == STACCATO_OK && r.output_len == ...;
 *         staccato_test_result_free(&r);
 *         return ok ? 0 : 1;
 *     }
 *
 * Build: cc handler.c test.c $(pkg-config --cflags --libs staccato-testing)
 * (after `make -C runtimes/c install PREFIX=...`), or from the repository:
 * cc -I runtimes/c/include handler.c test.c runtimes/c/src/testing.c
 */
#ifndef STACCATO_TESTING_H
#define STACCATO_TESTING_H

#include "staccato.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A stub for one callee: fills *out (with staccato_fake_reply) and returns
 * its error kind. `out` is never NULL. */
typedef int (*staccato_fake_fn)(const uint8_t *input, size_t input_len, staccato_result *out, void *arg);

typedef struct staccato_fake_callee {
    const char *name;
    staccato_fake_fn fn;
    void *arg;
} staccato_fake_callee;

typedef struct staccato_test_options {
    const char *function;  /* in log lines (default "test") */
    uint64_t call_id;      /* default 1 */
    int64_t timeout_us;    /* the deadline, from now; 0: none */
    const staccato_fake_callee *callees;
    size_t n_callees;      /* a call of any other function fails: not_found */
    /* The invocation's trace context (staccato_trace_id ...): a traceparent
     * value, 00-<32 hex>-<16 hex>-<2 hex>, and a tracestate; NULL: none.
     * A malformed traceparent fails the run with bad_request. */
    const char *traceparent;
    const char *tracestate;
} staccato_test_options;

/* One call the handler made. */
typedef struct staccato_test_call {
    char function[STACCATO_NAME_MAX + 1];
    uint8_t *input;
    size_t input_len;
} staccato_test_call;

typedef struct staccato_test_result {
    int returned;       /* what the handler returned */
    int error_kind;     /* STACCATO_OK, or the kind the call would fail with */
    uint8_t *output;    /* the output (error_kind OK), NUL-terminated */
    size_t output_len;
    char *error;        /* the error message (error_kind not OK) */
    staccato_test_call *calls; /* the calls it made, in order */
    size_t n_calls;
} staccato_test_result;

/* Runs handler once on input, as the runtime would. Returns r->error_kind. */
int staccato_test_run(int (*handler)(staccato_ctx *, const uint8_t *, size_t), const uint8_t *input,
                      size_t input_len, const staccato_test_options *options, staccato_test_result *r);

void staccato_test_result_free(staccato_test_result *r);

/* For a stub: sets *out to data (copied) and returns kind. With a kind
 * other than STACCATO_OK, data is the error message. */
int staccato_fake_reply(staccato_result *out, int kind, const void *data, size_t len);

#ifdef __cplusplus
}
#endif

#endif /* STACCATO_TESTING_H */
