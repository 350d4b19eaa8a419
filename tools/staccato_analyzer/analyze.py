"""`analyze RUN_DIR` and `compare RUN_DIR...`."""

import json
import math
import os
import time

import numpy as np

from . import plots
from . import stats as S

SEND_LAG_WARN_MS = 1.0
BOTTLENECK = "the generator, not the system, may be the bottleneck"


def _clean(d):
    """Drop private keys (numpy arrays) before JSON."""
    return {k: v for k, v in d.items() if not k.startswith("_")}


def analysis(run):
    """The analysis.json document for one run."""
    slo = run.config.get("slo")
    inst = {}
    for name in run.instances():
        cells = [c for c in run.cells if c["instance"] == name]
        s = S.group_stats(run, cells)
        apps = sorted(set(run.req["application"][run.req["instance"] == name].tolist()) - {""})
        s["application"] = apps[0] if len(apps) == 1 else apps
        inst[name] = _clean(s)
    overall = S.group_stats(run, run.cells)
    doc = {
        "test_name": run.name,
        "run_dir": run.dir,
        "definitions": {
            "percentile": "nearest rank: value at 1-based rank ceil(p/100*N) of the sorted values",
            "latency": "corrected latency_ms of successful (error empty) non-warm-up requests",
            "offered_rate": "configured rate, time-weighted over the measured (post-warm-up) windows",
            "achieved_rate": "successful non-warm-up requests completed by their phase's end, per second of measured window",
            "capacity_factor": "achieved_rate / offered_rate (FaaSProfiler-style; 1.0 = kept up with the offered load)",
            "cold": "cold_ms > 0",
            "slo": "a phase meets the SLO when its nearest-rank percentile, counting failed requests as infinite, is <= max_ms",
        },
        "instances": inst,
        "overall": _clean(overall),
        "sweep": run.is_sweep(),
        "breakdown_available": run.has_breakdown(),
        "invocations": len(run.invocations),
        "warnings": [],
    }
    if run.is_sweep():
        rows = S.phase_table(run, slo)
        doc["phases"] = [_clean(r) for r in rows]
        if slo:
            best = S.slo_select(rows)
            doc["slo"] = {"percentile": float(slo["percentile"]), "max_ms": float(slo["max_ms"]),
                          "highest_rate_meeting": best["configured_rate"] if best else None,
                          "phase": best["phase"] if best else None}
    elif slo:
        v = S.slo_percentile(overall, float(slo["percentile"]))
        doc["slo"] = {"percentile": float(slo["percentile"]), "max_ms": float(slo["max_ms"]),
                      "latency_ms": None if math.isinf(v) else S._f(v),
                      "met": bool(v <= float(slo["max_ms"]))}
    doc["server"] = server_side(run)
    lag = doc["overall"]["send_lag_p99_ms"]
    if lag is not None and lag > SEND_LAG_WARN_MS:
        doc["warnings"].append(f"send lag p99 {lag:.3f} ms > {SEND_LAG_WARN_MS:g} ms: {BOTTLENECK}")
    return doc


def server_side(run):
    """The engines' view of each function over the run (server.json), with
    the run's external calls of it split warm and cold; None without one."""
    srv = run.server
    if not srv:
        return None
    if not srv.get("available"):
        return {"available": False, "why": srv.get("why")}
    req = run.req
    measured = ~req["warmup"] & (req["error"] == "")
    cold = measured & (np.nan_to_num(req["cold_ms"], nan=0.0) > 0)
    functions = {}
    for name, f in sorted(srv.get("functions", {}).items()):
        mine = req["application"] == name
        functions[name] = dict(f, external_warm=int((measured & mine & ~cold).sum()),
                               external_cold=int((cold & mine).sum()))
    return {"available": True, "how": srv.get("how"), "functions": functions,
            "hardware_counters": srv.get("hardware_counters"),
            "per_call_cpu": srv.get("per_call_cpu") or {"available": False, "why": "not in server.json"}}


# --------------------------------------------------------------------------- text

def fmt(x, nd=3):
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:.{nd}f}"


def report(doc):
    lines = []
    add = lines.append
    add(f"Test: {doc['test_name']}   ({doc['run_dir']})")
    add("")
    groups = list(doc["instances"].items()) + [("overall", doc["overall"])]
    w = max(12, *(len(n) + 2 for n, _ in groups))
    add("Latency distribution (corrected, ms; nearest rank; warm-up excluded)")
    add("  percentile" + "".join(f"{n:>{w}}" for n, _ in groups))
    for p in S.PERCENTILES:
        k = S.pkey(p)
        add(f"  {p:9.3f}%" + "".join(f"{fmt(g['latency_ms'][k]):>{w}}" for _, g in groups))
    add("  " + "mean".rjust(10) + "".join(f"{fmt(g['mean_ms']):>{w}}" for _, g in groups))
    add("")
    hdr = ["", "requests", "ok", "errors", "offered/s", "achieved/s", "cap.factor",
           "uncorr p99", "lag p99"]
    add("Rates (capacity factor = achieved rate / offered rate) and uncorrected latency / send lag (ms)")
    add(f"  {hdr[0]:<{w}}" + "".join(f"{h:>11}" for h in hdr[1:]))
    for n, g in groups:
        vals = [g["scheduled"], g["ok"], g["errors"], fmt(g["offered_rate"], 1),
                fmt(g["achieved_rate"], 1), fmt(g["capacity_factor"], 3),
                fmt(g["uncorrected_p99_ms"]), fmt(g["send_lag_p99_ms"])]
        add(f"  {n:<{w}}" + "".join(f"{v:>11}" for v in vals))
    add("")
    ov = doc["overall"]
    kinds = ", ".join(f"{k}: {v}" for k, v in ov["errors_by_kind"].items()) or "none"
    add(f"Errors by kind: {kinds}")
    for n, g in doc["instances"].items():
        if g["errors"]:
            add(f"  {n}: " + ", ".join(f"{k}: {v}" for k, v in g["errors_by_kind"].items()))
    if doc["breakdown_available"]:
        add("Warm vs cold (cold = cold_ms > 0):")
        for n, g in groups:
            c, wm = g["cold"], g["warm"]
            add(f"  {n:<{w}} warm {wm['n']:>7} (p50 {fmt(wm['p50_ms'])}, p99 {fmt(wm['p99_ms'])} ms)"
                f"   cold {c['n']:>5} (p50 {fmt(c['p50_ms'])}, p99 {fmt(c['p99_ms'])} ms,"
                f" mean init {fmt(c['mean_cold_ms'])} ms)")
    else:
        add("Warm vs cold: n/a (no queue/exec/cold breakdown in requests.csv)")
    if doc.get("phases"):
        add("")
        slo = doc.get("slo")
        add("Sweep (per phase, all instances)" + (
            f"; SLO p{slo['percentile']:g} <= {slo['max_ms']:g} ms, failures count as infinite" if slo else ""))
        cols = ["phase", "rate/s", "achieved/s", "cap.factor", "p50", "p99", "p99.9", "errors"]
        if slo:
            cols += [f"slo p{slo['percentile']:g}", "SLO"]
        add("  " + "".join(f"{c:>11}" for c in cols))
        for r in doc["phases"]:
            v = [r["phase"], fmt(r["configured_rate"], 1), fmt(r["achieved_rate"], 1),
                 fmt(r["capacity_factor"], 3), fmt(r["latency_ms"]["p50"]), fmt(r["latency_ms"]["p99"]),
                 fmt(r["latency_ms"]["p99.9"]), r["errors"]]
            if slo:
                v += [fmt(r["slo_latency_ms"]) if r["slo_latency_ms"] is not None else "inf",
                      "ok" if r["slo_ok"] else "MISS"]
            add("  " + "".join(f"{x:>11}" for x in v))
        if slo:
            h = slo["highest_rate_meeting"]
            add(f"  highest rate meeting the SLO: {h:g} requests/s (phase {slo['phase']})" if h is not None
                else "  highest rate meeting the SLO: none")
    elif doc.get("slo"):
        s = doc["slo"]
        add(f"SLO p{s['percentile']:g} <= {s['max_ms']:g} ms: {'met' if s['met'] else 'MISSED'}"
            f" (p{s['percentile']:g} = {fmt(s['latency_ms']) if s['latency_ms'] is not None else 'inf'} ms)")
    srv = doc.get("server")
    if srv and srv["available"]:
        add("")
        add("Server side (each function's processes, from its engines, over the run; calls include internal ones)")
        cols = ["calls", "CPU ms", "CPU us/call", "wait us/call", "switches/call", "ext. warm", "ext. cold"]
        nw = max(12, *(len(n) + 2 for n in srv["functions"] or ["x"]))
        add(f"  {'function':<{nw}}" + "".join(f"{c:>14}" for c in cols))
        for n, f in srv["functions"].items():
            v = [f["calls"], fmt(f["cpu_ms"], 1), fmt(f["cpu_us_per_call"], 1), fmt(f["run_delay_us_per_call"], 1),
                 fmt(f["switches_per_call"], 2), f["external_warm"], f["external_cold"]]
            add(f"  {n:<{nw}}" + "".join(f"{x:>14}" for x in v))
        pc = srv.get("per_call_cpu") or {}
        if pc.get("available"):
            add("  CPU per call, measured by the runtime (the handler's thread), warm vs cold:")
            add(f"  {'function':<{nw}}" + "".join(f"{c:>14}" for c in
                                                  ["warm calls", "warm us p50", "warm us mean", "cold calls",
                                                   "cold us p50", "cold us mean"]))
            for n, f in pc["functions"].items():
                wv, cv = f.get("warm") or {}, f.get("cold") or {}
                v = [wv.get("calls", 0), fmt(wv.get("p50_us"), 1), fmt(wv.get("mean_us"), 1),
                     cv.get("calls", 0), fmt(cv.get("p50_us"), 1), fmt(cv.get("mean_us"), 1)]
                add(f"  {n:<{nw}}" + "".join(f"{x:>14}" for x in v))
        else:
            add(f"  CPU per call: not measured ({pc.get('why')})")
        hw = srv.get("hardware_counters") or {}
        add("  hardware counters (IPC, cache misses): " + (
            "available" if hw.get("available") else "not available") + (f" ({hw['why']})" if hw.get("why") else ""))
    elif srv:
        add("")
        add(f"Server side: not available ({srv.get('why')})")
    for wline in doc["warnings"]:
        add(f"WARNING: {wline}")
    return "\n".join(lines)


# --------------------------------------------------------------------------- commands

def analyze(run_dir, quiet=False):
    run = S.Run(run_dir)
    doc = analysis(run)
    plots.latency_over_time(run, os.path.join(run.dir, "latency_over_time.png"))
    plots.percentile_spectrum(run, os.path.join(run.dir, "percentile_spectrum.png"))
    files = ["analysis.json", "latency_over_time.png", "percentile_spectrum.png"]
    if doc["server"] and doc["server"]["available"] and doc["server"]["functions"]:
        plots.server_cpu(run.name, doc["server"], os.path.join(run.dir, "server_cpu_per_call.png"))
        files.append("server_cpu_per_call.png")
    if run.is_sweep():
        plots.latency_vs_load(run, S.phase_table(run, run.config.get("slo")), run.config.get("slo"),
                              os.path.join(run.dir, "latency_vs_load.png"))
        files.append("latency_vs_load.png")
    doc["files"] = files
    with open(os.path.join(run.dir, "analysis.json"), "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
    if not quiet:
        print(report(doc))
        print("\nwrote " + ", ".join(os.path.join(run.dir, x) for x in files))
    return doc


def _ratio(a, b):
    if a is None or b is None or b == 0:
        return None
    return a / b


def compare(run_dirs, out=None):
    runs = [S.Run(d) for d in run_dirs]
    labels, seen = [], {}
    for r in runs:  # unique legend labels
        lab = r.name
        if lab in seen:
            seen[lab] += 1
            lab = f"{lab} ({os.path.basename(r.dir)})"
        else:
            seen[lab] = 1
        labels.append(lab)
    if out is None:
        out = os.path.join(os.path.dirname(runs[0].dir), "compare-" + time.strftime("%Y%m%d-%H%M%S"))
    os.makedirs(out, exist_ok=True)
    docs = [analysis(r) for r in runs]
    base = docs[0]["overall"]
    keys = [("p50", "latency_ms", "p50"), ("p99", "latency_ms", "p99"), ("p99.9", "latency_ms", "p99.9")]
    table = []
    for lab, r, d in zip(labels, runs, docs):
        o = d["overall"]
        row = {"label": lab, "run_dir": r.dir, "test_name": d["test_name"]}
        for k, sect, sub in keys:
            row[f"{k}_ms"] = o[sect][sub]
            row[f"{k}_ratio"] = _ratio(o[sect][sub], base[sect][sub])
        row["achieved_rate"] = o["achieved_rate"]
        row["achieved_rate_ratio"] = _ratio(o["achieved_rate"], base["achieved_rate"])
        row["capacity_factor"] = o["capacity_factor"]
        if d.get("slo") and "highest_rate_meeting" in d["slo"]:
            row["slo_highest_rate"] = d["slo"]["highest_rate_meeting"]
        table.append(row)
    plots.spectrum_overlay(list(zip(labels, runs)), os.path.join(out, "percentile_spectrum.png"))
    files = ["compare.json", "percentile_spectrum.png"]
    sweeps = [(lab, S.phase_table(r)) for lab, r in zip(labels, runs) if r.is_sweep()]
    if sweeps:
        slo = next((r.config.get("slo") for r in runs if r.config.get("slo")), None)
        plots.load_overlay(sweeps, os.path.join(out, "latency_vs_load.png"), slo)
        files.append("latency_vs_load.png")
    doc = {"baseline": labels[0], "runs": table, "files": files}
    with open(os.path.join(out, "compare.json"), "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
    w = max(12, *(len(l) + 2 for l in labels))
    print(f"Comparison (ratios vs {labels[0]}; latency corrected, ms, nearest rank)")
    print(f"  {'run':<{w}}" + "".join(f"{h:>19}" for h in ["p50", "p99", "p99.9", "achieved/s"]))
    for row in table:
        cells = []
        for k in ("p50", "p99", "p99.9"):
            cells.append(f"{fmt(row[f'{k}_ms'])} (x{fmt(row[f'{k}_ratio'], 2)})")
        cells.append(f"{fmt(row['achieved_rate'], 1)} (x{fmt(row['achieved_rate_ratio'], 2)})")
        print(f"  {row['label']:<{w}}" + "".join(f"{c:>19}" for c in cells))
    print("\nwrote " + ", ".join(os.path.join(out, x) for x in files))
    return doc, out
