#!/usr/bin/env python3
"""Bursts to a quiet function (issue 14): N concurrent calls of a function
that sleeps D ms, sent at once, to a freshly deployed function (no history:
managed concurrency has no measurement yet) and again after a steady
trickle (history). Reports each burst's makespan against D: 1.0x means
every call ran at once. Then the steady state turning slow: 10 calls/s of
1 ms for 5 s, then 10 calls/s of D ms (open loop, each sent at its time):
the slow calls' latency, which stays near D when τ follows the calls that
run long, and grows with the queue when it waits for the average.

    python3 bench/burst.py [--binary target/release/staccato] [--sizes 1 16 64] [--ms 200] [--rounds 3]

Starts its own `staccato up` on a free loopback port, with the default
settings (containers when it can make them), and stops it at the end."""
import argparse
import concurrent.futures as cf
import http.client
import statistics
import subprocess
import sys
import time
from pathlib import Path

import up

ROOT = Path(__file__).resolve().parent.parent
FN = ROOT / "bench" / "functions" / "burst"


def call(port, ms):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        c.request("POST", "/function/bench-burst", body=str(ms).encode())
        r = c.getresponse()
        body = r.read()
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status}: {body[:200]!r}")
    finally:
        c.close()


def burst(port, n, ms):
    """Seconds from the first call sent to the last answer."""
    with cf.ThreadPoolExecutor(n) as ex:
        t0 = time.perf_counter()
        list(ex.map(lambda _: call(port, ms), range(n)))
        return time.perf_counter() - t0


def slowdown(port, ms, rate=10, seconds=5):
    """Latencies (s) of the calls after a steady rate of 1 ms calls turns into D ms calls."""
    plan = [(i / rate, 1) for i in range(rate * seconds)]
    plan += [(seconds + i / rate, ms) for i in range(rate * seconds)]
    out = [None] * len(plan)

    def one(i):
        at, d = plan[i]
        delay = t0 + at - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        call(port, d)
        out[i] = time.perf_counter() - (t0 + at)

    with cf.ThreadPoolExecutor(len(plan)) as ex:
        t0 = time.perf_counter() + 0.2
        list(ex.map(one, range(len(plan))))
    return sorted(out[rate * seconds:])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--binary", default=str(ROOT / "target" / "release" / "staccato"))
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--ms", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    with up.private(a.binary) as env:
        port = int(env["STACCATO_GATEWAY"].rsplit(":", 1)[1])
        cli = lambda *args: subprocess.run([a.binary, *args], env=env, capture_output=True, text=True, check=True)
        rows = {}
        for r in range(a.rounds):
            for n in a.sizes:
                # Fresh: deployed just now, never called.
                subprocess.run([a.binary, "rm", "bench-burst"], env=env, capture_output=True)
                cli("deploy", str(FN))
                fresh = burst(port, n, a.ms)
                # With history: a trickle of single calls first.
                for _ in range(5):
                    call(port, a.ms)
                warm = burst(port, n, a.ms)
                rows.setdefault(n, []).append((fresh, warm))
                print(f"round {r + 1}: {n:3d} calls: fresh {fresh * 1000:7.0f} ms, "
                      f"after history {warm * 1000:7.0f} ms", file=sys.stderr, flush=True)
        slow = []
        for r in range(a.rounds):
            subprocess.run([a.binary, "rm", "bench-burst"], env=env, capture_output=True)
            cli("deploy", str(FN))
            lat = slowdown(port, a.ms)
            slow.append(lat)
            print(f"round {r + 1}: calls turned slow: p50 {statistics.median(lat) * 1000:.0f} ms, "
                  f"max {lat[-1] * 1000:.0f} ms", file=sys.stderr, flush=True)
        print(f"\nburst of N calls of a {a.ms} ms function, makespan (median of {a.rounds}), and as a "
              f"multiple of one call:")
        print("| N | fresh function | after a trickle of calls |")
        print("|---:|---:|---:|")
        for n, v in rows.items():
            f = statistics.median(x[0] for x in v)
            w = statistics.median(x[1] for x in v)
            print(f"| {n} | {f * 1000:.0f} ms ({f * 1000 / a.ms:.2f}x) | {w * 1000:.0f} ms ({w * 1000 / a.ms:.2f}x) |")
        p = lambda q: statistics.median(v[min(len(v) - 1, int(q * len(v)))] for v in slow) * 1000
        print(f"\n10 calls/s of 1 ms turning into 10 calls/s of {a.ms} ms: the slow calls' latency "
              f"(median of {a.rounds} rounds): p50 {p(0.5):.0f} ms, p90 {p(0.9):.0f} ms, max {p(1.0):.0f} ms")


if __name__ == "__main__":
    main()
