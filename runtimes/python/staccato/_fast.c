/* staccato._fast: the Python runtime's hot path in C (optional).
 *
 * A worker channel's messages are read, checked and, for the two kinds that
 * make up an internal call's round trip, handled here without running the
 * channel's Python code:
 *
 *   - an inline Dispatch: the Context is built, the handler called, and an
 *     inline result packed and written as the Completion;
 *   - an inline Completion: the waiting future gets its result.
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

typedef struct {
    PyObject_HEAD
    PyObject *channel;      /* the WorkerChannel */
    PyObject *pending;      /* its _pending dict: call_id -> Future */
    PyObject *handler;
    PyObject *context_type; /* staccato.context.Context */
    int rfd, wfd;
    uint32_t worker_id;
    int handler_is_async;
    Py_ssize_t have;        /* bytes of a partial message at buf[0:] */
    char buf[READ_BUF];
} Reader;

static PyObject *s_closed, *s_backlog, *s_slow, *s_eof_read, *s_read_failed, *s_spawn, *s_handler_failed,
    *s_send_result, *s_send, *s_cpu, *s_await, *s_done, *s_set_result;

static int reader_traverse(Reader *r, visitproc visit, void *arg)
{
    Py_VISIT(r->channel);
    Py_VISIT(r->pending);
    Py_VISIT(r->handler);
    Py_VISIT(r->context_type);
    return 0;
}

static int reader_clear(Reader *r)
{
    Py_CLEAR(r->channel);
    Py_CLEAR(r->pending);
    Py_CLEAR(r->handler);
    Py_CLEAR(r->context_type);
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
                            "worker_id", NULL};
    PyObject *channel, *pending, *handler, *context_type;
    int is_async, rfd, wfd;
    unsigned long worker_id;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO!OpOiik", names, &channel, &PyDict_Type, &pending, &handler,
                                     &is_async, &context_type, &rfd, &wfd, &worker_id))
        return -1;
    if (worker_id > 0xFFFFFFFFul) {
        PyErr_SetString(PyExc_ValueError, "worker_id is out of range");
        return -1;
    }
    Py_XSETREF(r->channel, Py_NewRef(channel));
    Py_XSETREF(r->pending, Py_NewRef(pending));
    Py_XSETREF(r->handler, Py_NewRef(handler));
    Py_XSETREF(r->context_type, Py_NewRef(context_type));
    r->handler_is_async = is_async;
    r->rfd = rfd;
    r->wfd = wfd;
    r->worker_id = (uint32_t)worker_id;
    r->have = 0;
    return 0;
}

/* 1 if the channel is closed, 0 if not, -1 on error. */
static int channel_closed(Reader *r)
{
    PyObject *v = PyObject_GetAttr(r->channel, s_closed);
    if (!v)
        return -1;
    int closed = PyObject_IsTrue(v);
    Py_DECREF(v);
    return closed;
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
    int closed = channel_closed(r);
    if (closed)
        return closed < 0 ? -1 : 0;
    PyObject *backlog = PyObject_GetAttr(r->channel, s_backlog);
    if (!backlog)
        return -1;
    int queued = backlog == Py_None ? 0 : PyObject_IsTrue(backlog);
    Py_DECREF(backlog);
    if (queued < 0)
        return -1;
    if (!queued) {
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
    PyObject *cargs[5] = {r->channel, NULL, NULL, NULL, trace};
    if ((cargs[1] = PyLong_FromUnsignedLongLong(h->call_id)) &&
        (cargs[2] = PyLong_FromUnsignedLongLong(h->parent_call_id)) &&
        (cargs[3] = PyLong_FromUnsignedLongLong(h->deadline_us)))
        ctx = PyObject_Vectorcall(r->context_type, cargs, 5, NULL);
    Py_XDECREF(cargs[1]);
    Py_XDECREF(cargs[2]);
    Py_XDECREF(cargs[3]);
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
    h.name_len = (uint16_t)name_len;
    h.payload_len = (uint32_t)(name_len + n);
    if (PyDict_SetItem(r->pending, args[0], args[5]) < 0)
        return NULL;
    char msg[MESSAGE_LEN];
    h.send_ts_ns = now_ns(CLOCK_MONOTONIC);
    memcpy(msg, &h, HEADER_LEN);
    memcpy(msg + HEADER_LEN, PyBytes_AS_STRING(args[3]), (size_t)name_len);
    memcpy(msg + HEADER_LEN + name_len, PyBytes_AS_STRING(args[4]), (size_t)n);
    memset(msg + HEADER_LEN + name_len + n, 0, (size_t)(INLINE_MAX - name_len - n));
    if (send_message(r, msg) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef reader_methods[] = {
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
            if (PyErr_ExceptionMatches(PyExc_KeyboardInterrupt))
                break; /* the process is going down: raise it */
            /* A fault while handling this message (one Python's own
             * reader would have let escape to the loop): report it in the
             * function's log and go on with the messages after it, which
             * no new event would come for. */
            PyErr_WriteUnraisable(r->channel);
        }
        int closed = channel_closed(r);
        if (closed > 0) {
            r->have = 0; /* the fds are gone: what is left goes with them */
            Py_RETURN_NONE;
        }
        if (closed < 0)
            break;
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
    .tp_doc = PyDoc_STR("Reader(channel, pending, handler, handler_is_async, context_type, rfd, wfd, worker_id): "
                        "a worker channel's e2w reader; call it when e2w is readable."),
    .tp_basicsize = sizeof(Reader),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)reader_init,
    .tp_dealloc = (destructor)reader_dealloc,
    .tp_traverse = (traverseproc)reader_traverse,
    .tp_clear = (inquiry)reader_clear,
    .tp_call = (ternaryfunc)reader_call,
    .tp_methods = reader_methods,
};

static PyObject *fast_init(PyObject *self, PyObject *arg)
{
    (void)self;
    Py_XSETREF(WireError, Py_NewRef(arg));
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"pack", (PyCFunction)(void (*)(void))fast_pack, METH_FASTCALL,
     "pack(kind, flags, payload_len, call_id, parent_call_id, worker_id, name_len, error_kind, deadline_us, "
     "send_ts_ns, aux, inline) -> bytes: wire.pack"},
    {"check_message", fast_check_message, METH_O,
     "check_message(buf) -> None if wire.decode accepts it, else why not"},
    {"init", fast_init, METH_O, "init(WireError): the exception pack raises for an oversized inline payload"},
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
        {&s_closed, "closed"}, {&s_backlog, "_backlog"}, {&s_slow, "_on_raw"}, {&s_eof_read, "_on_eof_read"},
        {&s_read_failed, "_on_read_failed"}, {&s_spawn, "_spawn"}, {&s_handler_failed, "_handler_failed"},
        {&s_send_result, "send_result"}, {&s_send, "send"}, {&s_cpu, "_cpu"}, {&s_await, "__await__"},
        {&s_done, "done"}, {&s_set_result, "set_result"},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!(*names[i].slot = PyUnicode_InternFromString(names[i].text)))
            return NULL;
    if (PyType_Ready(&ReaderType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m)
        return NULL;
    if (PyModule_AddObjectRef(m, "Reader", (PyObject *)&ReaderType) < 0 ||
        PyModule_AddIntConstant(m, "MESSAGE_LEN", MESSAGE_LEN) < 0 ||
        PyModule_AddIntConstant(m, "INLINE_MAX", INLINE_MAX) < 0 ||
        PyModule_AddIntConstant(m, "ERROR_KIND_MAX", ERROR_KIND_MAX) < 0 ||
        PyModule_AddIntConstant(m, "READ_BUF", READ_BUF) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
