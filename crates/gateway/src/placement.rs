//! Where each function runs. By default on every engine; a function's
//! `placement` may ask for engines with some labels, or for a number of
//! engines, which the gateway chooses at deploy time and keeps in its
//! store (an engine that comes back under its id gets its functions back).
//!
//! Only functions with a placement have a [`Route`]; calls to the others
//! go to any ready engine, with no lookup beyond an empty-map check.

use crate::cluster::Engine;
use crate::store::{Store, StoreError};
use api::spec::{FunctionSpec, Placement};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

/// After a gateway starts, engines rejoin in any order within a renewal or
/// two; until this has passed, none takes a function chosen for another
/// (which is only late, not gone).
pub const REJOIN_GRACE: Duration = Duration::from_millis(2 * api::cluster::LEASE_MS);

/// Where one function with a placement runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    pub placement: Placement,
    /// With `placement.engines` > 0: the engines chosen for it (some may
    /// be away). Otherwise empty: every engine the labels admit.
    pub chosen: Vec<String>,
}

impl Route {
    pub fn serves(&self, id: &str, labels: &BTreeMap<String, String>) -> bool {
        self.placement.admits(labels) && (self.placement.engines == 0 || self.chosen.iter().any(|c| c == id))
    }
}

/// Why a function cannot be placed.
#[derive(Debug, thiserror::Error)]
#[error("function {name}: {why}")]
pub struct Unplaceable {
    pub name: String,
    pub why: String,
}

pub struct Placements {
    routes: RwLock<HashMap<String, Arc<Route>>>,
    /// Bumped at every change, so HTTP threads rebuild their routes.
    version: AtomicU64,
    store: Arc<Store>,
    /// No claims before this (`REJOIN_GRACE` after start).
    claims_from: Instant,
}

impl Placements {
    /// The routes of the stored functions.
    pub fn load(store: Arc<Store>) -> Result<Placements, StoreError> {
        Ok(Placements {
            routes: RwLock::new(Placements::read(&store)?),
            version: AtomicU64::new(1),
            store,
            claims_from: Instant::now() + REJOIN_GRACE,
        })
    }

    fn read(store: &Store) -> Result<HashMap<String, Arc<Route>>, StoreError> {
        let chosen: HashMap<String, Vec<String>> = store.placements()?.into_iter().collect();
        let mut routes = HashMap::new();
        for spec in store.list()? {
            if !spec.placement.is_everywhere() {
                let chosen = chosen.get(&spec.name).cloned().unwrap_or_default();
                routes.insert(spec.name.clone(), Arc::new(Route { placement: spec.placement, chosen }));
            }
        }
        Ok(routes)
    }

    /// Reads every route again from the store (another gateway sharing it
    /// changed it): `Some(changed)`, or `None` if a route changed here
    /// while the store was read (what was read may be older than it; the
    /// caller reads again).
    pub fn reload(&self) -> Result<Option<bool>, StoreError> {
        let before = self.version();
        let next = Placements::read(&self.store)?;
        let mut routes = self.routes.write().unwrap_or_else(|p| p.into_inner());
        if self.version() != before {
            return Ok(None);
        }
        if *routes == next {
            return Ok(Some(false));
        }
        *routes = next;
        self.version.fetch_add(1, Ordering::AcqRel);
        Ok(Some(true))
    }

    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    pub fn snapshot(&self) -> HashMap<String, Arc<Route>> {
        self.routes.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Whether the engine `id` with `labels` runs `name` (every engine runs
    /// a function without a placement).
    pub fn serves(&self, name: &str, id: &str, labels: &BTreeMap<String, String>) -> bool {
        self.routes.read().unwrap_or_else(|p| p.into_inner()).get(name).is_none_or(|r| r.serves(id, labels))
    }

    /// Where a function being deployed goes, among `table`: `None` when it
    /// runs everywhere. A redeploy keeps the engines it had that are still
    /// here and admitted, then takes ready engines running the fewest
    /// placed functions.
    pub fn decide(&self, spec: &FunctionSpec, table: &[Arc<Engine>]) -> Result<Option<Route>, Unplaceable> {
        let p = &spec.placement;
        if p.is_everywhere() {
            return Ok(None);
        }
        let admitted: Vec<&Arc<Engine>> = table.iter().filter(|e| p.admits(&e.labels)).collect();
        if admitted.is_empty() {
            let labels: Vec<String> = p.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
            return Err(Unplaceable {
                name: spec.name.clone(),
                why: format!(
                    "no engine has the labels it asks for ({}); engines get labels with `staccato engine --label \
                     KEY=VALUE`",
                    labels.join(", ")
                ),
            });
        }
        if p.engines == 0 {
            return Ok(Some(Route { placement: p.clone(), chosen: Vec::new() }));
        }
        let routes = self.snapshot();
        let before = routes.get(&spec.name);
        let mut chosen: Vec<String> = admitted
            .iter()
            .filter(|e| before.is_some_and(|r| r.chosen.contains(&e.id)))
            .map(|e| e.id.clone())
            .take(p.engines as usize)
            .collect();
        let load = |id: &str| routes.values().filter(|r| r.chosen.iter().any(|c| c == id)).count();
        let mut rest: Vec<&&Arc<Engine>> = admitted.iter().filter(|e| !chosen.contains(&e.id)).collect();
        rest.sort_by_key(|e| (!e.ready(), load(&e.id), e.id.clone()));
        for e in rest {
            if chosen.len() >= p.engines as usize {
                break;
            }
            chosen.push(e.id.clone());
        }
        Ok(Some(Route { placement: p.clone(), chosen }))
    }

    /// Takes a deployed function's route (`None`: it runs everywhere).
    pub fn set(&self, name: &str, route: Option<Route>) {
        let mut routes = self.routes.write().unwrap_or_else(|p| p.into_inner());
        match route {
            Some(r) => routes.insert(name.to_string(), Arc::new(r)),
            None => routes.remove(name),
        };
        self.version.fetch_add(1, Ordering::AcqRel);
    }

    pub fn remove(&self, name: &str) {
        if self.routes.write().unwrap_or_else(|p| p.into_inner()).remove(name).is_some() {
            self.version.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// A new engine joins: each function placed on fewer engines here than
    /// it asks for, that the engine's labels admit, takes it (before the
    /// engine is restored, so it gets the function). It takes the place of
    /// a chosen engine that is away, so no function is ever placed on more
    /// engines than it asked for; and none is taken in the first
    /// `REJOIN_GRACE` after the gateway starts, while engines rejoin.
    /// `present`: the engines in the table.
    pub fn claim(&self, id: &str, labels: &BTreeMap<String, String>, present: &[&str]) {
        if Instant::now() < self.claims_from {
            return;
        }
        let mut routes = self.routes.write().unwrap_or_else(|p| p.into_inner());
        let mut changed = false;
        for (name, r) in routes.iter_mut() {
            let n = r.placement.engines as usize;
            if n == 0 || !r.placement.admits(labels) || r.chosen.iter().any(|c| c == id) {
                continue;
            }
            if r.chosen.iter().filter(|c| present.contains(&c.as_str())).count() >= n {
                continue;
            }
            let mut next = (**r).clone();
            if next.chosen.len() >= n {
                // Full, so some chosen engine is away: this one replaces it.
                if let Some(away) = next.chosen.iter().position(|c| !present.contains(&c.as_str())) {
                    next.chosen.remove(away);
                }
            }
            next.chosen.push(id.to_string());
            if let Err(e) = self.store.set_placed(name, &next.chosen) {
                log::error!("placing function {name} on engine {id}: {e}");
                continue;
            }
            log::info!("function {name} is placed on {} engines of {n}: engine {id} joined", next.chosen.len());
            *r = Arc::new(next);
            changed = true;
        }
        if changed {
            self.version.fetch_add(1, Ordering::AcqRel);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use api::spec::Runtime;

    fn placed(n: u32) -> FunctionSpec {
        FunctionSpec {
            name: "f".into(),
            runtime: Runtime::C,
            handler: "x.c".into(),
            source: format!("sha256:{}", "a".repeat(64)),
            min_workers: 1,
            max_workers: 2,
            timeout_ms: 10,
            max_queue: 1024,
            env: Default::default(),
            memory_bytes: 64 << 20,
            pids: 32,
            worker_mode: Default::default(),
            cpu_shares: None,
            placement: Placement { engines: n, labels: Default::default() },
            auth: Default::default(),
            secrets: Vec::new(),
            async_calls: Default::default(),
            grpc: Vec::new(),
        }
    }

    /// Engines rejoining a restarted gateway in any order leave a function
    /// where it was; later, a newcomer takes the place of an engine that is
    /// away, and a function never runs on more engines than it asked for.
    #[test]
    fn claims_wait_for_rejoins_and_never_exceed_the_count() {
        let dir = std::env::temp_dir().join(format!("staccato-placement-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        let store = Arc::new(Store::open(&dir.join("db.redb")).expect("store"));
        store.put(&placed(1), Some(&["e1".to_string()])).expect("put");
        let p = Placements::load(store.clone()).expect("load");
        let none = BTreeMap::new();
        // Just restarted: e2 rejoins first, e1 is not back yet.
        p.claim("e2", &none, &[]);
        assert_eq!(p.snapshot()["f"].chosen, vec!["e1".to_string()]);
        let p = Placements { claims_from: Instant::now(), ..Placements::load(store.clone()).expect("load") };
        // e1 is here: nothing to take.
        p.claim("e2", &none, &["e1"]);
        assert_eq!(p.snapshot()["f"].chosen, vec!["e1".to_string()]);
        // e1 is away for good: e3 takes its place, and the store says so.
        p.claim("e3", &none, &["e2"]);
        assert_eq!(p.snapshot()["f"].chosen, vec!["e3".to_string()]);
        assert_eq!(store.placements().expect("placements")[0].1, vec!["e3".to_string()]);
        let _ = std::fs::remove_dir_all(dir);
    }
}
