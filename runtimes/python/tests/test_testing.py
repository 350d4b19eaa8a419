"""staccato.testing: handlers run in a unit test as the runtime runs them,
and the package installs on its own (pyproject.toml)."""
import asyncio
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from staccato import CallError, Context
from staccato.testing import FakeCalls, run_handler

RUNTIME = Path(__file__).resolve().parent.parent


def test_a_sync_and_an_async_handler_and_what_they_may_return():
    assert run_handler(lambda ctx, data: data.upper(), b"abc") == b"ABC"

    async def handle(ctx, data):
        await asyncio.sleep(0)
        return "é" + data.decode()
    assert run_handler(handle, "x") == "éx".encode()
    assert run_handler(lambda ctx, data: None) == b""
    assert run_handler(lambda ctx, data: bytearray(b"ba")) == b"ba"
    with pytest.raises(TypeError, match="returned int"):
        run_handler(lambda ctx, data: 42)


def test_the_context_is_a_real_one():
    seen = {}

    def handle(ctx, data):
        seen.update(ctx=ctx, function=ctx.function, call_id=ctx.call_id, parent=ctx.parent_call_id,
                    remaining=ctx.remaining(), deadline=ctx.deadline)
        ctx.logger.info("logged")
        return b""
    run_handler(handle, function="greet", timeout_s=5, call_id=77)
    assert isinstance(seen["ctx"], Context)
    assert (seen["function"], seen["call_id"], seen["parent"]) == ("greet", 77, 0)
    assert 4 < seen["remaining"] <= 5 and abs(seen["deadline"] - time.time() - 5) < 1
    run_handler(lambda ctx, data: seen.update(none=(ctx.deadline, ctx.remaining())))
    assert seen["none"] == (None, None)


def test_calls_are_answered_by_the_fakes_and_recorded():
    async def handle(ctx, data):
        a, b = await asyncio.gather(ctx.call("upper", data), ctx.call("fixed", b""))
        try:
            await ctx.call("down", b"?")
        except CallError as e:
            c = e.kind.encode()
        try:
            await ctx.call("nobody")
        except CallError as e:
            d = e.kind.encode()
        return b"|".join([a, b, c, d])

    async def upper(data):
        return data.upper()
    calls = FakeCalls({"upper": upper, "fixed": b"F", "down": CallError("timeout", "too slow")})
    assert run_handler(handle, b"hi", calls=calls) == b"HI|F|timeout|not_found"
    assert sorted(calls.made) == [("down", b"?"), ("fixed", b""), ("nobody", b""), ("upper", b"hi")]
    # A dict is enough when the calls need not be looked at.
    assert run_handler(lambda ctx, d: ctx.call("x", d), b"1", calls={"x": lambda d: d + b"2"}) == b"12"


def test_a_handler_that_raises_or_overruns_fails_the_test():
    def bad(ctx, data):
        raise ValueError("boom")
    with pytest.raises(ValueError, match="boom"):
        run_handler(bad)

    async def slow(ctx, data):
        await asyncio.sleep(5)
    with pytest.raises(asyncio.TimeoutError):
        run_handler(slow, timeout_s=0.05)


def test_the_package_installs_from_the_repository_and_brings_the_helper(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    # From a copy: a build in place would leave build/ and *.egg-info in the repository.
    src = tmp_path / "src"
    shutil.copytree(RUNTIME, src, ignore=shutil.ignore_patterns("tests", "build", "*.egg-info", "__pycache__"))
    r = subprocess.run([*pip, str(src)], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    code = ("from staccato.testing import run_handler; import staccato, pathlib; "
            "assert pathlib.Path(staccato.__file__).parent.joinpath('py.typed').exists(); "
            "print(run_handler(lambda c, d: d[::-1], b'abc').decode())")
    r = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True, cwd=tmp_path,
                       env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert r.returncode == 0 and r.stdout.strip() == "cba", r


def test_a_trace_context_can_be_given():
    def handle(ctx, data):
        return f"{ctx.trace_id} {ctx.traceparent} {ctx.tracestate}"

    tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    out = run_handler(handle, traceparent=tp, tracestate="k=v")
    assert out == f"4bf92f3577b34da6a3ce929d0e0e4736 {tp} k=v".encode()
    assert run_handler(handle) == b"None None None"
    with pytest.raises(ValueError, match="traceparent"):
        run_handler(handle, traceparent="00-short")
