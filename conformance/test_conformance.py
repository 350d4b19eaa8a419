"""The shared conformance suite (conformance/README.md): the same checks for
every language runtime, vectors first, then live against a real engine.

Run: python3 -m pytest -q conformance
"""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from harness import HEX16, Server, check_error, ok_body, traces, wait_for  # noqa: E402

LANGS = ["python", "c", "node", "go", "cpp"]
CONFIG = json.loads((REPO / "conformance" / "langs.json").read_text())
VECTORS = REPO / "testvectors" / "message_v1.json"


# ---------------------------------------------------------------- 1. vectors


def run_vector_program(lang):
    cfg = CONFIG[lang]
    if "build" in cfg:
        (REPO / "build").mkdir(exist_ok=True)
        b = subprocess.run(cfg["build"], cwd=REPO, capture_output=True, text=True, timeout=300)
        assert b.returncode == 0, f"building the {lang} vector program failed:\n{b.stdout}\n{b.stderr}"
    p = subprocess.run([*cfg["vectors"], str(VECTORS)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, f"{lang} vector program exited {p.returncode}:\n{p.stderr}"
    out = {}
    for line in p.stdout.splitlines():
        if line.strip():
            r = json.loads(line)
            out[r["tcId"]] = r
    return out


@pytest.mark.parametrize("lang", LANGS)
def test_vectors(lang):
    doc = json.loads(VECTORS.read_text())
    got = run_vector_program(lang)
    assert len(got) == doc["numberOfTests"], f"{lang}: {len(got)} results for {doc['numberOfTests']} cases"
    for t in doc["tests"]:
        r = got[t["tcId"]]
        where = f"{lang}, tcId {t['tcId']} ({t['comment']})"
        if t["result"] == "valid":
            assert r["decoded"] is True, f"{where}: rejected a valid message: {r.get('error')}"
            assert r["fields"] == t["fields"], f"{where}: decoded fields differ"
            assert r["reencoded"] == t["msg"], f"{where}: re-encoding differs"
        else:
            assert r["decoded"] is False, f"{where}: accepted an invalid message"


# ---------------------------------------------------------------- 2. live


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = Server(tmp_path_factory.mktemp("conformance"))
    srv.start()
    srv.deploy_errors = {}
    yield srv
    srv.cleanup()


@pytest.fixture
def fn(server, lang):
    """Deploys the language's conformance functions once; returns a namer."""
    if lang not in server.deploy_errors:
        p = server.cli("deploy", REPO / "conformance" / "functions" / lang, timeout=600)
        server.deploy_errors[lang] = None if p.returncode == 0 else f"{p.stdout}\n{p.stderr}"
    err = server.deploy_errors[lang]
    assert err is None, f"deploying the {lang} conformance functions failed:\n{err}"
    return lambda role: f"conf-{lang}-{role}"


live = pytest.mark.parametrize("lang", LANGS)


@live
def test_nop(server, fn):
    assert ok_body(server.invoke(fn("nop"), b"ignored")) == b""


@live
@pytest.mark.parametrize("size", [0, 960, 961, 1 << 20])
def test_echo_external_and_internal(server, fn, size):
    data = os.urandom(size)
    assert ok_body(server.invoke(fn("echo"), data, timeout=30)) == data
    # Through an internal call: the caller's runtime sends it, the callee's
    # echoes it, both directions inline or in shared memory by size.
    call_input = fn("echo").encode() + b":" + data
    assert ok_body(server.invoke(fn("call"), call_input, timeout=30)) == data


@live
def test_fail_is_a_function_error(server, fn):
    check_error(server.invoke(fn("fail"), b"boom"), 500, "function_error", in_message="conformance failure: boom")


@live
def test_callee_errors_surface_with_their_kind(server, fn):
    missing = json.loads(ok_body(server.invoke(fn("call"), b"conf-nope-missing:x")))
    assert missing["error_kind"] == "not_found", missing
    failed = json.loads(ok_body(server.invoke(fn("call"), fn("fail").encode() + b":why")))
    assert failed["error_kind"] == "function_error", failed
    assert "conformance failure: why" in failed["message"], failed


@live
def test_context_fields(server, fn):
    before_us = time.time() * 1e6
    r = server.invoke(fn("deadline"))
    d = json.loads(ok_body(r))
    assert d["call_id"] == r.headers["x-call-id"], (d, r.headers)
    assert d["parent_call_id"] == "0" * 16, d  # an external call has no parent
    # deploy sets timeout: 60s for the deadline function
    assert before_us + 50e6 < d["deadline_us"] <= time.time() * 1e6 + 60e6 + 1e5, d
    assert 50_000 < d["remaining_ms"] <= 60_000, d


@live
def test_deadline_propagates_to_callee(server, fn):
    before_us = time.time() * 1e6
    r = server.invoke(fn("chain-deadline"))
    d = json.loads(ok_body(r))
    outer = r.headers["x-call-id"]
    assert HEX16.fullmatch(d["call_id"]) and d["call_id"] != outer, d
    assert d["parent_call_id"] == outer, (d, outer)
    # The caller has a 5 s timeout; the callee's own is 60 s; it gets ≤ 5 s.
    assert d["deadline_us"] <= before_us + 5e6 + 2e5, d
    assert 0 < d["remaining_ms"] <= 5_000, d


@live
def test_fanout_sixteen_concurrent_calls(server, fn):
    r = server.invoke(fn("fanout"), b"", timeout=30)
    assert json.loads(ok_body(r)) == [str(i) for i in range(16)]
    children = [t for t in traces(server, fn("echo")) if t["parent_call_id"] == r.headers["x-call-id"]]
    assert len(children) == 16, children


@live
def test_logger_reaches_staccato_logs(server, fn):
    marker = f"m{os.getpid()}-{time.monotonic_ns()}"
    assert ok_body(server.invoke(fn("log"), marker.encode())) == b"ok"

    def logged():
        p = server.cli("logs", fn("log"), "--state-dir", server.state_dir)
        return p if f"conformance log {marker}" in p.stdout else None
    assert wait_for(logged, timeout=3.0), server.cli("logs", fn("log"), "--state-dir", server.state_dir).stdout
