"""Live tests of the C++ layer (include/staccato.hpp): handlers written in
C++, built the way the engine builds them, run in the C runtime's host while
this file plays the engine with real FIFOs -- the fake engine of
runtimes/c/tests/test_host.py, reused.

Paths come from the environment (the Makefile sets them), defaulting to the
build directories:
  STACCATO_C_HOST        runtimes/c/build/staccato-c-host
  STACCATO_CPP_BUILD     runtimes/cpp/build (test_handler.so, vec_handler.so, void_handler.so)
"""
import json
import os
import random
import re
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "c" / "tests"))

from test_host import (  # noqa: E402  (the path above)
    COMPLETION, DISPATCH, FAILURE, GW, INLINE_MAX, INVOKE, SHM, Engine, FUNCTION, call, pattern,
    shm_file, wait_for)

BUILD = Path(os.environ.get("STACCATO_CPP_BUILD", HERE.parent / "build"))
HANDLER = BUILD / "test_handler.so"

# The error kinds are the contract's (testvectors/contract_v1.json): every
# code must come out of the C++ API (CallError::kind) under its name.
CONTRACT = json.loads((HERE.parents[2] / "testvectors" / "contract_v1.json").read_text())
KIND_NAMES = {k["code"]: k["name"] for k in CONTRACT["error_kinds"]}


def start(tmp_path, handler=HANDLER, **kw):
    eng = Engine(tmp_path, handler=handler, **kw)
    eng.handshake()
    ch, _ = eng.create_worker(1)
    return eng, ch


@pytest.fixture
def worker(tmp_path):
    eng, ch = start(tmp_path)
    yield eng, ch
    eng.close()


def payload(engine, res):
    """The payload of the worker's Completion/Failure, inline or from its shm file."""
    if not res.flags & SHM:
        return res.inline
    path = shm_file(engine.ipc, res.call_id, "o")
    data = path.read_bytes()
    path.unlink()
    return data


# ---- dispatch ------------------------------------------------------------------

@pytest.mark.parametrize("size", [0, 5, INLINE_MAX])
def test_echo_inline(worker, size):
    _, ch = worker
    data = pattern(size)
    res = call(ch, data, call_id=GW | 7)
    assert (res.kind, res.flags, res.call_id, res.error_kind, res.inline) == (COMPLETION, 0, GW | 7, 0, data)


def test_echo_1mib_through_shm_both_ways(worker):
    engine, ch = worker
    data = os.urandom(1 << 20).replace(b"!", b"?")  # no leading '!' command
    inp = shm_file(engine.ipc, GW | 3, "i")
    inp.write_bytes(data)
    res = call(ch, flags=SHM, payload_len=len(data), call_id=GW | 3)
    assert (res.kind, res.flags, res.payload_len) == (COMPLETION, SHM, len(data))
    assert not inp.exists()
    assert payload(engine, res) == data


def test_exception_is_a_function_error_with_what(worker):
    _, ch = worker
    res = call(ch, b"!throw:it broke", call_id=GW | 5)
    assert (res.kind, res.call_id, res.error_kind, res.inline) == (FAILURE, GW | 5, 3, b"it broke")


def test_non_std_exception(worker):
    _, ch = worker
    res = call(ch, b"!throwint")
    assert (res.kind, res.error_kind, res.inline) == (FAILURE, 3, b"unknown C++ exception")


def test_worker_survives_exceptions(worker):
    _, ch = worker
    for i in range(3):
        assert call(ch, b"!throw:x", call_id=GW | (10 + i)).kind == FAILURE
        assert call(ch, b"fine", call_id=GW | (20 + i)).inline == b"fine"


def test_context_accessors(worker):
    _, ch = worker
    deadline = time.time_ns() // 1000 + 10_000_000
    res = call(ch, b"!info", call_id=(3 << 32) | 9, parent_call_id=GW | 1, deadline_us=deadline)
    m = re.fullmatch(rb"call=([0-9a-f]{16}) parent=([0-9a-f]{16}) deadline=(\d+) remaining=(\d+)", res.inline)
    assert m, res.inline
    assert int(m[1], 16) == (3 << 32) | 9 and int(m[2], 16) == GW | 1
    assert int(m[3]) == deadline and 0 < int(m[4]) <= 10_000_000
    assert call(ch, b"!info", deadline_us=1).inline.endswith(b"remaining=0")
    assert call(ch, b"!info").inline.endswith(b"parent=0000000000000000 deadline=none remaining=none")


def test_log(worker):
    engine, ch = worker
    assert call(ch, b"!log:hello there", call_id=GW | 0xAB).inline == b"logged"
    prefix = f"[{FUNCTION} {GW | 0xAB:016x}] "
    assert wait_for(lambda: prefix + "hello there\n" in engine.stderr())
    assert wait_for(lambda: prefix + "n=42 pi=3.5 s=str\n" in engine.stderr())


def test_vector_handler_with_byte_input(tmp_path):
    eng, ch = start(tmp_path, handler=BUILD / "vec_handler.so")
    try:
        data = bytes(range(256)) * 3
        res = call(ch, data[:INLINE_MAX])
        assert (res.kind, res.inline) == (COMPLETION, data[:INLINE_MAX][::-1])
        res = call(ch, b"", call_id=GW | 2)
        assert (res.kind, res.payload_len) == (COMPLETION, 0)
        big = os.urandom(5000)
        shm_file(eng.ipc, GW | 3, "i").write_bytes(big)
        res = call(ch, flags=SHM, payload_len=len(big), call_id=GW | 3)
        assert (res.kind, res.flags) == (COMPLETION, SHM)
        assert payload(eng, res) == big[::-1]
    finally:
        eng.close()


def test_void_handler(tmp_path):
    eng, ch = start(tmp_path, handler=BUILD / "void_handler.so")
    try:
        res = call(ch, b"abc", call_id=GW | 4)
        assert (res.kind, res.payload_len) == (COMPLETION, 0)
        assert wait_for(lambda: f"[{FUNCTION} {GW | 4:016x}] got 3 bytes\n" in eng.stderr())
    finally:
        eng.close()


# ---- internal calls --------------------------------------------------------------

@pytest.mark.parametrize("cmd", [b"!call", b"!callbytes"])
def test_call_sends_invoke_and_returns_the_answer(worker, cmd):
    _, ch = worker
    deadline = time.time_ns() // 1000 + 10_000_000
    ch.send(DISPATCH, cmd + b":echo:ping", call_id=GW | 10, deadline_us=deadline)
    inv = ch.recv()
    assert (inv.kind, inv.flags, inv.worker_id, inv.call_id) == (INVOKE, 0, 1, (1 << 32) | 1)
    assert (inv.parent_call_id, inv.deadline_us) == (GW | 10, deadline)
    assert (inv.name_len, inv.inline) == (4, b"echoping")
    ch.send(COMPLETION, b"pong", call_id=inv.call_id)
    res = ch.recv()
    assert (res.kind, res.call_id, res.inline) == (COMPLETION, GW | 10, b"ok:pong")


def test_call_with_shm_input_and_output(worker):
    engine, ch = worker
    big_in = b"x" * 2000
    cmd = b"!call:echo:" + big_in
    shm_file(engine.ipc, GW | 11, "i").write_bytes(cmd)
    ch.send(DISPATCH, flags=SHM, payload_len=len(cmd), call_id=GW | 11)
    inv = ch.recv()
    assert (inv.kind, inv.flags, inv.inline, inv.payload_len) == (INVOKE, SHM, b"echo", 2000)
    inp = shm_file(engine.ipc, inv.call_id, "i")
    assert inp.read_bytes() == big_in
    inp.unlink()
    out = os.urandom(3000)
    shm_file(engine.ipc, inv.call_id, "o").write_bytes(out)
    ch.send(COMPLETION, flags=SHM, payload_len=len(out), call_id=inv.call_id)
    res = ch.recv()
    assert payload(engine, res) == b"ok:" + out


@pytest.mark.parametrize("code", sorted(KIND_NAMES))
def test_call_error_kind_mapping(worker, code):
    _, ch = worker
    ch.send(DISPATCH, b"!call:f:x", call_id=GW | 12)
    inv = ch.recv()
    ch.send(FAILURE, b"callee says %d" % code, call_id=inv.call_id, error_kind=code)
    res = ch.recv()
    want = f"err:{KIND_NAMES[code]}:{code}:callee says {code}".encode()
    assert (res.kind, res.inline) == (COMPLETION, want)


def test_uncaught_call_error_fails_the_invocation(worker):
    _, ch = worker
    ch.send(DISPATCH, b"!rethrow:missing:x", call_id=GW | 13)
    inv = ch.recv()
    ch.send(FAILURE, b"no function named 'missing'", call_id=inv.call_id, error_kind=1)
    res = ch.recv()
    assert (res.kind, res.call_id, res.error_kind, res.inline) == (FAILURE, GW | 13, 3, b"no function named 'missing'")


def test_local_call_errors(worker):
    _, ch = worker
    res = call(ch, b"!call:" + b"f" * 65 + b":x")
    assert res.kind == COMPLETION and res.inline.startswith(b"err:bad_request:7:"), res.inline
    res = call(ch, b"!call:" + b"f" * 64 + b":x", call_id=GW | 2, deadline_us=1)  # long past
    assert res.inline.startswith(b"err:timeout:5:"), res.inline


@pytest.mark.parametrize("cmd", [b"!async", b"!threads"])
def test_16_concurrent_calls_answered_out_of_order(worker, cmd):
    _, ch = worker
    ch.send(DISPATCH, cmd + b":16:echo", call_id=GW | 14)
    invokes = [ch.recv() for _ in range(16)]  # all 16 in flight before any answer
    assert all((inv.kind, inv.parent_call_id) == (INVOKE, GW | 14) for inv in invokes)
    assert sorted(inv.call_id for inv in invokes) == [(1 << 32) | seq for seq in range(1, 17)]
    assert sorted(inv.inline for inv in invokes) == sorted(b"echo%d" % i for i in range(16))
    random.Random(14).shuffle(invokes)
    for inv in invokes:
        i = int(inv.inline[4:])
        if cmd == b"!threads" and i == 5:
            ch.send(FAILURE, b"nope", call_id=inv.call_id, error_kind=5)
        else:
            ch.send(COMPLETION, b"r%d" % i, call_id=inv.call_id)
    res = ch.recv()
    want = [b"r%d" % i for i in range(16)]
    if cmd == b"!threads":
        want[5] = b"err:timeout"
    assert (res.kind, res.call_id, res.inline) == (COMPLETION, GW | 14, b",".join(want))


def test_async_call_failure_propagates_through_future(worker):
    _, ch = worker
    ch.send(DISPATCH, b"!async:4:echo", call_id=GW | 15)
    invokes = [ch.recv() for _ in range(4)]
    for inv in reversed(invokes):
        if inv.inline == b"echo2":
            ch.send(FAILURE, b"callee crashed", call_id=inv.call_id, error_kind=4)
        else:
            ch.send(COMPLETION, b"ok", call_id=inv.call_id)
    res = ch.recv()
    assert (res.kind, res.error_kind, res.inline) == (FAILURE, 3, b"callee crashed")
