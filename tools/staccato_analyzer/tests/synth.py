"""A synthetic run directory following the runner's contract."""

import csv
import json
import os

HEADER = ("instance,application,phase,warmup,scheduled_s,sent_s,done_s,latency_ms,uncorrected_ms,"
          "send_lag_ms,status,bytes_out,bytes_in,error,call_id,queue_ms,exec_ms,cold_ms").split(",")

SLO = {"percentile": 99, "max_ms": 10}


def make_run(path, scale=1.0, test_name="synthetic_sweep", lag_ms=0.05, sweep=True, breakdown=True):
    """Two instances; a 3-phase sweep (rates 10/20/40 and 5/5/5 per s, 2 s each, 1 s pauses),
    0.5 s of warm-up at the start of each phase, cold starts, timeouts and a transport error in phase 2.
    Latencies are multiplied by `scale`. Returns the list of row dicts written."""
    os.makedirs(path, exist_ok=True)
    phases = [(0, 0.0, 2.0), (1, 3.0, 5.0), (2, 6.0, 8.0)] if sweep else [(0, 0.0, 4.0)]
    rates = {"fast": [10, 20, 40], "slow": [5, 5, 5]}
    apps = {"fast": "function0", "slow": "function1"}
    rows, cid = [], 0
    instances = {}
    for name in ("fast", "slow"):
        ph_meta = []
        for (ph, a, b), rate in zip(phases, rates[name]):
            ph_meta.append({"phase": ph, "rate": rate, "start_s": a, "end_s": b})
            n = int(round((b - a) * rate))
            for i in range(n):
                cid += 1
                t = a + i / rate
                warm = t - a < 0.5  # the runner: warm-up at the start of every phase
                base = {0: 1.0, 1: 2.0, 2: 20.0}[ph] if sweep else 1.0
                lat = (base + 0.01 * i) * scale
                cold = 5.0 * scale if i in (5, 6) else 0.0
                queue, exe = 0.2 * lat, 0.5 * lat
                lat += cold
                status, err = 200, ""
                if ph == 2 and name == "fast" and i in (30, 40):
                    status, err = 504, "timeout"
                if ph == 2 and name == "fast" and i == 50:
                    status, err = 0, "connect"
                done = t + lat / 1000.0
                row = {"instance": name, "application": apps[name], "phase": ph,
                       "warmup": "true" if warm else "false", "scheduled_s": f"{t:.6f}",
                       "sent_s": f"{t + lag_ms / 1000:.6f}", "done_s": f"{done:.6f}",
                       "latency_ms": f"{lat:.6f}", "uncorrected_ms": f"{max(lat - lag_ms, 0.5 * lat):.6f}",
                       "send_lag_ms": f"{lag_ms:.6f}", "status": status, "bytes_out": 10,
                       "bytes_in": 20 if status == 200 else 0, "error": err,
                       "call_id": f"{cid:016x}" if status else "",
                       "queue_ms": f"{queue:.6f}" if breakdown else "",
                       "exec_ms": f"{exe:.6f}" if breakdown else "",
                       "cold_ms": f"{cold:.6f}" if breakdown else ""}
                if status == 0:
                    row.update(done_s="", latency_ms="", uncorrected_ms="", queue_ms="", exec_ms="", cold_ms="")
                rows.append(row)
        instances[name] = {"offered_rate": rates[name][0], "phases": ph_meta,
                           "scheduled": sum(1 for r in rows if r["instance"] == name)}
    config = {"test_name": test_name, "test_duration_in_seconds": 2 if sweep else 4, "random_seed": 1,
              "blocking_cli": False, "warmup_in_seconds": 0.5,
              "instances": {n: {"application": apps[n], "distribution": "Uniform",
                                **({"rates": rates[n]} if sweep else {"rate": rates[n][0]}),
                                "activity_window": [0, 2]} for n in rates}}
    if sweep:
        config["pause_in_seconds"] = 1
        config["slo"] = SLO
    meta = {"config": config, "config_path": "synthetic.json", "seed_used": 1, "started_unix_s": 1.7e9,
            "duration_s": phases[-1][2], "base_url": "http://127.0.0.1:8080", "machine": {},
            "versions": {}, "instances": instances}
    with open(os.path.join(path, "run.json"), "w") as f:
        json.dump(meta, f)
    with open(os.path.join(path, "requests.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=HEADER)
        w.writeheader()
        w.writerows(rows)
    with open(os.path.join(path, "invocations.csv"), "w") as f:
        f.write("call_id,parent_call_id,function,receive_ns,dispatch_ns,complete_ns,queue_ms,exec_ms,outcome\n")
    with open(os.path.join(path, "summary.json"), "w") as f:
        f.write("{}")
    return rows
