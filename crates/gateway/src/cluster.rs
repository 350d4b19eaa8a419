//! The engines a gateway sends calls to (Nightcore §3.1: an engine per
//! server, gateways in front of them). An engine is static (`--engine`,
//! and the one `staccato up` starts) or joins at run time: it posts its
//! address to `/system/engines` and renews that every second
//! (`api::cluster`); one whose lease ([`LEASE`]) runs out, or that leaves,
//! is dropped from the table.
//!
//! The gateway owns the table; an engine owns only its own entry's renewal.
//! Every HTTP thread reads it on every call, so reads are an atomic load:
//! the table's version tells a thread that its own links are stale, and
//! only then does it take the lock (see `ThreadState::pick`).

use crate::control::ControlClient;
use crate::placement::Placements;
use crate::store::Store;
use api::cluster::{EngineRow, Join};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How long a joined engine stays in the table without renewing.
pub const LEASE: Duration = Duration::from_millis(api::cluster::LEASE_MS);
/// Engines in one table, at most.
pub const ENGINES_MAX: usize = api::cluster::ENGINES_MAX;

pub struct Engine {
    pub id: String,
    pub addr: SocketAddr,
    pub control: ControlClient,
    /// Calls this gateway has sent it and not had answered (all threads).
    pub in_flight: AtomicU64,
    /// Calls this gateway has sent it, ever.
    pub calls: AtomicU64,
    /// Internal calls it sent here for another engine to run, ever.
    pub forwarded: AtomicU64,
    pub labels: BTreeMap<String, String>,
    /// When its lease ends; `None`: static, it never does.
    lease_until: Mutex<Option<Instant>>,
    pub joined_unix_ms: u64,
}

impl Engine {
    /// Not joined: given on the command line, never dropped.
    pub fn is_static(&self) -> bool {
        self.lease_until.lock().unwrap_or_else(|p| p.into_inner()).is_none()
    }

    /// Ready for calls: the control connection is up and every stored
    /// function is on it (a late joiner gets them all before any call).
    pub fn ready(&self) -> bool {
        self.control.restored()
    }

    fn renew(&self, now: Instant) {
        let mut l = self.lease_until.lock().unwrap_or_else(|p| p.into_inner());
        if l.is_some() {
            *l = Some(now + LEASE);
        }
    }

    fn expired(&self, now: Instant) -> bool {
        self.lease_until.lock().unwrap_or_else(|p| p.into_inner()).is_some_and(|t| now >= t)
    }

    /// Milliseconds left of its lease (`None`: static).
    pub fn lease_left_ms(&self) -> Option<u64> {
        let l = *self.lease_until.lock().unwrap_or_else(|p| p.into_inner());
        l.map(|t| t.saturating_duration_since(Instant::now()).as_millis() as u64)
    }
}

/// Why a join was refused.
#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    #[error("{0}")]
    Invalid(String),
    #[error("engine {0:?} is named on the gateway's command line; a joining engine needs an id of its own")]
    Static(String),
    #[error("the table holds {ENGINES_MAX} engines, its limit")]
    Full,
}

pub struct Engines {
    list: RwLock<Arc<Vec<Arc<Engine>>>>,
    version: AtomicU64,
    /// Woken at every change of membership, after the version is bumped.
    changed: tokio::sync::Notify,
    store: Arc<Store>,
    placements: Arc<Placements>,
    secret: api::auth::Secret,
}

impl Engines {
    pub fn new(store: Arc<Store>, placements: Arc<Placements>, secret: api::auth::Secret) -> Engines {
        Engines {
            list: RwLock::new(Arc::new(Vec::new())),
            version: AtomicU64::new(1),
            changed: tokio::sync::Notify::new(),
            store,
            placements,
            secret,
        }
    }

    /// Bumped at every change of membership.
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    /// Completes at the next change of membership after it was made (made
    /// before a look at the table, it misses no change after that look).
    pub fn changed(&self) -> tokio::sync::futures::Notified<'_> {
        self.changed.notified()
    }

    fn bump(&self) {
        self.version.fetch_add(1, Ordering::AcqRel);
        self.changed.notify_waiters();
    }

    pub fn snapshot(&self) -> Arc<Vec<Arc<Engine>>> {
        self.list.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// A new entry. Functions placed on too few engines take it first, so
    /// its restore gives it them.
    fn make(
        &self,
        id: String,
        addr: SocketAddr,
        labels: BTreeMap<String, String>,
        lease_until: Option<Instant>,
        present: &[&str],
    ) -> Arc<Engine> {
        self.placements.claim(&id, &labels, present);
        let joined_unix_ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
        let placed_here = crate::control::PlacedHere { id: id.clone(), labels: labels.clone() };
        Arc::new(Engine {
            control: ControlClient::start(addr, self.secret.clone(), self.store.clone(), placed_here),
            id,
            addr,
            in_flight: AtomicU64::new(0),
            calls: AtomicU64::new(0),
            forwarded: AtomicU64::new(0),
            labels,
            lease_until: Mutex::new(lease_until),
            joined_unix_ms,
        })
    }

    /// An engine named on the command line.
    pub fn add_static(&self, addr: SocketAddr) {
        let present: Vec<String> = self.snapshot().iter().map(|e| e.id.clone()).collect();
        let present: Vec<&str> = present.iter().map(String::as_str).collect();
        let e = self.make(addr.to_string(), addr, BTreeMap::new(), None, &present);
        self.change(|l| l.push(e));
    }

    /// Adds an engine, or renews its lease; returns whether it is new. An
    /// engine that comes back under its id at another address or with
    /// other labels (restarted) replaces its old entry.
    pub fn join(&self, j: &Join) -> Result<bool, JoinError> {
        j.check().map_err(JoinError::Invalid)?;
        let now = Instant::now();
        let mut list = self.list.write().unwrap_or_else(|p| p.into_inner());
        match list.iter().find(|e| e.id == j.id) {
            Some(e) if e.addr == j.address && e.labels == j.labels => {
                e.renew(now);
                return Ok(false);
            }
            Some(e) if e.is_static() => return Err(JoinError::Static(j.id.clone())),
            Some(_) => {}
            None if list.len() >= ENGINES_MAX => return Err(JoinError::Full),
            None => {}
        }
        let present: Vec<&str> = list.iter().filter(|e| e.id != j.id).map(|e| e.id.as_str()).collect();
        let e = self.make(j.id.clone(), j.address, j.labels.clone(), Some(now + LEASE), &present);
        let mut next: Vec<Arc<Engine>> = list.iter().filter(|x| x.id != j.id).cloned().collect();
        next.push(e);
        *list = Arc::new(next);
        drop(list);
        self.bump();
        Ok(true)
    }

    /// The table as `/system/engines` shows it.
    pub fn rows(&self) -> Vec<EngineRow> {
        self.snapshot()
            .iter()
            .map(|e| EngineRow {
                id: e.id.clone(),
                address: e.addr,
                kind: if e.is_static() { "static" } else { "joined" }.into(),
                state: if e.ready() {
                    "ready"
                } else if e.control.connected() {
                    "restoring"
                } else {
                    "unreachable"
                }
                .into(),
                in_flight: e.in_flight.load(Ordering::Relaxed),
                calls: e.calls.load(Ordering::Relaxed),
                lease_left_ms: e.lease_left_ms(),
                joined_unix_ms: e.joined_unix_ms,
                labels: e.labels.clone(),
                forwarded: e.forwarded.load(Ordering::Relaxed),
                functions: e.control.serving(),
            })
            .collect()
    }

    /// Drops a joined engine (it left); false if there was none of that id.
    pub fn leave(&self, id: &str) -> bool {
        let mut gone = false;
        self.change(|l| {
            let before = l.len();
            l.retain(|e| e.id != id || e.is_static());
            gone = l.len() < before;
        });
        gone
    }

    /// Drops engines whose lease ran out; returns their ids.
    pub fn expire(&self, now: Instant) -> Vec<String> {
        if !self.snapshot().iter().any(|e| e.expired(now)) {
            return Vec::new();
        }
        let mut gone = Vec::new();
        self.change(|l| {
            l.retain(|e| {
                let keep = !e.expired(now);
                if !keep {
                    gone.push(e.id.clone());
                }
                keep
            })
        });
        gone
    }

    fn change(&self, f: impl FnOnce(&mut Vec<Arc<Engine>>)) {
        let mut list = self.list.write().unwrap_or_else(|p| p.into_inner());
        let mut next = (**list).clone();
        f(&mut next);
        *list = Arc::new(next);
        drop(list);
        self.bump();
    }
}

/// A call counted in its engine's `in_flight` until it is answered or
/// abandoned (the client went away: the future is dropped).
pub struct InFlight<'a>(&'a Engine);

impl InFlight<'_> {
    pub fn new(e: &Engine) -> InFlight<'_> {
        e.in_flight.fetch_add(1, Ordering::Relaxed);
        e.calls.fetch_add(1, Ordering::Relaxed);
        InFlight(e)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Drops expired engines, every quarter of a second, on a thread of its own.
pub fn start_expiry(engines: Arc<Engines>) {
    let spawned = std::thread::Builder::new().name("gateway-engines".into()).spawn(move || loop {
        std::thread::sleep(Duration::from_millis(250));
        for id in engines.expire(Instant::now()) {
            log::warn!("engine {id} dropped from the table: no renewal within {} ms", LEASE.as_millis());
        }
    });
    if let Err(e) = spawned {
        log::error!("gateway: cannot start the engine table's expiry: {e}");
    }
}
