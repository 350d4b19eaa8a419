//! The isolation pool (Nuka §III.A): containers made ahead of time by a
//! background thread, handed out in microseconds, cleaned and reused when
//! returned, destroyed when they cannot be cleaned.

use crate::{Container, Error, Network, Result, Settings};
use std::collections::{BTreeSet, VecDeque};
use std::fs;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{channel, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Clone, Debug, Default)]
pub struct PoolStats {
    pub idle: usize,
    pub target: usize,
    pub created: u64,
    pub reused: u64,
    pub destroyed: u64,
    /// Takes that found the pool empty and waited for a new container.
    pub misses: u64,
    pub create_ms_last: f64,
}

const REFILL_DELAY: Duration = Duration::from_millis(30);

enum Job {
    Refill,
    Return(Arc<Container>, bool),
}

struct Inner {
    settings: Settings,
    nets: Option<netns::Networks>,
    idle: Mutex<VecDeque<Arc<Container>>>,
    /// Indexes of live containers (they pick uids and subnets).
    indexes: Mutex<BTreeSet<u32>>,
    jobs: Mutex<Sender<Job>>,
    stopping: AtomicBool,
    target: AtomicUsize,
    /// Kinds (warm or not) to make next, in the order they were taken.
    wanted: Mutex<VecDeque<bool>>,
    created: AtomicU64,
    reused: AtomicU64,
    destroyed: AtomicU64,
    misses: AtomicU64,
    create_us_last: AtomicU64,
    _claim: crate::Claim,
}

#[derive(Clone)]
pub struct Pool {
    inner: Arc<Inner>,
}

impl Pool {
    /// Removes what a previous engine with the same prefix left behind, then
    /// starts filling the pool in the background.
    pub fn new(settings: Settings) -> Result<Pool> {
        fs::create_dir_all(&settings.dir).map_err(Error::io(format!("creating {}", settings.dir.display())))?;
        let claim = crate::claim(&settings.prefix)?;
        crate::cgroup::prepare().map_err(Error::io("preparing the containers' cgroups (v2)"))?;
        // The engine joins the CPU group its containers will share (v1).
        if let Some(group) = crate::shared_cpu_group(&settings.prefix) {
            fs::create_dir_all(&group)
                .and_then(|()| fs::write(group.join("cgroup.procs"), std::process::id().to_string()))
                .map_err(Error::io(format!("joining the CPU group {}", group.display())))?;
        }
        let nets = match settings.network {
            Network::Isolated => Some(match &settings.host_ports {
                Some(ports) => netns::Networks::with_ports(&settings.prefix, ports)?,
                None => netns::Networks::new(&settings.prefix)?,
            }),
            Network::Host => None,
        };
        let (tx, rx) = channel();
        let target = settings.pool_size;
        let inner = Arc::new(Inner {
            settings,
            nets,
            idle: Mutex::new(VecDeque::new()),
            indexes: Mutex::new(BTreeSet::new()),
            jobs: Mutex::new(tx),
            stopping: AtomicBool::new(false),
            target: AtomicUsize::new(target),
            wanted: Mutex::new(VecDeque::new()),
            created: AtomicU64::new(0),
            reused: AtomicU64::new(0),
            destroyed: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            create_us_last: AtomicU64::new(0),
            _claim: claim,
        });
        inner.remove_leftovers();
        thaw_orphans();
        let _ = fs::write(inner.settings.dir.join("engine.pid"), std::process::id().to_string());
        let bg = inner.clone();
        std::thread::Builder::new()
            .name("pool".into())
            .spawn(move || {
                background_priority();
                loop {
                    match rx.recv_timeout(Duration::from_millis(500)) {
                        Ok(Job::Return(c, reuse)) => bg.put_back(c, reuse),
                        Ok(Job::Refill) => {
                            // Not at once: a container was just taken, and a
                            // runc run (a Go binary, ~30 ms of CPU) beside the
                            // function's start would slow that start down on a
                            // small machine. Starts take a few ms.
                            std::thread::sleep(REFILL_DELAY);
                            bg.refill()
                        }
                        Err(RecvTimeoutError::Timeout) => bg.refill(),
                        Err(RecvTimeoutError::Disconnected) => return,
                    }
                    if bg.stopping.load(Ordering::Relaxed) {
                        return;
                    }
                }
            })
            .map_err(Error::io("starting the pool thread"))?;
        let pool = Pool { inner };
        pool.send(Job::Refill);
        Ok(pool)
    }

    fn send(&self, job: Job) {
        let _ = self.inner.jobs.lock().unwrap_or_else(|p| p.into_inner()).send(job);
    }

    /// A ready container: from the pool when it has one, else made now.
    /// `python`: the container is for a Python function, which starts
    /// fastest in one with a warm interpreter; anything else starts fastest
    /// in one without (no interpreter to kill first). The pool refills with
    /// the kind just taken, so its mix follows the demand.
    pub fn take(&self, python: bool) -> Result<Arc<Container>> {
        if self.inner.stopping.load(Ordering::Relaxed) {
            return Err(Error::ShuttingDown);
        }
        let warm_wanted = python && self.inner.settings.warm_python.is_some();
        if self.inner.settings.warm_python.is_some() {
            let mut wanted = self.inner.wanted.lock().unwrap_or_else(|p| p.into_inner());
            wanted.push_back(warm_wanted);
            while wanted.len() > self.inner.target().max(1) {
                wanted.pop_front();
            }
        }
        let c = {
            let mut idle = self.inner.idle.lock().unwrap_or_else(|p| p.into_inner());
            match idle.iter().position(|c| c.is_warm() == warm_wanted) {
                Some(i) => idle.remove(i),
                None => idle.pop_front(),
            }
        };
        let c = match c {
            Some(c) => c,
            None => {
                self.inner.misses.fetch_add(1, Ordering::Relaxed);
                // Used at once: no point warming an interpreter for it.
                Arc::new(self.inner.create(false)?)
            }
        };
        self.send(Job::Refill);
        Ok(c)
    }

    /// Takes a container back. `reuse` false (say, after an OOM kill)
    /// destroys it; otherwise it is cleaned in the background and reused if
    /// the check passes.
    pub fn give_back(&self, c: Arc<Container>, reuse: bool) {
        self.send(Job::Return(c, reuse));
    }

    /// Makes the pool hold `n` ready containers from now on.
    pub fn resize(&self, n: usize) {
        let drop: Vec<Arc<Container>> = {
            let mut idle = self.inner.idle.lock().unwrap_or_else(|p| p.into_inner());
            let keep = idle.len().min(n);
            idle.drain(keep..).collect()
        };
        self.inner.target.store(n, Ordering::Relaxed);
        for c in drop {
            self.inner.destroy(c);
        }
        self.send(Job::Refill);
    }

    /// Blocks until the pool holds its target (or `timeout` passes).
    pub fn wait_full(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if self.stats().idle >= self.inner.target() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        false
    }

    pub fn stats(&self) -> PoolStats {
        let i = &self.inner;
        PoolStats {
            idle: i.idle.lock().unwrap_or_else(|p| p.into_inner()).len(),
            target: i.target(),
            created: i.created.load(Ordering::Relaxed),
            reused: i.reused.load(Ordering::Relaxed),
            destroyed: i.destroyed.load(Ordering::Relaxed),
            misses: i.misses.load(Ordering::Relaxed),
            create_ms_last: i.create_us_last.load(Ordering::Relaxed) as f64 / 1000.0,
        }
    }

    /// Destroys every container of this engine, in use or not (at exit).
    pub fn shutdown(&self) {
        self.inner.stopping.store(true, Ordering::Relaxed);
        let idle: Vec<Arc<Container>> = self.inner.idle.lock().unwrap_or_else(|p| p.into_inner()).drain(..).collect();
        for c in idle {
            self.inner.destroy(c);
        }
        self.inner.remove_leftovers();
    }
}

impl Inner {
    fn target(&self) -> usize {
        self.target.load(Ordering::Relaxed)
    }

    fn create(&self, warm: bool) -> Result<Container> {
        let index = {
            let mut used = self.indexes.lock().unwrap_or_else(|p| p.into_inner());
            let i = (0..).find(|i| !used.contains(i)).expect("u32 indexes");
            used.insert(i);
            i
        };
        let t0 = Instant::now();
        match Container::create(&self.settings, self.nets.as_ref(), index, warm) {
            Ok(c) => {
                self.created.fetch_add(1, Ordering::Relaxed);
                self.create_us_last.store(t0.elapsed().as_micros() as u64, Ordering::Relaxed);
                Ok(c)
            }
            Err(e) => {
                self.indexes.lock().unwrap_or_else(|p| p.into_inner()).remove(&index);
                Err(e)
            }
        }
    }

    fn refill(&self) {
        while !self.stopping.load(Ordering::Relaxed) {
            if self.idle.lock().unwrap_or_else(|p| p.into_inner()).len() >= self.target() {
                return;
            }
            // With no takes yet to go by: half warm, half not.
            let warm = self.wanted.lock().unwrap_or_else(|p| p.into_inner()).pop_front().unwrap_or_else(|| {
                let idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
                idle.iter().filter(|c| c.is_warm()).count() * 2 <= idle.len()
            });
            match self.create(warm && self.settings.warm_python.is_some()) {
                Ok(c) => self.idle.lock().unwrap_or_else(|p| p.into_inner()).push_back(Arc::new(c)),
                Err(e) => {
                    log::error!("isolation pool: {e}");
                    std::thread::sleep(Duration::from_secs(1));
                    return;
                }
            }
        }
    }

    fn put_back(&self, c: Arc<Container>, reuse: bool) {
        if !reuse || self.stopping.load(Ordering::Relaxed) {
            return self.destroy(c);
        }
        let warm = self.settings.warm_python.is_some()
            && self.wanted.lock().unwrap_or_else(|p| p.into_inner()).pop_front().unwrap_or(false);
        match c.reset(&self.settings, self.nets.as_ref(), warm) {
            Ok(()) => {
                self.reused.fetch_add(1, Ordering::Relaxed);
                // Handed out first; beyond the target, the newest go.
                let surplus: Vec<Arc<Container>> = {
                    let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
                    idle.push_front(c);
                    let keep = self.target().min(idle.len());
                    idle.drain(keep..).collect()
                };
                for c in surplus {
                    self.destroy(c);
                }
            }
            Err(e) => {
                log::warn!("container {} failed its check, destroying it: {e}", c.id);
                self.destroy(c);
            }
        }
    }

    fn destroy(&self, c: Arc<Container>) {
        c.destroy(&self.settings, self.nets.as_ref());
        self.destroyed.fetch_add(1, Ordering::Relaxed);
        self.indexes.lock().unwrap_or_else(|p| p.into_inner()).remove(&c.index);
    }

    /// Containers, cgroups and namespaces named with our prefix that no
    /// live Container owns (a crashed engine's, or ours at exit).
    fn remove_leftovers(&self) {
        remove_leftovers(&self.settings, self.nets.as_ref());
    }
}

/// Removes the containers, cgroups and namespaces named with the settings'
/// prefix (none of which may be in use).
pub(crate) fn remove_leftovers(s: &Settings, nets: Option<&netns::Networks>) {
    {
        let mine = |name: &str| name.strip_prefix(&s.prefix).is_some_and(|r| r.starts_with('-'));
        // Paused containers first: a frozen init never sees its engine go,
        // and runc cannot kill what is frozen.
        for g in crate::cgroup::groups(mine) {
            let _ = g.thaw();
        }
        if let Ok(entries) = fs::read_dir(&s.dir) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if mine(&name) {
                    let _ = std::process::Command::new(&s.runc)
                        .arg("--root")
                        .arg(s.dir.join("runc"))
                        .args(["delete", "-f", &name])
                        .stdin(Stdio::null())
                        .stdout(Stdio::null())
                        .stderr(Stdio::null())
                        .status();
                    let _ = fs::remove_dir_all(e.path());
                }
            }
        }
        for g in crate::cgroup::groups(mine) {
            g.remove();
        }
        if let Some(n) = nets {
            if let Err(e) = n.cleanup() {
                log::warn!("cleaning up network namespaces: {e}");
            }
        }
    }
}

/// Thaws paused containers whose engine is gone, whatever their prefix: a
/// frozen init never notices its engine died (it cannot run), so it would
/// hold its memory forever. Thawed, it reads end-of-file and exits, and
/// the kernel ends the rest. The engine is found through the file init's
/// stderr points at (`<containers dir>/<id>/runc.err`, opened by runc on
/// the host before the container's root changed) and the `engine.pid` the
/// engine left beside it.
fn thaw_orphans() {
    for g in crate::cgroup::groups(|_| true) {
        if !g.frozen() {
            continue;
        }
        // The container's init: pid 1 of its namespace.
        let init = g.procs().into_iter().map(|p| p.to_string()).find(|pid| {
            fs::read_to_string(format!("/proc/{pid}/status"))
                .is_ok_and(|st| st.lines().any(|l| l.starts_with("NSpid:") && l.split_whitespace().last() == Some("1")))
        });
        let alive_engine = init.as_ref().is_some_and(|pid| {
            let err = fs::read_link(format!("/proc/{pid}/fd/2")).unwrap_or_default();
            let text = err.to_string_lossy();
            !text.ends_with("(deleted)")
                && err
                    .parent()
                    .and_then(|d| d.parent())
                    .and_then(|d| fs::read_to_string(d.join("engine.pid")).ok())
                    .is_some_and(|p| alive(p.trim()))
        });
        if init.is_some() && !alive_engine {
            let _ = g.thaw();
        }
    }
}

/// The process exists and is not a zombie (a killed engine may wait a while
/// for its parent to reap it).
fn alive(pid: &str) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|s| s.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().next()) != Some("Z"))
}

/// Puts the calling (pool) thread, and every process it starts from now on,
/// at `POOL_NICE`, if the engine can set a container back to 0 when it
/// gives it to a function (CAP_SYS_NICE: root, as runc needs, but not root
/// in a user namespace or a pod without the capability). Tried on this
/// thread first: a function must never be left at the pool's priority.
fn background_priority() {
    let can_raise = sys::cpu::set_nice(0, crate::container::POOL_NICE).is_ok() && sys::cpu::set_nice(0, 0).is_ok();
    if !can_raise {
        let _ = sys::cpu::set_nice(0, 0);
        log::info!("isolation pool: cannot raise priority again (no CAP_SYS_NICE); it runs at the default priority");
        return;
    }
    crate::container::BACKGROUND.store(true, std::sync::atomic::Ordering::Relaxed);
    if let Err(e) = sys::cpu::set_nice(0, crate::container::POOL_NICE) {
        log::warn!("isolation pool: lowering its thread's priority: {e}");
    }
}
