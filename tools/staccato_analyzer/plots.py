"""PNG plots (matplotlib, Agg backend)."""

import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from . import stats as S  # noqa: E402

SPECTRUM_TICKS = [50.0, 90.0, 99.0, 99.9, 99.99, 99.999]


def _save(fig, path):
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def latency_over_time(run, path):
    req = run.req
    fig, ax = plt.subplots(figsize=(11, 5.5))
    lat = req["latency_ms"]
    sched = req["scheduled_s"]
    fin = np.isfinite(lat) & np.isfinite(sched)
    if run.has_breakdown() and fin.any():
        dur = float(np.nanmax(sched[fin]) - np.nanmin(sched[fin]))
        bin_s = S.nice_bin(dur)
        ok = fin & (req["error"] == "")
        b = S.breakdown_bins(sched[ok], lat[ok], req["cold_ms"][ok], req["queue_ms"][ok],
                             req["exec_ms"][ok], bin_s)
        x = b["center_s"]
        layers = [np.nan_to_num(b[k]) for k in ("init", "wait", "exec", "rest")]
        ax.stackplot(x, *layers, step="mid", alpha=0.55,
                     colors=["#d62728", "#ff7f0e", "#2ca02c", "#9ecae1"],
                     labels=[f"init (cold start), mean per {bin_s:g} s bin",
                             "wait (engine queue)", "exec (function)", "rest (network, gateway, client)"])
    names = run.instances()
    cmap = plt.get_cmap("tab10")
    for i, name in enumerate(names):
        m = fin & (req["instance"] == name)
        if not m.any():
            continue
        w = m & req["warmup"]
        mm = m & ~req["warmup"]
        ax.scatter(sched[mm], lat[mm], s=4, alpha=0.5, color=cmap(i % 10), label=f"{name} (per request)")
        if w.any():
            ax.scatter(sched[w], lat[w], s=4, alpha=0.35, color="grey", marker="x",
                       label="warm-up" if i == 0 else None)
    err = (req["error"] != "") & np.isfinite(sched)
    if err.any():
        y = np.where(np.isfinite(lat[err]), lat[err], 0.0)
        ax.scatter(sched[err], y, s=14, marker="x", color="black", label=f"errors ({int(err.sum())})")
    if fin.any():
        cap = S.percentile(lat[fin], 99.9)
        top = float(np.nanmax(lat[fin]))
        if top > 3 * cap and cap > 0:
            above = int((lat[fin] > cap * 1.2).sum())
            ax.set_ylim(0, cap * 1.2)
            ax.text(0.99, 0.98, f"{above} requests above {cap * 1.2:.3g} ms not shown (max {top:.3g} ms)",
                    transform=ax.transAxes, ha="right", va="top", fontsize=8)
        else:
            ax.set_ylim(bottom=0)
    ax.set_xlabel("scheduled send time (s since test start)")
    ax.set_ylabel("latency (ms, corrected)")
    ax.set_title(f"{run.name}: latency over time" + ("" if run.has_breakdown() else " (no breakdown)"))
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=8, markerscale=3)
    _save(fig, path)


def spectrum_points(values, max_points=400):
    """(x = 1/(1-p), y = nearest-rank percentile) points for an HdrHistogram-style plot."""
    v = np.sort(np.asarray(values, float))
    n = v.size
    if n == 0:
        return np.array([]), np.array([])
    xmax = max(float(n), 2.0)
    xs = np.unique(np.concatenate([np.geomspace(1.0, xmax, max_points), [xmax]]))
    ps = 1.0 - 1.0 / xs
    ranks = np.clip(np.ceil(ps * n - 1e-9).astype(int), 1, n)
    return xs, v[ranks - 1]


def _spectrum_axes(ax, title):
    ax.set_xscale("log")
    ticks = [1.0 / (1.0 - p / 100.0) for p in SPECTRUM_TICKS]
    ax.set_xticks(ticks)
    ax.set_xticklabels([f"{p:g}%" for p in SPECTRUM_TICKS])
    ax.minorticks_off()
    ax.set_xlim(left=1.0)
    ax.set_xlabel("percentile (log scale of 1/(1-p))")
    ax.set_ylabel("latency (ms, corrected)")
    ax.set_title(title)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)


def percentile_spectrum(run, path):
    req = run.req
    base = ~req["warmup"] & (req["error"] == "") & np.isfinite(req["latency_ms"])
    fig, ax = plt.subplots(figsize=(10, 5.5))
    for name in run.instances():
        xs, ys = spectrum_points(req["latency_ms"][base & (req["instance"] == name)])
        if xs.size:
            ax.plot(xs, ys, lw=1.3, label=name)
    xs, ys = spectrum_points(req["latency_ms"][base])
    if xs.size:
        ax.plot(xs, ys, lw=2.2, color="black", label="overall")
    _spectrum_axes(ax, f"{run.name}: latency by percentile (warm-up excluded)")
    _save(fig, path)


def spectrum_overlay(runs, path):
    fig, ax = plt.subplots(figsize=(10, 5.5))
    for label, run in runs:
        req = run.req
        base = ~req["warmup"] & (req["error"] == "") & np.isfinite(req["latency_ms"])
        xs, ys = spectrum_points(req["latency_ms"][base])
        if xs.size:
            ax.plot(xs, ys, lw=1.8, label=label)
    _spectrum_axes(ax, "latency by percentile: " + " vs ".join(l for l, _ in runs))
    _save(fig, path)


def _load_axes(axl, axr, title, slo):
    axl.set_xlabel("offered rate (requests/s)")
    axl.set_ylabel("latency (ms, corrected)")
    axl.set_title(title, fontsize=10)
    # Past saturation latencies grow by orders of magnitude: on a linear
    # axis that hides every difference below it.
    lo, hi = _finite_range(axl)
    if lo and hi / lo > 100:
        axl.set_yscale("log")
    axl.grid(alpha=0.3)
    if slo:
        axl.axhline(float(slo["max_ms"]), color="red", ls="--", lw=1,
                    label=f"SLO p{float(slo['percentile']):g} <= {float(slo['max_ms']):g} ms")
    axl.legend(fontsize=8)
    axr.set_xlabel("offered rate (requests/s)")
    axr.set_ylabel("achieved rate (requests/s)")
    axr.set_title("throughput")
    axr.grid(alpha=0.3)
    axr.legend(fontsize=8)


def _plot_load(axl, axr, rows, label, color=None, slo_pct=None):
    x = np.array([r["configured_rate"] for r in rows], float)
    p50 = np.array([r["latency_ms"]["p50"] or np.nan for r in rows], float)
    p99 = np.array([r["latency_ms"]["p99"] or np.nan for r in rows], float)
    ach = np.array([r["achieved_rate"] or np.nan for r in rows], float)
    o = np.argsort(x)
    pre = f"{label} " if label else ""
    l1, = axl.plot(x[o], p50[o], "o-", color=color, label=f"{pre}p50")
    axl.plot(x[o], p99[o], "s--", color=l1.get_color(), label=f"{pre}p99")
    axr.plot(x[o], ach[o], "o-", color=l1.get_color(), label=f"{pre}achieved")
    return x


def latency_vs_load(run, rows, slo, path):
    fig, (axl, axr) = plt.subplots(1, 2, figsize=(13, 5.2), gridspec_kw={"width_ratios": [3, 2]})
    x = _plot_load(axl, axr, rows, "")
    if x.size:
        axr.plot([0, x.max()], [0, x.max()], ":", color="grey", label="achieved = offered")
    if slo:
        best = S.slo_select(rows)
        if best is not None:
            axl.axvline(best["configured_rate"], color="red", ls=":", lw=1,
                        label=f"highest rate meeting SLO: {best['configured_rate']:g}/s")
    _load_axes(axl, axr, f"{run.name}: latency vs offered load (per phase)", slo)
    _save(fig, path)


def load_overlay(runs_rows, path, slo=None):
    fig, (axl, axr) = plt.subplots(1, 2, figsize=(13, 5.2), gridspec_kw={"width_ratios": [3, 2]})
    xmax = 0.0
    for label, rows in runs_rows:
        x = _plot_load(axl, axr, rows, label)
        if x.size:
            xmax = max(xmax, float(x.max()))
    if xmax:
        axr.plot([0, xmax], [0, xmax], ":", color="grey", label="achieved = offered")
    names = [l for l, _ in runs_rows]
    title = "latency vs offered load: " + (" vs ".join(names) if len(names) <= 2 else f"{len(names)} runs")
    _load_axes(axl, axr, title, slo)
    _save(fig, path)


def _finite_range(ax):
    """The smallest positive and the largest y value plotted on `ax`."""
    ys = [y for line in ax.get_lines() for y in np.asarray(line.get_ydata(), float)
          if np.isfinite(y) and y > 0]
    return (min(ys), max(ys)) if ys else (None, None)


def finite(x):
    return x is not None and not (isinstance(x, float) and math.isnan(x))


def server_cpu(name, server, path):
    """Per function: CPU time per call of its processes (and time they
    waited for a CPU), beside how many of the run's external calls of it
    were warm and cold. CPU is counted per process, so a cold call's share
    cannot be told from a warm one's: the right panel shows how many of
    each the CPU figure covers."""
    fns = list(server["functions"])
    f = server["functions"]
    cpu = [f[n]["cpu_us_per_call"] or 0.0 for n in fns]
    wait = [f[n]["run_delay_us_per_call"] or 0.0 for n in fns]
    warm = [f[n]["external_warm"] for n in fns]
    cold = [f[n]["external_cold"] for n in fns]
    y = np.arange(len(fns))
    pc = server.get("per_call_cpu") or {}
    measured = pc.get("functions") if pc.get("available") else None
    if measured:
        fig, (a, b, c) = plt.subplots(1, 3, figsize=(16, 1.2 + 0.45 * len(fns)), sharey=True,
                                      gridspec_kw={"width_ratios": [2, 1, 2]})
    else:
        fig, (a, b) = plt.subplots(1, 2, figsize=(12, 1.2 + 0.45 * len(fns)), sharey=True,
                                   gridspec_kw={"width_ratios": [2, 1]})
    a.barh(y, cpu, color="#2ca02c", label="on a CPU")
    a.barh(y, wait, left=cpu, color="#ff7f0e", alpha=0.7, label="waiting for a CPU")
    a.set_yticks(y, fns)
    a.invert_yaxis()
    a.set_xlabel("µs per call (all calls the engines ran)")
    a.set_title(f"{name}: each function's processes, server side", fontsize=10)
    a.legend(fontsize=8)
    a.grid(axis="x", alpha=0.3)
    b.barh(y, warm, color="#9ecae1", label="warm")
    b.barh(y, cold, left=warm, color="#d62728", label="cold")
    b.set_xlabel("external calls in the run")
    b.set_title("warm vs cold", fontsize=10)
    b.legend(fontsize=8)
    b.grid(axis="x", alpha=0.3)
    if measured:
        # Each call's handler CPU as its runtime measured it: warm and cold apart.
        # A function not measured (Node.js, Go, async Python) gets no bar
        # but a label: never a zero.
        mean = lambda n, k: ((measured.get(n) or {}).get(k) or {}).get("mean_us")
        h, labeled = 0.38, set()
        for i, n in enumerate(fns):
            if n not in measured:
                c.text(0, i, " not measured", va="center", fontsize=8, color="#555")
                continue
            for dy, k, color in ((-h / 2, "warm", "#9ecae1"), (h / 2, "cold", "#d62728")):
                if mean(n, k) is not None:
                    c.barh(i + dy, mean(n, k), height=h, color=color, label=None if k in labeled else f"{k} calls")
                    labeled.add(k)
        c.set_xlabel("CPU µs per call, measured per call (mean)")
        c.set_title("each call's handler, warm vs cold", fontsize=10)
        c.legend(fontsize=8)
        c.grid(axis="x", alpha=0.3)
    hw = server.get("hardware_counters") or {}
    if not hw.get("available"):
        fig.text(0.01, 0.01, "hardware counters (IPC, cache misses): not available" +
                 (f" — {hw['why']}" if hw.get("why") else ""), fontsize=7, color="#555")
    _save(fig, path)
