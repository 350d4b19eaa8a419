/*
 * staccato.h - public API for Staccato functions written in C (or C++).
 *
 * A function is a shared library that exports staccato_handle():
 *
 *     #include <staccato.h>
 *
 *     int staccato_handle(staccato_ctx *ctx, const uint8_t *input, size_t input_len)
 *     {
 *         return staccato_set_output(ctx, input, input_len);   // echo
 *     }
 *
 * Build it with:
 *
 *     cc -O2 -fPIC -shared -I runtimes/c/include handler.c -o handler.so
 *
 * and deploy it with STACCATO_HANDLER set to the path of handler.so.  The
 * staccato_* functions below are provided by the host process
 * (staccato-c-host), which loads the library; do not link against anything.
 *
 * Threading: a worker runs one invocation at a time.  The ctx passed to
 * staccato_handle is valid only until staccato_handle returns.  While it
 * runs, the handler may use ctx from threads of its own:
 *   - staccato_call may be called from several threads at once (fan-out:
 *     the calls are in flight together and each thread gets its own result);
 *   - staccato_log and the read-only accessors (call id, deadline, ...) are
 *     thread-safe;
 *   - staccato_set_output / staccato_set_error must not run concurrently
 *     with each other (set the result from one thread, e.g. after joining).
 * Every thread that uses ctx must be done with it (joined) before
 * staccato_handle returns.
 */
#ifndef STACCATO_H
#define STACCATO_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__) || defined(__clang__)
#define STACCATO_API __attribute__((visibility("default")))
#define STACCATO_PRINTF(fmt_idx, args_idx) __attribute__((format(printf, fmt_idx, args_idx)))
#else
#define STACCATO_API
#define STACCATO_PRINTF(fmt_idx, args_idx)
#endif

/* Error kinds (docs/protocol.md, "Error kinds").  0 means success. */
#define STACCATO_OK 0
#define STACCATO_ERR_NOT_FOUND 1
#define STACCATO_ERR_PAYLOAD_TOO_LARGE 2
#define STACCATO_ERR_FUNCTION_ERROR 3
#define STACCATO_ERR_WORKER_CRASHED 4
#define STACCATO_ERR_TIMEOUT 5
#define STACCATO_ERR_ENGINE_UNAVAILABLE 6
#define STACCATO_ERR_BAD_REQUEST 7
#define STACCATO_ERR_INTERNAL 8
#define STACCATO_ERR_OUT_OF_MEMORY 9
#define STACCATO_ERR_OUTPUT_TOO_LARGE 10
#define STACCATO_ERR_CALL_CYCLE 11
#define STACCATO_ERR_CALL_DEPTH_EXCEEDED 12
#define STACCATO_ERR_FUNCTION_REMOVED 13
#define STACCATO_ERR_OVERLOADED 14

/* Longest function name accepted by staccato_call, in bytes. */
#define STACCATO_NAME_MAX 64

/* Opaque per-invocation context. */
typedef struct staccato_ctx staccato_ctx;

/* Result of staccato_call.  Release with staccato_result_free. */
typedef struct staccato_result {
    int error_kind; /* STACCATO_OK or one of STACCATO_ERR_* */
    uint8_t *data;  /* output on success, UTF-8 error message otherwise; may be
                       NULL when len == 0; when non-NULL, data[len] == 0 so a
                       message can be printed with %s */
    size_t len;
} staccato_result;

/*
 * Implemented by the user's library.  Return 0 on success (the output is what
 * staccato_set_output last set, empty if never set) or nonzero on failure
 * (the error message is what staccato_set_error last set, else a default
 * message naming the return value).
 */
STACCATO_API int staccato_handle(staccato_ctx *ctx, const uint8_t *input, size_t input_len);

/* Sets the output (copied; may be called several times, the last one wins).
 * Returns 0, or STACCATO_ERR_OUTPUT_TOO_LARGE if len exceeds the
 * configured maximum payload (STACCATO_PAYLOAD_MAX), or
 * STACCATO_ERR_OUT_OF_MEMORY.  If the last call failed, the invocation fails
 * with that error kind whatever staccato_handle returns. */
STACCATO_API int staccato_set_output(staccato_ctx *ctx, const void *data, size_t len);

/* Sets the failure message (printf-style) used if staccato_handle returns
 * nonzero.  fmt == NULL clears it.  Returns 0 or STACCATO_ERR_OUT_OF_MEMORY. */
STACCATO_API int staccato_set_error(staccato_ctx *ctx, const char *fmt, ...) STACCATO_PRINTF(2, 3);

/* This invocation's call id, and the id of the invocation that called it
 * (0 for calls from the gateway). */
STACCATO_API uint64_t staccato_call_id(const staccato_ctx *ctx);
STACCATO_API uint64_t staccato_parent_call_id(const staccato_ctx *ctx);

/* The invocation's W3C trace context, when it has one (on an engine that
 * traces, --otlp-endpoint: it records the call, or its caller sent a context;
 * internal calls carry it without being told): the
 * trace id (32 lower-case hex digits), a traceparent header value naming this
 * invocation's span as the parent (for calls to services outside Staccato),
 * and the caller's tracestate.  Each is "" when there is none; valid until
 * staccato_handle returns. */
STACCATO_API const char *staccato_trace_id(const staccato_ctx *ctx);
STACCATO_API const char *staccato_traceparent(const staccato_ctx *ctx);
STACCATO_API const char *staccato_tracestate(const staccato_ctx *ctx);

/* Absolute deadline in microseconds since the Unix epoch, 0 = none. */
STACCATO_API int64_t staccato_deadline_us(const staccato_ctx *ctx);

/* Microseconds left until the deadline (0 once it has passed), -1 = none. */
STACCATO_API int64_t staccato_remaining_us(const staccato_ctx *ctx);

/* Writes one line to stderr: "[<function> <call id, 16 hex digits>] <message>".
 * ctx may be NULL (call id 0). */
STACCATO_API void staccato_log(staccato_ctx *ctx, const char *fmt, ...) STACCATO_PRINTF(2, 3);

/*
 * Calls another function synchronously and waits for its result.  The callee
 * inherits this invocation's deadline.  Thread-safe: several threads of the
 * running invocation may each have a call in flight at the same time.  out may be NULL to discard the
 * result; otherwise *out is always filled in and must be released with
 * staccato_result_free.  Returns 0 on success or the error kind (also in
 * out->error_kind):
 *   STACCATO_ERR_BAD_REQUEST       function name empty or longer than
 *                                  STACCATO_NAME_MAX, or input NULL with len > 0
 *   STACCATO_ERR_PAYLOAD_TOO_LARGE input larger than the configured maximum
 *   STACCATO_ERR_TIMEOUT           the deadline has already passed
 *   anything else                  as reported by the engine / callee
 * The first three are detected locally and nothing is sent.
 */
STACCATO_API int staccato_call(staccato_ctx *ctx, const char *function, const void *input,
                               size_t input_len, staccato_result *out);

/* Frees out->data and resets *out.  Safe on a zeroed or already-freed result. */
STACCATO_API void staccato_result_free(staccato_result *out);

#ifdef __cplusplus
}
#endif

#endif /* STACCATO_H */
