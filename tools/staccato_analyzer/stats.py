"""Loading a run directory and the numbers computed from it (no plotting).

Definitions (also written into analysis.json):

* Percentile: nearest rank on the sorted values: the p-th percentile of N
  values is the value at 1-based rank ceil(p/100 * N) (rank 1 for p = 0).
  1..100 -> p50 = 50, p99 = 99, p100 = 100.
* Latency basis: the corrected latency (`latency_ms`, measured from the
  scheduled send time, wrk2-style) of every successful (error empty)
  non-warm-up request, as the runner's summary.json; failures are counted
  by kind (and as infinitely slow for SLO checks).
* Measured window of an (instance, phase) cell: from the end of its warm-up
  to the phase end. The warm-up end is the phase's `measured_start_s` in
  run.json if given, else (as the runner schedules it) phase k's start
  k * (test_duration_in_seconds + pause_in_seconds) + warmup_in_seconds,
  clamped to the activity window; without `warmup_in_seconds`, the first
  non-warm-up scheduled time when the cell has warm-up requests, else the
  window start. Windows of
  several cells are combined as the length of their union (pauses between
  sweep phases are not counted).
* Offered rate: the configured rate, time-weighted over the measured windows
  (sum(rate * window) / union length).
* Achieved rate: successful (error empty) measured requests that completed
  by the end of their phase, per second of measured window.
* Capacity factor: achieved rate / offered rate (1.0 = the system kept up;
  below 1 it completed fewer calls than were offered).
* SLO: a phase meets {"percentile": p, "max_ms": m} when the nearest-rank
  p-th percentile of its measured requests' latency, counting every failed
  request (error non-empty) as infinitely slow, is <= m.
"""

import csv
import json
import math
import os

import numpy as np

PERCENTILES = [50.0, 75.0, 90.0, 99.0, 99.9, 99.99, 99.999, 100.0]

FLOAT_COLS = ["scheduled_s", "sent_s", "done_s", "latency_ms", "uncorrected_ms",
              "send_lag_ms", "queue_ms", "exec_ms", "cold_ms"]
INT_COLS = ["phase", "status", "bytes_out", "bytes_in"]
STR_COLS = ["instance", "application", "error", "call_id"]


def percentile(values, p):
    """Nearest-rank percentile of `values` (any iterable of numbers), p in [0, 100].

    Returns NaN for no values. +inf values sort last (used for SLO checks).
    """
    v = np.sort(np.asarray(values, dtype=float))
    n = v.size
    if n == 0:
        return float("nan")
    if not 0.0 <= p <= 100.0:
        raise ValueError(f"percentile out of range: {p}")
    # The small epsilon keeps e.g. 99.9/100*1000 = 999.0000000000001 at rank 999.
    rank = math.ceil(p / 100.0 * n - 1e-9)
    rank = min(max(rank, 1), n)
    return float(v[rank - 1])


def percentiles(values, ps=PERCENTILES):
    return {pkey(p): percentile(values, p) for p in ps}


def pkey(p):
    """50.0 -> 'p50', 99.9 -> 'p99.9', 99.999 -> 'p99.999'."""
    s = f"{p:.3f}".rstrip("0").rstrip(".")
    return "p" + s


# --------------------------------------------------------------------------- loading

def _num(s, conv, default):
    s = (s or "").strip()
    if s == "":
        return default
    try:
        return conv(s)
    except ValueError:
        return conv(float(s)) if conv is int else default


def load_requests(path):
    """requests.csv -> dict of numpy arrays (empty numeric cells are NaN / -1)."""
    cols = {c: [] for c in FLOAT_COLS + INT_COLS + STR_COLS + ["warmup"]}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            for c in FLOAT_COLS:
                cols[c].append(_num(row.get(c), float, math.nan))
            for c in INT_COLS:
                cols[c].append(_num(row.get(c), int, -1 if c != "phase" else 0))
            for c in STR_COLS:
                cols[c].append((row.get(c) or "").strip())
            cols["warmup"].append((row.get("warmup") or "").strip().lower() in ("true", "1", "yes"))
    out = {}
    for c in FLOAT_COLS:
        out[c] = np.array(cols[c], dtype=float)
    for c in INT_COLS:
        out[c] = np.array(cols[c], dtype=np.int64)
    for c in STR_COLS:
        out[c] = np.array(cols[c], dtype=object)
    out["warmup"] = np.array(cols["warmup"], dtype=bool)
    return out


def load_invocations(path):
    """invocations.csv -> list of dicts, or [] when missing/empty."""
    if not os.path.exists(path) or os.path.getsize(path) == 0:
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


class Run:
    """One run directory, loaded."""

    def __init__(self, run_dir):
        self.dir = os.path.abspath(run_dir)
        with open(os.path.join(self.dir, "run.json")) as f:
            self.meta = json.load(f)
        self.config = self.meta.get("config") or {}
        self.req = load_requests(os.path.join(self.dir, "requests.csv"))
        self.invocations = load_invocations(os.path.join(self.dir, "invocations.csv"))
        self.n = len(self.req["instance"])
        self.cells = build_cells(self.meta, self.req)
        # The server's side (bench run's server.json), when the run has it.
        server = os.path.join(self.dir, "server.json")
        self.server = None
        if os.path.exists(server):
            with open(server) as f:
                self.server = json.load(f)

    @property
    def name(self):
        return self.config.get("test_name") or os.path.basename(self.dir.rstrip("/"))

    def instances(self):
        names = list((self.meta.get("instances") or {}).keys())
        for n in dict.fromkeys(self.req["instance"].tolist()):
            if n not in names:
                names.append(n)
        return names

    def phases(self):
        return sorted({c["phase"] for c in self.cells})

    def is_sweep(self):
        return len(self.phases()) > 1

    def has_breakdown(self):
        return bool(np.isfinite(self.req["queue_ms"]).any() or np.isfinite(self.req["exec_ms"]).any()
                    or np.isfinite(self.req["cold_ms"]).any())


# --------------------------------------------------------------------------- cells

def build_cells(meta, req):
    """One cell per (instance, phase): configured rate and measured window."""
    cells = []
    cfg = meta.get("config") or {}
    warmup_s = cfg.get("warmup_in_seconds")
    warmup_s = float(warmup_s) if warmup_s is not None else None
    dur_s = float(cfg.get("test_duration_in_seconds") or 0.0)
    pause_s = float(cfg.get("pause_in_seconds") or 0.0)
    inst_meta = meta.get("instances") or {}
    names = list(inst_meta.keys())
    for n in dict.fromkeys(req["instance"].tolist()):
        if n not in names:
            names.append(n)
    for name in names:
        im = inst_meta.get(name) or {}
        in_inst = req["instance"] == name
        phases = im.get("phases") or []
        if not phases:  # fall back: one phase spanning the scheduled times
            s = req["scheduled_s"][in_inst]
            lo = float(np.nanmin(s)) if s.size else 0.0
            hi = float(np.nanmax(s)) if s.size else 0.0
            phases = [{"phase": 0, "rate": im.get("offered_rate", 0.0), "start_s": lo, "end_s": hi}]
        for ph in phases:
            idx = int(ph.get("phase", 0))
            start, end = float(ph["start_s"]), float(ph["end_s"])
            mask = in_inst & (req["phase"] == idx)
            w = req["warmup"] & mask
            m = ~req["warmup"] & mask
            mstart = start
            if "measured_start_s" in ph:  # written by the runner (if it does)
                mstart = float(ph["measured_start_s"])
            elif warmup_s is not None:  # the runner's rule: warm-up from each phase's start
                mstart = min(max(idx * (dur_s + pause_s) + warmup_s, start), end)
            elif w.any():
                first_m = float(np.nanmin(req["scheduled_s"][m])) if m.any() else end
                mstart = min(max(first_m, start), end)
            cells.append({"instance": name, "phase": idx, "rate": float(ph.get("rate", 0.0) or 0.0),
                          "start_s": start, "end_s": end, "measured_start_s": mstart,
                          "mask": mask})
    return cells


def union_length(intervals):
    total, cur_lo, cur_hi = 0.0, None, None
    for lo, hi in sorted(intervals):
        if hi <= lo:
            continue
        if cur_hi is None or lo > cur_hi:
            if cur_hi is not None:
                total += cur_hi - cur_lo
            cur_lo, cur_hi = lo, hi
        else:
            cur_hi = max(cur_hi, hi)
    if cur_hi is not None:
        total += cur_hi - cur_lo
    return total


# --------------------------------------------------------------------------- stats

def _f(x):
    """JSON-friendly float: NaN -> None."""
    if x is None:
        return None
    x = float(x)
    return None if math.isnan(x) else x


def group_stats(run, cells):
    """Everything analysis.json reports for a group of cells (an instance, a phase, all)."""
    req = run.req
    mask = np.zeros(run.n, dtype=bool)
    for c in cells:
        mask |= c["mask"]
    meas = mask & ~req["warmup"]
    errs = req["error"] != ""
    responded = meas & ~errs & np.isfinite(req["latency_ms"])
    ok = meas & ~errs

    # achieved: successes completed by the end of their phase
    done_in_window = np.zeros(run.n, dtype=bool)
    for c in cells:
        done_in_window |= c["mask"] & (req["done_s"] <= c["end_s"] + 1e-9)
    window = union_length([(c["measured_start_s"], c["end_s"]) for c in cells])
    expected = sum(c["rate"] * max(0.0, c["end_s"] - c["measured_start_s"]) for c in cells)
    n_ok_window = int((ok & done_in_window).sum())
    offered = expected / window if window > 0 else float("nan")
    achieved = n_ok_window / window if window > 0 else float("nan")
    cf = achieved / offered if offered and offered > 0 else float("nan")

    lat = req["latency_ms"][responded]
    kinds = {}
    for k in req["error"][meas & errs].tolist():
        kinds[k] = kinds.get(k, 0) + 1

    cold_ms = req["cold_ms"]
    has_cold = np.isfinite(cold_ms[meas]).any()
    cold = responded & (np.nan_to_num(cold_ms, nan=0.0) > 0)
    warm = responded & ~cold
    sched = req["scheduled_s"][meas]
    return {
        "scheduled": int(meas.sum()),
        "warmup": int((mask & req["warmup"]).sum()),
        "responses": int(responded.sum()),
        "ok": int(ok.sum()),
        "errors": int((meas & errs).sum()),
        "errors_by_kind": dict(sorted(kinds.items())),
        "latency_ms": {k: _f(v) for k, v in percentiles(lat).items()},
        "mean_ms": _f(lat.mean()) if lat.size else None,
        "uncorrected_p99_ms": _f(percentile(req["uncorrected_ms"][responded & np.isfinite(req["uncorrected_ms"])], 99)),
        "send_lag_p99_ms": _f(percentile(req["send_lag_ms"][meas & np.isfinite(req["send_lag_ms"])], 99)),
        "window_s": window,
        "offered_rate": _f(offered),
        "scheduled_rate": _f(sched.size / window) if window > 0 else None,
        "achieved_rate": _f(achieved),
        "capacity_factor": _f(cf),
        "breakdown_available": bool(has_cold or np.isfinite(req["queue_ms"][meas]).any()),
        "warm": {"n": int(warm.sum()), "p50_ms": _f(percentile(req["latency_ms"][warm], 50)),
                 "p99_ms": _f(percentile(req["latency_ms"][warm], 99))},
        "cold": {"n": int(cold.sum()), "p50_ms": _f(percentile(req["latency_ms"][cold], 50)),
                 "p99_ms": _f(percentile(req["latency_ms"][cold], 99)),
                 "mean_cold_ms": _f(cold_ms[cold].mean()) if cold.any() else None},
        "_slo_latencies": np.where(errs[meas], np.inf, req["latency_ms"][meas]),
    }


def slo_percentile(stats, p):
    """The SLO latency of a group: failed requests count as +inf."""
    v = stats["_slo_latencies"]
    v = np.where(np.isnan(v), np.inf, v)
    return percentile(v, p)


def phase_table(run, slo=None):
    """Per-phase stats over all instances (the sweep view)."""
    rows = []
    for ph in run.phases():
        cells = [c for c in run.cells if c["phase"] == ph]
        s = group_stats(run, cells)
        s["phase"] = ph
        s["start_s"] = min(c["start_s"] for c in cells)
        s["end_s"] = max(c["end_s"] for c in cells)
        s["configured_rate"] = sum(c["rate"] for c in cells)
        if slo:
            v = slo_percentile(s, float(slo["percentile"]))
            s["slo_latency_ms"] = None if math.isinf(v) else _f(v)
            s["slo_ok"] = bool(v <= float(slo["max_ms"]))
        rows.append(s)
    return rows


def slo_select(phase_rows):
    """Highest configured rate among phases meeting the SLO (None if none does)."""
    best = None
    for r in phase_rows:
        if r.get("slo_ok") and (best is None or r["configured_rate"] > best["configured_rate"]):
            best = r
    return best


def breakdown_bins(sched_s, latency_ms, cold_ms, queue_ms, exec_ms, bin_s, t0=None, t1=None):
    """Per-time-bin means of the latency components (FaaSProfiler Fig. 5).

    Only rows with a finite latency and at least one finite component are used;
    missing components count as 0. Returns dict of arrays: `center_s`, `n`,
    `init`, `wait`, `exec`, `rest` (latency - init - wait - exec, clipped at 0),
    `latency`; empty bins are NaN.
    """
    sched_s = np.asarray(sched_s, float)
    lat = np.asarray(latency_ms, float)
    comps = [np.asarray(x, float) for x in (cold_ms, queue_ms, exec_ms)]
    use = np.isfinite(lat) & np.isfinite(sched_s) & np.any([np.isfinite(c) for c in comps], axis=0)
    if not use.any():
        t0 = 0.0 if t0 is None else t0
        t1 = t0 + bin_s if t1 is None else t1
    t0 = float(np.nanmin(sched_s[use])) if t0 is None else t0
    t1 = float(np.nanmax(sched_s[use])) if t1 is None else t1
    nb = max(1, int(math.ceil((t1 - t0) / bin_s - 1e-9)))
    out = {"center_s": t0 + (np.arange(nb) + 0.5) * bin_s, "n": np.zeros(nb, dtype=int)}
    for key in ("init", "wait", "exec", "rest", "latency"):
        out[key] = np.full(nb, np.nan)
    if not use.any():
        return out
    idx = np.clip(np.floor((sched_s[use] - t0) / bin_s).astype(np.int64), 0, nb - 1)
    counts = np.bincount(idx, minlength=nb)
    out["n"] = counts
    nz = counts > 0

    def mean(x):
        s = np.bincount(idx, weights=x, minlength=nb)
        m = np.full(nb, np.nan)
        m[nz] = s[nz] / counts[nz]
        return m

    parts = [np.nan_to_num(c[use], nan=0.0) for c in comps]
    out["init"], out["wait"], out["exec"] = (mean(p) for p in parts)
    out["latency"] = mean(lat[use])
    out["rest"] = np.clip(mean(lat[use] - parts[0] - parts[1] - parts[2]), 0, None)
    return out


def nice_bin(duration_s, target_bins=100):
    raw = max(duration_s, 1e-3) / target_bins
    for step in (0.01, 0.02, 0.05, 0.1, 0.2, 0.25, 0.5, 1, 2, 5, 10, 30, 60):
        if step >= raw:
            return float(step)
    return float(math.ceil(raw / 60) * 60)
