#!/usr/bin/env python3
"""The moderate mixed load (issue 14), interleaved between variants: for
each round and each variant, a fresh `staccato up`, the workload's
functions deployed, `staccato bench run examples/workloads/mixed-2050.json`
(shortened to --seconds), and per instance the p50 / p99 / p99.9 of the
latency (scheduled -> answered, warm-up left out) from requests.csv.

    python3 bench/mixed_ab.py --variant NAME=BINARY[,UP_ARG...] [--variant ...]
                              [--rounds 3] [--seconds 30]

A variant is a binary (which serves and which runs the load) and
arguments for its `staccato up`, e.g. `spin=/tmp/old-staccato` and
`timer=target/release/staccato` for two builds, or
`nospin=target/release/staccato,--engine-spin-us=0,--worker-spin-us=0`.
Each `staccato up` gets a free loopback port and a state directory of its
own, and is stopped after its run; runs go to bench-results/mixed-ab-*/.

`--floor` adds a variant `plain`: the same workload, from the same load
generator (the first variant's binary), sent to a plain C HTTP server
(bench/ab-client/plain.c, one epoll thread answering every path 200) in
each round: what this machine and load generator give a server that does
nothing, the floor of the C nop's p50 and p99. One plain server serves
every round (each Staccato variant is started afresh for each)."""
import argparse
import contextlib
import csv
import json
import math
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import up

ROOT = Path(__file__).resolve().parent.parent
WORKLOAD = ROOT / "examples" / "workloads" / "mixed-2050.json"
FUNCTION_SETS = [ROOT / "examples" / "workloads" / "functions", ROOT / "bench" / "functions" / "python",
                 ROOT / "bench" / "functions" / "node"]


def pct(v, q):
    """Nearest rank, as `bench run` reports it."""
    return v[max(0, min(len(v) - 1, math.ceil(q * len(v)) - 1))]


def run(cmd, env):
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout}{p.stderr}")


@contextlib.contextmanager
def plain_server():
    """A plain C HTTP server (bench/ab-client/plain.c) on a free loopback
    port; yields its base URL."""
    with tempfile.TemporaryDirectory() as d:
        exe = Path(d) / "plain"
        subprocess.run(["gcc", "-O2", "-o", str(exe), str(ROOT / "bench" / "ab-client" / "plain.c")], check=True)
        port = up.free_port()
        proc = subprocess.Popen([str(exe), str(port)])
        try:
            for _ in range(100):
                if proc.poll() is not None:
                    sys.exit(f"the plain server did not start (exit {proc.returncode})")
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    time.sleep(0.05)
            else:
                sys.exit(f"the plain server does not listen on {port}")
            yield f"http://127.0.0.1:{port}"
        finally:
            proc.kill()
            proc.wait()


def one_run(binary, up_args, workload, out, base_url=None):
    """One run of `workload`: against a fresh `staccato up`, or, with
    `base_url`, against whatever serves there (the floor)."""
    out.mkdir(parents=True)
    if base_url:
        cfg = json.loads(workload.read_text())
        cfg["base_url"] = base_url
        (out / "workload.json").write_text(json.dumps(cfg))
        env = {k: v for k, v in os.environ.items() if not k.startswith("STACCATO_")}
        run([binary, "bench", "run", str(out / "workload.json"), "--out", str(out), "--no-analyze"], env)
    else:
        with open(out / "up.log", "w") as log, up.private(binary, up_args, log=log) as env:
            for d in FUNCTION_SETS:
                run([binary, "deploy", str(d)], env)
            run([binary, "bench", "run", str(workload), "--out", str(out), "--no-analyze"], env)
    lat, failed = {}, 0
    with open(out / "requests.csv") as f:
        for r in csv.DictReader(f):
            if r["warmup"] == "true":
                continue
            if r["status"] != "200":
                failed += 1
                continue
            lat.setdefault(r["instance"], []).append(float(r["latency_ms"]))
    stats = {}
    for inst, v in lat.items():
        v.sort()
        stats[inst] = {"n": len(v), "p50": pct(v, 0.5), "p99": pct(v, 0.99), "p99.9": pct(v, 0.999),
                       "over_2ms": sum(x > 2 for x in v) / len(v)}
    return stats, failed


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variant", action="append", required=True, help="NAME=BINARY[,UP_ARG...]")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=30, help="the workload's duration (the file says 60)")
    ap.add_argument("--floor", action="store_true", help="also run the workload against a plain C HTTP server")
    a = ap.parse_args()
    variants = []
    for v in a.variant:
        name, _, rest = v.partition("=")
        binary, *up_args = rest.split(",")
        if not name or not Path(binary).is_file():
            sys.exit(f"--variant {v!r}: expected NAME=BINARY[,UP_ARG...] with an existing binary")
        variants.append((name, binary, up_args))
    if a.floor and any(name == "plain" for name, _, _ in variants):
        sys.exit("--floor adds a variant named plain: name yours otherwise")
    cfg = json.loads(WORKLOAD.read_text())
    cfg["test_duration_in_seconds"] = a.seconds
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = ROOT / "bench-results" / f"mixed-ab-{stamp}"
    base.mkdir(parents=True)
    workload = base / "workload.json"
    workload.write_text(json.dumps(cfg))
    results = {}
    floor = plain_server() if a.floor else contextlib.nullcontext()
    with floor as plain_url:
        rounds(a, variants, workload, base, results, plain_url)
    (base / "results.json").write_text(json.dumps(results, indent=1))
    print(f"\nmedians of {a.rounds} rounds, ms ({base}):")
    print("| variant | instance | p50 | p99 | p99.9 | p99 / p50 | calls > 2 ms |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for name, runs in results.items():
        for inst in sorted(runs[0]):
            m = {k: statistics.median(run[inst][k] for run in runs if inst in run)
                 for k in ("p50", "p99", "p99.9", "over_2ms")}
            print(f"| {name} | {inst} | {m['p50']:.3f} | {m['p99']:.3f} | {m['p99.9']:.3f} | "
                  f"{m['p99'] / m['p50']:.1f}x | {m['over_2ms'] * 100:.2f} % |")


def rounds(a, variants, workload, base, results, plain_url):
    """Every variant once per round, in turn (the floor last)."""
    runs = [(name, binary, up_args, None) for name, binary, up_args in variants]
    if plain_url:
        runs.append(("plain", variants[0][1], [], plain_url))
    for r in range(a.rounds):
        for name, binary, up_args, url in runs:
            out = base / f"{name}-{r + 1}"
            stats, failed = one_run(binary, up_args, workload, out, url)
            results.setdefault(name, []).append(stats)
            nop = stats.get("nop", {})
            print(f"round {r + 1} {name}: C nop p50 {nop.get('p50', 0):.3f} p99 {nop.get('p99', 0):.3f} "
                  f"p99.9 {nop.get('p99.9', 0):.3f} ms, {failed} failed", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
