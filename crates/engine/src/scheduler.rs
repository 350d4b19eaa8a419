//! Per-function dispatch queue and worker pool bookkeeping (Nightcore
//! §3.3, §4.1). Decisions only: no file descriptors, no clocks, no locks, so
//! every rule here is unit-tested. The engine holds one `Scheduler` per
//! function under that function's mutex and carries out what it decides.
//!
//! Rules:
//! * a call is dispatched only to an idle worker, and only while fewer than
//!   τ calls of the function are running;
//! * the pool grows (up to `max_workers`) when calls wait and τ allows more
//!   to run than there are idle or starting workers, and never drops below
//!   `min_workers`;
//! * the pool shrinks when it holds more than max(2τ, min_workers) workers,
//!   by stopping workers that have been idle for a while, least recently
//!   used first. τ moves at microsecond scale; without the idle time the
//!   pool would churn (fork, exit, fork) as τ steps between 1 and 2.
//! * an I/O thread that dispatches a call at once to another thread's
//!   worker because it has none of its own gets one, within what the
//!   shrinking keeps (`take_local_wanted`): calls then stay on the vCPU
//!   that received them.
//! * a *nested* call — one whose callers already hold workers of this
//!   function (recursion, or a cycle A → B → A) — cannot wait for τ: the
//!   workers it waits for are its own ancestors', and they wait for it. It
//!   goes first and may run beyond τ, up to `max_workers`; the engine
//!   refuses one whose ancestors hold all `max_workers` (`call_cycle`).
//! * a *background* call — an asynchronous one the gateway runs from its
//!   queue — never delays an ordinary one: it is dispatched only when no
//!   ordinary call waits and fewer than τ calls run; an ordinary call is
//!   held back only by the ordinary calls running (background ones do not
//!   count against its τ), so it finds a worker at once if the pool has
//!   one. The gateway runs at most `async.concurrency` of a function's
//!   background calls at a time (default half its `max_workers`).

use crate::concurrency::ConcurrencyHint;
use std::collections::{BTreeMap, HashSet, VecDeque};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorkerState {
    /// Asked for; its hello has not arrived.
    Starting,
    Idle,
    Busy(u64),
    /// Told to stop; its channel closing is expected, not a crash.
    Stopping,
}

#[derive(Clone, Debug)]
pub struct Worker {
    pub state: WorkerState,
    /// Index of the engine I/O thread that reads this worker's channel.
    pub owner: usize,
    /// When the worker became ready (monotonic ns), to tell cold calls.
    pub ready_ns: u64,
    /// When it last became idle; while `Starting`, when it was asked for.
    pub idle_since_ns: u64,
    /// When its call was dispatched (while `Busy`).
    pub busy_since_ns: u64,
}

/// How many recent worker start-up times are kept for status reports.
const READY_SAMPLES: usize = 64;

#[derive(Clone, Debug)]
pub struct Scheduler {
    pub min_workers: u32,
    pub max_workers: u32,
    hint: ConcurrencyHint,
    queue: VecDeque<u64>,
    /// Nested calls (see the module doc): dispatched first, beyond τ.
    nested: VecDeque<u64>,
    /// Background calls (module doc): dispatched last.
    background: VecDeque<u64>,
    /// The background calls running.
    background_running: HashSet<u64>,
    workers: BTreeMap<u32, Worker>,
    /// Idle workers, most recently used last.
    idle: Vec<u32>,
    running: u32,
    pub running_max: u32,
    /// Recent times from asking for a worker to its hello, in µs.
    ready_us: VecDeque<u64>,
    /// τ is max_workers, not λ·t (`with_fixed_concurrency`).
    fixed: bool,
    /// An I/O thread that dispatched to another thread's worker because it
    /// has none of its own (`take_local_wanted`).
    local_wanted: Option<usize>,
}

/// `next_dispatch`'s `prefer_owner` for dispatches that no I/O thread asked
/// for (housekeeping, the supervisor): no preference, and no thread to
/// start a worker for (`take_local_wanted`).
pub const NO_THREAD: usize = usize::MAX;

/// Where a function whose one process serves all its workers (Python,
/// Node.js, Go: `Runtime::multiplexed`) has its calls submitted from. Its
/// channels are all read by one I/O thread, and under packed placement the
/// process runs on that thread's vCPU; when nearly all of a window's calls
/// were submitted on another vCPU (its callers' channels or its clients'
/// connections are read there), its workers move to a thread there, so
/// that a call and its reply stop crossing vCPUs (ARCHITECTURE.md,
/// "Placement and spinning").
#[derive(Debug, Default)]
pub struct Follow {
    /// Calls submitted on each vCPU in the current window.
    counts: Vec<u32>,
    total: u32,
    moved_ns: u64,
    /// The I/O thread its workers' channels are read by, once it moved
    /// (until then, its launcher's); a restarted launcher starts there.
    pub home: Option<usize>,
    /// It moved, and its process is still to be pinned there.
    pub pin: bool,
}

/// Calls per decision.
pub const FOLLOW_WINDOW: u32 = 256;
/// The share of a window one vCPU must have submitted for a move.
pub const FOLLOW_SHARE_PCT: u32 = 90;
/// Moves at most this often.
pub const FOLLOW_EVERY_NS: u64 = 1_000_000_000;

impl Follow {
    /// Counts a call submitted on vCPU `cpu` (every call an I/O thread
    /// submits, from the workers' own vCPU `home_cpu` too). When a window
    /// ends with at least `FOLLOW_SHARE_PCT` of it from one other vCPU,
    /// returns that vCPU: the workers should move there.
    pub fn note(&mut self, cpu: usize, home_cpu: usize, now_ns: u64) -> Option<usize> {
        if self.counts.len() <= cpu {
            self.counts.resize(cpu + 1, 0);
        }
        self.counts[cpu] += 1;
        self.total += 1;
        if self.total < FOLLOW_WINDOW {
            return None;
        }
        let (best, n) = self.counts.iter().copied().enumerate().max_by_key(|&(_, n)| n).unwrap_or((home_cpu, 0));
        self.counts.iter_mut().for_each(|c| *c = 0);
        self.total = 0;
        let recently = self.moved_ns != 0 && now_ns.saturating_sub(self.moved_ns) < FOLLOW_EVERY_NS;
        if best == home_cpu || n * 100 < FOLLOW_SHARE_PCT * FOLLOW_WINDOW || recently {
            return None;
        }
        self.moved_ns = now_ns.max(1);
        Some(best)
    }
}

/// What a worker's channel closing meant.
#[derive(Debug, PartialEq, Eq)]
pub enum Removed {
    /// It was told to stop, or never started: nothing to report.
    Expected,
    /// It died while idle.
    Crashed,
    /// It died running this call.
    CrashedDuring(u64),
    /// No such worker.
    Unknown,
}

/// A snapshot for status reports and metrics.
pub use api::control::SchedulerStatus;

impl Scheduler {
    pub fn new(min_workers: u32, max_workers: u32, alpha: f64) -> Scheduler {
        Scheduler {
            min_workers,
            max_workers,
            hint: ConcurrencyHint::new(alpha),
            queue: VecDeque::new(),
            nested: VecDeque::new(),
            background: VecDeque::new(),
            background_running: HashSet::new(),
            workers: BTreeMap::new(),
            idle: Vec::new(),
            running: 0,
            running_max: 0,
            ready_us: VecDeque::new(),
            fixed: false,
            local_wanted: None,
        }
    }

    /// With `fixed`, τ is max_workers whatever the load (managed
    /// concurrency off: Nightcore Figure 8's baseline).
    pub fn with_fixed_concurrency(mut self, fixed: bool) -> Scheduler {
        self.fixed = fixed;
        self
    }

    pub fn tau(&self, now_ns: u64) -> u32 {
        if self.fixed {
            return self.max_workers.max(1);
        }
        let busy = self.queued() > 0 || self.running > 0;
        // With calls waiting: how long the oldest running ordinary call has
        // run (background calls run beside τ, not within it).
        let running_for_s = if self.queue.is_empty() || self.foreground_running() == 0 {
            0.0
        } else {
            let oldest = self
                .workers
                .values()
                .filter(|w| matches!(w.state, WorkerState::Busy(c) if !self.background_running.contains(&c)))
                .map(|w| w.busy_since_ns)
                .min()
                .unwrap_or(now_ns);
            now_ns.saturating_sub(oldest) as f64 / 1e9
        };
        let tau = self.hint.tau(now_ns, busy, self.min_workers, self.max_workers, running_for_s);
        debug_assert!(tau >= 1, "τ = {tau}: a function could never run a call");
        tau
    }

    /// The bookkeeping agrees with itself: `running` counts the busy
    /// workers, `idle` lists exactly the idle ones, once each. O(workers):
    /// checked in debug builds after every change.
    fn check(&self) {
        if cfg!(debug_assertions) {
            let busy = self.workers.values().filter(|w| matches!(w.state, WorkerState::Busy(_))).count();
            debug_assert_eq!(busy, self.running as usize, "running is not the number of busy workers");
            debug_assert!(
                self.background_running.iter().all(|c| self.workers.values().any(|w| w.state == WorkerState::Busy(*c))),
                "a background call counted as running is on no worker"
            );
            let idle = self.workers.values().filter(|w| w.state == WorkerState::Idle).count();
            debug_assert_eq!(idle, self.idle.len(), "the idle list is not the idle workers");
            debug_assert!(
                self.idle.iter().all(|id| self.workers.get(id).is_some_and(|w| w.state == WorkerState::Idle)),
                "the idle list holds a worker that is not idle"
            );
        }
    }

    pub fn enqueue(&mut self, call_id: u64, now_ns: u64) {
        self.hint.on_arrival(now_ns);
        self.queue.push_back(call_id);
    }

    /// Queues a nested call: one whose callers hold workers of this function.
    pub fn enqueue_nested(&mut self, call_id: u64, now_ns: u64) {
        self.hint.on_arrival(now_ns);
        self.nested.push_back(call_id);
    }

    /// Queues a background call (module doc).
    pub fn enqueue_background(&mut self, call_id: u64, now_ns: u64) {
        self.hint.on_arrival(now_ns);
        self.background.push_back(call_id);
    }

    pub fn queued(&self) -> usize {
        self.queue.len() + self.nested.len() + self.background.len()
    }

    /// The ordinary and nested calls running (not the background ones).
    fn foreground_running(&self) -> u32 {
        self.running - self.background_running.len() as u32
    }

    /// A call's worker is free again (it ended, crashed, or was abandoned).
    fn released(&mut self, call: u64) {
        self.running -= 1;
        self.background_running.remove(&call);
    }

    pub fn running(&self) -> u32 {
        self.running
    }

    /// Picks the next queued call and an idle worker for it, if τ allows.
    /// Prefers a worker read by I/O thread `prefer_owner`, so the reply comes
    /// back to the thread (and vCPU) that is already awake.
    pub fn next_dispatch(&mut self, now_ns: u64, prefer_owner: usize) -> Option<(u64, u32)> {
        if self.idle.is_empty() {
            return None;
        }
        #[derive(PartialEq)]
        enum From {
            Nested,
            Queue,
            Background,
        }
        let from = if !self.nested.is_empty() && self.running < self.max_workers {
            From::Nested
        } else if !self.queue.is_empty() {
            if self.foreground_running() >= self.tau(now_ns) {
                return None;
            }
            From::Queue
        } else if !self.background.is_empty() && self.running < self.tau(now_ns) {
            From::Background
        } else {
            return None;
        };
        let local = self.idle.iter().rposition(|w| self.workers.get(w).is_some_and(|x| x.owner == prefer_owner));
        let pos = match local {
            Some(pos) => pos,
            None => {
                if prefer_owner != NO_THREAD && !self.has_worker_of(prefer_owner) {
                    self.local_wanted = Some(prefer_owner);
                }
                self.idle.len() - 1
            }
        };
        let worker = self.idle.remove(pos);
        let call = match from {
            From::Nested => self.nested.pop_front()?,
            From::Queue => self.queue.pop_front()?,
            From::Background => self.background.pop_front()?,
        };
        if from == From::Background {
            self.background_running.insert(call);
        }
        let w = self.workers.get_mut(&worker)?;
        debug_assert_eq!(w.state, WorkerState::Idle, "dispatching to worker {worker}, which is not idle");
        w.state = WorkerState::Busy(call);
        w.busy_since_ns = now_ns;
        self.running += 1;
        self.running_max = self.running_max.max(self.running);
        self.check();
        Some((call, worker))
    }

    /// A worker read by I/O thread `owner`, starting, idle or busy.
    fn has_worker_of(&self, owner: usize) -> bool {
        self.workers.values().any(|w| w.owner == owner && w.state != WorkerState::Stopping)
    }

    /// The I/O thread that last had to dispatch a call at once to another
    /// thread's idle worker because it has none (cleared by the call), if
    /// that thread still has none and the pool has room: a worker to start
    /// for it, so that its calls stay on its vCPU (the one already awake)
    /// rather than waking another. Room is below `max_workers` and below
    /// what `surplus` keeps, max(2τ, min_workers), so the extra worker is
    /// never one that housekeeping stops and the next call starts again.
    /// τ still bounds how many run at once. `starting` counts workers about
    /// to start that are not known here yet.
    pub fn take_local_wanted(&mut self, now_ns: u64, starting: u32) -> Option<usize> {
        let owner = self.local_wanted.take()?;
        let pool = self.workers.values().filter(|w| w.state != WorkerState::Stopping).count() as u32;
        let keep = (2 * self.tau(now_ns)).max(self.min_workers).min(self.max_workers);
        (pool + starting < keep && !self.has_worker_of(owner)).then_some(owner)
    }

    /// Undoes `next_dispatch` when the call turned out to be gone (it timed
    /// out while queued).
    pub fn unreserve(&mut self, worker: u32) {
        if let Some(w) = self.workers.get_mut(&worker) {
            if let WorkerState::Busy(call) = w.state {
                w.state = WorkerState::Idle;
                self.idle.push(worker);
                self.released(call);
            }
        }
        self.check();
    }

    /// How many workers to start now.
    pub fn workers_to_create(&self, now_ns: u64) -> u32 {
        let (mut live, mut starting) = (0u32, 0u32);
        for w in self.workers.values() {
            match w.state {
                WorkerState::Starting => starting += 1,
                WorkerState::Idle | WorkerState::Busy(_) => live += 1,
                WorkerState::Stopping => {}
            }
        }
        let tau = self.tau(now_ns);
        let background = if self.queue.is_empty() {
            (self.background.len() as u32).min(tau.saturating_sub(self.running))
        } else {
            0
        };
        let runnable = (self.queue.len() as u32).min(tau.saturating_sub(self.foreground_running()))
            + self.nested.len() as u32
            + background;
        let for_queue = runnable.saturating_sub(self.idle.len() as u32 + starting);
        let for_min = self.min_workers.saturating_sub(live + starting);
        let room = self.max_workers.saturating_sub(live + starting);
        for_queue.max(for_min).min(room)
    }

    pub fn worker_starting(&mut self, id: u32, owner: usize, now_ns: u64) {
        self.workers.insert(
            id,
            Worker { state: WorkerState::Starting, owner, ready_ns: 0, idle_since_ns: now_ns, busy_since_ns: 0 },
        );
    }

    /// The worker said hello. Returns false for a worker we did not ask for.
    pub fn worker_ready(&mut self, id: u32, now_ns: u64) -> bool {
        match self.workers.get_mut(&id) {
            Some(w) if w.state == WorkerState::Starting => {
                if self.ready_us.len() == READY_SAMPLES {
                    self.ready_us.pop_front();
                }
                self.ready_us.push_back(now_ns.saturating_sub(w.idle_since_ns) / 1000);
                w.state = WorkerState::Idle;
                w.ready_ns = now_ns;
                w.idle_since_ns = now_ns;
                self.idle.push(id);
                true
            }
            _ => false,
        }
    }

    pub fn worker(&self, id: u32) -> Option<&Worker> {
        self.workers.get(&id)
    }

    /// Worker `id` finished call `call_id` at `now_ns`.
    pub fn complete(&mut self, id: u32, call_id: u64, processing_ns: u64, now_ns: u64) -> bool {
        let Some(w) = self.workers.get_mut(&id) else { return false };
        if w.state != WorkerState::Busy(call_id) {
            return false;
        }
        w.state = WorkerState::Idle;
        w.idle_since_ns = now_ns;
        self.idle.push(id);
        self.released(call_id);
        self.hint.on_processed(processing_ns);
        self.check();
        true
    }

    /// The worker's channel closed.
    pub fn remove_worker(&mut self, id: u32) -> Removed {
        let Some(w) = self.workers.remove(&id) else { return Removed::Unknown };
        self.idle.retain(|x| *x != id);
        match w.state {
            WorkerState::Starting | WorkerState::Stopping => Removed::Expected,
            WorkerState::Idle => Removed::Crashed,
            WorkerState::Busy(call) => {
                self.released(call);
                self.check();
                Removed::CrashedDuring(call)
            }
        }
    }

    /// Workers that were asked for but never said hello (their launcher
    /// died): forget them.
    pub fn drop_starting(&mut self) -> Vec<u32> {
        let ids: Vec<u32> =
            self.workers.iter().filter(|(_, w)| w.state == WorkerState::Starting).map(|(id, _)| *id).collect();
        for id in &ids {
            self.workers.remove(id);
        }
        ids
    }

    /// Workers asked for more than `max_ns` ago that never said hello (their
    /// launcher could not fork, or the request was lost): forget them, so
    /// the pool can ask again. Returns their ids.
    pub fn expire_starting(&mut self, now_ns: u64, max_ns: u64) -> Vec<u32> {
        let ids: Vec<u32> = self
            .workers
            .iter()
            .filter(|(_, w)| w.state == WorkerState::Starting && now_ns.saturating_sub(w.idle_since_ns) > max_ns)
            .map(|(id, _)| *id)
            .collect();
        for id in &ids {
            self.workers.remove(id);
        }
        ids
    }

    /// The call running on `id` is over without a reply (it timed out and
    /// the worker is being killed): the worker must get nothing new.
    pub fn abandon(&mut self, id: u32) {
        if let Some(w) = self.workers.get_mut(&id) {
            if let WorkerState::Busy(call) = w.state {
                // Stopping before it is killed: it gets nothing new.
                w.state = WorkerState::Stopping;
                self.released(call);
            }
        }
        self.check();
    }

    /// Idle workers to stop now, marked `Stopping`: only those idle for at
    /// least `idle_min_ns`.
    pub fn surplus(&mut self, now_ns: u64, idle_min_ns: u64) -> Vec<u32> {
        let limit = (2 * self.tau(now_ns)).max(self.min_workers) as usize;
        let mut pool =
            self.workers.values().filter(|w| matches!(w.state, WorkerState::Idle | WorkerState::Busy(_))).count();
        let mut out = Vec::new();
        while pool > limit && !self.idle.is_empty() {
            let id = self.idle[0];
            let Some(w) = self.workers.get_mut(&id) else { break };
            if now_ns.saturating_sub(w.idle_since_ns) < idle_min_ns {
                break; // idle[] is in LRU order: the rest were used later
            }
            w.state = WorkerState::Stopping;
            self.idle.remove(0);
            out.push(id);
            pool -= 1;
        }
        out
    }

    /// Stops the idle workers whose channels are read by another thread
    /// than `owner` (the function's workers moved there: `Follow`); their
    /// replacements start on `owner`. Busy ones go when they are idle.
    pub fn retire_idle_not_of(&mut self, owner: usize) -> Vec<u32> {
        let mut out = Vec::new();
        let workers = &mut self.workers;
        self.idle.retain(|id| match workers.get_mut(id) {
            Some(w) if w.owner != owner => {
                w.state = WorkerState::Stopping;
                out.push(*id);
                false
            }
            _ => true,
        });
        self.check();
        out
    }

    /// The queued nested calls (their callers hold workers of this function).
    pub fn nested_ids(&self) -> Vec<u64> {
        self.nested.iter().copied().collect()
    }

    /// Takes every queued call (the function is going away or cannot start).
    pub fn drain_queue(&mut self) -> Vec<u64> {
        let mut all: Vec<u64> = self.nested.drain(..).collect();
        all.extend(self.queue.drain(..));
        all.extend(self.background.drain(..));
        all
    }

    /// Whether the pool keeps workers (`min_workers` > 0) and none is ready
    /// yet: a new launcher's first worker is to come. True before the pool
    /// even asked for one, so a deploy watched right after its launcher's
    /// hello waits too.
    pub fn awaits_first_worker(&self) -> bool {
        self.min_workers > 0
            && !self.workers.values().any(|w| matches!(w.state, WorkerState::Idle | WorkerState::Busy(_)))
    }

    pub fn worker_ids(&self) -> Vec<u32> {
        self.workers.keys().copied().collect()
    }

    pub fn status(&self, now_ns: u64) -> SchedulerStatus {
        let count = |f: fn(&WorkerState) -> bool| self.workers.values().filter(|w| f(&w.state)).count();
        SchedulerStatus {
            tau: self.tau(now_ns),
            running: self.running,
            running_max: self.running_max,
            queued: self.queued(),
            idle: self.idle.len(),
            starting: count(|s| *s == WorkerState::Starting),
            pool: count(|s| matches!(s, WorkerState::Idle | WorkerState::Busy(_))),
            rate_per_s: self.hint.rate_per_s(now_ns, self.queued() > 0 || self.running > 0),
            processing_ms: self.hint.processing_s() * 1e3,
            worker_ready_us: self.ready_us.iter().copied().collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn follow_moves_to_the_vcpu_nearly_all_calls_come_from_and_not_back_at_once() {
        let mut f = Follow::default();
        let mut now = 5 * MS;
        let window = |f: &mut Follow, from: &dyn Fn(u32) -> usize, home: usize, now: u64| -> Vec<usize> {
            (0..FOLLOW_WINDOW).filter_map(|i| f.note(from(i), home, now)).collect()
        };
        // A window from vCPU 1, the workers on vCPU 0: move.
        assert_eq!(window(&mut f, &|_| 1, 0, now), vec![1]);
        // All from vCPU 0 again within a second: stays on 1.
        now += 100 * MS;
        assert!(window(&mut f, &|_| 0, 1, now).is_empty());
        // After the second: callers split 80/20, either way round, never
        // move it, though one side is always "elsewhere".
        now += 2_000 * MS;
        for _ in 0..10 {
            assert!(window(&mut f, &|i| if i % 5 == 0 { 0 } else { 1 }, 1, now).is_empty());
            assert!(window(&mut f, &|i| if i % 5 == 0 { 1 } else { 0 }, 1, now).is_empty());
            now += 2_000 * MS;
        }
        // Calls from where it is: stays; 95% from elsewhere: moves.
        assert!(window(&mut f, &|_| 1, 1, now).is_empty());
        assert_eq!(window(&mut f, &|i| if i % 20 == 0 { 1 } else { 0 }, 1, now), vec![0]);
    }

    #[test]
    fn retiring_for_a_move_stops_the_idle_workers_of_other_threads_only() {
        let mut s = Scheduler::new(0, 8, 1e-3);
        for (id, owner) in [(1, 0), (2, 1), (3, 0)] {
            s.worker_starting(id, owner, 0);
            assert!(s.worker_ready(id, MS));
        }
        s.enqueue(100, 2 * MS);
        let (call, busy) = s.next_dispatch(2 * MS, 0).expect("a dispatch");
        assert_eq!(call, 100);
        let mut stopped = s.retire_idle_not_of(1);
        stopped.sort_unstable();
        let expect: Vec<u32> = [1, 3].into_iter().filter(|&w| w != busy).collect();
        assert_eq!(stopped, expect);
        assert_eq!(s.worker(2).map(|w| w.state), Some(WorkerState::Idle));
        if busy != 2 {
            assert_eq!(s.worker(busy).map(|w| w.state), Some(WorkerState::Busy(100)));
        }
    }

    fn ready_pool(s: &mut Scheduler, n: u32) {
        for id in 1..=n {
            s.worker_starting(id, 0, 0);
            assert!(s.worker_ready(id, 0));
        }
    }

    #[test]
    fn nested_calls_go_first_and_beyond_tau_up_to_max() {
        let mut s = Scheduler::new(1, 3, 1e-3);
        ready_pool(&mut s, 1);
        // One call already done, in a nanosecond: τ = λ·t is 1 from here.
        s.enqueue(100, 0);
        let (_, w) = s.next_dispatch(0, 0).expect("the first call runs");
        assert!(s.complete(w, 100, 1, 0));
        s.enqueue(1, 0);
        let (c, _) = s.next_dispatch(0, 0).expect("the outer call runs");
        assert_eq!(c, 1);
        // It calls itself: τ is 1 and taken by the caller, yet the nested
        // call must run, on a new worker, ahead of an ordinary one.
        s.enqueue(2, 1);
        s.enqueue_nested(3, 2);
        assert_eq!(s.tau(2), 1);
        assert_eq!(s.workers_to_create(2), 1);
        s.worker_starting(10, 0, 2);
        assert!(s.worker_ready(10, 3));
        assert_eq!(s.next_dispatch(3, 0), Some((3, 10)));
        // The ordinary call still waits for τ.
        s.worker_starting(11, 0, 3);
        assert!(s.worker_ready(11, 3));
        assert_eq!(s.next_dispatch(3, 0), None);
        // Never beyond max_workers: with 3 running, a nested call waits.
        s.enqueue_nested(4, 4);
        assert_eq!(s.next_dispatch(4, 0), Some((4, 11)));
        s.enqueue_nested(5, 5);
        assert_eq!(s.workers_to_create(5), 0);
        assert_eq!(s.next_dispatch(5, 0), None);
        assert_eq!(s.queued(), 2);
        assert_eq!(s.drain_queue(), vec![5, 2]);
    }

    #[test]
    fn min_workers_started_up_front() {
        let s = Scheduler::new(3, 8, 1e-3);
        assert_eq!(s.workers_to_create(0), 3);
    }

    #[test]
    fn awaits_first_worker_until_one_is_ready() {
        let mut s = Scheduler::new(2, 8, 1e-3);
        assert!(s.awaits_first_worker(), "before any is asked for");
        s.worker_starting(1, 0, 0);
        s.worker_starting(2, 0, 0);
        assert!(s.awaits_first_worker());
        assert!(s.worker_ready(2, MS));
        assert!(!s.awaits_first_worker(), "one is ready, the other may take its time");
        // Busy counts as ready.
        s.enqueue(7, MS);
        assert_eq!(s.next_dispatch(MS, 0), Some((7, 2)));
        assert!(!s.awaits_first_worker());
        s.remove_worker(2);
        assert!(s.awaits_first_worker(), "none ready again");
        // A pool without a minimum starts workers for calls only.
        assert!(!Scheduler::new(0, 8, 1e-3).awaits_first_worker());
    }

    #[test]
    fn dispatch_only_below_tau() {
        let mut s = Scheduler::new(1, 8, 1e-3);
        ready_pool(&mut s, 4);
        // Slow arrivals (1/s) of long calls (100 ms): τ = 1.
        s.enqueue(1, 0);
        let (c, w) = s.next_dispatch(0, 0).expect("dispatch");
        assert_eq!(c, 1);
        s.complete(w, 1, 100 * MS, 100 * MS);
        s.enqueue(2, 1000 * MS);
        s.enqueue(3, 2000 * MS);
        assert_eq!(s.tau(2000 * MS), 1);
        assert!(s.next_dispatch(2000 * MS, 0).is_some());
        // τ = 1 and one call is running: the next waits, idle workers or not.
        assert_eq!(s.next_dispatch(2000 * MS, 0), None);
        assert_eq!(s.queued(), 1);
        assert_eq!(s.workers_to_create(2000 * MS), 0);
    }

    #[test]
    fn fixed_concurrency_runs_up_to_max_workers_whatever_the_rate() {
        // The same slow arrivals of long calls that give τ = 1 above.
        let mut s = Scheduler::new(1, 4, 1e-3).with_fixed_concurrency(true);
        ready_pool(&mut s, 4);
        s.enqueue(1, 0);
        let (_, w) = s.next_dispatch(0, 0).expect("dispatch");
        s.complete(w, 1, 100 * MS, 100 * MS);
        for c in 2..=6 {
            s.enqueue(c, 1000 * MS * c);
        }
        let now = 6000 * MS;
        assert_eq!(s.tau(now), 4);
        for _ in 0..4 {
            assert!(s.next_dispatch(now, 0).is_some(), "4 run at once");
        }
        assert_eq!(s.next_dispatch(now, 0), None, "never beyond max_workers");
        assert_eq!(s.queued(), 1);
    }

    #[test]
    fn prefers_worker_of_the_same_thread() {
        let mut s = Scheduler::new(0, 8, 1e-3);
        s.worker_starting(1, 0, 0);
        s.worker_starting(2, 1, 0);
        s.worker_ready(1, 0);
        s.worker_ready(2, 0);
        s.enqueue(9, 0);
        assert_eq!(s.next_dispatch(0, 0), Some((9, 1)));
        assert_eq!(s.take_local_wanted(0, 0), None, "thread 0 had a worker of its own");
    }

    #[test]
    fn a_thread_without_a_worker_asks_for_one_once() {
        let mut s = Scheduler::new(1, 2, 1e-3);
        s.worker_starting(1, 0, 0);
        s.worker_ready(1, 0);
        // A call on thread 1 goes to thread 0's worker rather than wait ...
        s.enqueue(9, 0);
        assert_eq!(s.next_dispatch(0, 1), Some((9, 1)));
        // ... and thread 1 gets a worker of its own, once.
        assert_eq!(s.take_local_wanted(0, 0), Some(1));
        assert_eq!(s.take_local_wanted(0, 0), None);
        s.worker_starting(2, 1, 0);
        s.worker_ready(2, 0);
        assert!(s.complete(1, 9, 10, 10));
        s.enqueue(10, 20);
        assert_eq!(s.next_dispatch(20, 1), Some((10, 2)), "thread 1's own worker");
        assert!(s.complete(2, 10, 30, 10));
        // Thread 2 finds the pool at max_workers: no third worker.
        s.enqueue(11, 40);
        assert!(s.next_dispatch(40, 2).is_some());
        assert_eq!(s.take_local_wanted(0, 0), None, "max_workers is the limit");
    }

    #[test]
    fn pool_grows_with_queue_and_tau_up_to_max() {
        let mut s = Scheduler::new(1, 4, 1e-3);
        ready_pool(&mut s, 1);
        s.enqueue(100, 0);
        assert!(!s.complete(1, 0, 0, 0)); // not busy with call 0
        let (_, w) = s.next_dispatch(0, 0).expect("dispatch");
        s.complete(w, 100, 100 * MS, 100 * MS);
        // A burst: 10 calls a microsecond apart raise λ, so τ rises.
        for i in 0..10 {
            s.enqueue(i, 10 * MS + i * 1000);
        }
        let now = 10 * MS + 10_000;
        assert!(s.tau(now) >= 4);
        assert_eq!(s.workers_to_create(now), 3); // capped: 1 live + 3 = max 4
        for id in 2..=4 {
            s.worker_starting(id, 0, 0);
        }
        assert_eq!(s.workers_to_create(now), 0);
    }

    #[test]
    fn calls_turning_slow_grow_tau_while_others_wait() {
        let mut s = Scheduler::new(1, 16, 1e-3);
        ready_pool(&mut s, 1);
        // A steady 10 calls/s of 1 ms: τ = 1.
        let mut now = 0;
        for i in 0..200 {
            now = i * 100 * MS;
            s.enqueue(i + 1, now);
            let (c, w) = s.next_dispatch(now, 0).expect("dispatch");
            s.complete(w, c, MS, now + MS);
        }
        now += 100 * MS;
        s.enqueue(1000, now);
        let (c, w) = s.next_dispatch(now, 0).expect("dispatch");
        assert_eq!(c, 1000);
        // It runs on; calls keep coming at 10/s behind it.
        s.enqueue(1001, now + 50 * MS);
        assert_eq!(s.tau(now + 50 * MS), 1, "50 ms in: λ·50 ms < 1");
        s.enqueue(1002, now + 150 * MS);
        s.enqueue(1003, now + 250 * MS);
        assert_eq!(s.tau(now + 250 * MS), 3, "λ ~10/s × 250 ms running");
        assert_eq!(s.workers_to_create(now + 250 * MS), 2);
        // Nothing waiting: τ is λ·t again, however long the call runs.
        s.queue.clear();
        assert_eq!(s.tau(now + 400 * MS), 1);
        let _ = (w, c);
    }

    #[test]
    fn queued_burst_keeps_tau_up() {
        let mut s = Scheduler::new(1, 8, 1e-3);
        ready_pool(&mut s, 1);
        s.enqueue(1, 0);
        let (_, w) = s.next_dispatch(0, 0).expect("dispatch");
        s.complete(w, 1, 300 * MS, 300 * MS);
        for i in 0..12 {
            s.enqueue(10 + i, 1000 * MS + i * 1000);
        }
        // 300 ms into the burst no call has arrived since, but twelve wait:
        // that is load, not silence, so τ stays at the cap and the pool grows.
        let later = 1300 * MS;
        assert_eq!(s.tau(later), 8);
        assert_eq!(s.workers_to_create(later), 7);
    }

    #[test]
    fn shrinks_idle_surplus_to_two_tau() {
        let mut s = Scheduler::new(1, 16, 1e-3);
        ready_pool(&mut s, 8);
        // Recently idle workers are kept however large the surplus.
        assert!(s.surplus(500 * MS, 1000 * MS).is_empty());
        // Idle for a long time: λ decays, τ = 1, keep max(2τ, min) = 2.
        let stop = s.surplus(10_000 * MS, 1000 * MS);
        assert_eq!(stop.len(), 6);
        assert_eq!(stop, vec![1, 2, 3, 4, 5, 6]); // least recently used first
        assert_eq!(s.remove_worker(1), Removed::Expected);
        assert_eq!(s.status(10_000 * MS).pool, 2);
    }

    #[test]
    fn crash_reports_the_running_call() {
        let mut s = Scheduler::new(1, 2, 1e-3);
        ready_pool(&mut s, 2);
        s.enqueue(7, 0);
        let (_, w) = s.next_dispatch(0, 0).expect("dispatch");
        assert_eq!(s.remove_worker(w), Removed::CrashedDuring(7));
        assert_eq!(s.running(), 0);
        let other = if w == 1 { 2 } else { 1 };
        assert_eq!(s.remove_worker(other), Removed::Crashed);
        assert_eq!(s.remove_worker(other), Removed::Unknown);
        // The pool is empty again: replacements up to min_workers.
        assert_eq!(s.workers_to_create(0), 1);
    }

    #[test]
    fn starting_workers_expire_and_are_asked_for_again() {
        let mut s = Scheduler::new(1, 2, 1e-3);
        s.worker_starting(1, 0, 0);
        assert_eq!(s.workers_to_create(0), 0);
        assert!(s.expire_starting(MS, 5000 * MS).is_empty());
        assert_eq!(s.expire_starting(6000 * MS, 5000 * MS), vec![1]);
        assert_eq!(s.workers_to_create(6000 * MS), 1);
        assert!(!s.worker_ready(1, 6000 * MS)); // a late hello is refused
    }

    #[test]
    fn abandoned_worker_gets_no_new_calls() {
        let mut s = Scheduler::new(1, 2, 1e-3);
        ready_pool(&mut s, 1);
        s.enqueue(7, 0);
        let (_, w) = s.next_dispatch(0, 0).expect("dispatch");
        s.abandon(w);
        assert_eq!(s.running(), 0);
        assert!(!s.complete(w, 7, 0, 0)); // its late reply does not make it idle
        s.enqueue(8, 0);
        assert_eq!(s.next_dispatch(0, 0), None);
        assert_eq!(s.remove_worker(w), Removed::Expected);
    }

    #[test]
    fn unreserve_returns_the_worker() {
        let mut s = Scheduler::new(1, 2, 1e-3);
        ready_pool(&mut s, 1);
        s.enqueue(7, 0);
        let (_, w) = s.next_dispatch(0, 0).expect("dispatch");
        s.unreserve(w);
        assert_eq!(s.running(), 0);
        assert_eq!(s.status(0).idle, 1);
    }

    #[test]
    fn background_calls_go_last_and_do_not_hold_back_ordinary_ones() {
        let mut s = Scheduler::new(1, 8, 1e-3);
        ready_pool(&mut s, 4);
        // Slow arrivals (1/s) of long calls (100 ms): τ = 1.
        s.enqueue_background(1, 0);
        let (c, w) = s.next_dispatch(0, 0).expect("dispatch");
        assert_eq!(c, 1);
        s.complete(w, 1, 100 * MS, 100 * MS);
        s.enqueue_background(2, 1000 * MS);
        s.enqueue_background(3, 2000 * MS);
        let now = 2000 * MS;
        assert_eq!(s.tau(now), 1);
        let (c, w2) = s.next_dispatch(now, 0).expect("dispatch");
        assert_eq!(c, 2);
        // τ is taken by a background call: the next background one waits...
        assert_eq!(s.next_dispatch(now, 0), None);
        assert_eq!(s.workers_to_create(now), 0);
        // ...but an ordinary call does not, and goes before it. (Soon after:
        // calls running longer than t with others waiting would grow τ.)
        let now = 2050 * MS;
        s.enqueue(20, now);
        assert_eq!(s.tau(now), 1);
        let (c, w20) = s.next_dispatch(now, 0).expect("an ordinary call is not held back");
        assert_eq!(c, 20);
        // Ordinary calls hold their τ: the next ordinary one waits, and the
        // background one behind it too.
        let later = now + 30 * MS;
        s.enqueue(21, later);
        assert_eq!(s.tau(later), 1);
        assert_eq!(s.next_dispatch(later, 0), None);
        assert_eq!(s.queued(), 2);
        assert!(s.complete(w20, 20, MS, later + MS));
        assert_eq!(s.next_dispatch(later + MS, 0).map(|d| d.0), Some(21));
        assert_eq!(s.next_dispatch(later + MS, 0), None);
        // A background call that crashes frees its place too.
        assert_eq!(s.remove_worker(w2), Removed::CrashedDuring(2));
        assert_eq!((s.running(), s.foreground_running()), (1, 1));
        assert_eq!(s.drain_queue(), vec![3]);
    }
}
