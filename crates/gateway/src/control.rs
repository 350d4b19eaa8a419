//! The gateway's control connection to the engine, on a thread of its own:
//! registrations may take seconds (compiling, starting launchers) and must
//! not stall a gateway thread's event loop. Each registration goes over a
//! connection of its own, so a long build holds up neither other deploys
//! nor status, traces and removals (the engine builds them concurrently).

use crate::store::Store;
use api::control::{self, LinkBroken, Refusal, RefusalKind, Reply, Request};
use hyper::StatusCode;
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;

/// How often an idle control connection checks that the engine is still
/// the same one.
const HEARTBEAT: Duration = Duration::from_millis(200);

/// Whether a function (by name) is placed on this client's engine.
pub type PlacedHere = Box<dyn Fn(&str) -> bool + Send>;

/// A request, its attachment (a registration's source archive), and where
/// the answer goes.
type Job = (Request, Vec<u8>, oneshot::Sender<Result<Reply, ControlError>>);

/// Why a control request got no reply from the engine.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// No connection to the engine (`why` is the last connection error).
    #[error("engine at {addr} is unreachable{}", if why.is_empty() { String::new() } else { format!(": {why}") })]
    Unreachable { addr: SocketAddr, why: String },
    /// The connection failed during the exchange (the request may or may
    /// not have been carried out).
    #[error("the control connection to the engine broke: {0}")]
    Broken(String),
    /// The engine answered that it would not.
    #[error("{0}")]
    Refused(Refusal),
    #[error("the gateway's control thread is gone")]
    Gone,
}

impl ControlError {
    /// The HTTP status and error kind a client is answered.
    pub fn http(&self) -> (StatusCode, &'static str) {
        match self {
            ControlError::Unreachable { .. } | ControlError::Broken(_) | ControlError::Gone => {
                (StatusCode::SERVICE_UNAVAILABLE, "engine_unavailable")
            }
            ControlError::Refused(r) => match r.kind {
                RefusalKind::NotFound => (StatusCode::NOT_FOUND, "not_found"),
                RefusalKind::ShuttingDown => (StatusCode::SERVICE_UNAVAILABLE, "engine_unavailable"),
                RefusalKind::Internal => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
                RefusalKind::Superseded => (StatusCode::CONFLICT, "superseded"),
                RefusalKind::Busy => (StatusCode::SERVICE_UNAVAILABLE, "overloaded"),
                RefusalKind::BadRequest
                | RefusalKind::InvalidSpec
                | RefusalKind::BuildFailed
                | RefusalKind::StartFailed => (StatusCode::BAD_REQUEST, "bad_request"),
            },
        }
    }
}

#[derive(Clone)]
pub struct ControlClient {
    tx: mpsc::Sender<Job>,
    addr: SocketAddr,
    secret: api::auth::Secret,
    /// Connected, and every stored function re-registered since.
    restored: Arc<AtomicBool>,
    /// Connected (perhaps still restoring).
    connected: Arc<AtomicBool>,
}

impl ControlClient {
    /// Starts the control thread. On every (re)connection it re-registers
    /// the stored functions placed on the engine that it does not have: an
    /// engine that restarted comes back with everything deployed.
    pub fn start(
        addr: SocketAddr,
        secret: api::auth::Secret,
        store: Arc<Store>,
        placed_here: PlacedHere,
    ) -> ControlClient {
        let (tx, rx) = mpsc::channel::<Job>();
        let restored = Arc::new(AtomicBool::new(false));
        let connected = Arc::new(AtomicBool::new(false));
        let flags = Flags { restored: restored.clone(), connected: connected.clone() };
        let s = secret.clone();
        std::thread::Builder::new()
            .name("gateway-control".into())
            .spawn(move || control_thread(addr, s, (store, placed_here), rx, flags))
            .expect("spawning the control thread");
        ControlClient { tx, addr, secret, restored, connected }
    }

    /// Whether the engine has every stored function (as far as we know).
    pub fn restored(&self) -> bool {
        self.restored.load(Ordering::Acquire)
    }

    pub fn connected(&self) -> bool {
        self.connected.load(Ordering::Acquire)
    }

    pub async fn request(&self, req: Request) -> Result<Reply, ControlError> {
        self.request_with(req, Vec::new()).await
    }

    pub async fn request_with(&self, req: Request, attachment: Vec<u8>) -> Result<Reply, ControlError> {
        let (tx, rx) = oneshot::channel();
        // While the engine is being restored, a registration waits behind
        // the restore on the control thread: sent beside it, it could reach
        // the engine before the restore's older version of the same name.
        if matches!(req, Request::Register { .. }) && self.restored() {
            let (addr, secret) = (self.addr, self.secret.clone());
            std::thread::Builder::new()
                .name("gateway-deploy".into())
                .spawn(move || {
                    let result = connect(addr, &secret)
                        .map_err(|e| ControlError::Unreachable { addr, why: e.to_string() })
                        .and_then(|mut c| roundtrip(&mut c, &req, &attachment));
                    let _ = tx.send(result);
                })
                .map_err(|_| ControlError::Gone)?;
        } else {
            self.tx.send((req, attachment, tx)).map_err(|_| ControlError::Gone)?;
        }
        rx.await.map_err(|_| ControlError::Gone)?
    }
}

/// What the control thread tells the rest of the gateway.
struct Flags {
    restored: Arc<AtomicBool>,
    connected: Arc<AtomicBool>,
}

/// Runs until its `ControlClient` is dropped (the engine left the table).
fn control_thread(
    addr: SocketAddr,
    secret: api::auth::Secret,
    (store, placed_here): (Arc<Store>, PlacedHere),
    rx: mpsc::Receiver<Job>,
    flags: Flags,
) {
    let Flags { restored, connected } = flags;
    let mut conn: Option<TcpStream> = None;
    let mut last_error = String::new();
    loop {
        connected.store(conn.is_some(), Ordering::Release);
        if conn.is_none() {
            restored.store(false, Ordering::Release);
            conn = match connect(addr, &secret) {
                Ok(c) => Some(c),
                Err(e) => {
                    let e = e.to_string();
                    // Say it once, not at every retry.
                    if e != last_error {
                        log::error!("control connection to engine {addr}: {e}");
                        last_error = e;
                    }
                    None
                }
            };
            if let Some(c) = conn.as_mut() {
                connected.store(true, Ordering::Release);
                last_error.clear();
                match restore(c, &store, &placed_here) {
                    Ok(()) => restored.store(true, Ordering::Release),
                    Err(e) => {
                        log::error!("restoring functions: {e}");
                        conn = None;
                    }
                }
            }
        }
        let (req, attachment, reply) = match rx.recv_timeout(HEARTBEAT) {
            Ok(r) => r,
            Err(mpsc::RecvTimeoutError::Disconnected) => return,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                // Heartbeat: notice an engine that restarted (and lost its
                // functions) even when nobody is deploying.
                if let Some(c) = conn.as_mut() {
                    if let Err(ControlError::Broken(_)) = roundtrip(c, &Request::Status, &[]) {
                        conn = None;
                    }
                } else {
                    std::thread::sleep(HEARTBEAT);
                }
                continue;
            }
        };
        let result = match conn.as_mut() {
            Some(c) => roundtrip(c, &req, &attachment),
            None => Err(ControlError::Unreachable { addr, why: last_error.clone() }),
        };
        if let Err(ControlError::Broken(e)) = &result {
            log::warn!("control connection to engine {addr}: {e}");
            conn = None;
        }
        let _ = reply.send(result);
    }
}

fn connect(addr: SocketAddr, secret: &api::auth::Secret) -> Result<TcpStream, api::link::LinkError> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.set_write_timeout(Some(Duration::from_secs(5)))?;
    api::link::client(&mut s, secret, api::auth::Role::Control, 0)?;
    // Registrations may compile for minutes: no read timeout from here on.
    s.set_read_timeout(None)?;
    s.set_write_timeout(None)?;
    Ok(s)
}

fn restore(c: &mut TcpStream, store: &Store, placed_here: &PlacedHere) -> Result<(), ControlError> {
    let have: Vec<String> = match roundtrip(c, &Request::Status, &[])? {
        Reply::Status { functions } => functions.into_iter().map(|f| f.name).collect(),
        other => return Err(ControlError::Broken(format!("a status request was answered {other:?}"))),
    };
    let specs = store.list().map_err(|e| ControlError::Refused(Refusal::new(RefusalKind::Internal, e.to_string())))?;
    for listed in specs {
        if have.contains(&listed.name) || !placed_here(&listed.name) {
            continue;
        }
        // Deployed again or removed since the list was read: the store now.
        let spec = match store.get(&listed.name) {
            Ok(Some(spec)) => spec,
            Ok(None) => continue,
            Err(e) => return Err(ControlError::Refused(Refusal::new(RefusalKind::Internal, e.to_string()))),
        };
        let archive = match store.source(&spec.source) {
            Ok(a) => a,
            Err(e) => {
                log::error!("restoring function {}: {e} (deploy it again)", spec.name);
                continue;
            }
        };
        let name = spec.name.clone();
        let req = Request::Register { spec };
        // A busy engine (building as many deploys as it may) is asked again.
        let mut answer = roundtrip(c, &req, &archive);
        for _ in 0..RESTORE_BUSY_RETRIES {
            match &answer {
                Err(ControlError::Refused(r)) if r.kind == RefusalKind::Busy => {
                    std::thread::sleep(Duration::from_millis(500));
                    answer = roundtrip(c, &req, &archive);
                }
                _ => break,
            }
        }
        match answer {
            Ok(_) => log::info!("restored function {name}"),
            Err(e @ ControlError::Broken(_)) => return Err(e),
            Err(e) => log::error!("restoring function {name}: {e}"),
        }
    }
    Ok(())
}

/// How often a restore asks a busy engine again, half a second apart.
const RESTORE_BUSY_RETRIES: u32 = 120;

/// One request and its answer (api::control). A broken connection is
/// `Broken`: the caller drops it and connects again.
fn roundtrip(c: &mut TcpStream, req: &Request, attachment: &[u8]) -> Result<Reply, ControlError> {
    let broken = |e: LinkBroken| ControlError::Broken(e.to_string());
    control::write_request(c, req, attachment).map_err(|e| broken(e.into()))?;
    control::read_answer(c).map_err(broken)?.map_err(ControlError::Refused)
}
