import json
import math
import os
import subprocess
import sys

import pytest

import synth
from staccato_analyzer import analyze as A
from staccato_analyzer import stats as S

TOOLS = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def nearest_rank(vals, p):
    v = sorted(vals)
    return v[max(1, math.ceil(round(p / 100 * len(v), 9))) - 1]


def measured(rows, **kw):
    return [r for r in rows if r["warmup"] == "false" and all(r[k] == v for k, v in kw.items())]


def responded_lat(rows):
    """Latencies of the successful requests (the latency basis)."""
    return [float(r["latency_ms"]) for r in rows if r["error"] == ""]


@pytest.fixture()
def sweep(tmp_path):
    d = tmp_path / "run1"
    rows = synth.make_run(str(d))
    return str(d), rows


def test_sweep_detection_and_phase_stats(sweep):
    d, rows = sweep
    run = S.Run(d)
    assert run.is_sweep() and run.phases() == [0, 1, 2]
    assert run.has_breakdown()
    ph = S.phase_table(run, synth.SLO)
    assert [r["configured_rate"] for r in ph] == [15, 25, 45]
    for r in ph:
        m = measured(rows, phase=r["phase"])
        assert r["scheduled"] == len(m)
        assert r["latency_ms"]["p99"] == pytest.approx(nearest_rank(responded_lat(m), 99))
    # phase 2: 60 + 7 measured in 1.5 s, 3 failures -> 64 ok / 1.5 s
    assert ph[2]["errors"] == 3 and ph[2]["errors_by_kind"] == {"connect": 1, "timeout": 2}
    assert ph[2]["achieved_rate"] == pytest.approx(64 / 1.5)
    assert ph[2]["capacity_factor"] == pytest.approx(64 / 1.5 / 45)
    # phase 1: fast 30 + slow 7 (3.6 .. 4.8 s) measured vs 25/s * 1.5 s offered
    assert ph[1]["capacity_factor"] == pytest.approx(37 / 37.5)
    # phase 0 has 0.5 s of warm-up: measured window [0.5, 2]
    assert ph[0]["window_s"] == pytest.approx(1.5)
    assert ph[0]["offered_rate"] == pytest.approx(15)
    assert ph[0]["achieved_rate"] == pytest.approx((15 + 7) / 1.5)
    assert [r["warmup"] for r in ph] == [5 + 3, 10 + 3, 20 + 3]
    # SLO: p99 <= 10 ms holds for phases 0, 1; phase 2 has failures -> inf
    assert [r["slo_ok"] for r in ph] == [True, True, False]
    assert ph[2]["slo_latency_ms"] is None
    assert S.slo_select(ph)["configured_rate"] == 25


def test_capacity_factor_overload(tmp_path):
    """Completions after the phase end do not count as achieved."""
    d = tmp_path / "r"
    rows = synth.make_run(str(d), sweep=False)
    path = d / "requests.csv"
    lines = path.read_text().splitlines()
    hdr = lines[0].split(",")
    di = hdr.index("done_s")
    out = [lines[0]]
    slowed = 0
    for ln in lines[1:]:
        f = ln.split(",")
        if f[0] == "fast" and float(f[hdr.index("scheduled_s")]) >= 3.0:
            f[di] = "4.5"  # done after the 4 s phase end
            slowed += 1
        out.append(",".join(f))
    path.write_text("\n".join(out) + "\n")
    run = S.Run(str(d))
    s = S.group_stats(run, [c for c in run.cells if c["instance"] == "fast"])
    assert s["offered_rate"] == pytest.approx(10)
    # 40 scheduled in [0, 4), the first 5 (< 0.5 s) are warm-up: window 3.5 s
    assert s["window_s"] == pytest.approx(3.5)
    assert s["achieved_rate"] == pytest.approx((35 - slowed) / 3.5)
    assert s["capacity_factor"] == pytest.approx((35 - slowed) / 35)


def _run_cli(*args):
    env = dict(os.environ, PYTHONPATH=TOOLS, MPLBACKEND="Agg")
    p = subprocess.run([sys.executable, "-m", "staccato_analyzer", *args], env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return p.stdout


def _png_ok(path):
    assert os.path.exists(path), path
    with open(path, "rb") as f:
        head = f.read(8)
    assert head == b"\x89PNG\r\n\x1a\n"
    assert os.path.getsize(path) > 10_000


def test_end_to_end(tmp_path):
    d1, d2, d3 = (str(tmp_path / n) for n in ("run1", "run2", "flat"))
    rows = synth.make_run(d1)
    synth.make_run(d2, scale=2.0, test_name="slower")
    synth.make_run(d3, sweep=False, breakdown=False, lag_ms=3.0, test_name="flat")

    out = _run_cli("analyze", d1)
    assert "50.000%" in out and "99.999%" in out and "overall" in out
    assert "capacity factor = achieved rate / offered rate" in out
    assert "highest rate meeting the SLO: 25" in out
    assert "timeout: 2" in out and "connect: 1" in out
    assert "generator, not the system" not in out
    for f in ("latency_over_time.png", "percentile_spectrum.png", "latency_vs_load.png"):
        _png_ok(os.path.join(d1, f))

    doc = json.load(open(os.path.join(d1, "analysis.json")))
    m = measured(rows)
    lat = responded_lat(m)
    ov = doc["overall"]
    for p in S.PERCENTILES:
        assert ov["latency_ms"][S.pkey(p)] == pytest.approx(nearest_rank(lat, p)), p
    assert ov["scheduled"] == len(m)
    assert ov["errors"] == 3 and ov["errors_by_kind"] == {"connect": 1, "timeout": 2}
    assert ov["ok"] == len(m) - 3
    assert ov["send_lag_p99_ms"] == pytest.approx(0.05)
    cold = [r for r in m if r["error"] == "" and float(r["cold_ms"] or 0) > 0]
    assert ov["cold"]["n"] == len(cold) and ov["cold"]["mean_cold_ms"] == pytest.approx(5.0)
    assert ov["warm"]["n"] == len(lat) - len(cold)
    fast = measured(rows, instance="fast")
    assert doc["instances"]["fast"]["latency_ms"]["p50"] == pytest.approx(nearest_rank(responded_lat(fast), 50))
    assert doc["instances"]["fast"]["application"] == "function0"
    assert doc["sweep"] is True and len(doc["phases"]) == 3
    assert doc["slo"]["highest_rate_meeting"] == 25 and doc["slo"]["phase"] == 1
    # overall: windows [0.5,2]+[3.5,5]+[6.5,8] = 4.5 s
    assert ov["window_s"] == pytest.approx(4.5)
    assert ov["capacity_factor"] == pytest.approx(ov["achieved_rate"] / ov["offered_rate"])

    out = _run_cli("analyze", d3)
    assert "the generator, not the system, may be the bottleneck" in out
    assert "n/a (no queue/exec/cold breakdown" in out
    _png_ok(os.path.join(d3, "latency_over_time.png"))
    assert not os.path.exists(os.path.join(d3, "latency_vs_load.png"))
    doc3 = json.load(open(os.path.join(d3, "analysis.json")))
    assert doc3["sweep"] is False and doc3["warnings"]

    cmp_dir = str(tmp_path / "cmp")
    out = _run_cli("compare", d1, d2, d3, "--out", cmp_dir)
    assert "slower" in out and "x2.00" in out
    _png_ok(os.path.join(cmp_dir, "percentile_spectrum.png"))
    _png_ok(os.path.join(cmp_dir, "latency_vs_load.png"))
    c = json.load(open(os.path.join(cmp_dir, "compare.json")))
    assert [r["label"] for r in c["runs"]] == ["synthetic_sweep", "slower", "flat"]
    assert c["runs"][0]["p50_ratio"] == pytest.approx(1.0)
    assert c["runs"][1]["p99_ratio"] == pytest.approx(2.0, rel=1e-3)
    assert c["runs"][1]["p99.9_ratio"] == pytest.approx(2.0, rel=1e-3)
    assert c["runs"][2]["achieved_rate"] == pytest.approx(doc3["overall"]["achieved_rate"])

    # default output directory: next to the first run
    _run_cli("compare", d1, d2)
    assert any(n.startswith("compare-") for n in os.listdir(str(tmp_path)))


def test_missing_invocations_and_phases(tmp_path):
    d = tmp_path / "r"
    synth.make_run(str(d), sweep=False)
    os.remove(d / "invocations.csv")
    meta = json.load(open(d / "run.json"))
    for v in meta["instances"].values():
        v.pop("phases")
    json.dump(meta, open(d / "run.json", "w"))
    doc = A.analyze(str(d), quiet=True)
    assert doc["invocations"] == 0
    assert doc["instances"]["fast"]["offered_rate"] == pytest.approx(10)


def test_server_side_is_reported_and_missing_counters_are_said(tmp_path):
    d = str(tmp_path / "run")
    rows = synth.make_run(d)
    # server.json as bench run writes it: function0 ran 200 calls in 50 ms of CPU.
    with open(os.path.join(d, "server.json"), "w") as f:
        json.dump({"available": True, "how": "test", "functions": {"function0": {
            "calls": 200, "failed": 0, "cpu_ms": 50.0, "run_delay_ms": 2.0, "voluntary_switches": 300,
            "involuntary_switches": 100, "cpu_us_per_call": 250.0, "run_delay_us_per_call": 10.0,
            "switches_per_call": 2.0}},
            "hardware_counters": {"available": False, "why": "not supported here"}}, f)
    out = _run_cli("analyze", d)
    assert "Server side" in out and "hardware counters (IPC, cache misses): not available (not supported here)" in out
    line = next(l for l in out.splitlines() if l.strip().startswith("function0") and "250.0" in l)
    doc = json.load(open(os.path.join(d, "analysis.json")))
    f0 = doc["server"]["functions"]["function0"]
    ok = [r for r in measured(rows) if r["error"] == "" and r["application"] == "function0"]
    cold = [r for r in ok if float(r["cold_ms"] or 0) > 0]
    assert (f0["external_warm"], f0["external_cold"]) == (len(ok) - len(cold), len(cold)), line
    _png_ok(os.path.join(d, "server_cpu_per_call.png"))
    # Without a gateway to ask: said so, no plot.
    with open(os.path.join(d, "server.json"), "w") as f:
        json.dump({"available": False, "why": "no Staccato gateway answered"}, f)
    out = _run_cli("analyze", d)
    assert "Server side: not available (no Staccato gateway answered)" in out
