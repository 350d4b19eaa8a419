//! `staccato bench cluster`: the cluster's call paths side by side, all in
//! one run, on test hosts ([`crate::bed`]):
//!
//! * floors: a plain HTTP server's round trip on one host and across two;
//! * external nop calls through a gateway to an engine on the gateway's
//!   host, to one on another host, and to the single-server `staccato up`
//!   (on this machine's loopback), in interleaved rounds; the client sits
//!   on the gateway's host, as it does for `up`, so the three differ only
//!   in the gateway–engine hop;
//! * internal nop calls from a caller to a callee on its own engine and to
//!   one on another host (through the gateway), timed inside the caller;
//! * throughput from the client host with the function on 1, 2 and 3
//!   engines, with the CPU time the gateway, this client and the whole
//!   machine spent per call, from which a larger cluster's capacity
//!   follows (BENCHMARKS.md writes the computation down).
//!
//! Nothing here asserts a number.

use crate::bed::{self, Bed, Layout};
use crate::micro::{self, Row};
use anyhow::{anyhow, bail, Context, Result};
use api::manifest::ManifestFunction;
use api::spec::Placement;
use clap::Args;
use client::Client;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::Duration;

#[derive(Args, Clone)]
pub struct ClusterArgs {
    /// Calls per latency measurement and round.
    #[arg(long, default_value_t = 5_000, value_parser = clap::value_parser!(u32).range(10..))]
    calls: u32,
    /// Interleaved rounds of the latency measurements; each path goes first
    /// equally often when it is a multiple of 3.
    #[arg(long, default_value_t = 6, value_parser = clap::value_parser!(u32).range(1..))]
    rounds: u32,
    /// Seconds of each throughput run.
    #[arg(long, default_value_t = 3.0)]
    duration_s: f64,
    /// Client connections of the throughput runs.
    #[arg(long, default_value_t = 32)]
    connections: usize,
    /// Extra argument for every engine (and `staccato up`), repeatable.
    #[arg(long = "engine-arg", allow_hyphen_values = true)]
    engine_args: Vec<String>,
    /// The testbed's name (its hosts are the namespaces stb-NAME-*).
    #[arg(long, default_value = "bench")]
    prefix: String,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// The engines the throughput runs use, by the `first<k>` label each
/// function is placed with.
const SCALE: [u32; 3] = [1, 2, 3];

pub fn run(a: ClusterArgs) -> Result<()> {
    if sys::process::euid() != 0 {
        bail!("bench cluster makes network namespaces: run it as root");
    }
    let dir = std::env::temp_dir().join(format!("staccato-bench-cluster-{}", a.prefix));
    let layout = Layout {
        prefix: a.prefix.clone(),
        dir: dir.clone(),
        gateways: 1,
        engines: 3,
        spare: 0,
        colocated: true,
        engine_args: a.engine_args.clone(),
        gateway_args: Vec::new(),
    };
    eprintln!("staccato bench cluster: {} calls x {} rounds per latency figure", a.calls, a.rounds);
    // The bench's own testbed: one a crashed run left is removed first.
    bed::down(&a.prefix, Some(&dir))?;
    let _ = std::fs::remove_dir_all(&dir);
    let b = Bed::up(&layout, &|s| eprintln!("  {s}"))?;
    let result = measure(&a, &b);
    if let Err(e) = bed::down(&a.prefix, Some(&dir)) {
        eprintln!("tearing the testbed down: {e:#}");
    }
    let (rows, cpu, ratios) = result?;
    if a.json {
        let out = json!({
            "machine": micro::machine(),
            "results": rows.iter().map(Row::to_json).collect::<Vec<_>>(),
            "cpu_per_call_us": cpu,
            "p50_ratios_median_over_rounds": ratios,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        micro::print_table(&rows);
        let r = |k: &str| ratios[k].as_f64().unwrap_or(f64::NAN);
        println!("\np50 ratios, median over rounds of each round's ratio:");
        println!("  external, engine on the gateway's host / staccato up   {:.3}", r("here_over_up"));
        println!("  external, engine on another host / on the gateway's   {:.3}", r("away_over_here"));
        println!("  internal, callee on the caller's engine / staccato up  {:.3}", r("internal_local_over_up"));
        println!("  internal, callee on another host / on the caller's     {:.3}", r("internal_cross_over_local"));
        println!("\nCPU time per call (µs), throughput runs:");
        println!(
            "{:<8} {:>10} {:>10} {:>10} {:>22}",
            "engines", "gateway", "client", "machine", "rest (engines, kernel)"
        );
        for c in cpu.as_array().into_iter().flatten() {
            let f = |k: &str| c[k].as_f64().unwrap_or(f64::NAN);
            println!(
                "{:<8} {:>10.1} {:>10.1} {:>10.1} {:>22.1}",
                c["engines"].as_u64().unwrap_or(0),
                f("gateway_us"),
                f("client_us"),
                f("machine_us"),
                f("rest_us")
            );
        }
    }
    Ok(())
}

fn measure(a: &ClusterArgs, b: &Bed) -> Result<(Vec<Row>, Value, Value)> {
    eprintln!("  deploying the C nop and caller, placed on each host");
    let token = b.token.clone();
    let url = b.url(0);
    let gw_host = b.netns_path("gw0")?;
    let client_host = b.netns_path("client")?;
    let specs = placed_specs()?;
    {
        let (url, token) = (url.clone(), token.clone());
        bed::in_netns(&client_host, move || {
            let mut c = Client::new(&url, Some(token))?;
            for f in &specs {
                client::deploy::deploy_function(&mut c, f).with_context(|| format!("deploying {}", f.spec.name))?;
            }
            Ok(())
        })?;
    }
    // In a host of the bed, like the gateways: this machine's own namespace
    // carries whatever firewall and conntrack state it has (its plain
    // loopback round trip was 70 µs where a fresh namespace's was 44).
    eprintln!("  starting staccato up on the client host's loopback (the single-server baseline)");
    let engine_args = a.engine_args.clone();
    let up = bed::in_netns(&client_host, move || {
        let up = micro::Server::start(&engine_args)?;
        let mut c = Client::new(&up.url, client::read_token(&up.state))?;
        // This waits for the pools to refill after the deploys, the bed's too.
        micro::deploy_bench_functions(&mut c, "c")?;
        Ok(up)
    })?;
    let (up_url, up_token) = (up.url.clone(), client::read_token(&up.state));

    let mut samples: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    // Each round's p50 of each external path, for ratios between rounds'
    // neighbours rather than pooled over the whole run.
    let mut p50s: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    let engine0 = b.member("engine0")?.addr.ip();
    let calls = a.calls as usize;
    for round in 0..a.rounds as usize {
        // Floors: a plain HTTP server on the gateway's host (loopback) and
        // on engine0's host, called from the gateway's host.
        for (key, server_host, ip) in [("http-here", "gw0", "127.0.0.1".parse()?), ("http-away", "engine0", engine0)] {
            let addr = bed::in_netns(&b.netns_path(server_host)?, move || {
                let l = std::net::TcpListener::bind((ip, 0))?;
                let addr = l.local_addr()?;
                micro::plain_http_server(l);
                Ok(addr)
            })?;
            let n = calls;
            samples.entry(key).or_default().extend(bed::in_netns(&gw_host, move || micro::plain_http_client(addr, n))?);
        }
        eprintln!(
            "  round {}/{}: floors, external nop (up, same host, other host), internal (up, local, cross-server)",
            round + 1,
            a.rounds
        );
        // The three external paths in turn, each round starting one later.
        let paths = [
            ("up", &client_host, up_url.clone(), up_token.clone(), "bench-nop-c"),
            ("here", &gw_host, url.clone(), Some(token.clone()), "nop-here"),
            ("away", &gw_host, url.clone(), Some(token.clone()), "nop-away"),
        ];
        for i in 0..paths.len() {
            let (key, host, u, t, name) = paths[(round + i) % paths.len()].clone();
            let n = calls;
            let mut s = bed::in_netns(host, move || micro::external(&mut Client::new(&u, t)?, name, n))?;
            s.sort_unstable();
            p50s.entry(key).or_default().push(s[s.len() / 2]);
            samples.entry(key).or_default().extend(s);
        }
        // The three internal paths in turn too: (key, gateway, token, caller, callee).
        let internals = [
            ("up-internal", up_url.clone(), up_token.clone(), "bench-caller-c", "bench-nop-c"),
            ("local", url.clone(), Some(token.clone()), "caller-e0", "nop-away"),
            ("cross", url.clone(), Some(token.clone()), "caller-e0", "nop-e1"),
        ];
        for i in 0..internals.len() {
            let (key, u, t, caller, callee) = internals[(round + i) % internals.len()].clone();
            let n = calls;
            let mut s =
                bed::in_netns(&client_host, move || micro::internal(&mut Client::new(&u, t)?, caller, callee, n))?;
            s.sort_unstable();
            p50s.entry(key).or_default().push(s[s.len() / 2]);
            samples.entry(key).or_default().extend(s);
        }
    }
    let ratio = |x: &str, y: &str| {
        let mut r: Vec<f64> = p50s[x].iter().zip(&p50s[y]).map(|(&a, &b)| a as f64 / (b as f64).max(1.0)).collect();
        r.sort_by(f64::total_cmp);
        r[r.len() / 2]
    };
    let ratios = json!({
        "here_over_up": ratio("here", "up"),
        "away_over_here": ratio("away", "here"),
        "internal_local_over_up": ratio("local", "up-internal"),
        "internal_cross_over_local": ratio("cross", "local"),
    });
    let mut take = |k: &str| samples.remove(k).unwrap_or_default();
    let mut rows = vec![
        Row::latency("plain HTTP round trip (floor)", "same host", take("http-here")),
        Row::latency("plain HTTP round trip (floor)", "across hosts", take("http-away")),
        Row::latency("external nop, staccato up", "1 engine", take("up")),
        Row::latency("external nop, engine on gateway's host", "4 engines", take("here")),
        Row::latency("external nop, engine on another host", "4 engines", take("away")),
        Row::latency("internal nop, staccato up", "1 engine", take("up-internal")),
        Row::latency("internal nop, callee on caller's engine", "engine0", take("local")),
        Row::latency("internal nop, callee on another host", "engine0->1", take("cross")),
    ];
    drop(up);

    let gateway = b.member("gw0")?.pid.ok_or_else(|| anyhow!("gw0 is not running"))?;
    let mut cpu = Vec::new();
    for k in SCALE {
        eprintln!("  throughput from the client host, nop on {k} engine(s), {} connections", a.connections);
        let conns = a.connections;
        let dur = Duration::from_secs_f64(a.duration_s);
        let name = format!("nop-n{k}");
        let addr = b.member("gw0")?.addr;
        let (rate, marks) = bed::in_netns(&client_host, move || {
            let mut marks = Vec::new();
            let rate = micro::throughput_marked(addr, &name, conns, dur, &mut || marks.push(Cpu::read(gateway)))?;
            Ok((rate, marks))
        })?;
        let (before, after) = match marks.as_slice() {
            [Ok(b), Ok(a)] => (b, a),
            _ => bail!("reading CPU times around the throughput window failed"),
        };
        let calls = rate.count as f64;
        let per = |x: f64| x * 1e6 / calls.max(1.0);
        cpu.push(json!({
            "engines": k,
            "calls": rate.count,
            "gateway_us": per(after.gateway - before.gateway),
            "client_us": per(after.client - before.client),
            "machine_us": per(after.machine - before.machine),
            "rest_us": per((after.machine - before.machine) - (after.gateway - before.gateway) - (after.client - before.client)),
        }));
        rows.push(Row::rate(&format!("throughput, nop on {k} engine(s)"), &format!("{conns} conns"), rate.per_s));
    }
    Ok((rows, Value::Array(cpu), ratios))
}

/// The C benchmark functions, renamed and placed: `nop-here` on the
/// gateway's host (`local`), `nop-away` and `caller-e0` on engine0,
/// `nop-e1` on engine1, `nop-n<k>` on the first k engines.
fn placed_specs() -> Result<Vec<ManifestFunction>> {
    let specs = micro::bench_specs("c")?;
    let find = |name: &str| specs.iter().find(|f| f.spec.name == name).cloned().ok_or_else(|| anyhow!("no {name}"));
    let placed = |base: &str, name: &str, key: &str, value: &str| -> Result<ManifestFunction> {
        let mut f = find(base)?;
        f.spec.name = name.into();
        f.spec.placement = Placement { labels: [(key.to_string(), value.to_string())].into(), engines: 0 };
        Ok(f)
    };
    let mut out = vec![
        placed("bench-nop-c", "nop-here", "host", "local")?,
        placed("bench-nop-c", "nop-away", "host", "engine0")?,
        placed("bench-nop-c", "nop-e1", "host", "engine1")?,
        placed("bench-caller-c", "caller-e0", "host", "engine0")?,
    ];
    for k in SCALE {
        out.push(placed("bench-nop-c", &format!("nop-n{k}"), &format!("first{k}"), "y")?);
    }
    Ok(out)
}

/// CPU time (seconds) spent so far by the gateway, by this process (the
/// client), and by the whole machine; the rest of the machine's is the
/// engines', their workers' and the kernel's share of the calls.
struct Cpu {
    gateway: f64,
    client: f64,
    machine: f64,
}

impl Cpu {
    fn read(gateway: u32) -> Result<Cpu> {
        Ok(Cpu {
            gateway: proc_cpu(gateway).context("reading the gateway's CPU time")?,
            client: proc_cpu(std::process::id()).context("reading our CPU time")?,
            machine: machine_cpu()?,
        })
    }
}

/// Linux reports /proc times in USER_HZ, which is 100 on every
/// architecture it runs on.
const USER_HZ: f64 = 100.0;

/// utime + stime of every thread of `pid`, in seconds.
fn proc_cpu(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After the command: state is field 3, utime 14, stime 15 (1-based).
    let ticks = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    Some(ticks / USER_HZ)
}

/// Busy CPU time of the whole machine (all but idle and iowait), seconds.
fn machine_cpu() -> Result<f64> {
    let stat = std::fs::read_to_string("/proc/stat")?;
    let line = stat.lines().next().ok_or_else(|| anyhow!("/proc/stat is empty"))?;
    let v: Vec<f64> = line.split_whitespace().skip(1).filter_map(|x| x.parse().ok()).collect();
    // user nice system idle iowait irq softirq steal (guest is in user):
    // busy is what this machine's own vCPUs ran, so not steal.
    if v.len() < 7 {
        bail!("/proc/stat: unexpected first line {line:?}");
    }
    let busy: f64 = v[0] + v[1] + v[2] + v[5] + v[6];
    Ok(busy / USER_HZ)
}
