//! The gateway's control connection to the engine, on a thread of its own:
//! registrations may take seconds (compiling, starting launchers) and must
//! not stall a gateway thread's event loop. Each registration goes over a
//! connection of its own, so a long build holds up neither other deploys
//! nor status, traces and removals (the engine builds them concurrently).

use crate::store::Store;
use api::control::{self, LinkBroken, Refusal, RefusalKind, Reply, Request};
use hyper::StatusCode;
use std::collections::HashMap;
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;

/// How often an idle control connection checks that the engine is still
/// the same one.
const HEARTBEAT: Duration = Duration::from_millis(200);

/// The engine a control client reconciles: its id and labels, against
/// which each stored function's placement is read.
pub struct PlacedHere {
    pub id: String,
    pub labels: std::collections::BTreeMap<String, String>,
}

impl PlacedHere {
    /// Whether the stored `spec`, with the engines chosen for it
    /// (`chosen`, from the same read of the store), runs on this engine.
    fn serves(&self, spec: &api::spec::FunctionSpec, chosen: Option<&Vec<String>>) -> bool {
        let p = &spec.placement;
        p.admits(&self.labels) && (p.engines == 0 || chosen.is_some_and(|c| c.contains(&self.id)))
    }
}

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
    flags: Arc<Flags>,
}

impl ControlClient {
    /// Starts the control thread. On every (re)connection, and then every
    /// `RECONCILE_EVERY` or when [`ControlClient::nudge`]d, it brings the
    /// engine in line with the store (see [`reconcile`]): an engine that
    /// restarted comes back with everything placed on it.
    pub fn start(
        addr: SocketAddr,
        secret: api::auth::Secret,
        store: Arc<Store>,
        placed_here: PlacedHere,
    ) -> ControlClient {
        let (tx, rx) = mpsc::channel::<Job>();
        let flags = Arc::new(Flags::default());
        let (s, f) = (secret.clone(), flags.clone());
        std::thread::Builder::new()
            .name("gateway-control".into())
            .spawn(move || control_thread(addr, s, (store, placed_here), rx, &f))
            .expect("spawning the control thread");
        ControlClient { tx, addr, secret, flags }
    }

    /// Whether the engine has every stored function (as far as we know).
    pub fn restored(&self) -> bool {
        self.flags.restored.load(Ordering::Acquire)
    }

    pub fn connected(&self) -> bool {
        self.flags.connected.load(Ordering::Acquire)
    }

    /// The functions the engine said it runs, at its last heartbeat
    /// (`Names`) or reconciliation (`Status`): at most `HEARTBEAT` ago
    /// while connected.
    pub fn serving(&self) -> Vec<String> {
        self.flags.serving.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Asks for a reconciliation soon (the store changed).
    pub fn nudge(&self) {
        self.flags.stale.store(true, Ordering::Release);
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

/// What the control thread and the rest of the gateway tell each other.
#[derive(Default)]
struct Flags {
    /// Connected, and reconciled with the store since.
    restored: AtomicBool,
    /// Connected (perhaps still restoring).
    connected: AtomicBool,
    /// The store changed: reconcile at the next heartbeat.
    stale: AtomicBool,
    serving: std::sync::Mutex<Vec<String>>,
}

/// How often a connected engine is reconciled with the store when nothing
/// asked for it sooner (a change another gateway made to a shared store is
/// seen by then at the latest).
const RECONCILE_EVERY: Duration = Duration::from_secs(2);

/// Runs until its `ControlClient` is dropped (the engine left the table).
fn control_thread(
    addr: SocketAddr,
    secret: api::auth::Secret,
    (store, placed_here): (Arc<Store>, PlacedHere),
    rx: mpsc::Receiver<Job>,
    flags: &Flags,
) {
    let mut conn: Option<TcpStream> = None;
    let mut last_error = String::new();
    let mut reconciled = std::time::Instant::now();
    // Registrations that failed on this connection (stored fingerprints).
    let mut failed = std::collections::HashSet::new();
    // The engine on this connection does not know `Names` (an older one).
    let mut no_names = false;
    let set_serving = |names: Vec<String>| *flags.serving.lock().unwrap_or_else(|p| p.into_inner()) = names;
    // A job taken while checking for the client's end, run next.
    let mut pending: Option<Job> = None;
    loop {
        flags.connected.store(conn.is_some(), Ordering::Release);
        if conn.is_none() && pending.is_none() {
            // The engine left the table (every client is gone): do not
            // connect again, least of all to reconcile it behind the back of
            // the client its rejoining made.
            match rx.try_recv() {
                Err(mpsc::TryRecvError::Disconnected) => return,
                Ok(job) => pending = Some(job),
                Err(mpsc::TryRecvError::Empty) => {}
            }
        }
        if conn.is_none() {
            flags.restored.store(false, Ordering::Release);
            set_serving(Vec::new());
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
                flags.connected.store(true, Ordering::Release);
                last_error.clear();
                flags.stale.store(false, Ordering::Release);
                failed.clear();
                no_names = false;
                match reconcile(c, &store, &placed_here, &mut failed) {
                    Ok(names) => {
                        set_serving(names);
                        reconciled = std::time::Instant::now();
                        flags.restored.store(true, Ordering::Release);
                    }
                    Err(e @ ControlError::Broken(_)) => {
                        log::error!("restoring functions on engine {addr}: {e}");
                        conn = None;
                    }
                    // The store cannot be read (a shared store is down): the
                    // engine serves what it has, and is reconciled at the
                    // next round that can read it.
                    Err(e) => {
                        log::error!("reconciling engine {addr} with the store: {e}; it serves what it has");
                        match status_names(conn.as_mut().expect("connected"), &mut no_names) {
                            Ok(names) => {
                                set_serving(names);
                                reconciled = std::time::Instant::now();
                                flags.restored.store(true, Ordering::Release);
                            }
                            // Out of step (a late answer may still come):
                            // connect afresh.
                            Err(e) => {
                                log::error!("control connection to engine {addr}: {e}");
                                conn = None;
                            }
                        }
                    }
                }
            }
        }
        let next = match pending.take() {
            Some(job) => Ok(job),
            None => rx.recv_timeout(HEARTBEAT),
        };
        let (req, attachment, reply) = match next {
            Ok(r) => r,
            Err(mpsc::RecvTimeoutError::Disconnected) => return,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let Some(c) = conn.as_mut() else {
                    std::thread::sleep(HEARTBEAT);
                    continue;
                };
                // Heartbeat: notice an engine that restarted (and lost its
                // functions) even when nobody is deploying; now and then,
                // or when the store changed, reconcile it with the store.
                let nudged = flags.stale.swap(false, Ordering::AcqRel);
                let due = nudged || reconciled.elapsed() >= RECONCILE_EVERY;
                let result = if due {
                    reconciled = std::time::Instant::now();
                    reconcile(c, &store, &placed_here, &mut failed)
                } else {
                    status_names(c, &mut no_names)
                };
                match result {
                    Ok(names) => set_serving(names),
                    Err(ControlError::Broken(_)) => conn = None,
                    Err(e) => log::warn!("reconciling engine {addr} with the store: {e}"),
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

/// One function as an engine runs it.
struct Running {
    name: String,
    /// Its spec's fingerprint.
    spec: String,
    /// When it was registered (Unix ms, by this gateway's clock).
    since_ms: u64,
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// How long an engine may take to answer a status request before its
/// control connection is taken for dead (a cut cable leaves a TCP read
/// waiting for many minutes). Registrations, which may build for minutes,
/// have no limit.
const STATUS_ANSWER_MAX: Duration = Duration::from_secs(2);

/// A status request's round trip, its answer waited for at most
/// `STATUS_ANSWER_MAX`.
fn status_roundtrip(c: &mut TcpStream, req: &Request) -> Result<Reply, ControlError> {
    let limit = |c: &TcpStream, d| c.set_read_timeout(d).map_err(|e| ControlError::Broken(e.to_string()));
    limit(c, Some(STATUS_ANSWER_MAX))?;
    let answer = roundtrip(c, req, &[]);
    limit(c, None)?;
    answer
}

/// The engine's functions.
fn status(c: &mut TcpStream) -> Result<Vec<Running>, ControlError> {
    let now = unix_ms();
    match status_roundtrip(c, &Request::Status)? {
        Reply::Status { functions, .. } => Ok(functions
            .into_iter()
            .map(|f| Running { name: f.name, spec: f.spec, since_ms: now.saturating_sub(f.age_ms) })
            .collect()),
        other => Err(ControlError::Broken(format!("a status request was answered {other:?}"))),
    }
}

/// The names of the engine's functions (the heartbeat's question): a
/// `Names` request, which the engine answers without looking into any
/// function, or `Status` of an engine too old to know it (it refuses it
/// `bad_request`; `no_names` keeps that for the connection).
fn status_names(c: &mut TcpStream, no_names: &mut bool) -> Result<Vec<String>, ControlError> {
    if !*no_names {
        match status_roundtrip(c, &Request::Names) {
            Ok(Reply::Names { mut names }) => {
                // In a known order, whatever the engine's.
                names.sort_unstable();
                return Ok(names);
            }
            Ok(other) => return Err(ControlError::Broken(format!("a names request was answered {other:?}"))),
            Err(ControlError::Refused(r)) if r.kind == RefusalKind::BadRequest => *no_names = true,
            Err(e) => return Err(e),
        }
    }
    Ok(status(c)?.into_iter().map(|f| f.name).collect())
}

/// Brings the engine in line with the store; returns the functions it runs
/// after. For each stored function, the engine's copy is *current* (the
/// stored spec), *stale* (another spec, registered before the stored one
/// was stored: the engine was away when it was deployed again), or *newer*
/// (another spec registered since: a deploy is under way, which registers
/// on the engines first and stores after).
/// - Placed on the engine: registered when missing or stale (an engine that
///   restarted, joined late, or was away).
/// - Not placed on it: unregistered when current or stale (it was away when
///   the function moved, or another engine took its place while it was
///   away). Left there, its own callers would keep calling that copy: a
///   local callee always wins.
///
/// A newer copy, and a function the store does not have, are left alone:
/// either may be a deploy under way. A registration that fails is not
/// tried again on this connection until the stored spec changes
/// (`failed`), so a build that fails is not rerun every few seconds.
fn reconcile(
    c: &mut TcpStream,
    store: &Store,
    placed_here: &PlacedHere,
    failed: &mut std::collections::HashSet<String>,
) -> Result<Vec<String>, ControlError> {
    let internal =
        |e: crate::store::StoreError| ControlError::Refused(Refusal::new(RefusalKind::Internal, e.to_string()));
    let have = status(c)?;
    let mut serving: Vec<String> = have.iter().map(|f| f.name.clone()).collect();
    // Placements come from this read of the store, not from the gateway's
    // routes: another gateway may have changed them since those were read.
    let specs = store.list().map_err(internal)?;
    let stamps = store.stored_at().map_err(internal)?;
    let chosen: HashMap<String, Vec<String>> = store.placements().map_err(internal)?.into_iter().collect();
    let removed = store.removed().map_err(internal)?;
    // A function removed after the engine's copy was registered, and not
    // stored again: the engine was away when it was removed.
    for f in &have {
        let gone = removed.get(&f.name).is_some_and(|&at| f.since_ms < at);
        if gone && !specs.iter().any(|s| s.name == f.name) {
            match roundtrip(c, &Request::Unregister { name: f.name.clone() }, &[]) {
                Ok(_) => {
                    log::info!("function {} was removed while the engine was away: removed there too", f.name);
                    serving.retain(|n| *n != f.name);
                }
                Err(e @ ControlError::Broken(_)) => return Err(e),
                Err(e) => log::warn!("removing function {} (removed from the store): {e}", f.name),
            }
        }
    }
    for listed in specs {
        let name = listed.name.clone();
        let fingerprint = listed.fingerprint();
        let stored_ms = stamps.get(&name).copied().unwrap_or(0);
        let copy = have.iter().find(|f| f.name == name);
        let stale = copy.is_some_and(|f| copy_is(f, &fingerprint, stored_ms) == Held::Stale);
        match todo(placed_here.serves(&listed, chosen.get(&name)), copy.map(|f| copy_is(f, &fingerprint, stored_ms))) {
            Todo::Nothing => continue,
            Todo::Unregister => {
                match roundtrip(c, &Request::Unregister { name: name.clone() }, &[]) {
                    Ok(_) => {
                        log::info!("function {name} left an engine it is no longer placed on");
                        serving.retain(|n| *n != name);
                    }
                    // Gone already (a removal raced this one).
                    Err(ControlError::Refused(r)) if r.kind == RefusalKind::NotFound => serving.retain(|n| *n != name),
                    Err(e @ ControlError::Broken(_)) => return Err(e),
                    Err(e) => log::warn!("removing function {name} from an engine it is not placed on: {e}"),
                }
                continue;
            }
            Todo::Register if failed.contains(&fingerprint) => continue,
            Todo::Register => {}
        }
        // Deployed again or removed since the list was read: the store now.
        let spec = match store.get(&name).map_err(internal)? {
            Some(spec) => spec,
            None => continue,
        };
        let archive = match store.source(&spec.source) {
            Ok(a) => a,
            // Unreachable shared store: tried again at the next round.
            Err(e @ crate::store::StoreError::Unavailable(_)) => {
                log::warn!("restoring function {name}: {e}");
                continue;
            }
            Err(e) => {
                log::error!("restoring function {name}: {e} (deploy it again)");
                failed.insert(fingerprint);
                continue;
            }
        };
        let secrets = match store.secret_values(&spec.secrets) {
            Ok(s) => s,
            Err(e) => {
                log::error!("restoring function {name}: {e} (deploy it again)");
                failed.insert(fingerprint);
                continue;
            }
        };
        let req = Request::Register { spec, secrets };
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
            Ok(_) => {
                log::info!("restored function {name}{}", if stale { " (it ran an older version)" } else { "" });
                if !stale {
                    serving.push(name);
                }
            }
            Err(e @ ControlError::Broken(_)) => return Err(e),
            Err(e) => {
                // Not asked again until the spec changes, unless the engine
                // was only busy, or took another deploy of the name meanwhile
                // (another gateway restoring it too): both are looked at
                // again at the next reconciliation.
                let again = |k| matches!(&e, ControlError::Refused(r) if r.kind == k);
                if again(RefusalKind::Superseded) {
                    log::info!("restoring function {name}: another deploy of it came first ({e})");
                    continue;
                }
                log::error!("restoring function {name}: {e}");
                if !again(RefusalKind::Busy) {
                    failed.insert(fingerprint);
                }
            }
        }
    }
    serving.sort();
    Ok(serving)
}

/// What an engine's copy of a stored function is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Held {
    /// The stored spec.
    Current,
    /// Another spec, registered before the stored one was stored.
    Stale,
    /// Another spec, registered since: a deploy under way, perhaps.
    Newer,
}

fn copy_is(f: &Running, stored_fingerprint: &str, stored_ms: u64) -> Held {
    if f.spec == stored_fingerprint {
        Held::Current
    } else if f.since_ms < stored_ms {
        Held::Stale
    } else {
        Held::Newer
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Todo {
    Nothing,
    Register,
    Unregister,
}

/// What reconciliation does about one stored function on one engine
/// (`placed`: placed on it; `copy`: what it runs, if anything).
fn todo(placed: bool, copy: Option<Held>) -> Todo {
    match (placed, copy) {
        (true, None | Some(Held::Stale)) => Todo::Register,
        (false, Some(Held::Current | Held::Stale)) => Todo::Unregister,
        _ => Todo::Nothing,
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// An engine on a socket that answers `status` with one function `f`
    /// and, unless it `knows_names`, refuses `names` as an engine older
    /// than the request does (an unknown `op`); returns the ops it got.
    fn fake_engine(knows_names: bool) -> (SocketAddr, std::thread::JoinHandle<Vec<String>>) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = l.local_addr().expect("addr");
        let h = std::thread::spawn(move || {
            let (mut c, _) = l.accept().expect("accept");
            let mut ops = Vec::new();
            while let Ok(Some(Ok((req, _)))) = control::read_request(&mut c) {
                ops.push(req.op().to_string());
                let answer = match req {
                    Request::Names if !knows_names => {
                        Err(Refusal::new(RefusalKind::BadRequest, "invalid control request: unknown variant `names`"))
                    }
                    Request::Names => Ok(Reply::Names { names: vec!["f".into()] }),
                    Request::Status => Ok(Reply::Status {
                        functions: vec![control::FunctionStatus {
                            name: "f".into(),
                            spec: "v1".into(),
                            age_ms: 5,
                            runtime: "c".into(),
                            container: None,
                            launcher: control::LauncherState::Ready,
                            last_error: String::new(),
                            completed: 0,
                            failed: 0,
                            scheduler: Default::default(),
                            usage: None,
                        }],
                        pool: None,
                    }),
                    other => Err(Refusal::new(RefusalKind::BadRequest, format!("unexpected {}", other.op()))),
                };
                control::write_answer(&mut c, &answer).expect("answer");
            }
            ops
        });
        (addr, h)
    }

    #[test]
    fn the_heartbeat_asks_names_and_falls_back_to_status_on_an_older_engine() {
        // An engine that knows `names` is asked only that.
        let (addr, h) = fake_engine(true);
        let mut c = TcpStream::connect(addr).expect("connect");
        let mut no_names = false;
        for _ in 0..2 {
            assert_eq!(status_names(&mut c, &mut no_names).expect("names"), vec!["f".to_string()]);
        }
        assert!(!no_names);
        drop(c);
        assert_eq!(h.join().expect("engine"), vec!["names", "names"]);
        // An older one refuses it once, and is asked `status` from then on,
        // with the same answer for the heartbeat.
        let (addr, h) = fake_engine(false);
        let mut c = TcpStream::connect(addr).expect("connect");
        let mut no_names = false;
        for _ in 0..2 {
            assert_eq!(status_names(&mut c, &mut no_names).expect("names"), vec!["f".to_string()]);
        }
        assert!(no_names);
        drop(c);
        assert_eq!(h.join().expect("engine"), vec!["names", "status", "status"]);
    }

    #[test]
    fn reconciliation_never_undoes_a_deploy_under_way() {
        let running = |spec: &str, since_ms| Running { name: "f".into(), spec: spec.into(), since_ms };
        // Stored at t=1000 as "v2".
        assert_eq!(copy_is(&running("v2", 500), "v2", 1000), Held::Current);
        assert_eq!(copy_is(&running("v1", 500), "v2", 1000), Held::Stale);
        assert_eq!(copy_is(&running("v3", 1500), "v2", 1000), Held::Newer);
        // Placed here: missing or stale is registered; current or newer kept.
        assert_eq!(todo(true, None), Todo::Register);
        assert_eq!(todo(true, Some(Held::Stale)), Todo::Register);
        assert_eq!(todo(true, Some(Held::Current)), Todo::Nothing);
        assert_eq!(todo(true, Some(Held::Newer)), Todo::Nothing);
        // Not placed here: current or stale goes; newer (a deploy moving it
        // here, not stored yet) stays; nothing to do when it is not there.
        assert_eq!(todo(false, Some(Held::Current)), Todo::Unregister);
        assert_eq!(todo(false, Some(Held::Stale)), Todo::Unregister);
        assert_eq!(todo(false, Some(Held::Newer)), Todo::Nothing);
        assert_eq!(todo(false, None), Todo::Nothing);
    }
}
