/*
 * worker.c - one worker process: serves Dispatch messages on its channel and
 * implements the public staccato_* API used by the handler.
 *
 * A worker runs one invocation at a time, so most state is static: one
 * context and the receive buffer of the Dispatch; messages are encoded in
 * buffers of the sending thread.  The inline hot path (Dispatch in,
 * Completion out, Invoke/Completion for internal calls) does no allocation;
 * the output and error buffers grow only when a handler needs more than
 * they hold.
 *
 * Internal calls may be made from several threads of one invocation at once
 * (fan-out).  Sending needs no lock of ours: every message is one 1024-byte
 * write(2), which the pipe performs atomically (<= PIPE_BUF).  Replies are
 * demultiplexed by call id without a thread of our own: each outstanding
 * staccato_call has a waiter (on its caller's stack) in a list guarded by
 * calls_mu, and one of the waiting threads at a time holds the reader role:
 * it reads the channel, keeps a reply to its own call, and hands every other
 * reply to the waiter it belongs to (copy + condition variable).  When the
 * reader's own reply arrives it gives the role up and wakes a sleeping
 * waiter to take it over.  With one call outstanding (the usual case) the
 * caller is the reader from the start and never sleeps on a condition
 * variable: the cost over the single-threaded code is two uncontended lock/
 * unlock pairs of calls_mu per call and no extra system call.
 */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "channel.h"
#include "runtime.h"
#include "shm.h"
#include "wire.h"

#define OUT_INITIAL_CAP 4096u
#define ERR_INITIAL_CAP 256u
#define LOG_LINE_MAX 4096u /* <= PIPE_BUF: one atomic write to a piped stderr */

struct staccato_ctx {
    uint64_t call_id;
    uint64_t parent_call_id;
    uint64_t deadline_us; /* as on the wire: 0 = none */
    int active;           /* inside staccato_handle */
    uint8_t *out;         /* output set by staccato_set_output */
    size_t out_len, out_cap;
    int out_error;        /* STACCATO_ERR_* if the last staccato_set_output failed */
    size_t out_error_len; /* the length it was asked to store */
    char *err;            /* message set by staccato_set_error */
    size_t err_cap;
    int has_err;
    /* The Dispatch's trace context, formatted ("" when it has none). */
    char trace_id[33];
    char traceparent[56];
    char tracestate[STC_TRACE_STATE_MAX + 1];
};

static const stc_config *cfg;
static stc_chan chan;
static uint32_t worker_id;
static int stop_requested;   /* StopWorker arrived while a call was running (atomic access) */
static staccato_ctx the_ctx; /* the single context of this worker */
/* The CPU time of the dispatched call, for its reply (the engine asked). */
static struct {
    int set;
    uint64_t call_id;
    uint32_t us;
} reply_cpu;

/* rx_dispatch holds the Dispatch being served (its inline input is handed to
 * the handler and must stay intact); replies to internal calls are read into
 * the waiters' own buffers. */
static _Alignas(64) uint8_t rx_dispatch[STC_MSG_LEN];

/* One outstanding staccato_call.  Lives on the caller's stack. */
typedef struct waiter {
    struct waiter *next;
    uint64_t call_id;
    int done;       /* the reply was delivered into h and rx (w is off the list) */
    int sleeping;   /* blocked on cond; only sleeping waiters are signalled */
    int cond_ready; /* cond initialized (lazily: only a waiter that sleeps needs it) */
    pthread_cond_t cond;
    stc_header h; /* the reply, once delivered */
    _Alignas(64) uint8_t rx[STC_MSG_LEN];
} waiter;

/* Receiving replies: guarded by calls_mu. */
static pthread_mutex_t calls_mu = PTHREAD_MUTEX_INITIALIZER;
static uint32_t call_seq; /* low half of internal call ids; 0 is never used */
static waiter *waiters;   /* outstanding calls whose reply has not been delivered */
static int reader_busy;   /* a waiter holds the reader role */

static const uint8_t empty_input[1];

void stc_runtime_init(const stc_config *c) { cfg = c; }

/* ---- sending ----------------------------------------------------------- */

/* A failed send means the engine closed the channel (EPIPE): like end of
 * file on e2w, that ends the worker. */
static _Noreturn void engine_gone(int err)
{
    if (err != EPIPE)
        stc_logf("worker %u: channel write failed: %s", (unsigned)worker_id, strerror(err));
    exit(err == EPIPE ? 0 : 1);
}

/* Encodes h with its inline bytes (inline_used(h) bytes of a, then of b)
 * into msg, a buffer of the sending thread, and writes it.  Returns 0, or -1
 * with errno set if the write failed.  Headers built here are valid by
 * construction; an encoding failure is a bug in this file.
 *
 * Any thread may send.  A message goes out in one write(2) of 1024 bytes,
 * which a pipe performs atomically (<= PIPE_BUF, docs/protocol.md): the
 * kernel's pipe lock serializes whole messages, so no lock of ours is needed
 * as long as each sender encodes into a buffer of its own. */
static int send_parts(uint8_t msg[STC_MSG_LEN], const stc_header *h, const void *a, size_t a_len, const void *b)
{
    stc_wire_status st = stc_encode_header(h, msg);
    if (st != STC_WIRE_OK) {
        stc_logf("worker %u: internal error encoding kind %u: %s", (unsigned)worker_id, h->kind,
                 stc_wire_strerror(st));
        abort();
    }
    size_t used = stc_inline_used(h);
    if (a_len > used)
        a_len = used;
    if (a_len > 0)
        memcpy(msg + STC_HEADER_LEN, a, a_len);
    if (used > a_len)
        memcpy(msg + STC_HEADER_LEN + a_len, b, used - a_len);
    return stc_chan_send(&chan, msg);
}

static void send_msg(const stc_header *h, const void *inline_bytes)
{
    _Alignas(64) uint8_t msg[STC_MSG_LEN];
    if (send_parts(msg, h, inline_bytes, stc_inline_used(h), NULL) < 0)
        engine_gone(errno);
}

static void send_failuref(uint64_t call_id, uint16_t error_kind, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Sends Completion (error_kind 0) or Failure for call_id, inline when the
 * payload fits and through the shm output file otherwise. */
static void send_result(uint64_t call_id, uint16_t error_kind, const void *data, size_t len)
{
    stc_header h = {
        .kind = error_kind ? STC_FAILURE : STC_COMPLETION,
        .payload_len = (uint32_t)len,
        .call_id = call_id,
        .worker_id = worker_id,
        .error_kind = error_kind,
    };
    if (len > STC_INLINE_MAX) {
        if (stc_shm_write(cfg->shm_dir, call_id, STC_SHM_OUTPUT, data, len) < 0) {
            send_failuref(call_id, STACCATO_ERR_INTERNAL, "cannot write %zu-byte output file: %s", len,
                          strerror(errno));
            return;
        }
        h.flags = STC_FLAG_SHM;
    }
    if (reply_cpu.set && reply_cpu.call_id == call_id) {
        h.flags |= STC_FLAG_CPU;
        h.aux = reply_cpu.us;
    }
    _Alignas(64) uint8_t msg[STC_MSG_LEN];
    if (send_parts(msg, &h, data, stc_inline_used(&h), NULL) == 0)
        return;
    int err = errno;
    if (h.flags & STC_FLAG_SHM)
        stc_shm_unlink(cfg->shm_dir, call_id, STC_SHM_OUTPUT);
    engine_gone(err);
}

/* Failure with a short host-generated message (always inline). */
static void send_failuref(uint64_t call_id, uint16_t error_kind, const char *fmt, ...)
{
    char msg[STC_INLINE_MAX + 1];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    size_t len = n < 0 ? 0 : (size_t)n < sizeof msg ? (size_t)n : sizeof msg - 1;
    send_result(call_id, error_kind, msg, len);
}

/* ---- messages that arrive at the wrong time ---------------------------- */

/* Deals with a valid message that is not what the worker is waiting for.
 * busy: a handler is running (we are inside staccato_call). */
static void handle_stray(const stc_header *h, int busy)
{
    int in_shm = (h->flags & STC_FLAG_SHM) != 0;
    switch (h->kind) {
    case STC_DISPATCH:
        /* The engine dispatches only to idle workers; refuse rather than
         * leave the engine waiting forever. */
        if (in_shm)
            stc_shm_unlink(cfg->shm_dir, h->call_id, STC_SHM_INPUT);
        stc_logf("worker %u: Dispatch %016llx while busy", (unsigned)worker_id,
                 (unsigned long long)h->call_id);
        send_failuref(h->call_id, STACCATO_ERR_INTERNAL, "worker %u is busy", (unsigned)worker_id);
        break;
    case STC_STOP_WORKER:
        __atomic_store_n(&stop_requested, 1, __ATOMIC_RELAXED); /* finish the running call first */
        break;
    case STC_COMPLETION:
    case STC_FAILURE:
        /* A result for no outstanding call: drop it, and its file. */
        if (in_shm)
            stc_shm_unlink(cfg->shm_dir, h->call_id, STC_SHM_OUTPUT);
        stc_logf("worker %u: dropping result for unknown call %016llx", (unsigned)worker_id,
                 (unsigned long long)h->call_id);
        break;
    default:
        stc_logf("worker %u: ignoring unexpected message kind %u%s", (unsigned)worker_id, h->kind,
                 busy ? " during a call" : "");
        break;
    }
}

/* Receives the next valid message into buf; invalid ones are logged and
 * skipped (messages are fixed-size, so one bad message cannot desynchronize
 * the stream).  End of file means the engine is gone: exit. */
static void recv_msg(uint8_t *buf, stc_header *h)
{
    for (;;) {
        int r = stc_chan_recv(&chan, buf);
        if (r == 0)
            exit(0);
        if (r < 0) {
            stc_logf("worker %u: channel read failed: %s", (unsigned)worker_id, strerror(errno));
            exit(1);
        }
        stc_wire_status st = stc_decode(buf, STC_MSG_LEN, h);
        if (st == STC_WIRE_OK)
            return;
        stc_logf("worker %u: dropping invalid message: %s", (unsigned)worker_id, stc_wire_strerror(st));
    }
}

/* ---- serving a Dispatch ------------------------------------------------ */

static void hex(char *out, const uint8_t *b, size_t n)
{
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[b[i] >> 4];
        out[2 * i + 1] = digits[b[i] & 15];
    }
    out[2 * n] = 0;
}

/* The trace context at the start of the Dispatch's inline area, if any
 * (name_len bytes: trace id, span id, flags, state). */
static void ctx_trace(staccato_ctx *ctx, const stc_header *h, const uint8_t *t)
{
    if (h->name_len < STC_TRACE_CONTEXT_LEN) {
        ctx->trace_id[0] = ctx->traceparent[0] = ctx->tracestate[0] = 0;
        return;
    }
    hex(ctx->trace_id, t, 16);
    char span[17];
    hex(span, t + 16, 8);
    snprintf(ctx->traceparent, sizeof ctx->traceparent, "00-%s-%s-0%c", ctx->trace_id, span, t[24] & 1 ? '1' : '0');
    size_t n = h->name_len - STC_TRACE_CONTEXT_LEN; /* <= STC_TRACE_STATE_MAX (stc_validate) */
    memcpy(ctx->tracestate, t + STC_TRACE_CONTEXT_LEN, n);
    ctx->tracestate[n] = 0;
}

static void ctx_begin(staccato_ctx *ctx, const stc_header *h)
{
    ctx_trace(ctx, h, rx_dispatch + STC_HEADER_LEN);
    ctx->call_id = h->call_id;
    ctx->parent_call_id = h->parent_call_id;
    ctx->deadline_us = h->deadline_us;
    ctx->out_len = 0;
    ctx->out_error = 0;
    ctx->has_err = 0;
    ctx->active = 1;
}

/* Sends the outcome of the handler (return value rc).  An output that could
 * not be stored decides the outcome whatever rc is: handlers commonly end
 * with "return staccato_set_output(...)", and either way the output the
 * handler meant to return cannot be delivered. */
static void finish_dispatch(const staccato_ctx *ctx, int rc)
{
    if (ctx->out_error == STACCATO_ERR_OUTPUT_TOO_LARGE) {
        send_failuref(ctx->call_id, STACCATO_ERR_OUTPUT_TOO_LARGE,
                      "%s: output of %zu bytes exceeds the maximum payload of %zu bytes", cfg->function,
                      ctx->out_error_len, cfg->payload_max);
    } else if (ctx->out_error != 0) {
        send_failuref(ctx->call_id, (uint16_t)ctx->out_error, "%s: cannot store output of %zu bytes",
                      cfg->function, ctx->out_error_len);
    } else if (rc == 0) {
        send_result(ctx->call_id, 0, ctx->out, ctx->out_len);
    } else if (ctx->has_err) {
        size_t len = strlen(ctx->err);
        send_result(ctx->call_id, STACCATO_ERR_FUNCTION_ERROR, ctx->err,
                    len < cfg->payload_max ? len : cfg->payload_max);
    } else {
        send_failuref(ctx->call_id, STACCATO_ERR_FUNCTION_ERROR, "%s: staccato_handle returned %d", cfg->function,
                      rc);
    }
}

static void serve_dispatch(const stc_header *h)
{
    /* After the trace context, if the call has one. */
    const uint8_t *input = rx_dispatch + STC_HEADER_LEN + h->name_len;
    const void *mapped = NULL;
    size_t len = h->payload_len;
    if (!(h->flags & STC_FLAG_SHM))
        len -= h->name_len; /* <= payload_len (stc_validate) */
    if (h->flags & STC_FLAG_SHM) {
        if (len > cfg->payload_max) {
            stc_shm_unlink(cfg->shm_dir, h->call_id, STC_SHM_INPUT);
            send_failuref(h->call_id, STACCATO_ERR_PAYLOAD_TOO_LARGE,
                          "input of %zu bytes exceeds the maximum payload of %zu bytes", len, cfg->payload_max);
            return;
        }
        if (stc_shm_map(cfg->shm_dir, h->call_id, STC_SHM_INPUT, len, &mapped) < 0) {
            send_failuref(h->call_id, STACCATO_ERR_INTERNAL, "cannot read %zu-byte input file: %s", len,
                          strerror(errno));
            return;
        }
        input = mapped ? mapped : empty_input;
    }
    ctx_begin(&the_ctx, h);
    /* The handler's thread's CPU time, when the engine asks for it. */
    int measure = (h->flags & STC_FLAG_CPU) != 0;
    struct timespec c0 = {0}, c1 = {0};
    if (measure)
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c0);
    int rc = cfg->handle(&the_ctx, input, len);
    if (measure) {
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1);
        int64_t us = ((int64_t)(c1.tv_sec - c0.tv_sec) * 1000000000 + (c1.tv_nsec - c0.tv_nsec)) / 1000;
        reply_cpu.us = us < 0 ? 0 : us > UINT32_MAX ? UINT32_MAX : (uint32_t)us;
        reply_cpu.call_id = h->call_id;
        reply_cpu.set = 1;
    }
    the_ctx.active = 0;
    stc_shm_unmap(mapped, len);
    finish_dispatch(&the_ctx, rc);
    reply_cpu.set = 0;
}

static void ctx_init(staccato_ctx *ctx)
{
    ctx->out = malloc(OUT_INITIAL_CAP);
    ctx->err = malloc(ERR_INITIAL_CAP);
    if (ctx->out == NULL || ctx->err == NULL) {
        stc_logf("worker %u: out of memory", (unsigned)worker_id);
        exit(1);
    }
    ctx->out_cap = OUT_INITIAL_CAP;
    ctx->err_cap = ERR_INITIAL_CAP;
}

_Noreturn void stc_worker_main(const stc_config *c, uint32_t id)
{
    cfg = c;
    worker_id = id;
    ctx_init(&the_ctx);
    if (stc_chan_open(&chan, cfg->ipc_dir, id, cfg->spin_us) < 0) {
        stc_logf("worker %u: cannot open channel in %s: %s", (unsigned)id, cfg->ipc_dir, strerror(errno));
        exit(1);
    }
    stc_header hello = {.kind = STC_WORKER_HELLO, .worker_id = id, .aux = (uint32_t)getpid()};
    send_msg(&hello, NULL);
    for (;;) {
        stc_header h;
        recv_msg(rx_dispatch, &h);
        if (h.kind == STC_DISPATCH)
            serve_dispatch(&h);
        else if (h.kind == STC_STOP_WORKER)
            exit(0);
        else
            handle_stray(&h, 0);
        if (__atomic_load_n(&stop_requested, __ATOMIC_RELAXED))
            exit(0);
    }
}

/* ---- public API: context ----------------------------------------------- */

/* Returns buf grown to hold at least need bytes (doubling, so repeated
 * growth is amortized) and updates *cap, or NULL when out of memory (buf and
 * *cap unchanged). */
static void *reserve(void *buf, size_t *cap, size_t need)
{
    if (need <= *cap)
        return buf;
    size_t ncap = *cap * 2 > need ? *cap * 2 : need;
    void *p = realloc(buf, ncap);
    if (p != NULL)
        *cap = ncap;
    return p;
}

int staccato_set_output(staccato_ctx *ctx, const void *data, size_t len)
{
    if (ctx == NULL)
        return STACCATO_ERR_INTERNAL;
    if (data == NULL && len > 0)
        return STACCATO_ERR_BAD_REQUEST;
    int kind = STACCATO_OK;
    if (len > cfg->payload_max) {
        kind = STACCATO_ERR_OUTPUT_TOO_LARGE;
    } else {
        uint8_t *buf = reserve(ctx->out, &ctx->out_cap, len);
        if (buf == NULL)
            kind = STACCATO_ERR_OUT_OF_MEMORY;
        else
            ctx->out = buf;
    }
    ctx->out_error = kind;
    ctx->out_error_len = len;
    if (kind != STACCATO_OK) {
        ctx->out_len = 0;
        return kind;
    }
    if (len > 0)
        memcpy(ctx->out, data, len);
    ctx->out_len = len;
    return STACCATO_OK;
}

int staccato_set_error(staccato_ctx *ctx, const char *fmt, ...)
{
    if (ctx == NULL)
        return STACCATO_ERR_INTERNAL;
    ctx->has_err = 0;
    if (fmt == NULL)
        return STACCATO_OK;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(ctx->err, ctx->err_cap, fmt, ap);
    va_end(ap);
    if (n < 0)
        return STACCATO_ERR_BAD_REQUEST; /* invalid format */
    if ((size_t)n >= ctx->err_cap) {
        char *buf = reserve(ctx->err, &ctx->err_cap, (size_t)n + 1);
        if (buf == NULL)
            return STACCATO_ERR_OUT_OF_MEMORY;
        ctx->err = buf;
        va_start(ap, fmt);
        vsnprintf(ctx->err, ctx->err_cap, fmt, ap);
        va_end(ap);
    }
    ctx->has_err = 1;
    return STACCATO_OK;
}

uint64_t staccato_call_id(const staccato_ctx *ctx) { return ctx ? ctx->call_id : 0; }

uint64_t staccato_parent_call_id(const staccato_ctx *ctx) { return ctx ? ctx->parent_call_id : 0; }

const char *staccato_trace_id(const staccato_ctx *ctx) { return ctx ? ctx->trace_id : ""; }

const char *staccato_traceparent(const staccato_ctx *ctx) { return ctx ? ctx->traceparent : ""; }

const char *staccato_tracestate(const staccato_ctx *ctx) { return ctx ? ctx->tracestate : ""; }

int64_t staccato_deadline_us(const staccato_ctx *ctx)
{
    if (ctx == NULL)
        return 0;
    /* The wire field is unsigned; anything past INT64_MAX is "very far away". */
    return ctx->deadline_us > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)ctx->deadline_us;
}

int64_t staccato_remaining_us(const staccato_ctx *ctx)
{
    if (ctx == NULL || ctx->deadline_us == 0)
        return -1;
    uint64_t now = stc_realtime_us();
    if (now >= ctx->deadline_us)
        return 0;
    uint64_t left = ctx->deadline_us - now;
    return left > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)left;
}

void staccato_log(staccato_ctx *ctx, const char *fmt, ...)
{
    char line[LOG_LINE_MAX];
    const size_t room = sizeof line - 1; /* keep one byte for the newline */
    int n = snprintf(line, room, "[%s %016llx] ", cfg ? cfg->function : "?",
                     (unsigned long long)(ctx ? ctx->call_id : 0));
    size_t len = n < 0 ? 0 : (size_t)n < room ? (size_t)n : room - 1;
    va_list ap;
    va_start(ap, fmt);
    n = vsnprintf(line + len, room - len, fmt ? fmt : "", ap);
    va_end(ap);
    if (n > 0) /* vsnprintf truncates to room - len - 1 characters */
        len += (size_t)n < room - len ? (size_t)n : room - len - 1;
    while (len > 0 && line[len - 1] == '\n') /* exactly one newline */
        len--;
    line[len++] = '\n';
    ssize_t w;
    do
        w = write(STDERR_FILENO, line, len);
    while (w < 0 && errno == EINTR);
}

/* ---- public API: internal calls ---------------------------------------- */

/* Fills *out with a locally generated error (nothing was sent). */
static int local_error(staccato_result *out, int kind, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int local_error(staccato_result *out, int kind, const char *fmt, ...)
{
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    size_t len = n < 0 ? 0 : (size_t)n < sizeof msg ? (size_t)n : sizeof msg - 1;
    out->error_kind = kind;
    out->data = malloc(len + 1);
    out->len = out->data ? len : 0;
    if (out->data)
        memcpy(out->data, msg, len + 1);
    return kind;
}

/* Checks what can be checked without asking the engine.  Returns 0 or the
 * error kind (with *out filled in); sets *name_len. */
static int check_call(const staccato_ctx *ctx, const char *function, const void *input, size_t input_len,
                      staccato_result *out, size_t *name_len)
{
    if (ctx == NULL || ctx != &the_ctx || !ctx->active)
        return local_error(out, STACCATO_ERR_INTERNAL, "staccato_call outside of a running invocation");
    *name_len = function ? strnlen(function, STC_NAME_MAX + 1) : 0;
    if (*name_len == 0 || *name_len > STC_NAME_MAX)
        return local_error(out, STACCATO_ERR_BAD_REQUEST, "function name must be 1 to %u bytes",
                           (unsigned)STC_NAME_MAX);
    if (input == NULL && input_len > 0)
        return local_error(out, STACCATO_ERR_BAD_REQUEST, "input is NULL but input_len is %zu", input_len);
    if (input_len > cfg->payload_max)
        return local_error(out, STACCATO_ERR_PAYLOAD_TOO_LARGE,
                           "input of %zu bytes exceeds the maximum payload of %zu bytes", input_len,
                           cfg->payload_max);
    if (ctx->deadline_us != 0 && stc_realtime_us() >= ctx->deadline_us)
        return local_error(out, STACCATO_ERR_TIMEOUT, "deadline passed before calling %s", function);
    return 0;
}

/* Caller holds calls_mu. */
static uint64_t next_call_id(void)
{
    if (++call_seq == 0) /* after 2^32 calls: skip 0 so ids never collide with "none" */
        call_seq = 1;
    return (uint64_t)worker_id << 32 | call_seq;
}

/* Sends the Invoke: name and input inline if both fit, else the name inline
 * and the input in the shm input file.  Returns 0 or -1 (errno set) if the
 * input file cannot be written.  (Not encoded in the waiter's rx: the reader
 * may copy the reply there as soon as the engine has read the Invoke.) */
static int send_invoke(const staccato_ctx *ctx, uint64_t call_id, const char *name, size_t name_len,
                       const void *input, size_t input_len)
{
    stc_header h = {
        .kind = STC_INVOKE,
        .call_id = call_id,
        .parent_call_id = ctx->call_id,
        .worker_id = worker_id,
        .name_len = (uint16_t)name_len,
        .deadline_us = ctx->deadline_us,
    };
    int inline_input = name_len + input_len <= STC_INLINE_MAX;
    if (inline_input) {
        h.payload_len = (uint32_t)(name_len + input_len);
    } else {
        if (stc_shm_write(cfg->shm_dir, call_id, STC_SHM_INPUT, input, input_len) < 0)
            return -1;
        h.flags = STC_FLAG_SHM;
        h.payload_len = (uint32_t)input_len;
    }
    /* check_call guarantees a valid header. */
    _Alignas(64) uint8_t msg[STC_MSG_LEN];
    if (send_parts(msg, &h, name, name_len, input) < 0) {
        int err = errno;
        if (!inline_input)
            stc_shm_unlink(cfg->shm_dir, call_id, STC_SHM_INPUT);
        engine_gone(err);
    }
    return 0;
}

/* Moves the result carried by w (its Completion/Failure) into *out. */
static int take_result(const waiter *w, staccato_result *out)
{
    const stc_header *h = &w->h;
    int kind = h->kind == STC_COMPLETION ? STACCATO_OK : h->error_kind;
    size_t len = h->payload_len;
    if (h->flags & STC_FLAG_SHM) {
        if (stc_shm_read_alloc(cfg->shm_dir, h->call_id, STC_SHM_OUTPUT, len, &out->data) < 0)
            return local_error(out, errno == ENOMEM ? STACCATO_ERR_OUT_OF_MEMORY : STACCATO_ERR_INTERNAL,
                               "cannot read %zu-byte result file: %s", len, strerror(errno));
    } else if (len > 0) {
        out->data = malloc(len + 1);
        if (out->data == NULL)
            return local_error(out, STACCATO_ERR_OUT_OF_MEMORY, "no memory for a %zu-byte result", len);
        memcpy(out->data, w->rx + STC_HEADER_LEN, len);
        out->data[len] = 0;
    }
    out->len = len;
    out->error_kind = kind;
    return kind;
}

/* ---- demultiplexing replies (all with calls_mu held) -------------------- */

static void unlink_waiter(waiter *w)
{
    for (waiter **p = &waiters; *p != NULL; p = &(*p)->next) {
        if (*p == w) {
            *p = w->next;
            return;
        }
    }
}

/* The reader role is free: wake a sleeping waiter to take it.  Waiters that
 * are not asleep look at reader_busy before they sleep, so they need no
 * wake-up. */
static void hand_over_reader(void)
{
    reader_busy = 0;
    for (waiter *o = waiters; o != NULL; o = o->next) {
        if (o->sleeping) {
            pthread_cond_signal(&o->cond);
            return;
        }
    }
}

/* Delivers a reply read by the reader (into buf, decoded as h) to the
 * waiter of its call id and removes that waiter from the list.  Returns 0
 * if nobody waits for it. */
static int deliver(const stc_header *h, const uint8_t *buf)
{
    for (waiter **p = &waiters; *p != NULL; p = &(*p)->next) {
        waiter *o = *p;
        if (o->call_id == h->call_id) {
            *p = o->next;
            o->done = 1;
            o->h = *h;
            memcpy(o->rx, buf, STC_MSG_LEN);
            if (o->sleeping)
                pthread_cond_signal(&o->cond);
            return 1;
        }
    }
    return 0;
}

/* Registers w for a new call and returns its call id; *reader tells whether
 * the caller took the free reader role. */
static uint64_t register_call(waiter *w, int *reader)
{
    pthread_mutex_lock(&calls_mu);
    w->call_id = next_call_id();
    w->next = waiters;
    waiters = w;
    *reader = !reader_busy;
    reader_busy = 1;
    pthread_mutex_unlock(&calls_mu);
    return w->call_id;
}

/* Waits until the reply of w's call is in w->h / w->rx, reading the channel
 * whenever this thread holds the reader role.  w is off the list on return. */
static void await_result(waiter *w, int reader)
{
    for (;;) {
        if (reader) {
            recv_msg(w->rx, &w->h);
            const stc_header *h = &w->h;
            if (h->kind == STC_COMPLETION || h->kind == STC_FAILURE) {
                pthread_mutex_lock(&calls_mu);
                if (h->call_id == w->call_id) {
                    /* Ours: the usual case.  Pass the role on and return. */
                    unlink_waiter(w);
                    hand_over_reader();
                    pthread_mutex_unlock(&calls_mu);
                    return;
                }
                int delivered = deliver(h, w->rx);
                pthread_mutex_unlock(&calls_mu);
                if (delivered)
                    continue;
            }
            handle_stray(h, 1);
            continue;
        }
        /* Another thread reads: sleep until it delivers our reply or gives
         * the role up. */
        pthread_mutex_lock(&calls_mu);
        while (!w->done && reader_busy) {
            if (!w->cond_ready) {
                pthread_cond_init(&w->cond, NULL);
                w->cond_ready = 1;
            }
            w->sleeping = 1;
            pthread_cond_wait(&w->cond, &calls_mu);
            w->sleeping = 0;
        }
        if (w->done) {
            pthread_mutex_unlock(&calls_mu);
            return;
        }
        reader_busy = 1;
        reader = 1;
        pthread_mutex_unlock(&calls_mu);
    }
}

int staccato_call(staccato_ctx *ctx, const char *function, const void *input, size_t input_len,
                  staccato_result *out)
{
    staccato_result discard;
    staccato_result *res = out ? out : &discard;
    *res = (staccato_result){0};
    size_t name_len = 0;
    int kind = check_call(ctx, function, input, input_len, res, &name_len);
    if (kind == 0) {
        waiter w;
        w.done = w.sleeping = w.cond_ready = 0;
        int reader;
        uint64_t call_id = register_call(&w, &reader);
        if (send_invoke(ctx, call_id, function, name_len, input, input_len) < 0) {
            kind = local_error(res, STACCATO_ERR_INTERNAL, "cannot write %zu-byte input file: %s", input_len,
                               strerror(errno));
            pthread_mutex_lock(&calls_mu);
            unlink_waiter(&w);
            if (reader)
                hand_over_reader();
            pthread_mutex_unlock(&calls_mu);
        } else {
            await_result(&w, reader);
            kind = take_result(&w, res);
        }
        if (w.cond_ready)
            pthread_cond_destroy(&w.cond);
    }
    if (res == &discard)
        staccato_result_free(&discard);
    return kind;
}

void staccato_result_free(staccato_result *out)
{
    if (out == NULL)
        return;
    free(out->data);
    *out = (staccato_result){0};
}
