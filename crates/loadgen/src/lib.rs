//! `staccato bench run`: an open-loop workload runner that reads
//! FaaSProfiler's workload JSON (paper 004, §3.1 and Listing 1).
//!
//! Every arrival is scheduled up front (`schedule.rs`), sent at its time by a
//! non-blocking sender (`sender.rs`) whatever the earlier requests are doing,
//! and latency is measured from the scheduled time, so a slow server cannot
//! slow the load down and hide its own queueing (no coordinated omission,
//! as in wrk2). The run directory holds run.json, requests.csv,
//! invocations.csv and summary.json (`record.rs`).
//!
//! FaaSProfiler breakages fixed here:
//! * `activity_window: null` (the whole test) and `random_seed: null` (a
//!   random seed, recorded as `seed_used`) work;
//! * each instance draws from its own seed, derived from `random_seed`, the
//!   instance name and the sweep phase, so equal-rate Poisson instances do not
//!   fire at identical times, and the schedule is the same on every run;
//! * `perf_monitoring.post_script` runs, after the records are written, with
//!   the run directory as `$1`.
//!
//! `perf_monitoring.runtime_script` starts with the test, beside the config,
//! given the test's duration in whole seconds as `$1` (as FaaSProfiler
//! starts it) and in `STACCATO_TEST_DURATION_S`; it is stopped at the end.
//!
//! `blocking_cli` is accepted and recorded only: this sender never waits
//! for a response before sending the next request.

#![forbid(unsafe_code)]

pub mod config;
pub mod http;
pub mod record;
pub mod schedule;
pub mod sender;
pub mod stats;
pub mod tls;

use config::{Body, Config};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid workload configuration: {0}")]
    Config(String),
    #[error("{0}: {1}")]
    Io(String, #[source] std::io::Error),
}

pub struct RunOptions {
    /// Where requests go unless the config has `base_url` (the CLI passes
    /// --gateway, which defaults to $STACCATO_GATEWAY or http://127.0.0.1:8080).
    pub base_url: String,
    /// The run directory; default `bench-results/<test_name>-<YYYYmmdd-HHMMSS>`.
    pub out_dir: Option<PathBuf>,
    pub max_connections: usize,
    /// How long outstanding requests may take after the last arrival.
    pub drain: Duration,
    pub progress: bool,
    /// For run.json: the staccato version and `git describe`.
    pub versions: Value,
    /// The management token, for `/system/trace` (never written to the run).
    pub token: Option<String>,
    /// `https://` targets' certificates are checked against these (PEM);
    /// without, any certificate is accepted, as FaaSProfiler does.
    pub tls_ca: Option<PathBuf>,
}

pub struct RunResult {
    pub dir: PathBuf,
    pub summary: Value,
}

pub fn run(config_path: &Path, opts: &RunOptions) -> Result<RunResult, Error> {
    let cfg = Config::load(config_path)?;
    let seed = cfg.random_seed.unwrap_or_else(random_seed);
    let base_url = cfg.base_url.clone().unwrap_or_else(|| opts.base_url.clone());
    let (templates, template_of) = templates(&cfg, &base_url)?;
    let arrivals = schedule::build(&cfg, seed);
    let started_unix_s = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
    let dir = opts.out_dir.clone().unwrap_or_else(|| {
        PathBuf::from("bench-results").join(format!("{}-{}", cfg.dir_name(), timestamp(started_unix_s as u64)))
    });
    if opts.tls_ca.is_some() && !templates.iter().any(|t| t.target.1.is_some()) {
        eprintln!("warning: --tls-ca is not used: no instance sends to an https:// URL");
    }
    let tls = if templates.iter().any(|t| t.target.1.is_some()) {
        if opts.tls_ca.is_none() {
            eprintln!(
                "warning: https:// targets' certificates are not verified (as FaaSProfiler does); --tls-ca FILE \
                 checks them against a CA"
            );
        }
        Some(tls::client_config(opts.tls_ca.as_deref()).map_err(Error::Config)?)
    } else {
        None
    };
    for w in &cfg.warnings {
        eprintln!("warning: {}: {w}", config_path.display());
    }
    std::fs::create_dir_all(&dir).map_err(|e| Error::Io(format!("creating {}", dir.display()), e))?;
    let io = |what: &str| {
        let what = what.to_string();
        move |e| Error::Io(what, e)
    };
    eprintln!(
        "staccato bench run: {} — {} requests over {:.1} s to {base_url}, seed {seed}",
        cfg.test_name,
        arrivals.len(),
        cfg.total_duration_s()
    );
    let monitor = match &cfg.runtime_script {
        // As FaaSProfiler starts it: the test's duration, whole seconds, as $1.
        Some(s) => Some(
            start_script(s, &cfg.dir, Some((cfg.duration_s as u64).to_string().into()), cfg.duration_s)
                .map_err(io("starting perf_monitoring.runtime_script"))?,
        ),
        None => None,
    };
    let template_of = template_of_arrivals(&arrivals, &template_of, &cfg);
    let plan = sender::Plan { arrivals: &arrivals, templates, template_of };
    let usage_before = server_usage(&base_url, opts.token.as_deref());
    let sopts = sender::Options {
        max_connections: opts.max_connections.max(1),
        end_ns: (cfg.total_duration_s() * 1e9) as u64,
        drain: opts.drain,
        progress: opts.progress,
        tls,
    };
    let outcomes = sender::run(&plan, &sopts, Instant::now()).map_err(io("sender"));
    if let Some(m) = monitor {
        stop_script(m);
    }
    let rows = record::rows(&cfg, &arrivals, &outcomes?);
    record::write_requests(&dir.join("requests.csv"), &cfg, &rows).map_err(io("writing requests.csv"))?;
    let usage_after = server_usage(&base_url, opts.token.as_deref());
    let traces = fetch_traces(&base_url, opts.token.as_deref());
    let mut profile = server_profile(usage_before, usage_after);
    profile["per_call_cpu"] = record::per_call_cpu(traces.as_deref().unwrap_or(&[]), &rows);
    write_json(&dir.join("server.json"), &profile)?;
    if traces.is_none() {
        eprintln!("note: no Staccato trace endpoint at {base_url}/system/trace; invocations.csv has only its header");
    }
    record::write_invocations(&dir.join("invocations.csv"), traces.as_deref().unwrap_or(&[]), &rows)
        .map_err(io("writing invocations.csv"))?;
    let summary = record::summary(&cfg, &rows);
    write_json(&dir.join("summary.json"), &summary)?;
    let run = run_json(&cfg, config_path, seed, started_unix_s, &base_url, &arrivals, opts);
    write_json(&dir.join("run.json"), &run)?;
    if let Some(s) = &cfg.post_script {
        let run_dir = std::path::absolute(&dir).map(PathBuf::into_os_string);
        match run_dir.and_then(|d| start_script(s, &cfg.dir, Some(d), cfg.duration_s)).and_then(|mut c| c.wait()) {
            Ok(st) if st.success() => {}
            Ok(st) => eprintln!("warning: post_script {} exited with {st}", s.display()),
            Err(e) => eprintln!("warning: post_script {}: {e}", s.display()),
        }
    }
    Ok(RunResult { dir, summary })
}

type Templates = (Vec<sender::Template>, Vec<Vec<usize>>);

/// Prebuilt requests: per (instance, application), one, or one per line of
/// a `bodies_file` (consecutive, starting at the index returned for it).
fn templates(cfg: &Config, base_url: &str) -> Result<Templates, Error> {
    let mut out = Vec::new();
    let mut index = Vec::new();
    for inst in &cfg.instances {
        let mut row = Vec::new();
        for (app, _) in &inst.mix {
            let url_s =
                inst.url.clone().unwrap_or_else(|| format!("{}/function/{app}", base_url.trim_end_matches('/')));
            let url = http::parse_url(&url_s).map_err(|e| Error::Config(format!("instance {}: {e}", inst.name)))?;
            let name = match &url.tls {
                Some(host) => {
                    Some(tls::server_name(host).map_err(|e| Error::Config(format!("instance {}: {e}", inst.name)))?)
                }
                None => None,
            };
            let path = if url.path.is_empty() { "/".to_string() } else { url.path.clone() };
            let bodies: Vec<(&[u8], bool)> = match &inst.body {
                Body::Empty => vec![(&[], false)],
                Body::Bytes(b) => vec![(b, false)],
                Body::Json(b) => vec![(b, true)],
                Body::Lines(lines) => lines.iter().map(|l| (l.as_slice(), true)).collect(),
            };
            row.push(out.len());
            for (body, json) in bodies {
                out.push(sender::Template {
                    target: (url.addr, name.clone()),
                    bytes: http::build_request(&inst.method, &url.host, &path, &inst.headers, body, json),
                    body_len: body.len(),
                });
            }
        }
        index.push(row);
    }
    Ok((out, index))
}

/// The template of each arrival: its (instance, application)'s, and with a
/// `bodies_file` the next body of its instance in turn (arrivals are in
/// time order, so the k-th request of an instance gets body k mod n).
fn template_of_arrivals(arrivals: &[schedule::Arrival], first: &[Vec<usize>], cfg: &Config) -> Vec<usize> {
    let mut sent = vec![0usize; cfg.instances.len()];
    arrivals
        .iter()
        .map(|a| {
            let (i, app) = (a.instance as usize, a.app as usize);
            let n = match &cfg.instances[i].body {
                Body::Lines(lines) => lines.len(),
                _ => 1,
            };
            let k = sent[i] % n;
            sent[i] += 1;
            first[i][app] + k
        })
        .collect()
}

fn random_seed() -> u64 {
    let mut b = [0u8; 8];
    if std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b)).is_ok() {
        return u64::from_le_bytes(b) >> 1; // fits a JSON integer everywhere that reads i64
    }
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64 >> 1) ^ std::process::id() as u64
}

/// `bash SCRIPT [ARG]` in `cwd`, in its own process group so stopping it
/// stops whatever it started (perf, sar, ...).
/// Starts `bash SCRIPT [ARG]` in `cwd`, in a process group of its own, with
/// the test's duration in `STACCATO_TEST_DURATION_S` too.
fn start_script(script: &Path, cwd: &Path, arg: Option<std::ffi::OsString>, duration_s: f64) -> std::io::Result<Child> {
    use std::os::unix::process::CommandExt;
    let mut c = Command::new("bash");
    c.arg(script).current_dir(cwd).process_group(0).env("STACCATO_TEST_DURATION_S", (duration_s as u64).to_string());
    if let Some(a) = arg {
        c.arg(a);
    }
    c.spawn()
}

/// SIGTERM to the script's process group, then SIGKILL after 5 s.
fn stop_script(mut child: Child) {
    if let Ok(Some(_)) = child.try_wait() {
        return;
    }
    let _ = Command::new("kill").args(["-TERM", "--", &format!("-{}", child.id())]).status();
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(5) {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = Command::new("kill").args(["-KILL", "--", &format!("-{}", child.id())]).status();
    let _ = child.wait();
}

/// `GET {base_url}/system/trace?limit=4096`, best effort: None when absent.
pub fn fetch_traces(base_url: &str, token: Option<&str>) -> Option<Vec<Value>> {
    match get_json(base_url, "/system/trace?limit=4096", token)? {
        Value::Array(v) => Some(v),
        _ => None,
    }
}

/// A management GET of Staccato's gateway at `base_url`: its JSON, or
/// None when there is no such gateway (or it said no).
fn get_json(base_url: &str, path: &str, token: Option<&str>) -> Option<Value> {
    let url = http::parse_url(base_url).ok()?;
    // Plain HTTP only: never send the token unencrypted to a TLS port.
    if url.tls.is_some() {
        return None;
    }
    let mut s = std::net::TcpStream::connect_timeout(&url.addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    write!(s, "GET {}{path} HTTP/1.1\r\nHost: {}\r\n{auth}Connection: close\r\n\r\n", url.path, url.host).ok()?;
    // Read until the response is whole (a server may keep the connection
    // open whatever `Connection: close` said), or it ends.
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 << 10];
    let resp = loop {
        if let Ok(Some((resp, _))) = http::parse_response(&buf) {
            break resp;
        }
        match s.read(&mut chunk) {
            Ok(0) => break http::parse_response(&buf).ok().flatten().unwrap_or_default().0,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(_) => return None,
        }
    };
    let head_end = buf.windows(4).position(|w| w == b"\r\n\r\n")?;
    if !buf.starts_with(b"HTTP/1.1 200") {
        return None;
    }
    let body = &buf[head_end + 4..];
    let body = if resp.bytes_in > 0 && resp.bytes_in <= body.len() { &body[..resp.bytes_in] } else { body };
    serde_json::from_slice(body).ok()
}

/// Each function's processes as the engines see them now (summed over
/// engines): CPU and scheduling figures, and calls run.
fn server_usage(base_url: &str, token: Option<&str>) -> Option<BTreeMap<String, [u64; 6]>> {
    let list = get_json(base_url, "/system/functions?usage=1", token)?;
    let mut out = BTreeMap::new();
    for f in list.as_array()? {
        let name = f["name"].as_str().unwrap_or_default().to_string();
        let mut sum = [0u64; 6];
        for e in f["by_engine"].as_array().into_iter().flatten() {
            let st = &e["status"];
            let u = &st["usage"];
            let fig = [
                &u["cpu_ns"],
                &u["run_delay_ns"],
                &u["voluntary_switches"],
                &u["involuntary_switches"],
                &st["completed"],
                &st["failed"],
            ];
            for (s, v) in sum.iter_mut().zip(fig) {
                *s += v.as_u64().unwrap_or(0);
            }
        }
        out.insert(name, sum);
    }
    Some(out)
}

/// The server's side of the run (`server.json`): per function, what its
/// processes used between the two readings and per call the engines ran
/// (internal calls too), and whether hardware counters can be read here.
fn server_profile(before: Option<BTreeMap<String, [u64; 6]>>, after: Option<BTreeMap<String, [u64; 6]>>) -> Value {
    let (Some(before), Some(after)) = (before, after) else {
        return json!({"available": false, "why": "no Staccato gateway answered GET /system/functions"});
    };
    let mut functions = serde_json::Map::new();
    for (name, a) in &after {
        let b = before.get(name).copied().unwrap_or_default();
        let d: Vec<u64> = a.iter().zip(b).map(|(x, y)| x.saturating_sub(y)).collect();
        let calls = d[4] + d[5];
        if calls == 0 {
            continue; // not part of this run (idle workers' spinning aside)
        }
        let per = |x: u64, scale: f64| if calls > 0 { json!(x as f64 / scale / calls as f64) } else { Value::Null };
        functions.insert(
            name.clone(),
            json!({
                "calls": calls, "failed": d[5],
                "cpu_ms": d[0] as f64 / 1e6, "run_delay_ms": d[1] as f64 / 1e6,
                "voluntary_switches": d[2], "involuntary_switches": d[3],
                "cpu_us_per_call": per(d[0], 1e3), "run_delay_us_per_call": per(d[1], 1e3),
                "switches_per_call": per(d[2] + d[3], 1.0),
            }),
        );
    }
    json!({
        "available": true,
        "how": "each function's processes, all threads, read from /proc (schedstat, status) by its engines before \
                and after the run; calls are every call the engines ran (internal ones too); a process that \
                exited during the run took its share with it",
        "functions": functions,
        "hardware_counters": hardware_counters(),
    })
}

/// Whether the host running `bench run` lets `perf` count cycles and
/// instructions (a VM often does not): what the report says instead of
/// showing zeros. It is this host's answer: a gateway elsewhere runs its
/// functions on another.
fn hardware_counters() -> Value {
    let out =
        std::process::Command::new("perf").args(["stat", "-x", ",", "-e", "cycles,instructions", "true"]).output();
    match out {
        Err(e) => json!({"available": false, "host": "the host running bench run",
                         "why": format!("perf cannot run on the host running bench run: {e}")}),
        Ok(o) => {
            let text = String::from_utf8_lossy(&o.stderr);
            if text.contains("<not supported>") || text.contains("<not counted>") || !o.status.success() {
                json!({"available": false, "host": "the host running bench run",
                       "why": "perf stat reports cycles and instructions as not supported on the host running bench run"})
            } else {
                json!({"available": true, "host": "the host running bench run",
                       "why": "supported on the host running bench run, not collected by this version"})
            }
        }
    }
}

fn run_json(
    cfg: &Config,
    config_path: &Path,
    seed: u64,
    started_unix_s: f64,
    base_url: &str,
    arrivals: &[schedule::Arrival],
    opts: &RunOptions,
) -> Value {
    let mut instances = serde_json::Map::new();
    for (i, inst) in cfg.instances.iter().enumerate() {
        let ws = schedule::phase_windows(cfg, inst);
        let scheduled = arrivals.iter().filter(|a| a.instance as usize == i).count();
        let phases: Vec<Value> = ws
            .iter()
            .map(|w| {
                json!({"phase": w.phase, "rate": w.rate, "start_s": w.start_s, "end_s": w.end_s,
                            "measured_start_s": w.measured_start_s})
            })
            .collect();
        instances.insert(
            inst.name.clone(),
            json!({"offered_rate": if inst.rates.len() == 1 { json!(inst.rates[0]) } else { json!(inst.rates) },
                   "applications": inst.mix.iter().map(|m| m.0.clone()).collect::<Vec<_>>(),
                   "phases": phases, "scheduled": scheduled}),
        );
    }
    json!({
        "config": cfg.raw,
        "config_warnings": cfg.warnings,
        "config_path": std::path::absolute(config_path).unwrap_or_else(|_| config_path.to_path_buf()),
        "seed_used": seed,
        "started_unix_s": started_unix_s,
        "duration_s": cfg.total_duration_s(),
        "base_url": base_url,
        "blocking_cli": cfg.blocking_cli,
        "max_connections": opts.max_connections,
        "machine": machine(),
        "versions": opts.versions,
        "instances": instances,
    })
}

pub fn machine() -> Value {
    let read = |p: &str| std::fs::read_to_string(p).ok().map(|s| s.trim().to_string());
    let cpu_model = read("/proc/cpuinfo").and_then(|s| {
        s.lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
    });
    json!({
        "cpus": std::thread::available_parallelism().map_or(0, |n| n.get()),
        "cpu_model": cpu_model,
        "kernel": read("/proc/sys/kernel/osrelease"),
        "hostname": read("/proc/sys/kernel/hostname"),
    })
}

fn write_json(path: &Path, v: &Value) -> Result<(), Error> {
    let text = serde_json::to_string_pretty(v).unwrap_or_default();
    std::fs::write(path, text + "\n").map_err(|e| Error::Io(format!("writing {}", path.display()), e))
}

/// `YYYYmmdd-HHMMSS` in UTC (Howard Hinnant's civil-from-days).
pub fn timestamp(unix_s: u64) -> String {
    let days = (unix_s / 86_400) as i64;
    let secs = unix_s % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}{m:02}{d:02}-{:02}{:02}{:02}", secs / 3600, secs / 60 % 60, secs % 60)
}

#[cfg(test)]
mod tests;
