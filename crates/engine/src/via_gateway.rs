//! Internal calls sent out over HTTP to a gateway instead of being served
//! here: the way OpenFaaS and most FaaS systems chain functions, kept as an
//! engine setting (`--internal-calls-via URL`) to measure what the local
//! fast path is worth (Nightcore §5.3, Figure 8, design ③ against ②).
//!
//! Each such call goes to a pool of threads with blocking keep-alive HTTP
//! connections to the gateway, which routes it like any external call (so
//! it comes back to an engine as a new call, without its parent or depth:
//! exactly what a gateway-routed system knows; its W3C trace context goes
//! along as headers, as any traced HTTP client's would). A thread is
//! added whenever every one is busy, up to [`THREADS_MAX`]: a chain of
//! calls waiting for each other must never wait for a thread that one of
//! them holds. Threads idle for [`IDLE_EXIT`] end.
//!
//! Architecture invariant: the engine's I/O threads never block here; they
//! only queue a job.

use crate::remote::OutCall;
use crate::shared::{lock, Outcome, Payload, Shared};
use client::Requester;
use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::Duration;
use wire::ErrorKind;

/// Threads making calls at once, at most; past it calls wait for one.
pub(crate) const THREADS_MAX: usize = 2048;

/// A thread with nothing to do for this long ends.
const IDLE_EXIT: Duration = Duration::from_secs(30);

/// One internal call to make.
pub(crate) struct Job {
    pub call_id: u64,
    pub out: OutCall,
    pub input: Vec<u8>,
    /// What is left of the caller's deadline (ms), or None: the callee's
    /// own timeout.
    pub timeout_ms: Option<u64>,
    /// The caller's trace context: sent as `traceparent`/`tracestate`.
    pub trace: Option<api::trace::TraceContext>,
}

#[derive(Default)]
struct State {
    jobs: VecDeque<Job>,
    threads: usize,
    idle: usize,
}

pub(crate) struct ViaGateway {
    base_url: String,
    state: Mutex<State>,
    ready: Condvar,
}

impl ViaGateway {
    pub fn new(base_url: &str) -> ViaGateway {
        ViaGateway {
            base_url: base_url.trim_end_matches('/').to_string(),
            state: Mutex::default(),
            ready: Condvar::new(),
        }
    }

    /// Queues a call; starts a thread if none is idle. Called from I/O
    /// threads: never blocks beyond the queue's lock.
    pub fn submit(&self, shared: &Arc<Shared>, job: Job) {
        let spawn = {
            let mut st = lock(&self.state);
            st.jobs.push_back(job);
            let spawn = st.idle < st.jobs.len() && st.threads < THREADS_MAX;
            if spawn {
                st.threads += 1;
            }
            spawn
        };
        self.ready.notify_one();
        if spawn {
            let weak = Arc::downgrade(shared);
            let base = self.base_url.clone();
            let started = std::thread::Builder::new()
                .name("engine-via-gw".into())
                .stack_size(256 * 1024)
                .spawn(move || caller_thread(weak, base));
            if let Err(e) = started {
                log::warn!("internal calls via the gateway: cannot start a thread: {e}");
                lock(&self.state).threads -= 1;
            }
        }
    }

    /// The next job, or None once idle for [`IDLE_EXIT`] (the thread then
    /// ends, counted out under the same lock).
    fn next(&self) -> Option<Job> {
        let mut st = lock(&self.state);
        loop {
            if let Some(j) = st.jobs.pop_front() {
                return Some(j);
            }
            st.idle += 1;
            let (g, t) = self.ready.wait_timeout(st, IDLE_EXIT).unwrap_or_else(|p| p.into_inner());
            st = g;
            st.idle -= 1;
            if t.timed_out() && st.jobs.is_empty() {
                st.threads -= 1;
                return None;
            }
        }
    }
}

fn caller_thread(shared: Weak<Shared>, base: String) {
    let mut client = match client::Client::new(&base, None) {
        Ok(mut c) => {
            c.timeout = Duration::from_millis(api::spec::TIMEOUT_MAX_MS)
                + Duration::from_micros(crate::remote::ANSWER_SLACK_US);
            Some(c)
        }
        Err(e) => {
            log::warn!("internal calls via the gateway: {base}: {e}");
            None
        }
    };
    loop {
        let Some(sh) = shared.upgrade() else { return };
        let Some(via) = sh.via_gateway.as_ref() else { return };
        let Some(job) = via.next() else { return };
        let outcome = match client.as_mut() {
            Some(c) => call(c, &job),
            None => Outcome::Err(ErrorKind::EngineUnavailable, format!("gateway {base} cannot be reached")),
        };
        crate::remote::answer(&sh, job.call_id, job.out, outcome);
    }
}

/// `POST /function/NAME` on the gateway; its answer as the call's outcome.
fn call(c: &mut client::Client, job: &Job) -> Outcome {
    let path = format!("/function/{}", job.out.callee);
    let timeout = job.timeout_ms.map(|ms| ms.max(1).to_string());
    let mut headers: Vec<(&str, &str)> = timeout.iter().map(|t| ("x-staccato-timeout-ms", t.as_str())).collect();
    let parent = job.trace.as_ref().map(|t| {
        let p = &t.parent;
        api::trace::TraceParent::header(p.trace_id, p.parent_id, p.sampled)
    });
    if let (Some(p), Some(t)) = (&parent, &job.trace) {
        headers.push((api::trace::HEADER, p));
        if !t.state.is_empty() {
            headers.push((api::trace::STATE_HEADER, &t.state));
        }
    }
    match c.request_with_headers("POST", &path, &job.input, &headers) {
        Ok(r) if r.status == 200 => Outcome::Ok(Payload::Bytes(r.body)),
        Ok(r) => {
            let (kind, message) = error_of(r.status, &r.body);
            Outcome::Err(kind, message)
        }
        // Sent, maybe run, never answered: not retried (it could run twice).
        Err(e) => {
            Outcome::Err(ErrorKind::EngineUnavailable, format!("calling {} through the gateway: {e}", job.out.callee))
        }
    }
}

/// The error kind and message of a gateway's error answer.
pub(crate) fn error_of(status: u16, body: &[u8]) -> (ErrorKind, String) {
    let v: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
    let kind = v["error"]["kind"].as_str().and_then(ErrorKind::from_name);
    let message = v["error"]["message"].as_str().map(str::to_string);
    match (kind, message) {
        (Some(k), Some(m)) => (k, m),
        (Some(k), None) => (k, format!("HTTP {status}")),
        _ => (ErrorKind::Internal, format!("the gateway answered HTTP {status} without an error body")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gateway_errors_keep_their_kind() {
        let b = br#"{"error":{"kind":"timeout","message":"took too long","call_id":"00"}}"#;
        assert_eq!(error_of(504, b), (ErrorKind::Timeout, "took too long".into()));
        assert_eq!(error_of(404, br#"{"error":{"kind":"not_found"}}"#).0, ErrorKind::NotFound);
        let (k, m) = error_of(502, b"<html>bad gateway</html>");
        assert_eq!(k, ErrorKind::Internal);
        assert!(m.contains("502"), "{m}");
        assert_eq!(error_of(500, br#"{"error":{"kind":"no_such_kind","message":"x"}}"#).0, ErrorKind::Internal);
    }
}
