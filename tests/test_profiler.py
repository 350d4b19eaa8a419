"""`staccato bench run` (issue 5) against the real binaries: FaaSProfiler's
sample configuration (the paper's Listing 1) runs unchanged."""
import csv
import http.server
import json
import os
import shutil
import subprocess
import threading

from harness import BIN, REPO, clean_env, own_server

WORKLOADS = REPO / "examples" / "workloads"
COLUMNS = ("instance,application,phase,warmup,scheduled_s,sent_s,done_s,latency_ms,uncorrected_ms,send_lag_ms,"
           "status,bytes_out,bytes_in,error,call_id,queue_ms,exec_ms,cold_ms").split(",")


def test_faasprofiler_listing1_runs_unchanged(tmp_path):
    with own_server(tmp_path / "srv", extra=["--cpu-per-call"]) as srv:
        srv.deploy(WORKLOADS / "functions")
        work, home = tmp_path / "fp", tmp_path / "home"
        work.mkdir()
        home.mkdir()
        for f in ("faasprofiler-sample.json", "MonitoringScript.sh"):
            shutil.copy(WORKLOADS / f, work / f)
        (home / "image.jpg").write_bytes(os.urandom(50_000))  # the config's "~/image.jpg"
        env = clean_env(STACCATO_GATEWAY=srv.gateway, STACCATO_TOKEN=srv.token, HOME=str(home))
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
    # The server's side: what each function's processes used over the run,
    # per call the engines ran; hardware counters said to be missing on a
    # host that has none, never shown as zeros.
    server = json.loads((run / "server.json").read_text())
    assert server["available"], server
    for fn, n_requests in (("function0", len(per["instance0"]) + len(per["instance1"])),
                           ("function1", len(per["instance2"]))):
        f = server["functions"][fn]
        assert f["calls"] >= n_requests, (fn, f, n_requests)
        assert f["cpu_ms"] > 0 and f["cpu_us_per_call"] > 0, (fn, f)
        assert f["voluntary_switches"] + f["involuntary_switches"] > 0, (fn, f)
        a = analysis["server"]["functions"][fn]
        assert a["external_warm"] + a["external_cold"] == n_requests, (fn, a, n_requests)
    # Per call, as the runtimes measured it (--cpu-per-call): Python's
    # plain-def function0 and C's function1, warm calls and cold ones apart.
    pc = server["per_call_cpu"]
    assert pc["available"], pc
    for fn in ("function0", "function1"):
        warm = pc["functions"][fn]["warm"]
        assert warm["calls"] > 100 and warm["mean_us"] > 0 and warm["p50_us"] <= warm["p99_us"], (fn, pc)
    assert pc["functions"]["function0"]["warm"]["p50_us"] > 100, pc  # ~1 ms of json.dumps
    report = subprocess.run([str(BIN), "bench", "analyze", str(run)], env=clean_env(), capture_output=True,
                            text=True, timeout=120)
    assert "CPU per call, measured by the runtime" in report.stdout, report.stdout + report.stderr
    hw = server["hardware_counters"]
    perf = subprocess.run(["perf", "stat", "-x", ",", "-e", "cycles,instructions", "true"],
                          capture_output=True, text=True) if shutil.which("perf") else None
    if perf is None or "<not supported>" in perf.stderr or perf.returncode != 0:
        assert hw["available"] is False and hw["why"], hw
    assert "server_cpu_per_call.png" in analysis["files"]
    for png in ("latency_over_time.png", "percentile_spectrum.png", "server_cpu_per_call.png"):
        assert (run / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    inv = list(csv.DictReader(open(run / "invocations.csv")))
    assert inv and {"cold", "cpu_us"} <= set(inv[0]), inv[:1]
    assert all(r["cpu_us"] for r in inv if r["function"] in ("function0", "function1")), inv[:3]
    # perf_monitoring.runtime_script ran beside the config, given the test's
    # duration as $1, as FaaSProfiler gives it.
    log = (work / "monitoring.log").read_text()
    want = int(json.loads((WORKLOADS / "faasprofiler-sample.json").read_text())["test_duration_in_seconds"])
    assert log.startswith(f"# duration_s {want}\n"), log[:200]


class _Recorder(http.server.BaseHTTPRequestHandler):
    """A generic endpoint: keeps each request's path, Content-Type and body."""
    seen = []

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.seen.append((self.path, self.headers.get("Content-Type"), body))
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args):
        pass


def test_configs_faasprofiler_accepts_run_with_warnings(tmp_path):
    # Written as FaaSProfiler's README and example configs write them, with
    # what FaaSProfiler itself lets through: a key it does not know, a
    # window reaching past the test, a window beside an interarrivals_list,
    # a param_file holding a list, and paths relative to where it runs
    # (its repository's root) rather than to the config.
    receiver = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    _Recorder.seen = []
    root, configs = tmp_path / "faas-profiler", tmp_path / "faas-profiler" / "workload_configs"
    configs.mkdir(parents=True)
    (root / "params.json").write_text("[1, 2, 3]")
    (root / "monitoring").mkdir()
    (root / "monitoring" / "RuntimeMonitoring.sh").write_text(f'echo "ran $1" > {tmp_path / "monitor.out"}\n')
    config = {
        "test_name": "fp accepts/this",
        "test_duration_in_seconds": 3,
        "random_seed": 100,
        "blocking_cli": False,
        "endpoint": "generic",
        "owner": "someone",
        "instances": {
            "generic": {"application": "example_app1", "url": f"http://127.0.0.1:{receiver.server_port}/app1",
                        "data": {"message": "sample.png"}, "distribution": "Uniform", "rate": 10,
                        "activity_window": [1, 60]},
            "listed": {"application": "function0", "interarrivals_list": [0.5, 0.5, 0.5, 10],
                       "activity_window": [2, 3]},
            "params": {"application": "function0", "param_file": "params.json", "distribution": "Poisson",
                       "rate": 5},
        },
        "perf_monitoring": {"runtime_script": "monitoring/RuntimeMonitoring.sh", "post_script": None},
    }
    (configs / "workload_configs.json").write_text(json.dumps(config, indent=4))
    try:
        with own_server(tmp_path / "srv") as srv:
            srv.deploy(WORKLOADS / "functions")
            env = clean_env(STACCATO_GATEWAY=srv.gateway)
            p = subprocess.run([str(BIN), "bench", "run", "workload_configs/workload_configs.json", "--out",
                                str(tmp_path / "run")], cwd=root, env=env, capture_output=True, text=True, timeout=120)
            assert p.returncode == 0, f"{p.stdout}\n{p.stderr}"
    finally:
        receiver.shutdown()
    warnings = [line for line in p.stderr.splitlines() if line.startswith("warning: ")]
    assert any("unknown field `owner`" in w for w in warnings), p.stderr
    assert any("instance generic: activity_window [1, 60] reaches outside the test: cut to [1, 3]" in w
               for w in warnings), p.stderr
    assert any("instance listed: activity_window is ignored next to interarrivals_list" in w for w in warnings)
    assert any("cannot name a directory" in w for w in warnings), p.stderr
    run_json = json.loads((tmp_path / "run" / "run.json").read_text())
    assert len(run_json["config_warnings"]) == len(warnings) == 4, (run_json["config_warnings"], warnings)

    rows = list(csv.DictReader(open(tmp_path / "run" / "requests.csv")))
    assert all(r["status"] == "200" and r["error"] == "" for r in rows), [r for r in rows if r["status"] != "200"]
    per = {i: [r for r in rows if r["instance"] == i] for i in ("generic", "listed", "params")}
    # Uniform at 10/s from 1 s to the test's end; the list up to the end,
    # its window ignored (0.5, 1.0, 1.5; the 4th arrival is past 3 s).
    assert 19 <= len(per["generic"]) <= 21, len(per["generic"])
    assert [round(float(r["scheduled_s"]), 3) for r in per["listed"]] == [0.5, 1.0, 1.5]
    assert per["params"] and all(int(r["bytes_out"]) == len(b"[1, 2, 3]") for r in per["params"])
    # The generic endpoint got what FaaSProfiler sends it: data as JSON.
    assert len(_Recorder.seen) == len(per["generic"])
    assert all(path == "/app1" and ctype == "application/json" and json.loads(body) == {"message": "sample.png"}
               for path, ctype, body in _Recorder.seen), _Recorder.seen[:2]
    # The runtime script was found from the working directory, and ran.
    assert (tmp_path / "monitor.out").read_text() == "ran 3\n"


class _KeepAliveRecorder(_Recorder):
    protocol_version = "HTTP/1.1"


def _ca_and_server_cert(d, name):
    """A CA and a certificate for 127.0.0.1 it signed (openssl): (CA cert, server cert, server key)."""
    ca, ca_key, csr = d / f"{name}-ca.pem", d / f"{name}-ca.key", d / f"{name}.csr"
    cert, key, ext = d / f"{name}.pem", d / f"{name}.key", d / f"{name}.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n")
    for argv in (["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN={name} CA",
                  "-keyout", str(ca_key), "-out", str(ca)],
                 ["req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout", str(key),
                  "-out", str(csr)],
                 ["x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial",
                  "-days", "2", "-extfile", str(ext), "-out", str(cert)]):
        subprocess.run(["openssl", *argv], check=True, capture_output=True, timeout=60)
    return ca, cert, key


def test_https_endpoints_as_faasprofiler_sends_to_them(tmp_path):
    """FaaSProfiler's generic endpoint with an https:// URL (its stress-test
    example): sent over TLS on kept-alive connections, certificates not
    checked (FaaSProfiler's verify=False) unless --tls-ca names the CA, and
    then a certificate from another CA fails every request as `tls`."""
    import ssl
    ca, cert, key = _ca_and_server_cert(tmp_path, "server")
    other, _, _ = _ca_and_server_cert(tmp_path, "other")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    receiver = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _KeepAliveRecorder)
    receiver.socket = ctx.wrap_socket(receiver.socket, server_side=True)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    _Recorder.seen = []
    config = {
        "test_name": "https", "test_duration_in_seconds": 2, "random_seed": 7, "blocking_cli": False,
        "endpoint": "generic",
        "instances": {"tls": {"application": "app", "url": f"https://127.0.0.1:{receiver.server_port}/app",
                              "data": {"n": 1}, "distribution": "Uniform", "rate": 20}},
    }
    (tmp_path / "w.json").write_text(json.dumps(config))
    # A body larger than what TLS buffers before its handshake ends (64 KiB).
    big = dict(config, instances={"big": {"application": "big", "url": f"https://127.0.0.1:{receiver.server_port}/big",
                                          "data_file": "big.bin", "distribution": "Uniform", "rate": 5}})
    (tmp_path / "big.bin").write_bytes(os.urandom(200_000))
    (tmp_path / "big.json").write_text(json.dumps(big))

    def run(name, *extra):
        p = subprocess.run([str(BIN), "bench", "run", str(tmp_path / "w.json"), "--out", str(tmp_path / name),
                            "--no-analyze", "--max-connections", "4", *extra],
                           env=clean_env(STACCATO_GATEWAY="http://127.0.0.1:1"), capture_output=True, text=True,
                           timeout=120)
        assert p.returncode == 0, f"{p.stdout}\n{p.stderr}"
        return p.stderr, list(csv.DictReader(open(tmp_path / name / "requests.csv")))

    try:
        stderr, rows = run("any")
        assert "certificates are not verified" in stderr, stderr
        assert len(rows) == 40 and all(r["status"] == "200" and r["error"] == "" for r in rows), rows[:3]
        assert len(_Recorder.seen) == 40 and all(b == b'{"n":1}' for _, _, b in _Recorder.seen), _Recorder.seen[:2]
        stderr, rows = run("checked", "--tls-ca", str(ca))
        assert "not verified" not in stderr, stderr
        assert len(rows) == 40 and all(r["status"] == "200" for r in rows), rows[:3]
        stderr, rows = run("wrong-ca", "--tls-ca", str(other))
        assert len(rows) == 40 and all(r["error"] == "tls" for r in rows), rows[:3]
        assert len(_Recorder.seen) == 80
        p = subprocess.run([str(BIN), "bench", "run", str(tmp_path / "big.json"), "--out", str(tmp_path / "big"),
                            "--no-analyze"], env=clean_env(STACCATO_GATEWAY="http://127.0.0.1:1"),
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        rows = list(csv.DictReader(open(tmp_path / "big" / "requests.csv")))
        assert len(rows) == 10 and all(r["status"] == "200" for r in rows), rows[:3]
        assert len(_Recorder.seen) == 90 and all(len(b) == 200_000 for _, _, b in _Recorder.seen[80:])
    finally:
        receiver.shutdown()
    p = subprocess.run([str(BIN), "bench", "run", str(tmp_path / "w.json"), "--tls-ca", str(tmp_path / "none.pem")],
                       env=clean_env(), capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and "--tls-ca" in p.stderr and "none.pem" in p.stderr, p.stderr


def test_each_calls_cpu_time_is_measured_where_it_can_be(tmp_path):
    """--cpu-per-call: C and Python plain-def handlers report each call's
    CPU time (their thread's), which /system/trace shows: a C function that
    computes ~5 ms shows ~5 ms, one that sleeps 200 ms almost none; without
    the flag nothing is measured."""
    from harness import FUNCS, traces
    for flag in (["--cpu-per-call"], []):
        with own_server(tmp_path / f"srv{len(flag)}", extra=flag) as srv:
            srv.deploy(WORKLOADS / "functions")
            srv.deploy(FUNCS)
            for _ in range(5):
                assert srv.invoke("json-dumps", b"{}").status == 200
                assert srv.invoke("function0", b"x").status == 200
            assert srv.invoke("slow-c", b"200").status == 200
            got = {f: [t.get("cpu_us") for t in traces(srv, f)] for f in ("json-dumps", "function0", "slow-c")}
        if not flag:
            assert all(v is None for vs in got.values() for v in vs), got
            continue
        assert len(got["json-dumps"]) == 5 and all(1_000 <= v <= 200_000 for v in got["json-dumps"]), got
        assert len(got["function0"]) == 5 and all(50 <= v <= 200_000 for v in got["function0"]), got
        assert got["slow-c"] and all(v < 20_000 for v in got["slow-c"]), got  # asleep, not on a CPU
