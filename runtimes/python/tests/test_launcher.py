"""Live tests: this file plays the engine against a real launcher process.

FIFOs, shm files and the launcher process are real; every wait has a timeout
so a broken runtime fails a test instead of hanging it.
"""
import json
import os
import textwrap
import time

import pytest

from fake_engine import TIMEOUT, Engine as FakeEngine
from staccato import wire
from staccato.wire import Message

GATEWAY = 1 << 63

HANDLER = textwrap.dedent('''
    import asyncio, json, time
    from staccato import CallError

    async def handle(ctx, data):
        cmd, _, arg = data.partition(b" ")
        if cmd == b"echo":
            return arg
        if cmd == b"str":
            return arg.decode() + "!"
        if cmd == b"none":
            return None
        if cmd == b"view":
            return memoryview(bytearray(arg))
        if cmd == b"big":
            return b"x" * int(arg)
        if cmd == b"raise":
            raise ValueError("boom")
        if cmd == b"badtype":
            return 42
        if cmd == b"ctx":
            return json.dumps({"call_id": ctx.call_id, "parent": ctx.parent_call_id,
                               "deadline": ctx.deadline, "remaining": ctx.remaining(),
                               "function": ctx.function, "trace_id": ctx.trace_id,
                               "traceparent": ctx.traceparent, "tracestate": ctx.tracestate,
                               "input": len(arg)}).encode()
        if cmd == b"call":
            name, _, payload = arg.partition(b" ")
            return b"got:" + await ctx.call(name.decode(), payload)
        if cmd == b"callbig":
            out = await ctx.call("big", b"i" * int(arg))
            return str(len(out)).encode()
        if cmd == b"fanout":
            outs = await asyncio.gather(*(ctx.call(f"f{i}", str(i)) for i in range(8)))
            return b",".join(outs)
        if cmd == b"callerr":
            try:
                await ctx.call("nope", b"")
            except CallError as e:
                return f"{e.kind}|{e.message}".encode()
            return b"no error"
        if cmd == b"uncaught":
            await ctx.call("nope", b"")
        if cmd == b"badname":
            try:
                await ctx.call("n" * 65)
            except ValueError as e:
                return b"ValueError"
        if cmd == b"pending":
            # arg: a file to record what happened to a call cut off by close
            try:
                await ctx.call("slow", b"")
                result = "completed"
            except CallError as e:
                result = e.kind
            with open(arg, "w") as f:
                f.write(result)
            return b""
        return b"unknown command " + cmd

    def sync_handle(ctx, data):
        if data == b"raise":
            raise KeyError("k")
        if data.startswith(b"spin "):
            end = time.thread_time() + int(data[5:]) / 1000
            while time.thread_time() < end:
                pass
            return b"spun"
        return data.upper()
''')


def Engine(tmp_path, source=HANDLER, **kw):
    return FakeEngine(tmp_path, source=source, **kw)


MODES = ["inline", "fork"]


# Every test of this module runs against both worker modes
# (STACCATO_WORKER_MODE): a forked worker must behave exactly like an inline
# one. test_fork.py covers what is particular to processes.
@pytest.fixture(scope="module", params=MODES)
def engine(tmp_path_factory, request):
    eng = Engine(tmp_path_factory.mktemp("launcher"), worker_mode=request.param)
    try:
        eng.hello()
        yield eng
    finally:
        eng.close()


@pytest.fixture
def worker(engine):
    return engine.create_worker()


_ids = iter(range(1, 1 << 30))


def gw_id():
    return GATEWAY | next(_ids)


# -- Dispatch / Completion ---------------------------------------------------

def test_echo_small(engine, worker):
    cid = gw_id()
    msg = engine.call(worker, b"echo hello", cid)
    assert msg.kind == wire.COMPLETION and not msg.in_shm
    assert msg.inline == b"hello" and msg.payload_len == 5


@pytest.mark.parametrize("cmd,out", [(b"str abc", b"abc!"), (b"none", b""), (b"view xyz", b"xyz")])
def test_result_types(engine, worker, cmd, out):
    msg = engine.call(worker, cmd, gw_id())
    assert msg.kind == wire.COMPLETION and engine.payload(msg, "o") == out


def test_echo_1mib_via_shm_both_ways(engine, worker):
    cid = gw_id()
    data = os.urandom(1 << 20)
    msg = engine.call(worker, b"echo " + data, cid)
    assert msg.kind == wire.COMPLETION and msg.in_shm and msg.payload_len == len(data)
    # The launcher consumed (unlinked) the input file ...
    assert not os.path.exists(engine.shm_path(cid, "i"))
    # ... and wrote the output file before the message.
    assert engine.payload(msg, "o") == data
    assert os.listdir(engine.shm) == []


def test_exactly_inline_max_stays_inline(engine, worker):
    msg = engine.call(worker, b"big 960", gw_id())
    assert not msg.in_shm and msg.inline == b"x" * 960
    msg = engine.call(worker, b"big 961", gw_id())
    assert msg.in_shm and engine.payload(msg, "o") == b"x" * 961


def test_serial_calls_on_one_worker(engine, worker):
    for i in range(50):
        cid = gw_id()
        assert engine.call(worker, b"echo %d" % i, cid).inline == b"%d" % i


def test_context_fields(engine, worker):
    cid = (worker.worker_id << 32) | 77  # an internal call dispatched to us
    deadline_us = int((time.time() + 30) * 1e6)
    msg = engine.call(worker, b"ctx", cid, parent=GATEWAY | 5, deadline_us=deadline_us)
    info = json.loads(msg.inline)
    assert info["call_id"] == cid and info["parent"] == GATEWAY | 5
    assert info["deadline"] == pytest.approx(deadline_us / 1e6)
    assert 0 < info["remaining"] <= 30 and info["function"] == "fn"
    info = json.loads(engine.call(worker, b"ctx", gw_id()).inline)
    assert info["deadline"] is None and info["remaining"] is None and info["parent"] == 0
    assert info["trace_id"] is None and info["traceparent"] is None and info["tracestate"] is None


@pytest.mark.parametrize("size", [3, 2000])  # the input inline, then in shm
def test_the_trace_context_before_the_input(engine, worker, size):
    trace = bytes.fromhex("4bf92f3577b34da6a3ce929d0e0e4736" "00f067aa0ba902b7" "01") + b"rojo=1,congo=2"
    data = b"ctx " + b"x" * size
    msg = engine.call(worker, data, gw_id(), trace=trace)
    assert msg.kind == wire.COMPLETION, msg
    info = json.loads(engine.payload(msg, "o"))
    assert info["trace_id"] == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert info["traceparent"] == "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    assert info["tracestate"] == "rojo=1,congo=2" and info["input"] == size
    # Unsampled, without a state.
    info = json.loads(engine.call(worker, b"ctx", gw_id(), trace=trace[:24] + b"\0").inline)
    assert info["traceparent"].endswith("-00") and info["tracestate"] is None


# -- Failures ----------------------------------------------------------------

def test_handler_raising_sends_function_error(engine, worker):
    msg = engine.call(worker, b"raise", gw_id())
    assert msg.kind == wire.FAILURE and msg.error_kind == 3
    assert msg.inline == b"ValueError: boom"
    assert "ValueError: boom" in engine.stderr  # traceback logged


def test_bad_result_type_is_function_error(engine, worker):
    msg = engine.call(worker, b"badtype", gw_id())
    assert msg.error_kind == 3 and msg.inline.startswith(b"TypeError")


def test_worker_survives_a_failure(engine, worker):
    engine.call(worker, b"raise", gw_id())
    assert engine.call(worker, b"echo ok", gw_id()).inline == b"ok"


@pytest.mark.parametrize("mode", MODES)
def test_output_over_payload_max_is_rejected(tmp_path, mode):
    eng = Engine(tmp_path, payload_max=4096, worker_mode=mode)
    try:
        eng.hello()
        w = eng.create_worker()
        msg = eng.call(w, b"big 4097", gw_id())
        assert msg.kind == wire.FAILURE and msg.error_kind == 10  # output_too_large
        assert os.listdir(eng.shm) == []
        assert eng.call(w, b"big 4096", gw_id()).payload_len == 4096
    finally:
        eng.close()


# -- Internal calls (ctx.call) ------------------------------------------------

def test_call_sends_invoke_and_returns_completion(engine, worker):
    cid = gw_id()
    deadline_us = int((time.time() + 30) * 1e6)
    engine.dispatch(worker, b"call x ping", cid, deadline_us=deadline_us)
    inv = worker.recv()
    assert inv.kind == wire.INVOKE and not inv.in_shm
    assert inv.inline[:inv.name_len] == b"x" and engine.payload(inv, "i") == b"ping"
    assert inv.parent_call_id == cid and inv.deadline_us == deadline_us
    assert inv.worker_id == worker.worker_id
    # call id layout: (worker_id << 32) | seq, seq from 1 per channel.
    assert inv.call_id == (worker.worker_id << 32) | 1
    engine.reply(worker, inv.call_id, b"pong")
    msg = worker.recv()
    assert (msg.kind, msg.call_id, msg.inline) == (wire.COMPLETION, cid, b"got:pong")

    # The per-channel sequence goes on.
    engine.dispatch(worker, b"call y ", gw_id())
    inv = worker.recv()
    assert inv.call_id == (worker.worker_id << 32) | 2 and inv.payload_len == 1
    engine.reply(worker, inv.call_id, b"")
    assert worker.recv().inline == b"got:"


def test_call_with_large_input_and_output_uses_shm(engine, worker):
    cid = gw_id()
    engine.dispatch(worker, b"callbig 2000000", cid)
    inv = worker.recv()
    assert inv.kind == wire.INVOKE and inv.in_shm
    assert inv.name_len == 3 and inv.inline == b"big" and inv.payload_len == 2_000_000
    assert engine.payload(inv, "i") == b"i" * 2_000_000
    engine.reply(worker, inv.call_id, b"o" * 3_000_000)
    msg = worker.recv()
    assert msg.kind == wire.COMPLETION and msg.inline == b"3000000"
    assert not os.path.exists(engine.shm_path(inv.call_id, "o"))  # launcher unlinked it
    assert os.listdir(engine.shm) == []


def test_fanout_of_8_answered_out_of_order(engine, worker):
    cid = gw_id()
    engine.dispatch(worker, b"fanout", cid)
    invokes = [worker.recv() for _ in range(8)]
    assert all(m.kind == wire.INVOKE and m.parent_call_id == cid for m in invokes)
    assert len({m.call_id for m in invokes}) == 8
    names = {m.inline[:m.name_len].decode(): m for m in invokes}
    assert set(names) == {f"f{i}" for i in range(8)}
    for i in (5, 2, 7, 0, 3, 6, 1, 4):
        inv = names[f"f{i}"]
        engine.reply(worker, inv.call_id, b"r" + engine.payload(inv, "i"))
    msg = worker.recv()
    assert msg.kind == wire.COMPLETION and msg.call_id == cid
    assert msg.inline == b",".join(b"r%d" % i for i in range(8))


def test_failure_reply_raises_call_error(engine, worker):
    cid = gw_id()
    engine.dispatch(worker, b"callerr", cid)
    inv = worker.recv()
    assert inv.inline[:inv.name_len] == b"nope"
    engine.reply(worker, inv.call_id, b"no function 'nope'", error_kind=1)
    assert worker.recv().inline == b"not_found|no function 'nope'"


def test_uncaught_call_error_is_function_error(engine, worker):
    cid = gw_id()
    engine.dispatch(worker, b"uncaught", cid)
    inv = worker.recv()
    engine.reply(worker, inv.call_id, b"too slow", error_kind=5)
    msg = worker.recv()
    assert msg.kind == wire.FAILURE and msg.call_id == cid and msg.error_kind == 3
    assert msg.inline == b"CallError: timeout: too slow"


def test_invalid_name_raises_value_error(engine, worker):
    assert engine.call(worker, b"badname", gw_id()).inline == b"ValueError"


def test_late_reply_for_unknown_call_is_dropped(engine, worker):
    engine.write_shm((worker.worker_id << 32) | 999, "o", b"z" * 5000)
    engine.reply(worker, (worker.worker_id << 32) | 999, b"z" * 5000)
    assert engine.call(worker, b"echo still", gw_id()).inline == b"still"
    assert os.listdir(engine.shm) == []  # the stray file was consumed


# -- Channel lifecycle -----------------------------------------------------------

def test_stop_worker_closes_channel(engine, worker):
    worker.send(Message(wire.STOP_WORKER, worker_id=worker.worker_id))
    worker.expect_eof()
    assert engine.proc.poll() is None


def test_eof_on_worker_channel_closes_it_and_fails_pending_calls(engine, worker):
    record = engine.tmp / f"pending-{worker.worker_id}"
    engine.dispatch(worker, b"pending " + str(record).encode(), gw_id())
    inv = worker.recv()
    assert inv.kind == wire.INVOKE
    os.close(worker.e2w)  # the engine drops its end of e2w
    worker.expect_eof()
    deadline = time.monotonic() + TIMEOUT
    while not record.exists() or not record.read_text():
        assert time.monotonic() < deadline, "pending call was not failed"
        time.sleep(0.01)
    assert record.read_text() == "engine_unavailable"
    # Other workers keep working.
    other = engine.create_worker()
    assert engine.call(other, b"echo alive", gw_id()).inline == b"alive"


def test_several_workers(engine):
    a, b = engine.create_worker(), engine.create_worker()
    ca, cb = gw_id(), gw_id()
    engine.dispatch(a, b"call sa 1", ca)
    engine.dispatch(b, b"call sb 2", cb)
    ia, ib = a.recv(), b.recv()
    assert ia.call_id >> 32 == a.worker_id and ib.call_id >> 32 == b.worker_id
    engine.reply(b, ib.call_id, b"B")
    engine.reply(a, ia.call_id, b"A")
    assert b.recv().inline == b"got:B" and a.recv().inline == b"got:A"


@pytest.mark.parametrize("mode", MODES)
def test_eof_on_channel_0_exits(tmp_path, mode):
    eng = Engine(tmp_path, worker_mode=mode)
    try:
        eng.hello()
        w = eng.create_worker()
        assert eng.call(w, b"echo x", gw_id()).inline == b"x"
        os.close(eng.chan0.e2w)
        assert eng.wait() == 0
        eng.chan0.expect_eof()
        w.expect_eof()
    finally:
        eng.close()


# -- Other handlers / startup ---------------------------------------------------

@pytest.mark.parametrize("mode", MODES)
def test_sync_handler(tmp_path, mode):
    eng = Engine(tmp_path, handler="handler:sync_handle", worker_mode=mode)
    try:
        eng.hello()
        w = eng.create_worker()
        assert eng.call(w, b"abc", gw_id()).inline == b"ABC"
        msg = eng.call(w, b"raise", gw_id())
        assert msg.error_kind == 3 and msg.inline == b"KeyError: 'k'"
        # Asked for it (CPU_TIME), the reply carries the call's CPU time in aux.
        assert not eng.call(w, b"spin 20", gw_id()).flags & wire.CPU_TIME
        msg = eng.call(w, b"spin 20", gw_id(), flags=wire.CPU_TIME)
        assert msg.inline == b"spun" and msg.flags & wire.CPU_TIME and 15_000 <= msg.aux <= 500_000, msg
        msg = eng.call(w, b"raise", gw_id(), flags=wire.CPU_TIME)
        assert msg.kind == wire.FAILURE and msg.flags & wire.CPU_TIME and msg.aux < 500_000, msg
    finally:
        eng.close()


@pytest.mark.parametrize("handler,source,needle", [
    ("handler:handle", "raise RuntimeError('broken module')\n", "broken module"),
    ("handler:missing", "def handle(ctx, data): pass\n", "no attribute 'missing'"),
    ("nomodule:handle", "", "nomodule"),
    ("justamodule", "", "module:function"),
])
def test_import_errors_fail_at_startup(tmp_path, handler, source, needle):
    eng = Engine(tmp_path, handler=handler, source=source)
    try:
        assert eng.wait() == 1
        assert needle in eng.stderr
        # Channel 0 was never opened: no hello.
        with pytest.raises(TimeoutError):
            eng.chan0.recv(timeout=0.1)
    finally:
        eng.close()
