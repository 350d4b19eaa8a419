"""Live tests: this file plays the engine against a real launcher process.

FIFOs, shm files and the launcher process are real; every wait has a timeout
so a broken runtime fails a test instead of hanging it.
"""
import json
import os
import select
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import PYTHON_RUNTIME
from staccato import wire
from staccato.wire import Message, decode, encode

TIMEOUT = 10.0
# The interpreter that runs the launcher (to test other Python versions).
LAUNCHER_PYTHON = os.environ.get("STACCATO_TEST_PYTHON") or sys.executable
GATEWAY = 1 << 63

HANDLER = textwrap.dedent('''
    import asyncio, json
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
                               "function": ctx.function}).encode()
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
        return data.upper()
''')


class Chan:
    """The engine's end of one channel: e2w O_RDWR, w2e O_RDONLY|O_NONBLOCK."""

    def __init__(self, ipc, worker_id):
        base = os.path.join(ipc, str(worker_id))
        for suffix in (".e2w", ".w2e"):
            os.mkfifo(base + suffix)
        self.worker_id = worker_id
        self.e2w = os.open(base + ".e2w", os.O_RDWR)
        self.w2e = os.open(base + ".w2e", os.O_RDONLY | os.O_NONBLOCK)
        self.buf = b""

    def send(self, msg):
        os.write(self.e2w, encode(msg))

    def _fill(self, deadline):
        """Reads more bytes; returns False on EOF."""
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"channel {self.worker_id}: no message within {TIMEOUT}s")
            r, _, _ = select.select([self.w2e], [], [], left)
            if not r:
                continue
            try:
                data = os.read(self.w2e, 65536)
            except BlockingIOError:
                continue
            if not data:
                return False
            self.buf += data
            return True

    def recv(self, timeout=TIMEOUT):
        deadline = time.monotonic() + timeout
        while len(self.buf) < wire.MESSAGE_LEN:
            if not self._fill(deadline):
                raise EOFError(f"channel {self.worker_id}: EOF")
        raw, self.buf = self.buf[:wire.MESSAGE_LEN], self.buf[wire.MESSAGE_LEN:]
        return decode(raw)

    def expect_eof(self, timeout=TIMEOUT):
        deadline = time.monotonic() + timeout
        while self._fill(deadline):
            pass
        assert self.buf == b"", "unexpected bytes before EOF"

    def close(self):
        for fd in (self.e2w, self.w2e):
            try:
                os.close(fd)
            except OSError:
                pass


class Engine:
    """A fake engine around one launcher process."""

    def __init__(self, tmp_path, handler="handler:handle", payload_max=None, source=HANDLER):
        self.tmp = tmp_path
        self.ipc = str(tmp_path / "ipc" / "fn")
        self.shm = os.path.join(self.ipc, "shm")
        os.makedirs(self.shm)
        code = tmp_path / "code"
        code.mkdir()
        (code / "handler.py").write_text(source)
        self.chan0 = Chan(self.ipc, 0)
        env = dict(os.environ, STACCATO_FUNCTION="fn", STACCATO_IPC_DIR=self.ipc,
                   STACCATO_HANDLER=handler, PYTHONPATH=str(PYTHON_RUNTIME))
        if payload_max is not None:
            env["STACCATO_PAYLOAD_MAX"] = str(payload_max)
        self.stderr_path = tmp_path / "launcher.stderr"
        with open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen([LAUNCHER_PYTHON, "-m", "staccato.launcher"],
                                         cwd=code, env=env, stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=err)
        self.workers = {}
        self.next_worker = 1

    @property
    def stderr(self):
        return self.stderr_path.read_text()

    def hello(self):
        msg = self.chan0.recv()
        assert msg.kind == wire.LAUNCHER_HELLO, msg
        assert msg.aux == self.proc.pid and msg.worker_id == 0
        return msg

    def create_worker(self):
        wid = self.next_worker
        self.next_worker += 1
        chan = Chan(self.ipc, wid)
        self.workers[wid] = chan
        self.chan0.send(Message(wire.CREATE_WORKER, worker_id=wid))
        msg = chan.recv()
        assert (msg.kind, msg.worker_id, msg.aux) == (wire.WORKER_HELLO, wid, self.proc.pid)
        return chan

    def dispatch(self, chan, data, call_id, parent=0, deadline_us=0):
        if len(data) <= wire.INLINE_MAX:
            chan.send(Message(wire.DISPATCH, 0, len(data), call_id, parent, chan.worker_id,
                              deadline_us=deadline_us, inline=data))
        else:
            self.write_shm(call_id, "i", data)
            chan.send(Message(wire.DISPATCH, wire.PAYLOAD_IN_SHM, len(data), call_id, parent,
                              chan.worker_id, deadline_us=deadline_us))

    def reply(self, chan, call_id, data=b"", error_kind=0):
        kind = wire.FAILURE if error_kind else wire.COMPLETION
        if len(data) <= wire.INLINE_MAX:
            chan.send(Message(kind, 0, len(data), call_id, 0, chan.worker_id,
                              error_kind=error_kind, inline=data))
        else:
            self.write_shm(call_id, "o", data)
            chan.send(Message(kind, wire.PAYLOAD_IN_SHM, len(data), call_id, 0, chan.worker_id,
                              error_kind=error_kind))

    def shm_path(self, call_id, suffix):
        return os.path.join(self.shm, f"{call_id:016x}.{suffix}")

    def write_shm(self, call_id, suffix, data):
        with open(self.shm_path(call_id, suffix), "wb") as f:
            f.write(data)

    def payload(self, msg, suffix):
        """A received message's payload; shm files are read and unlinked."""
        if not msg.in_shm:
            return msg.inline[msg.name_len:]
        path = self.shm_path(msg.call_id, suffix)
        with open(path, "rb") as f:
            data = f.read()
        os.unlink(path)
        assert len(data) == msg.payload_len
        return data

    def call(self, chan, data, call_id, **kw):
        """Dispatch and wait for the result message."""
        self.dispatch(chan, data, call_id, **kw)
        msg = chan.recv()
        assert msg.call_id == call_id and msg.worker_id == chan.worker_id
        assert msg.kind in (wire.COMPLETION, wire.FAILURE), msg
        return msg

    def wait(self, timeout=TIMEOUT):
        return self.proc.wait(timeout)

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(TIMEOUT)
        self.chan0.close()
        for chan in self.workers.values():
            chan.close()


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    eng = Engine(tmp_path_factory.mktemp("launcher"))
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


def test_output_over_payload_max_is_rejected(tmp_path):
    eng = Engine(tmp_path, payload_max=4096)
    try:
        eng.hello()
        w = eng.create_worker()
        msg = eng.call(w, b"big 4097", gw_id())
        assert msg.kind == wire.FAILURE and msg.error_kind == 2
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


def test_several_workers_in_one_process(engine):
    a, b = engine.create_worker(), engine.create_worker()
    ca, cb = gw_id(), gw_id()
    engine.dispatch(a, b"call sa 1", ca)
    engine.dispatch(b, b"call sb 2", cb)
    ia, ib = a.recv(), b.recv()
    assert ia.call_id >> 32 == a.worker_id and ib.call_id >> 32 == b.worker_id
    engine.reply(b, ib.call_id, b"B")
    engine.reply(a, ia.call_id, b"A")
    assert b.recv().inline == b"got:B" and a.recv().inline == b"got:A"


def test_eof_on_channel_0_exits(tmp_path):
    eng = Engine(tmp_path)
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

def test_sync_handler(tmp_path):
    eng = Engine(tmp_path, handler="handler:sync_handle")
    try:
        eng.hello()
        w = eng.create_worker()
        assert eng.call(w, b"abc", gw_id()).inline == b"ABC"
        msg = eng.call(w, b"raise", gw_id())
        assert msg.error_kind == 3 and msg.inline == b"KeyError: 'k'"
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
