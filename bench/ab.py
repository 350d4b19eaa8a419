"""Interleaved A/B of `staccato bench micro` variants: each round runs every
variant once, in turn, so drift on a shared machine hits all of them alike.
Prints the median over rounds of each figure, per variant.

    python3 bench/ab.py --rounds 3 --variant engine=--front-door=engine \\
        --variant gateway=--front-door=gateway -- --langs c --calls 5000

A variant is NAME=UP_ARG[,UP_ARG...] (each passed as --up-arg); the
arguments after `--` go to every `staccato bench micro` run. Two builds
against each other: `--binary NAME=PATH` runs that variant's rounds with
another `staccato` binary (kept under target/release/, where it finds
runtimes/):

    cp target/release/staccato target/release/stc-old   # before the change
    python3 bench/ab.py --rounds 4 --variant old= --variant new= \
        --binary old=target/release/stc-old -- --langs c --low-load-s 0
"""
import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

BIN = Path(__file__).resolve().parent.parent / "target" / "release" / "staccato"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--variant", action="append", required=True, help="NAME=UP_ARG[,UP_ARG...] (NAME= for none)")
    ap.add_argument("--json", help="write every run's rows here")
    ap.add_argument("--binary", action="append", default=[], help="NAME=PATH: the staccato binary of variant NAME")
    ap.add_argument("rest", nargs="*", help="arguments for `staccato bench micro` (after --)")
    a = ap.parse_args()
    variants = []
    for v in a.variant:
        name, _, args = v.partition("=")
        variants.append((name, [f"--up-arg={x}" for x in args.split(",") if x]))
    runs = {name: [] for name, _ in variants}
    binaries = {}
    for b in a.binary:
        name, _, path = b.partition("=")
        if name not in runs or not path:
            sys.exit(f"--binary {b!r}: expected NAME=PATH with NAME one of the variants")
        binaries[name] = Path(path).resolve()
        if not binaries[name].is_file():
            sys.exit(f"--binary {b!r}: {binaries[name]} is not a file")
    for r in range(a.rounds):
        for name, up in variants:
            print(f"round {r + 1}/{a.rounds}: {name}", file=sys.stderr, flush=True)
            out = subprocess.run([str(binaries.get(name, BIN)), "bench", "micro", "--json", *up, *a.rest], capture_output=True, text=True,
                                 timeout=1800)
            if out.returncode != 0:
                sys.exit(f"{name}: bench micro failed:\n{out.stderr[-3000:]}")
            runs[name].append(json.loads(out.stdout)["results"])
    if a.json:
        Path(a.json).write_text(json.dumps(runs, indent=1))
    keys = []
    for rows in runs[variants[0][0]]:
        for row in rows:
            k = (row["name"], row["mode"])
            if k not in keys:
                keys.append(k)
    fields = ["p50_us", "p99_us", "p99_9_us", "requests_per_s"]
    print(f"medians of {a.rounds} interleaved rounds")
    print(f"{'measurement':42s} {'placement':9s} " + " ".join(f"{n:>26s}" for n, _ in variants))
    for k in keys:
        cells = []
        for name, _ in variants:
            vals = {f: [] for f in fields}
            for rows in runs[name]:
                for row in rows:
                    if (row["name"], row["mode"]) == k:
                        for f in fields:
                            if row.get(f) is not None:
                                vals[f].append(row[f])
            if vals["requests_per_s"]:
                cells.append(f"{statistics.median(vals['requests_per_s']):.0f}/s")
            elif vals["p50_us"]:
                cells.append("/".join(f"{statistics.median(vals[f]):.1f}" for f in fields[:3] if vals[f]))
            else:
                cells.append("-")
        print(f"{k[0]:42s} {k[1]:9s} " + " ".join(f"{c:>26s}" for c in cells))


if __name__ == "__main__":
    main()
