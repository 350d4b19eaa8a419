//! A whole run against a tiny HTTP server on loopback: the records' columns,
//! row counts, the trace join and both perf_monitoring scripts.

use super::*;
use std::io::{BufRead, BufReader};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Answers every request 200 with Staccato's headers; /system/trace lists
/// the call ids handed out so far plus one nested call under the first.
fn serve() -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let ids = Arc::new(AtomicU64::new(0));
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            let ids = ids.clone();
            std::thread::spawn(move || handle(s, &ids));
        }
    });
    format!("http://{addr}")
}

fn handle(s: TcpStream, ids: &AtomicU64) {
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut w = s;
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let path = line.split(' ').nth(1).unwrap_or("").to_string();
        let mut len = 0;
        loop {
            let mut h = String::new();
            r.read_line(&mut h).unwrap();
            if h == "\r\n" {
                break;
            }
            if let Some(v) = h.to_ascii_lowercase().strip_prefix("content-length:") {
                len = v.trim().parse().unwrap();
            }
        }
        let mut body = vec![0; len];
        r.read_exact(&mut body).unwrap();
        if path.starts_with("/system/functions") {
            // No function has used anything: the server's side is empty.
            write!(w, "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n[]").unwrap();
            continue;
        }
        if path.starts_with("/system/trace") {
            let n = ids.load(Ordering::SeqCst);
            let mut t: Vec<Value> = (1..=n)
                .map(|i| {
                    json!({"call_id": format!("{i:016x}"), "parent_call_id": format!("{:016x}", 0),
                    "function": "f", "receive_ns": 100, "dispatch_ns": 2100, "complete_ns": 5100, "outcome": "ok"})
                })
                .collect();
            t.push(json!({"call_id": "ffff000000000001", "parent_call_id": format!("{:016x}", 1), "function": "g",
                "receive_ns": 200, "dispatch_ns": 300, "complete_ns": 400, "outcome": "ok"}));
            t.push(json!({"call_id": "eeee000000000001", "parent_call_id": "0", "function": "other",
                "receive_ns": 1, "dispatch_ns": 2, "complete_ns": 3, "outcome": "ok"}));
            let b = Value::Array(t).to_string();
            write!(w, "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{b}", b.len()).unwrap();
            return;
        }
        let id = ids.fetch_add(1, Ordering::SeqCst) + 1;
        let cold = if id == 1 { 1500 } else { 0 };
        // One write: a separate body write would meet Nagle and delayed ACKs.
        let mut resp = format!(
            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nx-call-id: {id:016x}\r\n\
             x-staccato-timing: queue_us=5,exec_us=20,cold_us={cold}\r\n\r\n",
            body.len()
        )
        .into_bytes();
        resp.extend_from_slice(&body);
        w.write_all(&resp).unwrap();
    }
}

#[test]
fn a_run_writes_the_records() {
    let url = serve();
    let dir = std::env::temp_dir().join(format!("loadgen-run-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("mon.sh"), "echo started > monitor.txt\nsleep 30\n").unwrap();
    std::fs::write(dir.join("post.sh"), "echo \"$1\" > \"$1/post.txt\"\n").unwrap();
    std::fs::write(dir.join("body.bin"), b"12345").unwrap();
    let cfg = format!(
        r#"{{"test_name":"t","test_duration_in_seconds":0.5,"random_seed":null,"blocking_cli":true,
        "base_url":"{url}","warmup_in_seconds":0.1,
        "instances":{{
          "a":{{"application":"f","distribution":"Constant","rate":200,"activity_window":null,"data_file":"body.bin"}},
          "b":{{"application":"g","distribution":"Poisson","rate":100,"activity_window":[0.2,0.5]}}}},
        "perf_monitoring":{{"runtime_script":"mon.sh","post_script":"post.sh"}}}}"#
    );
    std::fs::write(dir.join("w.json"), cfg).unwrap();
    let out = dir.join("out");
    let opts = RunOptions {
        base_url: "http://127.0.0.1:1".into(),
        out_dir: Some(out.clone()),
        max_connections: 8,
        drain: Duration::from_secs(2),
        progress: false,
        token: None,
        versions: json!({"staccato": "test", "git": null}),
        tls_ca: None,
    };
    let t = Instant::now();
    let res = run(&dir.join("w.json"), &opts).unwrap();
    assert!(t.elapsed() < Duration::from_secs(8), "the monitor was stopped, not waited for");

    let csv = std::fs::read_to_string(out.join("requests.csv")).unwrap();
    let mut lines = csv.lines();
    assert_eq!(lines.next().unwrap(), record::REQUESTS_HEADER);
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    assert!(rows.iter().all(|r| r.len() == 18));
    let a: Vec<&Vec<&str>> = rows.iter().filter(|r| r[0] == "a").collect();
    assert_eq!(a.len(), 100);
    assert!(a.iter().all(|r| r[10] == "200" && r[11] == "5" && r[12] == "5" && r[13].is_empty()));
    assert_eq!(a.iter().filter(|r| r[3] == "true").count(), 20, "first 0.1 s is warmup");
    assert!(rows.iter().all(|r| r[15] == "0.005" && r[16] == "0.020" && !r[14].is_empty()));

    let run_json: Value = serde_json::from_str(&std::fs::read_to_string(out.join("run.json")).unwrap()).unwrap();
    let seed = run_json["seed_used"].as_u64().unwrap();
    assert_eq!(run_json["instances"]["a"]["scheduled"], 100);
    assert_eq!(run_json["config"]["test_name"], "t");
    assert!(run_json["machine"]["cpus"].as_u64().unwrap() >= 1);
    let b_expected = rows.iter().filter(|r| r[0] == "b").count();
    assert_eq!(run_json["instances"]["b"]["scheduled"], b_expected);
    assert!(seed > 0);

    let s = &res.summary;
    assert_eq!(s["instances"]["a"]["count"], 80);
    assert_eq!(s["instances"]["a"]["ok"], 80);
    assert_eq!(s["instances"]["a"]["offered_rate"], 200.0);
    assert!(s["overall"]["latency_ms"]["p99"].as_f64().unwrap() > 0.0);
    assert!(s["capacity_factor_definition"].is_string());

    let inv = std::fs::read_to_string(out.join("invocations.csv")).unwrap();
    let inv: Vec<&str> = inv.lines().collect();
    assert_eq!(inv[0], record::INVOCATIONS_HEADER);
    assert_eq!(inv.len(), 1 + rows.len() + 1, "ours plus the nested call, not the stranger");
    assert!(inv.iter().any(|l| l.starts_with("ffff000000000001,0000000000000001,g,")));
    assert!(inv.iter().any(|l| l.ends_with(",0.002,0.003,ok,false,")));

    let server: Value = serde_json::from_str(&std::fs::read_to_string(out.join("server.json")).unwrap()).unwrap();
    assert_eq!(
        (server["available"].as_bool(), server["functions"].as_object().map(|m| m.len())),
        (Some(true), Some(0))
    );
    assert!(dir.join("monitor.txt").exists(), "runtime_script ran in the config's directory");
    let post = std::fs::read_to_string(out.join("post.txt")).unwrap();
    assert!(post.trim().ends_with("out"), "post_script got the run directory: {post}");
}

#[test]
fn refused_connections_are_errors_not_hangs() {
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let dir = std::env::temp_dir().join(format!("loadgen-refused-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = format!(
        r#"{{"test_name":"t","test_duration_in_seconds":0.2,"random_seed":1,"base_url":"http://127.0.0.1:{port}",
        "instances":{{"a":{{"application":"f","distribution":"Constant","rate":50}}}}}}"#
    );
    std::fs::write(dir.join("w.json"), cfg).unwrap();
    let opts = RunOptions {
        base_url: "http://127.0.0.1:1".into(),
        out_dir: Some(dir.join("out")),
        max_connections: 4,
        drain: Duration::from_millis(500),
        progress: false,
        token: None,
        versions: Value::Null,
        tls_ca: None,
    };
    let res = run(&dir.join("w.json"), &opts).unwrap();
    assert_eq!(res.summary["overall"]["count"], 10);
    assert_eq!(res.summary["overall"]["errors"]["connect"], 10);
}

#[test]
fn timestamps() {
    assert_eq!(timestamp(0), "19700101-000000");
    assert_eq!(timestamp(1_700_000_000), "20231114-221320");
}

/// A `bodies_file` gives each request of its instance the next line in
/// turn; other instances keep their one body.
#[test]
fn bodies_file_bodies_go_in_turn() {
    let d = std::env::temp_dir().join(format!("loadgen-bodies-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join("b.jsonl"), "{\"k\":0}\n\n{\"k\":1}\n{\"k\":2}\n").unwrap();
    let cfg = Config::parse(
        r#"{"test_name":"t","test_duration_in_seconds":1,"random_seed":1,"instances":{
            "a":{"application":"f","distribution":"Constant","rate":20,"bodies_file":"b.jsonl"},
            "b":{"application":"g","distribution":"Constant","rate":10,"data":{"x":1}}}}"#,
        &d,
    )
    .unwrap();
    let (tpls, first) = templates(&cfg, "http://127.0.0.1:9").unwrap();
    assert_eq!(tpls.len(), 4, "three bodies for a, one for b");
    let arrivals = schedule::build(&cfg, 1);
    let of = template_of_arrivals(&arrivals, &first, &cfg);
    let mut seen_a = 0;
    for (a, &t) in arrivals.iter().zip(&of) {
        let req = String::from_utf8_lossy(&tpls[t].bytes).into_owned();
        if a.instance == 0 {
            assert!(req.ends_with(&format!("{{\"k\":{}}}", seen_a % 3)), "request {seen_a} of a: {req}");
            assert!(req.contains("application/json"), "{req}");
            seen_a += 1;
        } else {
            assert!(req.ends_with("{\"x\":1}"), "{req}");
        }
    }
    assert_eq!(seen_a, 20);
    let bad = |text: &str| {
        std::fs::write(d.join("bad.jsonl"), text).unwrap();
        let c = r#"{"test_name":"t","test_duration_in_seconds":1,"instances":{
            "a":{"application":"f","distribution":"Poisson","rate":1,"bodies_file":"bad.jsonl"}}}"#;
        Config::parse(c, &d).unwrap_err().to_string()
    };
    assert!(bad("{\"k\":1}\n{oops\n").contains("line 2: not JSON"), "{}", bad("{\"k\":1}\n{oops\n"));
    assert!(bad("\n\n").contains("no bodies"));
    let both = r#"{"test_name":"t","test_duration_in_seconds":1,"instances":{
        "a":{"application":"f","distribution":"Poisson","rate":1,"bodies_file":"b.jsonl","data":{}}}}"#;
    assert!(Config::parse(both, &d).unwrap_err().to_string().contains("cannot be combined"));
    std::fs::remove_dir_all(&d).unwrap();
}
