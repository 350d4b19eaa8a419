"""Integration tests: the real `staccato` binary, real launchers and workers.

A session-scoped server (`staccato up` on a free loopback port) gets every
function of tests/functions deployed once; tests that need an isolated server
(restart, token, listen address) start their own. Standard library only.

Run: python3 -m pytest tests/test_integration.py -x -q
(needs target/release/staccato and runtimes/c/build/staccato-c-host).
"""
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest


from harness import (BIN, FUNCS, send_too_large, HEX16, PAYLOAD_MAX, REPO, Server, alive_pid, check_error, clean_env,
                     free_port, manifest_names, max_overlap, ok_body, own_server, request, shm_files, timing,
                     traces, wait_for)


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    with own_server(tmp_path_factory.mktemp("staccato")) as srv:
        srv.deploy(FUNCS)
        yield srv


@pytest.fixture(autouse=True)
def _log_tail_on_failure(request):
    """Prints the shared server's log tail when a test that used it failed."""
    failed_before = request.session.testsfailed
    yield
    if "server" in request.fixturenames and request.session.testsfailed > failed_before:
        srv = request.getfixturevalue("server")
        print(f"--- tail of {srv.log_path}\n{srv.log_tail()}")


# ---------------------------------------------------------------- 1. external calls


def test_external_calls_and_headers(server):
    r = server.invoke("echo", b"hello")
    assert ok_body(r) == b"hello"
    r2 = server.invoke("echo-c", b"hello")
    assert ok_body(r2) == b"c:hello"  # ECHO_PREFIX from the manifest's env reached the C function
    ids = set()
    for resp in (r, r2, server.invoke("echo", b""), server.invoke("nop-c", b"x")):
        assert resp.status == 200, resp
        cid = resp.headers.get("x-call-id", "")
        assert HEX16.fullmatch(cid), resp.headers
        assert int(cid, 16) >> 63 == 1, cid  # gateway call ids have bit 63 set
        ids.add(cid)
        t = timing(resp)
        assert t["exec_us"] < 5_000_000 and t["queue_us"] < 5_000_000, t
    assert len(ids) == 4, ids
    assert server.invoke("echo", b"").body == b""
    assert server.invoke("nop-c", b"x").body == b""
    # The CLI's invoke prints the output.
    p = server.cli("invoke", "echo-c", "--data", "via-cli")
    assert p.returncode == 0 and p.stdout == "c:via-cli", (p.stdout, p.stderr)


# ---------------------------------------------------------------- 2. internal calls


def test_internal_calls(server):
    r = server.invoke("relay", b"through relay")
    assert ok_body(r) == b"through relay"
    relay_id = r.headers["x-call-id"]
    # The engine recorded echo's call as a child of relay's.
    echo_calls = [t for t in traces(server, "echo") if t["parent_call_id"] == relay_id]
    assert len(echo_calls) == 1 and echo_calls[0]["outcome"] == "ok", echo_calls

    # C calls Python.
    assert ok_body(server.invoke("call-c", b"echo:x")) == b"x"
    assert ok_body(server.invoke("call-c", b"echo-c:y")) == b"c:y"  # C calls C

    # C calls a function that does not exist: the callee error comes back as kind 1 (not_found).
    r = server.invoke("call-c", b"no-such-function:x")
    err = check_error(r, 500, "function_error", in_message="(kind 1)")
    assert "no function named" in err["message"], err


# ---------------------------------------------------------------- 3. nested chain


def test_nested_chain(server):
    r = server.invoke("chain-a", b"x")
    assert ok_body(r) == b"a(b(c(x)))"
    a_id = r.headers["x-call-id"]
    b = [t for t in traces(server, "chain-b") if t["parent_call_id"] == a_id]
    assert len(b) == 1, b
    c = [t for t in traces(server, "chain-c") if t["parent_call_id"] == b[0]["call_id"]]
    assert len(c) == 1, c


# ---------------------------------------------------------------- 4. fan-out


def test_fanout_eight_concurrent_internal_calls(server):
    r = server.invoke("fanout", b"8")
    assert json.loads(ok_body(r)) == [f"part-{i}" for i in range(8)]
    children = [t for t in traces(server, "echo") if t["parent_call_id"] == r.headers["x-call-id"]]
    assert len(children) == 8 and all(t["outcome"] == "ok" for t in children), children
    assert len({t["call_id"] for t in children}) == 8


# ---------------------------------------------------------------- 5. shared-memory payloads


def test_one_mib_payloads_through_shared_memory(server):
    data = os.urandom(1 << 20)
    assert ok_body(server.invoke("echo", data, timeout=20)) == data
    assert ok_body(server.invoke("echo-c", data, timeout=20)) == b"c:" + data
    assert ok_body(server.invoke("relay", data, timeout=20)) == data  # Python → Python internal call
    assert ok_body(server.invoke("call-c", b"echo:" + data, timeout=20)) == data  # C → Python internal call
    # Exactly the limit still passes.
    big = os.urandom(PAYLOAD_MAX)
    assert ok_body(server.invoke("echo", big, timeout=30)) == big
    left = wait_for(lambda: not shm_files(server), timeout=2.0) or shm_files(server)
    assert left is True, f"payload files left behind: {left}"


# ---------------------------------------------------------------- 6. concurrency limiting


def test_tau_bounds_running_invocations(server):
    fn = "tau-c"  # slow.c; min 1, max 8; no other test calls it
    # Warm-up: one 200 ms call a second. The first interval initialises λ
    # (≈ 1/s) and the first call t (≈ 0.2 s); alpha = 1e-3 keeps them there,
    # so τ = ceil(λ·t) = ceil(0.2) = 1.
    t0 = time.monotonic()
    for i in range(4):
        time.sleep(max(0.0, t0 + 1.0 * i - time.monotonic()))
        assert ok_body(server.invoke(fn, b"200"))
    s = server.sched(fn)
    assert s["tau"] == 1, s
    assert 0.6 < s["rate_per_s"] < 1.6, s
    assert 150 < s["processing_ms"] < 450, s

    # A (500 ms) and, 100 ms later, B (200 ms): τ = 1, so B waits for A even
    # though max_workers would allow another worker (A running longer than
    # t would count as t only past 1/λ ≈ 1 s).
    with ThreadPoolExecutor(2) as ex:
        fa = ex.submit(server.invoke, fn, b"500")
        time.sleep(0.1)
        pre = server.sched(fn)
        fb = ex.submit(server.invoke, fn, b"200")
        time.sleep(0.2)
        mid = server.sched(fn)
        ra, rb = fa.result(15), fb.result(15)
    a, b = json.loads(ok_body(ra)), json.loads(ok_body(rb))
    assert mid["tau"] == 1 and mid["running"] == 1 and mid["queued"] == 1, mid
    # The pool was not grown for B (A may have had a worker started for its
    # I/O thread: ARCHITECTURE.md, "Placement and spinning").
    assert mid["pool"] + mid["starting"] == pre["pool"] + pre["starting"], (pre, mid)
    assert b["start_us"] >= a["end_us"], (a, b)
    assert timing(rb)["queue_us"] >= 250_000, rb.headers  # ≈ 400 ms expected
    assert timing(ra)["queue_us"] < 100_000, ra.headers
    assert server.sched(fn)["running_max"] == 1

    # C (4 s) and, 100 ms later, D: once C has run ~1/λ, λ·(C's time so
    # far) passes 1 and τ grows: D starts long before C ends, not after it.
    with ThreadPoolExecutor(2) as ex:
        fc = ex.submit(server.invoke, fn, b"4000")
        time.sleep(0.1)
        fd = ex.submit(server.invoke, fn, b"100")
        rc, rd = fc.result(15), fd.result(15)
    c, d = json.loads(ok_body(rc)), json.loads(ok_body(rd))
    assert d["start_us"] < c["end_us"] - 1_500_000, (c, d)
    assert 500_000 <= timing(rd)["queue_us"] <= 3_000_000, rd.headers  # ≈ 0.9 s expected
    assert server.sched(fn)["running_max"] == 2


def test_running_max_never_exceeds_max_workers(server):
    max_workers = server.function("slow")["max_workers"]
    assert max_workers == 8
    with ThreadPoolExecutor(12) as ex:
        rs = [f.result(30) for f in [ex.submit(server.invoke, "slow", b"300", None, 20) for _ in range(12)]]
    outs = [json.loads(ok_body(r)) for r in rs]
    s = server.sched("slow")
    assert 2 <= s["running_max"] <= max_workers, s  # it did run in parallel, within the bound
    assert all(o["running_max"] <= max_workers for o in outs), outs  # the function's own count agrees
    assert s["pool"] <= max_workers and s["running"] == 0 and s["queued"] == 0, s


# ---------------------------------------------------------------- 7. pool growth and shrink


def test_pool_grows_under_burst_and_shrinks_when_idle(server):
    fn = "slow-c"
    with ThreadPoolExecutor(16) as ex:
        futs = [ex.submit(server.invoke, fn, b"300", None, 30) for _ in range(16)]
        time.sleep(0.8)
        during = server.sched(fn)
        rs = [f.result(30) for f in futs]
    outs = [json.loads(ok_body(r)) for r in rs]
    pids = {o["pid"] for o in outs}
    assert len(pids) > 1, outs
    assert during["pool"] > 1 and during["pool"] <= 8, during
    concurrent = max_overlap([(o["start_us"], o["end_us"]) for o in outs])
    assert 2 <= concurrent <= 8, concurrent
    s = server.sched(fn)
    assert s["running_max"] <= 8, s

    # Idle: λ decays to 1/silence, τ to 1, the pool to max(2τ, min_workers) = 2.
    s = wait_for(lambda: (lambda x: x if x["pool"] <= 2 else None)(server.sched(fn)), timeout=3.0)
    assert s, f"pool did not shrink within 3 s: {server.sched(fn)}"
    c = server.container(fn)
    live = wait_for(lambda: (lambda n: n if len(n) <= 2 else None)([p for p in pids if alive_pid(p, c)]), timeout=2.0)
    assert live is not None, f"stopped workers still running: {[p for p in pids if alive_pid(p, c)]}"
    assert ok_body(server.invoke(fn, b"1"))


def test_burst_is_served_by_a_grown_pool(server, tmp_path):
    # A fresh copy of slow.c, so no earlier call shaped its averages.
    server.deploy(_write(tmp_path / "staccato.yml", f"functions:\n  burst-c:\n    runtime: c\n    source: {FUNCS / 'c'}\n"
                                                    "    handler: slow.c\n    max_workers: 8\n    timeout: 20s\n"))
    with ThreadPoolExecutor(16) as ex:
        rs = [f.result(30) for f in [ex.submit(server.invoke, "burst-c", b"300", None, 25) for _ in range(16)]]
    outs = [json.loads(ok_body(r)) for r in rs]
    concurrent = max_overlap([(o["start_us"], o["end_us"]) for o in outs])
    # 16 calls arrive within milliseconds and take 300 ms: λ·t ≫ 8, so up to 8 should run at once.
    assert concurrent >= 6, (concurrent, server.sched("burst-c"))
    # Before any call has finished there is no processing time, and τ = λ·t
    # was 0 (held at 1): the first call ran alone and the burst took twice
    # as long. Now τ is max_workers until then: the first call has company.
    first = min(outs, key=lambda o: o["start_us"])
    with_first = sum(1 for o in outs if o["start_us"] < first["end_us"])
    assert with_first >= 6, (with_first, outs)


# ---------------------------------------------------------------- 8. every error


def test_error_unknown_function(server):
    check_error(server.invoke("no-such-function", b"x"), 404, "not_found", in_message="no-such-function")


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_error_payload_too_large(server, chunked):
    check_error(send_too_large(server.port, "/function/echo", chunked), 413, "payload_too_large", in_message=str(PAYLOAD_MAX))
    assert ok_body(server.invoke("echo", b"still fine")) == b"still fine"


def test_error_function_raises(server):
    r = server.invoke("fail", b"oops")
    check_error(r, 500, "function_error", in_message="ValueError: bad input: oops")


def test_error_worker_crash(server):
    before = server.sched("crash-c")
    assert before["pool"] == 2, before
    with ThreadPoolExecutor(3) as ex:
        fc = ex.submit(server.invoke, "crash-c", b"crash")
        fe = [ex.submit(server.invoke, "echo", b"during crash %d" % i) for i in range(2)]
        crash = fc.result(15)
        echoes = [f.result(15) for f in fe]
    err = check_error(crash, 502, "worker_crashed", in_message="exited while running the call")
    dead_pid = int(re.search(r"\(pid (\d+)\)", err["message"])[1])
    assert [ok_body(r) for r in echoes] == [b"during crash 0", b"during crash 1"]
    # crash-c keeps answering, never from the dead worker, and gets back to 2 workers.
    pids = {int(ok_body(server.invoke("crash-c", b"hi")).split(b"=")[1]) for _ in range(6)}
    assert dead_pid not in pids and not alive_pid(dead_pid, server.container("crash-c")), (dead_pid, pids)
    s = wait_for(lambda: (lambda x: x if x["pool"] == 2 else None)(server.sched("crash-c")), timeout=3.0)
    assert s, server.sched("crash-c")
    assert server.function("crash-c")["status"]["failed"] >= 1
    assert ok_body(server.invoke("echo-c", b"z")) == b"c:z"
    # Seen from a caller: the crash arrives as the callee's error kind 4.
    err = check_error(server.invoke("call-c", b"crash-c:crash"), 500, "function_error", in_message="(kind 4)")
    assert "exited while running" in err["message"], err


def clock_runs(pid):
    """How many times the engine's clock thread has been run by the kernel
    (`/proc/PID/task/TID/schedstat`, third field)."""
    for t in Path(f"/proc/{pid}/task").iterdir():
        if (t / "comm").read_text().strip() == "engine-clock":
            return int((t / "schedstat").read_text().split()[2])
    raise AssertionError("no engine-clock thread")


def test_the_clock_sleeps_until_the_next_deadline_and_a_call_due_sooner_wakes_it(server):
    """The clock thread sleeps until the earliest deadline of the calls in
    flight, the next housekeeping (every 100 ms) or connection check:
    idle, or busy with calls of ordinary timeouts, it runs ~12 times a
    second (it used to scan for deadlines every 2 ms, ~480 times). A call
    due before its wake-up wakes it: a 20 ms timeout fires on time, where a
    clock left asleep until its next housekeeping would fire it up to 100
    ms late. And six such timeouts in a row, each killing the Python worker
    (its launcher) well within a second of its start, are each that call's
    end, not a crash loop: they were counted as one, and the fourth call
    was refused with "keeps exiting right after it starts"."""
    pid = server.proc.pid
    before = clock_runs(pid)
    time.sleep(0.5)
    idle_runs = clock_runs(pid) - before
    assert idle_runs < 50, f"the clock ran {idle_runs} times in half an idle second"

    stop, calls = threading.Event(), []

    def load():
        while not stop.is_set():
            assert ok_body(server.invoke("echo", b"x")) == b"x"
            calls.append(1)

    with ThreadPoolExecutor(1) as ex:
        f = ex.submit(load)
        time.sleep(0.3)
        before, n = clock_runs(pid), len(calls)
        time.sleep(0.5)
        runs, n = clock_runs(pid) - before, len(calls) - n
        stop.set()
        f.result(10)
    assert n >= 50, f"only {n} calls in half a second"
    assert runs < 50, f"the clock ran {runs} times in half a second of {n} calls"

    def hang_ready():
        r = server.get("/system/functions/hang")
        return r.status == 200 and r.json()["status"]["launcher"] == "ready"

    rng = random.Random(14)
    late = []
    for attempt in range(6):
        # At a random phase of the clock's 100 ms housekeeping.
        time.sleep(0.15 + rng.uniform(0, 0.1))
        wait_for(hang_ready, 10, interval=0.01)
        r = server.invoke("hang", b"", {"X-Staccato-Timeout-Ms": "20"}, 10)
        check_error(r, 504, "timeout", in_message="did not finish within 20 ms")
        # From its receipt to its timeout, as the engine saw it.
        t = timing(r)
        late.append(t["queue_us"] + t["exec_us"] - 20_000)
        assert late[-1] >= -1_000, r.headers
    # A clock not woken would be 0-100 ms late each time, at random, so all
    # six within 15 ms by chance about once in 10^5; woken, it fires on
    # time (give or take this machine's stalls).
    assert max(late) < 15_000, f"timeouts fired {late} µs late"


def test_error_timeout_recycles_worker(server):
    def worker_of(r):
        err = check_error(r, 504, "timeout", in_message="did not finish within 500 ms")
        return int(re.search(r"worker (\d+) was recycled", err["message"])[1])

    with ThreadPoolExecutor(2) as ex:
        t = time.monotonic()
        fh = ex.submit(server.invoke, "hang", b"", None, 10)
        fe = ex.submit(server.invoke, "echo", b"while hanging")
        assert ok_body(fe.result(10)) == b"while hanging"
        first = fh.result(10)
        elapsed = time.monotonic() - t
    w1 = worker_of(first)
    assert 0.45 <= elapsed < 3.0, elapsed
    assert ok_body(server.invoke("echo", b"after")) == b"after"
    w2 = worker_of(server.invoke("hang", b"", timeout=10))
    assert w2 != w1, (w1, w2)
    assert ok_body(server.invoke("echo", b"after 2")) == b"after 2"

    # The x-staccato-timeout-ms request header shortens the function's own timeout.
    t = time.monotonic()
    r = server.invoke("slow-c", b"3000", headers={"X-Staccato-Timeout-Ms": "200"})
    elapsed = time.monotonic() - t
    check_error(r, 504, "timeout", in_message="within 200 ms")
    assert elapsed < 2.0, elapsed
    assert ok_body(server.invoke("slow-c", b"1"))


def test_engine_unreachable_gives_503(tmp_path):
    """`staccato gateway` in front of a separate `staccato engine`, which dies and comes back."""
    eport = free_port()
    ipc = Path(f"/dev/shm/staccato-test-{eport}")
    engine_argv = [str(BIN), "engine", "--engine-listen", f"127.0.0.1:{eport}", "--state-dir",
                   str(tmp_path / "engine-state"), "--ipc-dir", str(ipc)]
    engine_log = tmp_path / "engine.log"

    def start_engine():
        with open(engine_log, "ab") as log:
            proc = subprocess.Popen(engine_argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=clean_env(), cwd=REPO)
        return proc

    def stop(proc):
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)

    manifest = _write(tmp_path / "m" / "staccato.yml",
                      f"functions:\n  echo:\n    runtime: python\n    source: {FUNCS / 'py'}\n    handler: echo:handle\n")
    engine = start_engine()
    try:
        gport = free_port()
        # An engine on loopback writes its link secret for the gateway to read.
        token_file = tmp_path / "engine-state" / "engine-token"
        assert wait_for(token_file.is_file, timeout=10), engine_log.read_text()
        gw_argv = [str(BIN), "gateway", "--listen", f"127.0.0.1:{gport}", "--engine", f"127.0.0.1:{eport}",
                   "--state-dir", str(tmp_path / "gateway-state"), "--engine-token-file", str(token_file)]
        with own_server(tmp_path / "gw", port=gport, argv=gw_argv, state_dir=tmp_path / "gateway-state") as gw:  # waits for /healthz 200: engine linked
            gw.deploy(manifest)
            assert ok_body(gw.invoke("echo", b"before")) == b"before"

            stop(engine)
            health = wait_for(lambda: (lambda r: r if r.status == 503 else None)(gw.get("/healthz")), timeout=5)
            assert health and health.json() == {"status": "degraded", "engine": "down"}, gw.get("/healthz")
            check_error(gw.invoke("echo", b"during"), 503, "engine_unavailable")
            assert gw.alive()

            # The engine comes back empty; the gateway reconnects and re-registers what it stored.
            engine = start_engine()
            r = wait_for(lambda: (lambda x: x if x.status == 200 else None)(gw.invoke("echo", b"after")), timeout=10)
            assert r and r.body == b"after", (gw.invoke("echo", b"after"), engine_log.read_text()[-2000:])
    finally:
        stop(engine)
        shutil.rmtree(ipc, ignore_errors=True)


# ---------------------------------------------------------------- 9. bad deployments


def _write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_invalid_manifests_rejected_with_line(server, tmp_path):
    py = FUNCS / "py"
    bad_workers = _write(tmp_path / "w" / "staccato.yml", (
        "version: 1\n"                       # 1
        "functions:\n"                       # 2
        "  zz-fine:\n"                       # 3
        "    runtime: python\n"              # 4
        f"    source: {py}\n"                # 5
        "    handler: echo:handle\n"         # 6
        "  bad-workers:\n"                   # 7
        "    runtime: python\n"              # 8
        f"    source: {py}\n"                # 9
        "    handler: echo:handle\n"         # 10
        "    min_workers: 5\n"               # 11
        "    max_workers: 2\n"))             # 12
    p = server.cli("deploy", bad_workers)
    assert p.returncode != 0, p
    assert "line 7" in p.stderr and "min_workers" in p.stderr, p.stderr

    bad_runtime = _write(tmp_path / "r" / "staccato.yml", (
        "functions:\n"                       # 1
        "  bad-runtime:\n"                   # 2
        "    source: .\n"                    # 3
        "    runtime: ruby\n"))              # 4
    p = server.cli("deploy", bad_runtime)
    assert p.returncode != 0, p
    assert "line 4" in p.stderr and "ruby" in p.stderr, p.stderr
    for name in ("zz-fine", "bad-workers", "bad-runtime"):
        assert server.get(f"/system/functions/{name}").status == 404


def test_broken_code_rejected_at_deploy(server, tmp_path):
    d = tmp_path / "broken"
    _write(d / "broken.c", "#include <staccato.h>\n"
           "int staccato_handle(staccato_ctx *ctx, const uint8_t *in, size_t n) {\n"
           "    return undeclared_thing_xyz;\n}\n")
    _write(d / "badsyntax.py", "def handle(ctx, data)\n    return data\n")
    _write(d / "c.yml", "functions:\n  broken-c:\n    runtime: c\n    handler: broken.c\n")
    _write(d / "py.yml", "functions:\n  broken-py:\n    runtime: python\n    handler: badsyntax:handle\n")

    p = server.cli("deploy", d / "c.yml")
    assert p.returncode != 0, p
    assert "broken.c" in p.stderr and "undeclared_thing_xyz" in p.stderr, p.stderr

    p = server.cli("deploy", d / "py.yml")
    assert p.returncode != 0, p
    assert "SyntaxError" in p.stderr and "badsyntax" in p.stderr, p.stderr

    for name in ("broken-c", "broken-py"):
        assert server.get(f"/system/functions/{name}").status == 404
        check_error(server.invoke(name, b"x"), 404, "not_found")
    # Nothing crashed.
    assert server.alive()
    assert server.get("/healthz").json() == {"status": "ok", "engine": "up"}
    assert ok_body(server.invoke("echo", b"alive")) == b"alive"


# A C function whose workers each take 300 ms to start: the launcher forks
# a worker, and a fork handler it registered runs in the child before the
# worker says hello.
SLOW_FORK_C = """#include <pthread.h>
#include <staccato.h>
#include <unistd.h>

static void slow_child(void) { usleep(300000); }

__attribute__((constructor)) static void setup(void) { pthread_atfork(NULL, NULL, slow_child); }

int staccato_handle(staccato_ctx *ctx, const uint8_t *input, size_t input_len) {
    staccato_set_output(ctx, input, input_len);
    return 0;
}
"""


def test_a_deploy_returns_with_its_first_worker_ready(server, tmp_path):
    """A deploy is installed once its launcher and its first worker said
    hello, so a redeploy leaves no gap (the old version takes the calls
    until then) and a deploy that returns serves at once. Installed at the
    launcher's hello, this slow worker was still starting when the deploy
    returned."""
    _write(tmp_path / "src" / "slow_fork.c", SLOW_FORK_C)
    manifest = _write(tmp_path / "staccato.yml", f"functions:\n  slow-worker:\n    runtime: c\n"
                                                 f"    source: {tmp_path / 'src'}\n    handler: slow_fork.c\n"
                                                 "    min_workers: 1\n")
    for _ in ("deploy", "redeploy"):
        server.deploy(manifest)
        s = server.sched("slow-worker")
        assert s["pool"] >= 1 and s["starting"] == 0, s
        # The start was as slow as meant (else this proves nothing).
        assert s["worker_ready_us"] and s["worker_ready_us"][0] >= 300_000, s
    assert ok_body(server.invoke("slow-worker", b"served")) == b"served"


# ---------------------------------------------------------------- 10. restart


def _manifest(dirpath, names):
    """A manifest of Python functions answering b"<name>:" + input."""
    for n in names:
        mod = n.replace("-", "_")
        _write(dirpath / f"{mod}.py", f"def handle(ctx, data):\n    return b'{n}:' + data\n")
    body = "".join(f"  {n}:\n    runtime: python\n    handler: {n.replace('-', '_')}:handle\n" for n in names)
    return _write(dirpath / "staccato.yml", "version: 1\nfunctions:\n" + body)


def test_restart_keeps_functions(tmp_path):
    src, state = tmp_path / "src", tmp_path / "state"
    manifest = _manifest(src, ["keeper", "persist"])

    with own_server(tmp_path / "run1", state_dir=state) as srv:
        srv.deploy(manifest)
        assert ok_body(srv.invoke("persist", b"1")) == b"persist:1"
        srv.stop()
    shutil.rmtree(src)  # the deployed code must not depend on the user's copy

    with own_server(tmp_path / "run2", state_dir=state) as srv:
        # Functions are restored in the background after start-up (see
        # test_restart_serves_deployed_functions_once_healthy): wait for them.
        r = wait_for(lambda: (lambda x: x if x.status == 200 else None)(srv.invoke("persist", b"2")), timeout=10)
        assert r and r.body == b"persist:2", srv.invoke("persist", b"2")
        p = srv.cli("rm", "persist")
        assert p.returncode == 0 and "Removed persist" in p.stdout, (p.stdout, p.stderr)
        check_error(srv.invoke("persist", b"3"), 404, "not_found")
        srv.stop(signal.SIGKILL)

    with own_server(tmp_path / "run3", state_dir=state) as srv:
        r = wait_for(lambda: (lambda x: x if x.status == 200 else None)(srv.invoke("keeper", b"4")), timeout=10)
        assert r and r.body == b"keeper:4", srv.invoke("keeper", b"4")
        check_error(srv.invoke("persist", b"5"), 404, "not_found")
        names = [f["name"] for f in srv.get("/system/functions").json()]
        assert names == ["keeper"], names


def test_restart_serves_deployed_functions_once_healthy(tmp_path):
    names = ["ra", "rb", "rc", "rd"]
    state = tmp_path / "state"
    with own_server(tmp_path / "run1", state_dir=state) as srv:
        srv.deploy(_manifest(tmp_path / "src", names))
        srv.stop()
    with own_server(tmp_path / "run2", state_dir=state) as srv:
        # own_server returned as soon as /healthz said ok.
        r = srv.invoke("rd", b"now")
        assert r.status == 200 and r.body == b"rd:now", r


def test_failed_redeploy_keeps_function_across_restart(tmp_path):
    good, bad = tmp_path / "good", tmp_path / "bad"
    good.mkdir()
    shutil.copy(FUNCS / "c" / "echo.c", good / "kc.c")
    _write(bad / "kc.c", "int staccato_handle(void) { return no_such_thing; }\n")
    for d in (good, bad):
        _write(d / "staccato.yml", "functions:\n  kc:\n    runtime: c\n    handler: kc.c\n")
    state = tmp_path / "state"
    with own_server(tmp_path / "run1", state_dir=state) as srv:
        srv.deploy(good)
        p = srv.cli("deploy", bad)
        assert p.returncode != 0 and "no_such_thing" in p.stderr, p.stderr
        assert ok_body(srv.invoke("kc", b"still")) == b"still"  # the deployed version keeps running
        srv.stop()
    with own_server(tmp_path / "run2", state_dir=state) as srv:
        r = wait_for(lambda: (lambda x: x if x.status == 200 else None)(srv.invoke("kc", b"again")), timeout=5)
        assert r and r.body == b"again", srv.invoke("kc", b"again")


# ---------------------------------------------------------------- 11. management API


def test_management_api(server):
    p = server.cli("ls", "--json")
    assert p.returncode == 0, p.stderr
    listed = {f["name"]: f for f in json.loads(p.stdout)}
    expected = manifest_names(FUNCS / "staccato.yml")
    assert len(expected) >= 14
    assert set(expected) <= set(listed), set(expected) - set(listed)
    assert listed["crash-c"]["min_workers"] == 2 and listed["crash-c"]["max_workers"] == 2
    assert listed["hang"]["timeout_ms"] == 500 and listed["echo-c"]["env"] == {"ECHO_PREFIX": "c:"}
    assert listed["echo"]["runtime"] == "python" and listed["echo-c"]["runtime"] == "c"
    assert listed["echo"]["status"]["launcher"] == "ready"

    r = request(server.port, "DELETE", "/system/functions/no-such-function", headers=server.auth())
    check_error(r, 404, "not_found", call_id=False)
    check_error(server.get("/system/functions/no-such-function"), 404, "not_found", call_id=False)
    p = server.cli("rm", "no-such-function")
    assert p.returncode != 0 and "not_found" in p.stderr, (p.stdout, p.stderr)


def test_cli_ignores_proxies_and_checks_names_before_sending(server):
    # The token must reach the gateway named and no proxy: with one set
    # (pointing nowhere), the CLI still talks to the loopback gateway.
    nowhere = "http://127.0.0.1:9"
    p = server.cli("invoke", "echo-c", "--data", "direct",
                   extra_env={"HTTP_PROXY": nowhere, "ALL_PROXY": nowhere, "http_proxy": nowhere})
    assert p.returncode == 0 and p.stdout.strip() == "c:direct", (p.stdout, p.stderr)
    # A name no function can have is refused as such, not as an unreachable gateway.
    for bad in ["my fn", "../system/functions", "x/y"]:
        p = server.cli("invoke", bad, "--data", "x")
        assert p.returncode != 0 and "invalid function name" in p.stderr, (bad, p.stdout, p.stderr)
        assert "cannot reach" not in p.stderr, p.stderr


def test_token_guards_management_api(tmp_path):
    manifest = _write(tmp_path / "m" / "staccato.yml",
                      f"functions:\n  echo:\n    runtime: python\n    source: {FUNCS / 'py'}\n    handler: echo:handle\n")
    with own_server(tmp_path / "srv", token="s3cret") as srv:
        check_error(request(srv.port, "GET", "/system/functions"), 401, "unauthorized", call_id=False)
        check_error(request(srv.port, "GET", "/system/functions", headers={"Authorization": "Bearer wrong"}), 401,
                    "unauthorized", call_id=False)
        r = request(srv.port, "GET", "/system/functions", headers={"Authorization": "Bearer s3cret"})
        assert r.status == 200 and r.json() == [], r
        p = srv.cli("deploy", manifest, token="wrong")
        assert p.returncode != 0 and "401" in p.stderr, (p.stdout, p.stderr)
        srv.deploy(manifest, token="s3cret")
        # Function calls, health and metrics need no token.
        assert ok_body(srv.invoke("echo", b"open")) == b"open"
        assert request(srv.port, "GET", "/healthz").status == 200
        assert request(srv.port, "GET", "/metrics").status == 200


def test_refuses_non_loopback_without_token(tmp_path):
    port = free_port()
    ipc = Path(f"/dev/shm/staccato-test-{port}")
    try:
        p = subprocess.run([str(BIN), "up", "--listen", f"0.0.0.0:{port}", "--state-dir", str(tmp_path / "state"),
                            "--ipc-dir", str(ipc)], capture_output=True, text=True, timeout=30, env=clean_env())
    finally:
        shutil.rmtree(ipc, ignore_errors=True)
    assert p.returncode != 0, (p.stdout, p.stderr)
    assert "refusing to listen on 0.0.0.0" in p.stderr and "token" in p.stderr, p.stderr


# ---------------------------------------------------------------- 12. metrics


METRIC_LINE = re.compile(r'^(\w+)\{([^}]*)\} (\S+)$')


def _metrics(srv):
    r = request(srv.port, "GET", "/metrics")
    assert r.status == 200 and r.headers["content-type"].startswith("text/plain"), r
    text = r.body.decode()
    out = {}
    for line in text.splitlines():
        m = METRIC_LINE.match(line)
        if m:
            labels = tuple(sorted(re.findall(r'(\w+)="([^"]*)"', m[2])))
            out[(m[1], labels)] = float(m[3])
    return text, out


def test_metrics(server):
    def total(m, fn, outcome):
        return m.get(("staccato_invocations_total", (("function", fn), ("outcome", outcome))), 0.0)

    _, before = _metrics(server)
    for _ in range(3):
        ok_body(server.invoke("nop-c", b""))
    server.invoke("fail", b"m")
    server.invoke("no-such-function", b"")
    text, after = _metrics(server)
    assert "# TYPE staccato_invocations_total counter" in text
    assert "# TYPE staccato_invocation_duration_seconds histogram" in text
    assert total(after, "nop-c", "ok") - total(before, "nop-c", "ok") == 3
    assert total(after, "fail", "function_error") - total(before, "fail", "function_error") == 1
    assert total(after, "_unknown", "not_found") - total(before, "_unknown", "not_found") == 1

    buckets = sorted(((float(dict(k[1])["le"]), v) for k, v in after.items()
                      if k[0] == "staccato_invocation_duration_seconds_bucket" and dict(k[1])["function"] == "nop-c"))
    assert len(buckets) >= 10 and buckets[-1][0] == float("inf"), buckets
    counts = [v for _, v in buckets]
    assert counts == sorted(counts), buckets  # cumulative
    count = after[("staccato_invocation_duration_seconds_count", (("function", "nop-c"),))]
    assert counts[-1] == count >= 3
    assert after[("staccato_invocation_duration_seconds_sum", (("function", "nop-c"),))] > 0


# ---------------------------------------------------------------- 13. isolation


def test_bad_calls_do_not_disturb_others(server):
    bad = ([("crash-c", b"crash", {"worker_crashed"})] * 3 + [("hang", b"", {"timeout"})] * 2
           + [("fail", b"x", {"function_error"})] * 4 + [("no-such-function", b"", {"not_found"})] * 4)
    payloads = [b"echo %d " % i + os.urandom(32) for i in range(50)]
    with ThreadPoolExecutor(12) as ex:
        bad_f = [(ex.submit(server.invoke, n, d, None, 15), kinds) for n, d, kinds in bad]
        good_f = [ex.submit(server.invoke, "echo", d, None, 15) for d in payloads]
        good = [f.result(30) for f in good_f]
        bad_r = [(f.result(30), kinds) for f, kinds in bad_f]
    assert [r.status for r in good] == [200] * 50, [r for r in good if r.status != 200]
    assert [r.body for r in good] == payloads
    for r, kinds in bad_r:
        assert r.status >= 400 and r.json()["error"]["kind"] in kinds, r
    assert server.alive()
    assert ok_body(server.invoke("crash-c", b"ok")).startswith(b"pid=")


# ---------------------------------------------------------------- logs


def test_logs_command(server, tmp_path):
    """`staccato logs NAME --state-dir DIR` with the DIR given to `staccato up`."""
    manifest = _write(tmp_path / "staccato.yml", "functions:\n  chatty:\n    runtime: python\n    handler: chatty:handle\n")
    _write(tmp_path / "chatty.py", "def handle(ctx, data):\n    print('chatty got', data.decode(), flush=True)\n"
                                   "    return b'ok'\n")
    server.deploy(manifest)
    assert ok_body(server.invoke("chatty", b"marker-7f3a")) == b"ok"

    def logged():
        p = server.cli("logs", "chatty", "--state-dir", server.state_dir)
        return p if p.returncode == 0 and "chatty got marker-7f3a" in p.stdout else None
    p = wait_for(logged, timeout=2.0)
    assert p, server.cli("logs", "chatty", "--state-dir", server.state_dir)
    # Through the gateway (the default): the same lines, from the engine.
    p = server.cli("logs", "chatty", "-n", "1")
    assert p.returncode == 0 and p.stdout == "chatty got marker-7f3a\n", (p.stdout, p.stderr)
    r = server.get("/system/logs/chatty?lines=5")
    assert r.status == 200 and len(r.json()["engines"]) == 1, r
    check_error(server.get("/system/logs/nobody"), 404, "not_found", call_id=False)
    check_error(server.get("/system/logs/chatty?after=e1~x~1"), 400, "bad_request", call_id=False)
    check_error(server.get("/system/logs/chatty?lines=1", headers={"Authorization": "Bearer wrong"}), 401,
                "unauthorized", call_id=False)


def test_logs_follow_prints_what_comes_after(server, tmp_path):
    """`staccato logs -f` prints the last lines, then each new line as the
    function writes it, until stopped."""
    manifest = _write(tmp_path / "staccato.yml", "functions:\n  talker:\n    runtime: python\n    handler: talker:handle\n")
    _write(tmp_path / "talker.py", "def handle(ctx, data):\n    print('said', data.decode(), flush=True)\n"
                                   "    return b'ok'\n")
    server.deploy(manifest)
    assert ok_body(server.invoke("talker", b"before")) == b"ok"
    env = clean_env(STACCATO_GATEWAY=server.gateway, STACCATO_TOKEN=server.token)
    follower = subprocess.Popen([str(BIN), "logs", "-f", "-n", "5", "talker"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=env)
    try:
        seen = []
        reader = threading.Thread(target=lambda: seen.extend(iter(follower.stdout.readline, "")), daemon=True)
        reader.start()
        assert wait_for(lambda: "said before\n" in seen, timeout=10), seen
        for i in range(3):
            assert ok_body(server.invoke("talker", b"after-%d" % i)) == b"ok"
        assert wait_for(lambda: all(f"said after-{i}\n" in seen for i in range(3)), timeout=10), seen
        assert seen.count("said before\n") == 1, seen  # printed once, not at every poll
        assert follower.poll() is None, follower.stderr.read()
    finally:
        follower.kill()
        follower.wait(10)


# ---------------------------------------------------------------- languages (issue 3)


@pytest.mark.parametrize("lang", ["python", "node", "go", "c", "cpp"])
def test_new_scaffolds_a_deployable_function(server, tmp_path, lang):
    name = f"scaffold-{lang}"
    p = server.cli("new", name, "--lang", lang, "--dir", tmp_path)
    assert p.returncode == 0, p.stderr
    assert (tmp_path / name / "staccato.yml").is_file()
    server.deploy(tmp_path / name)
    assert ok_body(server.invoke(name, b"world", timeout=30)) == f"Hello from {name}: world".encode()
    again = server.cli("new", name, "--lang", lang, "--dir", tmp_path)
    assert again.returncode != 0 and "already exists" in again.stderr


@pytest.mark.parametrize("lang", ["python", "node", "go", "c", "cpp"])
def test_a_scaffold_comes_with_a_unit_test_that_runs_without_an_engine(server, tmp_path, lang):
    """`staccato new` writes a unit test using the runtime's test helper;
    it passes with the runtime's package installed as the command says
    (pip: the package on the path; npm: `npm install <runtimes/node>`; Go,
    C and C++: the command it prints, run as printed)."""
    name = f"unit-{lang}"
    p = server.cli("new", name, "--lang", lang, "--dir", tmp_path)
    assert p.returncode == 0 and "Unit test:" in p.stdout, p
    d = tmp_path / name
    if lang in ("go", "c", "cpp"):
        command = p.stdout.split("Unit test: ", 1)[1].splitlines()[0].split("   (")[0]
        r = subprocess.run(["bash", "-c", command], cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, command + "\n" + r.stdout + r.stderr
        assert ("ok  \t" in r.stdout) if lang == "go" else (f"ok: Hello from {name}: world" in r.stdout), r.stdout
        return
    if lang == "python":
        env = {**os.environ, "PYTHONPATH": str(REPO / "runtimes" / "python")}
        r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"], cwd=d, env=env,
                           capture_output=True, text=True, timeout=120)
    else:
        subprocess.run(["npm", "install", "--silent", "--offline", "--no-audit", "--no-fund",
                        str(REPO / "runtimes" / "node")], cwd=d, check=True, timeout=120)
        r = subprocess.run(["node", "--test"], cwd=d, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "2 passed" in r.stdout or "# pass 2" in r.stdout, r.stdout


def test_polyglot_chain(server):
    """Python → Go → Node.js → C++ and back, every hop an internal call."""
    server.deploy(REPO / "examples" / "polyglot")
    r = server.invoke("poly-python", b"x", timeout=30)
    assert ok_body(r) == b"python(go(node(cpp(x))))"
    outer = r.headers["x-call-id"]
    chain = {t["function"]: t for t in traces(server, None, limit=100) if t["function"].startswith("poly-")}
    assert chain["poly-go"]["parent_call_id"] == outer
    assert chain["poly-node"]["parent_call_id"] == chain["poly-go"]["call_id"]
    assert chain["poly-cpp"]["parent_call_id"] == chain["poly-node"]["call_id"]


def test_dependencies_installed_at_deploy(server, tmp_path):
    """requirements.txt, package.json and go.mod are resolved from the package
    registries at deploy, into the function's own directory."""
    py, node, go = tmp_path / "py", tmp_path / "node", tmp_path / "go"
    for d in (py, node, go):
        d.mkdir()
    _write(py / "requirements.txt", "six==1.16.0\n")
    _write(py / "handler.py", "import six\n\ndef handle(ctx, data):\n    return six.ensure_binary('six ' + six.__version__)\n")
    _write(node / "package.json", json.dumps({"name": "deps-node", "version": "1.0.0", "type": "module",
                                              "dependencies": {"is-number": "7.0.0"}}))
    _write(node / "handler.mjs", "import isNumber from 'is-number';\n"
                                 "export function handle(ctx, data) { return `is-number ${isNumber(data.toString())}`; }\n")
    _write(go / "go.mod", "module example.com/depsgo\n\ngo 1.22\n\nrequire github.com/google/uuid v1.6.0\n")
    _write(go / "handler.go", 'package depsgo\n\nimport (\n\t"github.com/google/uuid"\n\t"staccato.local/go/staccato"\n)\n\n'
                              'func Handle(ctx *staccato.Context, in []byte) ([]byte, error) {\n'
                              '\tu, err := uuid.Parse(string(in))\n\tif err != nil {\n\t\treturn nil, err\n\t}\n'
                              '\treturn []byte(u.URN()), nil\n}\n')
    manifest = _write(tmp_path / "staccato.yml", "functions:\n"
                      "  deps-py:\n    runtime: python\n    source: py\n"
                      "  deps-node:\n    runtime: node\n    source: node\n"
                      "  deps-go:\n    runtime: go\n    source: go\n")
    p = server.cli("deploy", manifest, timeout=300)
    assert p.returncode == 0, f"{p.stdout}\n{p.stderr}"
    assert ok_body(server.invoke("deps-py")) == b"six 1.16.0"
    assert ok_body(server.invoke("deps-node", b"42")) == b"is-number true"
    u = "6ba7b810-9dad-11d1-80b4-00c04fd430c8"
    assert ok_body(server.invoke("deps-go", u.encode())) == f"urn:uuid:{u}".encode()
    check_error(server.invoke("deps-go", b"not-a-uuid"), 500, "function_error", in_message="invalid UUID")


def test_missing_dependency_fails_the_deploy(server, tmp_path):
    _write(tmp_path / "requirements.txt", "staccato-no-such-package-7f3a==1.0\n")
    _write(tmp_path / "handler.py", "def handle(ctx, data):\n    return b''\n")
    manifest = _write(tmp_path / "staccato.yml", "functions:\n  deps-missing:\n    runtime: python\n")
    p = server.cli("deploy", manifest, timeout=300)
    assert p.returncode != 0
    assert "requirements.txt" in p.stderr and "staccato-no-such-package-7f3a" in p.stderr, p.stderr
    check_error(server.invoke("deps-missing"), 404, "not_found")


def test_worker_that_replies_then_dies_is_replaced(server):
    """A reply and the end of file can arrive in one readiness event; the
    engine must still notice the death. If it did not, the next call would
    be sent to a dead worker and wait out its timeout (504)."""
    rs = []
    # It dies within a second of every start: after three such deaths in a
    # row that is a crash loop, answered with a clear error, not a fork storm.
    # A death that races a call (502 below) neither counts toward the loop
    # nor ends it, and the first launcher may be older than a second, so how
    # many calls it takes varies: call until it is seen, within a bound.
    for _ in range(24):
        r = server.invoke("exit-after", b"", timeout=10)
        # 502 is a fair answer when a call raced the death (it was handed
        # to the worker between its reply and its exit); 504 never is.
        assert r.status in (200, 500, 502), r
        if r.status == 502:
            check_error(r, 502, "worker_crashed")
        rs.append(r)
        if r.status == 500:
            break
    assert ok_body(rs[0]) == b"bye"
    assert sum(r.status == 200 for r in rs) >= 2, rs
    looped = [r for r in rs if r.status == 500]
    assert looped, rs
    check_error(looped[0], 500, "function_error", in_message="keeps exiting right after it starts")
