#!/usr/bin/env python3
"""Worker ready after a redeploy (issue 14), interleaved between builds:
for each round and each variant, a fresh `staccato up` (pinned to one
vCPU with --pinned, as `bench micro`'s pinned placement), a language's
bench functions deployed, then --redeploys redeploys of them, each
followed by the engine's own figure for the nop's first worker (asking
its launcher for a worker -> the worker's hello, `worker_ready_us`) and
the time the deploy command took.

    python3 bench/redeploy_ab.py --variant NAME=BINARY[,UP_ARG...] [--variant ...]
                                 [--rounds 3] [--redeploys 10] [--lang node] [--pinned]

Each `staccato up` gets a free loopback port and a state directory of its
own, and is stopped after its run."""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import up

ROOT = Path(__file__).resolve().parent.parent


def run(cmd, env):
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout}{p.stderr}")


def ready_us(port, token, name):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/system/functions/{name}",
                                 headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.load(r)["status"]["scheduler"]["worker_ready_us"]


def one_run(binary, up_args, a):
    functions = ROOT / "bench" / "functions" / a.lang
    nop = f"bench-nop-{a.lang}"
    pin = ["taskset", "-c", str(min(os.sched_getaffinity(0)))] if a.pinned else []
    ready, took = [], []
    with up.private(binary, up_args, prefix=pin, extra_env={"STACCATO_RUNTIMES": str(ROOT / "runtimes")}) as env:
        port = env["STACCATO_GATEWAY"].rsplit(":", 1)[1]
        run([*pin, binary, "deploy", str(functions)], env)
        for _ in range(a.redeploys):
            # Let the pool refill and the old version go, as bench micro does.
            time.sleep(1.5)
            t0 = time.monotonic()
            run([*pin, binary, "deploy", str(functions)], env)
            took.append((time.monotonic() - t0) * 1e3)
            deadline = time.monotonic() + 5
            while not (r := ready_us(port, env["STACCATO_TOKEN"], nop)) and time.monotonic() < deadline:
                time.sleep(0.02)
            if not r:
                sys.exit(f"{nop}: no worker became ready after a redeploy")
            ready.append(r[0])
    return ready, took


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variant", action="append", required=True, help="NAME=BINARY[,UP_ARG...]")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--redeploys", type=int, default=10)
    ap.add_argument("--lang", default="node")
    ap.add_argument("--pinned", action="store_true", help="everything on one vCPU")
    a = ap.parse_args()
    variants = []
    for v in a.variant:
        name, _, rest = v.partition("=")
        binary, *up = rest.split(",")
        variants.append((name, str(Path(binary).resolve()), up))
    res = {name: [] for name, _, _ in variants}
    for r in range(a.rounds):
        for name, binary, up in variants:
            ready, took = one_run(binary, up, a)
            res[name].append((ready, took))
            print(f"round {r + 1} {name}: worker ready p50 {statistics.median(ready):.0f} us "
                  f"(each: {' '.join(str(x) for x in ready)}); deploy p50 {statistics.median(took):.0f} ms",
                  flush=True)
    print(f"\n{a.lang}{' pinned' if a.pinned else ''}: worker ready µs over all redeploys, deploy ms")
    for name, _, _ in variants:
        ready = sorted(x for rd, _ in res[name] for x in rd)
        took = [x for _, t in res[name] for x in t]
        rounds = " / ".join(f"{statistics.median(rd):.0f}" for rd, _ in res[name])
        p90 = ready[max(0, math.ceil(0.9 * len(ready)) - 1)]  # nearest rank
        print(f"{name:>10}: ready p50 {statistics.median(ready):.0f}, p90 {p90:.0f}, "
              f"max {ready[-1]} (round p50s {rounds}); deploy p50 {statistics.median(took):.0f} ms")


if __name__ == "__main__":
    main()
