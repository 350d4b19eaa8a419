//! Internal calls that cross servers (Nightcore §3.2). A callee on this
//! engine is always called here; one that is not is sent, as a `Forward`
//! frame, up one of the gateways' data connections, and the gateway sends
//! it on to an engine that runs it. The answer comes back down the same
//! connection with the caller's call id.
//!
//! This module keeps the calls this engine sent out and has not had
//! answered ([`OutCall`]), the data connections they may go on, and the
//! ids calls that came in from another server are shown under.

use crate::shared::{lock, Function, Hop, Outcome, Shared, TraceRecord, TracedFn};
use mio::Token;
use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::sync::{Arc, Mutex};

/// A call sent to another server, waiting for its answer.
pub(crate) struct OutCall {
    pub caller: Arc<Function>,
    /// The calling worker's channel, where the answer goes.
    pub tx: Arc<File>,
    pub worker_id: u32,
    /// The caller's own call, whose worker made this one.
    pub parent_call_id: u64,
    pub callee: Arc<str>,
    /// Past this (wall clock, µs) it is answered `timeout` here, whatever
    /// the gateway does: the callee's deadline plus slack for its answer.
    pub give_up_us: u64,
    pub sent_ns: u64,
    /// The I/O thread and connection it went on: only that connection may
    /// answer it, and its closing fails it.
    pub conn: (usize, Token),
}

/// How long after its deadline an answer from the other server is waited
/// for: the callee's engine answers `timeout` at the deadline itself.
pub(crate) const ANSWER_SLACK_US: u64 = 2_000_000;

/// Calls that came in from another server, at most, whose ids are kept to
/// show them in traces: as many as the trace ring holds.
const SHOWN_MAX: usize = crate::calls::TRACE_RING_LEN;

#[derive(Default)]
struct State {
    out: HashMap<u64, OutCall>,
    /// Gateway data connections, by I/O thread.
    conns: Vec<(usize, Token)>,
    /// Where the next forward goes when this thread has no connection.
    turn: usize,
    /// No call in `out` gives up before this (µs; a lower bound, stale
    /// after an answer): the clock sleeps until then at most, and scans
    /// no call here before.
    next_give_up_us: u64,
}

#[derive(Default)]
struct Shown {
    /// A forwarded call's key here (the gateway's hop id) → the id its
    /// caller's engine gave it, and its parent there.
    ids: HashMap<u64, (u64, u64)>,
    order: VecDeque<u64>,
}

#[derive(Default)]
pub(crate) struct Remote {
    state: Mutex<State>,
    shown: Mutex<Shown>,
}

impl Remote {
    pub fn add_conn(&self, thread: usize, conn: Token) {
        lock(&self.state).conns.push((thread, conn));
    }

    /// A data connection closed: the calls sent on it, to be failed (their
    /// answers can no longer come).
    pub fn remove_conn(&self, thread: usize, conn: Token) -> Vec<(u64, OutCall)> {
        let mut st = lock(&self.state);
        st.conns.retain(|c| *c != (thread, conn));
        let lost: Vec<u64> = st.out.iter().filter(|(_, o)| o.conn == (thread, conn)).map(|(id, _)| *id).collect();
        lost.into_iter().filter_map(|id| st.out.remove(&id).map(|o| (id, o))).collect()
    }

    /// Whether any gateway is connected (so a callee elsewhere is reachable).
    pub fn connected(&self) -> bool {
        !lock(&self.state).conns.is_empty()
    }

    /// Records a call about to be sent; returns the connection to send it
    /// on (one of `thread`'s own if it has one, else the others' in turn),
    /// or gives the call back if no gateway is connected, or if its id is
    /// already waiting. Connection and record are chosen under one lock, so
    /// a connection that closes afterwards fails the call.
    pub fn start(&self, thread: usize, call_id: u64, mut call: OutCall) -> Result<(usize, Token), OutCall> {
        let mut st = lock(&self.state);
        if st.out.contains_key(&call_id) {
            return Err(call);
        }
        let own = st.conns.iter().find(|c| c.0 == thread).copied();
        let conn = match own {
            Some(c) => c,
            None if st.conns.is_empty() => return Err(call),
            None => {
                st.turn = st.turn.wrapping_add(1);
                st.conns[st.turn % st.conns.len()]
            }
        };
        call.conn = conn;
        st.next_give_up_us = if st.out.is_empty() { call.give_up_us } else { st.next_give_up_us.min(call.give_up_us) };
        st.out.insert(call_id, call);
        Ok(conn)
    }

    /// The call an answer on `conn` is for; `None` if there is none (it
    /// timed out here already) or it was sent on another connection.
    pub fn finish(&self, call_id: u64, conn: (usize, Token)) -> Option<OutCall> {
        let mut st = lock(&self.state);
        if st.out.get(&call_id).is_some_and(|o| o.conn == conn) {
            st.out.remove(&call_id)
        } else {
            None
        }
    }

    /// Calls whose answer is overdue, and when the next of the others is
    /// (`u64::MAX`: none left).
    pub fn expire(&self, now_us: u64) -> (Vec<(u64, OutCall)>, u64) {
        let mut st = lock(&self.state);
        if st.out.is_empty() {
            return (Vec::new(), u64::MAX);
        }
        if now_us < st.next_give_up_us {
            return (Vec::new(), st.next_give_up_us);
        }
        let late: Vec<u64> = st.out.iter().filter(|(_, o)| o.give_up_us <= now_us).map(|(id, _)| *id).collect();
        let gone = late.into_iter().filter_map(|id| st.out.remove(&id).map(|o| (id, o))).collect();
        st.next_give_up_us = st.out.values().map(|o| o.give_up_us).min().unwrap_or(u64::MAX);
        (gone, st.next_give_up_us)
    }

    /// Remembers what a call that came in from another server is called
    /// there: `key` is its id here, `origin` its id on the caller's
    /// engine, `parent` the caller's call there.
    pub fn came_in(&self, key: u64, origin: u64, parent: u64) {
        let mut s = lock(&self.shown);
        if s.order.len() >= SHOWN_MAX {
            if let Some(old) = s.order.pop_front() {
                s.ids.remove(&old);
            }
        }
        s.ids.insert(key, (origin, parent));
        s.order.push_back(key);
    }

    /// The id a call here is known by on other servers: its caller's id
    /// for it if it came in from another server, else its own.
    pub fn shown_id(&self, key: u64) -> u64 {
        lock(&self.shown).ids.get(&key).map_or(key, |ids| ids.0)
    }

    /// How ids are shown in traces: a call that came in from another
    /// server under the id its caller's engine gave it.
    pub fn shown(&self) -> ShownIds {
        ShownIds(lock(&self.shown).ids.clone())
    }
}

/// A copy of the shown ids, to format traces with outside the lock.
pub(crate) struct ShownIds(HashMap<u64, (u64, u64)>);

impl ShownIds {
    /// A call's id as shown, and its parent's.
    pub fn ids(&self, call_id: u64, parent_call_id: u64) -> (u64, u64) {
        match self.0.get(&call_id) {
            // Came in from another server: its ids there.
            Some(&(origin, parent)) => (origin, parent),
            // A call whose parent came in from another server.
            None => (call_id, self.0.get(&parent_call_id).map_or(parent_call_id, |p| p.0)),
        }
    }
}

/// Gives a worker the answer to a call it sent to another server (or the
/// error that stands for it), and traces the call as sent out.
pub(crate) fn answer(shared: &Shared, call_id: u64, o: OutCall, outcome: Outcome) {
    let label = match &outcome {
        Outcome::Ok(_) => "ok",
        Outcome::Err(k, _) => k.name(),
    };
    shared.traces.push(TraceRecord {
        call_id,
        parent_call_id: o.parent_call_id,
        function: TracedFn::Elsewhere(o.callee.clone()),
        worker_id: o.worker_id,
        receive_ns: o.sent_ns,
        dispatch_ns: o.sent_ns,
        complete_ns: sys::clock::monotonic_ns(),
        outcome: label,
        hop: Hop::Out,
        cold: false,
        cpu_us: None,
    });
    let msg = crate::shared::worker_reply(call_id, outcome, None, &o.caller.dir);
    if let Err(e) = sys::channel::write_message(&o.tx, &msg) {
        log::warn!("{}: answer from another server lost: {e}", o.caller.spec.name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shown_ids_map_a_forwarded_call_and_its_children() {
        let r = Remote::default();
        r.came_in(1 << 63 | 5, 7 << 32 | 1, 1 << 63 | 99);
        let shown = r.shown();
        // The forwarded call: its caller's id and parent.
        assert_eq!(shown.ids(1 << 63 | 5, 0), (7 << 32 | 1, 1 << 63 | 99));
        // Its own internal call names it as its caller knows it.
        assert_eq!(shown.ids(3 << 32 | 1, 1 << 63 | 5), (3 << 32 | 1, 7 << 32 | 1));
        // Anything else is shown as it is.
        assert_eq!(shown.ids(4 << 32 | 2, 1 << 63 | 6), (4 << 32 | 2, 1 << 63 | 6));
        assert_eq!((r.shown_id(1 << 63 | 5), r.shown_id(1 << 63 | 6)), (7 << 32 | 1, 1 << 63 | 6));
        for i in 0..SHOWN_MAX as u64 {
            r.came_in(i + 10, 1, 2);
        }
        assert_eq!(r.shown().ids(1 << 63 | 5, 0), (1 << 63 | 5, 0), "the oldest is forgotten");
    }
}
