//! A content-addressed cache of function dependencies on the host (Nuka
//! §III.B, "local package caching"): each dependency is resolved and
//! installed once, and every later deploy of any function that needs the same
//! thing reuses it instead of running pip or npm again.
//!
//! # How the engine uses it
//!
//! ```text
//! let r = cache.python(&python, &code.join("requirements.txt"), &mut |l| log(l))?;
//! cache.pin(&function, &r.entries)?;          // before the next eviction can run
//! cache.evict_to_budget()?;
//! // bind-mount every r.dirs[i] read-only at the same path; PYTHONPATH = r.dirs joined by ':'
//! // Node: r.dirs == [<entry>/node_modules]; link <code>/node_modules to it.
//! ```
//!
//! Returned directories are absolute, never change once published, and stay
//! until no function pins them and eviction picks them.
//!
//! # Design decisions
//!
//! * **Python: one entry per resolved distribution.** pip resolves the
//!   whole requirements file (`install --dry-run --report`), and each
//!   distribution it picks is installed alone (`--no-deps --target`) from the
//!   exact archive, hash-checked, so two functions that both need `six 1.16.0`
//!   share one directory whatever else they need. The key is the interpreter's
//!   bytecode tag and ABI, the platform, name, version and archive hash.
//! * **Node: one entry per dependency set.** npm's nested, deduplicated
//!   node_modules tree is shaped by all its packages together, so single
//!   packages cannot be shared as directories; functions with the same
//!   dependencies (and lock file) share one tree.
//! * **Fully pinned requirements skip pip on later deploys.** pip's resolver
//!   costs about a second even when everything is cached. A file made only of
//!   `name==version` lines whose resolution was exactly those lines (the
//!   output of `pip freeze` or `pip-compile`) resolves the same way every
//!   time, so its resolution is remembered (keyed by the file, the
//!   interpreter and the `PIP_*` environment) and reused while its entries
//!   exist. Anything looser is resolved by pip at every deploy, so new
//!   releases are picked up.
//! * **No locks: publishing is one `rename(2)`.** An entry is built under
//!   `tmp/` and renamed into place; if another deploy renamed the same entry
//!   first, ours is discarded. Removal renames into `trash/` first. Readers
//!   see a whole entry or none.
//! * **Eviction is LRU over unpinned entries** (the paper allows LFU or LRU);
//!   a use marker's mtime is the last use. Pinned entries are never removed,
//!   and neither is any entry used within the grace period (see below).
//!
//! # Limits
//!
//! * One sys.path directory per distribution: `.pth` files inside entries
//!   are not processed by PYTHONPATH (the launcher can call
//!   `site.addsitedir` per directory if a package needs them). Implicit
//!   namespace packages (PEP 420) spanning several entries work; old
//!   `pkg_resources`-style namespace packages that rely on `-nspkg.pth` do not.
//! * Console scripts in `<entry>/site/bin` name the interpreter that
//!   installed them; they are not on PATH anyway.
//! * Each distribution is installed from the archive URL pip resolved.
//!   Index credentials written inside requirements.txt (`--index-url
//!   https://user:token@...`) do not reach that second pip run; put them in
//!   pip's configuration, environment, netrc or keyring instead.
//! * Requirements that are local directories are refused (not addressable by
//!   content); a local `.whl` file is fine. Node dependencies given as local
//!   paths (`file:`) are refused likewise.
//! * Node ranges without a lock file are resolved once, when the entry is
//!   built; later deploys with the same package.json reuse that tree until it
//!   is evicted. Commit a package-lock.json to control upgrades.
//! * An entry returned by `python()`/`node()` is protected from eviction for
//!   the grace period ([`DEFAULT_GRACE`]) and then by its pin. A caller that
//!   waits longer than that between the two can lose the entry to a
//!   concurrent eviction; `pin` then fails with `NotFound` and the deploy
//!   should be retried.

#![forbid(unsafe_code)]

mod error;
mod key;
mod node;
mod python;
mod size;
mod store;
mod tool;

pub use error::{Error, Result};
pub use size::format_size;

/// Where pip and npm run. They execute code the deployer controls (build
/// backends, install scripts), so an engine with containers runs them in
/// its build sandbox; [`HostRunner`] runs them as plain child processes
/// (process isolation, and this crate's own tests).
pub trait Runner: Send + Sync {
    /// Runs `cmd` to its end and returns its output. `reads` are host
    /// paths it needs besides the toolchain (the requirements file's
    /// directory); `output` is the one directory it writes.
    fn output(
        &self,
        cmd: &mut std::process::Command,
        reads: &[PathBuf],
        output: Option<&Path>,
    ) -> Result<std::process::Output, RunError>;
}

#[derive(Debug)]
pub enum RunError {
    /// It could not be started.
    Spawn(io::Error),
    /// A limit stopped it: why, then its last output lines.
    Stopped(String),
}

/// Runs commands on the host, as the engine's user.
pub struct HostRunner;

impl Runner for HostRunner {
    fn output(
        &self,
        cmd: &mut std::process::Command,
        _reads: &[PathBuf],
        _output: Option<&Path>,
    ) -> Result<std::process::Output, RunError> {
        cmd.output().map_err(RunError::Spawn)
    }
}

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use store::{Layout, PinFile, Published, ResolutionMemo, Staging};

/// The cache's size budget unless configured otherwise.
pub const DEFAULT_BUDGET_BYTES: u64 = 2 << 30;

/// How long after its last use an unpinned entry is safe from eviction: it
/// covers the gap between `python()`/`node()` returning and the deploy
/// pinning what it got. Generous, because a deploy also builds other things.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(10 * 60);

/// pip installs run this many at a time: much of pip's time is spent waiting
/// on the index, so more than the core count pays off, but not many more.
const INSTALL_PARALLELISM: usize = 4;

#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Python,
    Node,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Python => "python",
            Kind::Node => "node",
        }
    }

    fn dir_name(self) -> &'static str {
        self.name()
    }
}

/// What a function needs, found or installed in the cache.
#[derive(Debug, Clone, Default)]
pub struct Resolved {
    /// Python: one directory per distribution, for sys.path, in pip's
    /// resolution order. Node: `[<entry>/node_modules]`.
    pub dirs: Vec<PathBuf>,
    /// Entries this call built and published.
    pub installed: usize,
    /// Entries that were already there (or that a concurrent deploy published
    /// while this one was building the same thing).
    pub cached: usize,
    /// Entry ids, for [`Cache::pin`].
    pub entries: Vec<String>,
}

#[derive(Debug, Clone)]
pub struct Entry {
    /// `python/<name>-<version>-<hash>` or `node/<hash>`.
    pub id: String,
    pub kind: Kind,
    /// Python: the distribution. Node: the direct dependencies, comma-separated.
    pub name: String,
    pub version: String,
    pub size_bytes: u64,
    pub last_used: SystemTime,
    /// Functions that pin it.
    pub users: Vec<String>,
}

pub struct Cache {
    layout: Layout,
    budget_bytes: u64,
    grace: Duration,
    runner: std::sync::Arc<dyn Runner>,
}

impl Cache {
    /// Opens (creating if needed) the cache at `root`, and deletes what
    /// crashed deploys left behind.
    pub fn open(root: &Path, budget_bytes: u64) -> io::Result<Cache> {
        Ok(Cache {
            layout: Layout::create(root)?,
            budget_bytes,
            grace: DEFAULT_GRACE,
            runner: std::sync::Arc::new(HostRunner),
        })
    }

    /// Runs pip and npm through `runner` instead of on the host.
    pub fn with_runner(mut self, runner: std::sync::Arc<dyn Runner>) -> Cache {
        self.runner = runner;
        self
    }

    /// Changes how long recently used entries are safe from eviction.
    pub fn with_grace(mut self, grace: Duration) -> Cache {
        self.grace = grace;
        self
    }

    /// The absolute, canonical root: every returned directory is below it.
    pub fn root(&self) -> &Path {
        &self.layout.root
    }

    pub fn budget_bytes(&self) -> u64 {
        self.budget_bytes
    }

    /// Python: resolve `requirements` with the given interpreter's pip,
    /// install each resolved distribution once into its own entry, and return
    /// the directories to put on sys.path (one per distribution).
    pub fn python(&self, python: &Path, requirements: &Path, progress: &mut dyn FnMut(&str)) -> Result<Resolved> {
        let started = Instant::now();
        let interp = python::probe(python)?;
        let python = interp.executable.as_path();
        let file_name = requirements.file_name().unwrap_or(requirements.as_os_str()).to_string_lossy();
        progress(&format!("resolving {file_name}"));
        let requirements = fs::canonicalize(requirements)
            .map_err(|e| Error::Input(format!("cannot read {}: {e}", requirements.display())))?;
        let text = fs::read_to_string(&requirements)
            .map_err(|e| Error::Input(format!("cannot read {}: {e}", requirements.display())))?;
        let pins = python::pinned_lines(&text);
        let memo_key = python::memo_key(&interp, &text);
        if pins.is_some() {
            if let Some(resolved) = self.python_from_memo(&memo_key, started, progress) {
                return Ok(resolved);
            }
        }
        let report =
            Staging::new(&self.layout, "pip-report").map_err(Error::io(format!("cache {}", self.root().display())))?;
        let dists = python::resolve(&*self.runner, python, &requirements, report.path())?;
        drop(report);
        let reads: Vec<PathBuf> = requirements.parent().map(Path::to_path_buf).into_iter().collect();
        let ids: Vec<String> = dists.iter().map(|d| d.id(&interp)).collect();

        let mut missing = Vec::new();
        for (i, id) in ids.iter().enumerate() {
            if self.reuse(id) {
                progress(&format!("cached {}", dists[i].label()));
            } else {
                missing.push(i);
            }
        }
        let installed = self.install_python(python, &reads, &dists, &ids, &missing, progress)?;
        self.touch_all(&ids)?;
        if pins.is_some_and(|p| python::resolution_is_pinned(&p, &dists)) {
            let memo = ResolutionMemo { entries: ids.clone(), labels: dists.iter().map(|d| d.label()).collect() };
            // Only an optimisation: a failure costs the next deploy a pip run.
            let _ = serde_json::to_vec_pretty(&memo).map(|json| {
                store::write_atomic(
                    &self.layout,
                    &self.layout.resolutions_dir().join(format!("{memo_key}.json")),
                    &json,
                )
            });
        }
        let dirs = ids.iter().map(|id| self.layout.entry_dir(id).join(python::PAYLOAD)).collect();
        let resolved = Resolved { dirs, installed, cached: ids.len() - installed, entries: ids };
        progress(&summary(&resolved, started));
        Ok(resolved)
    }

    /// A fully pinned file seen before, all of whose entries are still here.
    fn python_from_memo(&self, key: &str, started: Instant, progress: &mut dyn FnMut(&str)) -> Option<Resolved> {
        let text = fs::read(self.layout.resolutions_dir().join(format!("{key}.json"))).ok()?;
        let memo: ResolutionMemo = serde_json::from_slice(&text).ok()?;
        if memo.entries.len() != memo.labels.len()
            || !memo.entries.iter().all(|id| store::valid_id(id) && self.reuse(id))
        {
            return None;
        }
        self.touch_all(&memo.entries).ok()?;
        progress("every requirement is pinned and was resolved before: pip not needed");
        for label in &memo.labels {
            progress(&format!("cached {label}"));
        }
        let dirs = memo.entries.iter().map(|id| self.layout.entry_dir(id).join(python::PAYLOAD)).collect();
        let resolved = Resolved { dirs, installed: 0, cached: memo.entries.len(), entries: memo.entries };
        progress(&summary(&resolved, started));
        Some(resolved)
    }

    /// Node: one entry per dependency set, keyed by package.json's
    /// dependencies, the lock file if present and the Node version; returns
    /// `dirs = [<entry>/node_modules]` (empty when there are no dependencies).
    pub fn node(&self, package_dir: &Path, progress: &mut dyn FnMut(&str)) -> Result<Resolved> {
        let started = Instant::now();
        progress("reading package.json");
        let deps = node::read(package_dir)?;
        if deps.is_empty() {
            progress("no dependencies in package.json");
            return Ok(Resolved::default());
        }
        let id = deps.id(&node::probe_node()?);
        let label = deps.label();
        let installed = if self.reuse(&id) {
            progress(&format!("cached {label}"));
            0
        } else {
            progress(&format!("installing {label} (npm)"));
            let staging =
                Staging::new(&self.layout, "node").map_err(Error::io(format!("cache {}", self.root().display())))?;
            node::install(&*self.runner, &deps, staging.path(), package_dir)?;
            let meta = deps.meta(staging.path());
            match staging.publish(&self.layout, &id, meta, node::PAYLOAD) {
                Ok(Published::New) => 1,
                Ok(Published::AlreadyThere) => 0,
                Err(e) => return Err(Error::Io { what: format!("publishing {label} in the cache"), error: e }),
            }
        };
        self.touch_all(std::slice::from_ref(&id))?;
        let dirs = vec![self.layout.entry_dir(&id).join(node::PAYLOAD)];
        let resolved = Resolved { dirs, installed, cached: 1 - installed, entries: vec![id] };
        progress(&summary(&resolved, started));
        Ok(resolved)
    }

    /// Records that `function` uses exactly these entries (replacing what it
    /// pinned before). Fails with NotFound if an entry is not in the cache.
    pub fn pin(&self, function: &str, entries: &[String]) -> io::Result<()> {
        let path = self.pin_path(function)?;
        for id in entries {
            if !store::valid_id(id) {
                return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("not a cache entry id: {id:?}")));
            }
            if !self.layout.exists(id) {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("cache entry {id} does not exist (evicted since it was resolved?)"),
                ));
            }
        }
        let pins = PinFile { function: function.to_string(), entries: entries.to_vec() };
        let json = serde_json::to_vec_pretty(&pins).map_err(io::Error::other)?;
        store::write_atomic(&self.layout, &path, &json)
    }

    pub fn unpin(&self, function: &str) -> io::Result<()> {
        match fs::remove_file(self.pin_path(function)?) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// Every entry, sorted by kind, name and version.
    pub fn list(&self) -> io::Result<Vec<Entry>> {
        let mut users: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (function, ids) in self.read_pins()? {
            for id in ids {
                users.entry(id).or_default().push(function.clone());
            }
        }
        let mut entries = Vec::new();
        for kind in [Kind::Python, Kind::Node] {
            for dirent in fs::read_dir(self.layout.kind_dir(kind))? {
                let file_name = dirent?.file_name();
                let id = format!("{}/{}", kind.dir_name(), file_name.to_string_lossy());
                if !store::valid_id(&id) {
                    continue;
                }
                let meta = match self.layout.read_meta(&id) {
                    Ok(m) => m,
                    // Removed between read_dir and here.
                    Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(io::Error::new(e.kind(), format!("cache entry {id}: {e}"))),
                };
                let created = UNIX_EPOCH + Duration::from_secs(meta.created_unix_s);
                entries.push(Entry {
                    last_used: self.layout.last_used(&id).unwrap_or(created),
                    users: users.remove(&id).unwrap_or_default(),
                    id,
                    kind: meta.kind,
                    name: meta.name,
                    version: meta.version,
                    size_bytes: meta.size_bytes,
                });
            }
        }
        entries.sort_by(|a, b| (a.kind, &a.name, &a.version, &a.id).cmp(&(b.kind, &b.name, &b.version, &b.id)));
        Ok(entries)
    }

    /// Evicts least-recently-used unpinned entries until the total size is
    /// within the budget; returns what was removed.
    pub fn evict_to_budget(&self) -> io::Result<Vec<Entry>> {
        self.remove_unpinned(Some(self.budget_bytes))
    }

    /// Removes unpinned entries: all of them, or least recently used first
    /// until the total is at most `max_bytes`. Entries used within the grace
    /// period stay either way.
    pub fn prune(&self, max_bytes: Option<u64>) -> io::Result<Vec<Entry>> {
        self.remove_unpinned(max_bytes)
    }

    fn remove_unpinned(&self, max_total_bytes: Option<u64>) -> io::Result<Vec<Entry>> {
        let entries = self.list()?;
        let mut total: u64 = entries.iter().map(|e| e.size_bytes).sum();
        let mut candidates: Vec<Entry> =
            entries.into_iter().filter(|e| e.users.is_empty() && !self.recent(e.last_used)).collect();
        candidates.sort_by(|a, b| (a.last_used, &a.id).cmp(&(b.last_used, &b.id)));
        let mut removed = Vec::new();
        for e in candidates {
            if max_total_bytes.is_some_and(|max| total <= max) {
                break;
            }
            // A deploy may have used or pinned it since list(): check again
            // just before it leaves the namespace.
            let used = self.layout.last_used(&e.id).map(|t| self.recent(t)).unwrap_or(false);
            if used || self.pinned_ids()?.contains(&e.id) {
                continue;
            }
            match self.layout.remove_entry(&e.id) {
                Ok(()) => {}
                // Another process evicted it first: it is gone all the same.
                Err(err) if err.kind() == io::ErrorKind::NotFound => {}
                Err(err) => return Err(io::Error::new(err.kind(), format!("removing cache entry {}: {err}", e.id))),
            }
            total = total.saturating_sub(e.size_bytes);
            removed.push(e);
        }
        if !removed.is_empty() {
            self.forget_resolutions(&removed);
        }
        Ok(removed)
    }

    /// Memos that name a removed entry can never be used again. Best effort:
    /// a memo left behind is only read and found wanting.
    fn forget_resolutions(&self, removed: &[Entry]) {
        let Ok(dir) = fs::read_dir(self.layout.resolutions_dir()) else { return };
        for dirent in dir.flatten() {
            let stale = fs::read(dirent.path())
                .ok()
                .and_then(|t| serde_json::from_slice::<ResolutionMemo>(&t).ok())
                .is_none_or(|m| m.entries.iter().any(|id| removed.iter().any(|e| &e.id == id)));
            if stale {
                let _ = fs::remove_file(dirent.path());
            }
        }
    }

    fn recent(&self, last_used: SystemTime) -> bool {
        SystemTime::now().duration_since(last_used).map_or(true, |age| age < self.grace)
    }

    /// An entry that exists and could be marked used. A failed touch means it
    /// was evicted this instant; building it again is the safe answer.
    fn reuse(&self, id: &str) -> bool {
        self.layout.exists(id) && self.layout.touch(id).is_ok()
    }

    /// Marks everything returned as used, last, so the grace period starts
    /// when the caller gets the directories.
    fn touch_all(&self, ids: &[String]) -> Result<()> {
        for id in ids {
            self.layout.touch(id).map_err(|error| Error::EntryGone { id: id.clone(), error })?;
        }
        Ok(())
    }

    /// Installs the distributions at `missing` (indexes into `dists`), a few
    /// at a time. Progress is reported from this thread only: `progress` is
    /// the caller's and need not be `Send`.
    fn install_python(
        &self,
        python: &Path,
        reads: &[PathBuf],
        dists: &[python::Dist],
        ids: &[String],
        missing: &[usize],
        progress: &mut dyn FnMut(&str),
    ) -> Result<usize> {
        enum Event {
            Started(usize),
            Finished(usize, Result<Published>, Duration),
        }
        let next = AtomicUsize::new(0);
        let failed = AtomicBool::new(false);
        let (tx, rx) = mpsc::channel();
        let mut published = 0;
        let mut errors = Vec::new();
        std::thread::scope(|s| {
            for _ in 0..missing.len().min(INSTALL_PARALLELISM) {
                let (tx, next, failed) = (tx.clone(), &next, &failed);
                s.spawn(move || loop {
                    let k = next.fetch_add(1, Ordering::Relaxed);
                    // After one failure the deploy fails anyway: start nothing new.
                    if k >= missing.len() || failed.load(Ordering::Relaxed) {
                        break;
                    }
                    let i = missing[k];
                    let _ = tx.send(Event::Started(i));
                    let t = Instant::now();
                    let result = self.install_one(python, reads, &dists[i], &ids[i]);
                    if result.is_err() {
                        failed.store(true, Ordering::Relaxed);
                    }
                    let _ = tx.send(Event::Finished(i, result, t.elapsed()));
                });
            }
            drop(tx);
            for event in rx {
                match event {
                    Event::Started(i) => {
                        progress(&format!("installing {} ({}/{})", dists[i].label(), i + 1, dists.len()))
                    }
                    Event::Finished(i, Ok(Published::New), took) => {
                        published += 1;
                        progress(&format!("installed {} in {:.1}s", dists[i].label(), took.as_secs_f64()));
                    }
                    Event::Finished(i, Ok(Published::AlreadyThere), _) => {
                        progress(&format!("cached {} (a concurrent deploy installed it first)", dists[i].label()))
                    }
                    Event::Finished(_, Err(e), _) => errors.push(e),
                }
            }
        });
        if errors.is_empty() {
            Ok(published)
        } else {
            Err(if errors.len() == 1 { errors.remove(0) } else { Error::Several(errors) })
        }
    }

    fn install_one(&self, python: &Path, reads: &[PathBuf], dist: &python::Dist, id: &str) -> Result<Published> {
        // A concurrent deploy may have published it since we looked.
        if self.layout.exists(id) {
            return Ok(Published::AlreadyThere);
        }
        let staging =
            Staging::new(&self.layout, "python").map_err(Error::io(format!("cache {}", self.root().display())))?;
        python::install(&*self.runner, python, reads, dist, staging.path())?;
        staging
            .publish(&self.layout, id, dist.meta(), python::PAYLOAD)
            .map_err(Error::io(format!("publishing {} in the cache", dist.label())))
    }

    fn pin_path(&self, function: &str) -> io::Result<PathBuf> {
        if !store::valid_function_name(function) {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("not a function name: {function:?}")));
        }
        Ok(self.layout.pins_dir().join(format!("{function}.json")))
    }

    /// Function → pinned entry ids. An unreadable pin file is an error, not
    /// an empty set: guessing wrong would let eviction delete a live entry.
    fn read_pins(&self) -> io::Result<BTreeMap<String, Vec<String>>> {
        let mut pins = BTreeMap::new();
        for dirent in fs::read_dir(self.layout.pins_dir())? {
            let path = dirent?.path();
            if path.extension().is_none_or(|x| x != "json") {
                continue;
            }
            let text = match fs::read(&path) {
                Ok(t) => t,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            let pin: PinFile = serde_json::from_slice(&text)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{}: {e}", path.display())))?;
            pins.insert(pin.function, pin.entries);
        }
        Ok(pins)
    }

    fn pinned_ids(&self) -> io::Result<BTreeSet<String>> {
        Ok(self.read_pins()?.into_values().flatten().collect())
    }
}

fn summary(r: &Resolved, started: Instant) -> String {
    format!("installed {}, cached {} in {:.1}s", r.installed, r.cached, started.elapsed().as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(label: &str) -> PathBuf {
        let p = std::env::temp_dir().join(format!("pkgcache-lib-{label}-{}", std::process::id()));
        let _ = store::remove_tree(&p);
        p
    }

    #[test]
    fn pins_round_trip_and_reject_bad_input() {
        let root = scratch("pins");
        let cache = Cache::open(&root, DEFAULT_BUDGET_BYTES).unwrap();
        assert!(cache.root().is_absolute());
        let missing = cache.pin("f", &["python/six-1.0-abc".to_string()]).unwrap_err();
        assert_eq!(missing.kind(), io::ErrorKind::NotFound);
        assert_eq!(cache.pin("../f", &[]).unwrap_err().kind(), io::ErrorKind::InvalidInput);
        assert_eq!(cache.pin("f", &["../../etc".to_string()]).unwrap_err().kind(), io::ErrorKind::InvalidInput);
        cache.pin("f", &[]).unwrap();
        assert_eq!(cache.read_pins().unwrap().get("f"), Some(&vec![]));
        cache.unpin("f").unwrap();
        cache.unpin("f").unwrap();
        assert!(cache.read_pins().unwrap().is_empty());
        store::remove_tree(&root).unwrap();
    }
}
