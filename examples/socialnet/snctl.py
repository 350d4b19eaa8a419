#!/usr/bin/env python3
"""SocialNetwork on Staccato: stores, deployments, data, checks and the
benchmark of examples/socialnet (README.md there).

  snctl.py stores up|down|flush [--dir D]      Redis, memcached, PostgreSQL on loopback
  snctl.py up VARIANT [--dir D] [--port P]     one variant, deployed, in the foreground
  snctl.py load --url URL [--users N ...]      the social graph and some posts, through the API
  snctl.py check --url URL                     a post reaches every timeline it must
  snctl.py latency --url URL                   each API's latency, one call at a time
  snctl.py bench [--out D] [--quick]           everything below, in one run

`bench` starts the stores, starts every variant (Staccato default, Staccato
with internal calls through the gateway, Staccato with managed concurrency
off, RPC servers), loads the data once, checks each variant, sweeps each
workload over offered rates with `staccato bench run`, stops everything, and
writes results.md, results.json and the analyzer's latency-vs-load plots.
"""

import argparse
import contextlib
import datetime
import json
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from snlib import bench, check, cluster, data, stores, variants  # noqa: E402

DEFAULT_DIR = Path("/var/tmp/staccato-socialnet")


def say(msg):
    print(msg, flush=True)


def cmd_stores(a):
    s = stores.Stores(a.dir / "stores")
    if a.action == "up":
        say(f"==> stores under {s.root}")
        s.up(say)
    elif a.action == "down":
        s.down()
        say("stores stopped")
    else:
        s.flush()
        say("stores emptied")


def cmd_up(a):
    s = stores.Stores(a.dir / "stores")
    v = variants.make(a.variant, a.dir / "variants", a.port, s)
    v.start(say)
    say(f"{a.variant} serving on {v.url}; Ctrl-C stops it")
    try:
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        v.stop()


def cmd_load(a):
    api = data.Api(a.url)
    t0 = time.monotonic()
    data.load(api, a.users, a.edges, a.posts_per_user, seed=a.seed, progress=say)
    say(f"loaded in {time.monotonic() - t0:.1f} s")


def cmd_check(a):
    check.check(data.Api(a.url), data.social_graph(a.users, a.edges, a.seed), users=a.users)
    say("ok: the post is on its author's timeline, its follower's and its mentioned user's home timelines")


def cmd_latency(a):
    """Closed loop, one call at a time: each API's latency without queueing
    (what a request costs when nothing else runs)."""
    import random
    api = data.Api(a.url)
    rng = random.Random(a.seed)
    makers = [("sn-user-follow", lambda: {"user_id": rng.randint(1, a.users), "followee_id": rng.randint(1, a.users)}),
              ("sn-home-timeline-read", lambda: data.read_request(rng, a.users)),
              ("sn-user-timeline-read", lambda: data.read_request(rng, a.users)),
              ("sn-post-compose", lambda: data.compose_request(rng, a.users))]
    for name, make in makers:
        lat = []
        for _ in range(a.calls):
            body = make()
            if name == "sn-user-follow" and body["user_id"] == body["followee_id"]:
                body["followee_id"] = body["user_id"] % a.users + 1
            t = time.perf_counter()
            api.call(name, body)
            lat.append((time.perf_counter() - t) * 1000)
        lat.sort()
        q = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))]  # noqa: E731
        say(f"{name:24s} p50 {q(0.5):6.2f} ms  p90 {q(0.9):6.2f} ms  p99 {q(0.99):6.2f} ms  ({a.calls} calls)")


def cmd_bench(a):
    out = a.out or Path("bench-results") / f"socialnet-{datetime.datetime.now():%Y%m%d-%H%M%S}"
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    opts = {"duration_s": a.duration, "warmup_s": a.warmup, "pause_s": 2, "slo_ms": a.slo_ms, "rounds": a.rounds,
            "variants": a.variants, "when": f"{datetime.datetime.now():%Y-%m-%d %H:%M}",
            "command": " ".join(shlex.quote(x) for x in sys.argv)}
    rates = {"mixed": a.mixed_rates, "compose": a.compose_rates}
    rows, compare = [], {}
    if a.variants:
        s = stores.Stores(a.dir / "stores")
        say(f"==> stores under {s.root}")
        s.down()  # leftovers of an interrupted run
        s.up(say)
        started = []
        try:
            s.flush()
            for i, name in enumerate(a.variants):
                say(f"==> starting {name}")
                v = variants.make(name, a.dir / "variants", a.port + 100 * i, s)
                started.append(v)  # stopped in `finally` even if it fails to start
                v.start(say)
            measure(a, started, s, out, opts, rates, rows, compare, "")
        finally:
            for v in started:
                v.stop()
            s.down()
    if a.hosts:
        say(f"==> {cluster.HOSTS} servers (test hosts): Staccato and the RPC servers")
        bed, s = cluster.Bed(a.dir), None
        try:
            bed.up(say)
            s = bed.stores(a.dir / "stores-testbed")
            s.down()
            s.up(say)
            s.flush()
            started = [cluster.StaccatoCluster(bed, s, a.dir / "variants"),
                       cluster.RpcCluster(bed, s, a.dir / "variants")]
            for v in started:
                v.start(say)
            measure(a, started, s, out, opts, rates, rows, compare, "-3hosts")
        finally:
            if s is not None:
                with contextlib.suppress(Exception):
                    s.down()
            bed.down()
    (out / "results.json").write_text(json.dumps({"options": opts, "rates": rates, "rows": rows}, indent=1))
    bench.report(rows, opts, out / "results.md", compare)
    say((out / "results.md").read_text())
    say(f"==> results in {out}")
    if opts.get("incorrect_after_load"):
        sys.exit("snctl: a variant answered incorrectly after the load (see above)")


def measure(a, started, s, out, opts, rates, rows, compare, tag):
    """Loads the data through the first variant, checks every one, sweeps
    every workload over each (the first variant changing per workload),
    and checks again."""
    say(f"==> loading {a.users} users, {a.edges} follows, {a.posts_per_user} posts each (through {started[0].name})")
    graph = data.load(started[0].api(), a.users, a.edges, a.posts_per_user, seed=a.seed, progress=say)
    for v in started:
        check.check(v.api(), graph, users=a.users, seed=len(v.name))
        say(f"  {v.name}: correct (a post reaches its author's, a follower's and a mentioned user's timelines)")
    bodies = bench.write_bodies(out / "bodies", a.users)
    with bench.Sampler(s) as sampler:
        for rnd in range(a.rounds):
            for k, workload in enumerate(a.workloads):
                say(f"==> workload {workload}" + (f", round {rnd + 1} of {a.rounds}" if a.rounds > 1 else ""))
                # Each workload and round starts with the next variant: the
                # data grow as posts are composed, and no variant always goes
                # last.
                first = (k + rnd) % len(started)
                order = started[first:] + started[:first]
                dirs = []
                suffix = f"-r{rnd + 1}" if a.rounds > 1 else ""
                for v in order:
                    rs = bench.run_sweep(v, workload, rates[workload], bodies, out, sampler, opts, say, suffix)
                    for r in rs:
                        r["round"] = rnd + 1
                    rows += rs
                    # Kept as they come: a later failure loses no measurement.
                    (out / "results.json").write_text(json.dumps({"options": opts, "rates": rates, "rows": rows},
                                                                 indent=1))
                    dirs.append(rs[0]["run_dir"])
                    best = bench.best_under_slo(rs)
                    say(f"    {v.name}: highest rate under the SLO {best['offered'] if best else 'none'}; "
                        f"errors {sum(r['errors'] for r in rs)}")
                cdir = out / f"compare-{workload}{tag}{suffix}"
                r = subprocess.run([str(variants.STACCATO), "bench", "compare", *dirs, "--out", str(cdir)],
                                   capture_output=True, text=True)
                if r.returncode == 0:
                    compare.setdefault(workload + tag, []).append(str(cdir))
                else:
                    say(f"  warning: bench compare failed: {r.stderr.strip()[-500:]}")
    failed = []
    for v in started:
        try:
            check.check(v.api(), graph, users=a.users, seed=100 + len(v.name))
        except (check.CheckFailed, data.CallFailed) as e:
            failed.append(f"{v.name}: {e}")
    if failed:
        say("==> INCORRECT after the load:\n  " + "\n  ".join(failed))
        opts.setdefault("incorrect_after_load", []).extend(failed)
    else:
        say(f"==> every variant{tag} still correct after the load")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="stores' data and variants' state (%(default)s)")
    sub = ap.add_subparsers(dest="cmd", required=True)

    p = sub.add_parser("stores", help="start, stop or empty the stores")
    p.add_argument("action", choices=["up", "down", "flush"])
    p.set_defaults(fn=cmd_stores)

    p = sub.add_parser("up", help="run one variant in the foreground")
    p.add_argument("variant", choices=variants.VARIANTS)
    p.add_argument("--port", type=int, default=18080)
    p.set_defaults(fn=cmd_up)

    for name, fn, what in (("load", cmd_load, "load the social graph through the API"),
                           ("check", cmd_check, "check that posts reach the timelines")):
        p = sub.add_parser(name, help=what)
        p.add_argument("--url", required=True, help="a gateway, or the RPC variant's frontend")
        p.add_argument("--users", type=int, default=data.USERS)
        p.add_argument("--edges", type=int, default=data.EDGES)
        p.add_argument("--seed", type=int, default=1)
        p.add_argument("--posts-per-user", type=int, default=3)
        p.set_defaults(fn=fn)

    p = sub.add_parser("latency", help="each API's latency, one call at a time")
    p.add_argument("--url", required=True)
    p.add_argument("--calls", type=int, default=500)
    p.add_argument("--users", type=int, default=data.USERS)
    p.add_argument("--seed", type=int, default=5)
    p.set_defaults(fn=cmd_latency)

    p = sub.add_parser("bench", help="the whole benchmark in one run")
    p.add_argument("--out", type=Path, help="results directory (default bench-results/socialnet-<time>)")
    p.add_argument("--variants", nargs="*", default=variants.DEFAULT_VARIANTS, choices=variants.VARIANTS,
                   help="single-server variants (none: only the test hosts' run)")
    p.add_argument("--hosts", type=int, choices=[0, 3], default=3,
                   help="also run Staccato and the RPC servers over 3 test hosts (0: not)")
    p.add_argument("--workloads", nargs="+", default=list(bench.WORKLOADS), choices=list(bench.WORKLOADS))
    p.add_argument("--mixed-rates", type=float, nargs="+",
                   default=[100, 200, 400, 600, 800, 1000, 1200, 1400])
    p.add_argument("--compose-rates", type=float, nargs="+", default=[50, 100, 150, 200, 250, 300, 350, 400])
    p.add_argument("--duration", type=float, default=20, help="seconds per offered rate")
    p.add_argument("--rounds", type=int, default=1,
                   help="sweep every variant this many times, interleaved; the report gives medians")
    p.add_argument("--warmup", type=float, default=5, help="seconds of each rate left out")
    p.add_argument("--slo-ms", type=float, default=20)
    p.add_argument("--users", type=int, default=data.USERS)
    p.add_argument("--edges", type=int, default=data.EDGES)
    p.add_argument("--posts-per-user", type=int, default=3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--port", type=int, default=18080, help="first variant's port (then +100 each)")
    p.set_defaults(fn=cmd_bench)

    a = ap.parse_args(argv)
    try:
        a.fn(a)
    except (stores.StoreError, RuntimeError, check.CheckFailed, data.CallFailed) as e:
        sys.exit(f"snctl: {e}")


if __name__ == "__main__":
    main()
