"""The per-invocation context handed to a function handler."""
import logging
import time

from .wire import FAST, NAME_MAX

_log = logging.getLogger("staccato.function")


class _CallAdapter(logging.LoggerAdapter):
    """Prefixes every line with the function name and the call id."""

    def process(self, msg, kwargs):
        return f"[{self.extra['function']} {self.extra['call_id']:016x}] {msg}", kwargs


async def _call_py(ctx, name, data=b""):
    """Calls function ``name`` with ``data``; returns its output bytes.

    Raises staccato.CallError(kind, message) when the call fails, ValueError for an
    invalid name. Several calls may be in flight at once (asyncio.gather).
    """
    name_b = name.encode("utf-8")
    if not 1 <= len(name_b) <= NAME_MAX:
        raise ValueError(f"function name must be 1..{NAME_MAX} UTF-8 bytes, got {len(name_b)}")
    if type(data) is not bytes:
        data = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    channel = ctx._channel
    call_id, fut = channel.start_call(name_b, data, ctx.call_id, ctx.deadline_us)
    # The reply takes the future out of the channel's table; a call
    # given up on takes it out here (a try costs nothing until it raises).
    try:
        return await fut
    except BaseException:
        channel.forget_call(call_id)
        raise


if FAST is not None:
    # The fields in C, and call() in C for a Context the reader built (an
    # inline Dispatch) making a call whose Invoke fits inline; every other
    # call goes to _call_py.
    _ContextBase = FAST.ContextBase
    FAST.set_slow_call(_call_py)
else:
    class _ContextBase:
        __slots__ = ("call_id", "parent_call_id", "deadline_us", "_channel", "_logger", "_trace")

        def __init__(self, channel, call_id, parent_call_id, deadline_us, trace=None):
            self._channel = channel
            self.call_id = call_id
            self.parent_call_id = parent_call_id
            self.deadline_us = deadline_us
            self._logger = None
            self._trace = trace  # the Dispatch's trace bytes, or None

        call = _call_py


class Context(_ContextBase):
    """What a handler knows about its invocation, and how it calls others.

    ``call_id`` / ``parent_call_id`` are the wire ids (``parent_call_id`` is 0
    for calls from the gateway); ``deadline`` is Unix seconds or None.
    ``trace_id``, ``traceparent`` and ``tracestate`` are the invocation's W3C
    trace context when it has one (on an engine that traces, --otlp-endpoint:
    it records the call, or its caller sent a context), else None; internal
    calls carry it without being told.

    ``await ctx.call(name, data)`` calls function ``name`` with ``data`` (bytes
    or str) and returns its output bytes; it raises staccato.CallError(kind,
    message) when the call fails, ValueError for an invalid name. Several
    calls may be in flight at once (asyncio.gather).
    """

    __slots__ = ()

    @property
    def trace_id(self):
        """The trace's id, 32 lower-case hex digits, or None."""
        return self._trace[:16].hex() if self._trace else None

    @property
    def traceparent(self):
        """A ``traceparent`` header naming this invocation's span as the
        parent (for calls to services outside Staccato), or None."""
        t = self._trace
        if not t:
            return None
        return f"00-{t[:16].hex()}-{t[16:24].hex()}-{t[24] & 1:02x}"

    @property
    def tracestate(self):
        """The caller's ``tracestate``, or None when there is none."""
        t = self._trace
        return t[25:].decode("ascii", "replace") if t and len(t) > 25 else None

    @property
    def function(self):
        return self._channel.runtime.function

    @property
    def worker_id(self):
        return self._channel.worker_id

    @property
    def deadline(self):
        """Absolute deadline in Unix seconds, or None when there is none."""
        return self.deadline_us / 1e6 if self.deadline_us else None

    def remaining(self):
        """Seconds left until the deadline (never negative), or None."""
        if not self.deadline_us:
            return None
        return max(0.0, self.deadline_us / 1e6 - time.time())

    @property
    def logger(self):
        # Built lazily: most invocations never log, and the hot path should
        # not pay for an adapter object per call.
        if self._logger is None:
            self._logger = _CallAdapter(_log, {"function": self.function,
                                               "call_id": self.call_id})
        return self._logger


__all__ = ["Context"]
