//! The engine's clock thread: call deadlines and pool housekeeping.
//!
//! Kept off the I/O threads so that their `epoll_wait` never needs a
//! timeout: arming and cancelling an hrtimer on every wait is measurable at
//! microsecond scale. Deadlines are checked every `SCAN`, so a timeout fires
//! up to that much late; that is fine for millisecond timeouts.

use crate::shared::{lock, Cmd, Outcome, Shared};
use std::sync::Arc;
use std::time::Duration;
use wire::ErrorKind;

const SCAN: Duration = Duration::from_millis(2);
const HOUSEKEEPING_EVERY: u32 = 50; // scans: every 100 ms

pub(crate) fn run(shared: Arc<Shared>) {
    let mut n = 0u32;
    loop {
        std::thread::sleep(SCAN);
        expire(&shared);
        n += 1;
        if n.is_multiple_of(HOUSEKEEPING_EVERY) {
            housekeeping(&shared);
        }
    }
}

/// Fails every call past its deadline. A call that was running has its
/// worker killed: it may be stuck in a loop, and its channel closing makes
/// the pool replace it.
fn expire(shared: &Shared) {
    let now_us = ipc::unix_us();
    let expired: Vec<u64> = {
        let calls = lock(&shared.calls);
        calls.iter().filter(|(_, r)| r.deadline_us <= now_us).map(|(id, _)| *id).collect()
    };
    for call_id in expired {
        let Some(rec) = lock(&shared.calls).remove(&call_id) else { continue };
        let func = rec.func.clone();
        // Rounded: the deadline is computed from a clock reading taken a few
        // µs before recv_unix_us, so flooring reports 499 ms for 500.
        let timeout_ms = (rec.deadline_us.saturating_sub(rec.recv_unix_us) + 500) / 1000;
        let msg = match rec.worker {
            Some((worker_id, pid)) => {
                // Before the kill: its reply may still arrive, and the
                // worker must not be handed the next call meanwhile.
                lock(&func.core).sched.abandon(worker_id);
                let _ = ipc::kill(pid);
                format!(
                    "function {} did not finish within {timeout_ms} ms; worker {worker_id} was recycled",
                    func.spec.name
                )
            }
            None => format!("call to {} waited {timeout_ms} ms in the queue without running", func.spec.name),
        };
        lock(&func.core).failed += 1;
        shared.trace(call_id, &rec, rec.worker.map_or(0, |w| w.0), ErrorKind::Timeout.name());
        if let Some(r) = shared.deliver(call_id, rec, Outcome::Err(ErrorKind::Timeout, msg), None) {
            shared.post(r.thread, Cmd::Reply { conn: r.conn, frame: r.frame });
        }
    }
}

/// Shrinks pools, retries launchers that failed, lets τ decay when idle.
fn housekeeping(shared: &Shared) {
    for f in shared.functions() {
        for r in shared.pump_with(&f, 0, true) {
            shared.post(r.thread, Cmd::Reply { conn: r.conn, frame: r.frame });
        }
    }
}
