//! The Staccato engine: one per worker server. It receives calls from the
//! gateway over TCP and from functions over message channels, queues them per
//! function, and dispatches them to workers under managed concurrency
//! (Nightcore §3.1–§3.3, §4.1).

#![forbid(unsafe_code)]

mod clock;
mod code;
pub mod concurrency;
pub mod config;
mod io_thread;
pub mod scheduler;
mod shared;
pub mod spec;
mod supervisor;

pub use config::{ContainerConfig, EngineConfig, Placement};

use shared::{Cmd, Mailbox, Shared, SupervisorCmd};
use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU32, AtomicUsize};
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
    });
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

fn accept_loop(shared: Arc<Shared>, listener: TcpListener) {
    for stream in listener.incoming() {
        let Ok(stream) = stream else {
            // Out of fds (EMFILE) or similar: don't spin; let others finish.
            std::thread::sleep(Duration::from_millis(10));
            continue;
        };
        let s = shared.clone();
        // A slow or silent peer must not hold up the next connection.
        let _ = std::thread::Builder::new().name("engine-hello".into()).spawn(move || {
            if let Err(e) = on_connection(s, stream) {
                log::warn!("engine connection: {e}");
            }
        });
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

fn on_connection(shared: Arc<Shared>, mut stream: TcpStream) -> io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let (h, body) = read_frame(&mut stream)?;
    if h.kind != FrameKind::Hello {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "first frame is not a hello"));
    }
    stream.set_read_timeout(None)?;
    match body.first() {
        Some(0) => {
            let thread = h.c as usize % shared.mailboxes.len();
            shared.post(thread, Cmd::AdoptConn(stream));
            Ok(())
        }
        Some(1) => serve_control(&shared, stream),
        _ => Err(io::Error::new(io::ErrorKind::InvalidData, "unknown connection role")),
    }
}

/// Serves one control connection: each JSON request is answered in order.
fn serve_control(shared: &Shared, mut stream: TcpStream) -> io::Result<()> {
    loop {
        let (h, body) = match read_frame(&mut stream) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        };
        let reply = if h.kind != FrameKind::Control {
            serde_json::json!({ "ok": false, "error": "expected a control frame" })
        } else {
            match serde_json::from_slice(&body) {
                Ok(req) => {
                    let (tx, rx) = mpsc::channel();
                    let _ = shared::lock(&shared.supervisor).send(SupervisorCmd::Control(req, tx));
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
