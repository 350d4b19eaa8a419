#!/usr/bin/env python3
"""Internal calls between languages: every caller -> callee pair of the
bench functions (bench/functions/<lang>), timed inside the caller, so a
language's cost as a caller and as a callee show apart (C -> Python is
Python's callee side, Python -> C its caller side).

    python3 bench/cross_lang.py [--binary target/release/staccato] [--langs c python]
                                [--modes pinned default] [--calls 5000] [--rounds 3]

Each round starts its own `staccato up` per placement on a free loopback
port (pinned: everything on the first allowed CPU, as `bench micro`
pins it; default: the kernel places the processes), deploys the
languages' bench functions and runs every pair once, in turn; the table
gives the median over rounds of each pair's p50 (and p99) in µs, and
each p50 as a multiple of C -> C in the same round."""
import argparse
import os
import statistics
import struct
import subprocess
import sys
import urllib.request
from pathlib import Path

import up

ROOT = Path(__file__).resolve().parent.parent


def invoke(port, name, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/function/{name}", data=body, method="POST")
    with urllib.request.urlopen(req, timeout=300) as r:
        return r.read()


def pct(v, p):
    return v[min(len(v) - 1, int(len(v) * p / 100))]


def one_round(a, pinned):
    """{(caller, callee): (p50 µs, p99 µs)} for one `staccato up`."""
    first_cpu = min(os.sched_getaffinity(0))
    pre = ["taskset", "-c", str(first_cpu)] if pinned else []
    out = {}
    with up.private(a.binary, prefix=pre) as env:
        port = int(env["STACCATO_GATEWAY"].rsplit(":", 1)[1])
        for lang in a.langs:
            subprocess.run(pre + [a.binary, "deploy", str(ROOT / "bench" / "functions" / lang)], env=env,
                           check=True, stdout=subprocess.DEVNULL)
        for caller in a.langs:
            for callee in a.langs:
                c, n = f"bench-caller-{caller}", f"bench-nop-{callee}"
                invoke(port, c, f"{max(1, a.calls // 10)}:{n}".encode())  # warm-up
                raw = invoke(port, c, f"{a.calls}:{n}".encode())
                v = sorted(struct.unpack(f"<{len(raw) // 4}I", raw))
                out[(caller, callee)] = (pct(v, 50) / 1000, pct(v, 99) / 1000)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--binary", default=str(ROOT / "target" / "release" / "staccato"))
    ap.add_argument("--langs", nargs="+", default=["c", "python"])
    ap.add_argument("--modes", nargs="+", default=["pinned", "default"], choices=["pinned", "default"])
    ap.add_argument("--calls", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    if "c" not in a.langs:
        ap.error("--langs must include c (the other pairs are given as multiples of C -> C)")
    results = {m: [] for m in a.modes}
    for r in range(a.rounds):
        for mode in a.modes:
            res = one_round(a, mode == "pinned")
            results[mode].append(res)
            line = ", ".join(f"{x}->{y} {p50:.1f}" for (x, y), (p50, _) in res.items())
            print(f"round {r + 1} {mode}: {line}", file=sys.stderr, flush=True)
    print(f"\ninternal nop call p50 / p99 µs, median of {a.rounds} rounds ({a.calls} calls each); "
          "in brackets the median of each round's p50 over its C -> C p50")
    print("| caller -> callee | " + " | ".join(a.modes) + " |")
    print("|---|" + "---:|" * len(a.modes))
    for caller in a.langs:
        for callee in a.langs:
            cells = []
            for mode in a.modes:
                rs = results[mode]
                p50 = statistics.median(x[(caller, callee)][0] for x in rs)
                p99 = statistics.median(x[(caller, callee)][1] for x in rs)
                ratio = statistics.median(x[(caller, callee)][0] / x[("c", "c")][0] for x in rs)
                cells.append(f"{p50:.1f} / {p99:.1f} ({ratio:.2f}x)")
            print(f"| {caller} -> {callee} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
