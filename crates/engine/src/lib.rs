//! The Staccato engine: one per worker server. It receives calls from the
//! gateway over TCP and from functions over message channels, queues them per
//! function, and dispatches them to workers under managed concurrency
//! (Nightcore §3.1–§3.3, §4.1).

#![forbid(unsafe_code)]

pub mod build;
mod clock;
mod code;
pub mod concurrency;
pub mod config;
mod io_thread;
pub mod scheduler;
mod shared;
pub use api::spec;
mod supervisor;

pub use config::{ContainerConfig, EngineConfig, Placement};

use api::auth::Role;
use shared::{Cmd, Mailbox, Shared, SupervisorCmd};
use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex, RwLock};
use std::time::Duration;
use wire::frame::{FrameHeader, FrameKind, FRAME_HEADER_LEN};

/// A running engine.
pub struct Engine {
    pub addr: SocketAddr,
    pool: Option<sandbox::Pool>,
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
    let cpus = ipc::cpus_allowed();
    let pool = match &cfg.containers {
        Some(cc) => Some(sandbox::Pool::new(cc.sandbox.clone()).map_err(io::Error::other)?),
        None => None,
    };
    let builds = build::Builds::new(&cfg);
    // The log FIFOs: beside the functions' IPC directories, never inside one.
    let fifos = cfg.ipc_dir.join(LOG_FIFOS);
    std::fs::create_dir_all(&fifos)?;
    std::fs::set_permissions(&fifos, std::os::unix::fs::PermissionsExt::from_mode(0o700))?;
    let logs = sandbox::logs::Logs::start("engine-logs")?;
    let (sup_tx, sup_rx) = mpsc::channel();
    let shared = Arc::new(Shared {
        cpus,
        cfg,
        functions: RwLock::new(HashMap::new()),
        calls: Mutex::new(HashMap::new()),
        mailboxes,
        supervisor: Mutex::new(sup_tx),
        traces: Mutex::new(Default::default()),
        next_worker_id: AtomicU32::new(1),
        next_owner: AtomicUsize::new(0),
        pool: pool.clone(),
        memory_total_bytes: memory_total_bytes(),
        builds,
        logs,
    });
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
    Ok(Engine { addr, pool })
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

fn read_frame(s: &mut TcpStream) -> io::Result<(FrameHeader, Vec<u8>)> {
    let mut hb = [0u8; FRAME_HEADER_LEN];
    s.read_exact(&mut hb)?;
    let h = FrameHeader::decode(&hb).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    let mut body = vec![0u8; h.body_len as usize];
    s.read_exact(&mut body)?;
    Ok((h, body))
}

/// Serves one (authenticated) control connection: each request is answered
/// in order. A request is JSON, followed by an attachment when the header's
/// `a` gives the JSON's length (docs/protocol.md §2).
fn serve_control(shared: &Shared, mut stream: TcpStream) -> io::Result<()> {
    loop {
        let (h, mut body) = match read_frame(&mut stream) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        };
        let json_len = if h.a == 0 { body.len() } else { h.a as usize };
        let reply = if h.kind != FrameKind::Control {
            serde_json::json!({ "ok": false, "error": "expected a control frame" })
        } else if json_len > body.len() {
            serde_json::json!({ "ok": false, "error": "control frame: JSON length beyond the body" })
        } else {
            let attachment = body.split_off(json_len);
            match serde_json::from_slice(&body) {
                Ok(req) => {
                    let (tx, rx) = mpsc::channel();
                    let _ = shared::lock(&shared.supervisor).send(SupervisorCmd::Control(req, attachment, tx));
                    rx.recv().unwrap_or_else(|_| serde_json::json!({ "ok": false, "error": "engine is shutting down" }))
                }
                Err(e) => serde_json::json!({ "ok": false, "error": format!("invalid JSON: {e}") }),
            }
        };
        let body = serde_json::to_vec(&reply)?;
        let mut out = FrameHeader::new(FrameKind::ControlReply, h.call_id, body.len()).encode().to_vec();
        out.extend_from_slice(&body);
        stream.write_all(&out)?;
    }
}
