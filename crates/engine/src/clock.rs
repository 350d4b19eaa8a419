//! The engine's clock thread: call deadlines and pool housekeeping.
//!
//! Kept off the I/O threads so that their `epoll_wait` never needs a
//! timeout: arming and cancelling an hrtimer on every wait is measurable at
//! microsecond scale.
//!
//! It sleeps until the earliest deadline of the calls in flight, the next
//! housekeeping (every 100 ms) or the next connection check (every 500
//! ms), whichever comes first: a call's timeout fires on time (give or
//! take a housekeeping round in progress), and under a steady load of
//! calls with timeouts of 100 ms or more the clock wakes ~12 times a
//! second. (It used to scan every 2 ms, ~480 runs a second, each one on a
//! vCPU some call was using; BENCHMARKS.md, "A clock that sleeps until
//! the next deadline".) A call registered with a deadline before the
//! clock's wake-up wakes it (`Alarm`); after such a wake it scans every
//! `SCAN` for `SCAN_AFTER_EARLY_WAKE`, so that calls with short timeouts
//! do not wake it one by one (those under `SCAN` still may).

use crate::shared::{Cmd, Function, LauncherState, Outcome, Shared};
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use wire::ErrorKind;

const HOUSEKEEPING_EVERY: Duration = Duration::from_millis(100);
/// How often deadlines are looked at for a while after a call due before
/// the clock's wake-up woke it (short timeouts come in numbers).
const SCAN: Duration = Duration::from_millis(2);
/// How long after such a wake-up it scans every `SCAN`.
const SCAN_AFTER_EARLY_WAKE: Duration = Duration::from_secs(1);
const CHECK_CONNS_EVERY: Duration = Duration::from_millis(500);
/// How long a call waits on a function whose every worker waits for it
/// (`Shared::deadlock_victim`) before it is refused: a wait that lasts
/// this long between two housekeeping rounds is no passing state.
const DEADLOCK_AFTER: Duration = Duration::from_millis(200);

/// When the sleeping clock wakes by itself, and how a call due before
/// that wakes it sooner.
pub(crate) struct Alarm {
    /// Wall-clock µs the clock will wake at, at the latest: announced
    /// before it looks at the deadlines, lowered to the earliest it found
    /// and by calls registered since; 0 from its wake-up until it
    /// announces the next (it looks at every deadline before it sleeps
    /// again).
    wakes_at_us: AtomicU64,
    clock: OnceLock<std::thread::Thread>,
}

impl Alarm {
    pub fn new() -> Alarm {
        Alarm { wakes_at_us: AtomicU64::new(0), clock: OnceLock::new() }
    }

    /// A call due at `deadline_us` (wall clock) was registered: in the call
    /// table, or as sent to another server. Called after it is: the clock
    /// announces when it will wake before it looks at the deadlines, so a
    /// call it did not see finds that announcement here, and wakes it if
    /// the call is due sooner. (An atomic load per call, and a
    /// `fetch_min` for one due sooner.)
    #[inline]
    pub fn registered(&self, deadline_us: u64) {
        // A load first: most calls are due after the wake-up, and then the
        // cache line stays shared between the threads that register calls.
        // (A `fetch_min` that lowers nothing changes nothing, so skipping
        // it loses nothing.)
        if self.wakes_at_us.load(SeqCst) <= deadline_us {
            return;
        }
        if self.wakes_at_us.fetch_min(deadline_us, SeqCst) > deadline_us {
            if let Some(t) = self.clock.get() {
                t.unpark();
            }
        }
    }

    /// Says the clock will wake at `at_us` at the latest: before it looks
    /// at the deadlines.
    fn announce(&self, at_us: u64) {
        self.wakes_at_us.store(at_us, SeqCst);
    }

    /// Sleeps until the announced time, lowered to `due_us` (the earliest
    /// deadline it saw) and by any call registered since, or until such a
    /// call wakes it; `at_most` long whatever the wall clock does (a step
    /// back must not hold up housekeeping). Returns how long it slept, and
    /// whether a call registered meanwhile lowered its wake-up.
    fn sleep(&self, due_us: u64, at_most: Duration) -> (Duration, bool) {
        let at = self.wakes_at_us.fetch_min(due_us, SeqCst).min(due_us);
        let t = Instant::now();
        let now = sys::clock::unix_us();
        if at > now {
            std::thread::park_timeout(Duration::from_micros(at - now).min(at_most));
        }
        let woke_at = self.wakes_at_us.swap(0, SeqCst);
        (t.elapsed(), woke_at < at)
    }
}

pub(crate) fn run(shared: Arc<Shared>) {
    let _ = shared.alarm.clock.set(std::thread::current());
    let start = Instant::now();
    let (mut next_housekeeping, mut next_conns) = (start + HOUSEKEEPING_EVERY, start + CHECK_CONNS_EVERY);
    let mut scan_until = start;
    loop {
        let now = Instant::now();
        let mut until = next_housekeeping.min(next_conns).saturating_duration_since(now);
        if now < scan_until {
            until = until.min(SCAN);
        }
        shared.alarm.announce(sys::clock::unix_us() + until.as_micros() as u64);
        let due = expire(&shared);
        let (_, woken_early) = shared.alarm.sleep(due, until);
        if woken_early {
            scan_until = Instant::now() + SCAN_AFTER_EARLY_WAKE;
        }
        let now = Instant::now();
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
///
/// Returns the earliest deadline (wall-clock µs) of the calls left in
/// flight, here or sent to another server (`u64::MAX`: none).
fn expire(shared: &Shared) -> u64 {
    let now_us = sys::clock::unix_us();
    let (late, next_remote) = shared.remote.expire(now_us);
    for (call_id, o) in late {
        let msg = format!("{} runs on another server, whose answer did not come in time", o.callee);
        crate::remote::answer(shared, call_id, o, Outcome::Err(ErrorKind::Timeout, msg));
    }
    let (expired, next) = shared.calls.due(now_us);
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
                let current = core.workers.get(&worker_id).is_some_and(|w| w.pid == pid);
                if current && pid == core.launcher.pid {
                    // A worker that is its launcher (Go's, Node.js's,
                    // Python's inline): its end is this call's, not a crash
                    // loop's, however soon after its start (as for a death
                    // mid-call).
                    core.launcher.crashed_mid_call = true;
                }
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
    next.min(next_remote)
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
    use super::{busy, pause_delay, Alarm};
    use std::sync::atomic::Ordering::SeqCst;
    use std::sync::Arc;
    use std::time::Duration;

    fn in_us(d: Duration) -> u64 {
        sys::clock::unix_us() + d.as_micros() as u64
    }

    #[test]
    fn the_clock_sleeps_until_its_earliest_deadline_and_a_call_due_sooner_wakes_it() {
        let alarm = Arc::new(Alarm::new());
        let _ = alarm.clock.set(std::thread::current());
        // It sleeps until the earlier of what it announced and what it saw.
        alarm.announce(in_us(Duration::from_secs(60)));
        let (slept, early) = alarm.sleep(in_us(Duration::from_millis(30)), Duration::from_secs(60));
        assert!(!early);
        assert!(slept >= Duration::from_millis(25) && slept < Duration::from_secs(30), "{slept:?}");
        // Registrations while it is awake neither lower its next wake-up
        // nor leave a wake for later: it sleeps as long as it announces.
        alarm.registered(in_us(Duration::from_millis(1)));
        assert_eq!(alarm.wakes_at_us.load(SeqCst), 0);
        alarm.announce(in_us(Duration::from_millis(40)));
        // A call due after that wakes nobody.
        alarm.registered(in_us(Duration::from_secs(10)));
        let (slept, early) = alarm.sleep(u64::MAX, Duration::from_secs(60));
        assert!(!early);
        assert!(slept >= Duration::from_millis(35) && slept < Duration::from_secs(30), "{slept:?}");
        // What it announced in wall-clock time (here an hour, as after a
        // step back of the wall clock) never holds it past `at_most`.
        alarm.announce(in_us(Duration::from_secs(3600)));
        let (slept, _) = alarm.sleep(u64::MAX, Duration::from_millis(30));
        assert!(slept >= Duration::from_millis(25) && slept < Duration::from_secs(30), "{slept:?}");
        // Asleep for a minute, it is woken by a call due before that (a
        // clock thread of its own: `clock` is set once).
        let alarm = Arc::new(Alarm::new());
        let clock = {
            let alarm = alarm.clone();
            std::thread::spawn(move || {
                let _ = alarm.clock.set(std::thread::current());
                alarm.announce(in_us(Duration::from_secs(60)));
                alarm.sleep(u64::MAX, Duration::from_secs(60))
            })
        };
        while alarm.wakes_at_us.load(SeqCst) == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(20));
        alarm.registered(in_us(Duration::from_secs(5)));
        // (It says it was woken early, unless the call came between its
        // announcement and its sleep, which the 20 ms make unlikely.)
        let (slept, _early) = clock.join().unwrap();
        assert!(slept < Duration::from_secs(4), "{slept:?}");
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
