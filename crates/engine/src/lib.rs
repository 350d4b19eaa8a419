//! The Staccato engine: one per worker server. It receives calls from the
//! gateway over TCP and from functions over message channels, queues them per
//! function, and dispatches them to workers under managed concurrency
//! (Nightcore §3.1–§3.3, §4.1).

#![forbid(unsafe_code)]

mod awake;
pub mod build;
mod calls;
mod clock;
mod code;
pub mod concurrency;
pub mod config;
mod error;
pub mod front;
mod io_thread;
mod otel;
mod remote;
pub mod scheduler;
mod secrets;
mod shared;
pub use api::spec;
mod supervisor;
mod via_gateway;

pub use config::{Concurrency, ContainerConfig, EngineConfig, Placement};
pub use error::{Error, Result};

use api::auth::Role;
use shared::{Cmd, Mailbox, Shared, SupervisorCmd};
use std::collections::HashMap;
use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex, RwLock};
use std::time::Duration;

/// A running engine.
pub struct Engine {
    pub addr: SocketAddr,
    pool: Option<sandbox::Pool>,
    shared: Arc<Shared>,
}

impl Engine {
    /// Destroys every function container (call before the process exits;
    /// if it dies instead, each container's init sees its control FIFO
    /// close and the kernel ends the container, and the next engine with
    /// the same state directory removes what is left).
    pub fn shutdown(&self) {
        if let Some(p) = &self.pool {
            p.shutdown();
        }
    }

    /// Makes the engine the front door for `door`'s external calls: its I/O
    /// threads accept client connections on `listeners` (one each, in
    /// turn), answer the calls they can (`front`), and hand everything
    /// else to the gateway. Once only; later calls are refused.
    pub fn serve_front(&self, door: Arc<dyn front::FrontDoor>, listeners: Vec<TcpListener>) -> io::Result<()> {
        if self.shared.front.set(door).is_err() {
            return Err(io::Error::other("the engine is a front door already"));
        }
        for (i, l) in listeners.into_iter().enumerate() {
            l.set_nonblocking(true)?;
            // Connections from a client on CPU c go to the listener of
            // the I/O thread on c, so a call does not cross vCPUs.
            if let Some(cpu) = self.shared.cpu_of(i) {
                if let Err(e) = socket2::SockRef::from(&l).set_cpu_affinity(cpu) {
                    log::warn!("SO_INCOMING_CPU on the front door's listener {i}: {e}");
                }
            }
            self.shared.post(i, Cmd::Listen(l));
        }
        Ok(())
    }

    /// The isolation pool, for benchmarks and tests.
    pub fn pool(&self) -> Option<&sandbox::Pool> {
        self.pool.as_ref()
    }
}

/// Starts the engine's threads and returns once it accepts connections.
pub fn start(cfg: EngineConfig) -> io::Result<Engine> {
    std::fs::create_dir_all(&cfg.ipc_dir)?;
    std::fs::create_dir_all(&cfg.state_dir)?;
    let listener = TcpListener::bind(cfg.listen)?;
    let addr = listener.local_addr()?;
    let n = cfg.io_threads.max(1);
    let mut polls = Vec::with_capacity(n);
    let mut mailboxes = Vec::with_capacity(n);
    for _ in 0..n {
        let poll = mio::Poll::new()?;
        let waker = mio::Waker::new(poll.registry(), io_thread::WAKER)?;
        mailboxes.push(Mailbox { queue: Mutex::new(Vec::new()), waker });
        polls.push(poll);
    }
    let cpus = sys::cpu::cpus_allowed();
    let pool = match &cfg.containers {
        Some(cc) => Some(sandbox::Pool::new(cc.sandbox.clone()).map_err(io::Error::other)?),
        None => None,
    };
    let builds = build::Builds::new(&cfg);
    // Secrets a previous engine of this IPC directory wrote: its
    // gateways register every function again, with their values.
    let _ = std::fs::remove_dir_all(cfg.ipc_dir.join(secrets::ROOT));
    // The log FIFOs: beside the functions' IPC directories, never inside one.
    let fifos = cfg.ipc_dir.join(LOG_FIFOS);
    std::fs::create_dir_all(&fifos)?;
    std::fs::set_permissions(&fifos, std::os::unix::fs::PermissionsExt::from_mode(0o700))?;
    let logs = sandbox::logs::Logs::start("engine-logs")?;
    let (sup_tx, sup_rx) = mpsc::channel();
    let cfg_via = cfg.internal_calls_via.clone();
    let tracer = match &cfg.otlp_endpoint {
        Some(e) => Some(otel::Tracer::start(e, cfg.trace_sample, addr.to_string())?),
        None => None,
    };
    let keep_awake_ms = cfg.keep_awake_ms;
    let shared = Arc::new(Shared {
        cpus,
        cfg,
        functions: RwLock::new(HashMap::new()),
        calls: calls::CallTable::new(),
        mailboxes,
        supervisor: Mutex::new(sup_tx),
        traces: calls::TraceRing::new(),
        next_worker_id: AtomicU32::new(1),
        next_owner: AtomicUsize::new(0),
        pool: pool.clone(),
        memory_total_bytes: memory_total_bytes(),
        builds,
        logs,
        remote: remote::Remote::default(),
        via_gateway: cfg_via.as_deref().map(via_gateway::ViaGateway::new),
        front: std::sync::OnceLock::new(),
        awake: Arc::new(awake::Awake::new(keep_awake_ms)),
        alarm: clock::Alarm::new(),
        tracer,
    });
    let awake_cpus = match shared.cfg.placement {
        Placement::Packed => shared.cpus.clone(),
        Placement::Kernel => Vec::new(),
    };
    shared.awake.start(&awake_cpus);
    shared.builds.prepare_go(&shared.cfg);
    for (i, poll) in polls.into_iter().enumerate() {
        let t = io_thread::IoThread::new(i, shared.clone(), poll);
        std::thread::Builder::new().name(format!("engine-io-{i}")).spawn(move || t.run())?;
    }
    let s = shared.clone();
    std::thread::Builder::new().name("engine-supervisor".into()).spawn(move || supervisor::run(s, sup_rx))?;
    let s = shared.clone();
    std::thread::Builder::new().name("engine-clock".into()).spawn(move || clock::run(s))?;
    let s = shared.clone();
    std::thread::Builder::new().name("engine-accept".into()).spawn(move || accept_loop(s, listener))?;
    Ok(Engine { addr, pool, shared })
}

/// The directory of the functions' log FIFOs in the IPC directory (a
/// function name never starts with a dot).
pub(crate) const LOG_FIFOS: &str = ".logs";

/// Connections still in their handshake at once; more are closed at once,
/// so unauthenticated peers cannot tie up threads without bound.
const HANDSHAKES_MAX: usize = 64;

/// Time a peer has to complete the handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// The host's RAM (`MemTotal`), or 0 if /proc does not say.
fn memory_total_bytes() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| {
            t.lines().find_map(|l| l.strip_prefix("MemTotal:")?.trim().strip_suffix("kB")?.trim().parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

fn accept_loop(shared: Arc<Shared>, listener: TcpListener) {
    let in_handshake = Arc::new(AtomicUsize::new(0));
    for stream in listener.incoming() {
        let Ok(stream) = stream else {
            // Out of fds (EMFILE) or similar: don't spin; let others finish.
            std::thread::sleep(Duration::from_millis(10));
            continue;
        };
        if in_handshake.fetch_add(1, Ordering::AcqRel) >= HANDSHAKES_MAX {
            in_handshake.fetch_sub(1, Ordering::AcqRel);
            log::warn!("engine: {HANDSHAKES_MAX} connections are already in their handshake; closing a new one");
            continue;
        }
        let (s, count) = (shared.clone(), in_handshake.clone());
        // A slow or silent peer must not hold up the next connection.
        let spawned = std::thread::Builder::new().name("engine-hello".into()).spawn(move || {
            let peer = stream.peer_addr().map_or_else(|_| "?".into(), |a| a.to_string());
            if let Err(e) = on_connection(s, stream, &count) {
                log::warn!("engine connection from {peer}: {e}");
            }
        });
        if spawned.is_err() {
            in_handshake.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

fn on_connection(shared: Arc<Shared>, mut stream: TcpStream, in_handshake: &AtomicUsize) -> io::Result<()> {
    stream.set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
    stream.set_write_timeout(Some(HANDSHAKE_TIMEOUT))?;
    let accepted = api::link::engine(&mut stream, &shared.cfg.secret);
    in_handshake.fetch_sub(1, Ordering::AcqRel);
    let accepted = accepted.map_err(io::Error::other)?;
    stream.set_read_timeout(None)?;
    stream.set_write_timeout(None)?;
    match accepted.role {
        Role::Data => {
            let thread = accepted.thread as usize % shared.mailboxes.len();
            shared.post(thread, Cmd::AdoptConn(stream));
            Ok(())
        }
        Role::Control => serve_control(&shared, stream),
    }
}

/// Serves one (authenticated) control connection: each request is answered
/// in order (api::control; docs/protocol.md §2).
fn serve_control(shared: &Shared, mut stream: TcpStream) -> io::Result<()> {
    use api::control::{self, LinkBroken, Refusal, RefusalKind};
    loop {
        let answer = match control::read_request(&mut stream) {
            Ok(None) => return Ok(()),
            // The gateway's heartbeat, every 200 ms: answered here, without
            // waking the supervisor.
            Ok(Some(Ok((control::Request::Names, _)))) => Ok(shared.names()),
            Ok(Some(Ok((req, attachment)))) => {
                let (tx, rx) = mpsc::channel();
                let _ = shared::lock(&shared.supervisor).send(SupervisorCmd::Control(Box::new(req), attachment, tx));
                rx.recv().unwrap_or_else(|_| Err(Refusal::new(RefusalKind::ShuttingDown, "engine is shutting down")))
            }
            Ok(Some(Err(refusal))) => Err(refusal),
            Err(LinkBroken::Io(e)) => return Err(e),
            Err(LinkBroken::Malformed(m)) => {
                // The stream is out of step: say why, then close.
                let _ = control::write_answer(&mut stream, &Err(Refusal::new(RefusalKind::BadRequest, m.clone())));
                return Err(io::Error::new(io::ErrorKind::InvalidData, m));
            }
        };
        control::write_answer(&mut stream, &answer)?;
    }
}
