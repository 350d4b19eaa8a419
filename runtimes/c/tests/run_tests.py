#!/usr/bin/env python3
"""Runs the C runtime's tests (used by `make test`): the codec test binary
against the shared vectors, then the live host tests under pytest.  Prints,
as its last line, "N passed, N failed" summed over both."""
import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


class Counter:
    """pytest plugin counting test outcomes (setup/teardown errors count as failures)."""

    def __init__(self):
        self.passed = self.failed = 0

    def pytest_runtest_logreport(self, report):
        if report.when == "call" and report.passed:
            self.passed += 1
        elif report.failed:
            self.failed += 1


def run_wire(binary, vectors):
    proc = subprocess.run([binary, vectors], capture_output=True, text=True)
    sys.stdout.write(proc.stdout)
    sys.stderr.write(proc.stderr)
    lines = proc.stdout.strip().splitlines()
    m = re.fullmatch(r"(\d+) passed, (\d+) failed", lines[-1]) if lines else None
    if not m:
        print(f"{binary} did not report its results (exit status {proc.returncode})")
        return 0, 1
    return int(m[1]), int(m[2])


def contract_tables(contract):
    """What the compiled program cannot see: the error kind macros of the
    public header and the limit of the codec, and the STACCATO_* variables
    the runtime's sources read.  Yields each difference."""
    root = HERE.parent
    header = (root / "include" / "staccato.h").read_text()
    ours = {int(code): name.lower() for name, code in re.findall(r"#define STACCATO_ERR_(\w+) (\d+)", header)}
    want = {k["code"]: k["name"] for k in contract["error_kinds"]}
    if ours != want:
        yield f"staccato.h error kinds {ours} != the contract's {want}"
    m = re.search(r"#define STC_ERROR_KIND_MAX (\d+)", (root / "src" / "wire.h").read_text())
    if not m or int(m[1]) != max(want):
        yield f"STC_ERROR_KIND_MAX is {m and m[1]}, the contract's highest code is {max(want)}"
    allowed = set(contract["env"]["launcher"]) | set(contract["env"]["runtime"]["c"])
    used = set()
    for f in (root / "src").glob("*.c"):
        used |= set(re.findall(r'"(STACCATO_[A-Z0-9_]+)"', f.read_text()))
    if not used:
        yield "the environment scan found nothing: it is broken"
    for name in sorted(used - allowed):
        yield f"the C runtime reads {name}, which testvectors/contract_v1.json does not list"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--wire", required=True)
    ap.add_argument("--vectors", required=True)
    ap.add_argument("--host", required=True)
    ap.add_argument("--handler", required=True)
    ap.add_argument("--nosym", required=True)
    ap.add_argument("--contract-program", required=True)
    ap.add_argument("--contract", required=True)
    args = ap.parse_args()

    print("== test_wire")
    wire_passed, wire_failed = run_wire(args.wire, args.vectors)

    print("== test_contract")
    p, f = run_wire(args.contract_program, args.contract)
    wire_passed, wire_failed = wire_passed + p, wire_failed + f
    for problem in contract_tables(json.loads(Path(args.contract).read_text())):
        print(f"FAIL {problem}")
        wire_failed += 1

    print("== test_host.py")
    os.environ.update(STACCATO_C_HOST=str(Path(args.host).resolve()),
                      STACCATO_C_HANDLER=str(Path(args.handler).resolve()),
                      STACCATO_C_NOSYM=str(Path(args.nosym).resolve()))
    sys.dont_write_bytecode = True
    counter = Counter()
    pytest.main(["-q", "-p", "no:cacheprovider", str(HERE / "test_host.py")], plugins=[counter])

    passed, failed = wire_passed + counter.passed, wire_failed + counter.failed
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
