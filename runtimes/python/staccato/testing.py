"""Running a handler in a unit test, without an engine.

    from staccato.testing import run_handler, FakeCalls

    def test_greets():
        assert run_handler(handle, b"ann") == b"hello ann"

    def test_calls_its_store():
        calls = FakeCalls({"store": lambda data: b"saved " + data})
        assert run_handler(handle, b"x", calls=calls) == b"ok"
        assert calls.made == [("store", b"x")]

The handler gets a real :class:`staccato.Context` (call id, parent call id,
deadline and remaining time, logger) whose ``ctx.call`` is answered by
``calls``: per callee a function of the input (sync or async) returning
bytes/str, bytes to return as is, or a :class:`staccato.CallError` to raise.
A callee not listed raises ``CallError("not_found", ...)``, as the engine
would. The result is turned into bytes as the runtime does (str as UTF-8,
None as empty), and what the runtime refuses (another type) raises
TypeError here.
"""
import asyncio
import inspect
import itertools
import time

from .context import Context
from .errors import CallError

_ids = itertools.count(1)


class FakeCalls:
    """What ``ctx.call`` answers in a test, and the calls it saw."""

    def __init__(self, callees=None):
        self.callees = dict(callees or {})
        self.made = []  # (name, data) in the order the handler called

    async def _answer(self, name, data):
        self.made.append((name, data))
        if name not in self.callees:
            raise CallError("not_found", f"no function named {name!r}")
        answer = self.callees[name]
        if isinstance(answer, CallError):
            raise answer
        if callable(answer):
            answer = answer(data)
            if inspect.isawaitable(answer):
                answer = await answer
        return _as_bytes(answer, f"the fake callee {name!r}")


class _Runtime:
    def __init__(self, function):
        self.function = function


class _Channel:
    """Stands in for a worker channel: what Context uses of one."""

    def __init__(self, function, calls, loop):
        self.runtime = _Runtime(function)
        self.worker_id = 1
        self._calls = calls
        self._loop = loop

    def start_call(self, name_b, data, parent_call_id, deadline_us):
        call_id = next(_ids)
        fut = self._loop.create_task(self._calls._answer(name_b.decode("utf-8"), data))
        return call_id, fut

    def forget_call(self, call_id):
        pass


def _as_bytes(result, what):
    if result is None:
        return b""
    if isinstance(result, str):
        return result.encode("utf-8")
    if isinstance(result, (bytes, bytearray, memoryview)):
        return bytes(result)
    raise TypeError(f"{what} returned {type(result).__name__}; expected bytes, bytearray, memoryview, str or None")


def _trace_bytes(traceparent, tracestate):
    """A traceparent (and tracestate) as the Dispatch carries them."""
    if traceparent is None:
        return None
    parts = traceparent.split("-")
    if len(parts) != 4 or [len(p) for p in parts] != [2, 32, 16, 2]:
        raise ValueError(f"traceparent {traceparent!r} is not 00-<32 hex>-<16 hex>-<2 hex>")
    return bytes.fromhex(parts[1] + parts[2] + parts[3]) + (tracestate or "").encode("ascii")


async def run_handler_async(handler, data=b"", *, function="test", calls=None, timeout_s=None, call_id=None,
                            traceparent=None, tracestate=None):
    """:func:`run_handler` inside a running event loop."""
    calls = calls if calls is not None else FakeCalls()
    deadline_us = int((time.time() + timeout_s) * 1e6) if timeout_s else 0
    channel = _Channel(function, calls, asyncio.get_running_loop())
    ctx = Context(channel, call_id if call_id is not None else next(_ids), 0, deadline_us,
                  _trace_bytes(traceparent, tracestate))
    if isinstance(data, str):
        data = data.encode("utf-8")
    result = handler(ctx, bytes(data))
    if inspect.isawaitable(result):
        result = await (asyncio.wait_for(result, timeout_s) if timeout_s else result)
    return _as_bytes(result, "the handler")


def run_handler(handler, data=b"", *, function="test", calls=None, timeout_s=None, call_id=None,
                traceparent=None, tracestate=None):
    """Runs ``handler(ctx, data)`` once, as the runtime would, and returns
    its output as bytes. ``calls``: a :class:`FakeCalls` (or a dict for
    one); ``timeout_s``: the call's deadline (``ctx.remaining()``), after
    which an async handler is cancelled (asyncio.TimeoutError);
    ``traceparent``/``tracestate``: the invocation's trace context
    (``ctx.trace_id`` ...), none by default."""
    if isinstance(calls, dict):
        calls = FakeCalls(calls)
    return asyncio.run(run_handler_async(handler, data, function=function, calls=calls, timeout_s=timeout_s,
                                         call_id=call_id, traceparent=traceparent, tracestate=tracestate))


__all__ = ["FakeCalls", "run_handler", "run_handler_async"]
