"""A fake engine for tests and benchmarks: it plays the engine's side of
docs/protocol.md against a real launcher process over real FIFOs.

Standard library only (bench_spawn.py uses it outside pytest). Every wait has
a timeout, so a broken runtime fails instead of hanging.
"""
import os
import select
import subprocess
import sys
import time
from pathlib import Path

PYTHON_RUNTIME = Path(__file__).resolve().parent.parent
if str(PYTHON_RUNTIME) not in sys.path:
    sys.path.insert(0, str(PYTHON_RUNTIME))

from staccato import wire  # noqa: E402 (needs the path above)
from staccato.wire import Message, decode, encode  # noqa: E402

TIMEOUT = 10.0
# The interpreter that runs the launcher (to test other Python versions).
LAUNCHER_PYTHON = os.environ.get("STACCATO_TEST_PYTHON") or sys.executable


def parent_pid(pid):
    """The parent of process ``pid`` (from /proc), or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except FileNotFoundError:
        return None
    # comm (field 2) may contain spaces and parentheses: split after it.
    return int(stat.rpartition(")")[2].split()[1])


def process_gone(pid):
    """True when ``pid`` no longer exists or is a zombie (dead, not reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def wait_until(predicate, what, timeout=TIMEOUT):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout}s")
        time.sleep(0.005)


class Chan:
    """The engine's end of one channel: e2w O_RDWR, w2e O_RDONLY|O_NONBLOCK."""

    def __init__(self, ipc, worker_id):
        base = os.path.join(ipc, str(worker_id))
        for suffix in (".e2w", ".w2e"):
            os.mkfifo(base + suffix)
        self.worker_id = worker_id
        self.pid = None         # the worker's pid, from its hello
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

    def __init__(self, tmp_path, handler="handler:handle", payload_max=None, source="",
                 worker_mode=None, env=None, uvloop=True):
        self.tmp = tmp_path
        self.worker_mode = worker_mode or "inline"
        self.ipc = str(tmp_path / "ipc" / "fn")
        self.shm = os.path.join(self.ipc, "shm")
        os.makedirs(self.shm)
        code = tmp_path / "code"
        code.mkdir()
        (code / "handler.py").write_text(source)
        self.chan0 = Chan(self.ipc, 0)
        path = str(PYTHON_RUNTIME)
        if not uvloop:
            # A module that shadows uvloop and fails to import: the launcher
            # falls back to the standard asyncio loop.
            shadow = tmp_path / "no-uvloop"
            shadow.mkdir()
            (shadow / "uvloop.py").write_text("raise ImportError('uvloop hidden by the test')\n")
            path = f"{shadow}:{path}"
        env = dict(os.environ, STACCATO_FUNCTION="fn", STACCATO_IPC_DIR=self.ipc,
                   STACCATO_HANDLER=handler, PYTHONPATH=path, **(env or {}))
        env.pop("STACCATO_WORKER_MODE", None)
        if worker_mode is not None:
            env["STACCATO_WORKER_MODE"] = worker_mode
        if payload_max is not None:
            env["STACCATO_PAYLOAD_MAX"] = str(payload_max)
        self.stderr_path = tmp_path / "launcher.stderr"
        with open(self.stderr_path, "wb") as err:
            self.started_ns = time.perf_counter_ns()  # for bench_spawn.py
            self.proc = subprocess.Popen([LAUNCHER_PYTHON, "-u", "-m", "staccato.launcher"],
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

    def new_channel(self):
        """Makes the FIFOs of the next worker id, as the engine does before
        it sends CreateWorker."""
        chan = Chan(self.ipc, self.next_worker)
        self.next_worker += 1
        self.workers[chan.worker_id] = chan
        return chan

    def create_worker(self, forked=None):
        """Asks for a worker and waits for its hello. ``forked``: whether the
        worker must be a process of its own (default: as the mode says)."""
        if forked is None:
            forked = self.worker_mode == "fork"
        chan = self.new_channel()
        self.chan0.send(Message(wire.CREATE_WORKER, worker_id=chan.worker_id))
        msg = chan.recv()
        wid = chan.worker_id
        assert (msg.kind, msg.worker_id) == (wire.WORKER_HELLO, wid), msg
        if forked:
            assert msg.aux != self.proc.pid and parent_pid(msg.aux) == self.proc.pid
        else:
            assert msg.aux == self.proc.pid
        chan.pid = msg.aux
        return chan

    def dispatch(self, chan, data, call_id, parent=0, deadline_us=0, trace=b"", flags=0):
        """``trace``: the call's trace context bytes (its prefix), if any;
        ``flags``: more flags (CPU_TIME)."""
        n = len(trace)
        if n + len(data) <= wire.INLINE_MAX:
            chan.send(Message(wire.DISPATCH, flags, n + len(data), call_id, parent, chan.worker_id,
                              name_len=n, deadline_us=deadline_us, inline=trace + data))
        else:
            self.write_shm(call_id, "i", data)
            chan.send(Message(wire.DISPATCH, wire.PAYLOAD_IN_SHM | flags, len(data), call_id, parent,
                              chan.worker_id, name_len=n, deadline_us=deadline_us, inline=trace))

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
