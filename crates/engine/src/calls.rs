//! The in-flight call table and the trace ring, sharded by call id.
//!
//! Every call touches the table three times (submit, dispatch, completion)
//! from whichever I/O thread handles it, and the trace ring once. One
//! process-wide mutex each made the I/O threads queue behind one another;
//! with shards picked by a hash of the call id two threads rarely meet.
//! Readers that need everything (deadlines, status, traces, sweeping) walk
//! the shards one at a time.
//!
//! Locking: at most one shard is held at a time, and a function's `core`
//! mutex may be held while taking a shard, never the other way round
//! (ARCHITECTURE.md, "lock order").

use crate::shared::{lock, CallRecord, TraceRecord};
use std::cell::Cell;
use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::ops::{Deref, DerefMut};
use std::sync::{Mutex, MutexGuard};

/// A power of two, well above the number of I/O threads.
const SHARDS: usize = 16;

/// The trace ring keeps about this many finished calls in all.
pub(crate) const TRACE_RING_LEN: usize = 4096;

thread_local! {
    /// Shards of `calls` this thread holds (debug builds only).
    static HELD: Cell<u32> = const { Cell::new(0) };
}

/// Whether this thread holds a shard of `calls` now (always false in release
/// builds): the lock-order check of [`crate::shared::Function::lock_core`].
pub(crate) fn shard_held() -> bool {
    cfg!(debug_assertions) && HELD.with(Cell::get) > 0
}

/// A locked shard; in debug builds it counts itself in `HELD`.
struct Held<'a, T>(MutexGuard<'a, T>);

fn lock_shard<T>(m: &Mutex<T>) -> Held<'_, T> {
    debug_assert!(!shard_held(), "two shards of calls held at once");
    let g = lock(m);
    if cfg!(debug_assertions) {
        HELD.with(|h| h.set(h.get() + 1));
    }
    Held(g)
}

impl<T> Drop for Held<'_, T> {
    fn drop(&mut self) {
        if cfg!(debug_assertions) {
            HELD.with(|h| h.set(h.get() - 1));
        }
    }
}

impl<T> Deref for Held<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T> DerefMut for Held<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.0
    }
}

fn shard_of(call_id: u64) -> usize {
    // Fibonacci hashing: gateway ids differ in their low bits, internal ids
    // (worker << 32 | seq) in both halves; the top bits of the product mix
    // all of them.
    (call_id.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - SHARDS.trailing_zeros())) as usize
}

/// Every in-flight call's record (ARCHITECTURE.md: exactly one per call;
/// whoever removes it answers the caller).
pub(crate) struct CallTable {
    shards: [Mutex<HashMap<u64, CallRecord>>; SHARDS],
}

impl CallTable {
    pub fn new() -> CallTable {
        CallTable { shards: std::array::from_fn(|_| Mutex::new(HashMap::new())) }
    }

    /// Records a new call, or gives the record back if its id is already
    /// in flight (that call keeps its record: one record per call).
    pub fn insert(&self, call_id: u64, rec: CallRecord) -> Result<(), Box<CallRecord>> {
        match lock_shard(&self.shards[shard_of(call_id)]).entry(call_id) {
            Entry::Occupied(_) => Err(Box::new(rec)),
            Entry::Vacant(v) => {
                v.insert(rec);
                Ok(())
            }
        }
    }

    /// Takes a call's record: whoever gets it answers the call.
    pub fn remove(&self, call_id: u64) -> Option<CallRecord> {
        lock_shard(&self.shards[shard_of(call_id)]).remove(&call_id)
    }

    /// Removes a call's record if `cond` holds for it.
    pub fn remove_if(&self, call_id: u64, cond: impl FnOnce(&CallRecord) -> bool) -> Option<CallRecord> {
        let mut shard = lock_shard(&self.shards[shard_of(call_id)]);
        if shard.get(&call_id).is_some_and(cond) {
            shard.remove(&call_id)
        } else {
            None
        }
    }

    pub fn contains(&self, call_id: u64) -> bool {
        lock_shard(&self.shards[shard_of(call_id)]).contains_key(&call_id)
    }

    /// Runs `f` on a call's record under its shard's lock.
    pub fn with<R>(&self, call_id: u64, f: impl FnOnce(&mut CallRecord) -> R) -> Option<R> {
        lock_shard(&self.shards[shard_of(call_id)]).get_mut(&call_id).map(f)
    }

    /// The ids of the calls due by `now_us` (wall clock), and the earliest
    /// deadline of the others (`u64::MAX`: none), one shard at a time.
    pub fn due(&self, now_us: u64) -> (Vec<u64>, u64) {
        let (mut out, mut next) = (Vec::new(), u64::MAX);
        for s in &self.shards {
            for (id, r) in lock_shard(s).iter() {
                if r.deadline_us <= now_us {
                    out.push(*id);
                } else {
                    next = next.min(r.deadline_us);
                }
            }
        }
        (out, next)
    }

    /// The ids of the calls `keep` accepts, one shard at a time (a call
    /// submitted meanwhile may be missed, as with any snapshot).
    pub fn select(&self, mut keep: impl FnMut(&CallRecord) -> bool) -> Vec<u64> {
        let mut out = Vec::new();
        for s in &self.shards {
            out.extend(lock_shard(s).iter().filter(|(_, r)| keep(r)).map(|(id, _)| *id));
        }
        out
    }
}

/// Finished calls' timelines for `staccato trace`, newest last in each shard.
pub(crate) struct TraceRing {
    shards: [Mutex<VecDeque<TraceRecord>>; SHARDS],
}

impl TraceRing {
    pub fn new() -> TraceRing {
        TraceRing { shards: std::array::from_fn(|_| Mutex::new(VecDeque::new())) }
    }

    pub fn push(&self, t: TraceRecord) {
        let mut ring = lock(&self.shards[shard_of(t.call_id)]);
        if ring.len() == TRACE_RING_LEN / SHARDS {
            ring.pop_front();
        }
        ring.push_back(t);
    }

    /// The `limit` most recent records `keep` accepts, newest first. Copied
    /// under each shard's lock, merged outside them.
    pub fn recent(&self, limit: usize, mut keep: impl FnMut(&TraceRecord) -> bool) -> Vec<TraceRecord> {
        let mut all = Vec::new();
        for s in &self.shards {
            all.extend(lock(s).iter().rev().filter(|t| keep(t)).take(limit).cloned());
        }
        all.sort_unstable_by_key(|t| std::cmp::Reverse(t.complete_ns));
        all.truncate(limit);
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_spread_gateway_and_internal_ids() {
        let mut seen = [0usize; SHARDS];
        for seq in 0..1600u64 {
            seen[shard_of(wire::GATEWAY_CALL_ID_BIT | (1 << 56) | seq)] += 1;
        }
        for seq in 0..1600u32 {
            seen[shard_of(wire::internal_call_id(7, seq))] += 1;
        }
        // 200 per shard on average; a hash that ignored the low bits would
        // put them all in one.
        assert!(seen.iter().all(|n| (100..300).contains(n)), "{seen:?}");
    }
}
