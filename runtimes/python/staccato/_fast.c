/* staccato._fast: the Python runtime's hot path in C (optional).
 *
 * A worker channel's messages are read, checked and, for the two kinds that
 * make up an internal call's round trip, handled here without running the
 * channel's Python code:
 *
 *   - an inline Dispatch: the Context is built, the handler called, and an
 *     inline result packed and written as the Completion;
 *   - an inline Completion: the waiting future gets its result; for a
 *     ctx.call made in C (a Call, below), its task is woken right here.
 *
 * Everything else (shm payloads, Failures, StopWorker, a handler that
 * raises or returns something unusual, a full pipe, end of file, a message
 * that fails a check) goes to the channel's Python methods, which do what
 * the pure-Python runtime does. channel.py imports this module when it was
 * built (scripts/setup.sh) and STACCATO_PY_PURE is unset; wire.py's checks
 * are the reference, and tests/test_fast.py holds the two to the same
 * answers.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#if PY_VERSION_HEX < 0x030A0000
#error "staccato._fast needs Python 3.10 or later (the runtime works without it)"
#endif
#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the wire format is little-endian and this module copies it as is"
#endif

/* docs/protocol.md §1; kept equal to wire.py (tests/test_fast.py checks). */
enum {
    MESSAGE_LEN = 1024,
    HEADER_LEN = 64,
    INLINE_MAX = MESSAGE_LEN - HEADER_LEN,
    CALLEE_NAME_MAX = 64,
    TRACE_CONTEXT_LEN = 25,
    TRACE_LEN_MAX = TRACE_CONTEXT_LEN + 512,
    ERROR_KIND_MAX = 14,
    READ_BUF = 64 * MESSAGE_LEN,
};
enum { K_DISPATCH = 5, K_COMPLETION = 6, K_FAILURE = 7, K_INVOKE = 8 };
enum { F_PAYLOAD_IN_SHM = 1, F_CPU_TIME = 2 };

struct header {
    uint16_t kind, flags;
    uint32_t payload_len;
    uint64_t call_id, parent_call_id;
    uint32_t worker_id;
    uint16_t name_len, error_kind;
    uint64_t deadline_us, send_ts_ns;
    uint32_t aux;
    uint8_t reserved[12];
};
_Static_assert(sizeof(struct header) == HEADER_LEN, "header layout");

static PyObject *WireError; /* staccato.wire.WireError, given by init() */

/* Checks one message like wire.decode; returns NULL when it is valid, else
 * a static description (the Python decode then builds the precise text). */
static const char *check(const struct header *h)
{
    static const uint8_t zeros[12];
    if (h->kind < 1 || h->kind > K_INVOKE)
        return "unknown kind";
    if (h->flags & ~(F_PAYLOAD_IN_SHM | F_CPU_TIME))
        return "unknown flag bits";
    if ((h->flags & F_CPU_TIME) && h->kind != K_DISPATCH && h->kind != K_COMPLETION && h->kind != K_FAILURE)
        return "CPU_TIME on a kind that cannot carry it";
    if (memcmp(h->reserved, zeros, sizeof zeros) != 0)
        return "reserved header bytes are not zero";
    if (h->kind == K_INVOKE) {
        if (h->name_len < 1 || h->name_len > CALLEE_NAME_MAX)
            return "Invoke name_len out of range";
    } else if (h->kind == K_DISPATCH) {
        if (h->name_len && (h->name_len < TRACE_CONTEXT_LEN || h->name_len > TRACE_LEN_MAX))
            return "Dispatch name_len out of range";
    } else if (h->name_len) {
        return "name_len on a kind without a name";
    }
    if (h->flags & F_PAYLOAD_IN_SHM) {
        if (h->kind < K_DISPATCH)
            return "PAYLOAD_IN_SHM on a kind without a payload";
    } else {
        if (h->payload_len > INLINE_MAX)
            return "inline payload_len too large";
        if (h->name_len > h->payload_len)
            return "name_len exceeds payload_len";
    }
    if (h->kind == K_FAILURE) {
        if (h->error_kind < 1 || h->error_kind > ERROR_KIND_MAX)
            return "Failure with an invalid error_kind";
    } else if (h->error_kind) {
        return "error_kind on a kind that is not a Failure";
    }
    return NULL;
}

static uint64_t now_ns(clockid_t clock)
{
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Fills a whole message: the header, `n` inline bytes, zeros after them. */
static void fill(char *out, const struct header *h, const char *inline_, Py_ssize_t n)
{
    memcpy(out, h, HEADER_LEN);
    memcpy(out + HEADER_LEN, inline_, (size_t)n);
    memset(out + HEADER_LEN + n, 0, (size_t)(INLINE_MAX - n));
}

/* Fills an Invoke: `h` with its lengths and send time, then the name and
 * the input inline (1..CALLEE_NAME_MAX and together <= INLINE_MAX). */
static void fill_invoke(char *out, struct header *h, const char *name, Py_ssize_t name_len, const char *data,
                        Py_ssize_t n)
{
    h->kind = K_INVOKE;
    h->name_len = (uint16_t)name_len;
    h->payload_len = (uint32_t)(name_len + n);
    h->send_ts_ns = now_ns(CLOCK_MONOTONIC);
    memcpy(out, h, HEADER_LEN);
    memcpy(out + HEADER_LEN, name, (size_t)name_len);
    memcpy(out + HEADER_LEN + name_len, data, (size_t)n);
    memset(out + HEADER_LEN + name_len + n, 0, (size_t)(INLINE_MAX - name_len - n));
}

/* ---- pack / check_message: wire.py's fast path and its tests ---------- */

static PyObject *fast_pack(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 12) {
        PyErr_Format(PyExc_TypeError, "pack takes 12 arguments (%zd given)", nargs);
        return NULL;
    }
    unsigned long long v[11];
    for (int i = 0; i < 11; i++) {
        v[i] = PyLong_AsUnsignedLongLong(args[i]);
        if (v[i] == (unsigned long long)-1 && PyErr_Occurred())
            return NULL;
    }
    /* The same ranges struct.pack("<HHIQQIHHQQI12s") enforces. */
    static const unsigned long long max[11] = {
        0xFFFF, 0xFFFF, 0xFFFFFFFF, UINT64_MAX, UINT64_MAX, 0xFFFFFFFF, 0xFFFF, 0xFFFF,
        UINT64_MAX, UINT64_MAX, 0xFFFFFFFF,
    };
    for (int i = 0; i < 11; i++)
        if (v[i] > max[i])
            return PyErr_Format(PyExc_OverflowError, "pack: argument %d is out of range", i + 1), NULL;
    Py_buffer in;
    if (PyObject_GetBuffer(args[11], &in, PyBUF_SIMPLE) < 0)
        return NULL;
    if (in.len > INLINE_MAX) {
        PyErr_Format(WireError ? WireError : PyExc_ValueError, "inline payload of %zd bytes exceeds %d", in.len,
                     INLINE_MAX);
        PyBuffer_Release(&in);
        return NULL;
    }
    struct header h = {
        .kind = (uint16_t)v[0], .flags = (uint16_t)v[1], .payload_len = (uint32_t)v[2],
        .call_id = v[3], .parent_call_id = v[4], .worker_id = (uint32_t)v[5],
        .name_len = (uint16_t)v[6], .error_kind = (uint16_t)v[7], .deadline_us = v[8],
        .send_ts_ns = v[9], .aux = (uint32_t)v[10],
    };
    PyObject *out = PyBytes_FromStringAndSize(NULL, MESSAGE_LEN);
    if (out)
        fill(PyBytes_AS_STRING(out), &h, in.buf, in.len);
    PyBuffer_Release(&in);
    return out;
}

/* check_message(buf) -> None if wire.decode would accept it, else a short
 * description. For tests: the reader uses check() directly. */
static PyObject *fast_check_message(PyObject *self, PyObject *arg)
{
    (void)self;
    Py_buffer b;
    if (PyObject_GetBuffer(arg, &b, PyBUF_SIMPLE) < 0)
        return NULL;
    const char *why = "message is not 1024 bytes";
    if (b.len == MESSAGE_LEN) {
        struct header h;
        memcpy(&h, b.buf, HEADER_LEN);
        why = check(&h);
    }
    PyBuffer_Release(&b);
    if (!why)
        Py_RETURN_NONE;
    return PyUnicode_FromString(why);
}

/* ---- Reader: one worker channel's e2w side ---------------------------- */

static PyTypeObject CtxType, CallType;

typedef struct {
    PyObject_HEAD
    PyObject *channel;      /* the WorkerChannel */
    PyObject *pending;      /* its _pending dict: call_id -> Future */
    PyObject *handler;
    PyObject *context_type; /* staccato.context.Context */
    PyObject *loop;         /* the channel's event loop */
    int rfd, wfd;
    uint32_t worker_id;
    uint32_t seq;           /* the last Invoke's sequence number (0: none yet) */
    int handler_is_async;
    int ctx_fast;           /* context_type is a ContextBase: built without Python code */
    char closed;            /* the channel closed: set by WorkerChannel.close before it closes the fds */
    char backlogged;        /* the channel's Python send() queues messages: set by the channel */
    Py_ssize_t have;        /* bytes of a partial message at buf[0:] */
    char buf[READ_BUF];
} Reader;

static PyObject *s_slow, *s_eof_read, *s_read_failed, *s_spawn, *s_handler_failed,
    *s_send_result, *s_send, *s_cpu, *s_await, *s_done, *s_set_result, *s_call_soon, *s_start_call;
static PyObject *context_kwnames; /* ("context",) */
static PyObject *CancelledError, *InvalidStateError, *current_tasks, *current_task, *slow_call;

static int reader_traverse(Reader *r, visitproc visit, void *arg)
{
    Py_VISIT(r->channel);
    Py_VISIT(r->pending);
    Py_VISIT(r->handler);
    Py_VISIT(r->context_type);
    Py_VISIT(r->loop);
    return 0;
}

static int reader_clear(Reader *r)
{
    Py_CLEAR(r->channel);
    Py_CLEAR(r->pending);
    Py_CLEAR(r->handler);
    Py_CLEAR(r->context_type);
    Py_CLEAR(r->loop);
    return 0;
}

static void reader_dealloc(Reader *r)
{
    PyObject_GC_UnTrack(r);
    reader_clear(r);
    Py_TYPE(r)->tp_free((PyObject *)r);
}

static int reader_init(Reader *r, PyObject *args, PyObject *kw)
{
    static char *names[] = {"channel", "pending", "handler", "handler_is_async", "context_type", "rfd", "wfd",
                            "worker_id", "loop", NULL};
    PyObject *channel, *pending, *handler, *context_type, *loop = Py_None;
    int is_async, rfd, wfd;
    unsigned long worker_id;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO!OpOiik|O", names, &channel, &PyDict_Type, &pending, &handler,
                                     &is_async, &context_type, &rfd, &wfd, &worker_id, &loop))
        return -1;
    if (worker_id > 0xFFFFFFFFul) {
        PyErr_SetString(PyExc_ValueError, "worker_id is out of range");
        return -1;
    }
    Py_XSETREF(r->channel, Py_NewRef(channel));
    Py_XSETREF(r->pending, Py_NewRef(pending));
    Py_XSETREF(r->handler, Py_NewRef(handler));
    Py_XSETREF(r->context_type, Py_NewRef(context_type));
    int ctx_fast = PyType_Check(context_type) && PyType_IsSubtype((PyTypeObject *)context_type, &CtxType);
    if (ctx_fast && loop == Py_None) {
        /* Its Contexts' calls wait on it. */
        PyErr_SetString(PyExc_TypeError, "a Reader building ContextBase contexts needs the channel's loop");
        return -1;
    }
    Py_XSETREF(r->loop, Py_NewRef(loop));
    r->ctx_fast = ctx_fast;
    r->handler_is_async = is_async;
    r->rfd = rfd;
    r->wfd = wfd;
    r->worker_id = (uint32_t)worker_id;
    r->have = 0;
    r->closed = r->backlogged = 0;
    return 0;
}

/* 1 if the channel is closed, 0 if not (WorkerChannel.close tells the
 * reader first: this is channel.closed without an attribute lookup). */
static int channel_closed(Reader *r)
{
    return r->closed;
}

/* Calls channel.<name>(*args); returns 0, or -1 with an exception set. */
static int call_channel(Reader *r, PyObject *name, PyObject *const *args, size_t n)
{
    PyObject *stack[4] = {r->channel};
    for (size_t i = 0; i < n; i++)
        stack[i + 1] = args[i];
    PyObject *res = PyObject_VectorcallMethod(name, stack, (n + 1) | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    if (!res)
        return -1;
    Py_DECREF(res);
    return 0;
}

/* Writes one message to w2e when nothing is queued before it; anything
 * else (a backlog, EAGAIN, an error) is the Python send()'s to handle. */
static int send_message(Reader *r, const char *msg)
{
    /* A closed channel's fd numbers may already name another channel's. */
    if (channel_closed(r))
        return 0;
    if (!r->backlogged) {
        ssize_t n = write(r->wfd, msg, MESSAGE_LEN);
        if (n == MESSAGE_LEN)
            return 0;
        /* A message is <= PIPE_BUF, so a write is all of it or nothing. */
    }
    PyObject *data = PyBytes_FromStringAndSize(msg, MESSAGE_LEN);
    if (!data)
        return -1;
    int rc = call_channel(r, s_send, &data, 1);
    Py_DECREF(data);
    return rc;
}

/* A new internal call id: worker id << 32 | a 32-bit sequence, never 0. */
static unsigned long long next_id(Reader *r)
{
    r->seq = r->seq == UINT32_MAX ? 1 : r->seq + 1;
    return ((unsigned long long)r->worker_id << 32) | r->seq;
}

/* ---- ContextBase and Call: ctx.call without Python code -----------------
 *
 * context.Context subclasses ContextBase when this module is in use. A
 * Context the reader builds for an inline Dispatch knows its reader, and
 * its call(name, data) returns a Call when the Invoke fits inline; any
 * other call (another argument type, a payload for shm, a Context built in
 * Python) goes to context._call_py, the pure runtime's coroutine.
 *
 * A Call is both the coroutine ctx.call returns and the future it waits
 * on, so a call costs one object. It is lazy like a coroutine: the Invoke
 * is sent when it is first awaited (sent None). It then yields itself to
 * the task awaiting it, as an asyncio Future does (_asyncio_future_blocking,
 * get_loop, add_done_callback, cancel, result); the task never sees another
 * object, since ctx.call is all users are given. An inline Completion read
 * by the reader runs the task's wake-up at once, in the task's context,
 * instead of queueing it on the loop: the same steps as a Future's reply,
 * one trip through the loop's ready queue fewer. Everything else that ends
 * a Call (a Failure, a closed channel, a cancellation) queues the wake-ups
 * with loop.call_soon, as a Future does. */

typedef struct {
    PyObject_HEAD
    PyObject *channel, *logger, *trace;
    Reader *reader; /* set when the reader built it, else NULL */
    unsigned long long call_id, parent_call_id, deadline_us;
} Ctx;

/* A Python subclass's subtype_dealloc and subtype_traverse take care of
 * its type (the reference and the visit) around these. */
static int ctx_traverse(Ctx *c, visitproc visit, void *arg)
{
    Py_VISIT(c->channel);
    Py_VISIT(c->logger);
    Py_VISIT(c->trace);
    Py_VISIT(c->reader);
    return 0;
}

static int ctx_clear(Ctx *c)
{
    Py_CLEAR(c->channel);
    Py_CLEAR(c->logger);
    Py_CLEAR(c->trace);
    Py_CLEAR(c->reader);
    return 0;
}

static void ctx_dealloc(Ctx *c)
{
    PyObject_GC_UnTrack(c);
    ctx_clear(c);
    Py_TYPE(c)->tp_free((PyObject *)c);
}

static int ctx_init(Ctx *c, PyObject *args, PyObject *kw)
{
    static char *names[] = {"channel", "call_id", "parent_call_id", "deadline_us", "trace", NULL};
    PyObject *channel, *trace = Py_None;
    unsigned long long call_id, parent, deadline;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OKKK|O", names, &channel, &call_id, &parent, &deadline, &trace))
        return -1;
    Py_XSETREF(c->channel, Py_NewRef(channel));
    Py_XSETREF(c->trace, Py_NewRef(trace));
    Py_CLEAR(c->logger);
    Py_CLEAR(c->reader);
    c->call_id = call_id;
    c->parent_call_id = parent;
    c->deadline_us = deadline;
    return 0;
}

/* A Context for an inline Dispatch, without running Python code. */
static PyObject *ctx_build(Reader *r, const struct header *h, PyObject *trace)
{
    PyTypeObject *tp = (PyTypeObject *)r->context_type;
    Ctx *c = (Ctx *)tp->tp_alloc(tp, 0);
    if (!c)
        return NULL;
    c->channel = Py_NewRef(r->channel);
    c->trace = Py_NewRef(trace);
    c->reader = (Reader *)Py_NewRef(r);
    c->call_id = h->call_id;
    c->parent_call_id = h->parent_call_id;
    c->deadline_us = h->deadline_us;
    return (PyObject *)c;
}

enum { CALL_NEW, CALL_PENDING, CALL_RESULT, CALL_ERROR, CALL_CANCELLED };

typedef struct {
    PyObject_HEAD
    Reader *reader;
    PyObject *name, *data; /* str, and bytes or str, until the Invoke is sent */
    PyObject *value;       /* the result bytes, the exception, or the cancel message */
    PyObject *cb, *cb_context; /* the first done callback and its context (or None), or NULL */
    PyObject *callbacks;   /* the others: a list of (fn, context or None), or NULL */
    unsigned long long call_id, parent_call_id, deadline_us;
    unsigned long cb_version; /* changes with every change of the callbacks */
    int state;
    int blocking;          /* _asyncio_future_blocking */
    int yielded;
} Call;

static int call_traverse(Call *c, visitproc visit, void *arg)
{
    Py_VISIT(c->reader);
    Py_VISIT(c->name);
    Py_VISIT(c->data);
    Py_VISIT(c->value);
    Py_VISIT(c->cb);
    Py_VISIT(c->cb_context);
    Py_VISIT(c->callbacks);
    return 0;
}

static int call_clear(Call *c)
{
    Py_CLEAR(c->reader);
    Py_CLEAR(c->name);
    Py_CLEAR(c->data);
    Py_CLEAR(c->value);
    Py_CLEAR(c->cb);
    Py_CLEAR(c->cb_context);
    Py_CLEAR(c->callbacks);
    return 0;
}

static void call_dealloc(Call *c)
{
    if (c->state == CALL_NEW && c->reader) {
        /* What an unawaited coroutine says: the call was never made. */
        PyObject *t, *v, *tb;
        PyErr_Fetch(&t, &v, &tb);
        if (PyErr_WarnEx(PyExc_RuntimeWarning, "ctx.call(...) was never awaited: the call was not made", 1) < 0)
            PyErr_WriteUnraisable(NULL); /* not c: it is being freed */
        PyErr_Restore(t, v, tb);
    }
    PyObject_GC_UnTrack(c);
    call_clear(c);
    PyObject_GC_Del(c);
}

/* ctx.call(name, data=b"") */
static PyObject *ctx_call(Ctx *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (self->reader && !kwnames && (nargs == 1 || nargs == 2) && PyUnicode_CheckExact(args[0]) &&
        (nargs == 1 || PyBytes_CheckExact(args[1]) || PyUnicode_CheckExact(args[1]))) {
        Py_ssize_t name_len, n = 0;
        if (!PyUnicode_AsUTF8AndSize(args[0], &name_len)) {
            PyErr_Clear(); /* _call_py raises it when awaited, as before */
        } else if (nargs == 2 && PyUnicode_CheckExact(args[1]) && !PyUnicode_AsUTF8AndSize(args[1], &n)) {
            PyErr_Clear();
        } else {
            if (nargs == 2 && PyBytes_CheckExact(args[1]))
                n = PyBytes_GET_SIZE(args[1]);
            if (name_len >= 1 && name_len <= CALLEE_NAME_MAX && name_len + n <= INLINE_MAX) {
                Call *c = PyObject_GC_New(Call, &CallType);
                if (!c)
                    return NULL;
                c->reader = (Reader *)Py_NewRef(self->reader);
                c->name = Py_NewRef(args[0]);
                c->data = nargs == 2 ? Py_NewRef(args[1]) : NULL;
                c->value = c->cb = c->cb_context = c->callbacks = NULL;
                c->call_id = 0;
                c->parent_call_id = self->call_id;
                c->deadline_us = self->deadline_us;
                c->state = CALL_NEW;
                c->cb_version = 0;
                c->blocking = c->yielded = 0;
                PyObject_GC_Track(c);
                return (PyObject *)c;
            }
        }
    }
    /* _call_py(self, *args, **kwargs) */
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    PyObject *small[8], **stack = small;
    if (nargs + nkw + 1 > 8 && !(stack = PyMem_Malloc((size_t)(nargs + nkw + 1) * sizeof(PyObject *))))
        return PyErr_NoMemory();
    stack[0] = (PyObject *)self;
    for (Py_ssize_t i = 0; i < nargs + nkw; i++)
        stack[i + 1] = args[i];
    PyObject *res = slow_call ? PyObject_Vectorcall(slow_call, stack, (size_t)nargs + 1, kwnames)
                              : (PyErr_SetString(PyExc_RuntimeError, "staccato._fast: no slow call set"), NULL);
    if (stack != small)
        PyMem_Free(stack);
    return res;
}

/* Takes the call out of the reader's table (a reply to it is dropped). */
static int call_forget(Call *c)
{
    if (!c->reader || !c->reader->pending)
        return 0; /* cleared by the garbage collector: no table left */
    PyObject *key = PyLong_FromUnsignedLongLong(c->call_id);
    if (!key)
        return -1;
    PyObject *v = PyDict_GetItemWithError(c->reader->pending, key); /* borrowed */
    int rc = v == (PyObject *)c ? PyDict_DelItem(c->reader->pending, key) : (PyErr_Occurred() ? -1 : 0);
    Py_DECREF(key);
    return rc;
}

/* Queues fn(call) on the loop in `context` (None: the loop's choice). */
static int call_soon(Call *c, PyObject *fn, PyObject *context)
{
    if (!c->reader || !c->reader->loop) {
        PyErr_SetString(PyExc_RuntimeError, "the call's channel is gone");
        return -1;
    }
    PyObject *stack[4] = {c->reader->loop, fn, (PyObject *)c, context};
    PyObject *res = PyObject_VectorcallMethod(s_call_soon, stack, 3 | PY_VECTORCALL_ARGUMENTS_OFFSET,
                                              context == Py_None ? NULL : context_kwnames);
    if (!res)
        return -1;
    Py_DECREF(res);
    return 0;
}

/* Runs fn(call) in `context` here, or queues it on the loop when `now` is
 * 0 or the context is entered elsewhere. Returns -1 only for a
 * KeyboardInterrupt or SystemExit (or a failure to queue); other exceptions
 * a callback raises are reported as unraisable (a task's wake-up raises
 * none: its step keeps what the coroutine raised). */
static int call_run(Call *c, PyObject *fn, PyObject *context, int now)
{
    if (!now || (context != Py_None && PyContext_Enter(context) < 0)) {
        PyErr_Clear();
        return call_soon(c, fn, context);
    }
    PyObject *res = PyObject_CallOneArg(fn, (PyObject *)c);
    if (context != Py_None && PyContext_Exit(context) < 0)
        Py_CLEAR(res);
    if (res) {
        Py_DECREF(res);
        return 0;
    }
    /* As the loop lets them out of a callback. */
    if (PyErr_ExceptionMatches(PyExc_KeyboardInterrupt) || PyErr_ExceptionMatches(PyExc_SystemExit))
        return -1;
    PyErr_WriteUnraisable(fn);
    return 0;
}

/* Runs or queues the done callbacks, once the state is final. `now`: run
 * them here, which only the reader does, and only outside any task (a
 * task's step cannot start inside another's). */
static int call_wake(Call *c, int now)
{
    PyObject *cb = c->cb, *cb_context = c->cb_context, *cbs = c->callbacks;
    if (!cb)
        return 0;
    c->cb = c->cb_context = c->callbacks = NULL;
    c->cb_version++;
    if (now && (!c->reader || !c->reader->loop)) {
        now = 0;
    } else if (now && current_tasks) {
        PyObject *task = PyDict_GetItemWithError(current_tasks, c->reader->loop); /* borrowed */
        if (task || PyErr_Occurred())
            now = 0;
        PyErr_Clear();
    } else if (now) {
        PyObject *task = PyObject_CallOneArg(current_task, c->reader->loop);
        if (task != Py_None)
            now = 0;
        Py_XDECREF(task);
        PyErr_Clear();
    }
    int rc = call_run(c, cb, cb_context, now);
    for (Py_ssize_t i = 0; cbs && i < PyList_GET_SIZE(cbs) && rc == 0; i++) {
        PyObject *entry = PyList_GET_ITEM(cbs, i);
        rc = call_run(c, PyTuple_GET_ITEM(entry, 0), PyTuple_GET_ITEM(entry, 1), now);
    }
    Py_DECREF(cb);
    Py_DECREF(cb_context);
    Py_XDECREF(cbs);
    return rc;
}

/* Ends the call with `value` (a new reference is taken) in `state`. */
static int call_finish(Call *c, int state, PyObject *value, int now)
{
    c->state = state;
    Py_XSETREF(c->value, Py_XNewRef(value));
    return call_wake(c, now);
}

/* Sends the Invoke (the first send). */
static int call_start(Call *c)
{
    Reader *r = c->reader;
    if (!r || !r->pending) {
        PyErr_SetString(PyExc_RuntimeError, "the call's channel is gone");
        return -1;
    }
    if (!r->channel) {
        PyErr_SetString(PyExc_RuntimeError, "the worker channel is gone");
        return -1;
    }
    if (channel_closed(r)) { /* the channel's start_call raises the precise error */
        PyObject *stack[5] = {r->channel, c->name, c->data ? c->data : Py_None, NULL, NULL};
        stack[3] = PyLong_FromUnsignedLongLong(c->parent_call_id);
        stack[4] = stack[3] ? PyLong_FromUnsignedLongLong(c->deadline_us) : NULL;
        PyObject *res = stack[4] ? PyObject_VectorcallMethod(s_start_call, stack, 5 | PY_VECTORCALL_ARGUMENTS_OFFSET,
                                                             NULL)
                                 : NULL;
        Py_XDECREF(stack[3]);
        Py_XDECREF(stack[4]);
        if (res) {
            Py_DECREF(res);
            PyErr_SetString(PyExc_RuntimeError, "start_call on a closed channel did not raise");
        }
        return -1;
    }
    Py_ssize_t name_len, n = 0;
    const char *name = PyUnicode_AsUTF8AndSize(c->name, &name_len), *data = "";
    if (!name)
        return -1;
    if (c->data && PyBytes_CheckExact(c->data)) {
        data = PyBytes_AS_STRING(c->data);
        n = PyBytes_GET_SIZE(c->data);
    } else if (c->data && !(data = PyUnicode_AsUTF8AndSize(c->data, &n))) {
        return -1;
    }
    /* Checked when the call was made; the objects are immutable. */
    assert(name_len >= 1 && name_len <= CALLEE_NAME_MAX && name_len + n <= INLINE_MAX);
    c->call_id = next_id(r);
    /* Registered before sending: a failed send closes the channel, which
     * fails every pending call (this one too). */
    PyObject *key = PyLong_FromUnsignedLongLong(c->call_id);
    if (!key)
        return -1;
    int rc = PyDict_SetItem(r->pending, key, (PyObject *)c);
    Py_DECREF(key);
    if (rc < 0)
        return -1;
    c->state = CALL_PENDING;
    struct header h = {.call_id = c->call_id, .parent_call_id = c->parent_call_id, .worker_id = r->worker_id,
                       .deadline_us = c->deadline_us};
    char msg[MESSAGE_LEN];
    fill_invoke(msg, &h, name, name_len, data, n);
    Py_CLEAR(c->name); /* after: name and data point into them */
    Py_CLEAR(c->data);
    return send_message(r, msg);
}

/* Sets the exception the call ended with (CALL_ERROR or CALL_CANCELLED). */
static void call_raise(Call *c)
{
    if (c->state == CALL_CANCELLED) {
        PyObject *e = c->value && c->value != Py_None ? PyObject_CallOneArg(CancelledError, c->value)
                                                      : PyObject_CallNoArgs(CancelledError);
        if (e) {
            PyErr_SetObject(CancelledError, e);
            Py_DECREF(e);
        }
        return;
    }
    PyErr_SetObject((PyObject *)Py_TYPE(c->value), c->value);
}

static PySendResult call_am_send(Call *c, PyObject *arg, PyObject **result)
{
    (void)arg;
    if (c->state == CALL_NEW && call_start(c) < 0) {
        /* Like a coroutine that raised, it is over: it ends with what it
         * raised (unless a closing channel ended it first). */
        PyObject *t, *v, *tb;
        PyErr_Fetch(&t, &v, &tb);
        PyErr_NormalizeException(&t, &v, &tb);
        if (tb && v)
            PyException_SetTraceback(v, tb);
        if (c->state == CALL_PENDING && call_forget(c) < 0)
            PyErr_Clear();
        if (c->state < CALL_RESULT) {
            c->state = v ? CALL_ERROR : CALL_CANCELLED;
            Py_XSETREF(c->value, Py_XNewRef(v));
        }
        PyErr_Restore(t, v, tb);
        *result = NULL;
        return PYGEN_ERROR;
    }
    if (c->state == CALL_PENDING) {
        if (c->yielded) {
            PyErr_SetString(PyExc_RuntimeError, "await wasn't used with future");
            *result = NULL;
            return PYGEN_ERROR;
        }
        c->yielded = 1;
        c->blocking = 1;
        *result = Py_NewRef(c);
        return PYGEN_NEXT;
    }
    if (c->state == CALL_RESULT) {
        *result = Py_NewRef(c->value);
        return PYGEN_RETURN;
    }
    call_raise(c);
    *result = NULL;
    return PYGEN_ERROR;
}

/* The PYGEN_RETURN value as StopIteration, as a generator's send raises. */
static PyObject *call_send_result(PySendResult r, PyObject *value)
{
    if (r != PYGEN_RETURN)
        return value;
    PyObject *e = PyObject_CallOneArg(PyExc_StopIteration, value);
    Py_DECREF(value);
    if (e) {
        PyErr_SetObject(PyExc_StopIteration, e);
        Py_DECREF(e);
    }
    return NULL;
}

static PyObject *call_send(Call *c, PyObject *arg)
{
    PyObject *v = NULL;
    PySendResult r = call_am_send(c, arg, &v);
    return call_send_result(r, v);
}

static PyObject *call_iternext(Call *c)
{
    return call_send(c, Py_None);
}

static PyObject *call_await(Call *c)
{
    return Py_NewRef(c);
}

/* throw(value) / throw(type[, value[, traceback]]): the awaiting code gave
 * up (a cancellation, a timeout): the reply, if any comes, is dropped. */
static PyObject *call_throw(Call *c, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1 || nargs > 3) {
        PyErr_SetString(PyExc_TypeError, "throw expected 1 to 3 arguments");
        return NULL;
    }
    PyObject *typ = args[0], *val = nargs > 1 ? args[1] : Py_None, *tb = nargs > 2 ? args[2] : Py_None;
    /* The arguments are judged as a coroutine's throw judges them, before
     * the call is given up. */
    if (tb != Py_None && !PyTraceBack_Check(tb)) {
        PyErr_SetString(PyExc_TypeError, "throw() third argument must be a traceback object");
        return NULL;
    }
    if (PyExceptionInstance_Check(typ) ? val != Py_None : !PyExceptionClass_Check(typ)) {
        if (PyExceptionInstance_Check(typ))
            PyErr_SetString(PyExc_TypeError, "instance exception may not have a separate value");
        else
            PyErr_Format(PyExc_TypeError,
                         "exceptions must be classes or instances deriving from BaseException, not %s",
                         Py_TYPE(typ)->tp_name);
        return NULL;
    }
    if (c->state == CALL_PENDING && call_forget(c) < 0)
        return NULL;
    if (c->state < CALL_RESULT)
        c->state = CALL_CANCELLED;
    if (PyExceptionInstance_Check(typ))
        PyErr_SetObject((PyObject *)Py_TYPE(typ), typ);
    else
        PyErr_SetObject(typ, val == Py_None ? NULL : val);
    if (tb != Py_None) {
        PyObject *t, *v, *old_tb;
        PyErr_Fetch(&t, &v, &old_tb);
        PyErr_NormalizeException(&t, &v, &old_tb);
        Py_XDECREF(old_tb);
        if (v)
            PyException_SetTraceback(v, tb);
        PyErr_Restore(t, v, Py_NewRef(tb));
    }
    return NULL;
}

static PyObject *call_close(Call *c, PyObject *unused)
{
    (void)unused;
    if (c->state == CALL_PENDING && call_forget(c) < 0)
        return NULL;
    if (c->state < CALL_RESULT)
        c->state = CALL_CANCELLED;
    Py_RETURN_NONE;
}

/* -- the Future side, what a Task uses of what it awaits -- */

/* None until the call is awaited: asyncio.ensure_future (gather,
 * wait_for, create_task) takes an object whose _asyncio_future_blocking is
 * not None for a future already running, and would never start it. */
static PyObject *call_get_blocking(Call *c, void *closure)
{
    (void)closure;
    if (!c->yielded)
        Py_RETURN_NONE;
    return PyBool_FromLong(c->blocking);
}

static int call_set_blocking(Call *c, PyObject *v, void *closure)
{
    (void)closure;
    int b = v ? PyObject_IsTrue(v) : 0;
    if (b < 0)
        return -1;
    c->blocking = b;
    return 0;
}

static PyObject *call_get_loop(Call *c, PyObject *unused)
{
    (void)unused;
    if (!c->reader || !c->reader->loop) {
        PyErr_SetString(PyExc_RuntimeError, "the call's channel is gone");
        return NULL;
    }
    return Py_NewRef(c->reader->loop);
}

static PyObject *call_done(Call *c, PyObject *unused)
{
    (void)unused;
    return PyBool_FromLong(c->state >= CALL_RESULT);
}

static PyObject *call_cancelled(Call *c, PyObject *unused)
{
    (void)unused;
    return PyBool_FromLong(c->state == CALL_CANCELLED);
}

static PyObject *call_result(Call *c, PyObject *unused)
{
    (void)unused;
    if (c->state < CALL_RESULT) {
        PyErr_SetString(InvalidStateError, "Result is not set.");
        return NULL;
    }
    if (c->state == CALL_RESULT)
        return Py_NewRef(c->value);
    call_raise(c);
    return NULL;
}

static PyObject *call_exception(Call *c, PyObject *unused)
{
    (void)unused;
    if (c->state < CALL_RESULT) {
        PyErr_SetString(InvalidStateError, "Exception is not set.");
        return NULL;
    }
    if (c->state == CALL_CANCELLED) {
        call_raise(c);
        return NULL;
    }
    return Py_NewRef(c->state == CALL_ERROR ? c->value : Py_None);
}

static PyObject *call_add_done_callback(Call *c, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *fn = nargs == 1 ? args[0] : NULL, *context = Py_None;
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    if (!fn || nkw > 1 ||
        (nkw == 1 && PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, 0), "context") != 0)) {
        PyErr_SetString(PyExc_TypeError, "add_done_callback(fn, *, context=None)");
        return NULL;
    }
    if (nkw)
        context = args[1];
    if (c->state >= CALL_RESULT)
        return call_soon(c, fn, context) < 0 ? NULL : Py_NewRef(Py_None);
    /* As a Future does: without a context, the one current now. */
    PyObject *own = context == Py_None ? PyContext_CopyCurrent() : Py_NewRef(context);
    if (!own)
        return NULL;
    c->cb_version++;
    if (!c->cb) {
        c->cb = Py_NewRef(fn);
        c->cb_context = own;
        Py_RETURN_NONE;
    }
    int rc = -1;
    PyObject *entry = NULL;
    if ((c->callbacks || (c->callbacks = PyList_New(0))) && (entry = PyTuple_Pack(2, fn, own)))
        rc = PyList_Append(c->callbacks, entry);
    Py_XDECREF(entry);
    Py_DECREF(own);
    return rc < 0 ? NULL : Py_NewRef(Py_None);
}

static PyObject *call_remove_done_callback(Call *c, PyObject *fn)
{
    /* The comparisons may run Python code, which may change the call's
     * callbacks: they run on a list of pairs this function owns, and the
     * call's are replaced only if nothing changed them meanwhile. */
    PyObject *all = c->callbacks ? PyList_GetSlice(c->callbacks, 0, PY_SSIZE_T_MAX) : PyList_New(0);
    PyObject *keep = PyList_New(0), *first = NULL;
    PyObject *res = NULL;
    if (!all || !keep)
        goto out;
    if (c->cb && (!(first = PyTuple_Pack(2, c->cb, c->cb_context)) || PyList_Insert(all, 0, first) < 0))
        goto out;
    unsigned long version = c->cb_version;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(all); i++) {
        PyObject *entry = PyList_GET_ITEM(all, i);
        int eq = PyObject_RichCompareBool(PyTuple_GET_ITEM(entry, 0), fn, Py_EQ);
        if (eq < 0 || (!eq && PyList_Append(keep, entry) < 0))
            goto out;
    }
    if (c->cb_version != version) {
        PyErr_SetString(PyExc_RuntimeError, "the call's callbacks changed while they were compared");
        goto out;
    }
    Py_ssize_t removed = PyList_GET_SIZE(all) - PyList_GET_SIZE(keep);
    if (removed) {
        PyObject *old_cb = c->cb, *old_context = c->cb_context, *old_list = c->callbacks;
        c->cb = c->cb_context = c->callbacks = NULL;
        if (PyList_GET_SIZE(keep)) {
            PyObject *entry = PyList_GET_ITEM(keep, 0);
            c->cb = Py_NewRef(PyTuple_GET_ITEM(entry, 0));
            c->cb_context = Py_NewRef(PyTuple_GET_ITEM(entry, 1));
        }
        if (PyList_GET_SIZE(keep) > 1)
            c->callbacks = PyList_GetSlice(keep, 1, PY_SSIZE_T_MAX); /* NULL on failure: those are lost */
        c->cb_version++;
        Py_XDECREF(old_cb); /* last: a __del__ run here sees a whole state */
        Py_XDECREF(old_context);
        Py_XDECREF(old_list);
        if (PyList_GET_SIZE(keep) > 1 && !c->callbacks)
            goto out;
    }
    res = PyLong_FromSsize_t(removed);
out:
    Py_XDECREF(first);
    Py_XDECREF(keep);
    Py_XDECREF(all);
    return res;
}

static PyObject *call_cancel(Call *c, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *msg = nargs ? args[0] : Py_None;
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    if (nargs > 1 || nkw > 1 || (nargs && nkw) ||
        (nkw == 1 && PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, 0), "msg") != 0)) {
        PyErr_SetString(PyExc_TypeError, "cancel(msg=None)");
        return NULL;
    }
    if (nkw)
        msg = args[0];
    if (c->state >= CALL_RESULT)
        Py_RETURN_FALSE;
    if (c->state == CALL_PENDING && call_forget(c) < 0)
        return NULL;
    if (call_finish(c, CALL_CANCELLED, msg, 0) < 0)
        return NULL;
    Py_RETURN_TRUE;
}

/* set_result / set_exception: the channel's Python code ends a call this
 * way (a reply read in Python, a closed channel). */
static PyObject *call_set(Call *c, PyObject *value, int state)
{
    if (c->state >= CALL_RESULT) {
        PyErr_SetString(InvalidStateError, "invalid state");
        return NULL;
    }
    if (state == CALL_ERROR && !PyExceptionInstance_Check(value)) {
        PyErr_SetString(PyExc_TypeError, "set_exception takes an exception instance");
        return NULL;
    }
    return call_finish(c, state, value, 0) < 0 ? NULL : Py_NewRef(Py_None);
}

static PyObject *call_set_result(Call *c, PyObject *value)
{
    return call_set(c, value, CALL_RESULT);
}

static PyObject *call_set_exception(Call *c, PyObject *value)
{
    return call_set(c, value, CALL_ERROR);
}

static PyMethodDef call_methods[] = {
    {"send", (PyCFunction)call_send, METH_O, "send(value): sends the Invoke the first time, then returns the reply"},
    {"throw", (PyCFunction)(void (*)(void))call_throw, METH_FASTCALL, "throw(exc): gives the call up, raising exc"},
    {"close", (PyCFunction)call_close, METH_NOARGS, "close(): gives the call up"},
    {"get_loop", (PyCFunction)call_get_loop, METH_NOARGS, NULL},
    {"done", (PyCFunction)call_done, METH_NOARGS, NULL},
    {"cancelled", (PyCFunction)call_cancelled, METH_NOARGS, NULL},
    {"result", (PyCFunction)call_result, METH_NOARGS, NULL},
    {"exception", (PyCFunction)call_exception, METH_NOARGS, NULL},
    {"add_done_callback", (PyCFunction)(void (*)(void))call_add_done_callback, METH_FASTCALL | METH_KEYWORDS, NULL},
    {"remove_done_callback", (PyCFunction)call_remove_done_callback, METH_O, NULL},
    {"cancel", (PyCFunction)(void (*)(void))call_cancel, METH_FASTCALL | METH_KEYWORDS, NULL},
    {"set_result", (PyCFunction)call_set_result, METH_O, NULL},
    {"set_exception", (PyCFunction)call_set_exception, METH_O, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef call_getset[] = {
    {"_asyncio_future_blocking", (getter)call_get_blocking, (setter)call_set_blocking, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyAsyncMethods call_async = {
    .am_await = (unaryfunc)call_await,
    .am_send = (sendfunc)call_am_send,
};

static PyTypeObject CallType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "staccato._fast.Call",
    .tp_doc = PyDoc_STR("An internal call in flight: what ctx.call returns (a coroutine) and the future it awaits."),
    .tp_basicsize = sizeof(Call),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_dealloc = (destructor)call_dealloc,
    .tp_traverse = (traverseproc)call_traverse,
    .tp_clear = (inquiry)call_clear,
    .tp_as_async = &call_async,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)call_iternext,
    .tp_methods = call_methods,
    .tp_getset = call_getset,
};

static PyMethodDef ctx_methods[] = {
    {"call", (PyCFunction)(void (*)(void))ctx_call, METH_FASTCALL | METH_KEYWORDS,
     "call(name, data=b\"\"): calls function name with data; await it for the output bytes.\n\n"
     "Raises staccato.CallError(kind, message) when the call fails, ValueError for an\n"
     "invalid name. Several calls may be in flight at once (asyncio.gather)."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef ctx_members[] = {
    {"_channel", T_OBJECT, offsetof(Ctx, channel), 0, NULL},
    {"_logger", T_OBJECT, offsetof(Ctx, logger), 0, NULL},
    {"_trace", T_OBJECT, offsetof(Ctx, trace), 0, NULL},
    {"call_id", T_ULONGLONG, offsetof(Ctx, call_id), 0, NULL},
    {"parent_call_id", T_ULONGLONG, offsetof(Ctx, parent_call_id), 0, NULL},
    {"deadline_us", T_ULONGLONG, offsetof(Ctx, deadline_us), 0, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject CtxType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "staccato._fast.ContextBase",
    .tp_doc = PyDoc_STR("ContextBase(channel, call_id, parent_call_id, deadline_us, trace=None): "
                        "staccato.Context's fields and call(), in C."),
    .tp_basicsize = sizeof(Ctx),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_BASETYPE,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)ctx_init,
    .tp_dealloc = (destructor)ctx_dealloc,
    .tp_traverse = (traverseproc)ctx_traverse,
    .tp_clear = (inquiry)ctx_clear,
    .tp_methods = ctx_methods,
    .tp_members = ctx_members,
};

/* The handler's result as inline bytes for the fast path: a new reference
 * to bytes of at most INLINE_MAX, or NULL (no exception) when the Python
 * send_result must decide (other types, larger results). */
static PyObject *inline_result(PyObject *result)
{
    PyObject *b = NULL;
    if (PyBytes_CheckExact(result))
        b = Py_NewRef(result);
    else if (result == Py_None)
        b = PyBytes_FromStringAndSize(NULL, 0);
    else if (PyUnicode_Check(result))
        b = PyUnicode_AsUTF8String(result);
    if (!b) {
        PyErr_Clear();
        return NULL;
    }
    if (PyBytes_GET_SIZE(b) > INLINE_MAX) {
        Py_DECREF(b);
        return NULL;
    }
    return b;
}

/* Sets channel._cpu = (call_id, µs), what send_result/send_failure read. */
static int set_cpu(Reader *r, uint64_t call_id, uint64_t cpu_us)
{
    PyObject *t = Py_BuildValue("(KK)", (unsigned long long)call_id, (unsigned long long)cpu_us);
    if (!t)
        return -1;
    int rc = PyObject_SetAttr(r->channel, s_cpu, t);
    Py_DECREF(t);
    return rc;
}

/* An inline Dispatch: channel._on_dispatch's work for inline input. */
static int on_dispatch(Reader *r, const struct header *h, const char *inline_)
{
    PyObject *trace = Py_None, *data = NULL, *ctx = NULL, *result = NULL;
    int rc = -1;
    Py_INCREF(trace);
    if (h->name_len) {
        Py_SETREF(trace, PyBytes_FromStringAndSize(inline_, h->name_len));
        if (!trace)
            return -1;
    }
    data = PyBytes_FromStringAndSize(inline_ + h->name_len, (Py_ssize_t)(h->payload_len - h->name_len));
    if (!data)
        goto out;
    if (r->ctx_fast) {
        ctx = ctx_build(r, h, trace);
    } else {
        PyObject *cargs[5] = {r->channel, NULL, NULL, NULL, trace};
        if ((cargs[1] = PyLong_FromUnsignedLongLong(h->call_id)) &&
            (cargs[2] = PyLong_FromUnsignedLongLong(h->parent_call_id)) &&
            (cargs[3] = PyLong_FromUnsignedLongLong(h->deadline_us)))
            ctx = PyObject_Vectorcall(r->context_type, cargs, 5, NULL);
        Py_XDECREF(cargs[1]);
        Py_XDECREF(cargs[2]);
        Py_XDECREF(cargs[3]);
    }
    if (!ctx)
        goto out;

    int measure = !r->handler_is_async && (h->flags & F_CPU_TIME);
    uint64_t c0 = measure ? now_ns(CLOCK_THREAD_CPUTIME_ID) : 0;
    PyObject *hargs[2] = {ctx, data};
    result = PyObject_Vectorcall(r->handler, hargs, 2, NULL);
    uint64_t cpu_us = measure ? (now_ns(CLOCK_THREAD_CPUTIME_ID) - c0) / 1000 : 0;
    if (cpu_us > 0xFFFFFFFFu)
        cpu_us = 0xFFFFFFFFu;

    if (!result) {
        /* As in the Python path: anything but KeyboardInterrupt (which
         * goes on up) fails this call only. */
        if (PyErr_ExceptionMatches(PyExc_KeyboardInterrupt))
            goto out;
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyErr_NormalizeException(&type, &value, &tb);
        if (tb && value && PyException_SetTraceback(value, tb) < 0)
            PyErr_Clear(); /* the failure is reported without its traceback */
        Py_XDECREF(type);
        Py_XDECREF(tb);
        if (!value) {
            PyErr_SetString(PyExc_SystemError, "the handler's exception could not be normalized");
            goto out;
        }
        if (measure && set_cpu(r, h->call_id, cpu_us) < 0) {
            Py_DECREF(value);
            goto out;
        }
        PyObject *a[2] = {ctx, value};
        rc = call_channel(r, s_handler_failed, a, 2);
        Py_DECREF(value);
        goto out;
    }
    if (r->handler_is_async) {
        PyObject *a[2] = {ctx, result};
        rc = call_channel(r, s_spawn, a, 2);
        goto out;
    }
    PyObject *out = inline_result(result);
    if (out) {
        struct header c = {
            .kind = K_COMPLETION, .flags = measure ? F_CPU_TIME : 0,
            .payload_len = (uint32_t)PyBytes_GET_SIZE(out), .call_id = h->call_id,
            .parent_call_id = h->parent_call_id, .worker_id = r->worker_id,
            .send_ts_ns = now_ns(CLOCK_MONOTONIC), .aux = (uint32_t)cpu_us,
        };
        char msg[MESSAGE_LEN];
        fill(msg, &c, PyBytes_AS_STRING(out), PyBytes_GET_SIZE(out));
        Py_DECREF(out);
        rc = send_message(r, msg);
        goto out;
    }
    /* A def returning a coroutine, or a result send_result must judge. */
    PyObject *await_ = PyObject_GetAttr(result, s_await);
    int awaitable = await_ != NULL;
    Py_XDECREF(await_);
    if (!awaitable) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError))
            goto out; /* hasattr() lets only AttributeError pass */
        PyErr_Clear();
    }
    PyObject *a[2] = {ctx, result};
    if (awaitable) {
        rc = call_channel(r, s_spawn, a, 2);
    } else {
        if (measure && set_cpu(r, h->call_id, cpu_us) < 0)
            goto out;
        rc = call_channel(r, s_send_result, a, 2);
    }
out:
    Py_XDECREF(result);
    Py_XDECREF(ctx);
    Py_XDECREF(data);
    Py_DECREF(trace);
    return rc;
}

/* An inline Completion: channel._on_reply's work. */
static int on_completion(Reader *r, const struct header *h, const char *inline_)
{
    PyObject *key = PyLong_FromUnsignedLongLong(h->call_id);
    if (!key)
        return -1;
    PyObject *fut = PyDict_GetItemWithError(r->pending, key); /* borrowed */
    if (!fut) {
        Py_DECREF(key);
        return PyErr_Occurred() ? -1 : 0; /* the caller gave up, or an unknown id */
    }
    Py_INCREF(fut);
    int rc = PyDict_DelItem(r->pending, key);
    Py_DECREF(key);
    if (rc == 0 && Py_IS_TYPE(fut, &CallType)) {
        Call *c = (Call *)fut;
        if (c->state == CALL_PENDING) {
            PyObject *payload = PyBytes_FromStringAndSize(inline_, h->payload_len);
            rc = payload ? call_finish(c, CALL_RESULT, payload, 1) : -1;
            Py_XDECREF(payload);
        }
        Py_DECREF(fut);
        return rc;
    }
    PyObject *done = rc < 0 ? NULL : PyObject_CallMethodNoArgs(fut, s_done);
    int is_done = done ? PyObject_IsTrue(done) : -1;
    Py_XDECREF(done);
    if (is_done == 0) {
        PyObject *payload = PyBytes_FromStringAndSize(inline_, h->payload_len);
        PyObject *res = payload ? PyObject_CallMethodOneArg(fut, s_set_result, payload) : NULL;
        Py_XDECREF(payload);
        is_done = res ? 1 : -1;
        Py_XDECREF(res);
    }
    Py_DECREF(fut);
    return is_done < 0 ? -1 : 0;
}

/* invoke(call_id, parent_call_id, deadline_us, name, data, fut): the inline
 * case of channel.start_call after it chose the id: registers fut under
 * call_id (before sending: a failed send closes the channel, which fails
 * every pending future), then sends the Invoke. */
static PyObject *reader_invoke(Reader *r, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6) {
        PyErr_Format(PyExc_TypeError, "invoke takes 6 arguments (%zd given)", nargs);
        return NULL;
    }
    if (!r->channel) {
        PyErr_SetString(PyExc_RuntimeError, "reader is not initialized");
        return NULL;
    }
    struct header h = {.kind = K_INVOKE, .worker_id = r->worker_id};
    h.call_id = PyLong_AsUnsignedLongLong(args[0]);
    h.parent_call_id = PyLong_AsUnsignedLongLong(args[1]);
    h.deadline_us = PyLong_AsUnsignedLongLong(args[2]);
    if (PyErr_Occurred())
        return NULL;
    if (!PyBytes_Check(args[3]) || !PyBytes_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError, "invoke: name and data must be bytes");
        return NULL;
    }
    Py_ssize_t name_len = PyBytes_GET_SIZE(args[3]), n = PyBytes_GET_SIZE(args[4]);
    if (name_len < 1 || name_len > CALLEE_NAME_MAX || name_len + n > INLINE_MAX) {
        PyErr_SetString(PyExc_ValueError, "invoke: the name is 1..64 bytes and name and data fit inline");
        return NULL;
    }
    if (PyDict_SetItem(r->pending, args[0], args[5]) < 0)
        return NULL;
    char msg[MESSAGE_LEN];
    fill_invoke(msg, &h, PyBytes_AS_STRING(args[3]), name_len, PyBytes_AS_STRING(args[4]), n);
    if (send_message(r, msg) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* next_call_id(): a new id for an Invoke the channel's Python code sends
 * (one counter with the Calls'). */
static PyObject *reader_next_call_id(Reader *r, PyObject *unused)
{
    (void)unused;
    return PyLong_FromUnsignedLongLong(next_id(r));
}

static PyMemberDef reader_members[] = {
    {"closed", T_BOOL, offsetof(Reader, closed), 0, "the channel closed (WorkerChannel.close sets it)"},
    {"backlogged", T_BOOL, offsetof(Reader, backlogged), 0,
     "messages wait in the channel's backlog: every send goes through it (the channel sets it)"},
    {NULL, 0, 0, 0, NULL},
};

static PyMethodDef reader_methods[] = {
    {"next_call_id", (PyCFunction)reader_next_call_id, METH_NOARGS,
     "next_call_id(): the id for an Invoke sent from Python (worker id << 32 | a 32-bit sequence, never 0)"},
    {"invoke", (PyCFunction)(void (*)(void))reader_invoke, METH_FASTCALL,
     "invoke(call_id, parent_call_id, deadline_us, name, data, fut): send an inline Invoke, fut awaiting its reply"},
    {NULL, NULL, 0, NULL},
};

/* reader() — the loop's add_reader callback: reads what e2w holds and
 * handles each whole message. */
static PyObject *reader_read(Reader *r);

static PyObject *reader_call(Reader *r, PyObject *args, PyObject *kw)
{
    (void)args;
    (void)kw;
    if (!r->channel) {
        PyErr_SetString(PyExc_RuntimeError, "reader is not initialized");
        return NULL;
    }
    /* Python code run from here (a StopWorker closing the channel) may
     * drop every other reference to this reader. */
    Py_INCREF(r);
    PyObject *res = reader_read(r);
    Py_DECREF(r);
    return res;
}

static PyObject *reader_read(Reader *r)
{
    ssize_t n = read(r->rfd, r->buf + r->have, (size_t)(READ_BUF - r->have));
    if (n < 0) {
        if (errno == EAGAIN || errno == EINTR)
            Py_RETURN_NONE;
        PyObject *e = PyLong_FromLong(errno);
        int rc = e ? call_channel(r, s_read_failed, &e, 1) : -1;
        Py_XDECREF(e);
        return rc < 0 ? NULL : Py_NewRef(Py_None);
    }
    if (n == 0) {
        PyObject *have = PyLong_FromSsize_t(r->have);
        int rc = have ? call_channel(r, s_eof_read, &have, 1) : -1;
        Py_XDECREF(have);
        return rc < 0 ? NULL : Py_NewRef(Py_None);
    }
    Py_ssize_t end = r->have + n, off = 0;
    /* A read may return several messages, or (defensively) part of one. */
    while (end - off >= MESSAGE_LEN) {
        const char *m = r->buf + off;
        struct header h;
        memcpy(&h, m, HEADER_LEN);
        off += MESSAGE_LEN;
        int rc, fast = !(h.flags & F_PAYLOAD_IN_SHM) && !check(&h);
        if (fast && h.kind == K_DISPATCH)
            rc = on_dispatch(r, &h, m + HEADER_LEN);
        else if (fast && h.kind == K_COMPLETION)
            rc = on_completion(r, &h, m + HEADER_LEN);
        else {
            PyObject *raw = PyBytes_FromStringAndSize(m, MESSAGE_LEN);
            rc = raw ? call_channel(r, s_slow, &raw, 1) : -1;
            Py_XDECREF(raw);
        }
        if (rc < 0) {
            if (PyErr_ExceptionMatches(PyExc_KeyboardInterrupt) || PyErr_ExceptionMatches(PyExc_SystemExit))
                break; /* the process is going down (a task woken here raised it): raise it */
            /* A fault while handling this message (one Python's own
             * reader would have let escape to the loop): report it in the
             * function's log and go on with the messages after it, which
             * no new event would come for. */
            PyErr_WriteUnraisable(r->channel);
        }
        if (channel_closed(r)) {
            r->have = 0; /* the fds are gone: what is left goes with them */
            Py_RETURN_NONE;
        }
    }
    Py_ssize_t rest = end - off;
    if (rest && off)
        memmove(r->buf, r->buf + off, (size_t)rest);
    r->have = rest;
    if (PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
}

static PyTypeObject ReaderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "staccato._fast.Reader",
    .tp_doc = PyDoc_STR("Reader(channel, pending, handler, handler_is_async, context_type, rfd, wfd, worker_id, "
                        "loop=None): a worker channel's e2w reader; call it when e2w is readable."),
    .tp_basicsize = sizeof(Reader),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)reader_init,
    .tp_dealloc = (destructor)reader_dealloc,
    .tp_traverse = (traverseproc)reader_traverse,
    .tp_clear = (inquiry)reader_clear,
    .tp_call = (ternaryfunc)reader_call,
    .tp_methods = reader_methods,
    .tp_members = reader_members,
};

static PyObject *fast_init(PyObject *self, PyObject *arg)
{
    (void)self;
    Py_XSETREF(WireError, Py_NewRef(arg));
    Py_RETURN_NONE;
}

static PyObject *fast_set_slow_call(PyObject *self, PyObject *arg)
{
    (void)self;
    Py_XSETREF(slow_call, Py_NewRef(arg));
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"pack", (PyCFunction)(void (*)(void))fast_pack, METH_FASTCALL,
     "pack(kind, flags, payload_len, call_id, parent_call_id, worker_id, name_len, error_kind, deadline_us, "
     "send_ts_ns, aux, inline) -> bytes: wire.pack"},
    {"check_message", fast_check_message, METH_O,
     "check_message(buf) -> None if wire.decode accepts it, else why not"},
    {"init", fast_init, METH_O, "init(WireError): the exception pack raises for an oversized inline payload"},
    {"set_slow_call", fast_set_slow_call, METH_O,
     "set_slow_call(fn): fn(ctx, *args, **kwargs) serves the ContextBase.call calls not done in C"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "staccato._fast", "The Python runtime's hot path in C (see _fast.c).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__fast(void)
{
    struct {
        PyObject **slot;
        const char *text;
    } names[] = {
        {&s_slow, "_on_raw"}, {&s_eof_read, "_on_eof_read"},
        {&s_read_failed, "_on_read_failed"}, {&s_spawn, "_spawn"}, {&s_handler_failed, "_handler_failed"},
        {&s_send_result, "send_result"}, {&s_send, "send"}, {&s_cpu, "_cpu"}, {&s_await, "__await__"},
        {&s_done, "done"}, {&s_set_result, "set_result"}, {&s_call_soon, "call_soon"},
        {&s_start_call, "start_call"},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!(*names[i].slot = PyUnicode_InternFromString(names[i].text)))
            return NULL;
    if (PyType_Ready(&ReaderType) < 0 || PyType_Ready(&CtxType) < 0 || PyType_Ready(&CallType) < 0)
        return NULL;
    if (!(context_kwnames = Py_BuildValue("(s)", "context")))
        return NULL;
    PyObject *exc = PyImport_ImportModule("asyncio.exceptions");
    if (!exc)
        return NULL;
    CancelledError = PyObject_GetAttrString(exc, "CancelledError");
    InvalidStateError = PyObject_GetAttrString(exc, "InvalidStateError");
    Py_DECREF(exc);
    if (!CancelledError || !InvalidStateError)
        return NULL;
    /* Whether a task runs: up to 3.13 a dict lookup in the running tasks
     * by loop (C asyncio's, which asyncio.tasks exports); later, or
     * without it, asyncio.current_task(loop). */
    PyObject *tasks = PyImport_ImportModule("asyncio.tasks");
    if (!tasks)
        return NULL;
    current_task = PyObject_GetAttrString(tasks, "current_task");
    if (PY_VERSION_HEX < 0x030E0000)
        current_tasks = PyObject_GetAttrString(tasks, "_current_tasks");
    Py_DECREF(tasks);
    if (!current_task)
        return NULL;
    if (!current_tasks || !PyDict_Check(current_tasks)) {
        PyErr_Clear();
        Py_CLEAR(current_tasks);
    }
    PyObject *m = PyModule_Create(&module);
    if (!m)
        return NULL;
    if (PyModule_AddObjectRef(m, "Reader", (PyObject *)&ReaderType) < 0 ||
        PyModule_AddObjectRef(m, "ContextBase", (PyObject *)&CtxType) < 0 ||
        PyModule_AddObjectRef(m, "Call", (PyObject *)&CallType) < 0 ||
        PyModule_AddIntConstant(m, "MESSAGE_LEN", MESSAGE_LEN) < 0 ||
        PyModule_AddIntConstant(m, "INLINE_MAX", INLINE_MAX) < 0 ||
        PyModule_AddIntConstant(m, "ERROR_KIND_MAX", ERROR_KIND_MAX) < 0 ||
        PyModule_AddIntConstant(m, "READ_BUF", READ_BUF) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
