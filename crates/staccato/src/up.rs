//! `staccato up` / `staccato down`: the embedded single-machine setup, a
//! gateway and an engine in one process, joined over loopback TCP exactly as
//! they would be across machines.

use anyhow::{anyhow, bail, Context, Result};
use api::units::UnitError;
use clap::{Args, ValueEnum};
use client::Requester;
use engine::config::{ContainerConfig, Unavailable};
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum IsolationArg {
    /// Containers when this machine can make them (root, runc, cgroup v1 or v2),
    /// else processes, with a line saying why.
    Auto,
    /// runc containers from the isolation pool; fail if impossible.
    Container,
    /// Plain processes (development; no isolation between functions).
    Process,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum NetworkArg {
    /// Share the host's network namespace: no network isolation at all
    /// (functions can reach every loopback service, the gateway's
    /// management API included).
    Host,
    /// A network namespace per container, joined to the host by veth + NAT;
    /// host services on 127.0.0.1 are reachable at $STACCATO_HOST_IP.
    Isolated,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum FrontDoorArg {
    /// The engine's I/O threads accept client connections and answer
    /// external calls themselves; the rest goes to the gateway.
    Engine,
    /// Every request goes through the gateway, then to the engine.
    Gateway,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum PlacementArg {
    /// I/O thread i, its workers and gateway thread i share CPU i.
    Packed,
    /// Let the kernel place every thread.
    Kernel,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ConcurrencyArg {
    /// τ = λ·t per function, from its measured rate and processing time
    /// (Nightcore §3.3).
    Managed,
    /// Every function runs as many calls at once as it has, up to its
    /// max_workers (managed concurrency off; for comparisons).
    Fixed,
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
    /// BENCHMARKS.md for the measurements behind the default. C and C++
    /// workers do not spin on one vCPU, nor under packed placement when
    /// their function may have a worker on every vCPU: the engine thread
    /// that feeds them then shares their vCPU.
    #[arg(long, default_value_t = 30)]
    pub worker_spin_us: u32,
    /// Microseconds an engine I/O thread polls (yielding) after activity
    /// before sleeping; not after answering a caller on its own vCPU
    /// (packed placement on two or more vCPUs).
    #[arg(long, default_value_t = 30)]
    pub engine_spin_us: u32,
    /// Milliseconds after the last event during which an idle-priority
    /// thread per CPU keeps the vCPUs from halting: calls skip a halted
    /// vCPU's wake-up (tens of µs per hop in a VM), and the host sees
    /// those vCPUs busy for the whole window. 0 (the default): off. Give
    /// a window longer than the gaps between your calls (BENCHMARKS.md).
    #[arg(long, default_value_t = 0)]
    pub keep_awake_ms: u32,
    /// EMA coefficient for the concurrency hint (Nightcore: 1e-3).
    #[arg(long, default_value_t = 1e-3)]
    pub ema_alpha: f64,
    /// How many calls of a function run at once.
    #[arg(long, value_enum, default_value = "managed")]
    pub concurrency: ConcurrencyArg,
    /// Send every internal call as an HTTP request to this gateway
    /// (http://HOST:PORT), as gateway-routed FaaS systems do, instead of
    /// serving it on this engine. For measuring the local fast path: such
    /// calls lose their chain's depth limit and trace links.
    #[arg(long, value_name = "URL")]
    pub internal_calls_via: Option<String>,
    /// Export a span of every traced call to this OpenTelemetry collector
    /// (OTLP/HTTP with JSON: http://HOST:4318, or a full URL ending in
    /// /v1/traces). A call is traced when its caller's W3C traceparent is
    /// sampled, or, without one, with probability --trace-sample; its
    /// internal calls are traced with it.
    #[arg(long, value_name = "URL", value_parser = otlp_url)]
    pub otlp_endpoint: Option<String>,
    /// The share of calls without a traceparent that start a trace (0-1).
    #[arg(long, default_value_t = engine::config::TRACE_SAMPLE_DEFAULT, value_parser = share)]
    pub trace_sample: f64,
    /// Have C, C++ and Python functions measure each call's CPU time (the
    /// handler's thread; Python: plain def handlers) for `staccato trace`
    /// and `bench run`'s server profile. Costs two clock reads a call.
    #[arg(long)]
    pub cpu_per_call: bool,
    /// Python interpreter for Python functions.
    #[arg(long, default_value = "python3")]
    pub python: String,
    /// How functions are isolated from each other and from the host.
    #[arg(long, value_enum, default_value = "auto")]
    pub isolation: IsolationArg,
    /// Containers the isolation pool keeps ready.
    #[arg(long, default_value_t = 4)]
    pub pool_size: usize,
    /// Function containers' network.
    #[arg(long, value_enum, default_value = "isolated")]
    pub network: NetworkArg,
    /// With --network isolated: host loopback ports functions reach at
    /// $STACCATO_HOST_IP (Redis, PostgreSQL, memcached by default), or `all`.
    #[arg(long, default_value = "6379,5432,11211")]
    pub host_ports: String,
    /// Never pause idle containers.
    #[arg(long)]
    pub no_pause: bool,
    /// Bounds on the pause delay computed from Nuka's rule: milliseconds,
    /// or a duration like 250ms or 2s.
    #[arg(long, default_value = "100", value_parser = ms_flag)]
    pub pause_min_ms: Duration,
    #[arg(long, default_value = "10000", value_parser = ms_flag)]
    pub pause_max_ms: Duration,
    /// How long a paused container is kept before it is destroyed: seconds,
    /// or a duration like 10m.
    #[arg(long, default_value = "300", value_parser = secs_flag)]
    pub keep_alive_s: Duration,
    /// runc binary.
    #[arg(long, default_value = "runc")]
    pub runc: String,
    /// The longest chain of nested internal calls; deeper ones fail at once
    /// with call_depth_exceeded.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub max_call_depth: u32,
    /// Memory of each deploy-time build step (pip, npm, go build, cc) in its
    /// sandbox, e.g. 2Gi; its /tmp and output count against it.
    #[arg(long, default_value = "2Gi")]
    pub build_memory: String,
    /// How long a deploy's build steps may run, together, before they are
    /// killed: seconds, or a duration like 10m (at most 24h).
    #[arg(long, default_value = "600", value_parser = secs_flag)]
    pub build_timeout_s: Duration,
    /// A host a build may reach besides the package indexes (pypi.org,
    /// files.pythonhosted.org, registry.npmjs.org, proxy.golang.org,
    /// sum.golang.org and those PIP_INDEX_URL, GOPROXY etc. name); repeat
    /// it, or use `*.example.org`.
    #[arg(long = "build-allow-host", value_name = "HOST")]
    pub build_allow_hosts: Vec<String>,
    /// Size of a function's log (<state-dir>/engine/logs/NAME.log) before it
    /// is rotated to NAME.log.1, e.g. 10Mi; one older file is kept.
    #[arg(long, default_value = "10Mi")]
    pub log_max_size: String,
    /// Output a function may log per second, e.g. 1Mi; beyond it output is
    /// dropped and a line in the log says how much.
    #[arg(long, default_value = "1Mi")]
    pub log_rate: String,
}

/// The secret of the gateway–engine link (`staccato engine` / `gateway`;
/// `up` makes a fresh one for its own pair).
#[derive(Args, Clone, Debug)]
pub struct EngineTokenArgs {
    /// Secret every gateway–engine connection proves it knows. Default: the
    /// file --engine-token-file names.
    #[arg(long, env = "STACCATO_ENGINE_TOKEN", hide_env_values = true)]
    pub engine_token: Option<String>,
    /// File holding the engine secret. Default: <state-dir>/engine-token
    /// (an engine on loopback creates it, readable by its user only).
    #[arg(long)]
    pub engine_token_file: Option<PathBuf>,
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
    /// Client connections open at once; beyond it calls get 503 and a few
    /// more connections are kept for management requests.
    #[arg(long, default_value_t = 10_000)]
    pub max_connections: usize,
    /// How long a connection may go without sending a complete request head
    /// (idle between requests, or sending its headers slowly) before it is
    /// closed: seconds, or a duration like 500ms (at most 1h).
    #[arg(long, default_value = "30", value_parser = secs_flag)]
    pub idle_timeout_s: Duration,
    /// Where function metadata and sources are kept: in the state directory
    /// (default, one gateway), or etcd://HOST:PORT[,HOST:PORT...][/PREFIX],
    /// shared by every gateway given the same URL.
    #[arg(long, value_name = "URL")]
    pub store: Option<String>,
    /// The key that seals secrets in the store (64 hex characters; made if
    /// the file does not exist). Default: <state-dir>/secrets.key. Every
    /// gateway sharing a store needs the same one.
    #[arg(long, value_name = "FILE")]
    pub secrets_key_file: Option<PathBuf>,
    /// Asynchronous calls running at once, all functions together (each
    /// function also at most its async.concurrency).
    #[arg(long, default_value_t = 64)]
    pub async_concurrency: usize,
    /// Asynchronous calls accepted and not finished, at most; more get 429.
    #[arg(long, default_value_t = 100_000)]
    pub async_queue_max: usize,
    /// How long the result of an asynchronous call that succeeded is kept:
    /// a duration like 30m or 24h (dead letters are kept 7 days).
    #[arg(long, default_value = "24h", value_parser = secs_flag)]
    pub async_retention: Duration,
    /// Take gRPC calls (HTTP/2 without TLS) on this address too: methods map
    /// to functions by `grpc:` in their manifests (calls only: management
    /// stays on --listen).
    #[arg(long, value_name = "ADDRESS:PORT")]
    pub grpc_listen: Option<SocketAddr>,
    /// How long a stop (SIGTERM) waits for the asynchronous calls running
    /// to end before it stops anyway (those then run again at the next
    /// start): a duration like 30s.
    #[arg(long, default_value = "30s", value_parser = secs_flag)]
    pub async_drain: Duration,
    /// A network callbacks (X-Callback-Url) may go to besides public
    /// addresses, like 10.0.0.0/8 or 127.0.0.1/32; repeat for more.
    #[arg(long, value_name = "CIDR")]
    pub callback_allow: Vec<gateway::Cidr>,
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
    /// Who parses external calls (`POST /function/NAME`): the engine, one
    /// hop fewer (management, metrics and anything unusual still reach
    /// the gateway on the same port); or the gateway, as with engines on
    /// other servers.
    #[arg(long, value_enum, default_value = "engine")]
    pub front_door: FrontDoorArg,
}

/// `staccato engine`: an engine alone, for gateways on other machines.
#[derive(Args, Clone, Debug)]
pub struct EngineCmd {
    #[command(flatten)]
    pub common: CommonArgs,
    #[command(flatten)]
    pub engine: EngineArgs,
    #[command(flatten)]
    pub secret: EngineTokenArgs,
    /// A gateway to join (http://HOST:PORT), with the management token
    /// (--token or STACCATO_TOKEN); repeat it for several gateways. The
    /// engine tells each where to reach it, every second, while it runs.
    #[arg(long, value_name = "URL")]
    pub join: Vec<String>,
    /// Join every gateway that HOST resolves to (http://HOST:PORT), looking
    /// it up again every second: gateways that appear are joined, those
    /// that go are let go. On Kubernetes, HOST is the gateways' headless
    /// Service (clusterIP: None), which has one address per ready gateway
    /// pod. Takes the management token like --join; repeatable.
    #[arg(long, value_name = "URL")]
    pub join_every: Vec<String>,
    /// The address gateways reach this engine at (default: --engine-listen,
    /// which must then be a specific address).
    #[arg(long)]
    pub advertise: Option<SocketAddr>,
    /// This engine's name in the gateways' tables (default: its advertised
    /// address).
    #[arg(long)]
    pub engine_id: Option<String>,
    /// A label functions may ask for in their placement (KEY=VALUE, e.g.
    /// zone=a or gpu=); repeat it for several.
    #[arg(long = "label", value_name = "KEY=VALUE", value_parser = parse_label)]
    pub labels: Vec<(String, String)>,
}

fn parse_label(s: &str) -> Result<(String, String), String> {
    api::cluster::parse_label(s)
}

/// `staccato gateway`: a gateway alone, in front of engines elsewhere.
#[derive(Args, Clone, Debug)]
pub struct GatewayCmd {
    #[command(flatten)]
    pub common: CommonArgs,
    #[command(flatten)]
    pub gateway: GatewayArgs,
    /// An engine to send calls to; repeat it for several. Engines may also
    /// join at run time (`staccato engine --join`).
    #[arg(long)]
    pub engine: Vec<SocketAddr>,
    #[command(flatten)]
    pub secret: EngineTokenArgs,
}

pub fn state_dir(arg: Option<PathBuf>) -> PathBuf {
    arg.unwrap_or_else(|| {
        let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/tmp"), PathBuf::from);
        home.join(".local/state/staccato")
    })
}

pub fn up(args: UpArgs) -> Result<()> {
    let state = state_dir(args.common.state_dir.clone());
    std::fs::create_dir_all(&state).with_context(|| format!("creating {}", state.display()))?;
    let default_ipc = format!("/dev/shm/staccato-{}", args.gateway.listen.port());
    let ipc_dir = args.engine.ipc_dir.clone().unwrap_or_else(|| PathBuf::from(&default_ipc));
    if args.detach {
        // Refuse here, in the foreground, rather than in the child's log.
        drop(lock_dirs(&state, &ipc_dir)?);
        return detach(&args, &state);
    }
    // Before anything is touched: another instance may own these.
    let _locks = lock_dirs(&state, &ipc_dir)?;
    init_logging();
    sys::process::block_termination_signals();
    let secret = api::auth::Secret::random().map_err(|e| anyhow!("{e}"))?;
    let (engine, ipc_dir) = start_engine(&args.common, &args.engine, &state, &default_ipc, secret.clone())?;
    let front = args.front_door == FrontDoorArg::Engine;
    let gw = Arc::new(start_gateway(&args.common, &args.gateway, vec![engine.addr], &state, secret, front)?);
    if front {
        let listeners = gw.take_listeners();
        engine.serve_front(Arc::new(FrontDoor(gw.clone())), listeners).context("the engine's front door")?;
    }
    std::fs::write(state.join("staccato.pid"), std::process::id().to_string())?;
    println!(
        "Staccato is up: gateway http://{} (engine {}, IPC {}, state {})",
        gw.addr,
        engine.addr,
        ipc_dir.display(),
        state.display()
    );
    wait_and_stop(&engine, &gw)
}

pub fn engine_only(args: EngineCmd, token: Option<String>) -> Result<()> {
    let state = state_dir(args.common.state_dir.clone());
    if let Some(id) = args.engine_id.as_deref().filter(|id| !api::cluster::valid_engine_id(id)) {
        bail!("--engine-id {id:?}: use 1-64 of A-Z a-z 0-9 . _ : -");
    }
    let joins = args
        .join
        .iter()
        .map(|url| client::Gateway::new(url, token.clone(), Some(Duration::from_secs(2))).map(|g| (url.clone(), g)))
        .collect::<std::io::Result<Vec<_>>>()
        .context("--join")?;
    let services = args
        .join_every
        .iter()
        .map(|url| service_of(url).map(|(host, port)| (url.clone(), host, port)))
        .collect::<Result<Vec<_>>>()?;
    let joining = !joins.is_empty() || !services.is_empty();
    if args.advertise.is_none() && joining && args.engine.engine_listen.ip().is_unspecified() {
        bail!(
            "--engine-listen {} is no address a gateway can dial: give --advertise ADDRESS:PORT",
            args.engine.engine_listen
        );
    }
    std::fs::create_dir_all(&state).with_context(|| format!("creating {}", state.display()))?;
    let default_ipc = format!("/dev/shm/staccato-engine-{}", args.engine.engine_listen.port());
    let ipc_dir = args.engine.ipc_dir.clone().unwrap_or_else(|| PathBuf::from(&default_ipc));
    let _locks = lock_dirs(&state, &ipc_dir)?;
    init_logging();
    sys::process::block_termination_signals();
    let loopback = args.engine.engine_listen.ip().is_loopback();
    let (secret, from) = engine_secret(&args.secret, &state, loopback)?;
    let (engine, ipc_dir) = start_engine(&args.common, &args.engine, &state, &default_ipc, secret)?;
    println!(
        "Staccato engine is up on {} (IPC {}, state {}; gateways need the engine token {from})",
        engine.addr,
        ipc_dir.display(),
        state.display()
    );
    let address = args.advertise.unwrap_or(engine.addr);
    let join = api::cluster::Join {
        id: args.engine_id.clone().unwrap_or_else(|| address.to_string()),
        address,
        labels: args.labels.iter().cloned().collect(),
    };
    let mut leave = joins.iter().map(|(url, _)| url.clone()).collect::<Vec<_>>();
    // A thread per gateway: one that is down must not delay the others'
    // renewals past their lease.
    for (url, gw) in joins {
        let j = join.clone();
        let forever = Arc::new(AtomicBool::new(false));
        std::thread::Builder::new().name("engine-join".into()).spawn(move || join_loop(&url, gw, &j, &forever))?;
    }
    // The gateways each --join-every name gives now, by name.
    let resolved = Arc::new(Mutex::new(BTreeMap::new()));
    for (url, host, port) in services {
        let (j, t, r) = (join.clone(), token.clone(), resolved.clone());
        std::thread::Builder::new()
            .name("engine-join-every".into())
            .spawn(move || join_every(&url, (&host, port), t, &j, &r))?;
    }
    std::io::Write::flush(&mut std::io::stdout()).ok();
    let sig = sys::process::wait_termination();
    log::info!("signal {sig}: stopping");
    // No renewal may land after the leave below (it would put the engine
    // back for a lease while it stops): wait out those under way.
    *JOINING_STOPPED.write().unwrap_or_else(|p| p.into_inner()) = true;
    let by_name = resolved.lock().unwrap_or_else(|p| p.into_inner()).clone();
    leave.extend(by_name.into_values().flatten());
    // Leave first, so no gateway sends another call.
    for url in leave {
        let gone = client::Gateway::new(&url, token.clone(), Some(Duration::from_secs(1)))
            .and_then(|mut g| g.request("DELETE", &format!("/system/engines/{}", join.id), b""));
        if let Err(e) = gone {
            log::warn!("leaving {url}: {e}");
        }
    }
    engine.shutdown();
    std::process::exit(0)
}

/// Set once the engine is stopping: no join thread renews after it.
static JOINING_STOPPED: std::sync::RwLock<bool> = std::sync::RwLock::new(false);

/// `http://HOST:PORT` of `--join-every`, checked but not resolved: the
/// name may have no address yet (no gateway is ready).
fn service_of(url: &str) -> Result<(String, u16)> {
    let bad = || anyhow::anyhow!("--join-every {url:?}: give http://HOST:PORT (a name that resolves to every gateway)");
    let hostport = url.strip_prefix("http://").ok_or_else(bad)?.trim_end_matches('/');
    let (host, port) = hostport.rsplit_once(':').ok_or_else(bad)?;
    let port: u16 = port.parse().ok().filter(|&p| p != 0).ok_or_else(bad)?;
    // A DNS name or an IPv4 address: letters, digits, '-' and '.'.
    if host.is_empty() || host.len() > 253 || !host.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
    {
        return Err(bad());
    }
    Ok((host.to_string(), port))
}

/// Joins every address `host` resolves to, resolving it again every
/// `RENEW_MS`: a `join_loop` thread per address while the name has it.
/// A lookup that fails keeps the gateways of the last one that worked (a
/// DNS hiccup must not make the engine leave them all). `resolved` holds
/// the gateways joined now, for the engine to leave when it stops.
fn join_every(
    url: &str,
    (host, port): (&str, u16),
    token: Option<String>,
    join: &api::cluster::Join,
    resolved: &Mutex<BTreeMap<String, BTreeSet<String>>>,
) {
    use std::net::ToSocketAddrs;
    let mut joined: BTreeMap<SocketAddr, Arc<AtomicBool>> = BTreeMap::new();
    let mut last_error = String::new();
    while !*JOINING_STOPPED.read().unwrap_or_else(|p| p.into_inner()) {
        match (host, port).to_socket_addrs() {
            Ok(addrs) => {
                last_error.clear();
                let now: BTreeSet<SocketAddr> = addrs.collect();
                joined.retain(|addr, stop| {
                    let keep = now.contains(addr);
                    if !keep {
                        log::info!("gateway {addr} is no longer behind {url}: not joining it any more");
                        stop.store(true, Ordering::Release);
                    }
                    keep
                });
                for addr in now {
                    if joined.contains_key(&addr) {
                        continue;
                    }
                    let gw_url = format!("http://{addr}");
                    let gw = match client::Gateway::new(&gw_url, token.clone(), Some(Duration::from_secs(2))) {
                        Ok(gw) => gw,
                        Err(e) => {
                            log::warn!("gateway {addr} behind {url}: {e}");
                            continue;
                        }
                    };
                    log::info!("gateway {addr} is behind {url}: joining it");
                    let stop = Arc::new(AtomicBool::new(false));
                    let (j, s) = (join.clone(), stop.clone());
                    let spawned = std::thread::Builder::new()
                        .name("engine-join".into())
                        .spawn(move || join_loop(&gw_url, gw, &j, &s));
                    match spawned {
                        Ok(_) => {
                            joined.insert(addr, stop);
                        }
                        Err(e) => log::error!("joining gateway {addr}: starting a thread: {e}"),
                    }
                }
                resolved
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(url.to_string(), joined.keys().map(|a| format!("http://{a}")).collect());
            }
            Err(e) => {
                let e = e.to_string();
                if e != last_error {
                    log::warn!("looking up the gateways behind {url}: {e} (keeping the {} joined)", joined.len());
                    last_error = e;
                }
            }
        }
        std::thread::sleep(Duration::from_millis(api::cluster::RENEW_MS));
    }
}

/// Tells a gateway where this engine is, every `RENEW_MS`, until `stop`;
/// says so when the gateway stops or starts answering.
fn join_loop(url: &str, mut gw: client::Gateway, join: &api::cluster::Join, stop: &AtomicBool) {
    let body = serde_json::to_vec(join).expect("a Join serializes");
    let mut last = "never tried".to_string();
    while !stop.load(Ordering::Acquire) {
        // Held across the renewal: the engine leaves only after it.
        let stopped = JOINING_STOPPED.read().unwrap_or_else(|p| p.into_inner());
        if *stopped {
            return;
        }
        let r = gw.request_with_headers("POST", "/system/engines", &body, &[("content-type", "application/json")]);
        drop(stopped);
        let error = match r {
            Ok(r) if r.status == 200 => String::new(),
            Ok(r) => format!("HTTP {}: {}", r.status, String::from_utf8_lossy(&r.body).trim()),
            Err(e) => e.to_string(),
        };
        if error != last {
            if error.is_empty() {
                log::info!("joined gateway {url} as {} ({})", join.id, join.address);
            } else {
                log::warn!("joining gateway {url}: {error} (retrying every second)");
            }
            last = error;
        }
        std::thread::sleep(Duration::from_millis(api::cluster::RENEW_MS));
    }
}

/// Runs until SIGTERM/SIGINT, then lets the asynchronous calls under way
/// end and removes the engine's containers.
fn wait_and_stop(engine: &engine::Engine, gw: &gateway::Gateway) -> Result<()> {
    std::io::Write::flush(&mut std::io::stdout()).ok();
    let sig = sys::process::wait_termination();
    log::info!("signal {sig}: stopping");
    gw.stop_async();
    engine.shutdown();
    std::process::exit(0)
}

pub fn gateway_only(args: GatewayCmd) -> Result<()> {
    let state = state_dir(args.common.state_dir.clone());
    std::fs::create_dir_all(&state).with_context(|| format!("creating {}", state.display()))?;
    let _lock = lock_file(&state.join("gateway.lock"), &state)?;
    init_logging();
    sys::process::block_termination_signals();
    let (secret, _) = engine_secret(&args.secret, &state, false).context(
        "the gateway needs the engine's token (--engine-token, STACCATO_ENGINE_TOKEN or --engine-token-file)",
    )?;
    let gw = start_gateway(&args.common, &args.gateway, args.engine.clone(), &state, secret, false)?;
    let engines: Vec<String> = args.engine.iter().map(ToString::to_string).collect();
    let engines = if engines.is_empty() { "none yet: engines join with --join".into() } else { engines.join(", ") };
    println!("Staccato gateway is up: http://{} (engines: {engines})", gw.addr);
    std::io::Write::flush(&mut std::io::stdout()).ok();
    let sig = sys::process::wait_termination();
    log::info!("signal {sig}: stopping");
    gw.stop_async();
    std::process::exit(0)
}

/// Payloads travel in gateway–engine frames, whose bodies are bounded.
fn check_payload_max(c: &CommonArgs) -> Result<()> {
    let limit = (64 << 20) - (64 << 10);
    const { assert!((64 << 20) <= wire::frame::FRAME_BODY_LEN_MAX) };
    if c.payload_max == 0 || c.payload_max > limit {
        bail!("--payload-max must be between 1 and {limit} bytes, got {}", c.payload_max);
    }
    Ok(())
}

fn start_engine(
    c: &CommonArgs,
    e: &EngineArgs,
    state: &Path,
    default_ipc: &str,
    secret: api::auth::Secret,
) -> Result<(engine::Engine, PathBuf)> {
    check_payload_max(c)?;
    let runtimes = engine::config::find_runtimes(e.runtimes_dir.clone()).map_err(|e| anyhow!(e))?;
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
    if e.keep_awake_ms > 60_000 {
        bail!("--keep-awake-ms must be at most 60000, got {}", e.keep_awake_ms);
    }
    cfg.keep_awake_ms = e.keep_awake_ms;
    cfg.ema_alpha = e.ema_alpha;
    cfg.payload_len_max = c.payload_max;
    cfg.python = e.python.clone();
    cfg.cache_dir = state.join("cache");
    cfg.secret = secret;
    cfg.max_call_depth = e.max_call_depth;
    cfg.concurrency = match e.concurrency {
        ConcurrencyArg::Managed => engine::Concurrency::Managed,
        ConcurrencyArg::Fixed => engine::Concurrency::Fixed,
    };
    if let Some(url) = &e.internal_calls_via {
        let base = url.strip_prefix("http://").unwrap_or("");
        if base.is_empty() || base.trim_end_matches('/').contains('/') {
            bail!("--internal-calls-via must be a gateway's http://HOST:PORT, got {url:?}");
        }
        log::warn!(
            "every internal call goes through the gateway at {url} (--internal-calls-via), not the local fast path"
        );
        cfg.internal_calls_via = Some(url.clone());
    }
    cfg.trace_sample = e.trace_sample;
    cfg.cpu_per_call = e.cpu_per_call;
    cfg.otlp_endpoint = e.otlp_endpoint.clone();
    let size = |flag: &str, v: &str| api::units::parse_size(v).map_err(|err| anyhow::anyhow!("{flag} {v:?}: {err}"));
    cfg.log_caps = sandbox::logs::Caps {
        file_bytes: size("--log-max-size", &e.log_max_size)?,
        rate_bytes: size("--log-rate", &e.log_rate)?,
    };
    cfg.log_caps.check().map_err(|err| anyhow::anyhow!("--log-max-size/--log-rate: {err}"))?;
    cfg.containers = container_config(e, state, &cfg.runtimes_dir)?;
    if let Some(cc) = &mut cfg.containers {
        cc.pause = !e.no_pause;
        cc.pause_min = e.pause_min_ms;
        cc.pause_max = e.pause_max_ms.max(e.pause_min_ms);
        cc.keep_alive = e.keep_alive_s;
    }
    match &cfg.containers {
        Some(cc) => log::info!(
            "isolation: runc containers (pool {}, network {})",
            cc.sandbox.pool_size,
            cc.sandbox.network.name()
        ),
        None => log::info!("isolation: processes"),
    }
    let engine = engine::start(cfg).context("starting the engine")?;
    Ok((engine, ipc_dir))
}

/// The container settings, or None for process isolation.
fn container_config(e: &EngineArgs, state: &Path, runtimes: &Path) -> Result<Option<engine::ContainerConfig>> {
    let network = match e.network {
        NetworkArg::Host => sandbox::Network::Host,
        NetworkArg::Isolated => sandbox::Network::Isolated,
    };
    let mut cc = match e.isolation {
        IsolationArg::Process => None,
        IsolationArg::Auto | IsolationArg::Container => {
            let required = e.isolation == IsolationArg::Container;
            let found = ContainerConfig::detect(&e.runc, &e.python, network, e.pool_size, state, runtimes);
            match found {
                Ok(cc) => Some(cc),
                Err(Unavailable::Missing(why)) if !required => {
                    log::warn!("functions run as plain processes, without isolation: {why}");
                    None
                }
                Err(Unavailable::Missing(why)) => bail!("--isolation container: {why}"),
                Err(Unavailable::Failed(why)) => bail!("{why}"),
            }
        }
    };
    if let Some(cc) = &mut cc {
        let memory = api::units::parse_size(&e.build_memory)
            .map_err(|err| anyhow::anyhow!("--build-memory {:?}: {err}", e.build_memory))?;
        if memory < (64 << 20) {
            bail!("--build-memory {}: at least 64Mi", e.build_memory);
        }
        let mut build = engine::build::build_config(&e.build_allow_hosts).map_err(|err| anyhow::anyhow!(err))?;
        build.reads.push(cc.python_prefix.clone());
        build.memory_bytes = memory;
        build.tmp_bytes = memory;
        build.output_bytes = memory;
        if e.build_timeout_s.is_zero() || e.build_timeout_s > Duration::from_secs(86_400) {
            bail!("--build-timeout-s {:?}: between 1s and 24h", e.build_timeout_s);
        }
        build.timeout = e.build_timeout_s;
        cc.build = build;
        cc.sandbox.host_ports = match e.host_ports.trim() {
            "all" => None,
            "" => Some(Vec::new()),
            list => Some(
                list.split(',')
                    .map(|p| p.trim().parse::<u16>().with_context(|| format!("--host-ports: bad port {p:?}")))
                    .collect::<Result<_>>()?,
            ),
        };
    }
    Ok(cc)
}

fn start_gateway(
    c: &CommonArgs,
    g: &GatewayArgs,
    engines: Vec<SocketAddr>,
    state: &Path,
    engine_secret: api::auth::Secret,
    front_door_elsewhere: bool,
) -> Result<gateway::Gateway> {
    check_payload_max(c)?;
    let token = match g.token.clone().filter(|t| !t.is_empty()) {
        Some(t) => Some(t),
        // On loopback, a token of its own in a file only this user can read
        // (as Jupyter does): local web pages and other users are kept out,
        // and the CLI on this machine finds it by itself.
        None if g.listen.ip().is_loopback() => Some(ensure_token(state, "token")?),
        // Elsewhere the gateway refuses to start without one (below).
        None => None,
    };
    // Each connection is a file descriptor; keep room for the engine's own.
    let nofile = sys::process::raise_nofile_limit().unwrap_or(1024);
    let fd_room = (nofile as usize).saturating_sub(1024).max(64);
    if g.max_connections > fd_room {
        log::warn!(
            "--max-connections {} is more than the open-file limit allows ({nofile}); using {fd_room}",
            g.max_connections
        );
    }
    if g.idle_timeout_s.is_zero() || g.idle_timeout_s > Duration::from_secs(3600) {
        bail!("--idle-timeout-s must be between 0 and 3600 seconds, got {:?}", g.idle_timeout_s);
    }
    if g.gateway_threads.is_some_and(|n| n == 0 || n > 64) {
        // Call ids keep 6 bits for the thread and tell the engine's front
        // door's ids by bit 62 (docs/protocol.md, "Call ids").
        bail!("--gateway-threads must be between 1 and 64, got {}", g.gateway_threads.unwrap_or(0));
    }
    let cfg = gateway::GatewayConfig {
        connections_max: g.max_connections.clamp(1, fd_room),
        idle_timeout: g.idle_timeout_s,
        listen: g.listen,
        engines,
        threads: g.gateway_threads.unwrap_or_else(|| sys::cpu::cpus_allowed().len().clamp(1, 8)),
        token,
        engine_secret,
        state_dir: state.to_path_buf(),
        payload_len_max: c.payload_max,
        pin_threads: matches!(c.placement, PlacementArg::Packed),
        store_url: g.store.clone(),
        secrets_key_file: g.secrets_key_file.clone(),
        async_calls: gateway::AsyncConfig {
            concurrency: g.async_concurrency.max(1),
            queued_max: g.async_queue_max.max(1),
            retention: g.async_retention,
            drain: g.async_drain,
            callback_allow: g.callback_allow.clone(),
            ..gateway::AsyncConfig::default()
        },
        grpc_listen: g.grpc_listen,
        front_door_elsewhere,
    };
    gateway::start(cfg).context("starting the gateway")
}

/// The gateway, as the engine's front door sees it (`--front-door engine`).
struct FrontDoor(Arc<gateway::Gateway>);

impl engine::front::FrontDoor for FrontDoor {
    fn admit(&self) -> Option<Box<dyn Send>> {
        self.0.admit().map(|s| Box::new(s) as Box<dyn Send>)
    }
    fn hand_over(&self, thread: usize, stream: std::net::TcpStream, read: Vec<u8>) {
        self.0.adopt(thread, stream, read);
    }
    fn sole_engine(&self, f: &mut dyn FnMut(&str)) -> bool {
        self.0.sole_engine(f)
    }
    fn record(&self, thread: usize, function: &str, outcome: &'static str, latency_s: f64, t: wire::frame::Timing) {
        self.0.record(thread, function, outcome, latency_s, t);
    }
    fn loopback_only(&self) -> bool {
        self.0.loopback_only()
    }
    fn idle_timeout(&self) -> Duration {
        self.0.idle_timeout()
    }
    fn followed(&self) {
        self.0.front_door_followed();
    }
}

/// Reads `<state>/<name>`, or creates it with a fresh random token, mode
/// 0600 (created that way, never widened later).
fn ensure_token(state: &Path, name: &str) -> Result<String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let path = state.join(name);
    if let Ok(t) = std::fs::read_to_string(&path) {
        if !t.trim().is_empty() {
            return Ok(t.trim().to_string());
        }
    }
    let token = api::auth::random_token().map_err(|e| anyhow!("{e}"))?;
    let _ = std::fs::remove_file(&path);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .with_context(|| format!("creating {}", path.display()))?;
    f.write_all(token.as_bytes())?;
    Ok(token)
}

/// The engine link's secret and where it came from. Without one given, an
/// engine on loopback makes `<state>/engine-token`; anything else needs it
/// given, since a gateway elsewhere must be told it anyway.
fn engine_secret(a: &EngineTokenArgs, state: &Path, may_create: bool) -> Result<(api::auth::Secret, String)> {
    let bad = || anyhow!("the engine token is empty");
    if let Some(t) = &a.engine_token {
        return Ok((api::auth::Secret::new(t).ok_or_else(bad)?, "given with --engine-token".into()));
    }
    let file = a.engine_token_file.clone().unwrap_or_else(|| state.join("engine-token"));
    let text = if a.engine_token_file.is_none() && may_create {
        ensure_token(state, "engine-token")?
    } else {
        std::fs::read_to_string(&file).with_context(|| {
            format!("reading the engine token from {} (pass --engine-token or --engine-token-file)", file.display())
        })?
    };
    Ok((api::auth::Secret::new(&text).ok_or_else(bad)?, format!("in {}", file.display())))
}

/// An exclusive lock held while the process lives; a second `up` on the
/// same state or IPC directory is refused before it touches either.
pub struct DirLock(#[allow(dead_code)] std::fs::File);

fn lock_file(path: &Path, what: &Path) -> Result<DirLock> {
    use std::io::{Read, Seek, Write};
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    match f.try_lock() {
        Ok(()) => {
            f.set_len(0)?;
            f.rewind()?;
            write!(f, "{}", std::process::id())?;
            Ok(DirLock(f))
        }
        Err(std::fs::TryLockError::WouldBlock) => {
            let mut pid = String::new();
            let _ = f.read_to_string(&mut pid);
            bail!(
                "{} is in use by another staccato (pid {}); stop it first (`staccato down`), or use another \
                 --state-dir / --ipc-dir / --listen port",
                what.display(),
                pid.trim()
            )
        }
        Err(std::fs::TryLockError::Error(e)) => Err(e).with_context(|| format!("locking {}", path.display())),
    }
}

fn lock_dirs(state: &Path, ipc_dir: &Path) -> Result<(DirLock, DirLock)> {
    let s = lock_file(&state.join("lock"), state)?;
    let ipc_lock = PathBuf::from(format!("{}.lock", ipc_dir.display()));
    if let Some(parent) = ipc_lock.parent() {
        std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    }
    Ok((s, lock_file(&ipc_lock, ipc_dir)?))
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
        if let Ok(mut c) = client::Gateway::new(&url, None, Some(Duration::from_secs(2))) {
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
    // SIGTERM lets it remove its containers; SIGKILL if it hangs.
    if sys::process::signal(pid, libc::SIGTERM).is_err() {
        println!("staccato (pid {pid}) was not running");
    } else {
        let deadline = Instant::now() + Duration::from_secs(15);
        while Path::new(&format!("/proc/{pid}")).exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        if Path::new(&format!("/proc/{pid}")).exists() {
            let _ = sys::process::kill(pid);
        }
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

/// A duration flag whose bare numbers are milliseconds (`0` is allowed).
/// `--trace-sample`: a share of calls, checked as the flags are read.
fn share(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if (0.0..=1.0).contains(&x) => Ok(x),
        _ => Err(format!("a share of calls, 0 to 1, not {s:?}")),
    }
}

/// `--otlp-endpoint`: an http:// URL with a host.
fn otlp_url(s: &str) -> Result<String, String> {
    match s.strip_prefix("http://") {
        Some(rest) if !rest.is_empty() && !rest.starts_with('/') => Ok(s.to_string()),
        _ => Err(format!("the http:// URL of an OTLP/HTTP collector, not {s:?}")),
    }
}

fn ms_flag(v: &str) -> Result<Duration, UnitError> {
    duration_flag(v, Duration::from_millis(1))
}

/// A duration flag whose bare numbers are seconds (`0` is allowed).
fn secs_flag(v: &str) -> Result<Duration, UnitError> {
    duration_flag(v, Duration::from_secs(1))
}

fn duration_flag(v: &str, bare: Duration) -> Result<Duration, UnitError> {
    if v.trim() == "0" {
        return Ok(Duration::ZERO);
    }
    api::units::parse_duration(v, bare)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duration_flags_take_their_unit_or_a_suffix() {
        assert_eq!(ms_flag("250"), Ok(Duration::from_millis(250)));
        assert_eq!(ms_flag("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(secs_flag("300"), Ok(Duration::from_secs(300)));
        assert_eq!(secs_flag("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(secs_flag("1.5"), Ok(Duration::from_millis(1500)));
        assert_eq!(secs_flag("0"), Ok(Duration::ZERO));
        assert!(secs_flag("soon").unwrap_err().to_string().contains("\"soon\""));
        assert!(ms_flag("-5").is_err());
    }
}
