"""Trust boundaries, attacked the way a hostile-but-fair user would
(issue 9): the engine port, deploy requests that name host paths, web pages
reaching the loopback management API, a second `up` on a running state
directory, malformed request headers, numbers beyond what a host can give.

Each test fails on a Staccato without the fix it guards.
"""
import io
import json
import os
import re
import signal
import socket
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

import cgroups
from harness import (BIN, FUNCS, check_error, clean_env, free_port, ok_body, own_server, request,
                     wait_for)


NEIGHBOURS = """
import asyncio, os, sys

async def handle(ctx, data):
    if data == b"exit":
        await asyncio.sleep(0.05)
        sys.exit(3)
    if data == b"crash":
        await asyncio.sleep(0.05)
        os._exit(9)
    if data == b"forge":
        # A hostile function writes its own Invoke, claiming a gateway call
        # id (bit 63), and waits for the reply to it.
        import staccato
        from staccato import wire
        ch = ctx._channel
        call_id = (1 << 63) | 12345
        fut = asyncio.get_running_loop().create_future()
        ch._pending[call_id] = fut
        ch.send(wire.pack(wire.INVOKE, 0, 5, call_id, ctx.call_id, ch.worker_id, 4, 0, 0, 0, 0, b"echox"))
        try:
            await fut
        except staccato.CallError as e:
            return f"{e.kind}: {e.message}".encode()
        return b"accepted"
    await asyncio.sleep(0.3)
    return data
"""


NODE_NEIGHBOURS = """
export async function handle(ctx, data) {
  if (data.toString() === 'exit') {
    await new Promise((r) => setTimeout(r, 50));
    process.exit(3);
  }
  await new Promise((r) => setTimeout(r, 300));
  return data;
}
"""

REC = """
import staccato

LOOP = ("call_cycle", "call_depth_exceeded")


async def _call(ctx, name, data):
    try:
        return await ctx.call(name, data)
    except staccato.CallError as e:
        if e.kind in LOOP:
            return f"{e.kind}".encode()
        raise


async def handle(ctx, data):
    d = int(data)
    if d == 0:
        return b"0"
    return str(d).encode() + b"," + await _call(ctx, ctx.function, str(d - 1).encode())


async def slow(ctx, data):
    # handle, with a pause before each level: calls side by side interleave.
    import asyncio
    await asyncio.sleep(0.3)
    return await handle(ctx, data)


async def ping(ctx, data):
    # ping(n) -> pong(n) -> ping(n - 1) ...; "inf" never ends.
    return b"ping," + await _call(ctx, "pong", data)


async def pong(ctx, data):
    if data == b"0":
        return b"pong"
    nxt = data if data == b"inf" else str(int(data) - 1).encode()
    return b"pong," + await _call(ctx, "ping", nxt)
"""


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    root = tmp_path_factory.mktemp("trust")
    fn = root / "fn"
    fn.mkdir()
    (fn / "echo.py").write_text((FUNCS / "py" / "echo.py").read_text())
    (fn / "neighbours.py").write_text(NEIGHBOURS)
    (fn / "rec.py").write_text(REC)
    (fn / "neighbours.mjs").write_text(NODE_NEIGHBOURS)
    (fn / "staccato.yml").write_text("functions:\n  echo:\n    runtime: python\n    handler: echo:handle\n"
                                     "  neighbours:\n    runtime: python\n    handler: neighbours:handle\n"
                                     "  neighbours-node:\n    runtime: node\n    handler: neighbours.mjs:handle\n"
                                     "  rec:\n    runtime: python\n    handler: rec:handle\n    max_workers: 8\n"
                                     "    timeout: 20s\n"
                                     "  rec-wide:\n    runtime: python\n    handler: rec:handle\n    max_workers: 24\n"
                                     "    timeout: 20s\n"
                                     "  rec-pair:\n    runtime: python\n    handler: rec:slow\n    max_workers: 4\n"
                                     "    min_workers: 2\n    timeout: 20s\n"
                                     "  ping:\n    runtime: python\n    handler: rec:ping\n    max_workers: 64\n"
                                     "    timeout: 20s\n"
                                     "  pong:\n    runtime: python\n    handler: rec:pong\n    max_workers: 64\n"
                                     "    timeout: 20s\n")
    with own_server(root / "srv") as s:
        s.deploy(fn)
        yield s


def engine_port(s):
    m = re.search(r"\(engine 127\.0\.0\.1:(\d+)", s.log_path.read_text())
    assert m, s.log_tail()
    return int(m[1])


ERROR = 4  # frame kind (docs/protocol.md §2)
# The link protocol's version, as the engine speaks it.
PROTOCOL = int(re.search(r"PROTOCOL_VERSION: u16 = (\d+)",
                         (FUNCS.parent.parent / "crates/api/src/auth.rs").read_text())[1])

ATTACK = r"""
import json, os, socket, struct, sys
port, version = int(sys.argv[1]), int(sys.argv[2])
def frame(kind, body=b"", a=0):
    return struct.pack("<IHHQIIII", len(body), kind, 0, 0, a, 0, 0, 0) + body
out = {"uid": os.getuid()}
# 1. What a protocol-1 gateway sent: hello (control role), then a register.
s = socket.create_connection(("127.0.0.1", port), timeout=5)
s.sendall(frame(1, b"\x01") + frame(5, json.dumps({"op": "register", "spec": {"name": "pwned"}}).encode()))
def read_all(s, key):
    data = b""
    try:
        while True:
            c = s.recv(65536)
            if not c:
                break
            data += c
    except OSError as e:
        out[key] = str(e)
    return data
data = read_all(s, "error1")
out["reply1"] = data[32:].decode(errors="replace")
out["kind1"] = struct.unpack_from("<H", data, 4)[0] if len(data) >= 32 else None
# 2. A well-formed hello of the current version answered with a made-up proof.
s = socket.create_connection(("127.0.0.1", port), timeout=5)
s.sendall(frame(1, b"STCO" + struct.pack("<HBB", version, 1, 0) + os.urandom(32)))
head = s.recv(32)
n = struct.unpack_from("<I", head)[0]
s.recv(n)
s.sendall(frame(8, os.urandom(32)) + frame(5, b'{"op": "status"}'))
data = read_all(s, "error2")
out["reply2"] = data[32:].decode(errors="replace")
print(json.dumps(out))
"""


def test_engine_port_refuses_unauthenticated_peers(srv):
    """A local unprivileged user (nobody) speaks to the engine port directly."""
    port = engine_port(srv)
    nobody = 65534
    p = subprocess.run(["python3", "-c", ATTACK, str(port), str(PROTOCOL)], capture_output=True, text=True, timeout=30,
                       preexec_fn=lambda: (os.setgid(nobody), os.setuid(nobody)))
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["uid"] == nobody
    assert out["kind1"] == ERROR and f"protocol version {PROTOCOL}" in out["reply1"], out
    assert "authentication failed" in out["reply2"], out
    # Nothing got registered, nothing answered a status request.
    assert srv.get("/system/functions/pwned").status == 404
    assert '"functions"' not in out["reply2"]
    # The engine still serves the real gateway.
    assert ok_body(srv.invoke("echo", b"still here")) == b"still here"


def test_an_engine_beyond_loopback_needs_a_token(tmp_path):
    port = free_port()
    ipc = Path(f"/dev/shm/staccato-test-{port}")
    p = subprocess.run([str(BIN), "engine", "--engine-listen", f"0.0.0.0:{port}", "--state-dir",
                        str(tmp_path / "state"), "--ipc-dir", str(ipc), "--isolation", "process"],
                       capture_output=True, text=True, timeout=30, env=clean_env())
    assert p.returncode != 0, (p.stdout, p.stderr)
    assert "engine token" in p.stderr and "--engine-token" in p.stderr, p.stderr
    # It never listened.
    with socket.socket() as s:
        s.settimeout(1)
        assert s.connect_ex(("127.0.0.1", port)) != 0


def test_a_gateway_with_the_wrong_engine_token_is_refused(tmp_path):
    eport = free_port()
    ipc = Path(f"/dev/shm/staccato-test-{eport}")
    elog = open(tmp_path / "engine.log", "wb")
    engine = subprocess.Popen([str(BIN), "engine", "--engine-listen", f"127.0.0.1:{eport}", "--state-dir",
                               str(tmp_path / "es"), "--ipc-dir", str(ipc), "--isolation", "process",
                               "--engine-token", "right"], stdout=elog, stderr=subprocess.STDOUT, env=clean_env())
    gport = free_port()
    glog = tmp_path / "gw.log"
    try:
        with open(glog, "wb") as g:
            gw = subprocess.Popen([str(BIN), "gateway", "--listen", f"127.0.0.1:{gport}", "--engine",
                                   f"127.0.0.1:{eport}", "--state-dir", str(tmp_path / "gs"), "--engine-token",
                                   "wrong"], stdout=g, stderr=subprocess.STDOUT, env=clean_env())
        try:
            said = wait_for(lambda: "authentication failed" in glog.read_text(), timeout=10)
            assert said, glog.read_text()
            r = request(gport, "GET", "/healthz")
            assert r.status == 503, r
        finally:
            gw.kill()
            gw.wait()
    finally:
        engine.kill()
        engine.wait()
        elog.close()


# ---------------------------------------------------------------- sources come from the client


def _raw_tar(entries):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as t:
        for name, kind, data in entries:
            info = tarfile.TarInfo(name)
            info.type = kind
            if kind == tarfile.SYMTYPE:
                info.linkname = "/etc/shadow"
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _no_shadow_under(path):
    hits = [str(p) for p in Path(path).rglob("*") if p.name in ("shadow", "gshadow")]
    assert not hits, hits


def test_deploy_requests_naming_host_paths_copy_nothing(srv):
    auth = {**srv.auth(), "Content-Type": "application/json"}
    for source in ("/etc", "../../..", "/", str(srv.state_dir)):
        for key in ("source", "source_dir"):
            body = json.dumps({"functions": [{"name": "steal", "runtime": "python", "handler": "echo:handle",
                                              key: source}]})
            r = request(srv.port, "POST", "/system/functions", body=body, headers=auth)
            assert r.status == 400, (key, source, r)
    _no_shadow_under(srv.state_dir)
    assert srv.get("/system/functions/steal").status == 404


def test_hostile_source_archives_are_refused_whole(srv):
    headers = {**srv.auth(), "Content-Type": "application/gzip"}
    cases = {
        "escape": [("../../../../tmp/staccato-escaped", tarfile.REGTYPE, b"x")],
        "absolute": [("/tmp/staccato-absolute", tarfile.REGTYPE, b"x")],
        "symlink": [("handler.py", tarfile.SYMTYPE, b"")],
        "device": [("dev", tarfile.CHRTYPE, b"")],
    }
    for what, entries in cases.items():
        r = request(srv.port, "POST", "/system/sources", body=_raw_tar(entries), headers=headers)
        check_error(r, 400, "bad_request", call_id=False)
    assert not Path("/tmp/staccato-escaped").exists() and not Path("/tmp/staccato-absolute").exists()
    r = request(srv.port, "POST", "/system/sources", body=b"\x1f\x8b not really gzip", headers=headers)
    check_error(r, 400, "bad_request", call_id=False)
    # A source archive must be uploaded before a deploy can name it.
    body = json.dumps({"functions": [{"name": "ghost", "runtime": "python", "handler": "echo:handle",
                                      "source": "sha256:" + "ab" * 32}]})
    r = request(srv.port, "POST", "/system/functions", body=body,
                headers={**srv.auth(), "Content-Type": "application/json"})
    check_error(r, 400, "bad_request", in_message="was not uploaded", call_id=False)


def test_a_manifest_naming_the_root_fails_fast_on_the_client(srv, tmp_path):
    m = tmp_path / "staccato.yml"
    m.write_text("functions:\n  root:\n    runtime: python\n    handler: echo:handle\n    source: /\n")
    t = time.monotonic()
    p = srv.cli("deploy", m)
    assert p.returncode != 0 and "packing /:" in p.stderr, p.stderr
    assert any(w in p.stderr for w in ("more than 20000", "larger than", "deeper than")), p.stderr
    assert time.monotonic() - t < 30
    _no_shadow_under(srv.state_dir)


# ---------------------------------------------------------------- web pages and the loopback API


def test_web_pages_cannot_drive_the_loopback_api(srv):
    evil = {"Content-Type": "text/plain", "Origin": "http://evil.example"}
    spec = json.dumps({"functions": [{"name": "csrf", "runtime": "python", "handler": "echo:handle",
                                      "source": "sha256:" + "0" * 64}]})
    # DNS rebinding: the page's own name, resolved to 127.0.0.1.
    r = request(srv.port, "POST", "/system/functions", body=spec,
                headers={**evil, "Host": f"evil.example:{srv.port}"})
    check_error(r, 403, "forbidden", in_message="evil.example", call_id=False)
    r = request(srv.port, "POST", "/function/echo", body=b"x", headers={"Host": f"evil.example:{srv.port}"})
    check_error(r, 403, "forbidden", call_id=False)
    # Cross-site form post to the right host: refused for its origin even with the token.
    r = request(srv.port, "POST", "/system/functions", body=spec, headers={**evil, **srv.auth()})
    check_error(r, 403, "forbidden", in_message="origin", call_id=False)
    r = request(srv.port, "GET", "/system/functions", headers={"Sec-Fetch-Site": "cross-site", **srv.auth()})
    check_error(r, 403, "forbidden", call_id=False)
    # A simple (no-preflight) content type is refused even from the CLI's side.
    r = request(srv.port, "POST", "/system/functions", body=spec,
                headers={"Content-Type": "text/plain", **srv.auth()})
    check_error(r, 415, "unsupported_media_type", call_id=False)
    # Without the token, nothing; the token file is the user's alone.
    check_error(request(srv.port, "GET", "/system/functions"), 401, "unauthorized", call_id=False)
    assert (srv.state_dir / "token").stat().st_mode & 0o077 == 0
    assert srv.get("/system/functions/csrf").status == 404
    # Same-origin requests and loopback names still work.
    r = request(srv.port, "GET", "/system/functions",
                headers={**srv.auth(), "Origin": f"http://localhost:{srv.port}", "Host": f"localhost:{srv.port}"})
    assert r.status == 200, r


def test_the_cli_finds_the_local_token_by_itself(srv):
    env = clean_env(STACCATO_GATEWAY=srv.gateway, STACCATO_STATE_DIR=str(srv.state_dir))
    p = subprocess.run([str(BIN), "ls"], capture_output=True, text=True, timeout=30, env=env)
    assert p.returncode == 0 and "echo" in p.stdout, p.stderr


# ---------------------------------------------------------------- a second `up`


def test_a_second_up_on_a_running_state_dir_touches_nothing(srv):
    before = srv.function("echo")["status"]["container"]["id"]
    p = subprocess.run([str(BIN), "up", "--listen", f"127.0.0.1:{free_port()}", "--state-dir", str(srv.state_dir),
                        "--ipc-dir", str(srv.ipc_dir)], capture_output=True, text=True, timeout=30, env=clean_env())
    assert p.returncode != 0, (p.stdout, p.stderr)
    assert "in use by another staccato" in p.stderr, p.stderr
    assert "Staccato is up" not in p.stdout
    for i in range(20):
        assert ok_body(srv.invoke("echo", str(i).encode())) == str(i).encode()
    assert srv.function("echo")["status"]["container"]["id"] == before
    # Another state dir but the same IPC directory: refused too.
    p = subprocess.run([str(BIN), "up", "--listen", f"127.0.0.1:{free_port()}", "--state-dir",
                        str(srv.workdir / "other-state"), "--ipc-dir", str(srv.ipc_dir)],
                       capture_output=True, text=True, timeout=30, env=clean_env())
    assert p.returncode != 0 and "in use" in p.stderr, p.stderr
    assert ok_body(srv.invoke("echo", b"after")) == b"after"


# ---------------------------------------------------------------- headers and numbers


@pytest.mark.parametrize("value", ["-1", "abc", "0", "1.5", "99999999999"])
def test_bad_timeout_headers_are_refused(srv, value):
    r = srv.invoke("echo", b"x", headers={"X-Staccato-Timeout-Ms": value})
    check_error(r, 400, "bad_request", in_message="x-staccato-timeout-ms")


def test_numbers_are_bounded_by_what_a_host_has(srv, tmp_path):
    m = tmp_path / "staccato.yml"
    src = tmp_path / "src"
    src.mkdir()
    (src / "echo.py").write_text("def handle(ctx, d):\n    return d\n")
    for memory, want in (("100000Gi", "at most 1Ti"), ("512Gi", "more than this host has")):
        m.write_text(f"functions:\n  big:\n    runtime: python\n    handler: echo:handle\n    source: src\n"
                     f"    memory: {memory}\n")
        p = srv.cli("deploy", m)
        assert p.returncode != 0 and want in p.stderr, (memory, p.stderr)
    body = json.dumps({"functions": [{"name": "big", "runtime": "python", "handler": "echo:handle",
                                      "source": "sha256:" + "0" * 64, "memory_bytes": 2**64 - 1}]})
    r = request(srv.port, "POST", "/system/functions", body=body,
                headers={**srv.auth(), "Content-Type": "application/json"})
    check_error(r, 400, "bad_request", in_message="1Ti", call_id=False)
    assert srv.get("/system/functions/big").status == 404


# ---------------------------------------------------------------- one call's crash


def _exit_beside_neighbours(srv, function, says):
    """Three calls run while a fourth exits the process its own way: only
    the fourth fails, with a message naming the exit."""
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(4) as ex:
        ok = [ex.submit(srv.invoke, function, b"ok%d" % i) for i in range(3)]
        time.sleep(0.05)
        bad = ex.submit(srv.invoke, function, b"exit")
        assert [ok_body(f.result()) for f in ok] == [b"ok0", b"ok1", b"ok2"]
        check_error(bad.result(), 500, "function_error", in_message=says)


def test_sys_exit_fails_only_its_own_call(srv):
    _exit_beside_neighbours(srv, "neighbours", "sys.exit(3)")
    # Again and again: never mistaken for a launcher that cannot start.
    for _ in range(5):
        check_error(srv.invoke("neighbours", b"exit"), 500, "function_error")
    assert ok_body(srv.invoke("neighbours", b"fine")) == b"fine"


def test_a_crash_mid_call_is_not_called_a_crash_loop(srv):
    for _ in range(5):
        r = srv.invoke("neighbours", b"crash")
        check_error(r, 502, "worker_crashed")
        assert "keeps exiting" not in r.json()["error"]["message"], r
        wait_for(lambda: srv.function("neighbours")["status"]["launcher"] == "ready", timeout=10)
    r = srv.invoke("neighbours", b"fine")
    assert ok_body(r) == b"fine"
    assert "keeps exiting" not in srv.function("neighbours")["status"]["last_error"]


def test_a_function_cannot_choose_anothers_call_id(srv):
    out = ok_body(srv.invoke("neighbours", b"forge")).decode()
    assert out.startswith("bad_request") and "not worker" in out, out


# ---------------------------------------------------------------- recursion and cycles


@pytest.mark.parametrize("depth", [1, 5])
def test_self_recursion_runs_within_max_workers(srv, depth):
    t = time.monotonic()
    out = ok_body(srv.invoke("rec", str(depth).encode(), timeout=30))
    assert out == ",".join(str(d) for d in range(depth, -1, -1)).encode(), out
    assert time.monotonic() - t < 5


def test_recursion_deeper_than_max_workers_fails_at_once(srv):
    t = time.monotonic()
    out = ok_body(srv.invoke("rec", b"20", timeout=30)).decode()
    # Levels 20..13 hold all 8 workers; the 9th nested call is refused.
    assert out.endswith("call_cycle") and out.count(",") == 8, out
    assert time.monotonic() - t < 5
    # With room for every level, depth 20 runs.
    out = ok_body(srv.invoke("rec-wide", b"20", timeout=30)).decode()
    assert out == ",".join(str(d) for d in range(20, -1, -1)), out


def test_chains_that_hold_every_worker_between_them_are_broken_at_once(srv):
    """Two calls recurse side by side (3 levels below each, 4 workers
    each would need; max_workers 4): they end up holding 2 workers each,
    each waiting for a 5th. Neither chain alone holds them all, so neither
    call was refused on arrival; the engine sees that every worker waits on
    a queued call and refuses the newest of those, so that chain unwinds
    and the other finishes, long before the 20 s timeout."""
    from concurrent.futures import ThreadPoolExecutor
    t = time.monotonic()
    with ThreadPoolExecutor(2) as ex:
        futures = [ex.submit(srv.invoke, "rec-pair", b"3", timeout=30) for _ in range(2)]
        outs = sorted(ok_body(f.result()).decode() for f in futures)
    assert outs[0] == "3,2,1,0" and outs[1].endswith("call_cycle"), outs
    assert time.monotonic() - t < 6, outs
    assert "chains of calls hold every worker" in srv.log_path.read_text()


def test_call_cycles_run_and_runaway_ones_stop_at_the_depth_limit(srv):
    assert ok_body(srv.invoke("ping", b"3", timeout=30)) == b"ping,pong," * 3 + b"ping,pong"
    t = time.monotonic()
    out = ok_body(srv.invoke("ping", b"inf", timeout=30)).decode()
    assert out.endswith("call_depth_exceeded"), out
    assert out.count(",") == 32, out  # --max-call-depth 32
    assert time.monotonic() - t < 5
    # Everything is still served afterwards.
    assert ok_body(srv.invoke("rec", b"3", timeout=30)) == b"3,2,1,0"


# ---------------------------------------------------------------- dead and idle connections


def _closed_within(sock, seconds):
    sock.settimeout(seconds)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


def test_dead_and_idle_connections_are_bounded(tmp_path):
    fn = tmp_path / "fn"
    fn.mkdir()
    (fn / "echo.py").write_text((FUNCS / "py" / "echo.py").read_text())
    (fn / "staccato.yml").write_text("functions:\n  echo:\n    runtime: python\n    handler: echo:handle\n")
    with own_server(tmp_path / "srv", extra=["--max-connections", "50", "--idle-timeout-s", "3",
                                            "--isolation", "process"]) as s:
        s.deploy(fn)
        # Partial headers, then silence: closed at the timeout, not kept.
        slow = socket.create_connection(("127.0.0.1", s.port))
        slow.sendall(b"POST /function/echo HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        t = time.monotonic()
        assert _closed_within(slow, 10), "a half-sent request held its connection"
        assert 2 < time.monotonic() - t < 8
        # Fill the gateway with idle connections.
        idle = [socket.create_connection(("127.0.0.1", s.port)) for _ in range(60)]
        try:
            # Each gateway thread accepts from its own listener: wait until
            # the count is full before calling (it stays full until the idle
            # timeout), or the call may be accepted ahead of the idle ones.
            assert wait_for(lambda: "the limit (--max-connections)" in s.log_path.read_text(), timeout=2)
            r = s.invoke("echo", b"x")
            check_error(r, 503, "overloaded", in_message="--max-connections", call_id=False)
            # Management still gets through.
            assert s.get("/system/functions/echo").status == 200
            assert request(s.port, "GET", "/healthz").status == 200
            # The idle ones are closed at the timeout, and calls flow again.
            assert all(_closed_within(c, 10) for c in idle)
            assert ok_body(wait_for(lambda: (lambda r: r if r.status == 200 else None)(s.invoke("echo", b"y")),
                                    timeout=10)) == b"y"
        finally:
            for c in idle:
                c.close()


# ---------------------------------------------------------------- removal with calls in flight


def _slow_fn(tmp_path, name):
    d = tmp_path / name
    d.mkdir()
    (d / "slow.py").write_text("import asyncio\n\nasync def handle(ctx, data):\n"
                               "    await asyncio.sleep(float(data))\n    return b'done ' + data\n")
    (d / "staccato.yml").write_text(f"functions:\n  {name}:\n    runtime: python\n    handler: slow:handle\n"
                                    "    min_workers: 1\n    max_workers: 1\n    timeout: 10s\n")
    return d


def test_removal_drains_running_calls_and_answers_queued_ones(srv, tmp_path):
    from concurrent.futures import ThreadPoolExecutor
    d = _slow_fn(tmp_path, "doomed")
    srv.deploy(d)
    with ThreadPoolExecutor(4) as ex:
        first = ex.submit(srv.invoke, "doomed", b"1.0", timeout=20)
        time.sleep(0.2)
        queued = [ex.submit(srv.invoke, "doomed", b"1.0", timeout=20) for _ in range(2)]
        time.sleep(0.2)
        p = srv.cli("rm", "doomed")
        assert p.returncode == 0, p.stderr
        assert ok_body(first.result()) == b"done 1.0"  # it was running: it finished
        for f in queued:
            check_error(f.result(), 410, "function_removed", in_message="removed before the call ran")
    check_error(srv.invoke("doomed", b"0"), 404, "not_found")


def test_a_full_queue_is_answered_overloaded_at_once(srv, tmp_path):
    """Beyond max_queue a call is refused at once (503, Retry-After), not
    left to wait towards its timeout; the queue's own calls all finish."""
    from concurrent.futures import ThreadPoolExecutor
    d = _slow_fn(tmp_path, "narrow")
    yml = d / "staccato.yml"
    yml.write_text(yml.read_text() + "    max_queue: 2\n")
    srv.deploy(d)
    with ThreadPoolExecutor(6) as ex:
        running = ex.submit(srv.invoke, "narrow", b"1.5", timeout=20)
        time.sleep(0.3)
        queued = [ex.submit(srv.invoke, "narrow", b"0.1", timeout=20) for _ in range(2)]
        time.sleep(0.3)
        t0 = time.monotonic()
        refused = srv.invoke("narrow", b"0.1", timeout=20)
        waited = time.monotonic() - t0
        check_error(refused, 503, "overloaded", in_message="max_queue")
        assert refused.headers.get("retry-after") == "1", refused.headers
        assert waited < 1.0, waited  # the running call still has ~0.9 s to go
        assert ok_body(running.result()) == b"done 1.5"
        assert [ok_body(f.result()) for f in queued] == [b"done 0.1"] * 2
    assert ok_body(srv.invoke("narrow", b"0")) == b"done 0"


def test_a_redeploy_hands_queued_calls_to_the_new_version(srv, tmp_path):
    from concurrent.futures import ThreadPoolExecutor
    d = _slow_fn(tmp_path, "renewed")
    srv.deploy(d)
    with ThreadPoolExecutor(4) as ex:
        calls = [ex.submit(srv.invoke, "renewed", b"0.5", timeout=20) for _ in range(3)]
        time.sleep(0.2)
        (d / "slow.py").write_text("import asyncio\n\nasync def handle(ctx, data):\n"
                                   "    await asyncio.sleep(float(data))\n    return b'v2 ' + data\n")
        srv.deploy(d)
        bodies = [ok_body(f.result()) for f in calls]
    # One was running on the old version and finished there; the two queued
    # behind it (max_workers: 1) ran on the new one. None failed.
    assert sorted(bodies) == [b"done 0.5", b"v2 0.5", b"v2 0.5"], bodies


# ---------------------------------------------------------------- files a function leaves on the host


LITTER = """
import os


def handle(ctx, data):
    ipc = os.environ["STACCATO_IPC_DIR"]
    if data == b"root":
        # The directory holding the channels is the engine's.
        try:
            open(os.path.join(ipc, "junk"), "wb").close()
            return b"wrote"
        except PermissionError:
            return b"refused"
    if data == b"fill":
        # Beyond its memory limit, on the host's /dev/shm.
        with open(os.path.join(ipc, "shm", "junk"), "wb") as f:
            for _ in range(200):
                f.write(b"x" * (1 << 20))
        return b"wrote 200 MiB"
    if data == b"litter":
        with open(os.path.join(ipc, "shm", "litter"), "wb") as f:
            f.write(b"x" * (10 << 20))
        os.makedirs(os.path.join(ipc, "shm", "d"), exist_ok=True)
        os._exit(1)
    return b"ok"
"""


def test_files_a_function_writes_to_its_ipc_dir_count_and_go(srv, tmp_path):
    d = tmp_path / "litter"
    d.mkdir()
    (d / "litter.py").write_text(LITTER)
    (d / "staccato.yml").write_text("functions:\n  litter:\n    runtime: python\n    handler: litter:handle\n"
                                    "    memory: 64Mi\n")
    srv.deploy(d)

    def leftovers():
        return [p for p in srv.ipc_dir.glob("litter.*/**/*") if p.is_file() and not p.is_fifo()]

    assert ok_body(srv.invoke("litter", b"root", timeout=30)) == b"refused"
    r = srv.invoke("litter", b"fill", timeout=30)
    check_error(r, 502, "out_of_memory")
    assert wait_for(lambda: not leftovers(), timeout=10), leftovers()
    r = srv.invoke("litter", b"litter", timeout=30)
    check_error(r, 502, "worker_crashed")
    assert wait_for(lambda: not leftovers() and not list(srv.ipc_dir.glob("litter.*/shm/d")), timeout=10), leftovers()
    assert ok_body(wait_for(lambda: (lambda r: r if r.status == 200 else None)(srv.invoke("litter", b"x")),
                            timeout=10)) == b"ok"


CHATTY = """
import sys


def handle(ctx, data):
    chunk = b"y" * ((1 << 20) - 1) + b"\\n"
    for _ in range(int(data)):
        sys.stdout.buffer.write(chunk)
    sys.stdout.flush()
    return b"printed " + data + b" MiB"
"""


def test_a_function_cannot_fill_the_disk_with_its_log(srv, tmp_path):
    from concurrent.futures import ThreadPoolExecutor
    d = tmp_path / "chatty"
    d.mkdir()
    (d / "chatty.py").write_text(CHATTY)
    (d / "staccato.yml").write_text("functions:\n  chatty:\n    runtime: python\n    handler: chatty:handle\n")
    srv.deploy(d)
    log = srv.state_dir / "engine" / "logs" / "chatty.log"
    rotated = log.with_name("chatty.log.1")
    with ThreadPoolExecutor(4) as ex:
        chatty = [ex.submit(srv.invoke, "chatty", b"100", timeout=60) for _ in range(2)]
        echoes = [ex.submit(srv.invoke, "echo", b"e%d" % i, timeout=30) for i in range(40)]
        assert [ok_body(f.result()) for f in echoes] == [b"e%d" % i for i in range(40)]
        assert [ok_body(f.result()) for f in chatty] == [b"printed 100 MiB"] * 2
    # The drain says what it dropped at the next second.
    assert wait_for(lambda: "bytes of output dropped" in log.read_text(errors="replace"), timeout=5)
    on_disk = log.stat().st_size + (rotated.stat().st_size if rotated.exists() else 0)
    assert on_disk <= 20 << 20, on_disk  # 10 MiB and one rotated file, at 1 MiB/s
    assert on_disk < 10 << 20  # at 1 MiB/s, the few seconds this took
    # What it prints afterwards, at a sane rate, is kept; `staccato logs` shows it.
    assert ok_body(srv.invoke("chatty", b"0")) == b"printed 0 MiB"
    p = srv.cli("logs", "chatty", "--state-dir", srv.state_dir, "--lines", "3")
    assert p.returncode == 0 and "bytes of output dropped: more than 1048576 bytes in a second" in p.stdout, p


def test_process_exit_in_node_fails_only_its_own_call(srv):
    _exit_beside_neighbours(srv, "neighbours-node", "process.exit(3)")


def _leftovers(prefix):
    """What an engine with this container prefix has on the machine."""
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    spaces = [l.split()[0] for l in netns.splitlines() if l.startswith(f"stc-{prefix}-")]
    groups = cgroups.groups(prefix)
    tables = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
    return spaces, groups, f"staccato_{prefix}" in tables


def test_a_killed_engines_leftovers_go_when_any_engine_starts(tmp_path):
    """A SIGKILLed engine's namespaces, nft table and cgroups are removed by
    the next engine to start on the machine, whatever its state directory."""
    with own_server(tmp_path / "first") as first:
        pid = str(first.proc.pid)
        claims = [p for p in Path("/run/staccato/engines").glob("*.lock") if p.read_text().strip() == pid]
        prefixes = sorted(p.name[:-len(".lock")] for p in claims)
        assert len(prefixes) == 2, prefixes  # the function pool's and the builds'
        pool_prefix = next(p for p in prefixes if p.startswith("s"))
        # Its first containers' namespaces, cgroups and nft table, all of
        # them (a namespace comes before its container's cgroup: killing
        # the engine between the two left no cgroup to find, once).
        assert wait_for(lambda: all(_leftovers(pool_prefix)), 20), "the pool made no containers"
        first.stop(signal.SIGKILL)
    spaces, groups, table = _leftovers(pool_prefix)
    assert spaces and groups and table, "SIGKILL should have left things behind"
    with own_server(tmp_path / "second"):
        for prefix in prefixes:
            assert _leftovers(prefix) == ([], [], False), prefix
            assert not (Path("/run/staccato/engines") / f"{prefix}.lock").exists()
