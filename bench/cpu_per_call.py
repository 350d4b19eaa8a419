#!/usr/bin/env python3
"""CPU burnt per call, with the latency beside it, at several call rates:
builds interleaved, each round a fresh `staccato up` per build (default
placement, containers, bench/functions/c deployed), then per rate an open
loop of the C nop through the front door (bench/ab-client/alternate with
Poisson gaps, one keep-alive connection, the client unpinned). CPU is the
run time the scheduler charged (`/proc/PID/task/*/schedstat`) to the
`staccato up` process and to the C nop's worker processes between the
first and the last call, divided by the calls: spinning shows as CPU.

    python3 bench/cpu_per_call.py --binary base=target/release/stc-base \\
        --binary new=target/release/staccato [--rounds 3] [--rates 100,1000,30000]

Prints per round, build and rate: p50 / p99 µs and µs of CPU per call.
"""
import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import up

ROOT = Path(__file__).resolve().parent.parent
SECONDS = {100: 5.0, 1000: 3.0}  # other rates: 2 s


def task_ns(pid):
    """Run time of every thread of `pid` (ns); 0 once it is gone."""
    total = 0
    try:
        for t in os.listdir(f"/proc/{pid}/task"):
            try:
                total += int(Path(f"/proc/{pid}/task/{t}/schedstat").read_text().split()[0])
            except (OSError, ValueError):
                pass
    except OSError:
        pass
    return total


def worker_pids():
    out = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                if Path(f"/proc/{p}/comm").read_text().strip() == "staccato-c-host":
                    out.append(int(p))
            except OSError:
                pass
    return out


def up_pid(port):
    out = subprocess.run(["pgrep", "-f", f"up --listen 127.0.0.1:{port}"], capture_output=True, text=True).stdout
    pids = [int(x) for x in out.split()]
    if not pids:
        sys.exit(f"no staccato up listening on {port}")
    return pids[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", action="append", required=True, help="NAME=PATH of a staccato build")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rates", default="100,1000,30000", help="calls a second, comma-separated")
    a = ap.parse_args()
    builds = [b.partition("=")[::2] for b in a.binary]
    rates = [int(r) for r in a.rates.split(",")]
    if worker_pids():
        sys.exit("staccato-c-host processes are running already: stop other servers first")
    with tempfile.TemporaryDirectory() as work:
        client = Path(work) / "alternate"
        subprocess.run(["gcc", "-O2", "-o", client, ROOT / "bench/ab-client/alternate.c", "-lm"], check=True)
        for r in range(1, a.rounds + 1):
            for name, binary in builds:
                with open(Path(work) / f"{name}-{r}.log", "w") as log, up.private(binary, log=log) as env:
                    subprocess.run([binary, "deploy", ROOT / "bench/functions/c"], env=env, check=True,
                                   stdout=subprocess.DEVNULL)
                    port = int(env["STACCATO_GATEWAY"].rsplit(":", 1)[1])
                    target = f"{port}:/function/bench-nop-c"
                    subprocess.run([client, "2000", target], check=True, stdout=subprocess.DEVNULL)  # warm-up
                    server = up_pid(port)
                    for rate in rates:
                        n = int(rate * SECONDS.get(rate, 2.0))
                        pids = [server, *worker_pids()]
                        before = sum(task_ns(p) for p in pids)
                        out = subprocess.run([client, str(n), target], check=True, capture_output=True, text=True,
                                             env={**os.environ, "GAP_US": str(1e6 / rate)}).stdout.split()
                        cpu_us = (sum(task_ns(p) for p in pids) - before) / 1000 / n
                        p50, p99 = float(out[out.index("p50") + 1]), float(out[out.index("p99") + 1])
                        print(f"round {r} {name:>8} {rate:>6}/s: p50 {p50:6.1f} p99 {p99:7.1f} µs, "
                              f"CPU {cpu_us:6.1f} µs a call", flush=True)


if __name__ == "__main__":
    main()
