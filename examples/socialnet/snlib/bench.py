"""The SocialNetwork benchmark: every variant on the same stores and data,
each swept over offered rates with `staccato bench run` (open loop), with
the machine's CPU split between the variant, the stores and the load
generator, and the share of calls that were internal (Nightcore Table 3).
"""

import contextlib
import csv
import json
import os
import statistics
import subprocess
import threading
import time
from pathlib import Path

from . import data, variants

# The workloads: DeathStarBench's mixed mix, and compose-post alone.
WORKLOADS = {
    "mixed": [("home", "sn-home-timeline-read", 0.6), ("user", "sn-user-timeline-read", 0.3),
              ("compose", "sn-post-compose", 0.1)],
    "compose": [("compose", "sn-post-compose", 1.0)],
}
BODY_MAKERS = {"sn-home-timeline-read": data.read_request, "sn-user-timeline-read": data.read_request,
               "sn-post-compose": data.compose_request}


def write_bodies(dirpath, users, seed=11, n=20_000):
    """One seeded bodies file per API the workloads call."""
    dirpath.mkdir(parents=True, exist_ok=True)
    files = {}
    for i, (app, make) in enumerate(sorted(BODY_MAKERS.items())):
        f = dirpath / f"{app}.jsonl"
        data.write_bodies(f, make, n, seed + i, users=users)
        files[app] = f
    return files


def workload_config(name, workload, rates, bodies, duration_s, warmup_s, pause_s, slo_ms, url=None, seed=3):
    """A `staccato bench run` sweep: one instance per API of the workload,
    each at its share of every offered rate."""
    instances = {}
    for inst, app, share in WORKLOADS[workload]:
        i = {"application": app, "distribution": "Poisson", "rates": [round(r * share, 3) for r in rates],
             "bodies_file": str(bodies[app])}
        if url:
            i["url"] = f"{url}/function/{app}"
        instances[inst] = i
    return {
        "test_name": name, "test_duration_in_seconds": duration_s, "random_seed": seed, "blocking_cli": False,
        "warmup_in_seconds": warmup_s, "pause_in_seconds": pause_s,
        "slo": {"percentile": 99, "max_ms": slo_ms}, "instances": instances,
    }


# ------------------------------------------------------------ CPU accounting

TICK = os.sysconf("SC_CLK_TCK")


def machine_cpu():
    """(busy seconds without steal, steal seconds) of the whole machine."""
    f = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    v = [int(x) for x in f]
    user, nice, system, idle, iowait, irq, softirq, steal = (v + [0] * 8)[:8]
    return (user + nice + system + irq + softirq) / TICK, steal / TICK


def proc_cpu(pid):
    with contextlib.suppress(OSError, ValueError, IndexError):
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) / TICK
    return None


class Sampler:
    """Samples cumulative CPU counters every `period` seconds on a thread
    of its own: the machine's, the stores', the load generator's (its pid
    given later) and this process's own."""

    def __init__(self, stores, period=0.25):
        self.stores, self.period = stores, period
        self.samples = []
        self.loadgen_pid = None
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()

    def _run(self):
        while not self._stop.is_set():
            busy, steal = machine_cpu()
            lg = proc_cpu(self.loadgen_pid) if self.loadgen_pid else None
            self.samples.append({"t": time.time(), "busy": busy, "steal": steal, "stores": self.stores.cpu_seconds(),
                                 "loadgen": lg, "self": time.process_time()})
            self._stop.wait(self.period)

    def window(self, t0, t1):
        """CPU seconds spent between t0 and t1 (unix seconds), by kind."""
        inside = [s for s in self.samples if t0 <= s["t"] <= t1]
        if len(inside) < 2:
            return None
        a, b = inside[0], inside[-1]
        lg = (b["loadgen"] - a["loadgen"]) if a["loadgen"] is not None and b["loadgen"] is not None else 0.0
        out = {"seconds": b["t"] - a["t"], "machine": b["busy"] - a["busy"], "steal": b["steal"] - a["steal"],
               "stores": b["stores"] - a["stores"], "loadgen": lg, "sampler": b["self"] - a["self"]}
        out["platform"] = out["machine"] - out["stores"] - out["loadgen"] - out["sampler"]
        return out


# ------------------------------------------------------------ one sweep

def run_sweep(variant, workload, rates, bodies, out_dir, sampler, opts, progress=print, suffix=""):
    """Runs one variant's sweep; returns per-phase rows."""
    name = f"socialnet-{workload}-{variant.name}{suffix}"
    run_dir = out_dir / "runs" / name
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    url = variant.url if isinstance(variant, variants.RpcVariant) else None
    # A testbed's variants are called from its client host.
    prefix = ["nsenter", f"--net={variant.bed.netns('client')}", "--"] if hasattr(variant, "bed") else []
    cfg = workload_config(name, workload, rates, bodies, opts["duration_s"], opts["warmup_s"], opts["pause_s"],
                          opts["slo_ms"], url=url)
    cfg_path = out_dir / "configs" / f"{name}.json"
    cfg_path.parent.mkdir(parents=True, exist_ok=True)
    cfg_path.write_text(json.dumps(cfg, indent=1))
    calls_before = variant.calls_total()
    progress(f"  {variant.name} / {workload}: {len(rates)} rates {rates} x {opts['duration_s']} s")
    env = {k: v for k, v in os.environ.items() if not k.startswith("STACCATO_")}
    argv = [*prefix, str(variants.STACCATO), "--gateway", variant.url, "bench", "run", str(cfg_path), "--out",
            str(run_dir), "--no-analyze", "--max-connections", "4096"]
    if getattr(variant, "token", None):
        argv[len(prefix) + 1:len(prefix) + 1] = ["--token", variant.token]
    with open(out_dir / "runs" / f"{name}.log", "wb") as log:
        p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
        sampler.loadgen_pid = p.pid
        rc = p.wait()
    if rc != 0:
        raise RuntimeError(f"staccato bench run failed for {name}: see {out_dir / 'runs' / (name + '.log')}")
    calls_after = variant.calls_total()
    return phase_rows(variant, workload, run_dir, sampler, calls_before, calls_after)


def phase_rows(variant, workload, run_dir, sampler, calls_before, calls_after):
    run = json.loads((run_dir / "run.json").read_text())
    summary = json.loads((run_dir / "summary.json").read_text())
    started = run["started_unix_s"]
    first = next(iter(run["instances"].values()))["phases"]
    with open(run_dir / "requests.csv") as f:
        sent = sum(1 for _ in csv.DictReader(f))
    total_calls = sum(calls_after.values()) - sum(calls_before.values())
    internal = max(total_calls - sent, 0)
    rows = []
    for ph, w in zip(summary["phases"], first):
        cpu = sampler.window(started + w["measured_start_s"], started + w["end_s"])
        done = ph["count"] or 0
        row = {
            "variant": variant.name, "workload": workload, "offered": ph["rate"],
            "achieved": ph["achieved_rate"], "count": done, "ok": ph["ok"], "errors": _errors(ph["errors"]),
            "p50_ms": ph["p50_ms"], "p99_ms": ph["p99_ms"], "slo_latency_ms": ph.get("slo_latency_ms"),
            "errors_by_kind": ph["errors"],
            "slo_met": ph.get("slo_met"),
            "internal_share": internal / total_calls if total_calls else None,
            "run_dir": str(run_dir),
        }
        if cpu and done:
            k = 1000.0 / done
            row.update({"cpu_s_per_1k": cpu["platform"] * k, "cpu_s_per_1k_with_stores": (cpu["platform"] +
                        cpu["stores"]) * k, "stores_cpu_s_per_1k": cpu["stores"] * k,
                        "loadgen_cpu_s_per_1k": cpu["loadgen"] * k, "machine_busy": cpu["machine"] / cpu["seconds"],
                        "steal_s": cpu["steal"]})
        rows.append(row)
    return rows


def _errors(e):
    """A phase's errors as a count (summary.json has them by kind)."""
    return sum(e.values()) if isinstance(e, dict) else (e or 0)


# ------------------------------------------------------------ the report

def met(r):
    """Whether a rate met the SLO: without errors, or (over several
    rounds) in most of them."""
    return bool(r.get("slo_met")) and (r.get("rounds", 1) > 1 or not r["errors"])


def best_under_slo(rows):
    ok = [r for r in rows if met(r)]
    return max(ok, key=lambda r: r["offered"]) if ok else None


def report(rows, opts, path, compare_dirs):
    groups = [("One server", "", [r for r in rows if not r["variant"].endswith("-3hosts")]),
              ("Three test hosts", "-3hosts", [r for r in rows if r["variant"].endswith("-3hosts")])]
    lines = [f"# SocialNetwork on Staccato: {opts['when']}", "",
             f"Command: `{opts['command']}`", "",
             f"SLO: p99 <= {opts['slo_ms']} ms with no errors (failed requests count as infinitely slow). "
             f"Each rate runs {opts['duration_s']} s, the first {opts['warmup_s']} s left out. "
             "CPU s per 1,000 requests: the machine's busy time (steal excluded) minus the stores' and the "
             "load generator's, over the measured part of the phase.", ""]
    for bad in opts.get("incorrect_after_load", []):
        lines += [f"**Incorrect after the load**: {bad}", ""]
    for title, tag, group in groups:
        if group:
            lines += [f"## {title}", ""]
            lines += _report_group(group, compare_dirs, tag)
    path.write_text("\n".join(lines))


def aggregate(rows):
    """One row per (workload, variant, offered rate): medians over rounds
    of latency, CPU and rates; errors summed; the SLO met if it was in
    most rounds."""
    groups, order = {}, []
    for r in rows:
        key = (r["workload"], r["variant"], r["offered"])
        if key not in groups:
            order.append(key)
        groups.setdefault(key, []).append(r)
    out = []
    for key in order:
        rs = groups[key]
        if len(rs) == 1:
            out.append(rs[0])
            continue
        m = dict(rs[0])
        for f in ("achieved", "p50_ms", "p99_ms", "cpu_s_per_1k", "cpu_s_per_1k_with_stores", "internal_share"):
            vals = sorted(x[f] for x in rs if x.get(f) is not None)
            if vals:
                m[f] = statistics.median(vals)
        m["errors"] = sum(x["errors"] for x in rs)
        m["slo_met"] = sum(1 for x in rs if x.get("slo_met") and not x["errors"]) * 2 > len(rs)
        m["rounds"] = len(rs)
        out.append(m)
    return out


def _report_group(rows, compare_dirs, tag):
    rows = aggregate(rows)
    by, order = {}, []
    for r in rows:
        key = (r["workload"], r["variant"])
        if key not in by:
            order.append(key)
        by.setdefault(key, []).append(r)
    lines = []
    for workload in WORKLOADS:
        vs = [v for (w, v) in order if w == workload]
        if not vs:
            continue
        common = None
        for v in vs:
            ok = {r["offered"] for r in by[(workload, v)] if met(r)}
            common = ok if common is None else common & ok
        common_rate = max(common) if common else None
        lines += [f"### {workload}", "", "| variant | max rate under SLO (req/s) | p50 / p99 at the common rate "
                  f"({common_rate} req/s) | CPU s / 1k req there (with stores) | internal calls | errors (all rates) |",
                  "|---|---|---|---|---|---|"]
        for v in vs:
            rs = by[(workload, v)]
            best = best_under_slo(rs)
            at = next((r for r in rs if r["offered"] == common_rate), None)
            lat = f"{at['p50_ms']:.2f} / {at['p99_ms']:.2f} ms" if at and at["p50_ms"] is not None else "-"
            cpu = (f"{at['cpu_s_per_1k']:.2f} ({at['cpu_s_per_1k_with_stores']:.2f})"
                   if at and "cpu_s_per_1k" in at else "-")
            share = rs[0]["internal_share"]
            share = f"{share * 100:.0f}%" if share is not None else "-"
            lines.append(f"| {variants.DESCRIPTIONS.get(v, v)} | {best['offered'] if best else 'none'} | {lat} | "
                         f"{cpu} | {share} | {sum(r['errors'] for r in rs)} |")
        lines += ["", "Every rate:", "", "| variant | offered | achieved | p50 ms | p99 ms | errors | SLO | CPU s/1k |",
                  "|---|---|---|---|---|---|---|---|"]
        for v in vs:
            for r in by[(workload, v)]:
                cpu = f"{r['cpu_s_per_1k']:.2f}" if "cpu_s_per_1k" in r else "-"
                p50 = f"{r['p50_ms']:.2f}" if r["p50_ms"] is not None else "-"
                p99 = f"{r['p99_ms']:.2f}" if r["p99_ms"] is not None else "-"
                lines.append(f"| {v} | {r['offered']:g} | {r['achieved']:.1f} | {p50} | {p99} | {r['errors']} | "
                             f"{'met' if met(r) else 'missed'} | {cpu} |")
        if workload + tag in compare_dirs:
            lines += ["", "Plots: " + ", ".join(f"`{d}`" for d in compare_dirs[workload + tag])]
        lines.append("")
    return lines
