//! `staccato bench`: open-loop workloads (`run`, crates/loadgen), their
//! analysis (`analyze`, `compare`, tools/staccato_analyzer), and the
//! microbenchmarks of crates/bench (`micro`, `coldstart`).

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

#[derive(Subcommand)]
pub enum BenchCmd {
    /// Microbenchmarks: pipes, message channels, internal and external calls.
    Micro(staccato_bench::micro::MicroArgs),
    /// Open-loop workload from a FaaSProfiler-style JSON config (see crates/loadgen).
    Run(RunArgs),
    /// Container cold starts: runc run vs the isolation pool vs resume vs zygote fork.
    Coldstart(staccato_bench::coldstart::ColdArgs),
    /// A cluster on test hosts (root): external calls to an engine on the
    /// gateway's host, another host and `staccato up`; internal calls
    /// across servers; throughput and CPU per call with 1-3 engines.
    Cluster(staccato_bench::cluster::ClusterArgs),
    /// A floor's peer process for `bench micro` (an echo, a relay, a plain
    /// HTTP server): internal.
    #[command(hide = true)]
    Floor(staccato_bench::floor::FloorArgs),
    /// Analyze a run directory (python3 -m staccato_analyzer analyze).
    Analyze { run: PathBuf },
    /// Compare run directories (python3 -m staccato_analyzer compare).
    Compare {
        #[arg(required = true)]
        runs: Vec<PathBuf>,
        /// Where to write the overlaid plots and compare.json.
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

#[derive(Args, Clone)]
pub struct RunArgs {
    /// The workload JSON (FaaSProfiler's format plus extensions).
    config: PathBuf,
    /// Run directory; default bench-results/<test_name>-<YYYYmmdd-HHMMSS>.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Upper bound on open connections (one request in flight on each).
    #[arg(long, default_value_t = 1024)]
    max_connections: usize,
    /// Seconds outstanding requests may take after the last arrival; then they count as `timeout`.
    #[arg(long, default_value_t = 10.0)]
    drain_timeout_s: f64,
    /// Do not run the Python analyzer afterwards.
    #[arg(long)]
    no_analyze: bool,
    /// Check https:// targets' certificates against the CA certificates in this PEM file
    /// (by default any certificate is accepted, as FaaSProfiler does).
    #[arg(long, value_name = "FILE")]
    tls_ca: Option<PathBuf>,
}

/// `gateway`: --gateway / STACCATO_GATEWAY, for configs without `base_url`.
pub fn run(cmd: BenchCmd, gateway: &str, token: Option<String>) -> Result<()> {
    match cmd {
        BenchCmd::Micro(a) => staccato_bench::micro::run(a),
        BenchCmd::Run(a) => run_workload(a, gateway, token),
        BenchCmd::Cluster(a) => staccato_bench::cluster::run(a),
        BenchCmd::Coldstart(a) => {
            crate::up::init_logging();
            staccato_bench::coldstart::run(a)
        }
        BenchCmd::Floor(a) => staccato_bench::floor::peer(a),
        BenchCmd::Analyze { run } => analyzer_checked("analyze", &[run]),
        BenchCmd::Compare { mut runs, out } => {
            if let Some(out) = out {
                runs.extend([PathBuf::from("--out"), out]);
            }
            analyzer_checked("compare", &runs)
        }
    }
}

fn run_workload(a: RunArgs, gateway: &str, token: Option<String>) -> Result<()> {
    let opts = loadgen::RunOptions {
        token,
        base_url: gateway.to_string(),
        out_dir: a.out,
        max_connections: a.max_connections,
        drain: Duration::from_secs_f64(a.drain_timeout_s.max(0.0)),
        progress: true,
        versions: serde_json::json!({"staccato": env!("CARGO_PKG_VERSION"), "git": staccato_bench::git_describe()}),
        tls_ca: a.tls_ca,
    };
    let res = loadgen::run(&a.config, &opts)?;
    let o = &res.summary["overall"];
    eprintln!(
        "{} requests, {} ok; latency p50 {} ms, p99 {} ms; send lag p99 {} ms; achieved {:.1}/s of {:.1}/s offered",
        o["count"],
        o["ok"],
        o["latency_ms"]["p50"],
        o["latency_ms"]["p99"],
        o["send_lag_ms"]["p99"],
        o["achieved_rate"].as_f64().unwrap_or(0.0),
        o["offered_rate"].as_f64().unwrap_or(0.0),
    );
    if let Some(best) = res.summary.get("slo") {
        eprintln!("highest swept rate meeting the SLO: {}", best["max_rate_meeting_slo"]);
    }
    if !a.no_analyze {
        match analyzer("analyze", std::slice::from_ref(&res.dir)) {
            Ok(true) => {}
            Ok(false) => eprintln!("note: the analyzer failed; the records are complete without it"),
            Err(e) => eprintln!("note: analyzer not run ({e})"),
        }
    }
    println!("{}", res.dir.display());
    Ok(())
}

/// `python3 -m staccato_analyzer VERB ARGS` with PYTHONPATH=<repo>/tools.
/// Ok(false) when it ran and failed.
/// Runs the analyzer and fails when it does.
fn analyzer_checked(verb: &str, args: &[PathBuf]) -> Result<()> {
    if !analyzer(verb, args)? {
        bail!("the analyzer failed (see its output above)");
    }
    Ok(())
}

fn analyzer(verb: &str, args: &[PathBuf]) -> Result<bool> {
    let tools = staccato_bench::find_repo()?.join("tools");
    if !tools.join("staccato_analyzer").is_dir() {
        bail!("{} has no staccato_analyzer", tools.display());
    }
    let st = Command::new("python3")
        .args(["-m", "staccato_analyzer", verb])
        .args(args)
        .env("PYTHONPATH", &tools)
        .status()
        .context("running python3")?;
    Ok(st.success())
}
