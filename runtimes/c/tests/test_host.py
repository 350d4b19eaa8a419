"""Live tests of staccato-c-host: this file plays the engine's side of
docs/protocol.md with real FIFOs and shm files in a temporary IPC directory.

Paths come from the environment (set by run_tests.py), defaulting to the
Makefile's build directory:
  STACCATO_C_HOST      build/staccato-c-host
  STACCATO_C_HANDLER   build/test_handler.so (tests/test_handler.c)
  STACCATO_C_NOSYM     build/test_nosym.so   (a library without staccato_handle)

Every wait has a timeout, so a broken host fails a test instead of hanging it.
"""
import os
import random
import re
import resource
import select
import shutil
import signal
import struct
import subprocess
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
BUILD = HERE.parent / "build"
HOST = os.environ.get("STACCATO_C_HOST", str(BUILD / "staccato-c-host"))
HANDLER = os.environ.get("STACCATO_C_HANDLER", str(BUILD / "test_handler.so"))
NOSYM = os.environ.get("STACCATO_C_NOSYM", str(BUILD / "test_nosym.so"))

TIMEOUT = 5.0
MSG_LEN, HEADER_LEN, INLINE_MAX = 1024, 64, 960
HEADER = struct.Struct("<HHIQQIHHQQI12x")  # docs/protocol.md header table
assert HEADER.size == HEADER_LEN
(LAUNCHER_HELLO, WORKER_HELLO, CREATE_WORKER, STOP_WORKER,
 DISPATCH, COMPLETION, FAILURE, INVOKE) = range(1, 9)
SHM = 1
CPU = 2  # CPU_TIME
GW = 1 << 63  # call ids from the gateway have bit 63 set
FUNCTION = "fn"


class Msg:
    FIELDS = ("kind", "flags", "payload_len", "call_id", "parent_call_id", "worker_id",
              "name_len", "error_kind", "deadline_us", "send_ts_ns", "aux")

    def __init__(self, raw):
        assert len(raw) == MSG_LEN
        for name, value in zip(self.FIELDS, HEADER.unpack_from(raw)):
            setattr(self, name, value)
        self.raw = raw

    @property
    def inline(self):
        used = self.payload_len if not self.flags & SHM else (self.name_len if self.kind == INVOKE else 0)
        return self.raw[HEADER_LEN:HEADER_LEN + used]

    def __repr__(self):
        return "Msg(" + ", ".join(f"{f}={getattr(self, f)}" for f in self.FIELDS) + ")"


def encode(kind, payload=b"", *, flags=0, payload_len=None, call_id=0, parent_call_id=0, worker_id=0,
           name_len=0, error_kind=0, deadline_us=0, aux=0):
    if payload_len is None:
        payload_len = len(payload)
    head = HEADER.pack(kind, flags, payload_len, call_id, parent_call_id, worker_id, name_len, error_kind,
                       deadline_us, time.monotonic_ns(), aux)
    assert len(payload) <= INLINE_MAX
    return head + payload + bytes(INLINE_MAX - len(payload))


def pattern(n):
    return bytes(ord("a") + i % 26 for i in range(n))


def shm_file(ipc, call_id, suffix):
    return Path(ipc) / "shm" / f"{call_id:016x}.{suffix}"


def pid_alive(pid):
    """True while pid exists and is not a zombie (PID 1 here may not reap)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def pid_gone(pid):
    return not Path(f"/proc/{pid}").exists()


def ppid_of(pid):
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def wait_for(predicate, timeout=TIMEOUT):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


class Channel:
    """The engine's end of one channel: creates both FIFOs and opens them the
    way the engine does (e2w O_RDWR, w2e O_RDONLY|O_NONBLOCK)."""

    def __init__(self, ipc, wid):
        self.wid = wid
        e2w, w2e = Path(ipc) / f"{wid}.e2w", Path(ipc) / f"{wid}.w2e"
        os.mkfifo(e2w)
        os.mkfifo(w2e)
        self.e2w = os.open(e2w, os.O_RDWR)
        self.w2e = os.open(w2e, os.O_RDONLY | os.O_NONBLOCK)

    def send(self, kind, payload=b"", **fields):
        fields.setdefault("worker_id", self.wid)
        assert os.write(self.e2w, encode(kind, payload, **fields)) == MSG_LEN

    def recv(self, timeout=TIMEOUT):
        """Next message, or None on end of file.  Raises TimeoutError."""
        buf = b""
        end = time.monotonic() + timeout
        while len(buf) < MSG_LEN:
            left = end - time.monotonic()
            if left <= 0 or not select.select([self.w2e], [], [], left)[0]:
                raise TimeoutError(f"no message on channel {self.wid} within {timeout}s")
            try:
                chunk = os.read(self.w2e, MSG_LEN - len(buf))
            except BlockingIOError:
                continue
            if not chunk:
                assert buf == b"", "end of file in the middle of a message"
                return None
            buf += chunk
        return Msg(buf)

    def close_e2w(self):
        if self.e2w is not None:
            os.close(self.e2w)
            self.e2w = None

    def close(self):
        self.close_e2w()
        if self.w2e is not None:
            os.close(self.w2e)
            self.w2e = None


def no_core_dumps():
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


class Engine:
    """A fake engine for one function: IPC directory, channel 0, launcher."""

    def __init__(self, tmp_path, handler=HANDLER, payload_max=None, spin_us=0, env_drop=()):
        self.ipc = tmp_path / "ipc" / FUNCTION
        (self.ipc / "shm").mkdir(parents=True)
        self.code = tmp_path / "code"
        self.code.mkdir()
        shutil.copy(handler, self.code / "handler.so")
        self.stderr_path = tmp_path / "stderr.txt"
        self.channels = {}
        self.ch0 = self.channel(0)
        env = dict(os.environ)
        env.update(STACCATO_FUNCTION=FUNCTION, STACCATO_IPC_DIR=str(self.ipc),
                   STACCATO_HANDLER="handler.so",  # relative: resolved in the code directory
                   STACCATO_SPIN_US=str(spin_us))
        if payload_max is not None:
            env["STACCATO_PAYLOAD_MAX"] = str(payload_max)
        for name in env_drop:
            env.pop(name, None)
        with open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen([HOST], cwd=self.code, env=env, stdin=subprocess.DEVNULL,
                                         stderr=err, start_new_session=True, preexec_fn=no_core_dumps)

    def channel(self, wid):
        self.channels[wid] = Channel(self.ipc, wid)
        return self.channels[wid]

    def stderr(self):
        return self.stderr_path.read_text(errors="replace")

    def handshake(self):
        hello = self.ch0.recv()
        assert hello is not None, "launcher closed channel 0: " + self.stderr()
        return hello

    def create_worker(self, wid):
        """CreateWorker → the worker's channel and its WorkerHello."""
        ch = self.channel(wid)
        self.ch0.send(CREATE_WORKER, worker_id=wid)
        hello = ch.recv()
        assert hello is not None, "worker closed its channel: " + self.stderr()
        return ch, hello

    def close(self):
        for ch in self.channels.values():
            ch.close()
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the launcher's group: it and its workers
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=TIMEOUT)


@pytest.fixture
def engine(tmp_path):
    eng = Engine(tmp_path)
    yield eng
    eng.close()


@pytest.fixture
def worker(engine):
    """A handshaken launcher with worker 1 ready: (engine, channel 1, hello)."""
    engine.handshake()
    ch, hello = engine.create_worker(1)
    return engine, ch, hello


def call(ch, payload=b"", call_id=GW | 1, **fields):
    ch.send(DISPATCH, payload, call_id=call_id, **fields)
    return ch.recv()


# ---- startup -----------------------------------------------------------------

def start_failing(tmp_path, **kw):
    eng = Engine(tmp_path, **kw)
    try:
        rc = eng.proc.wait(timeout=TIMEOUT)
        sent = select.select([eng.ch0.w2e], [], [], 0)[0]
        return rc, eng.stderr(), sent
    finally:
        eng.close()


def test_missing_handler_library_exits_before_channel_0(tmp_path):
    bogus = tmp_path / "bogus.so"
    bogus.write_bytes(b"not an ELF file")
    rc, err, sent = start_failing(tmp_path, handler=bogus)
    assert rc == 1
    assert "cannot load handler" in err
    assert not sent


def test_handler_without_symbol_exits_before_channel_0(tmp_path):
    rc, err, sent = start_failing(tmp_path, handler=NOSYM)
    assert rc == 1
    assert "does not export staccato_handle" in err
    assert not sent


def test_missing_environment_variable(tmp_path):
    rc, err, sent = start_failing(tmp_path, env_drop=("STACCATO_IPC_DIR",))
    assert rc == 1
    assert "STACCATO_IPC_DIR" in err
    assert not sent


# ---- handshakes --------------------------------------------------------------

def test_launcher_hello(engine):
    hello = engine.handshake()
    assert (hello.kind, hello.worker_id, hello.call_id, hello.flags) == (LAUNCHER_HELLO, 0, 0, 0)
    assert hello.aux == engine.proc.pid
    assert hello.send_ts_ns > 0


def test_worker_hello_comes_from_a_forked_child(worker):
    engine, _, hello = worker
    assert (hello.kind, hello.worker_id, hello.call_id) == (WORKER_HELLO, 1, 0)
    assert hello.aux != engine.proc.pid
    assert ppid_of(hello.aux) == engine.proc.pid


# ---- dispatch ----------------------------------------------------------------

@pytest.mark.parametrize("size", [0, 5, INLINE_MAX])
def test_echo_inline(worker, size):
    _, ch, _ = worker
    data = pattern(size)
    res = call(ch, data, call_id=GW | 7, deadline_us=1_790_000_000_000_000)
    assert (res.kind, res.flags, res.call_id, res.worker_id, res.error_kind) == (COMPLETION, 0, GW | 7, 1, 0)
    assert res.payload_len == size and res.inline == data
    assert res.send_ts_ns > 0


def test_echo_spinning(tmp_path):
    eng = Engine(tmp_path, spin_us=200)
    try:
        eng.handshake()
        ch, _ = eng.create_worker(1)
        for i in range(1, 20):
            res = call(ch, b"spin %d" % i, call_id=GW | i)
            assert (res.kind, res.call_id, res.inline) == (COMPLETION, GW | i, b"spin %d" % i)
    finally:
        eng.close()


def test_output_of_961_bytes_goes_to_shm(worker):
    engine, ch, _ = worker
    res = call(ch, b"!big:961", call_id=GW | 2)
    assert (res.kind, res.flags, res.payload_len, res.inline) == (COMPLETION, SHM, 961, b"")
    out = shm_file(engine.ipc, GW | 2, "o")
    assert out.read_bytes() == pattern(961)
    out.unlink()


def test_echo_1mib_through_shm_both_ways(worker):
    engine, ch, _ = worker
    data = os.urandom(1 << 20)
    cid = GW | 3
    inp = shm_file(engine.ipc, cid, "i")
    inp.write_bytes(data)
    res = call(ch, flags=SHM, payload_len=len(data), call_id=cid)
    assert (res.kind, res.flags, res.payload_len, res.call_id) == (COMPLETION, SHM, len(data), cid)
    assert not inp.exists(), "the worker must unlink the input file"
    out = shm_file(engine.ipc, cid, "o")
    assert out.read_bytes() == data
    out.unlink()
    assert list((engine.ipc / "shm").iterdir()) == []


def test_missing_input_file_is_an_internal_failure(worker):
    _, ch, _ = worker
    res = call(ch, flags=SHM, payload_len=5000, call_id=GW | 4)
    assert (res.kind, res.error_kind) == (FAILURE, 8)
    assert b"input file" in res.inline


def test_handler_error_message(worker):
    _, ch, _ = worker
    res = call(ch, b"!fail:boom", call_id=GW | 5)
    assert (res.kind, res.call_id, res.error_kind, res.inline) == (FAILURE, GW | 5, 3, b"boom")


def test_handler_error_default_message(worker):
    _, ch, _ = worker
    res = call(ch, b"!faildefault")
    assert (res.kind, res.error_kind) == (FAILURE, 3)
    assert b"returned 2" in res.inline


def test_output_above_payload_max(tmp_path):
    eng = Engine(tmp_path, payload_max=4096)
    try:
        eng.handshake()
        ch, _ = eng.create_worker(1)
        res = call(ch, b"!big:4097", call_id=GW | 1)
        assert (res.kind, res.error_kind) == (FAILURE, 10)  # output_too_large
        res = call(ch, b"!big:4096", call_id=GW | 2)  # exactly the maximum is fine
        assert (res.kind, res.flags, res.payload_len) == (COMPLETION, SHM, 4096)
        shm_file(eng.ipc, GW | 2, "o").unlink()
    finally:
        eng.close()


def test_context_accessors(worker):
    _, ch, _ = worker
    deadline = time.time_ns() // 1000 + 10_000_000
    res = call(ch, b"!info", call_id=(3 << 32) | 9, parent_call_id=GW | 1, deadline_us=deadline)
    m = re.fullmatch(rb"call=([0-9a-f]{16}) parent=([0-9a-f]{16}) deadline=(\d+) remaining=(\d+)", res.inline)
    assert m, res.inline
    assert int(m[1], 16) == (3 << 32) | 9 and int(m[2], 16) == GW | 1
    assert int(m[3]) == deadline and 0 < int(m[4]) <= 10_000_000
    res = call(ch, b"!info")
    assert res.inline.endswith(b"deadline=0 remaining=-1")


def test_the_trace_context_before_the_input(worker):
    engine, ch, _ = worker
    trace = bytes.fromhex("4bf92f3577b34da6a3ce929d0e0e4736" "00f067aa0ba902b7" "01") + b"rojo=1,congo=2"
    want = (b"id=4bf92f3577b34da6a3ce929d0e0e4736 parent=00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01 "
            b"state=rojo=1,congo=2 len=")
    inp = b"!trace" + b"x" * 10
    res = call(ch, trace + inp, name_len=len(trace))
    assert res.inline == want + b"16"
    # The input in shm: the context alone inline.
    big = b"!trace" + b"x" * 2000
    shm_file(engine.ipc, GW | 7, "i").write_bytes(big)
    res = call(ch, trace, call_id=GW | 7, flags=SHM, payload_len=len(big), name_len=len(trace))
    assert res.inline == want + b"2006"
    # Unsampled, no state; and none at all.
    res = call(ch, trace[:24] + b"\0" + inp, name_len=25)
    assert res.inline.endswith(b"-00 state= len=16"), res.inline
    assert call(ch, inp).inline == b"id= parent= state= len=16"


def test_cpu_time_when_asked(worker):
    _, ch, _ = worker
    assert not call(ch, b"!info").flags & CPU
    res = call(ch, b"!info", flags=CPU)
    assert res.kind == COMPLETION and res.flags & CPU and res.aux < 1_000_000, res
    res = call(ch, b"!fail:no", flags=CPU)
    assert res.kind == FAILURE and res.flags & CPU and res.aux < 1_000_000, res


def test_log_line(worker):
    engine, ch, _ = worker
    assert call(ch, b"!log:hello there", call_id=GW | 0xAB).inline == b"logged"
    assert wait_for(lambda: f"[{FUNCTION} {GW | 0xAB:016x}] hello there\n" in engine.stderr())


def test_invalid_message_is_skipped(worker):
    _, ch, _ = worker
    os.write(ch.e2w, bytes(MSG_LEN))  # kind 0
    assert call(ch, b"still here").inline == b"still here"


# ---- internal calls ------------------------------------------------------------

def test_internal_call_inline(worker):
    _, ch, _ = worker
    deadline = time.time_ns() // 1000 + 10_000_000
    ch.send(DISPATCH, b"!call:echo:ping", call_id=GW | 10, deadline_us=deadline)
    inv = ch.recv()
    assert (inv.kind, inv.flags, inv.worker_id) == (INVOKE, 0, 1)
    assert inv.call_id == (1 << 32) | 1, "call id = worker_id << 32 | seq, seq from 1"
    assert (inv.parent_call_id, inv.deadline_us) == (GW | 10, deadline)
    assert (inv.name_len, inv.payload_len, inv.inline) == (4, 8, b"echoping")
    ch.send(COMPLETION, b"pong", call_id=inv.call_id)
    res = ch.recv()
    assert (res.kind, res.call_id, res.inline) == (COMPLETION, GW | 10, b"kind=0;pong")


def test_internal_call_sequence_numbers(worker):
    _, ch, _ = worker
    ch.send(DISPATCH, b"!call2:nop", call_id=GW | 11)
    seen = []
    for _ in range(2):
        inv = ch.recv()
        assert (inv.kind, inv.inline, inv.payload_len) == (INVOKE, b"nop", 3)
        seen.append(inv.call_id)
        ch.send(COMPLETION, call_id=inv.call_id)
    assert seen == [(1 << 32) | 1, (1 << 32) | 2]
    assert ch.recv().inline == b"kind=0,0"


def test_internal_call_failure_and_stray_result(worker):
    _, ch, _ = worker
    ch.send(DISPATCH, b"!call:missing:x", call_id=GW | 12)
    inv = ch.recv()
    ch.send(COMPLETION, b"stale", call_id=inv.call_id + 100)  # not ours: dropped
    ch.send(FAILURE, b"no function 'missing'", call_id=inv.call_id, error_kind=1)
    res = ch.recv()
    assert (res.kind, res.inline) == (COMPLETION, b"kind=1;no function 'missing'")


def test_internal_call_through_shm(worker):
    engine, ch, _ = worker
    ch.send(DISPATCH, b"!callbig:echo:5000", call_id=GW | 13)
    inv = ch.recv()
    assert (inv.kind, inv.flags, inv.name_len, inv.payload_len) == (INVOKE, SHM, 4, 5000)
    assert inv.inline == b"echo"
    inp = shm_file(engine.ipc, inv.call_id, "i")
    assert inp.read_bytes() == pattern(5000)
    inp.unlink()
    out = shm_file(engine.ipc, inv.call_id, "o")
    result = os.urandom(6000)
    out.write_bytes(result)
    ch.send(COMPLETION, flags=SHM, payload_len=len(result), call_id=inv.call_id)
    res = ch.recv()
    assert (res.kind, res.flags, res.payload_len) == (COMPLETION, SHM, 7 + 6000)
    assert not out.exists(), "the worker must unlink the result file"
    final = shm_file(engine.ipc, GW | 13, "o")
    assert final.read_bytes() == b"kind=0;" + result
    final.unlink()


def test_internal_call_bad_name_is_not_sent(worker):
    _, ch, _ = worker
    res = call(ch, b"!call:" + b"f" * 65 + b":x", call_id=GW | 14)
    assert res.kind == COMPLETION, "no Invoke may be sent for a 65-byte name"
    assert res.inline.startswith(b"kind=7;")


def test_internal_call_with_64_byte_name(worker):
    _, ch, _ = worker
    ch.send(DISPATCH, b"!call:" + b"f" * 64 + b":x", call_id=GW | 15)
    inv = ch.recv()
    assert (inv.kind, inv.name_len, inv.inline) == (INVOKE, 64, b"f" * 64 + b"x")
    ch.send(COMPLETION, b"ok", call_id=inv.call_id)
    assert ch.recv().inline == b"kind=0;ok"


def test_internal_call_after_deadline_times_out_locally(worker):
    _, ch, _ = worker
    res = call(ch, b"!call:echo:x", deadline_us=1)  # long past
    assert (res.kind, res.inline[:7]) == (COMPLETION, b"kind=5;")


# ---- concurrent internal calls ---------------------------------------------------

def result_payload(engine, res):
    """The payload of a Completion/Failure from the worker, inline or from its shm file."""
    if not res.flags & SHM:
        return res.inline
    path = shm_file(engine.ipc, res.call_id, "o")
    data = path.read_bytes()
    path.unlink()
    assert len(data) == res.payload_len
    return data


def test_concurrent_calls_from_16_threads_answered_out_of_order(worker):
    engine, ch, _ = worker
    deadline = time.time_ns() // 1000 + 10_000_000
    ch.send(DISPATCH, b"!fanout:16:1:echo", call_id=GW | 30, deadline_us=deadline)
    # No reply goes out before all 16 Invokes are in: the 16 threads must
    # all be inside staccato_call at once.
    invokes = [ch.recv() for _ in range(16)]
    for inv in invokes:
        assert (inv.kind, inv.flags, inv.worker_id, inv.name_len) == (INVOKE, 0, 1, 4), inv
        assert (inv.parent_call_id, inv.deadline_us) == (GW | 30, deadline)
        assert inv.inline[:4] == b"echo"
    assert sorted(inv.call_id for inv in invokes) == [(1 << 32) | seq for seq in range(1, 17)], \
        "seq numbers must stay unique (1..16) under concurrency"
    by_input = {inv.inline[4:].decode(): inv for inv in invokes}
    assert sorted(by_input) == sorted(f"{i}.0" for i in range(16))

    big = pattern(2000)
    order = list(by_input.items())
    random.Random(30).shuffle(order)
    expected = {}
    for n, (inp, inv) in enumerate(order):
        i = int(inp.split(".")[0])
        if n == 8:  # a result nobody waits for, in the middle: dropped
            ch.send(COMPLETION, b"stale", call_id=(1 << 32) | 999)
        if i % 4 == 1:
            ch.send(FAILURE, b"no function %d" % i, call_id=inv.call_id, error_kind=1)
            expected[i] = b"kind=1;no function %d" % i
        elif i == 6:  # through shm
            shm_file(engine.ipc, inv.call_id, "o").write_bytes(big)
            ch.send(COMPLETION, flags=SHM, payload_len=len(big), call_id=inv.call_id)
            expected[i] = b"kind=0;" + big
        else:
            ch.send(COMPLETION, b"out " + inp.encode(), call_id=inv.call_id)
            expected[i] = b"kind=0;out " + inp.encode()
    res = ch.recv()
    assert (res.kind, res.call_id) == (COMPLETION, GW | 30), res
    want = b"".join(b"%d.0 " % i + expected[i] + b"\n" for i in range(16))
    assert result_payload(engine, res) == want
    assert not shm_file(engine.ipc, by_input["6.0"].call_id, "o").exists()

    # The channel is back to one caller: seq carries on, the reader role is free.
    ch.send(DISPATCH, b"!call2:nop", call_id=GW | 31)
    for seq in (17, 18):
        inv = ch.recv()
        assert (inv.kind, inv.call_id) == (INVOKE, (1 << 32) | seq)
        ch.send(COMPLETION, call_id=inv.call_id)
    assert ch.recv().inline == b"kind=0,0"
    assert "dropping result for unknown call 00000001000003e7" in engine.stderr()


@pytest.mark.parametrize("spin_us", [0, 200])
def test_concurrent_calls_stress(tmp_path, spin_us):
    """16 threads × 20 calls each, answered in random batches as they come:
    the reader role changes hands hundreds of times."""
    threads, rounds = 16, 20
    eng = Engine(tmp_path, spin_us=spin_us)
    try:
        eng.handshake()
        ch, _ = eng.create_worker(1)
        rng = random.Random(spin_us)
        ch.send(DISPATCH, b"!fanout:%d:%d:echo" % (threads, rounds), call_id=GW | 40)
        pending, seen, res = [], set(), None
        while res is None:
            try:
                msg = ch.recv(timeout=0.005 if pending else TIMEOUT)
            except TimeoutError:
                msg = None
            if msg is not None:
                if msg.kind == INVOKE:
                    assert msg.call_id not in seen, "duplicate call id"
                    seen.add(msg.call_id)
                    pending.append(msg)
                else:
                    res = msg
            if pending and (msg is None or rng.random() < 0.3):
                rng.shuffle(pending)
                k = rng.randint(1, len(pending))
                for inv in pending[:k]:
                    ch.send(COMPLETION, b"r" + inv.inline[4:], call_id=inv.call_id)
                del pending[:k]
        assert (res.kind, res.call_id) == (COMPLETION, GW | 40), res
        assert not pending
        assert seen == {(1 << 32) | seq for seq in range(1, threads * rounds + 1)}
        want = b"".join(b"%d.%d kind=0;r%d.%d\n" % (i, r, i, r) for i in range(threads) for r in range(rounds))
        assert result_payload(eng, res) == want
    finally:
        eng.close()


# ---- lifecycle -----------------------------------------------------------------

def test_segfault_closes_the_channel_and_is_reaped(worker):
    engine, ch, hello = worker
    ch.send(DISPATCH, b"!crash", call_id=GW | 20)
    assert ch.recv() is None, "w2e must reach end of file when the worker dies"
    assert wait_for(lambda: pid_gone(hello.aux)), "the launcher must reap the dead worker"
    ch2, hello2 = engine.create_worker(2)  # the launcher carries on
    assert hello2.worker_id == 2
    assert call(ch2, b"again").inline == b"again"


def test_stop_worker(worker):
    _, ch, hello = worker
    ch.send(STOP_WORKER)
    assert ch.recv() is None
    assert wait_for(lambda: pid_gone(hello.aux))


def test_worker_exits_on_e2w_eof(worker):
    _, ch, hello = worker
    ch.close_e2w()
    assert ch.recv() is None
    assert wait_for(lambda: pid_gone(hello.aux))


def test_closing_channel_0_ends_launcher_and_workers(worker):
    engine, ch, hello = worker
    _, hello2 = engine.create_worker(2)
    engine.ch0.close_e2w()
    assert engine.proc.wait(timeout=TIMEOUT) == 0
    assert ch.recv() is None
    assert engine.channels[2].recv() is None
    assert wait_for(lambda: not pid_alive(hello.aux) and not pid_alive(hello2.aux))
