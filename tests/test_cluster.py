"""Engines join gateways (issue 11): a gateway with no engine of its own,
engines that join it at run time with `staccato engine --join`, calls
balanced over them by fewest calls in flight, functions placed on some
engines by label or count, internal calls sent through the gateway to the
server their callee is on, late joiners given every function, and engines
that die or leave dropped from the table.

Everything runs on loopback here, each engine with its own state and IPC
directories and plain-process isolation (the network-namespace hosts of
`netns::testbed` are for the cross-host tests).
"""
import contextlib
import secrets
import shutil
import signal
import subprocess
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from harness import (BIN, FUNCS, REPO, check_error, clean_env, free_port, ok_body, own_server, request,
                     stop_process, wait_for)

TOKEN = "cluster-test-" + secrets.token_hex(8)
ENGINE_TOKEN = "engine-secret-" + secrets.token_hex(8)


class EngineProc:
    """One `staccato engine --join` process (of one gateway port, or several)."""

    def __init__(self, root, gport, name, extra=()):
        gports = gport if isinstance(gport, (list, tuple)) else [gport]
        self.port = free_port()
        self.dir = Path(root) / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.ipc = Path(f"/dev/shm/staccato-test-engine-{self.port}")
        self.log = self.dir / "engine.log"
        self.id = f"127.0.0.1:{self.port}"
        self.argv = [str(BIN), "engine", "--engine-listen", self.id, "--state-dir", str(self.dir / "state"),
                     "--ipc-dir", str(self.ipc), "--isolation", "process", "--engine-token", ENGINE_TOKEN,
                     *[a for g in gports for a in ("--join", f"http://127.0.0.1:{g}")], "--token", TOKEN, *extra]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=clean_env(), cwd=REPO)

    def stop(self, sig=signal.SIGKILL):
        stop_process(self.proc, sig)
        shutil.rmtree(self.ipc, ignore_errors=True)


@contextlib.contextmanager
def cluster(root, engines=3, engine_extra=()):
    """A gateway with no engine of its own, and `engines` that join it."""
    root = Path(root)
    gport = free_port()
    procs = [EngineProc(root, gport, f"engine{i}", extra=["--label", f"host=engine{i}", *engine_extra])
             for i in range(engines)]
    gw_argv = [str(BIN), "gateway", "--listen", f"127.0.0.1:{gport}", "--token", TOKEN, "--engine-token",
               ENGINE_TOKEN, "--state-dir", str(root / "gateway-state")]
    try:
        # Healthy once an engine has joined and is ready.
        with own_server(root / "gw", port=gport, argv=gw_argv, token=TOKEN,
                        state_dir=root / "gateway-state") as gw:
            gw.engine_procs = list(procs)  # those running
            gw.all_procs = procs  # every one started, stopped at the end
            gw.root = root
            assert wait_for(lambda: len(ready(gw)) == engines, timeout=20), table(gw)
            yield gw
    except BaseException:
        for p in procs:
            print(f"--- tail of {p.log}\n" + "\n".join(p.log.read_text(errors="replace").splitlines()[-20:]))
        raise
    finally:
        for p in procs:
            p.stop()


def table(gw):
    r = gw.get("/system/engines")
    assert r.status == 200, r
    return r.json()


def ready(gw):
    return [e["id"] for e in table(gw) if e["state"] == "ready"]


def served_by(r):
    return r.headers.get("x-staccato-engine")


MANIFEST = """functions:
  echo:
    runtime: python
    source: {py}
    handler: echo:handle
    max_workers: 16
  sleepy:
    runtime: python
    source: {root}/sleepy
    handler: sleepy:handle
    max_workers: 16
"""

SLEEPY = """
import asyncio

async def handle(ctx, data):
    await asyncio.sleep(0.05)
    return data
"""


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    root = tmp_path_factory.mktemp("cluster")
    (root / "sleepy").mkdir()
    (root / "sleepy" / "sleepy.py").write_text(SLEEPY)
    (root / "staccato.yml").write_text(MANIFEST.format(py=FUNCS / "py", root=root))
    with cluster(root) as g:
        g.deploy(root / "staccato.yml")
        yield g


def test_engines_join_and_are_listed(gw):
    rows = table(gw)
    assert sorted(e["id"] for e in rows) == sorted(p.id for p in gw.engine_procs), rows
    for e in rows:
        assert e["kind"] == "joined" and e["state"] == "ready", e
        assert 0 < e["lease_left_ms"] <= 3000, e
    out = gw.cli("engines")
    assert out.returncode == 0, out.stderr
    for p in gw.engine_procs:
        assert p.id in out.stdout, out.stdout
    # Every engine runs every function.
    f = gw.function("echo")
    assert sorted(f["engines"]) == sorted(p.id for p in gw.engine_procs), f


def test_calls_are_spread_over_the_engines(gw):
    """16 connections, 30 calls each: each engine serves a share within 2x
    of the mean, and says so in x-staccato-engine."""
    def caller(i):
        return [served_by(gw.invoke("sleepy", b"%d" % i)) for _ in range(30)]

    with ThreadPoolExecutor(16) as ex:
        counts = Counter(e for batch in ex.map(caller, range(16)) for e in batch)
    assert None not in counts, counts
    mean = sum(counts.values()) / len(gw.engine_procs)
    assert set(counts) == {p.id for p in gw.engine_procs}, counts
    for engine, n in counts.items():
        assert mean / 2 <= n <= mean * 2, counts


def test_bad_joins_are_refused(gw):
    auth = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}

    def join(body, headers=auth):
        return request(gw.port, "POST", "/system/engines", body=body, headers=headers)

    check_error(join(b'{"id": "a b", "address": "10.0.0.1:7000"}'), 400, "bad_request", call_id=False)
    check_error(join(b'{"id": "x", "address": "0.0.0.0:7000"}'), 400, "bad_request", call_id=False)
    check_error(join(b'{"id": "x", "address": "10.0.0.1:0"}'), 400, "bad_request", call_id=False)
    check_error(join(b'{"id": "x", "address": "10.0.0.1:7000", "more": 1}'), 400, "bad_request", call_id=False)
    check_error(join(b'{"id": "x", "address": "10.0.0.1:7000"}', {"Content-Type": "application/json"}), 401,
                "unauthorized", call_id=False)
    check_error(join(b'{"id": "x", "address": "10.0.0.1:7000"}', {"Authorization": auth["Authorization"]}), 415,
                "unsupported_media_type", call_id=False)
    assert "x" not in [e["id"] for e in table(gw)]


PLACED = """functions:
  chain-a:
    runtime: python
    source: {py}
    handler: chain:handle_a
    placement: {{labels: {{host: engine0}}}}
  chain-b:
    runtime: python
    source: {py}
    handler: chain:handle_b
    placement: {{labels: {{host: engine1}}}}
  chain-c:
    runtime: python
    source: {py}
    handler: chain:handle_c
    placement: {{labels: {{host: engine2}}}}
  pair:
    runtime: python
    source: {py}
    handler: echo:handle
    placement: {{engines: 2}}
  ping:
    runtime: python
    source: {root}/placed
    handler: pingpong:ping
    max_workers: 64
    placement: {{labels: {{host: engine0}}}}
  pong:
    runtime: python
    source: {root}/placed
    handler: pingpong:pong
    max_workers: 64
    placement: {{labels: {{host: engine1}}}}
  hurried:
    runtime: python
    source: {root}/placed
    handler: pingpong:hurried
    timeout: 1s
    placement: {{labels: {{host: engine0}}}}
  dawdle:
    runtime: python
    source: {py}
    handler: slow:handle
    timeout: 20s
    placement: {{labels: {{host: engine2}}}}
"""

PINGPONG = """
import staccato


async def _call(ctx, name, data):
    try:
        return await ctx.call(name, data)
    except staccato.CallError as e:
        if e.kind == "call_depth_exceeded":
            return e.kind.encode()
        raise


async def ping(ctx, data):
    return b"ping," + await _call(ctx, "pong", data)


async def pong(ctx, data):
    return b"pong," + await _call(ctx, "ping", data)


async def hurried(ctx, data):
    return await ctx.call("dawdle", data)
"""


@pytest.fixture(scope="module")
def placed(gw):
    (gw.root / "placed").mkdir(exist_ok=True)
    (gw.root / "placed" / "pingpong.py").write_text(PINGPONG)
    (gw.root / "placed.yml").write_text(PLACED.format(py=FUNCS / "py", root=gw.root))
    out = gw.cli("deploy", str(gw.root / "placed.yml"), timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def ids(procs):
    return [p.id for p in procs]


def test_functions_run_only_where_they_are_placed(gw, placed):
    e = ids(gw.engine_procs)
    assert "chain-b (python) ... ok" in placed and f"on {e[1]}" in placed, placed
    assert gw.function("chain-a")["engines"] == [e[0]]
    assert gw.function("chain-b")["engines"] == [e[1]]
    assert gw.function("chain-b")["placement"] == {"engines": 0, "labels": {"host": "engine1"}}
    pair = gw.function("pair")["engines"]
    assert len(pair) == 2 and set(pair) <= set(e), pair
    # External calls go only where the function is.
    with ThreadPoolExecutor(8) as ex:
        seen = Counter(ex.map(lambda i: served_by(gw.invoke("chain-c", b"%d" % i)), range(40)))
    assert seen == {e[2]: 40}, seen
    with ThreadPoolExecutor(8) as ex:
        seen = Counter(ex.map(lambda i: served_by(gw.invoke("pair", b"p")), range(40)))
    assert set(seen) == set(pair), seen
    # Placed on more engines than there are: on all of them, said so.
    (gw.root / "many.yml").write_text(
        f"functions:\n  many:\n    runtime: python\n    source: {FUNCS / 'py'}\n    handler: echo:handle\n"
        "    placement: {engines: 5}\n")
    out = gw.cli("deploy", str(gw.root / "many.yml"), timeout=120)
    assert out.returncode == 0 and "placed on 3 of the 5 engines" in out.stdout, out.stdout + out.stderr
    # Labels no engine has: refused, nothing deployed.
    (gw.root / "nowhere.yml").write_text(
        f"functions:\n  nowhere:\n    runtime: python\n    source: {FUNCS / 'py'}\n    handler: echo:handle\n"
        "    placement: {labels: {gpu: h100}}\n")
    out = gw.cli("deploy", str(gw.root / "nowhere.yml"), timeout=60)
    assert out.returncode != 0 and "gpu=h100" in out.stdout + out.stderr, out.stdout + out.stderr
    check_error(gw.get("/system/functions/nowhere"), 404, "not_found", call_id=False)


def test_internal_calls_cross_servers_through_the_gateway_and_are_traced(gw, placed):
    """chain-a on engine 0 calls chain-b on engine 1, which calls chain-c
    on engine 2: each hop goes up the caller's engine link and down to
    the callee's; both engines trace it under the caller's call id."""
    e = ids(gw.engine_procs)
    for i in range(20):
        assert ok_body(gw.invoke("chain-a", b"%d" % i)) == b"a(b(c(%d)))" % i
    traces = gw.get("/system/trace?limit=500").json()
    by = {}
    for t in traces:
        by.setdefault((t["function"], t.get("hop", ""), t["engine"]), []).append(t)
    assert len(by[("chain-a", "", e[0])]) >= 20, sorted(by)
    for callee, caller_engine, callee_engine in (("chain-b", e[0], e[1]), ("chain-c", e[1], e[2])):
        out = {t["call_id"]: t for t in by[(callee, "out", caller_engine)]}
        came = {t["call_id"]: t for t in by[(callee, "in", callee_engine)]}
        assert len(came) >= 20 and set(came) <= set(out), (callee, sorted(out), sorted(came))
        for call_id, t in came.items():
            assert t["parent_call_id"] == out[call_id]["parent_call_id"], (t, out[call_id])
            assert out[call_id]["outcome"] == t["outcome"] == "ok", (t, out[call_id])
    # The chain holds together across servers: c's caller is b as engine 1 knows it...
    b_ids = {t["call_id"] for t in by[("chain-b", "in", e[1])]}
    assert {t["parent_call_id"] for t in by[("chain-c", "out", e[1])]} <= b_ids
    # ...and b's caller is a call of chain-a on engine 0.
    a_ids = {t["call_id"] for t in by[("chain-a", "", e[0])]}
    assert {t["parent_call_id"] for t in by[("chain-b", "in", e[1])]} <= a_ids
    rows = {r["id"]: r for r in table(gw)}
    assert rows[e[0]]["forwarded"] >= 20 and rows[e[1]]["forwarded"] >= 20, rows
    assert rows[e[0]]["labels"] == {"host": "engine0"}, rows
    out = gw.cli("trace", "chain-b", "--limit", "5")
    assert out.returncode == 0 and f"{e[0]} ->" in out.stdout and f"-> {e[1]}" in out.stdout, out.stdout


def test_a_call_to_another_server_keeps_its_deadline_and_depth(gw, placed):
    """The caller's remaining deadline travels with the call: dawdle (20 s
    timeout) called from hurried (1 s) is stopped by its own engine after
    about 1 s. The chain's depth travels too: a cycle across two servers is
    stopped at the depth limit."""
    t0 = time.monotonic()
    r = gw.invoke("hurried", b"5000", timeout=15)
    took = time.monotonic() - t0
    check_error(r, 504, "timeout")
    assert took < 3, took
    e = ids(gw.engine_procs)
    assert wait_for(lambda: any(t.get("hop") == "in" and t["outcome"] == "timeout" and t["engine"] == e[2]
                                for t in gw.get("/system/trace?function=dawdle").json()), timeout=5)
    dawdled = [t for t in gw.get("/system/trace?function=dawdle").json() if t.get("hop") == "in"]
    ran_ms = (dawdled[0]["complete_ns"] - dawdled[0]["receive_ns"]) / 1e6
    assert 700 < ran_ms < 2500, dawdled[0]
    # ping on engine 0 and pong on engine 1 call each other for ever: the
    # chain is cut where a chain on one server would be (--max-call-depth 32).
    t0 = time.monotonic()
    out = ok_body(gw.invoke("ping", b"x", timeout=30)).decode()
    assert out.endswith("call_depth_exceeded") and out.count(",") == 32, out
    assert time.monotonic() - t0 < 10


def test_an_engine_that_joins_late_gets_every_function_first(gw):
    late = EngineProc(gw.root, gw.port, "late")
    gw.engine_procs.append(late)
    gw.all_procs.append(late)
    assert wait_for(lambda: late.id in ready(gw), timeout=20), table(gw)
    # Ready means restored: it has both functions, and takes calls at once.
    assert late.id in gw.function("echo")["engines"]
    assert late.id in gw.function("sleepy")["engines"]
    with ThreadPoolExecutor(8) as ex:
        seen = set(ex.map(lambda i: served_by(gw.invoke("sleepy", b"x")), range(64)))
    assert late.id in seen, seen


def test_an_engine_that_goes_silent_is_passed_over_within_a_second(gw):
    """SIGSTOP an engine under load: like a cut cable, nothing tells the
    gateway (no reset, the kernel still acknowledges). Its pings go
    unanswered, so within 1 s its links close: each call it held is answered
    503 engine_unavailable, none waits for its timeout, and later calls go
    to the others. Woken again, it rejoins and takes calls."""
    victim = gw.engine_procs[1]
    results = []

    def caller(i):
        out = []
        deadline = time.monotonic() + 3.5
        while time.monotonic() < deadline:
            t0 = time.monotonic()
            r = gw.invoke("sleepy", b"s", timeout=20)
            out.append((r.status, r.json()["error"]["kind"] if r.status != 200 else None, served_by(r), t0,
                        time.monotonic() - t0))
        return out

    try:
        with ThreadPoolExecutor(8) as ex:
            futures = [ex.submit(caller, i) for i in range(8)]
            time.sleep(1)
            victim.proc.send_signal(signal.SIGSTOP)
            stopped = time.monotonic()
            for f in futures:
                results.extend(f.result())
    finally:
        victim.proc.send_signal(signal.SIGCONT)
    kinds = Counter((status, kind) for status, kind, _, _, _ in results)
    assert set(kinds) <= {(200, None), (503, "engine_unavailable")}, kinds
    slowest = max(took for _, _, _, _, took in results)
    # 50 ms of work; a call the stopped engine held waits for the silence
    # limit (800 ms) and one ping period at most.
    assert slowest < 1.6, (slowest, kinds)
    # Calls made a second after it stopped are all served, elsewhere.
    after = [r for r in results if r[3] > stopped + 1.0]
    assert after and all(r[0] == 200 and r[2] != victim.id for r in after), after[:5]
    assert time.monotonic() - stopped < 6
    assert wait_for(lambda: victim.id in ready(gw), timeout=20), table(gw)
    with ThreadPoolExecutor(8) as ex:
        seen = set(ex.map(lambda i: served_by(gw.invoke("sleepy", b"x")), range(64)))
    assert victim.id in seen, seen


def test_logs_come_from_the_engines_that_hold_them(gw):
    """`staccato logs` asks the gateway, which asks every engine: a function
    placed on one engine shows that engine's output alone; one that runs
    everywhere shows each engine's, prefixed with its id."""
    (gw.root / "talk").mkdir(exist_ok=True)
    (gw.root / "talk" / "talk.py").write_text("def handle(ctx, data):\n    print('heard', data.decode(), flush=True)\n"
                                              "    return b'ok'\n")
    home = gw.engine_procs[1]
    (gw.root / "talk.yml").write_text(
        f"functions:\n  talk-here:\n    runtime: python\n    source: {gw.root / 'talk'}\n    handler: talk:handle\n"
        "    placement: {labels: {host: engine1}}\n"
        f"  talk-all:\n    runtime: python\n    source: {gw.root / 'talk'}\n    handler: talk:handle\n")
    out = gw.cli("deploy", str(gw.root / "talk.yml"), timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert ok_body(gw.invoke("talk-here", b"only-here")) == b"ok"
    r = gw.get("/system/logs/talk-here")
    assert r.status == 200, r
    parts = r.json()["engines"]
    assert [p["engine"] for p in parts] == [home.id], parts
    assert wait_for(lambda: gw.cli("logs", "talk-here").stdout == "heard only-here\n", timeout=5), \
        gw.cli("logs", "talk-here")
    served = {served_by(gw.invoke("talk-all", b"m%d" % i)) for i in range(30)}
    assert len(served) >= 2, served
    out = gw.cli("logs", "talk-all", "-n", "100").stdout
    prefixes = {line.split("] ")[0].lstrip("[") for line in out.splitlines()}
    assert served <= prefixes, (served, out)
    assert sum(1 for line in out.splitlines() if " heard m" in line) == 30, out


def row(gw, engine_id):
    return next((e for e in table(gw) if e["id"] == engine_id), None)


def test_an_engine_away_while_its_function_moved_drops_it_on_return(gw):
    """A function placed by label on engine 2 moves to engine 1 while
    engine 2 is stopped and out of the table, so nobody tells it. When it
    comes back, the gateway's reconciliation unregisters the stale copy
    before the engine counts as ready (left there, its own callers would
    keep calling it: a local callee always wins)."""
    victim, other = gw.engine_procs[2], gw.engine_procs[1]
    manifest = gw.root / "roamer.yml"

    def deploy(host):
        manifest.write_text(
            f"functions:\n  roamer:\n    runtime: python\n    source: {FUNCS / 'py'}\n    handler: echo:handle\n"
            f"    placement: {{labels: {{host: {host}}}}}\n")
        out = gw.cli("deploy", str(manifest), timeout=120)
        assert out.returncode == 0, out.stdout + out.stderr

    deploy("engine2")
    assert wait_for(lambda: "roamer" in row(gw, victim.id)["functions"], timeout=5), row(gw, victim.id)
    assert "roamer" not in row(gw, other.id)["functions"]
    try:
        victim.proc.send_signal(signal.SIGSTOP)
        assert wait_for(lambda: row(gw, victim.id) is None, timeout=10), table(gw)
        deploy("engine1")
        assert served_by(gw.invoke("roamer", b"r")) == other.id
    finally:
        victim.proc.send_signal(signal.SIGCONT)
    assert wait_for(lambda: victim.id in ready(gw), timeout=20), table(gw)
    back = row(gw, victim.id)
    assert "roamer" not in back["functions"] and "echo" in back["functions"], back
    assert wait_for(lambda: "roamer" in row(gw, other.id)["functions"], timeout=5), row(gw, other.id)
    assert "function roamer left an engine it is no longer placed on" in gw.log_tail(400)
    assert gw.cli("rm", "roamer").returncode == 0


def test_a_killed_engine_is_dropped_and_no_call_is_lost(gw):
    """SIGKILL an engine while 8 connections call: every call is answered
    once, ok or 503 engine_unavailable (those it was running), none hangs;
    the engine leaves the table within its lease, and later calls all
    succeed on the others."""
    victim = gw.engine_procs[0]
    results = []

    def caller(i):
        out = []
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            r = gw.invoke("sleepy", b"k", timeout=10)
            out.append((r.status, r.json()["error"]["kind"] if r.status != 200 else None))
        return out

    with ThreadPoolExecutor(8) as ex:
        futures = [ex.submit(caller, i) for i in range(8)]
        time.sleep(1)
        killed = time.monotonic()
        victim.stop(signal.SIGKILL)
        for f in futures:
            results.extend(f.result())
    statuses = Counter(results)
    assert set(statuses) <= {(200, None), (503, "engine_unavailable")}, statuses
    assert statuses[(200, None)] > 0, statuses
    assert wait_for(lambda: victim.id not in [e["id"] for e in table(gw)], timeout=5), table(gw)
    assert time.monotonic() - killed < 5
    gw.engine_procs.remove(victim)
    with ThreadPoolExecutor(8) as ex:
        after = list(ex.map(lambda i: gw.invoke("sleepy", b"a"), range(32)))
    assert all(r.status == 200 for r in after), [r for r in after if r.status != 200][:3]
    assert victim.id not in {served_by(r) for r in after}


def test_an_engine_that_stops_leaves_at_once(gw):
    leaving = gw.engine_procs[-1]
    leaving.stop(signal.SIGTERM)
    gw.engine_procs.remove(leaving)
    # Gone well before its lease (3 s) would run out.
    assert wait_for(lambda: leaving.id not in [e["id"] for e in table(gw)], timeout=1.5), table(gw)
    assert ok_body(gw.invoke("echo", b"still")) == b"still"
