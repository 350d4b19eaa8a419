"""`staccato bench run` (issue 5) against the real binaries: FaaSProfiler's
sample configuration (the paper's Listing 1) runs unchanged."""
import csv
import json
import os
import shutil
import subprocess

from harness import BIN, REPO, clean_env, own_server

WORKLOADS = REPO / "examples" / "workloads"
COLUMNS = ("instance,application,phase,warmup,scheduled_s,sent_s,done_s,latency_ms,uncorrected_ms,send_lag_ms,"
           "status,bytes_out,bytes_in,error,call_id,queue_ms,exec_ms,cold_ms").split(",")


def test_faasprofiler_listing1_runs_unchanged(tmp_path):
    with own_server(tmp_path / "srv") as srv:
        srv.deploy(WORKLOADS / "functions")
        work, home = tmp_path / "fp", tmp_path / "home"
        work.mkdir()
        home.mkdir()
        for f in ("faasprofiler-sample.json", "MonitoringScript.sh"):
            shutil.copy(WORKLOADS / f, work / f)
        (home / "image.jpg").write_bytes(os.urandom(50_000))  # the config's "~/image.jpg"
        env = clean_env(STACCATO_GATEWAY=srv.gateway, HOME=str(home))
        p = subprocess.run([str(BIN), "bench", "run", "faasprofiler-sample.json", "--out", str(work / "run")],
                           cwd=work, env=env, capture_output=True, text=True, timeout=180)
        assert p.returncode == 0, f"{p.stdout}\n{p.stderr}"

    run = work / "run"
    rows = list(csv.DictReader(open(run / "requests.csv")))
    assert list(rows[0].keys()) == COLUMNS
    assert all(r["status"] == "200" and r["error"] == "" for r in rows), [r for r in rows if r["status"] != "200"][:3]
    per = {i: [r for r in rows if r["instance"] == i] for i in ("instance0", "instance1", "instance2")}
    # Rates and activity windows from Listing 1: 20/s for 15 s, 100/s for 5 s, 15/s for 23 s.
    assert 200 <= len(per["instance0"]) <= 400, len(per["instance0"])
    assert 480 <= len(per["instance1"]) <= 520, len(per["instance1"])
    assert 240 <= len(per["instance2"]) <= 450, len(per["instance2"])
    for name, lo, hi in (("instance0", 5, 20), ("instance1", 10, 15), ("instance2", 1, 24)):
        ts = [float(r["scheduled_s"]) for r in per[name]]
        assert lo <= min(ts) and max(ts) <= hi, (name, min(ts), max(ts))
    assert all(int(r["bytes_out"]) == 50_000 for r in per["instance2"])  # the data_file is the body
    # Equal seeds must not make instances fire together (a FaaSProfiler bug).
    t0 = {float(r["scheduled_s"]) for r in per["instance0"]}
    assert not t0 & {float(r["scheduled_s"]) for r in per["instance2"]}
    # Staccato's timing header filled the breakdown; latency is from the schedule.
    assert all(r["queue_ms"] and r["exec_ms"] for r in rows)
    assert all(float(r["latency_ms"]) >= float(r["uncorrected_ms"]) - 1e-3 for r in rows)

    summary = json.loads((run / "summary.json").read_text())
    analysis = json.loads((run / "analysis.json").read_text())
    run_json = json.loads((run / "run.json").read_text())
    assert run_json["config"] == json.loads((WORKLOADS / "faasprofiler-sample.json").read_text())
    assert summary and analysis
    for png in ("latency_over_time.png", "percentile_spectrum.png"):
        assert (run / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (run / "invocations.csv").read_text().startswith("call_id,parent_call_id,function")
    # perf_monitoring.runtime_script ran beside the config, given the test's
    # duration as $1, as FaaSProfiler gives it.
    log = (work / "monitoring.log").read_text()
    want = int(json.loads((WORKLOADS / "faasprofiler-sample.json").read_text())["test_duration_in_seconds"])
    assert log.startswith(f"# duration_s {want}\n"), log[:200]
