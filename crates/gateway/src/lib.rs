//! The Staccato gateway: the HTTP front door. External calls arrive here and
//! go to one of the engines over a persistent TCP connection (Nightcore
//! §3.1); internal calls never pass through it (§3.2).
//!
//! Threads: `threads` HTTP threads, each a current-thread tokio runtime with
//! its own SO_REUSEPORT listener and its own connection to each engine, so a
//! request is parsed, forwarded and answered on one thread (and, pinned, one
//! vCPU). Each call goes to the engine with the fewest calls in flight from
//! this gateway (Nightcore's least-load pick), among those that are ready.
//! Management requests go to every engine, through a control thread each.
//! The engines are static (`--engine`) or join at run time ([`cluster`]);
//! a function runs on every engine unless its placement says otherwise
//! ([`placement`]). An internal call whose callee is not on the caller's
//! server comes up the caller's engine link and goes on to an engine that
//! runs it ([`forward`]).
#![forbid(unsafe_code)]

mod async_http;
mod callback;
mod calls;
pub mod cluster;
mod control;
mod dashboard;
mod engine_link;
mod etcd;
mod forward;
mod grpc;
pub mod http;
pub mod inputs;
mod keys;
mod metrics;
pub mod placement;
mod secrets;
pub mod store;

pub use callback::Cidr;
pub use calls::AsyncConfig;
use cluster::{Engine, Engines};
use engine_link::{EngineLink, ForwardTx};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use placement::Placements;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use store::Store;

#[derive(Clone, Debug)]
pub struct GatewayConfig {
    pub listen: SocketAddr,
    /// Engines named on the command line (more may join).
    pub engines: Vec<SocketAddr>,
    pub threads: usize,
    /// Required on `/system/*` when set; must be set to listen beyond loopback.
    pub token: Option<String>,
    pub state_dir: PathBuf,
    pub payload_len_max: usize,
    /// Pin HTTP thread i to the i-th allowed CPU (see engine `Placement`).
    pub pin_threads: bool,
    /// The engine's secret: every connection to it proves it (api::auth).
    pub engine_secret: api::auth::Secret,
    /// Open client connections at most (all threads together); beyond it a
    /// few more are served for management only, and calls get 503.
    pub connections_max: usize,
    /// A connection that sends no complete request head for this long is
    /// closed: idle between requests, or sending its headers too slowly.
    pub idle_timeout: std::time::Duration,
    /// The shared store (`etcd://...`), or `None`: the embedded one.
    pub store_url: Option<String>,
    /// The key that seals secrets (`None`: `<state_dir>/secrets.key`).
    pub secrets_key_file: Option<PathBuf>,
    /// Asynchronous calls: bounds, retention, callbacks.
    pub async_calls: calls::AsyncConfig,
    /// Where gRPC calls are taken (h2c), if anywhere ([`grpc`]).
    pub grpc_listen: Option<SocketAddr>,
    /// The listeners are bound here but accepted on by another front door
    /// (the engine's, in `staccato up`): see [`Gateway::take_listeners`].
    /// It hands the connections it does not serve to [`Gateway::adopt`].
    pub front_door_elsewhere: bool,
}

/// Connections served beyond `connections_max`, for management only: an
/// operator can still look and act when the gateway is full.
const RESERVE_CONNECTIONS: usize = 32;

#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    #[error("refusing to listen on {0} without a management token (set --token or STACCATO_TOKEN)")]
    NoToken(SocketAddr),
    #[error("listening on {0}: {1}")]
    Listen(SocketAddr, std::io::Error),
    #[error("listening for gRPC on {0}: {1}")]
    ListenGrpc(SocketAddr, std::io::Error),
    #[error(transparent)]
    Store(#[from] store::StoreError),
    #[error(transparent)]
    Vault(#[from] secrets::VaultError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

pub struct Gateway {
    pub addr: SocketAddr,
    sh: Arc<GwShared>,
    /// Per HTTP thread: connections handed over by another front door.
    adopt: Vec<tokio::sync::mpsc::UnboundedSender<Adopted>>,
    /// With `front_door_elsewhere`: the listeners, until taken.
    listeners: std::sync::Mutex<Vec<std::net::TcpListener>>,
}

/// A client connection another front door read from and hands over, with
/// the bytes it read and did not answer (a request it leaves to the
/// gateway, or the start of one).
struct Adopted {
    stream: std::net::TcpStream,
    read: Vec<u8>,
}

/// A connection's count, held by another front door while it serves it.
pub struct ConnectionSlot(#[allow(dead_code)] Slot);

impl Gateway {
    /// The listeners the gateway bound and did not accept on
    /// (`front_door_elsewhere`), one per HTTP thread, all on `addr`.
    pub fn take_listeners(&self) -> Vec<std::net::TcpListener> {
        std::mem::take(&mut *self.listeners.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Serves a connection another front door accepted, from HTTP thread
    /// `thread` (mod the number of threads) on: `read` is what was read
    /// from it and not answered. The connection counts as the gateway's
    /// own from here on (the limit and its management reserve apply).
    pub fn adopt(&self, thread: usize, stream: std::net::TcpStream, read: Vec<u8>) {
        let tx = &self.adopt[thread % self.adopt.len()];
        if tx.send(Adopted { stream, read }).is_err() {
            log::error!("gateway thread {thread} is gone; closing a connection handed to it");
        }
    }

    /// A place among the open connections (`connections_max`) for one
    /// another front door serves, given back when dropped; `None` when
    /// the gateway is full (hand the connection over: the gateway answers
    /// it from its management reserve, or closes it).
    pub fn admit(&self) -> Option<ConnectionSlot> {
        if self.sh.connections.fetch_add(1, Ordering::AcqRel) < self.sh.cfg.connections_max {
            return Some(ConnectionSlot(Slot { sh: self.sh.clone(), reserve: false }));
        }
        self.sh.connections.fetch_sub(1, Ordering::AcqRel);
        None
    }

    /// Whether the gateway knows exactly one engine: with more, external
    /// calls are the gateway's to balance between them. If it does, runs
    /// `f` with that engine's id.
    pub fn sole_engine(&self, f: &mut dyn FnMut(&str)) -> bool {
        let engines = self.sh.engines.snapshot();
        match engines.as_slice() {
            [e] => {
                f(&e.id);
                true
            }
            _ => false,
        }
    }

    /// Records a call another front door answered, in `/metrics`, with
    /// the engine's timing of it.
    pub fn record(
        &self,
        thread: usize,
        function: &str,
        outcome: &'static str,
        latency_s: f64,
        timing: wire::frame::Timing,
    ) {
        self.sh.metrics.record(thread, function, outcome, latency_s, Some(timing));
    }

    /// Whether the gateway answers only requests addressed to a loopback
    /// name (it listens on loopback).
    pub fn loopback_only(&self) -> bool {
        self.sh.cfg.listen.ip().is_loopback()
    }

    /// Stops starting asynchronous calls and waits for those running (up
    /// to the drain time) and for their results to be stored: call before
    /// the engines stop.
    pub fn stop_async(&self) {
        self.sh.calls.stop();
    }

    /// How long a connection may stay silent before its head is complete.
    pub fn idle_timeout(&self) -> std::time::Duration {
        self.sh.cfg.idle_timeout
    }

    /// Counts a client connection the engine's front door moved to the I/O
    /// thread of the vCPU its client now sends from (`/metrics`).
    pub fn front_door_followed(&self) {
        self.sh.front_door_moves.fetch_add(1, Ordering::Relaxed);
    }
}

pub(crate) struct GwShared {
    pub cfg: GatewayConfig,
    /// Client connections open now, and those in the management reserve.
    pub connections: AtomicUsize,
    pub reserve: AtomicUsize,
    /// When the full-gateway warning was last logged (seconds since start).
    pub warned_full_s: AtomicU64,
    /// Client connections the engine's front door moved between its I/O
    /// threads to follow their client.
    pub front_door_moves: AtomicU64,
    pub store: Arc<Store>,
    pub metrics: metrics::Metrics,
    pub engines: Arc<Engines>,
    pub placements: Arc<Placements>,
    /// Functions that need an invoke key, and their keys' digests.
    pub keys: Arc<keys::Keys>,
    /// The asynchronous calls' queue.
    pub calls: Arc<calls::Calls>,
    /// The dashboard's latest snapshot and its open streams.
    pub dashboard: dashboard::Board,
}

/// Per-thread state: the thread's links to the engines and call id counter.
pub(crate) struct ThreadState {
    links: RefCell<Vec<Link>>,
    /// The table version `links` was made from.
    seen: Cell<u64>,
    /// Functions with a placement: the indexes in `links` of the engines
    /// that run them. A function not here runs on every engine.
    routes: RefCell<HashMap<String, Rc<[usize]>>>,
    /// The placements' version `routes` was made from.
    seen_routes: Cell<u64>,
    forwards: ForwardTx,
    /// Where the next least-load scan starts, so ties rotate.
    turn: Cell<usize>,
    next_seq: Cell<u64>,
    /// 24 random bits of every call id this thread makes.
    tag: u64,
    thread: u64,
}

/// One engine, and this thread's data connection to it.
#[derive(Clone)]
pub(crate) struct Link {
    pub engine: Arc<Engine>,
    pub link: Rc<EngineLink>,
}

impl ThreadState {
    /// The engine for the next call of `name`: among the ready ones that
    /// run it, the one with the fewest calls in flight from this gateway;
    /// ties go round in turn. `except`: engines left out (a forward's
    /// caller, which does not have the function; an engine that could not
    /// take the call).
    pub fn pick(&self, sh: &GwShared, name: &str, except: &[&Arc<Engine>]) -> Option<Link> {
        self.sync(sh);
        let links = self.links.borrow();
        let usable = |l: &Link| l.link.is_up() && l.engine.ready() && !except.iter().any(|x| Arc::ptr_eq(x, &l.engine));
        let routes = self.routes.borrow();
        let placed = if routes.is_empty() { None } else { routes.get(name) };
        match (placed, links.as_slice()) {
            (None, []) => None,
            (None, [one]) => usable(one).then(|| one.clone()),
            (None, _) => {
                let start = self.turn.get();
                self.turn.set(start.wrapping_add(1));
                let n = links.len();
                (0..n)
                    .map(|i| &links[(start + i) % n])
                    .filter(|l| usable(l))
                    .min_by_key(|l| l.engine.in_flight.load(Ordering::Relaxed))
                    .cloned()
            }
            (Some(ix), _) => {
                let n = ix.len().max(1);
                let start = self.turn.get();
                self.turn.set(start.wrapping_add(1));
                (0..ix.len())
                    .map(|i| &links[ix[(start + i) % n]])
                    .filter(|l| usable(l))
                    .min_by_key(|l| l.engine.in_flight.load(Ordering::Relaxed))
                    .cloned()
            }
        }
    }

    /// Sends a call of `name` (`send`) to the engine `pick` gives;
    /// if that engine cannot have started it (its frame never left, or it
    /// does not have the function yet: it is being restored), once more to
    /// another, with what is left of `timeout_ms` (0: the function's own
    /// timeout; a call whose time ran out is not sent again). The last
    /// answer and the engine that gave it; `None` if no engine was ready.
    pub async fn send_call<F, Fut>(
        &self,
        sh: &GwShared,
        name: &str,
        (except, timeout_ms): (Option<&Arc<Engine>>, u32),
        send: F,
    ) -> Option<(engine_link::Reply, Arc<Engine>)>
    where
        F: Fn(Link, u32) -> Fut,
        Fut: std::future::Future<Output = engine_link::Reply>,
    {
        use engine_link::Reply;
        let started = std::time::Instant::now();
        let first = match self.pick(sh, name, except.as_slice()) {
            Some(l) => l,
            None => self.pick_once_linked(sh, name, except.as_slice()).await?,
        };
        let engine = first.engine.clone();
        let reply = {
            let _counted = cluster::InFlight::new(&engine);
            send(first, timeout_ms).await
        };
        // What is left of the caller's time; a retry may come a second
        // after the first try (a link found dead), and must not outlive it.
        let left = match timeout_ms {
            0 => Some(0),
            t => u32::try_from(u128::from(t).saturating_sub(started.elapsed().as_millis())).ok().filter(|&l| l > 0),
        };
        let again = match &reply {
            Reply::Unsent => true,
            Reply::Err(wire::ErrorKind::NotFound, ..) => sh.store.get(name).is_ok_and(|s| s.is_some()),
            _ => false,
        };
        // The second engine must be another one than the first (and the
        // caller's): a call is sent at most twice, and never twice to one
        // engine.
        let other = if again && left.is_some() {
            let mut not = except.as_slice().to_vec();
            not.push(&engine);
            self.pick(sh, name, &not)
        } else {
            None
        };
        let Some(second) = other else { return Some((reply, engine)) };
        log::debug!(
            "a call of {name} that engine {} cannot have started goes to engine {}",
            engine.id,
            second.engine.id
        );
        let engine = second.engine.clone();
        let reply = {
            let _counted = cluster::InFlight::new(&engine);
            send(second, left.unwrap_or(1)).await
        };
        Some((reply, engine))
    }

    /// `pick`, for a call that found no link up: an engine that is ready
    /// while this thread's link to it is still connecting (the gateway or
    /// the engine just started, the link is being made again) is waited
    /// for, up to [`LINK_WAIT`], rather than the call refused at once.
    async fn pick_once_linked(&self, sh: &GwShared, name: &str, except: &[&Arc<Engine>]) -> Option<Link> {
        let deadline = std::time::Instant::now() + LINK_WAIT;
        loop {
            let connecting = self
                .links
                .borrow()
                .iter()
                .any(|l| !l.link.is_up() && l.engine.ready() && !except.iter().any(|x| Arc::ptr_eq(x, &l.engine)));
            if !connecting || std::time::Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            if let Some(l) = self.pick(sh, name, except) {
                return Some(l);
            }
        }
    }

    /// The engine behind one of this thread's links.
    pub fn engine_of(&self, link: &Rc<EngineLink>) -> Option<Arc<Engine>> {
        self.links.borrow().iter().find(|l| Rc::ptr_eq(&l.link, link)).map(|l| l.engine.clone())
    }

    /// Whether any engine could take a call now.
    pub fn any_ready(&self, sh: &GwShared) -> bool {
        self.sync(sh);
        self.links.borrow().iter().any(|l| l.link.is_up() && l.engine.ready())
    }

    /// Brings this thread's links in line with the engine table: a link to
    /// each engine, made when it joins and closed when it leaves.
    fn sync(&self, sh: &GwShared) {
        let version = sh.engines.version();
        let routes_version = sh.placements.version();
        if version == self.seen.get() && routes_version == self.seen_routes.get() {
            return;
        }
        if version != self.seen.get() {
            let table = sh.engines.snapshot();
            let mut links = self.links.borrow_mut();
            let mut next = Vec::with_capacity(table.len());
            for e in table.iter() {
                match links.iter().position(|l| Arc::ptr_eq(&l.engine, e)) {
                    Some(i) => next.push(links.swap_remove(i)),
                    None => next.push(Link {
                        engine: e.clone(),
                        link: EngineLink::start(
                            e.addr,
                            sh.cfg.engine_secret.clone(),
                            self.thread as u32,
                            self.forwards.clone(),
                        ),
                    }),
                }
            }
            for gone in links.drain(..) {
                gone.link.close();
            }
            *links = next;
            self.seen.set(version);
        }
        // Read after the table: a route made from an older table only
        // names engines that the next sync corrects.
        let links = self.links.borrow();
        let routes = sh
            .placements
            .snapshot()
            .into_iter()
            .map(|(name, r)| {
                let ix: Rc<[usize]> =
                    (0..links.len()).filter(|&i| r.serves(&links[i].engine.id, &links[i].engine.labels)).collect();
                (name, ix)
            })
            .collect();
        *self.routes.borrow_mut() = routes;
        self.seen_routes.set(routes_version);
    }

    /// This HTTP thread's index.
    pub fn index(&self) -> usize {
        self.thread as usize
    }

    /// Gateway call ids (docs/protocol.md, "Call ids"): bit 63 set, the
    /// thread index in bits 56..63, this thread's random tag in bits 32..56
    /// and a counter below. An engine refuses an id already in flight, so
    /// the tag keeps two gateways sending to one engine (or a gateway
    /// restarted while its old calls run) from meeting: their tags differ
    /// but for a chance of 1 in 2^24. The counter wraps after 2^32 calls,
    /// long after any call that used the id has ended.
    pub fn next_call_id(&self) -> u64 {
        let seq = self.next_seq.get();
        self.next_seq.set(seq.wrapping_add(1));
        wire::GATEWAY_CALL_ID_BIT | (self.thread << 56) | (self.tag << 32) | (seq & 0xffff_ffff)
    }
}

/// 24 random bits (from /dev/urandom; the clock and pid if it cannot be
/// read) for a thread's call ids.
fn call_id_tag() -> u64 {
    let mut b = [0u8; 8];
    let random = std::fs::File::open("/dev/urandom").and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b));
    let bits = match random {
        Ok(()) => u64::from_le_bytes(b),
        Err(_) => {
            let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
            (t as u64) ^ (u64::from(std::process::id()) << 20)
        }
    };
    bits & 0xff_ffff
}

/// How long a call waits for this thread's link to a ready engine to come
/// up (`ThreadState::pick_once_linked`).
const LINK_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// How often a shared store's revision is read.
const WATCH_EVERY: std::time::Duration = std::time::Duration::from_millis(500);

/// With a store other gateways write too: when its revision changes, reads
/// the placements and invoke keys again and has every engine reconciled
/// with it (a deploy through another gateway reaches the engines that joined
/// only this one).
/// While the store is unreachable, nothing changes here; it is said once.
fn watch_store(store: Arc<Store>, placements: Arc<Placements>, engines: Arc<Engines>, keys: Arc<keys::Keys>) {
    if !store.shared() {
        return; // only this gateway writes it
    }
    let run = move || {
        let mut seen = None;
        let mut down = false;
        loop {
            std::thread::sleep(WATCH_EVERY);
            let r = match store.revision() {
                Ok(r) => r,
                Err(e) => {
                    if !std::mem::replace(&mut down, true) {
                        log::error!("{e}");
                    }
                    continue;
                }
            };
            if std::mem::replace(&mut down, false) {
                log::info!("the shared function store is reachable again");
            }
            if r == seen {
                continue;
            }
            // Keys made or revoked, and `auth` changed, through another
            // gateway: in force here within WATCH_EVERY. Read again at the
            // next tick if the read failed.
            let keys_read = keys.refresh();
            match placements.reload() {
                // A deploy here changed a route while the store was read:
                // read again at the next tick.
                Ok(None) => {}
                Ok(Some(_)) => {
                    if keys_read {
                        seen = r;
                    }
                    for e in engines.snapshot().iter() {
                        e.control.nudge();
                    }
                }
                Err(e) => log::warn!("reading placements from the store: {e}"),
            }
        }
    };
    std::thread::Builder::new().name("gateway-store-watch".into()).spawn(run).expect("spawning the store watcher");
}

pub fn start(cfg: GatewayConfig) -> Result<Gateway, GatewayError> {
    if !cfg.listen.ip().is_loopback() && cfg.token.as_deref().is_none_or(str::is_empty) {
        return Err(GatewayError::NoToken(cfg.listen));
    }
    std::fs::create_dir_all(&cfg.state_dir)?;
    let key_file = cfg.secrets_key_file.clone().unwrap_or_else(|| cfg.state_dir.join("secrets.key"));
    let vault = secrets::Vault::open(&key_file)?;
    let store = Arc::new(
        match &cfg.store_url {
            None => Store::open(&cfg.state_dir.join("functions.redb"))?,
            Some(url) => Store::with(Box::new(etcd::Etcd::connect(url)?), cfg.state_dir.join("sources"))?,
        }
        .with_vault(vault),
    );
    log::info!("function store: {}", store.describe());
    let placements = Arc::new(Placements::load(store.clone())?);
    let keys = Arc::new(keys::Keys::load(store.clone())?);
    let engines = Arc::new(Engines::new(store.clone(), placements.clone(), cfg.engine_secret.clone()));
    for addr in &cfg.engines {
        engines.add_static(*addr);
    }
    cluster::start_expiry(engines.clone());
    watch_store(store.clone(), placements.clone(), engines.clone(), keys.clone());
    let threads = cfg.threads.max(1);
    // Bind the first listener here so an address in use is reported to the
    // caller, and so port 0 resolves to one port every thread shares.
    let first = bind(cfg.listen).map_err(|e| GatewayError::Listen(cfg.listen, e))?;
    let addr = first.local_addr()?;
    let calls = calls::Calls::open(store.clone(), cfg.async_calls.clone(), &cfg.state_dir, addr)?;
    let sh = Arc::new(GwShared {
        cfg,
        store,
        metrics: metrics::Metrics::new(threads),
        engines,
        placements,
        keys,
        calls,
        connections: AtomicUsize::new(0),
        reserve: AtomicUsize::new(0),
        warned_full_s: AtomicU64::new(0),
        front_door_moves: AtomicU64::new(0),
        dashboard: dashboard::Board::default(),
    });
    let cpus = sys::cpu::cpus_allowed();
    let mut listeners = vec![first];
    for _ in 1..threads {
        listeners.push(bind(addr).map_err(|e| GatewayError::Listen(addr, e))?);
    }
    // gRPC: a listener per thread too, on the port the first one took.
    let mut grpc_listeners = Vec::new();
    if let Some(g) = sh.cfg.grpc_listen.filter(|g| g.port() == addr.port()) {
        // Both would take connections (SO_REUSEPORT): the kernel would
        // split them between HTTP/1.1 and gRPC at random.
        let why = format!("{addr} is the HTTP address; gRPC needs a port of its own");
        return Err(GatewayError::ListenGrpc(g, std::io::Error::other(why)));
    }
    if let Some(g) = sh.cfg.grpc_listen {
        let first = bind(g).map_err(|e| GatewayError::ListenGrpc(g, e))?;
        let at = first.local_addr()?;
        grpc_listeners.push(first);
        for _ in 1..threads {
            grpc_listeners.push(bind(at).map_err(|e| GatewayError::ListenGrpc(at, e))?);
        }
        log::info!("gRPC calls on {at} (h2c)");
    }
    let mut grpc_listeners = grpc_listeners.into_iter();
    let elsewhere = sh.cfg.front_door_elsewhere;
    let mut kept = Vec::new();
    let mut adopt = Vec::new();
    for (i, l) in listeners.into_iter().enumerate() {
        let sh = sh.clone();
        let cpu = sh.cfg.pin_threads.then(|| cpus[i % cpus.len()]);
        // Connections from a client on CPU c go to the thread pinned to c.
        if let Some(c) = cpu {
            if let Err(e) = socket2::SockRef::from(&l).set_cpu_affinity(c) {
                log::warn!("SO_INCOMING_CPU on gateway listener {i}: {e}");
            }
        }
        let l = if elsewhere {
            kept.push(l);
            None
        } else {
            Some(l)
        };
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        adopt.push(tx);
        let g = grpc_listeners.next();
        std::thread::Builder::new().name(format!("gateway-{i}")).spawn(move || serve_thread(sh, i, (l, g), rx, cpu))?;
    }
    let sh2 = sh.clone();
    std::thread::Builder::new().name("gateway-async".into()).spawn(move || async_thread(sh2, threads))?;
    Ok(Gateway { addr, sh, adopt, listeners: std::sync::Mutex::new(kept) })
}

/// Runs the asynchronous calls on links of its own to the engines (its
/// index follows the HTTP threads', for its call ids).
fn async_thread(sh: Arc<GwShared>, idx: usize) {
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            log::error!("gateway async thread: {e}; async calls are accepted but not run");
            return;
        }
    };
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async move {
        let th = thread_state(&sh, idx.min(63));
        sh.calls.clone().dispatch(sh.clone(), th).await;
    });
}

/// How often a thread brings its links and routes up to date even if no
/// change of the engine table woke it.
const SYNC_AT_LEAST_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// A thread's links to the engines, kept in line with the engine table,
/// and the internal calls the engines forward on them, each run on a task
/// of its own. Call from within the thread's `LocalSet`.
fn thread_state(sh: &Arc<GwShared>, idx: usize) -> Rc<ThreadState> {
    let (forwards, mut forwarded) = tokio::sync::mpsc::unbounded_channel();
    let th = Rc::new(ThreadState {
        links: RefCell::new(Vec::new()),
        seen: Cell::new(0),
        routes: RefCell::new(HashMap::new()),
        seen_routes: Cell::new(0),
        forwards,
        turn: Cell::new(idx),
        next_seq: Cell::new(0),
        thread: idx as u64 & 0x7f,
        tag: call_id_tag(),
    });
    // Links to the engines known now, before the first request, and to
    // those that join later, before their first call: woken by each change
    // of the table (it used to look every 100 ms, 10 wake-ups a second
    // per thread on an idle gateway), and now and then, for routes, which
    // a request's `pick` brings up to date anyway.
    th.sync(sh);
    let (sh2, th2) = (sh.clone(), th.clone());
    tokio::task::spawn_local(async move {
        loop {
            let changed = sh2.engines.changed();
            th2.sync(&sh2);
            tokio::select! {
                () = changed => {}
                () = tokio::time::sleep(SYNC_AT_LEAST_EVERY) => {}
            }
        }
    });
    let (sh2, th2) = (sh.clone(), th.clone());
    tokio::task::spawn_local(async move {
        while let Some(f) = forwarded.recv().await {
            tokio::task::spawn_local(forward::run(sh2.clone(), th2.clone(), f));
        }
    });
    th
}

/// A connection's place in the count; given back when it closes.
struct Slot {
    sh: Arc<GwShared>,
    reserve: bool,
}

impl Slot {
    /// A place for a new connection: an ordinary one, one of the reserve
    /// (management only), or none (the connection is closed at once).
    fn take(sh: &Arc<GwShared>, started: std::time::Instant) -> Option<Slot> {
        if sh.connections.fetch_add(1, Ordering::AcqRel) < sh.cfg.connections_max {
            return Some(Slot { sh: sh.clone(), reserve: false });
        }
        sh.connections.fetch_sub(1, Ordering::AcqRel);
        let now_s = started.elapsed().as_secs() + 1;
        let last = sh.warned_full_s.load(Ordering::Relaxed);
        if (last == 0 || now_s >= last + 10)
            && sh.warned_full_s.compare_exchange(last, now_s, Ordering::AcqRel, Ordering::Relaxed).is_ok()
        {
            log::warn!(
                "gateway: {} client connections are open, the limit (--max-connections); new ones are answered \
                 503, except management requests",
                sh.cfg.connections_max
            );
        }
        if sh.reserve.fetch_add(1, Ordering::AcqRel) < RESERVE_CONNECTIONS {
            return Some(Slot { sh: sh.clone(), reserve: true });
        }
        sh.reserve.fetch_sub(1, Ordering::AcqRel);
        None
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let counter = if self.reserve { &self.sh.reserve } else { &self.sh.connections };
        counter.fetch_sub(1, Ordering::AcqRel);
    }
}

fn bind(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    use socket2::{Domain, Socket, Type};
    let s = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    s.set_reuse_address(true)?;
    s.set_reuse_port(true)?;
    s.bind(&addr.into())?;
    s.listen(1024)?;
    s.set_nonblocking(true)?;
    Ok(s.into())
}

fn serve_thread(
    sh: Arc<GwShared>,
    idx: usize,
    (listener, grpc_listener): (Option<std::net::TcpListener>, Option<std::net::TcpListener>),
    mut adopted: tokio::sync::mpsc::UnboundedReceiver<Adopted>,
    cpu: Option<usize>,
) {
    if let Some(c) = cpu {
        let _ = sys::cpu::set_affinity(0, &[c]);
    }
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            log::error!("gateway thread {idx}: {e}");
            return;
        }
    };
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async move {
        let listener = match listener.map(tokio::net::TcpListener::from_std).transpose() {
            Ok(l) => l,
            Err(e) => {
                log::error!("gateway thread {idx}: {e}");
                return;
            }
        };
        let th = thread_state(&sh, idx);
        if let Some(g) = grpc_listener {
            match tokio::net::TcpListener::from_std(g) {
                Ok(g) => {
                    tokio::task::spawn_local(serve_grpc(sh.clone(), th.clone(), g));
                }
                Err(e) => log::error!("gateway thread {idx}: gRPC listener: {e}"),
            }
        }
        let started = std::time::Instant::now();
        loop {
            let accepted = async {
                match &listener {
                    Some(l) => Some(l.accept().await),
                    None => std::future::pending().await,
                }
            };
            let (stream, read) = tokio::select! {
                a = accepted => match a {
                    Some(Ok((s, _))) => (s, Vec::new()),
                    Some(Err(e)) => {
                        // Out of file descriptors, most likely: let some close.
                        log::warn!("gateway thread {idx}: accept: {e}");
                        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                        continue;
                    }
                    None => continue,
                },
                a = adopted.recv() => match a.map(|a| (tokio::net::TcpStream::from_std(a.stream), a.read)) {
                    Some((Ok(s), read)) => (s, read),
                    Some((Err(e), _)) => {
                        log::warn!("gateway thread {idx}: a connection handed over: {e}");
                        continue;
                    }
                    // The sender lives as long as the Gateway: none here.
                    None => std::future::pending().await,
                },
            };
            let _ = stream.set_nodelay(true);
            let Some(slot) = Slot::take(&sh, started) else { continue };
            let (sh, th) = (sh.clone(), th.clone());
            tokio::task::spawn_local(async move {
                let management_only = slot.reserve;
                let svc = service_fn(move |req| {
                    let (sh, th) = (sh.clone(), th.clone());
                    async move { Ok::<_, Infallible>(http::serve(sh, th, req, management_only).await) }
                });
                let mut b = http1::Builder::new();
                b.timer(hyper_util::rt::TokioTimer::new())
                    .header_read_timeout(slot.sh.cfg.idle_timeout)
                    .keep_alive(!management_only);
                let _ = b.serve_connection(TokioIo::new(Prefixed { read, at: 0, stream }), svc).await;
                drop(slot);
            });
        }
    });
}

/// Accepts gRPC connections (HTTP/2 without TLS) and serves each on a task
/// of this thread. They count among the open connections; beyond the
/// limit one is closed at once (gRPC carries calls only, not management).
async fn serve_grpc(sh: Arc<GwShared>, th: Rc<ThreadState>, listener: tokio::net::TcpListener) {
    let started = std::time::Instant::now();
    loop {
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                log::warn!("gateway thread {}: gRPC accept: {e}", th.index());
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let Some(slot) = Slot::take(&sh, started) else { continue };
        if slot.reserve {
            continue;
        }
        let (sh, th) = (sh.clone(), th.clone());
        tokio::task::spawn_local(async move {
            // Streams open now, and when the last one ended (or the
            // connection came): a connection with none for the idle time
            // is closed, as an idle HTTP/1.1 one is.
            let active = Rc::new(Cell::new(0usize));
            let quiet_since = Rc::new(Cell::new(std::time::Instant::now()));
            let idle = sh.cfg.idle_timeout;
            let (a, q) = (active.clone(), quiet_since.clone());
            let svc = service_fn(move |req| {
                let (sh, th, a, q) = (sh.clone(), th.clone(), a.clone(), q.clone());
                a.set(a.get() + 1);
                async move {
                    let r = grpc::handle(sh, th, req).await;
                    a.set(a.get() - 1);
                    q.set(std::time::Instant::now());
                    Ok::<_, Infallible>(r)
                }
            });
            let mut b = hyper::server::conn::http2::Builder::new(grpc::LocalExec);
            b.timer(hyper_util::rt::TokioTimer::new())
                .max_concurrent_streams(32)
                .max_header_list_size(16 << 10)
                .keep_alive_interval(Some(std::time::Duration::from_secs(30)));
            let conn = b.serve_connection(TokioIo::new(stream), svc);
            tokio::pin!(conn);
            let mut closing: Option<std::time::Instant> = None;
            loop {
                tokio::select! {
                    _ = &mut conn => break,
                    () = tokio::time::sleep(std::time::Duration::from_secs(1)) => match closing {
                        // Told to go and still here: dropped.
                        Some(t) if t.elapsed() > std::time::Duration::from_secs(5) => break,
                        Some(_) => {}
                        None if active.get() == 0 && quiet_since.get().elapsed() >= idle => {
                            conn.as_mut().graceful_shutdown();
                            closing = Some(std::time::Instant::now());
                        }
                        None => {}
                    },
                }
            }
            drop(slot);
        });
    }
}

/// A client connection with bytes already read from it (by another front
/// door) that are served first.
struct Prefixed {
    read: Vec<u8>,
    at: usize,
    stream: tokio::net::TcpStream,
}

impl tokio::io::AsyncRead for Prefixed {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        if self.at < self.read.len() {
            let n = buf.remaining().min(self.read.len() - self.at);
            let at = self.at;
            buf.put_slice(&self.read[at..at + n]);
            self.at += n;
            if self.at == self.read.len() {
                self.read = Vec::new();
                self.at = 0;
            }
            return std::task::Poll::Ready(Ok(()));
        }
        std::pin::Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for Prefixed {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}
