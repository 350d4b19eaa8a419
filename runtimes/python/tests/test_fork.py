"""Fork mode (STACCATO_WORKER_MODE=fork): what is particular to workers
being processes. test_launcher.py runs the protocol tests in both modes.

No test asserts on timing: the machine may be small and busy.
"""
import os
import signal
import textwrap

import pytest

from fake_engine import Engine, parent_pid, process_gone, wait_until
from staccato import wire
from staccato.wire import Message

GATEWAY = 1 << 63

HANDLER = textwrap.dedent('''
    import asyncio, os, subprocess, sys, time

    def _wait_for(path):
        # Busy, on purpose: a worker sharing a loop with another could not
        # let that one run meanwhile.
        deadline = time.monotonic() + 10
        while not os.path.exists(path):
            if time.monotonic() > deadline:
                raise TimeoutError(path)

    async def handle(ctx, data):
        cmd, _, arg = data.partition(b" ")
        if cmd == b"pid":
            return str(os.getpid())
        if cmd == b"echo":
            return arg
        if cmd == b"sleep":
            await asyncio.sleep(float(arg))
            return b"woke"
        if cmd == b"log":
            ctx.logger.info("ctx.logger line from pid %d", os.getpid())
            print(f"stderr line from pid {os.getpid()}", file=sys.stderr)
            return b"logged"
        if cmd == b"subprocess":
            return subprocess.run([sys.executable, "-c", "print(6 * 7)"],
                                  capture_output=True, check=True).stdout.strip()
        if cmd == b"call":
            return b"got:" + await ctx.call("other", arg)
        return b"unknown " + cmd

    def meet(ctx, data):
        """A sync handler: marks its own file, then spins until the other's
        exists. Two calls finish only if they run at the same time."""
        mine, _, theirs = data.decode().partition(" ")
        open(mine, "w").close()
        _wait_for(theirs)
        return str(os.getpid())
''')

THREADED = textwrap.dedent('''
    import threading, time
    threading.Thread(target=time.sleep, args=(3600,), name="import-time-thread", daemon=True).start()

    def handle(ctx, data):
        return data
''')

_ids = iter(range(1, 1 << 30))


def gw_id():
    return GATEWAY | next(_ids)


def children_of(pid):
    """(child pid, state) of every process whose parent is ``pid``."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(fields[1]) == pid:
            out.append((int(name), fields[0]))
    return out


def open_fds(pid):
    """What each fd of process ``pid`` refers to (paths, pipe:[..], anon_inode:...)."""
    fd_dir = f"/proc/{pid}/fd"
    targets = []
    for fd in os.listdir(fd_dir):
        try:
            targets.append(os.readlink(f"{fd_dir}/{fd}"))
        except FileNotFoundError:
            pass
    return targets


@pytest.fixture(params=[True, False], ids=["uvloop", "asyncio"])
def engine(tmp_path, request):
    eng = Engine(tmp_path, source=HANDLER, worker_mode="fork", uvloop=request.param)
    try:
        eng.hello()
        yield eng
    finally:
        eng.close()


def call_ok(eng, chan, data):
    msg = eng.call(chan, data, gw_id())
    assert msg.kind == wire.COMPLETION, (msg, msg.inline)
    return eng.payload(msg, "o")


def test_each_worker_is_a_child_process(engine):
    workers = [engine.create_worker() for _ in range(3)]
    pids = {w.pid for w in workers}
    assert len(pids) == 3 and engine.proc.pid not in pids
    for w in workers:
        assert parent_pid(w.pid) == engine.proc.pid
        # The hello's pid is the process that runs the handler.
        assert call_ok(engine, w, b"pid") == str(w.pid).encode()


def test_worker_holds_no_other_channel(engine):
    a, b = engine.create_worker(), engine.create_worker()
    for w, other in ((a, b), (b, a)):
        fds = open_fds(w.pid)
        mine = {os.path.join(engine.ipc, f"{w.worker_id}.{s}") for s in ("e2w", "w2e")}
        fifos = {t for t in fds if t.startswith(engine.ipc)}
        # Above all not channel 0: the engine must see EOF on it when the
        # launcher dies, whatever the workers do.
        assert fifos == mine, fds
        assert not any("pidfd" in t for t in fds), fds


def test_killed_worker_leaves_launcher_and_others_serving(engine):
    a, b = engine.create_worker(), engine.create_worker()
    # What the engine does to a worker whose call timed out.
    engine.dispatch(a, b"sleep 60", gw_id())
    os.kill(a.pid, signal.SIGKILL)
    a.expect_eof()
    assert call_ok(engine, b, b"echo alive") == b"alive"
    assert engine.proc.poll() is None
    c = engine.create_worker()
    assert call_ok(engine, c, b"echo new") == b"new"
    # The launcher reaped it: gone, not a zombie.
    wait_until(lambda: not os.path.exists(f"/proc/{a.pid}"), "killed worker reaped")
    wait_until(lambda: "killed by SIGKILL" in engine.stderr, "kill logged")


def test_sigterm_ends_a_worker(engine):
    a, b = engine.create_worker(), engine.create_worker()
    os.kill(a.pid, signal.SIGTERM)
    a.expect_eof()
    wait_until(lambda: not os.path.exists(f"/proc/{a.pid}"), "terminated worker reaped")
    assert call_ok(engine, b, b"echo ok") == b"ok"


def test_stop_worker_ends_its_process(engine):
    w = engine.create_worker()
    w.send(Message(wire.STOP_WORKER, worker_id=w.worker_id))
    w.expect_eof()
    wait_until(lambda: not os.path.exists(f"/proc/{w.pid}"), "stopped worker reaped")
    assert "exited with status" not in engine.stderr


def test_eof_on_worker_channel_ends_its_process(engine):
    w = engine.create_worker()
    engine.dispatch(w, b"call x", gw_id())
    assert w.recv().kind == wire.INVOKE
    os.close(w.e2w)
    w.expect_eof()
    wait_until(lambda: not os.path.exists(f"/proc/{w.pid}"), "worker reaped")


def test_channel_0_eof_kills_the_workers(engine):
    idle, busy = engine.create_worker(), engine.create_worker()
    engine.dispatch(busy, b"sleep 60", gw_id())
    pids = [idle.pid, busy.pid]
    os.close(engine.chan0.e2w)
    assert engine.wait() == 0
    # Killed and reaped before the launcher exited: nothing left behind.
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    engine.chan0.expect_eof()
    idle.expect_eof()
    busy.expect_eof()


def test_killed_launcher_takes_its_workers_along(engine):
    a, b = engine.create_worker(), engine.create_worker()
    engine.proc.kill()
    engine.wait()
    # No worker holds channel 0 open, so the engine sees the death at once,
    engine.chan0.expect_eof()
    # and the workers die with the launcher (PR_SET_PDEATHSIG).
    a.expect_eof()
    b.expect_eof()
    for w in (a, b):
        wait_until(lambda: process_gone(w.pid), f"worker {w.worker_id} dead")


def test_no_zombies_after_churn(engine):
    for _ in range(3):
        workers = [engine.create_worker() for _ in range(3)]
        os.kill(workers[0].pid, signal.SIGKILL)
        workers[1].send(Message(wire.STOP_WORKER, worker_id=workers[1].worker_id))
        workers[0].expect_eof()
        workers[1].expect_eof()
    # A stopped worker closes its channel a moment before it exits: wait
    # for the exits to be reaped, then only the running ones are left.
    def settled():
        kids = children_of(engine.proc.pid)
        return len(kids) == 3 and all(state != "Z" for _, state in kids)
    wait_until(settled, "every exited worker reaped, the 3 running ones left")
    assert len(children_of(engine.proc.pid)) == 3  # the ones still running


def test_logging_from_a_worker_reaches_the_log(engine):
    w = engine.create_worker()
    assert call_ok(engine, w, b"log") == b"logged"
    wait_until(lambda: f"ctx.logger line from pid {w.pid}" in engine.stderr, "ctx.logger line")
    wait_until(lambda: f"stderr line from pid {w.pid}" in engine.stderr, "stderr line")


def test_handler_can_run_subprocesses(engine):
    w = engine.create_worker()
    assert call_ok(engine, w, b"subprocess") == b"42"


def test_workers_run_at_the_same_time(tmp_path):
    # Two sync handlers that each wait for the other: they can both finish
    # only in two processes (inline, the first would hold the only loop).
    eng = Engine(tmp_path, source=HANDLER, handler="handler:meet", worker_mode="fork")
    try:
        eng.hello()
        a, b = eng.create_worker(), eng.create_worker()
        fa, fb = str(tmp_path / "a"), str(tmp_path / "b")
        ca, cb = gw_id(), gw_id()
        eng.dispatch(a, f"{fa} {fb}".encode(), ca)
        eng.dispatch(b, f"{fb} {fa}".encode(), cb)
        ra, rb = a.recv(), b.recv()
        assert (ra.kind, rb.kind) == (wire.COMPLETION, wire.COMPLETION), (ra.inline, rb.inline)
        assert {ra.inline, rb.inline} == {str(a.pid).encode(), str(b.pid).encode()}
    finally:
        eng.close()


def test_threads_at_import_fall_back_to_inline(tmp_path):
    eng = Engine(tmp_path, source=THREADED, worker_mode="fork")
    try:
        eng.hello()
        w = eng.create_worker(forked=False)  # served by the launcher itself
        assert call_ok(eng, w, b"still works") == b"still works"
        wait_until(lambda: "import-time-thread" in eng.stderr and "inline" in eng.stderr,
                   "fallback warning")
    finally:
        eng.close()


def test_unknown_worker_mode_fails_at_startup(tmp_path):
    eng = Engine(tmp_path, source=HANDLER, worker_mode="threads")
    try:
        assert eng.wait() == 1
        assert "STACCATO_WORKER_MODE" in eng.stderr
    finally:
        eng.close()


def test_fork_mode_is_opt_in(tmp_path):
    eng = Engine(tmp_path, source=HANDLER)  # STACCATO_WORKER_MODE unset
    try:
        eng.hello()
        w = eng.create_worker(forked=False)
        assert call_ok(eng, w, b"pid") == str(eng.proc.pid).encode()
    finally:
        eng.close()
