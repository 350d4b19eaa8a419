//! `staccato bench micro`: latency floors and Staccato's call paths measured
//! side by side in one run, under two placements:
//!
//! * `pinned`: every process (this benchmark, the gateway, the engine, the
//!   workers) on one vCPU;
//! * `default`: what a user gets from a plain `staccato up`, with this
//!   benchmark left to the kernel.
//!
//! Benchmarks are programs, not timed tests: nothing here asserts a number.

use crate::floor;
use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use client::http::read_response;
use client::{Client, Requester};
use serde_json::{json, Value};
use std::io::{BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use wire::message::{Header, Kind, Message};

#[derive(Args, Clone)]
pub struct MicroArgs {
    /// Calls per latency measurement.
    #[arg(long, default_value_t = 20_000)]
    calls: usize,
    /// Seconds of the 16-connection throughput run.
    #[arg(long, default_value_t = 3.0)]
    duration_s: f64,
    /// Concurrent connections for the throughput run.
    #[arg(long, default_value_t = 16)]
    connections: usize,
    /// Placements to measure.
    #[arg(long, value_delimiter = ',', default_value = "pinned,default")]
    modes: Vec<String>,
    /// Extra argument for `staccato up` (repeatable), e.g. --up-arg=--worker-spin-us=20.
    #[arg(long = "up-arg", allow_hyphen_values = true)]
    up_args: Vec<String>,
    /// Languages to measure.
    #[arg(long, value_delimiter = ',', default_value = "c,cpp,go,node,python")]
    langs: Vec<String>,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Skip the floors (pipes, channels, plain HTTP).
    #[arg(long)]
    no_floors: bool,
    /// Seconds of the low-load profile: calls at --low-rate a second with
    /// Poisson gaps, to the C nop and to the plain HTTP server (0: skip).
    #[arg(long, default_value_t = 10.0)]
    low_load_s: f64,
    /// The low-load profile's rate (calls per second).
    #[arg(long, default_value_t = 100.0)]
    low_rate: f64,
}

/// The repository: the directory above the binary (target/release/staccato)
/// holding runtimes/ and tools/, or the current directory.
pub fn find_repo() -> Result<PathBuf> {
    let mut candidates = Vec::new();
    if let Ok(exe) = std::env::current_exe() {
        candidates.extend(exe.ancestors().skip(1).take(4).map(PathBuf::from));
    }
    candidates.push(PathBuf::from("."));
    candidates
        .into_iter()
        .find(|p| p.join("runtimes").is_dir() && p.join("crates").is_dir())
        .map(|p| p.canonicalize().unwrap_or(p))
        .ok_or_else(|| anyhow!("cannot find the staccato repository (for tools/)"))
}

/// `git describe` of the repository the binary was built in, for run records.
pub fn git_describe() -> Option<String> {
    let repo = find_repo().ok()?;
    let out = Command::new("git").args(["describe", "--always", "--dirty"]).current_dir(repo).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

pub(crate) struct Row {
    name: String,
    mode: String,
    samples_ns: Vec<u64>,
    /// For throughput rows: requests per second.
    rate: Option<f64>,
}

impl Row {
    pub(crate) fn latency(name: &str, mode: &str, mut samples_ns: Vec<u64>) -> Row {
        samples_ns.sort_unstable();
        Row { name: name.into(), mode: mode.into(), samples_ns, rate: None }
    }

    pub(crate) fn rate(name: &str, mode: &str, per_s: f64) -> Row {
        Row { name: name.into(), mode: mode.into(), samples_ns: vec![], rate: Some(per_s) }
    }

    /// Nearest rank, the definition `bench run` and the analyzer use too.
    fn pct_us(&self, p: f64) -> f64 {
        loadgen::stats::percentile(&self.samples_ns, p).map_or(f64::NAN, |ns| ns as f64 / 1000.0)
    }

    pub(crate) fn to_json(&self) -> Value {
        match self.rate {
            Some(r) => json!({"name": self.name, "mode": self.mode, "requests_per_s": r}),
            None => json!({
                "name": self.name, "mode": self.mode, "n": self.samples_ns.len(),
                "p50_us": self.pct_us(50.0), "p99_us": self.pct_us(99.0), "p99_9_us": self.pct_us(99.9),
            }),
        }
    }
}

pub fn run(a: MicroArgs) -> Result<()> {
    let mut rows = Vec::new();
    let cpus = sys::cpu::cpus_allowed();
    let progress = |s: &str| eprintln!("  {s}");
    eprintln!("staccato bench micro: {} calls per latency figure, {} CPUs allowed", a.calls, cpus.len());
    if !a.no_floors {
        let other = *cpus.get(1).unwrap_or(&cpus[0]);
        progress("floor: raw 1 KB pipe ping-pong");
        rows.push(Row::latency(PIPE, SAME_VCPU, pipe_pingpong(a.calls, cpus[0], cpus[0])?));
        rows.push(Row::latency(PIPE, "across vCPUs", pipe_pingpong(a.calls, cpus[0], other)?));
        progress("floor: 1 KB round trips to another process, and through a relay process, on one vCPU");
        // The peers run where this process does when it starts them.
        sys::cpu::set_affinity(0, &cpus[..1])?;
        let between_processes = || -> Result<_> {
            let two = floor::pipe_round_trips(floor::PeerKind::Echo, a.calls)?;
            Ok((two, floor::pipe_round_trips(floor::PeerKind::Relay, a.calls)?))
        };
        let measured = between_processes();
        sys::cpu::set_affinity(0, &cpus)?;
        let (two, relayed) = measured?;
        rows.push(Row::latency(PIPE_PROCESSES, SAME_VCPU, two));
        rows.push(Row::latency(PIPE_RELAY, SAME_VCPU, relayed));
        progress("message channel one-way latency");
        rows.push(Row::latency("channel one-way", "same vCPU", channel_one_way(a.calls, cpus[0], cpus[0])?));
        rows.push(Row::latency("channel one-way", "across vCPUs", channel_one_way(a.calls, cpus[0], other)?));
    }
    for mode in &a.modes {
        let pinned = match mode.as_str() {
            "pinned" => true,
            "default" => false,
            m => bail!("unknown mode {m:?} (pinned, default)"),
        };
        if pinned {
            sys::cpu::set_affinity(0, &cpus[..1])?;
        }
        let r = run_mode(&a, mode, &mut rows);
        sys::cpu::set_affinity(0, &cpus)?;
        r?;
    }
    if a.json {
        let machine = machine();
        println!(
            "{}",
            serde_json::to_string_pretty(
                &json!({"machine": machine, "results": rows.iter().map(Row::to_json).collect::<Vec<_>>()})
            )?
        );
    } else {
        print_table(&rows);
        let lines = ratio_lines(&rows, a.low_rate);
        if !lines.is_empty() {
            println!("\nratios to the floors measured in this run (same vCPU for the pipes):");
            for l in lines {
                println!("  {l}");
            }
        }
    }
    Ok(())
}

// Row names that `ratio_lines` looks up.
const SAME_VCPU: &str = "same vCPU";
const PIPE: &str = "pipe 1KB round trip";
const PIPE_PROCESSES: &str = "pipe 1KB round trip, two processes";
const PIPE_RELAY: &str = "pipe 1KB via a relay process";
const PLAIN: &str = "plain HTTP keep-alive round trip";
const PLAIN_PROCESS: &str = "plain HTTP, server process";
const HTTP_RELAY: &str = "HTTP via a relay process";
const LOW_STACCATO: &str = "C nop";
const LOW_PLAIN: &str = "plain HTTP";
const LOW_PLAIN_PROCESS: &str = "plain HTTP process";
const LOW_RELAY: &str = "HTTP relay process";

fn internal_row(label: &str) -> String {
    format!("internal nop call, {label}")
}

fn external_row(label: &str) -> String {
    format!("external nop call, {label}")
}

/// The low-load profile's row of `server`: a floor's, or (`LOW_STACCATO`)
/// the C nop's.
fn low_load_row(server: &str, rate: f64) -> String {
    if server == LOW_STACCATO {
        format!("external nop at {rate:.0}/s, open loop, C")
    } else {
        format!("{server} at {rate:.0}/s, open loop")
    }
}

/// The ratios issue 14 sets targets for, each against the floor in one
/// process (the issue's), between processes and through a relay process
/// (BENCHMARKS.md, "The floors of the design"): a line per figure of
/// Staccato's in `rows`, with the floors `rows` has.
fn ratio_lines(rows: &[Row], low_rate: f64) -> Vec<String> {
    let p50 = |name: &str, mode: &str| {
        rows.iter()
            .find(|r| r.name == name && r.mode == mode && r.rate.is_none())
            .map(|r| r.pct_us(50.0))
            .filter(|v| v.is_finite() && *v > 0.0)
    };
    let mut lines = Vec::new();
    let mut ratio = |what: String, ours: Option<f64>, floors: [(&str, Option<f64>); 3]| {
        let Some(ours) = ours else { return };
        let parts: Vec<String> =
            floors.iter().filter_map(|(label, f)| f.map(|f| format!("{:.2}x {label}", ours / f))).collect();
        if !parts.is_empty() {
            lines.push(format!("{what}: {}", parts.join(", ")));
        }
    };
    for mode in ["pinned", "default"] {
        ratio(
            format!("internal C nop p50 ({mode})"),
            p50(&internal_row("C"), mode),
            [
                ("the pipe", p50(PIPE, SAME_VCPU)),
                ("the pipe between processes", p50(PIPE_PROCESSES, SAME_VCPU)),
                ("the relay", p50(PIPE_RELAY, SAME_VCPU)),
            ],
        );
        ratio(
            format!("external C nop p50 ({mode})"),
            p50(&external_row("C"), mode),
            [
                ("plain HTTP", p50(PLAIN, mode)),
                ("its server process", p50(PLAIN_PROCESS, mode)),
                ("the relay", p50(HTTP_RELAY, mode)),
            ],
        );
        let low = |server| p50(&low_load_row(server, low_rate), mode);
        ratio(
            format!("C nop at {low_rate:.0}/s p50 ({mode})"),
            low(LOW_STACCATO),
            [
                ("plain HTTP", low(LOW_PLAIN)),
                ("its server process", low(LOW_PLAIN_PROCESS)),
                ("the relay", low(LOW_RELAY)),
            ],
        );
    }
    lines
}

/// Languages measured, in table order; each has `bench/functions/<lang>/`
/// with `bench-nop-<lang>` and a self-timing `bench-caller-<lang>`.
const LANGS: [(&str, &str); 5] = [("c", "C"), ("cpp", "C++"), ("go", "Go"), ("node", "Node.js"), ("python", "Python")];

fn run_mode(a: &MicroArgs, mode: &str, rows: &mut Vec<Row>) -> Result<()> {
    eprintln!("[{mode}] starting staccato up");
    if !a.no_floors {
        eprintln!("  plain HTTP server round trip (floor for the external path)");
        rows.push(Row::latency(PLAIN, mode, plain_http(a.calls)?));
        eprintln!("  plain HTTP server in its own process, and one relaying to a worker process");
        for (kind, name) in [(floor::PeerKind::Http, PLAIN_PROCESS), (floor::PeerKind::HttpRelay, HTTP_RELAY)] {
            let mut p = floor::Peer::start(kind)?;
            rows.push(Row::latency(name, mode, plain_http_client(p.http_addr()?, a.calls)?));
        }
    }
    let low_n = (a.low_load_s * a.low_rate).round() as usize;
    if low_n > 0 {
        eprintln!(
            "  plain HTTP server at {:.0} calls/s, {:.0} s (floor for the low-load profile)",
            a.low_rate, a.low_load_s
        );
        let l = TcpListener::bind("127.0.0.1:0")?;
        let addr = l.local_addr()?;
        plain_http_server(l);
        let mut c = Client::new(&format!("http://{addr}"), None)?;
        rows.push(Row::latency(&low_load_row(LOW_PLAIN, a.low_rate), mode, paced(&mut c, "/", a.low_rate, low_n)?));
        if !a.no_floors {
            eprintln!("  the same, to a plain HTTP server process and to a relay");
            for (kind, name) in [(floor::PeerKind::Http, LOW_PLAIN_PROCESS), (floor::PeerKind::HttpRelay, LOW_RELAY)] {
                let mut p = floor::Peer::start(kind)?;
                let mut c = Client::new(&format!("http://{}", p.http_addr()?), None)?;
                let lat = paced(&mut c, "/", a.low_rate, low_n)?;
                rows.push(Row::latency(&low_load_row(name, a.low_rate), mode, lat));
            }
        }
    }
    let server = Server::start(&a.up_args)?;
    let mut c = Client::new(&server.url, client::read_token(&server.state))?;
    // Calls go on a connection of their own, as a client that only calls
    // functions has: `staccato up`'s engine answers them itself, but hands
    // a connection that carried a management request (a deploy, a status)
    // to the gateway for good, and calls on it then take the gateway's
    // path (engine/src/front.rs; BENCHMARKS.md "bench micro measured the
    // gateway's path").
    let mut calls = Client::new(&server.url, None)?;
    let mut deployed = Vec::new();
    for (lang, label) in LANGS.iter().filter(|(l, _)| a.langs.iter().any(|x| x == l)) {
        eprintln!("  {label}: deploying");
        if let Err(e) = deploy_bench_functions(&mut c, lang) {
            eprintln!("  {label}: skipped: {e:#}");
            continue;
        }
        deployed.push((*lang, *label));
        let (nop, caller) = (format!("bench-nop-{lang}"), format!("bench-caller-{lang}"));
        eprintln!("  {label}: internal nop calls");
        rows.push(Row::latency(&internal_row(label), mode, internal(&mut c, &caller, &nop, a.calls)?));
        eprintln!("  {label}: external nop calls, one keep-alive connection");
        rows.push(Row::latency(&external_row(label), mode, external(&mut calls, &nop, a.calls)?));
        rows.push(Row::latency(&format!("worker ready, {label}"), mode, worker_ready(&mut c, lang, &nop)?));
    }
    if low_n > 0 && deployed.iter().any(|(l, _)| *l == "c") {
        eprintln!("  C nop at {:.0} calls/s, {:.0} s (the low-load profile)", a.low_rate, a.low_load_s);
        rows.push(Row::latency(
            &low_load_row(LOW_STACCATO, a.low_rate),
            mode,
            paced(&mut calls, "/function/bench-nop-c", a.low_rate, low_n)?,
        ));
    }
    // The C nop when it was measured (the figure BENCHMARKS.md tracks),
    // else the first language that was: never a function not deployed.
    let Some((lang, label)) = deployed.iter().find(|(l, _)| *l == "c").or(deployed.first()).copied() else {
        bail!("no language's bench functions could be deployed: nothing to measure");
    };
    if !a.no_floors {
        // The floor, measured right before Staccato's figure, with the same
        // client: what a plain server on these vCPUs answers.
        eprintln!(
            "  plain hyper nop server, {} connections, {:.0} s (floor for throughput)",
            a.connections, a.duration_s
        );
        let l = TcpListener::bind("127.0.0.1:0")?;
        let addr = l.local_addr()?;
        hyper_nop_server(l)?;
        let floor = throughput(addr, "nop", a.connections, Duration::from_secs_f64(a.duration_s))?.per_s;
        rows.push(Row::rate(&format!("plain hyper nop throughput, {} conns", a.connections), mode, floor));
    }
    eprintln!("  external throughput ({label} nop), {} connections, {:.0} s", a.connections, a.duration_s);
    let nop = format!("bench-nop-{lang}");
    let rate = throughput(server.addr, &nop, a.connections, Duration::from_secs_f64(a.duration_s))?.per_s;
    rows.push(Row {
        name: if lang == "c" {
            format!("external throughput, {} conns", a.connections)
        } else {
            format!("external throughput, {label}, {} conns", a.connections)
        },
        mode: mode.into(),
        samples_ns: vec![],
        rate: Some(rate),
    });
    Ok(())
}

/// Worker start-up times (launcher asked → worker ready to serve), as the
/// engine records them. Each redeploy of the nop function (`min_workers:
/// 1`) starts a fresh launcher that is asked for exactly one worker: one
/// sample per redeploy, never a batch.
fn worker_ready(c: &mut Client, lang: &str, name: &str) -> Result<Vec<u64>> {
    let specs = bench_specs(lang)?;
    let f = specs.iter().find(|f| f.spec.name == name).ok_or_else(|| anyhow!("{name} is not in the manifest"))?;
    let mut out = Vec::new();
    for _ in 0..WORKER_READY_SAMPLES {
        client::deploy::deploy_function(c, f).with_context(|| format!("redeploying {name}"))?;
        // The launcher is ready when the deploy returns; its worker follows.
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let r = c.request("GET", &format!("/system/functions/{name}"), b"")?;
            let v: serde_json::Value = serde_json::from_slice(&r.body)?;
            if let Some(us) = v["status"]["scheduler"]["worker_ready_us"].as_array().and_then(|a| a.first()?.as_u64()) {
                out.push(us * 1000);
                break;
            }
            if Instant::now() > deadline {
                bail!("{name}: no worker became ready; its status: {}", v["status"]);
            }
            // The figure is the engine's own clock, so polling often buys
            // nothing; every 2 ms, the status requests (gateway, engine
            // control) took CPU from the start they measure when pinned.
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    Ok(out)
}

const WORKER_READY_SAMPLES: usize = 5;

pub(crate) fn print_table(rows: &[Row]) {
    println!("{:<40} {:<13} {:>9} {:>9} {:>9} {:>8}", "measurement", "placement", "p50 µs", "p99 µs", "p99.9 µs", "n");
    for r in rows {
        match r.rate {
            Some(rate) => {
                println!("{:<40} {:<13} {:>9} {:>9} {:>9} {:>8}", r.name, r.mode, format!("{rate:.0}/s"), "", "", "")
            }
            None => println!(
                "{:<40} {:<13} {:>9.1} {:>9.1} {:>9.1} {:>8}",
                r.name,
                r.mode,
                r.pct_us(50.0),
                r.pct_us(99.0),
                r.pct_us(99.9),
                r.samples_ns.len()
            ),
        }
    }
}

pub(crate) fn machine() -> Value {
    let model = std::fs::read_to_string("/proc/cpuinfo").ok().and_then(|s| {
        s.lines().find(|l| l.starts_with("model name")).map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
    });
    json!({"cpus": sys::cpu::cpus_allowed().len(), "cpu_model": model, "kernel": std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim()})
}

// ---- floors ----

/// 1 KB round trips over two anonymous pipes between two threads.
fn pipe_pingpong(n: usize, cpu_a: usize, cpu_b: usize) -> Result<Vec<u64>> {
    let saved = sys::cpu::cpus_allowed();
    let (r1, w1) = sys::pipe::pipe()?;
    let (r2, w2) = sys::pipe::pipe()?;
    let echo = std::thread::spawn(move || -> Result<()> {
        sys::cpu::set_affinity(0, &[cpu_b])?;
        floor::echo(r1, w2)
    });
    sys::cpu::set_affinity(0, &[cpu_a])?;
    let (mut w1, mut r2) = (w1, r2);
    let buf = [7u8; 1024];
    let mut back = [0u8; 1024];
    let out = timed(n, || {
        w1.write_all(&buf)?;
        Ok(r2.read_exact(&mut back)?)
    })?;
    drop(w1);
    echo.join().map_err(|_| anyhow!("echo thread panicked"))??;
    sys::cpu::set_affinity(0, &saved)?;
    Ok(out)
}

/// One-way latency of Staccato messages over a real channel (FIFO pair made
/// by the engine's code), timestamped by the sender, read by the receiver
/// the way workers read (poll, then read one 1 KB message).
fn channel_one_way(n: usize, cpu_a: usize, cpu_b: usize) -> Result<Vec<u64>> {
    let saved = sys::cpu::cpus_allowed();
    let dir = std::env::temp_dir().join(format!("staccato-bench-chan-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let eng = sys::channel::EngineChannel::create(&dir, 1)?;
    let (wrx, wtx) = sys::channel::open_worker_side(&dir, 1)?;
    sys::pipe::set_nonblocking(&wrx, true)?;
    let peer = std::thread::spawn(move || -> std::io::Result<Vec<u64>> {
        sys::cpu::set_affinity(0, &[cpu_b])?;
        let mut m = Message::default();
        let mut lat = Vec::new();
        loop {
            match sys::channel::read_message_spin(&wrx, &mut m, Duration::ZERO) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(lat),
                Err(e) => return Err(e),
            }
            let h = m.header().map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
            if h.kind == Kind::StopWorker {
                return Ok(lat);
            }
            lat.push(sys::clock::monotonic_ns().saturating_sub(h.send_ts_ns));
            let mut r = Header::new(Kind::Completion);
            r.call_id = h.call_id;
            r.send_ts_ns = sys::clock::monotonic_ns();
            sys::channel::write_message(&wtx, &Message::new(&r, &[]))?;
        }
    });
    sys::cpu::set_affinity(0, &[cpu_a])?;
    let mut lat = Vec::with_capacity(n);
    let rx = eng.rx.try_clone()?;
    sys::pipe::set_nonblocking(&rx, true)?;
    for i in 0..(n + n / 10) as u64 {
        let mut h = Header::new(Kind::Dispatch);
        h.call_id = i + 1;
        h.send_ts_ns = sys::clock::monotonic_ns();
        sys::channel::write_message(&eng.tx, &Message::new(&h, &[]))?;
        let mut m = Message::default();
        sys::channel::read_message_spin(&rx, &mut m, Duration::ZERO)?;
        let back = m.header().map_err(|e| anyhow!("{e}"))?;
        if i >= (n / 10) as u64 {
            lat.push(sys::clock::monotonic_ns().saturating_sub(back.send_ts_ns));
        }
    }
    sys::channel::write_message(&eng.tx, &Message::new(&Header::new(Kind::StopWorker), &[]))?;
    let mut theirs = peer.join().map_err(|_| anyhow!("channel peer panicked"))??;
    sys::cpu::set_affinity(0, &saved)?;
    let _ = std::fs::remove_dir_all(&dir);
    // Both directions are one-way samples; drop the peer's warm-up too.
    lat.extend(theirs.drain(n / 10..));
    Ok(lat)
}

/// Round trips to a minimal blocking HTTP/1.1 server on loopback: what any
/// HTTP hop costs here before any FaaS work.
fn plain_http(n: usize) -> Result<Vec<u64>> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let addr = l.local_addr()?;
    plain_http_server(l);
    plain_http_client(addr, n)
}

/// A minimal keep-alive HTTP server on `l` (one connection, answered with
/// an empty 200) on a thread of its own: the floor of the external path.
pub(crate) fn plain_http_server(l: TcpListener) {
    std::thread::spawn(move || {
        if let Ok((s, _)) = l.accept() {
            floor::serve_http(s, &mut |_| Ok(()));
        }
    });
}

/// A nop HTTP/1.1 server on hyper, the floor for the throughput run: a
/// thread per usable vCPU, each with a single-threaded tokio runtime,
/// accepting from the same listener and answering every request `200` with
/// an empty body on kept-alive connections. It runs until the process
/// exits.
pub(crate) fn hyper_nop_server(l: TcpListener) -> Result<()> {
    l.set_nonblocking(true)?;
    for _ in 0..sys::cpu::cpus_allowed().len().max(1) {
        let l = l.try_clone()?;
        let rt = tokio::runtime::Builder::new_current_thread().enable_io().build()?;
        std::thread::spawn(move || {
            rt.block_on(async move {
                let Ok(l) = tokio::net::TcpListener::from_std(l) else { return };
                loop {
                    let Ok((s, _)) = l.accept().await else { continue };
                    let _ = s.set_nodelay(true);
                    tokio::spawn(async move {
                        let svc = hyper::service::service_fn(|_req| async {
                            Ok::<_, std::convert::Infallible>(hyper::Response::new(
                                http_body_util::Empty::<bytes::Bytes>::new(),
                            ))
                        });
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(hyper_util::rt::TokioIo::new(s), svc)
                            .await;
                    });
                }
            })
        });
    }
    Ok(())
}

/// `n` timed round trips to a [`plain_http_server`] (after n/10 untimed).
pub(crate) fn plain_http_client(addr: SocketAddr, n: usize) -> Result<Vec<u64>> {
    let mut c = Client::new(&format!("http://{addr}"), None)?;
    timed(n, || Ok(c.request("POST", "/", b"").map(drop)?))
}

/// Runs `step` n/10 times untimed, then `n` times timed: each run's
/// nanoseconds.
pub(crate) fn timed(n: usize, mut step: impl FnMut() -> Result<()>) -> Result<Vec<u64>> {
    for _ in 0..n / 10 {
        step()?;
    }
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        step()?;
        out.push(t.elapsed().as_nanos() as u64);
    }
    Ok(out)
}

// ---- Staccato ----

pub(crate) struct Server {
    child: Child,
    pub(crate) url: String,
    addr: SocketAddr,
    pub(crate) state: PathBuf,
}

impl Server {
    pub(crate) fn start(extra: &[String]) -> Result<Server> {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let state = std::env::temp_dir().join(format!("staccato-bench-{}-{port}", std::process::id()));
        let _ = std::fs::remove_dir_all(&state);
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse()?;
        let log = std::fs::File::create(std::env::temp_dir().join(format!("staccato-bench-{port}.log")))?;
        let child = Command::new(std::env::current_exe()?)
            .args(["up", "--listen", &addr.to_string(), "--state-dir"])
            .arg(&state)
            .args(["--ipc-dir", &format!("/dev/shm/staccato-bench-{port}")])
            .args(extra)
            .env("STACCATO_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("starting staccato up")?;
        let url = format!("http://{addr}");
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Ok(mut c) = Client::new(&url, None) {
                if c.request("GET", "/healthz", b"").is_ok_and(|r| r.status == 200) {
                    break;
                }
            }
            if Instant::now() > deadline {
                bail!("staccato up did not become healthy");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(Server { child, url, addr, state })
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // SIGTERM first: it removes its function containers, pool and
        // network namespaces on the way out.
        let _ = sys::process::signal(self.child.id(), libc::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline && matches!(self.child.try_wait(), Ok(None)) {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.state);
        let _ = std::fs::remove_dir_all(format!("/dev/shm/staccato-bench-{}", self.addr.port()));
    }
}

fn bench_dir(lang: &str) -> Result<PathBuf> {
    let mut candidates = vec![PathBuf::from("bench/functions")];
    if let Ok(exe) = std::env::current_exe() {
        for anc in exe.ancestors().skip(1).take(4) {
            candidates.push(anc.join("bench/functions"));
        }
    }
    candidates
        .into_iter()
        .map(|p| p.join(lang))
        .find(|p| p.join("staccato.yml").is_file())
        .ok_or_else(|| anyhow!("cannot find bench/functions/{lang}"))
}

pub(crate) fn bench_specs(lang: &str) -> Result<Vec<api::manifest::ManifestFunction>> {
    let dir = bench_dir(lang)?;
    let text = std::fs::read_to_string(dir.join("staccato.yml"))?;
    api::manifest::parse(&text, &dir).map_err(|e| anyhow!("bench manifest: {e}"))
}

pub(crate) fn deploy_bench_functions(c: &mut Client, lang: &str) -> Result<()> {
    for f in bench_specs(lang)? {
        client::deploy::deploy_function(c, &f).with_context(|| format!("deploying {}", f.spec.name))?;
    }
    // Deploying took containers from the isolation pool, which now makes
    // new ones (runc, a warm Python: ~100 ms of CPU each). This measures the
    // warm path, so let that finish first.
    std::thread::sleep(Duration::from_millis(1500));
    Ok(())
}

fn invoke(c: &mut Client, name: &str, input: &[u8]) -> Result<Vec<u8>> {
    let r = c.request("POST", &format!("/function/{name}"), input)?;
    if r.status != 200 {
        bail!("{name}: HTTP {}: {}", r.status, String::from_utf8_lossy(&r.body));
    }
    Ok(r.body)
}

/// Internal calls timed inside the calling function.
pub(crate) fn internal(c: &mut Client, caller: &str, callee: &str, n: usize) -> Result<Vec<u64>> {
    invoke(c, caller, format!("{}:{callee}", (n / 10).max(1)).as_bytes())?; // warm-up
    let out = invoke(c, caller, format!("{n}:{callee}").as_bytes())?;
    Ok(out.chunks_exact(4).map(|b| u64::from(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))).collect())
}

/// External calls through the gateway on one keep-alive connection.
pub(crate) fn external(c: &mut Client, name: &str, n: usize) -> Result<Vec<u64>> {
    // Back to back: an infinite rate makes every gap 0.
    paced(c, &format!("/function/{name}"), f64::INFINITY, n)
}

/// `n` calls to `path` at `rate` a second on average, with exponential gaps
/// from a fixed seed (an open-loop Poisson arrival process, as
/// `staccato bench run` makes), over one keep-alive connection, after n/10
/// untimed ones: each call's round trip. At the low rates this is for, a
/// call is long done before the next is due; one that is due earlier waits
/// for it (and is timed from when it is sent).
pub(crate) fn paced(c: &mut impl Requester, path: &str, rate: f64, n: usize) -> Result<Vec<u64>> {
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut uniform = move || {
        // xorshift64*: enough for arrival gaps.
        seed ^= seed >> 12;
        seed ^= seed << 25;
        seed ^= seed >> 27;
        (seed.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64
    };
    let mut out = Vec::with_capacity(n);
    let mut due = Instant::now();
    for i in 0..n + n / 10 {
        let gap = -(1.0 - uniform()).ln() / rate;
        if gap > 0.0 {
            due += Duration::from_secs_f64(gap);
        }
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        let t = Instant::now();
        let r = c.request("POST", path, b"")?;
        let el = t.elapsed().as_nanos() as u64;
        if r.status != 200 {
            bail!("{path}: HTTP {}", r.status);
        }
        if i >= n / 10 {
            out.push(el);
        }
    }
    Ok(out)
}

/// Calls a throughput run completed in its measured window, and their rate.
pub(crate) struct Rate {
    pub(crate) count: u64,
    pub(crate) per_s: f64,
}

/// Closed-loop load from `conns` keep-alive connections, one request in
/// flight on each, for `dur` after a warm-up of a fifth of it.
pub(crate) fn throughput(addr: SocketAddr, name: &str, conns: usize, dur: Duration) -> Result<Rate> {
    throughput_marked(addr, name, conns, dur, &mut || {})
}

/// [`throughput`], calling `mark` as the measured window opens and as it
/// closes (to read CPU counters over exactly the calls counted).
pub(crate) fn throughput_marked(
    addr: SocketAddr,
    name: &str,
    conns: usize,
    dur: Duration,
    mark: &mut dyn FnMut(),
) -> Result<Rate> {
    let req = format!("POST /function/{name} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\n\r\n").into_bytes();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Two client threads (like `wrk -t2`) share the connections.
    let threads = 2.min(conns);
    let mut hs = Vec::new();
    for t in 0..threads {
        let my = conns / threads + usize::from(t < conns % threads);
        let (req, done, stop) = (req.clone(), done.clone(), stop.clone());
        hs.push(std::thread::spawn(move || -> Result<()> {
            let mut streams: Vec<(TcpStream, BufReader<TcpStream>)> = Vec::new();
            for _ in 0..my {
                let s = TcpStream::connect(addr)?;
                s.set_nodelay(true)?;
                let r = BufReader::new(s.try_clone()?);
                streams.push((s, r));
            }
            // Keep every connection busy: send on all, then collect in order.
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for (s, _) in streams.iter_mut() {
                    s.write_all(&req)?;
                }
                for (_, r) in streams.iter_mut() {
                    let resp = read_response(r)?;
                    if resp.status != 200 {
                        bail!("HTTP {}", resp.status);
                    }
                }
                done.fetch_add(my as u64, std::sync::atomic::Ordering::Relaxed);
            }
            Ok(())
        }));
    }
    std::thread::sleep(dur / 5); // warm-up
    mark();
    let start_count = done.load(std::sync::atomic::Ordering::Relaxed);
    let t = Instant::now();
    std::thread::sleep(dur);
    let count = done.load(std::sync::atomic::Ordering::Relaxed) - start_count;
    let el = t.elapsed().as_secs_f64();
    mark();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for h in hs {
        h.join().map_err(|_| anyhow!("load thread panicked"))??;
    }
    Ok(Rate { count, per_s: count as f64 / el })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lat(name: &str, mode: &str, us: u64) -> Row {
        Row::latency(name, mode, vec![us * 1000; 3])
    }

    #[test]
    fn ratio_lines_divide_each_figure_by_the_floors_measured_in_the_run() {
        let rows = vec![
            lat(PIPE, SAME_VCPU, 2),
            lat(PIPE_PROCESSES, SAME_VCPU, 4),
            lat(PIPE_RELAY, SAME_VCPU, 5),
            lat(&internal_row("C"), "pinned", 10),
            lat(PLAIN, "pinned", 5),
            lat(PLAIN_PROCESS, "pinned", 8),
            lat(HTTP_RELAY, "pinned", 10),
            lat(&external_row("C"), "pinned", 20),
            lat(&low_load_row(LOW_PLAIN, 100.0), "pinned", 10),
            lat(&low_load_row(LOW_STACCATO, 100.0), "pinned", 25),
            // No samples, or a rate: no figure, no floor.
            Row::latency(&external_row("C"), "default", vec![]),
            Row::rate(PLAIN, "default", 1.0),
        ];
        assert_eq!(
            ratio_lines(&rows, 100.0),
            [
                "internal C nop p50 (pinned): 5.00x the pipe, 2.50x the pipe between processes, 2.00x the relay",
                "external C nop p50 (pinned): 4.00x plain HTTP, 2.50x its server process, 2.00x the relay",
                "C nop at 100/s p50 (pinned): 2.50x plain HTTP",
            ]
        );
    }

    #[test]
    fn low_load_rows_keep_their_names() {
        assert_eq!(low_load_row(LOW_PLAIN, 100.0), "plain HTTP at 100/s, open loop");
        assert_eq!(low_load_row(LOW_RELAY, 100.0), "HTTP relay process at 100/s, open loop");
        assert_eq!(low_load_row(LOW_STACCATO, 100.0), "external nop at 100/s, open loop, C");
    }
}
