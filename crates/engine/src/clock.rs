//! The engine's clock thread: call deadlines and pool housekeeping.
//!
//! Kept off the I/O threads so that their `epoll_wait` never needs a
//! timeout: arming and cancelling an hrtimer on every wait is measurable at
//! microsecond scale. Deadlines are checked every `SCAN`, so a timeout fires
//! up to that much late; that is fine for millisecond timeouts.
//!
//! An idle engine's clock rests: after `REST_AFTER` with no call
//! submitted and none in flight, it wakes only for housekeeping and
//! connection checks (every 100 and 500 ms) instead of every `SCAN`, which
//! charged an idle engine ~12 ms of CPU a second (BENCHMARKS.md, "Spinning
//! only where the next message comes from another vCPU"). The next call
//! submitted wakes it (`Rest`).

use crate::shared::{Cmd, Function, LauncherState, Outcome, Shared};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use wire::ErrorKind;

const SCAN: Duration = Duration::from_millis(2);
const HOUSEKEEPING_EVERY: Duration = Duration::from_millis(100);
const CHECK_CONNS_EVERY: Duration = Duration::from_millis(500);
/// How long the engine must be idle before the clock rests.
const REST_AFTER: Duration = Duration::from_secs(1);
/// How long a call waits on a function whose every worker waits for it
/// (`Shared::deadlock_victim`) before it is refused: a wait that lasts
/// this long between two housekeeping rounds is no passing state.
const DEADLOCK_AFTER: Duration = Duration::from_millis(200);

/// What those who submit calls tell the clock: that they did (a count per
/// I/O thread, each in a cache line of its own, and one more for the other
/// threads), and, when it rests, that it must wake.
pub(crate) struct Rest {
    submitted: Box<[Count]>,
    resting: AtomicBool,
    clock: OnceLock<std::thread::Thread>,
}

#[repr(align(64))]
struct Count(AtomicU64);

impl Rest {
    pub fn new(io_threads: usize) -> Rest {
        Rest {
            submitted: (0..=io_threads).map(|_| Count(AtomicU64::new(0))).collect(),
            resting: AtomicBool::new(false),
            clock: OnceLock::new(),
        }
    }

    /// A call was registered (in the call table, or as sent to another
    /// server) by I/O thread `thread` (any other thread: out of range).
    /// Counted after it is registered, then the clock is woken if it
    /// rests: a clock that decides to rest meanwhile either sees the
    /// count change or is woken here.
    #[inline]
    pub fn submitted(&self, thread: usize) {
        self.submitted[thread.min(self.submitted.len() - 1)].0.fetch_add(1, SeqCst);
        self.wake();
    }

    /// Wakes the clock if it rests (a load when it does not).
    #[inline]
    pub fn wake(&self) {
        if self.resting.load(SeqCst) && self.resting.swap(false, SeqCst) {
            if let Some(t) = self.clock.get() {
                t.unpark();
            }
        }
    }

    fn activity(&self) -> u64 {
        self.submitted.iter().map(|s| s.0.load(SeqCst)).fold(0, u64::wrapping_add)
    }

    /// Rests until `until` unless a call was submitted since `activity`
    /// was read; returns whether it rested. Announced before the last look
    /// (`submitted` stores, then loads `resting`), so a call submitted
    /// meanwhile is seen here or wakes the park.
    fn rest(&self, activity: u64, until: Instant) -> bool {
        self.resting.store(true, SeqCst);
        if self.activity() != activity {
            self.resting.store(false, SeqCst);
            return false;
        }
        std::thread::park_timeout(until.saturating_duration_since(Instant::now()));
        self.resting.store(false, SeqCst);
        true
    }
}

pub(crate) fn run(shared: Arc<Shared>) {
    let _ = shared.rest.clock.set(std::thread::current());
    let start = Instant::now();
    let (mut next_housekeeping, mut next_conns) = (start + HOUSEKEEPING_EVERY, start + CHECK_CONNS_EVERY);
    let (mut activity, mut active_at) = (shared.rest.activity(), start);
    loop {
        let now = Instant::now();
        let idle =
            now.duration_since(active_at) >= REST_AFTER && shared.calls.is_empty() && shared.remote.nothing_out();
        if !(idle && shared.rest.rest(activity, next_housekeeping.min(next_conns))) {
            std::thread::sleep(SCAN);
        }
        expire(&shared);
        let now = Instant::now();
        let a = shared.rest.activity();
        if a != activity {
            (activity, active_at) = (a, now);
        }
        if now >= next_conns {
            next_conns = now + CHECK_CONNS_EVERY;
            if shared.remote.connected() || shared.front.get().is_some() {
                for t in 0..shared.mailboxes.len() {
                    shared.post(t, Cmd::CheckConns);
                }
            }
        }
        if now >= next_housekeeping {
            next_housekeeping = now + HOUSEKEEPING_EVERY;
            // A bug here must not stop the deadlines above for good.
            let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| housekeeping(&shared)));
            if ok.is_err() {
                log::error!("housekeeping panicked; carrying on");
            }
        }
    }
}

/// Fails every call past its deadline. A call that was running has its
/// worker killed: it may be stuck in a loop, and its channel closing makes
/// the pool replace it.
fn expire(shared: &Shared) {
    let now_us = sys::clock::unix_us();
    for (call_id, o) in shared.remote.expire(now_us) {
        let msg = format!("{} runs on another server, whose answer did not come in time", o.callee);
        crate::remote::answer(shared, call_id, o, Outcome::Err(ErrorKind::Timeout, msg));
    }
    let expired = shared.calls.select(|r| r.deadline_us <= now_us);
    for call_id in expired {
        let Some(rec) = shared.calls.remove(call_id) else { continue };
        let func = rec.func.clone();
        // Rounded: a deadline can come from another clock reading than
        // recv_unix_us (an internal call's caller's), a few µs earlier, so
        // flooring would report 499 ms for 500.
        let timeout_ms = (rec.deadline_us.saturating_sub(rec.recv_unix_us) + 500) / 1000;
        let msg = match rec.worker {
            Some((worker_id, pid)) => {
                // Before the kill: its reply may still arrive, and the
                // worker must not be handed the next call meanwhile.
                let mut core = func.lock_core();
                core.sched.abandon(worker_id);
                core.kill(pid);
                drop(core);
                format!(
                    "function {} did not finish within {timeout_ms} ms; worker {worker_id} was recycled",
                    func.spec.name
                )
            }
            None => format!("call to {} waited {timeout_ms} ms in the queue without running", func.spec.name),
        };
        func.lock_core().failed += 1;
        shared.trace(call_id, &rec, rec.worker.map_or(0, |w| w.0), ErrorKind::Timeout.name());
        if let Some(r) = shared.deliver(call_id, rec, Outcome::Err(ErrorKind::Timeout, msg), None) {
            shared.post(r.thread, Cmd::Reply { conn: r.conn, frame: r.frame });
        }
    }
}

/// Shrinks pools, retries launchers that failed, lets τ decay when idle,
/// pauses idle containers and destroys long-paused ones.
fn housekeeping(shared: &Shared) {
    for f in shared.functions() {
        break_deadlock(shared, &f);
        for r in shared.pump_with(&f, crate::scheduler::NO_THREAD, true) {
            shared.post(r.thread, Cmd::Reply { conn: r.conn, frame: r.frame });
        }
        if let Some(cc) = &shared.cfg.containers {
            reuse(shared, &f, cc);
        }
    }
}

/// Refuses a call that would wait for ever: every worker of its function
/// runs a call waiting for it (several call chains holding all of them).
fn break_deadlock(shared: &Shared, f: &Arc<Function>) {
    let now = sys::clock::monotonic_ns();
    let Some(call_id) = shared.deadlock_victim(f, now, DEADLOCK_AFTER.as_nanos() as u64) else { return };
    let msg = format!(
        "{name}: all {max} of its workers (max_workers) run calls that wait for calls queued on {name}, this one \
         among them: chains of calls hold every worker between them; this call was refused so that one chain can \
         finish; raise max_workers or call less deeply",
        name = f.spec.name,
        max = f.spec.max_workers
    );
    // Under the function's lock, which dispatching takes: a call that
    // found a worker meanwhile is left to run.
    let rec = {
        let _core = f.lock_core();
        shared.calls.remove_if(call_id, |r| r.worker.is_none() && Arc::ptr_eq(&r.func, f))
    };
    let Some(rec) = rec else { return };
    log::warn!("{msg}");
    f.lock_core().failed += 1;
    shared.trace(call_id, &rec, 0, ErrorKind::CallCycle.name());
    if let Some(r) = shared.deliver(call_id, rec, Outcome::Err(ErrorKind::CallCycle, msg), None) {
        shared.post(r.thread, Cmd::Reply { conn: r.conn, frame: r.frame });
    }
}

/// How long a function's container may sit idle before it is paused, from
/// Nuka's rule (§III.C, eq. 1): a container keeps up with its load while
/// 1/(t_f + t_p) > Q/N, i.e. while its idle gap t_p stays under
/// N/Q − t_f, with t_f the execution time, Q the call rate and N the
/// replicas (here: workers). Idle for longer than that gap, plus half
/// again for the load's jitter (Nuka sets it "slightly larger"), the load
/// has dropped: pause. Clamped to configured bounds; with no calls seen yet
/// the lower bound applies.
pub(crate) fn pause_delay(
    rate_per_s: f64,
    processing_s: f64,
    replicas: usize,
    min: Duration,
    max: Duration,
) -> Duration {
    if rate_per_s <= 0.0 || !rate_per_s.is_finite() {
        return min;
    }
    let gap = replicas.max(1) as f64 / rate_per_s - processing_s;
    // Clamped as seconds first: a tiny rate gives a gap no Duration holds.
    let secs = (1.5 * gap).clamp(min.as_secs_f64(), max.as_secs_f64());
    Duration::from_secs_f64(if secs.is_nan() { min.as_secs_f64() } else { secs })
}

/// Whether a function's container has work in hand: calls running or
/// queued, or a worker starting. A worker that is starting waits for its
/// launcher to open its channel; frozen, the launcher never does, and the
/// worker (and the calls behind it) would wait until the start times out.
fn busy(st: &api::control::SchedulerStatus) -> bool {
    st.running > 0 || st.queued > 0 || st.starting > 0
}

fn reuse(shared: &Shared, f: &Function, cc: &crate::config::ContainerConfig) {
    let now = sys::clock::monotonic_ns();
    let mut core = f.lock_core();
    let Some(c) = core.launcher.container.clone() else { return };
    if core.launcher.state != LauncherState::Ready {
        return;
    }
    let st = core.sched.status(now);
    if busy(&st) {
        core.last_active_ns = now;
        return;
    }
    match core.frozen_at {
        None if cc.pause => {
            let delay = pause_delay(st.rate_per_s, st.processing_ms / 1e3, st.pool, cc.pause_min, cc.pause_max);
            let idle = Duration::from_nanos(now.saturating_sub(core.last_active_ns));
            if idle >= delay {
                match c.freeze() {
                    Ok(()) => core.frozen_at = Some(Instant::now()),
                    Err(e) => log::warn!("{}: pausing its container: {e}", f.spec.name),
                }
            }
        }
        Some(t) if t.elapsed() >= cc.keep_alive => {
            // Return its memory: the next call starts it again from the pool.
            log::info!("{}: paused for {:?}; destroying its container", f.spec.name, t.elapsed());
            core.launcher.idle_destroyed = true;
            core.thaw();
            let pid = core.launcher.pid;
            core.kill(pid);
            let _ = shared;
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::{busy, pause_delay, Rest};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    #[test]
    fn a_resting_clock_is_woken_by_the_next_call_and_rests_no_longer_than_asked() {
        let rest = Arc::new(Rest::new(2));
        let far = || Instant::now() + Duration::from_secs(60);
        // A call since the clock last looked: it does not rest at all.
        let seen = rest.activity();
        rest.submitted(1);
        assert!(!rest.rest(seen, far()));
        assert!(!rest.resting.load(std::sync::atomic::Ordering::SeqCst));
        // Resting, it is woken by the next call submitted, long before the
        // minute it was to rest.
        let clock = {
            let rest = rest.clone();
            std::thread::spawn(move || {
                let _ = rest.clock.set(std::thread::current());
                let seen = rest.activity();
                let t = Instant::now();
                (rest.rest(seen, Instant::now() + Duration::from_secs(60)), t.elapsed())
            })
        };
        while !rest.resting.load(std::sync::atomic::Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(20));
        rest.submitted(0);
        let (rested, took) = clock.join().unwrap();
        assert!(rested && took < Duration::from_secs(30), "{rested} {took:?}");
        // Submitted by a thread that is no I/O thread: counted too.
        let seen = rest.activity();
        rest.submitted(crate::scheduler::NO_THREAD);
        assert_ne!(rest.activity(), seen);
        // Its time up, a rest ends by itself, after that time.
        let t = Instant::now();
        assert!(rest.rest(rest.activity(), Instant::now() + Duration::from_millis(30)));
        let took = t.elapsed();
        assert!(took >= Duration::from_millis(25) && took < Duration::from_secs(5), "{took:?}");
        assert!(!rest.resting.load(std::sync::atomic::Ordering::SeqCst));
    }

    /// Found by `bench micro` pinned to one vCPU: a redeployed function's
    /// container was paused while its first worker was starting, and the
    /// worker never came up.
    #[test]
    fn a_starting_worker_keeps_the_container_running() {
        let idle = api::control::SchedulerStatus { tau: 1, ..Default::default() };
        assert!(!busy(&idle));
        assert!(busy(&api::control::SchedulerStatus { starting: 1, ..idle.clone() }));
        assert!(busy(&api::control::SchedulerStatus { queued: 1, ..idle.clone() }));
        assert!(busy(&api::control::SchedulerStatus { running: 1, ..idle }));
    }

    #[test]
    fn pause_delay_follows_nukas_rule() {
        let (lo, hi) = (Duration::from_millis(50), Duration::from_secs(10));
        // No calls yet: the lower bound.
        assert_eq!(pause_delay(0.0, 0.0, 1, lo, hi), lo);
        // 1 call/s, 10 ms each, one worker: gap 0.99 s, paused after ~1.485 s.
        let d = pause_delay(1.0, 0.010, 1, lo, hi);
        assert!((d.as_secs_f64() - 1.485).abs() < 1e-6, "{d:?}");
        // Twice the workers for the same load: each waits twice as long.
        assert!(pause_delay(1.0, 0.010, 2, lo, hi) > d);
        // A busy function (gap under the bound) pauses at the bound...
        assert_eq!(pause_delay(1000.0, 0.002, 1, lo, hi), lo);
        // ...and a rare one no later than the upper bound.
        assert_eq!(pause_delay(0.001, 0.0, 1, lo, hi), hi);
        assert_eq!(pause_delay(1e-300, 0.0, 1, lo, hi), hi);
        assert_eq!(pause_delay(f64::MIN_POSITIVE, f64::NAN, 1, lo, hi), lo);
    }
}
