"""FIFO channels between the engine and this process (docs/protocol.md §1).

A process multiplexes its channels on one event loop (Nightcore §4.2):
channel 0 is the launcher channel, channel N > 0 is worker N. An inline
launcher serves channel 0 and every worker; in fork mode (zygote.py) the
launcher serves channel 0 and each forked worker process its own channel.
Each channel reads whole 1024-byte messages from its ``e2w`` FIFO via
``loop.add_reader`` and writes messages to its ``w2e`` FIFO with plain
``os.write``.

When ``staccato._fast`` was built (wire.FAST), a worker channel's reader is
its ``Reader``: it handles inline Dispatches and Completions in C and hands
every other message to ``_on_raw`` here, which is what the Python reader
does with each message.
"""
import abc
import asyncio
import collections
import errno
import logging
import os
import sys
import time
from time import thread_time_ns

from . import wire
from .context import Context
from .errors import ERROR_NAMES, CallError, ErrorKind
from .wire import (COMPLETION, DISPATCH, FAILURE, FAST, INLINE_MAX, INVOKE, MESSAGE_LEN,
                   PAYLOAD_IN_SHM, STOP_WORKER, WireError, decode, pack)

log = logging.getLogger("staccato.runtime")

_now_ns = time.monotonic_ns
# Messages read per read(2): the default pipe capacity is 64 KiB.
_READ_BUF = 64 * MESSAGE_LEN
_SEQ_MASK = 0xFFFFFFFF

if sys.version_info >= (3, 12):
    def _start_task(loop, coro):
        # Eager start runs the handler up to its first suspension right away
        # (inside the task context): a handler that never awaits finishes
        # without a trip through the loop's ready queue.
        return asyncio.Task(coro, loop=loop, eager_start=True)
else:
    def _start_task(loop, coro):
        return loop.create_task(coro)

_FUNCTION_ERROR = int(ErrorKind.function_error)
_OUTPUT_TOO_LARGE = int(ErrorKind.output_too_large)
_INTERNAL = int(ErrorKind.internal)


def open_fifos(ipc_dir, worker_id):
    """Opens channel ``worker_id``: returns (e2w read fd, w2e write fd).

    The engine holds both FIFOs open already, so the protocol allows blocking
    opens; O_NONBLOCK gives the same result then, but fails (ENXIO) instead of
    hanging the whole loop if the engine broke that promise. Python fds are
    close-on-exec, so a child process of a handler never keeps w2e open (which
    would hide our death from the engine).
    """
    e2w, w2e = wire.channel_file_names(worker_id)
    rfd = os.open(os.path.join(ipc_dir, e2w), os.O_RDONLY | os.O_NONBLOCK)
    try:
        wfd = os.open(os.path.join(ipc_dir, w2e), os.O_WRONLY | os.O_NONBLOCK)
    except BaseException:
        os.close(rfd)
        raise
    return rfd, wfd


def read_shm(path, size):
    """Reads a payload file and unlinks it (the receiver owns it)."""
    try:
        with open(path, "rb", buffering=0) as f:
            data = f.read()
    finally:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    if len(data) != size:
        raise OSError(errno.EIO, f"shm payload {path} is {len(data)} bytes, expected {size}")
    return data


def write_shm(path, data):
    """Writes a whole payload file; done before the message that names it."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


class Channel(abc.ABC):
    """Message framing and I/O for one FIFO pair; subclasses handle messages."""

    def __init__(self, runtime, worker_id, rfd, wfd):
        self.runtime = runtime
        self.loop = runtime.loop
        self.worker_id = worker_id
        self.rfd = rfd
        self.wfd = wfd
        self.closed = False
        self._buf = bytearray(_READ_BUF)
        self._view = memoryview(self._buf)
        self._have = 0          # bytes of a partial message kept at _buf[0:]
        self._backlog = None    # messages waiting for w2e to drain, or None

    def start(self):
        self.loop.add_reader(self.rfd, self._on_readable)

    # -- reading ---------------------------------------------------------

    def _on_readable(self):
        have = self._have
        try:
            n = os.readv(self.rfd, [self._view[have:]])
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            self._on_read_failed(e.errno)
            return
        if n == 0:
            self._on_eof_read(have)
            return
        end = have + n
        off = 0
        view = self._view
        # A read may return several messages, or (defensively) part of one.
        while end - off >= MESSAGE_LEN:
            self._on_raw(view[off:off + MESSAGE_LEN])
            if self.closed:
                return
            off += MESSAGE_LEN
        rest = end - off
        if rest and off:
            self._buf[:rest] = self._buf[off:end]
        self._have = rest

    # The reader's steps; _fast.Reader calls them too.

    def _on_raw(self, raw):
        """Handles one whole message as read (1024 bytes)."""
        try:
            msg = decode(raw)
        except WireError as e:
            log.error("channel %d: dropping invalid message: %s", self.worker_id, e)
            return
        self.on_message(msg)

    def _on_eof_read(self, have):
        if have:
            log.warning("channel %d: EOF after a partial message (%d bytes)", self.worker_id, have)
        self.on_eof("end of file on e2w")

    def _on_read_failed(self, code):
        self.on_eof(f"read error: {OSError(code, os.strerror(code))}")

    @abc.abstractmethod
    def on_message(self, msg):
        """Handles one decoded message; each kind of channel decides how."""

    def on_eof(self, reason):
        self.close(reason)

    # -- writing ---------------------------------------------------------

    def send(self, data):
        """Writes one encoded message. A message is <= PIPE_BUF, so the write
        is atomic: all of it or EAGAIN, never a partial write."""
        if self.closed:
            return
        if self._backlog:
            self._backlog.append(data)
            return
        try:
            os.write(self.wfd, data)
        except BlockingIOError:
            # The engine is not draining w2e fast enough: queue in order and
            # let the loop tell us when there is room, instead of blocking
            # every other channel.
            self._backlog = collections.deque((data,))
            self._backlogged(True)
            self.loop.add_writer(self.wfd, self._flush)
        except OSError as e:  # EPIPE: the engine closed its read end
            self.close(f"write error: {e}")

    def _flush(self):
        backlog = self._backlog
        try:
            while backlog:
                os.write(self.wfd, backlog[0])
                backlog.popleft()
        except BlockingIOError:
            return
        except OSError as e:
            self.close(f"write error: {e}")
            return
        self._backlog = None
        self._backlogged(False)
        self.loop.remove_writer(self.wfd)

    def _backlogged(self, queued):
        """Told when sends start and stop going through the backlog."""

    # -- shutdown --------------------------------------------------------

    def close(self, reason="closed"):
        if self.closed:
            return
        self.closed = True
        self.loop.remove_reader(self.rfd)
        if self._backlog is not None:
            self.loop.remove_writer(self.wfd)
            self._backlog = None
        os.close(self.rfd)
        os.close(self.wfd)
        self.on_closed(reason)

    def on_closed(self, reason):
        pass


class WorkerChannel(Channel):
    """Worker ``worker_id``: runs Dispatches, routes replies to ctx.call."""

    def __init__(self, runtime, worker_id, rfd, wfd):
        super().__init__(runtime, worker_id, rfd, wfd)
        self.shm_dir = runtime.shm_dir
        self._id_base = worker_id << 32
        self._seq = 0
        self._pending = {}      # call_id -> Future (or _fast.Call) of an Invoke in flight
        self._running = {}      # call_id -> Task of a running async handler
        self._cpu = None        # (call_id, µs): the CPU time for that call's reply
        self._reader = None     # the _fast.Reader serving e2w, if any

    def start(self):
        if self.closed:
            return  # closed before it started (the hello's write failed)
        if FAST is None:
            super().start()
            return
        runtime = self.runtime
        # It shares _pending (never replaced) and the fds with this channel.
        self._reader = FAST.Reader(self, self._pending, runtime.handler, runtime.handler_is_async,
                                   Context, self.rfd, self.wfd, self.worker_id, self.loop)
        self._reader.backlogged = self._backlog is not None  # the hello may be queued
        self._buf = self._view = None  # the reader has its own
        self.loop.add_reader(self.rfd, self._reader)

    def _backlogged(self, queued):
        if self._reader is not None:
            self._reader.backlogged = queued  # its writes wait their turn too

    def close(self, reason="closed"):
        if self._reader is not None:
            self._reader.closed = True  # before the fds go: it writes no more
        super().close(reason)

    def on_message(self, msg):
        kind = msg.kind
        if kind == COMPLETION or kind == FAILURE:
            self._on_reply(msg)
        elif kind == DISPATCH:
            self._on_dispatch(msg)
        elif kind == STOP_WORKER:
            self.close("StopWorker")
        else:
            log.warning("worker %d: ignoring unexpected %s", self.worker_id,
                        wire.KIND_NAMES[kind])

    def _payload(self, msg):
        if not msg.flags & PAYLOAD_IN_SHM:
            # After a Dispatch's trace context, if it has one.
            return msg.inline[msg.name_len:] if msg.name_len else msg.inline
        path = f"{self.shm_dir}/{wire.shm_file_name(msg.call_id, msg.kind)}"
        return read_shm(path, msg.payload_len)

    # -- running the handler -------------------------------------------

    def _on_dispatch(self, msg):
        call_id = msg.call_id
        try:
            data = self._payload(msg)
        except OSError as e:
            self.send_failure(call_id, msg.parent_call_id, _INTERNAL, f"cannot read input: {e}")
            return
        ctx = Context(self, call_id, msg.parent_call_id, msg.deadline_us,
                      msg.inline[:msg.name_len] if msg.name_len else None)
        runtime = self.runtime
        if runtime.handler_is_async:
            try:
                coro = runtime.handler(ctx, data)
            except KeyboardInterrupt:
                raise
            except BaseException as e:  # e.g. a TypeError: the wrong signature
                self._handler_failed(ctx, e)
                return
            self._spawn(ctx, coro)
            return
        # A plain def runs right here, on the loop thread: its CPU time is
        # the thread's while it runs (when the engine asks for it).
        measure = msg.flags & wire.CPU_TIME
        c0 = thread_time_ns() if measure else 0
        try:
            result = runtime.handler(ctx, data)
        except KeyboardInterrupt:
            raise
        except BaseException as e:  # SystemExit, a CancelledError too: this call fails
            if measure:
                self._cpu = (call_id, (thread_time_ns() - c0) // 1000)
            self._handler_failed(ctx, e)
            return
        if hasattr(result, "__await__"):  # e.g. a def returning a coroutine
            self._spawn(ctx, result)
        else:
            if measure:
                self._cpu = (call_id, (thread_time_ns() - c0) // 1000)
            self.send_result(ctx, result)

    def _spawn(self, ctx, awaitable):
        task = _start_task(self.loop, self._run_async(ctx, awaitable))
        # An eager task may be finished already (handler never suspended).
        if not task.done():
            self._running[ctx.call_id] = task

    async def _run_async(self, ctx, awaitable):
        try:
            result = await awaitable
        except asyncio.CancelledError:
            # Shutdown, or the handler let a cancellation escape: report it
            # (a no-op if the channel is closed already) without a traceback.
            self.send_failure(ctx.call_id, ctx.parent_call_id, _FUNCTION_ERROR,
                              "CancelledError: the invocation was cancelled")
            raise
        except (Exception, SystemExit) as e:
            self._handler_failed(ctx, e)
        else:
            self.send_result(ctx, result)
        finally:
            # Instead of a done callback, which would cost a loop iteration.
            self._running.pop(ctx.call_id, None)

    def _handler_failed(self, ctx, exc):
        if isinstance(exc, SystemExit):
            # sys.exit() in one call must not end the process that runs the
            # function's other calls: it fails this call only.
            ctx.logger.error("handler called sys.exit(%r); only this call fails", exc.code)
            self.send_failure(ctx.call_id, ctx.parent_call_id, _FUNCTION_ERROR,
                              f"SystemExit: the handler called sys.exit({exc.code!r}); this call failed, "
                              "the function's other calls go on")
            return
        ctx.logger.error("handler raised", exc_info=exc)
        text = str(exc)
        message = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
        self.send_failure(ctx.call_id, ctx.parent_call_id, _FUNCTION_ERROR, message)

    def send_result(self, ctx, result):
        """Sends the Completion for a dispatched call (inline or via shm)."""
        if type(result) is not bytes:
            if result is None:
                result = b""
            elif isinstance(result, str):
                try:
                    result = result.encode("utf-8")
                except UnicodeEncodeError as e:  # a lone surrogate
                    self.send_failure(ctx.call_id, ctx.parent_call_id, _FUNCTION_ERROR,
                                      f"UnicodeEncodeError: the handler returned a str that is not valid UTF-8: {e}")
                    return
            elif isinstance(result, (bytearray, memoryview)):
                result = bytes(result)
            else:
                self.send_failure(ctx.call_id, ctx.parent_call_id, _FUNCTION_ERROR,
                                  f"TypeError: handler returned {type(result).__name__}; "
                                  "expected bytes, bytearray, memoryview, str or None")
                return
        call_id = ctx.call_id
        n = len(result)
        if n <= INLINE_MAX:
            cpu_flag, cpu_us = self._cpu_for(call_id)
            self.send(pack(COMPLETION, cpu_flag, n, call_id, ctx.parent_call_id, self.worker_id,
                           0, 0, 0, _now_ns(), cpu_us, result))
            return
        limit = self.runtime.payload_max
        if n > limit:
            self.send_failure(call_id, ctx.parent_call_id, _OUTPUT_TOO_LARGE,
                              f"output of {n} bytes exceeds the maximum of {limit}")
            return
        try:
            write_shm(f"{self.shm_dir}/{wire.shm_file_name(call_id, COMPLETION)}", result)
        except OSError as e:
            self.send_failure(call_id, ctx.parent_call_id, _INTERNAL, f"cannot write output: {e}")
            return
        cpu_flag, cpu_us = self._cpu_for(call_id)
        self.send(pack(COMPLETION, PAYLOAD_IN_SHM | cpu_flag, n, call_id, ctx.parent_call_id,
                       self.worker_id, 0, 0, 0, _now_ns(), cpu_us, b""))

    def _cpu_for(self, call_id):
        """(flag, µs) for the reply to call_id: its CPU time if measured."""
        cpu = self._cpu
        if cpu is None or cpu[0] != call_id:
            return 0, 0
        self._cpu = None
        return wire.CPU_TIME, min(cpu[1], 0xFFFFFFFF)

    def send_failure(self, call_id, parent_call_id, error_kind, message):
        # Error messages are cut to fit inline (at a UTF-8 character
        # boundary): they are for humans, and shm is not worth it for them.
        data = message.encode("utf-8", "replace")
        if len(data) > INLINE_MAX:
            data = data[:INLINE_MAX - 3].decode("utf-8", "ignore").encode("utf-8") + b"..."
        cpu_flag, cpu_us = self._cpu_for(call_id)
        self.send(pack(FAILURE, cpu_flag, len(data), call_id, parent_call_id, self.worker_id,
                       0, error_kind, 0, _now_ns(), cpu_us, data))

    # -- internal calls (ctx.call) --------------------------------------

    def start_call(self, name, data, parent_call_id, deadline_us):
        """Sends an Invoke; returns (call_id, future of the reply)."""
        if self.closed:
            raise CallError("engine_unavailable", f"worker channel {self.worker_id} is closed")
        reader = self._reader
        if reader is not None:
            call_id = reader.next_call_id()  # one counter with ctx.call's in C
        else:
            seq = (self._seq + 1) & _SEQ_MASK or 1  # 32-bit counter, never 0
            self._seq = seq
            call_id = self._id_base | seq
        name_len = len(name)
        n = len(data)
        if name_len + n <= INLINE_MAX:
            if reader is not None:
                fut = self.loop.create_future()
                reader.invoke(call_id, parent_call_id, deadline_us, name, data, fut)
                return call_id, fut
            msg = pack(INVOKE, 0, name_len + n, call_id, parent_call_id, self.worker_id,
                       name_len, 0, deadline_us, _now_ns(), 0, name + data)
        else:
            limit = self.runtime.payload_max
            if n > limit:
                raise CallError("payload_too_large", f"input of {n} bytes exceeds the maximum of {limit}")
            try:
                write_shm(f"{self.shm_dir}/{wire.shm_file_name(call_id, INVOKE)}", data)
            except OSError as e:
                raise CallError("internal", f"cannot write input: {e}") from e
            # In shm the name stays inline and payload_len counts input only.
            msg = pack(INVOKE, PAYLOAD_IN_SHM, n, call_id, parent_call_id, self.worker_id,
                       name_len, 0, deadline_us, _now_ns(), 0, name)
        fut = self.loop.create_future()
        # Registered before sending: a failed send closes the channel, which
        # fails every pending future.
        self._pending[call_id] = fut
        self.send(msg)
        return call_id, fut

    def forget_call(self, call_id):
        self._pending.pop(call_id, None)

    def _on_reply(self, msg):
        fut = self._pending.pop(msg.call_id, None)
        try:
            # Read (and unlink) even when nobody waits: the file is ours now.
            payload = self._payload(msg)
        except OSError as e:
            if fut is not None and not fut.done():
                fut.set_exception(CallError("internal", f"cannot read reply: {e}"))
            return
        if fut is None or fut.done():
            return  # the caller gave up (cancelled) or the id is unknown
        if msg.kind == COMPLETION:
            fut.set_result(payload)
        else:
            fut.set_exception(CallError(ERROR_NAMES[msg.error_kind],
                                        payload.decode("utf-8", "replace")))

    def on_closed(self, reason):
        # The reader (and the cycle through it) goes; _pending stays the
        # same dict, which the reader shared.
        self._reader = None
        pending = list(self._pending.values())
        self._pending.clear()
        for fut in pending:
            if not fut.done():
                fut.set_exception(CallError("engine_unavailable",
                                            f"worker channel {self.worker_id} closed: {reason}"))
        # After the failures: a forked worker stops when its channel closes,
        # and handlers woken above then run before its shutdown cancels them.
        self.runtime.channel_closed(self, reason)

    def cancel_tasks(self):
        tasks = list(self._running.values())
        for task in tasks:
            task.cancel()
        return tasks


class LauncherChannel(Channel):
    """Channel 0: CreateWorker requests; EOF means the engine is gone."""

    def on_message(self, msg):
        if msg.kind == wire.CREATE_WORKER:
            self.runtime.create_worker(msg.worker_id)
        else:
            log.warning("launcher channel: ignoring unexpected %s", wire.KIND_NAMES[msg.kind])

    def on_eof(self, reason):
        self.close(reason)
        self.runtime.stop(f"launcher channel: {reason}")
