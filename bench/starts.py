#!/usr/bin/env python3
"""Functions started at once (issue 14): N new functions deployed together,
each by its own `staccato deploy`, through the engine (its supervisor and
the isolation pool), not around it as `bench coldstart` does. A deploy
returns once the function's launcher said hello, so its duration is the
start as a user sees it. Reports, per N, the median deploy and the
makespan (first deploy sent to last one answered), medians over rounds.

    python3 bench/starts.py [--binary target/release/staccato] [--sizes 1 4 8] [--rounds 3] [--runtime python]

Starts its own `staccato up` on a free loopback port with the default
settings (containers, a pool of 4) and stops it at the end."""
import argparse
import concurrent.futures as cf
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import up

ROOT = Path(__file__).resolve().parent.parent
SOURCES = {
    "python": ("handler.py", "def handle(ctx, data):\n    return data\n", "handler:handle"),
    "node": ("handler.mjs", "export function handle(ctx, data) { return data; }\n", "handler.mjs:handle"),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--binary", default=str(ROOT / "target" / "release" / "staccato"))
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 4, 8])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--runtime", choices=sorted(SOURCES), default="python")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp, up.private(a.binary) as env:
        file, source, handler = SOURCES[a.runtime]
        dirs = []
        for i in range(max(a.sizes)):
            d = Path(tmp) / f"f{i}"
            d.mkdir()
            (d / file).write_text(source)
            (d / "staccato.yml").write_text(
                f"version: 1\nfunctions:\n  starts-{i}:\n    runtime: {a.runtime}\n    handler: {handler}\n"
                f"    min_workers: 1\n")
            dirs.append(d)

        def deploy(d):
            t0 = time.perf_counter()
            r = subprocess.run([a.binary, "deploy", str(d)], env=env, capture_output=True, text=True)
            if r.returncode != 0:
                raise RuntimeError(f"deploying {d.name}: {r.stderr.strip()}")
            return t0, time.perf_counter()

        rows = {}
        for r in range(a.rounds):
            for n in a.sizes:
                for i in range(n):
                    subprocess.run([a.binary, "rm", f"starts-{i}"], env=env, capture_output=True)
                time.sleep(2)  # the pool refills after the removals
                with cf.ThreadPoolExecutor(n) as ex:
                    spans = list(ex.map(deploy, dirs[:n]))
                each = [t1 - t0 for t0, t1 in spans]
                makespan = max(t1 for _, t1 in spans) - min(t0 for t0, _ in spans)
                rows.setdefault(n, []).append((statistics.median(each), makespan))
                print(f"round {r + 1}: {n:3d} deploys: median {statistics.median(each) * 1000:6.0f} ms, "
                      f"all done in {makespan * 1000:6.0f} ms", file=sys.stderr, flush=True)
        print(f"\nN {a.runtime} functions deployed at once (medians of {a.rounds} rounds):")
        print("| N | deploy, median | all deployed |")
        print("|---:|---:|---:|")
        for n, v in rows.items():
            print(f"| {n} | {statistics.median(x[0] for x in v) * 1000:.0f} ms "
                  f"| {statistics.median(x[1] for x in v) * 1000:.0f} ms |")


if __name__ == "__main__":
    main()
