//! `staccato up` / `staccato down`: the embedded single-machine setup, a
//! gateway and an engine in one process, joined over loopback TCP exactly as
//! they would be across machines.

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, ValueEnum};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum PlacementArg {
    /// I/O thread i, its workers and gateway thread i share CPU i.
    Packed,
    /// Let the kernel place every thread.
    Kernel,
}

/// Settings both the engine and the gateway read.
#[derive(Args, Clone, Debug)]
pub struct CommonArgs {
    /// Functions, code and logs are kept here.
    #[arg(long, env = "STACCATO_STATE_DIR")]
    pub state_dir: Option<PathBuf>,
    /// Largest request or response body, in bytes.
    #[arg(long, default_value_t = wire::PAYLOAD_LEN_MAX_DEFAULT)]
    pub payload_max: usize,
    #[arg(long, value_enum, default_value = "packed")]
    pub placement: PlacementArg,
}

#[derive(Args, Clone, Debug)]
pub struct EngineArgs {
    /// Engine address (port 0 picks a free one).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub engine_listen: SocketAddr,
    /// Message channels and payload files (a tmpfs). Default: /dev/shm/staccato-<port>.
    #[arg(long)]
    pub ipc_dir: Option<PathBuf>,
    /// The repository's runtimes/ directory (found next to the binary by default).
    #[arg(long, env = "STACCATO_RUNTIMES")]
    pub runtimes_dir: Option<PathBuf>,
    /// Engine I/O threads (default: one per CPU, at most 8).
    #[arg(long)]
    pub io_threads: Option<usize>,
    /// Microseconds a worker polls (yielding) for its next message before
    /// sleeping. Keeps vCPUs from halting between the hops of a call; see
    /// BENCHMARKS.md for the measurements behind the default.
    #[arg(long, default_value_t = 30)]
    pub worker_spin_us: u32,
    /// Microseconds an engine I/O thread polls (yielding) after activity
    /// before sleeping.
    #[arg(long, default_value_t = 30)]
    pub engine_spin_us: u32,
    /// EMA coefficient for the concurrency hint (Nightcore: 1e-3).
    #[arg(long, default_value_t = 1e-3)]
    pub ema_alpha: f64,
    /// Python interpreter for Python functions.
    #[arg(long, default_value = "python3")]
    pub python: String,
}

#[derive(Args, Clone, Debug)]
pub struct GatewayArgs {
    /// Gateway address. Anything but loopback requires --token.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// Gateway HTTP threads (default: one per CPU, at most 8).
    #[arg(long)]
    pub gateway_threads: Option<usize>,
    /// Management API token (required to listen beyond loopback).
    #[arg(long, env = "STACCATO_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
}

#[derive(Args, Clone, Debug)]
pub struct UpArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    #[command(flatten)]
    pub engine: EngineArgs,
    #[command(flatten)]
    pub gateway: GatewayArgs,
    /// Run in the background; logs go to <state-dir>/staccato.log.
    #[arg(long)]
    pub detach: bool,
}

/// `staccato engine`: an engine alone, for a gateway on another machine.
#[derive(Args, Clone, Debug)]
pub struct EngineCmd {
    #[command(flatten)]
    pub common: CommonArgs,
    #[command(flatten)]
    pub engine: EngineArgs,
}

/// `staccato gateway`: a gateway alone, in front of an engine elsewhere.
#[derive(Args, Clone, Debug)]
pub struct GatewayCmd {
    #[command(flatten)]
    pub common: CommonArgs,
    #[command(flatten)]
    pub gateway: GatewayArgs,
    /// The engine to send calls to.
    #[arg(long)]
    pub engine: SocketAddr,
}

pub fn state_dir(arg: Option<PathBuf>) -> PathBuf {
    arg.unwrap_or_else(|| {
        let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/tmp"), PathBuf::from);
        home.join(".local/state/staccato")
    })
}

/// The repository's runtimes/ directory: next to the binary
/// (target/release/staccato → ../../runtimes), or the working directory's.
fn find_runtimes(arg: Option<PathBuf>) -> Result<PathBuf> {
    if let Some(p) = arg {
        return Ok(p);
    }
    let mut candidates = Vec::new();
    if let Ok(exe) = std::env::current_exe() {
        for anc in exe.ancestors().skip(1).take(4) {
            candidates.push(anc.join("runtimes"));
        }
    }
    candidates.push(PathBuf::from("runtimes"));
    candidates
        .into_iter()
        .find(|p| p.join("python/staccato").is_dir())
        .map(|p| p.canonicalize().unwrap_or(p))
        .ok_or_else(|| anyhow!("cannot find the runtimes/ directory; pass --runtimes-dir"))
}

pub fn up(args: UpArgs) -> Result<()> {
    let state = state_dir(args.common.state_dir.clone());
    std::fs::create_dir_all(&state).with_context(|| format!("creating {}", state.display()))?;
    if args.detach {
        return detach(&args, &state);
    }
    init_logging();
    let default_ipc = format!("/dev/shm/staccato-{}", args.gateway.listen.port());
    let (engine, ipc_dir) = start_engine(&args.common, &args.engine, &state, &default_ipc)?;
    let gw = start_gateway(&args.common, &args.gateway, engine, &state)?;
    std::fs::write(state.join("staccato.pid"), std::process::id().to_string())?;
    println!(
        "Staccato is up: gateway http://{} (engine {}, IPC {}, state {})",
        gw.addr,
        engine,
        ipc_dir.display(),
        state.display()
    );
    park()
}

pub fn engine_only(args: EngineCmd) -> Result<()> {
    let state = state_dir(args.common.state_dir.clone());
    init_logging();
    let default_ipc = format!("/dev/shm/staccato-engine-{}", args.engine.engine_listen.port());
    let (addr, ipc_dir) = start_engine(&args.common, &args.engine, &state, &default_ipc)?;
    println!("Staccato engine is up on {addr} (IPC {}, state {})", ipc_dir.display(), state.display());
    park()
}

pub fn gateway_only(args: GatewayCmd) -> Result<()> {
    let state = state_dir(args.common.state_dir.clone());
    init_logging();
    let gw = start_gateway(&args.common, &args.gateway, args.engine, &state)?;
    println!("Staccato gateway is up: http://{} (engine {})", gw.addr, args.engine);
    park()
}

fn park() -> ! {
    std::io::Write::flush(&mut std::io::stdout()).ok();
    loop {
        std::thread::park();
    }
}

/// Payloads travel in gateway–engine frames, whose bodies are bounded.
fn check_payload_max(c: &CommonArgs) -> Result<()> {
    let limit = wire::frame::FRAME_BODY_LEN_MAX - (64 << 10);
    if c.payload_max == 0 || c.payload_max > limit {
        bail!("--payload-max must be between 1 and {limit} bytes, got {}", c.payload_max);
    }
    Ok(())
}

fn start_engine(c: &CommonArgs, e: &EngineArgs, state: &Path, default_ipc: &str) -> Result<(SocketAddr, PathBuf)> {
    check_payload_max(c)?;
    let runtimes = find_runtimes(e.runtimes_dir.clone())?;
    let ipc_dir = e.ipc_dir.clone().unwrap_or_else(|| PathBuf::from(default_ipc));
    // Leftovers of an earlier run (FIFOs, payload files) mean nothing now.
    let _ = std::fs::remove_dir_all(&ipc_dir);
    let mut cfg = engine::EngineConfig::new(e.engine_listen, ipc_dir.clone(), state.join("engine"), runtimes);
    if let Some(n) = e.io_threads {
        cfg.io_threads = n.max(1);
    }
    cfg.placement = match c.placement {
        PlacementArg::Packed => engine::Placement::Packed,
        PlacementArg::Kernel => engine::Placement::Kernel,
    };
    cfg.worker_spin_us = e.worker_spin_us;
    cfg.engine_spin_us = e.engine_spin_us;
    cfg.ema_alpha = e.ema_alpha;
    cfg.payload_len_max = c.payload_max;
    cfg.python = e.python.clone();
    let engine = engine::start(cfg).context("starting the engine")?;
    Ok((engine.addr, ipc_dir))
}

fn start_gateway(c: &CommonArgs, g: &GatewayArgs, engine: SocketAddr, state: &Path) -> Result<gateway::Gateway> {
    check_payload_max(c)?;
    let cfg = gateway::GatewayConfig {
        listen: g.listen,
        engine,
        threads: g.gateway_threads.unwrap_or_else(|| ipc::cpus_allowed().len().clamp(1, 8)),
        token: g.token.clone().filter(|t| !t.is_empty()),
        state_dir: state.to_path_buf(),
        payload_len_max: c.payload_max,
        pin_threads: matches!(c.placement, PlacementArg::Packed),
    };
    gateway::start(cfg).context("starting the gateway")
}

fn detach(args: &UpArgs, state: &Path) -> Result<()> {
    let exe = std::env::current_exe()?;
    let log_path = state.join("staccato.log");
    let log = std::fs::OpenOptions::new().create(true).append(true).open(&log_path)?;
    let argv: Vec<String> = std::env::args().skip(1).filter(|a| a != "--detach").collect();
    let mut cmd = Command::new(exe);
    cmd.args(&argv).env("STACCATO_STATE_DIR", state).stdin(Stdio::null()).stdout(log.try_clone()?).stderr(log);
    {
        use std::os::unix::process::CommandExt;
        cmd.process_group(0);
    }
    let mut child = cmd.spawn().context("starting staccato in the background")?;
    let deadline = Instant::now() + Duration::from_secs(15);
    let url = format!("http://{}", args.gateway.listen);
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait()? {
            bail!("staccato exited during start-up ({status}); see {}", log_path.display());
        }
        if let Ok(mut c) = crate::client::Client::new(&url, None) {
            if c.request("GET", "/healthz", b"").is_ok_and(|r| r.status == 200) {
                println!(
                    "Staccato is up in the background (pid {}): gateway {url}, log {}",
                    child.id(),
                    log_path.display()
                );
                return Ok(());
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!("staccato did not become healthy within 15 s; see {}", log_path.display())
}

pub fn down(state: Option<PathBuf>) -> Result<()> {
    let state = state_dir(state);
    let pid_path = state.join("staccato.pid");
    let pid: u32 = std::fs::read_to_string(&pid_path)
        .with_context(|| format!("no running staccato recorded in {}", pid_path.display()))?
        .trim()
        .parse()
        .context("corrupt pid file")?;
    if ipc::kill(pid).is_err() {
        println!("staccato (pid {pid}) was not running");
    } else {
        println!("Stopped staccato (pid {pid})");
    }
    let _ = std::fs::remove_file(pid_path);
    Ok(())
}

struct StderrLogger {
    level: log::LevelFilter,
}

impl log::Log for StderrLogger {
    fn enabled(&self, m: &log::Metadata) -> bool {
        m.level() <= self.level
    }
    fn log(&self, r: &log::Record) {
        if self.enabled(r.metadata()) {
            let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
            // One write per line: stderr is unbuffered, and eprintln! of a
            // formatted line becomes a write per piece (engine threads log).
            let line = format!("{}.{:03} {:<5} {}\n", t.as_secs(), t.subsec_millis(), r.level(), r.args());
            let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
        }
    }
    fn flush(&self) {}
}

pub fn init_logging() {
    let level = match std::env::var("STACCATO_LOG").as_deref() {
        Ok("debug") => log::LevelFilter::Debug,
        Ok("warn") => log::LevelFilter::Warn,
        Ok("error") => log::LevelFilter::Error,
        _ => log::LevelFilter::Info,
    };
    if log::set_boxed_logger(Box::new(StderrLogger { level })).is_ok() {
        log::set_max_level(level);
    }
}
