//! Asynchronous calls: `POST /async-function/{name}` is answered `202` once
//! the call is written to the store, and the gateway runs it later.
//!
//! The store holds each call's record (its write-ahead log): written when it
//! is accepted (durably, before the 202), when an attempt starts (not waited
//! for), and when it ends. Memory holds the calls not finished, in a queue
//! per function; a thread of its own (`gateway-async`) starts them through
//! its own links to the engines, as an HTTP thread starts a call.
//!
//! - Retries: an attempt that ends in an error the function's `async.retry_on`
//!   names is tried again after `backoff * 2^(n-1)` (a quarter either way of
//!   jitter), up to `async.retries` times; then the call is a dead letter
//!   (state `failed`), kept until replayed or removed.
//! - Bounds: a function's unfinished calls (`async.queue`), all functions'
//!   ([`AsyncConfig::queued_max`]) and their inputs' bytes; beyond, `429`.
//! - Sharing workers: a function runs at most `async.concurrency` async
//!   calls at once (default half its `max_workers`), and the gateway at most
//!   [`AsyncConfig::concurrency`]: the rest of a function's workers are left
//!   to its synchronous calls, which never wait behind more than that.
//! - Restarts: on a stop (SIGTERM) no attempt starts, and those running are
//!   waited for ([`Calls::stop`]); at start the records not finished are
//!   queued again. An attempt the gateway did not see end (it was killed)
//!   counts as failed and is tried again: a call runs once per attempt the
//!   gateway records, and after a kill, possibly once more.
//! - Several gateways on one store: each runs the calls it accepted (the
//!   record's `owner`, this gateway's id in its state directory) and finds
//!   the others' results there.

use crate::callback::{self, CallbackUrl};
use crate::engine_link::Reply;
use crate::store::{unix_ms, Store, StoreError};
use crate::{GwShared, ThreadState};
use api::spec::AsyncSettings;
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::rc::Rc;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;
use wire::ErrorKind;

/// The gateway's settings for asynchronous calls.
#[derive(Clone, Debug)]
pub struct AsyncConfig {
    /// Async calls running at once, all functions together.
    pub concurrency: usize,
    /// Calls accepted and not finished, all functions together.
    pub queued_max: usize,
    /// Their inputs' bytes together (held in memory until they finish).
    pub queued_bytes_max: usize,
    /// How long a call that succeeded is kept (its result can be read).
    pub retention: Duration,
    /// How long a dead letter is kept, if not replayed or removed.
    pub dead_retention: Duration,
    /// Networks callbacks may go to besides public addresses.
    pub callback_allow: Vec<callback::Cidr>,
    /// How long a stop waits for attempts under way.
    pub drain: Duration,
}

impl Default for AsyncConfig {
    fn default() -> AsyncConfig {
        AsyncConfig {
            concurrency: 64,
            queued_max: 100_000,
            queued_bytes_max: 512 << 20,
            retention: Duration::from_secs(24 * 3600),
            dead_retention: Duration::from_secs(7 * 24 * 3600),
            callback_allow: Vec::new(),
            drain: Duration::from_secs(10),
        }
    }
}

/// The largest input an async call may have with a shared store (an etcd
/// value is at most 1.5 MiB, with the record around it).
pub const SHARED_INPUT_MAX: usize = 1 << 20;
/// Outputs larger than this are sent to the callback but not kept.
pub const KEPT_OUTPUT_MAX: usize = 1 << 20;
/// Attempt errors kept in a record: the last ones.
const ERRORS_KEPT: usize = 8;
/// How long a call that found no engine ready waits before it tries again
/// (doubled each time it did not start, up to the max).
const NOT_STARTED_WAIT_MS: u64 = 125;
const NOT_STARTED_WAIT_MAX_MS: u64 = 10_000;
/// Tries that did not start before a call is a dead letter (~20 minutes
/// with the waits above).
const NOT_STARTED_MAX: u32 = 128;
/// Threads posting callbacks: each delivery takes at most
/// `callback::DELIVERY_TIME`, so a slow receiver holds one for that long.
const CALLBACK_THREADS: usize = 8;
/// Callbacks waiting to be delivered, at most, and their bodies' bytes.
const CALLBACK_JOBS_MAX: usize = 10_000;
const CALLBACK_BYTES_MAX: usize = 256 << 20;
/// A callback is tried this many times (1 s, 2 s, 4 s apart).
const CALLBACK_TRIES: u32 = 4;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    Queued,
    Running,
    Ok,
    Failed,
}

impl State {
    pub fn name(self) -> &'static str {
        match self {
            State::Queued => "queued",
            State::Running => "running",
            State::Ok => "ok",
            State::Failed => "failed",
        }
    }

    pub fn parse(s: &str) -> Option<State> {
        [State::Queued, State::Running, State::Ok, State::Failed].into_iter().find(|x| x.name() == s)
    }

    fn finished(self) -> bool {
        matches!(self, State::Ok | State::Failed)
    }
}

/// One attempt that failed.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct AttemptError {
    pub attempt: u32,
    pub error: String,
    pub message: String,
    pub at_ms: u64,
}

/// How a call ended.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Outcome {
    /// The HTTP status a synchronous call would have had.
    pub status: u16,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The output, if it is at most [`KEPT_OUTPUT_MAX`] bytes.
    #[serde(default, with = "b64_opt", skip_serializing_if = "Option::is_none")]
    pub output: Option<Bytes>,
    pub output_bytes: usize,
    pub queue_us: u32,
    pub exec_us: u32,
    pub cold_us: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CallbackStatus {
    /// `pending`, `delivered` or `failed`.
    pub state: String,
    pub attempts: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// An async call, as stored.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Record {
    pub id: String,
    pub function: String,
    /// Kept until the call succeeds (a dead letter keeps it to be replayed).
    #[serde(with = "b64")]
    pub input: Bytes,
    pub input_bytes: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub callback: Option<String>,
    pub state: State,
    pub attempts: u32,
    /// Attempts allowed: 1 + the function's retries when it was accepted.
    pub max_attempts: u32,
    pub backoff_ms: u64,
    pub retry_on: Vec<String>,
    /// The caller's invoke key was checked (the function needs one).
    #[serde(default)]
    pub key_checked: bool,
    pub accepted_ms: u64,
    /// Not before then (a retry's backoff).
    pub due_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_ms: Option<u64>,
    pub owner: String,
    #[serde(default)]
    pub errors: Vec<AttemptError>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Outcome>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub callback_status: Option<CallbackStatus>,
    #[serde(default)]
    pub replays: u32,
    /// Attempts that did not start (no engine ready, the engine's queue
    /// full): not counted, but each waits longer.
    #[serde(default)]
    pub not_started: u32,
    /// The caller's W3C trace context (`traceparent`, `tracestate`, as
    /// checked when the call was accepted): every attempt runs in it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracestate: Option<String>,
}

impl Record {
    /// The trace block its attempts carry, if the caller sent a context.
    fn trace_block(&self) -> Option<Vec<u8>> {
        let parent = self.traceparent.as_deref()?;
        let state = self.tracestate.as_deref().map(str::as_bytes);
        api::trace::TraceContext::from_headers(parent.as_bytes(), state.into_iter()).map(|t| t.encode())
    }
}

mod b64 {
    use super::*;
    pub fn serialize<S: serde::Serializer>(b: &Bytes, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&B64.encode(b))
    }
    pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Bytes, D::Error> {
        let t = String::deserialize(d)?;
        B64.decode(t).map(Bytes::from).map_err(serde::de::Error::custom)
    }
}

mod b64_opt {
    use super::*;
    pub fn serialize<S: serde::Serializer>(b: &Option<Bytes>, s: S) -> Result<S::Ok, S::Error> {
        match b {
            Some(b) => s.serialize_some(&B64.encode(b)),
            None => s.serialize_none(),
        }
    }
    pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Bytes>, D::Error> {
        match Option::<String>::deserialize(d)? {
            Some(t) => B64.decode(t).map(|v| Some(Bytes::from(v))).map_err(serde::de::Error::custom),
            None => Ok(None),
        }
    }
}

impl Record {
    fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a call record serializes")
    }
}

/// Why a call was not accepted.
#[derive(Debug)]
pub enum Refused {
    /// A bound is reached (429).
    Full(String),
    /// The gateway is stopping, or the store failed (503).
    Unavailable(String),
    /// The call is queued or running already (a second replay; 409).
    Duplicate(String),
}

/// A function's queue.
#[derive(Default)]
struct FnQueue {
    /// Due now, in order.
    ready: VecDeque<String>,
    running: u32,
    /// Queued (ready or waiting out a backoff) or running.
    unfinished: u32,
    /// Async calls of it running at once, at most (as of its last accept).
    cap: u32,
}

#[derive(Default)]
struct Inner {
    /// The calls not finished, by id.
    calls: HashMap<String, Record>,
    fns: HashMap<String, FnQueue>,
    /// Waiting out a backoff: (due, id).
    delayed: BinaryHeap<Reverse<(u64, String)>>,
    running: usize,
    bytes: usize,
    stopping: bool,
    /// Calls ended ok, ended failed, and retries scheduled, per function
    /// (counted since the gateway started).
    ended: HashMap<String, [u64; 3]>,
}

/// Writes to the store, in batches: one transaction for all that wait.
struct Committer {
    tx: std::sync::mpsc::Sender<Write>,
}

/// A record to write (`Some`) or remove (`None`); none for a flush.
struct Write {
    op: Option<(String, Option<Vec<u8>>)>,
    done: Option<tokio::sync::oneshot::Sender<Result<(), String>>>,
}

impl Committer {
    fn start(store: Arc<Store>) -> Committer {
        let (tx, rx) = std::sync::mpsc::channel::<Write>();
        let run = move || {
            while let Ok(first) = rx.recv() {
                let mut batch = vec![first];
                while batch.len() < 512 {
                    match rx.try_recv() {
                        Ok(w) => batch.push(w),
                        Err(_) => break,
                    }
                }
                // In the order they came: a record's last change wins.
                let ops: Vec<(&str, Option<&[u8]>)> =
                    batch.iter().filter_map(|w| w.op.as_ref().map(|(k, v)| (k.as_str(), v.as_deref()))).collect();
                let r = if ops.is_empty() { Ok(()) } else { store.write_calls(&ops).map_err(|e| e.to_string()) };
                if let Err(e) = &r {
                    log::error!("writing {} async call records to the store: {e}", ops.len());
                }
                for w in batch {
                    if let Some(d) = w.done {
                        let _ = d.send(r.clone());
                    }
                }
            }
        };
        std::thread::Builder::new().name("gateway-async-log".into()).spawn(run).expect("spawning the async log");
        Committer { tx }
    }

    /// Queues a write; the receiver says when it is durable.
    fn write(&self, put: Option<&Record>, remove: Option<&str>) -> tokio::sync::oneshot::Receiver<Result<(), String>> {
        let (done, rx) = tokio::sync::oneshot::channel();
        let op = match (put, remove) {
            (Some(r), _) => Some((r.id.clone(), Some(r.encode()))),
            (None, Some(id)) => Some((id.to_string(), None)),
            (None, None) => None,
        };
        let w = Write { op, done: Some(done) };
        if self.tx.send(w).is_err() {
            log::error!("the async call log is gone");
        }
        rx
    }

    /// Waits until everything queued before is durable.
    fn flush(&self) {
        let rx = self.write(None, None);
        let _ = rx.blocking_recv();
    }
}

/// Callbacks to deliver, by when: (due, job number).
type CallbackQueue = BinaryHeap<Reverse<(u64, u64)>>;

/// A callback to deliver.
struct Job {
    rec: Record,
    /// The output, also when it was too large to keep in the record.
    output: Bytes,
    tries: u32,
}

pub struct Calls {
    inner: Mutex<Inner>,
    /// Signalled when running attempts drop to none (for a stop).
    idle: Condvar,
    /// Wakes the dispatcher: a call is queued, or a slot freed.
    wake: tokio::sync::Notify,
    log: Committer,
    store: Arc<Store>,
    pub cfg: AsyncConfig,
    /// This gateway's id, the owner of the calls it accepts.
    pub owner: String,
    policy: callback::Policy,
    callbacks: Arc<(Mutex<CallbackQueue>, Condvar)>,
    jobs: Arc<Mutex<HashMap<u64, Job>>>,
    next_job: std::sync::atomic::AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// 128 random bits in hex: a call's id.
pub fn new_id() -> String {
    let mut b = [0u8; 16];
    getrandom::fill(&mut b).expect("the kernel's random numbers");
    b.iter().map(|x| format!("{x:02x}")).collect()
}

pub fn valid_id(id: &str) -> bool {
    id.len() == 32 && id.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// `ms` give or take a quarter.
fn jitter(ms: u64) -> u64 {
    let mut b = [0u8; 8];
    let r = getrandom::fill(&mut b).map_or(0, |()| u64::from_le_bytes(b));
    let quarter = ms / 4;
    if quarter == 0 {
        return ms;
    }
    ms - quarter + r % (2 * quarter + 1)
}

impl Calls {
    /// Opens the queue: reads this gateway's id (made once, in its state
    /// directory) and queues again the calls it had not finished.
    pub fn open(
        store: Arc<Store>,
        cfg: AsyncConfig,
        state_dir: &std::path::Path,
        gateway: std::net::SocketAddr,
    ) -> std::io::Result<Arc<Calls>> {
        let owner = gateway_id(state_dir)?;
        let policy = callback::Policy { allow: cfg.callback_allow.clone(), gateway };
        let calls = Arc::new(Calls {
            inner: Mutex::new(Inner::default()),
            idle: Condvar::new(),
            wake: tokio::sync::Notify::new(),
            log: Committer::start(store.clone()),
            store,
            cfg,
            owner,
            policy,
            callbacks: Arc::new((Mutex::new(BinaryHeap::new()), Condvar::new())),
            jobs: Arc::new(Mutex::new(HashMap::new())),
            next_job: std::sync::atomic::AtomicU64::new(0),
        });
        calls.recover();
        for i in 0..CALLBACK_THREADS {
            let c = calls.clone();
            std::thread::Builder::new().name(format!("gateway-callback-{i}")).spawn(move || c.callback_worker())?;
        }
        let c = calls.clone();
        std::thread::Builder::new().name("gateway-async-sweep".into()).spawn(move || loop {
            c.sweep();
            std::thread::sleep(Duration::from_secs(60));
        })?;
        Ok(calls)
    }

    /// Queues again what this gateway accepted and did not finish (read
    /// from the store), and the callbacks it had not delivered.
    fn recover(&self) {
        let rows = match self.store.calls() {
            Ok(r) => r,
            Err(e) => {
                log::error!("reading async calls from the store: {e}; the unfinished ones are not resumed");
                return;
            }
        };
        let shared = self.store.shared();
        let (mut resumed, mut interrupted) = (0, 0);
        let mut caps: HashMap<String, u32> = HashMap::new();
        let now = unix_ms();
        for (id, bytes) in rows {
            let mut rec: Record = match serde_json::from_slice(&bytes) {
                Ok(r) => r,
                Err(e) => {
                    log::error!("async call {id} in the store is unreadable ({e}); left as it is");
                    continue;
                }
            };
            if shared && rec.owner != self.owner {
                continue;
            }
            if rec.state.finished() {
                if rec.callback_status.as_ref().is_some_and(|c| c.state == "pending") {
                    let output = rec.result.as_ref().and_then(|o| o.output.clone()).unwrap_or_default();
                    self.queue_callback(rec, output, 0);
                }
                continue;
            }
            if rec.state == State::Running {
                // Its attempt started and no end was recorded: the gateway
                // stopped (or was killed) while it ran.
                interrupted += 1;
                rec.errors.push(AttemptError {
                    attempt: rec.attempts,
                    error: "interrupted".into(),
                    message: "the gateway stopped while this attempt ran; its end is unknown".into(),
                    at_ms: now,
                });
                if rec.attempts >= rec.max_attempts {
                    let msg = "its last attempt was interrupted: the gateway stopped while it ran".to_string();
                    dead_letter(&mut rec, ErrorKind::EngineUnavailable, msg, now, wire::frame::Timing::default());
                    drop(self.log.write(Some(&rec), None));
                    continue;
                }
                rec.state = State::Queued;
            }
            resumed += 1;
            // The function's share as deployed now (1 if it is gone: its
            // calls end not_found).
            let cap = match caps.get(&rec.function) {
                Some(c) => *c,
                None => {
                    let c = match self.store.get(&rec.function) {
                        Ok(Some(s)) => s.async_calls.concurrency_for(s.max_workers),
                        _ => 1,
                    };
                    caps.insert(rec.function.clone(), c);
                    c
                }
            };
            let mut g = lock(&self.inner);
            let g = &mut *g;
            let f = g.fns.entry(rec.function.clone()).or_default();
            f.unfinished += 1;
            f.cap = cap;
            if rec.due_ms > now {
                g.delayed.push(Reverse((rec.due_ms, id.clone())));
            } else {
                f.ready.push_back(id.clone());
            }
            g.bytes += rec.input.len();
            g.calls.insert(id, rec);
        }
        if resumed > 0 {
            log::info!("async calls: {resumed} resumed from the store ({interrupted} were running when it stopped)");
        }
    }

    /// Takes a call: bounds checked, written durably, queued. `input_max`
    /// is checked by the caller.
    pub async fn accept(&self, mut rec: Record, settings: &AsyncSettings, max_workers: u32) -> Result<(), Refused> {
        let len = rec.input.len();
        {
            let mut g = lock(&self.inner);
            if g.stopping {
                return Err(Refused::Unavailable("the gateway is stopping; send the call again shortly".into()));
            }
            if g.calls.contains_key(&rec.id) {
                return Err(Refused::Duplicate(format!("call {} is already queued or running", rec.id)));
            }
            let f = g.fns.get(&rec.function).map_or(0, |f| f.unfinished);
            if f >= settings.queue {
                return Err(Refused::Full(format!(
                    "function {} has {f} async calls waiting or running, its limit (async.queue in its manifest)",
                    rec.function
                )));
            }
            if g.calls.len() >= self.cfg.queued_max {
                return Err(Refused::Full(format!(
                    "the gateway holds {} unfinished async calls, its limit (--async-queue-max)",
                    g.calls.len()
                )));
            }
            if g.bytes + len > self.cfg.queued_bytes_max {
                return Err(Refused::Full(format!(
                    "the unfinished async calls' inputs take {} MiB, the gateway's limit",
                    self.cfg.queued_bytes_max >> 20
                )));
            }
            let f = g.fns.entry(rec.function.clone()).or_default();
            f.unfinished += 1;
            f.cap = settings.concurrency_for(max_workers);
            g.bytes += len;
            rec.state = State::Queued;
            g.calls.insert(rec.id.clone(), rec.clone());
        }
        let durable = match self.log.write(Some(&rec), None).await {
            Ok(r) => r,
            Err(_) => Err("the store's writer stopped".to_string()),
        };
        let mut g = lock(&self.inner);
        if let Err(e) = durable {
            // Unless it was cancelled meanwhile (which gave its place back).
            if g.calls.remove(&rec.id).is_some() {
                g.bytes -= len.min(g.bytes);
                if let Some(f) = g.fns.get_mut(&rec.function) {
                    f.unfinished = f.unfinished.saturating_sub(1);
                }
            }
            return Err(Refused::Unavailable(format!("the call could not be stored: {e}")));
        }
        if !g.calls.contains_key(&rec.id) {
            return Ok(()); // cancelled while it was being stored
        }
        g.fns.entry(rec.function.clone()).or_default().ready.push_back(rec.id);
        drop(g);
        self.wake.notify_one();
        Ok(())
    }

    /// The attempts to start now, within the bounds: each marked running
    /// (written, not waited for). Also moves calls whose backoff is over
    /// to their function's queue. When the next backoff ends, if any.
    fn take_ready(&self) -> (Vec<Record>, Option<u64>) {
        let now = unix_ms();
        let mut g = lock(&self.inner);
        let g = &mut *g;
        while let Some(Reverse((due, _))) = g.delayed.peek() {
            if *due > now {
                break;
            }
            let Some(Reverse((_, id))) = g.delayed.pop() else { break };
            if let Some(rec) = g.calls.get(&id) {
                g.fns.entry(rec.function.clone()).or_default().ready.push_back(id);
            }
        }
        let next = g.delayed.peek().map(|Reverse((due, _))| *due);
        let mut out = Vec::new();
        if g.stopping {
            return (out, next);
        }
        let mut progress = true;
        // One call per function per round: functions share the slots.
        while progress && g.running < self.cfg.concurrency {
            progress = false;
            for f in g.fns.values_mut() {
                if g.running >= self.cfg.concurrency {
                    break;
                }
                if f.running >= f.cap.max(1) {
                    continue;
                }
                let Some(id) = f.ready.pop_front() else { continue };
                // Only a queued call starts (an id can be in a queue twice
                // only by mistake; it must not run twice for it).
                let Some(rec) = g.calls.get_mut(&id).filter(|r| r.state == State::Queued) else { continue };
                rec.state = State::Running;
                rec.attempts += 1;
                rec.started_ms = Some(now);
                f.running += 1;
                g.running += 1;
                progress = true;
                // Not waited for: if it is lost, a restart queues the call
                // as it was, and counts this attempt again.
                drop(self.log.write(Some(rec), None));
                out.push(rec.clone());
            }
        }
        (out, next)
    }

    /// Records how an attempt ended: the call succeeded, is tried again
    /// later, or is a dead letter.
    async fn finish(&self, id: &str, function: &str, result: AttemptResult) {
        let now = unix_ms();
        let (rec, written, output) = {
            let mut g = lock(&self.inner);
            let g = &mut *g;
            let Some(rec) = g.calls.get_mut(id).filter(|r| r.state == State::Running) else {
                // Not expected (a start is the only way to Running): the
                // slot is given back all the same.
                log::error!("async call {id} ended but is not among those running");
                if let Some(f) = g.fns.get_mut(function) {
                    f.running = f.running.saturating_sub(1);
                }
                g.running = g.running.saturating_sub(1);
                if g.running == 0 {
                    self.idle.notify_all();
                }
                return;
            };
            let function = rec.function.clone();
            let mut output = Bytes::new();
            match result {
                Ok((out, t, engine)) => {
                    output = out.clone();
                    rec.state = State::Ok;
                    rec.finished_ms = Some(now);
                    rec.result = Some(Outcome {
                        status: 200,
                        output_bytes: out.len(),
                        output: (out.len() <= KEPT_OUTPUT_MAX).then_some(out),
                        queue_us: t.queue_us,
                        exec_us: t.exec_us,
                        cold_us: t.cold_us,
                        engine,
                        ..Outcome::default()
                    });
                    rec.input = Bytes::new();
                }
                Err((kind, msg, t, true)) if rec.not_started >= NOT_STARTED_MAX => {
                    // Never started in all that time: a dead letter, not a
                    // call queued for ever.
                    let msg = format!("{msg}; it could not start in {} tries", rec.not_started + 1);
                    rec.attempts -= 1;
                    dead_letter(rec, kind, msg, now, t);
                }
                Err((_, msg, _, true)) => {
                    // Not started: no attempt spent. Waits for an engine
                    // (one restarting restores its functions first).
                    if rec.errors.last().is_none_or(|e| e.error != "not_started") {
                        rec.errors.push(AttemptError {
                            attempt: rec.attempts,
                            error: "not_started".into(),
                            message: format!("{msg}; waiting for an engine (not counted as an attempt)"),
                            at_ms: now,
                        });
                    }
                    rec.attempts -= 1;
                    rec.state = State::Queued;
                    rec.not_started += 1;
                    let wait = NOT_STARTED_WAIT_MS << rec.not_started.min(6);
                    rec.due_ms = now + jitter(wait.min(NOT_STARTED_WAIT_MAX_MS));
                    g.delayed.push(Reverse((rec.due_ms, id.to_string())));
                }
                Err((kind, msg, t, false)) => {
                    rec.errors.push(AttemptError {
                        attempt: rec.attempts,
                        error: kind.name().into(),
                        message: msg.clone(),
                        at_ms: now,
                    });
                    if rec.errors.len() > ERRORS_KEPT {
                        rec.errors.remove(0);
                    }
                    let again = rec.retry_on.iter().any(|k| k == kind.name()) && rec.attempts < rec.max_attempts;
                    if again {
                        g.ended.entry(function.clone()).or_default()[2] += 1;
                        let n = rec.attempts;
                        let settings = AsyncSettings { backoff_ms: rec.backoff_ms, ..AsyncSettings::default() };
                        rec.state = State::Queued;
                        rec.due_ms = now + jitter(settings.backoff_before(n));
                        g.delayed.push(Reverse((rec.due_ms, id.to_string())));
                    } else {
                        dead_letter(rec, kind, msg, now, t);
                    }
                }
            }
            if rec.state.finished() && rec.callback.is_some() {
                rec.callback_status =
                    Some(CallbackStatus { state: "pending".into(), attempts: 0, status: None, error: None });
            }
            let rec = rec.clone();
            match rec.state {
                State::Ok => g.ended.entry(function.clone()).or_default()[0] += 1,
                State::Failed => g.ended.entry(function.clone()).or_default()[1] += 1,
                _ => {}
            }
            // Queued before the slot is given back: a stop that waits for
            // the slots then flushes the log has this write in it.
            let written = self.log.write(Some(&rec), None);
            if let Some(f) = g.fns.get_mut(&function) {
                f.running -= 1;
                if rec.state.finished() {
                    f.unfinished -= 1;
                }
            }
            g.running -= 1;
            if rec.state.finished() {
                if let Some(r) = g.calls.remove(id) {
                    g.bytes -= r.input_bytes.min(g.bytes);
                }
            }
            if g.running == 0 {
                self.idle.notify_all();
            }
            (rec, written, output)
        };
        self.wake.notify_one();
        if let Ok(Err(e)) = written.await {
            log::error!("async call {id}: its end could not be stored ({e}); a restart runs it again");
        }
        if rec.state.finished() && rec.callback.is_some() {
            self.queue_callback(rec, output, 0);
        }
    }

    /// Runs the queue: starts attempts as slots free up, on this thread's
    /// links to the engines. Never returns.
    pub async fn dispatch(self: Arc<Self>, sh: Arc<GwShared>, th: Rc<ThreadState>) {
        loop {
            // No engine to send to: nothing is started (nor written).
            if !th.any_ready(&sh) {
                tokio::time::sleep(Duration::from_millis(NOT_STARTED_WAIT_MS)).await;
                continue;
            }
            let (starts, next) = self.take_ready();
            for rec in starts {
                let (me, sh, th) = (self.clone(), sh.clone(), th.clone());
                tokio::task::spawn_local(async move {
                    let result = attempt(&sh, &th, &rec).await;
                    me.finish(&rec.id, &rec.function, result).await;
                });
            }
            let wait = next.map_or(Duration::from_secs(1), |due| {
                Duration::from_millis(due.saturating_sub(unix_ms()).clamp(1, 1000))
            });
            tokio::select! {
                () = self.wake.notified() => {}
                () = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// Stops starting attempts and waits (up to the drain time) for those
    /// running, then until their ends are stored. New calls get 503.
    pub fn stop(&self) {
        let mut g = lock(&self.inner);
        g.stopping = true;
        let deadline = std::time::Instant::now() + self.cfg.drain;
        if g.running > 0 {
            log::info!("async calls: waiting up to {:?} for {} attempts under way", self.cfg.drain, g.running);
        }
        while g.running > 0 {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                log::warn!(
                    "async calls: {} attempts still running after {:?}; they run again at the next start",
                    g.running,
                    self.cfg.drain
                );
                break;
            }
            g = self.idle.wait_timeout(g, left).unwrap_or_else(|p| p.into_inner()).0;
        }
        drop(g);
        self.log.flush();
    }

    /// Writes what is queued to the store (a restart test's "stop").
    #[cfg(test)]
    fn stop_for_test(&self) {
        self.log.flush();
    }

    /// A call's record: from memory if it is not finished, else the store.
    pub fn get(&self, id: &str) -> Result<Option<Record>, StoreError> {
        if let Some(r) = lock(&self.inner).calls.get(id) {
            return Ok(Some(r.clone()));
        }
        match self.store.call(id)? {
            Some(b) => serde_json::from_slice(&b).map(Some).map_err(|e| StoreError::Corrupt(id.into(), e)),
            None => Ok(None),
        }
    }

    /// Every call, newest first, those not finished as memory has them.
    pub fn list(&self) -> Result<Vec<Record>, StoreError> {
        let mut out: Vec<Record> = Vec::new();
        for (id, b) in self.store.calls()? {
            match serde_json::from_slice::<Record>(&b) {
                Ok(r) => out.push(r),
                Err(e) => log::warn!("async call {id} in the store is unreadable: {e}"),
            }
        }
        {
            let g = lock(&self.inner);
            for r in &mut out {
                if let Some(m) = g.calls.get(&r.id) {
                    *r = m.clone();
                }
            }
        }
        out.sort_by(|a, b| b.accepted_ms.cmp(&a.accepted_ms).then_with(|| a.id.cmp(&b.id)));
        Ok(out)
    }

    /// Runs a dead letter again, from its first attempt.
    pub async fn replay(&self, id: &str, settings: &AsyncSettings, max_workers: u32) -> Result<Record, ReplayError> {
        let Some(mut rec) = self.get(id).map_err(|e| ReplayError::Store(e.to_string()))? else {
            return Err(ReplayError::NotFound);
        };
        if rec.state != State::Failed {
            return Err(ReplayError::NotFailed(rec.state));
        }
        if self.store.shared() && rec.owner != self.owner {
            // Taken over: this gateway runs it from now on.
            rec.owner = self.owner.clone();
        }
        rec.replays += 1;
        rec.attempts = 0;
        rec.max_attempts = settings.retries + 1;
        rec.backoff_ms = settings.backoff_ms;
        rec.retry_on = settings.retry_on.clone();
        rec.result = None;
        rec.finished_ms = None;
        rec.started_ms = None;
        rec.callback_status = None;
        rec.due_ms = unix_ms();
        self.accept(rec.clone(), settings, max_workers).await.map_err(ReplayError::Refused)?;
        Ok(rec)
    }

    /// Removes a call: a finished one, or a queued one (cancelled). A
    /// running one cannot be: `Err` with its state.
    pub async fn remove(&self, id: &str) -> Result<bool, ReplayError> {
        let in_memory = lock(&self.inner).calls.contains_key(id);
        // Read without the lock (a store may take seconds to answer).
        if !in_memory && self.store.call(id).map_err(|e| ReplayError::Store(e.to_string()))?.is_none() {
            return Ok(false);
        }
        {
            let mut g = lock(&self.inner);
            let g = &mut *g;
            if let Some(r) = g.calls.get(id) {
                if r.state == State::Running {
                    return Err(ReplayError::Running);
                }
                let function = r.function.clone();
                if let Some(r) = g.calls.remove(id) {
                    g.bytes -= r.input_bytes.min(g.bytes);
                }
                if let Some(f) = g.fns.get_mut(&function) {
                    f.unfinished = f.unfinished.saturating_sub(1);
                    f.ready.retain(|x| x != id);
                }
            }
        }
        match self.log.write(None, Some(id)).await {
            Ok(Ok(())) => Ok(true),
            Ok(Err(e)) => Err(ReplayError::Store(e)),
            Err(_) => Err(ReplayError::Store("the store's writer stopped".into())),
        }
    }

    /// The queue in Prometheus's text format, for `/metrics`.
    pub fn render_metrics(&self) -> String {
        use std::fmt::Write as _;
        let g = lock(&self.inner);
        let mut fns: Vec<_> = g.fns.iter().collect();
        fns.sort_by(|a, b| a.0.cmp(b.0));
        let mut s = String::new();
        s.push_str("# HELP staccato_async_queued Async calls accepted and not finished (waiting or running).\n");
        s.push_str("# TYPE staccato_async_queued gauge\n");
        for (name, f) in &fns {
            let _ = writeln!(s, "staccato_async_queued{{function=\"{name}\"}} {}", f.unfinished);
        }
        s.push_str("# HELP staccato_async_running Async calls running now.\n");
        s.push_str("# TYPE staccato_async_running gauge\n");
        for (name, f) in &fns {
            let _ = writeln!(s, "staccato_async_running{{function=\"{name}\"}} {}", f.running);
        }
        let mut ended: Vec<_> = g.ended.iter().collect();
        ended.sort_by(|a, b| a.0.cmp(b.0));
        s.push_str("# HELP staccato_async_finished_total Async calls ended: ok, or failed (dead letters).\n");
        s.push_str("# TYPE staccato_async_finished_total counter\n");
        for (name, n) in &ended {
            let _ = writeln!(s, "staccato_async_finished_total{{function=\"{name}\",outcome=\"ok\"}} {}", n[0]);
            let _ = writeln!(s, "staccato_async_finished_total{{function=\"{name}\",outcome=\"failed\"}} {}", n[1]);
        }
        s.push_str("# HELP staccato_async_retries_total Async attempts that failed and were scheduled again.\n");
        s.push_str("# TYPE staccato_async_retries_total counter\n");
        for (name, n) in &ended {
            let _ = writeln!(s, "staccato_async_retries_total{{function=\"{name}\"}} {}", n[2]);
        }
        s
    }

    /// Removes finished calls older than their retention.
    fn sweep(&self) {
        let now = unix_ms();
        let ok_before = now.saturating_sub(self.cfg.retention.as_millis() as u64);
        let dead_before = now.saturating_sub(self.cfg.dead_retention.as_millis() as u64);
        let rows = match self.store.calls() {
            Ok(r) => r,
            Err(e) => {
                log::warn!("async calls: reading the store to remove old results: {e}");
                return;
            }
        };
        let mut old = Vec::new();
        for (id, b) in rows {
            let Ok(r) = serde_json::from_slice::<Record>(&b) else { continue };
            let before = match r.state {
                State::Ok => ok_before,
                State::Failed => dead_before,
                _ => continue,
            };
            let pending = r.callback_status.as_ref().is_some_and(|c| c.state == "pending");
            if r.finished_ms.is_some_and(|f| f < before) && !pending {
                old.push(id);
            }
        }
        // Through the log, in order with the other changes of each record.
        let n = old.len();
        let written: Vec<_> = old.iter().map(|id| self.log.write(None, Some(id))).collect();
        if let Some(last) = written.into_iter().last() {
            match last.blocking_recv() {
                Ok(Ok(())) => log::info!("async calls: removed {n} finished past their retention"),
                Ok(Err(e)) => log::warn!("async calls: removing old results: {e}"),
                Err(_) => {}
            }
        }
    }

    fn queue_callback(&self, mut rec: Record, output: Bytes, tries: u32) {
        let n = self.next_job.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let due = if tries == 0 { 0 } else { unix_ms() + 1000 * (1 << (tries - 1).min(5)) };
        {
            let mut jobs = lock(&self.jobs);
            let bytes: usize = jobs.values().map(|j| j.output.len()).sum();
            if jobs.len() >= CALLBACK_JOBS_MAX || bytes + output.len() > CALLBACK_BYTES_MAX {
                drop(jobs);
                log::warn!("async call {}: {CALLBACK_JOBS_MAX} callbacks wait already; this one is dropped", rec.id);
                rec.callback_status = Some(CallbackStatus {
                    state: "failed".into(),
                    attempts: tries,
                    status: None,
                    error: Some("the gateway's callback queue was full".into()),
                });
                drop(self.log.write(Some(&rec), None));
                return;
            }
            jobs.insert(n, Job { rec, output, tries });
        }
        let (heap, cv) = &*self.callbacks;
        lock(heap).push(Reverse((due, n)));
        cv.notify_one();
    }

    fn callback_worker(&self) {
        let (heap, cv) = &*self.callbacks;
        loop {
            let n = {
                let mut h = lock(heap);
                loop {
                    let now = unix_ms();
                    match h.peek() {
                        Some(Reverse((due, _))) if *due <= now => break,
                        Some(Reverse((due, _))) => {
                            let wait = Duration::from_millis(due - now);
                            h = cv.wait_timeout(h, wait).unwrap_or_else(|p| p.into_inner()).0;
                        }
                        None => h = cv.wait(h).unwrap_or_else(|p| p.into_inner()),
                    }
                }
                let Some(Reverse((_, n))) = h.pop() else { continue };
                n
            };
            let Some(mut job) = lock(&self.jobs).remove(&n) else { continue };
            let tries = job.tries + 1;
            let sent = self.deliver(&job.rec, &job.output);
            let done = match &sent {
                Ok(status) if (200..300).contains(status) => Some("delivered"),
                _ if tries >= CALLBACK_TRIES => Some("failed"),
                _ => None,
            };
            let (status, error) = match sent {
                Ok(s) if (200..300).contains(&s) => (Some(s), None),
                Ok(s) => (Some(s), Some(format!("the callback answered HTTP {s}"))),
                Err(e) => (None, Some(e)),
            };
            match done {
                None => {
                    log::debug!("async call {}: callback try {tries} failed: {error:?}", job.rec.id);
                    job.rec.callback_status =
                        Some(CallbackStatus { state: "pending".into(), attempts: tries, status, error });
                    self.queue_callback(job.rec, job.output, tries);
                }
                Some(state) => {
                    if state == "failed" {
                        log::warn!("async call {}: callback failed {tries} times: {error:?}", job.rec.id);
                    }
                    job.rec.callback_status =
                        Some(CallbackStatus { state: state.into(), attempts: tries, status, error });
                    // Unless the call was removed (or replayed) meanwhile.
                    let current = self
                        .store
                        .call(&job.rec.id)
                        .ok()
                        .flatten()
                        .and_then(|b| serde_json::from_slice::<Record>(&b).ok());
                    if current.is_some_and(|c| c.state == job.rec.state && c.finished_ms == job.rec.finished_ms) {
                        drop(self.log.write(Some(&job.rec), None));
                    }
                }
            }
        }
    }

    /// Posts a finished call's result to its callback URL.
    fn deliver(&self, rec: &Record, output: &[u8]) -> Result<u16, String> {
        let url = CallbackUrl::parse(rec.callback.as_deref().unwrap_or_default())?;
        let r = rec.result.clone().unwrap_or_default();
        let error_body;
        let (content_type, body) = match &r.error {
            None => ("application/octet-stream", output),
            Some(kind) => {
                error_body = api::http::error_body(kind, r.message.as_deref().unwrap_or(""), Some(&rec.id));
                ("application/json", error_body.as_slice())
            }
        };
        let took = rec.finished_ms.unwrap_or(0).saturating_sub(rec.accepted_ms);
        let headers = [
            (api::http::CALL_ID_HEADER, rec.id.clone()),
            ("X-Function-Name", rec.function.clone()),
            ("X-Function-Status", r.status.to_string()),
            ("X-Staccato-Attempts", rec.attempts.to_string()),
            ("X-Duration-Seconds", format!("{:.6}", took as f64 / 1e3)),
            (api::http::TIMING_HEADER, api::http::timing_value(r.queue_us, r.exec_us, r.cold_us)),
        ];
        callback::post(&self.policy, &url, &callback::Delivery { content_type, headers: &headers, body })
    }

    /// Checks a callback URL when a call is accepted.
    pub fn check_callback(&self, url: &str) -> Result<(), String> {
        self.policy.check(&CallbackUrl::parse(url)?)
    }
}

/// Why a replay or a removal did not happen.
#[derive(Debug)]
pub enum ReplayError {
    NotFound,
    NotFailed(State),
    Running,
    Refused(Refused),
    Store(String),
}

fn dead_letter(rec: &mut Record, kind: ErrorKind, msg: String, now: u64, t: wire::frame::Timing) {
    rec.state = State::Failed;
    rec.finished_ms = Some(now);
    rec.result = Some(Outcome {
        status: kind.http_status(),
        error: Some(kind.name().into()),
        message: Some(msg),
        queue_us: t.queue_us,
        exec_us: t.exec_us,
        cold_us: t.cold_us,
        ..Outcome::default()
    });
}

/// How an attempt ended: the output, the engine's timing and which engine;
/// or the error, and whether the call certainly did not start (no engine
/// was ready, or none had the function yet: it is being restored).
type AttemptResult =
    Result<(Bytes, wire::frame::Timing, Option<String>), (ErrorKind, String, wire::frame::Timing, bool)>;

/// One attempt of a call, sent as an HTTP thread sends a call.
async fn attempt(sh: &GwShared, th: &ThreadState, rec: &Record) -> AttemptResult {
    let call_id = th.next_call_id();
    let (name, input) = (rec.function.as_str(), &rec.input);
    let mut flags = wire::frame::CALL_BACKGROUND;
    if rec.key_checked {
        flags |= wire::frame::CALL_KEY_CHECKED;
    }
    let trace = rec.trace_block();
    let trace = trace.as_deref();
    let sent = th
        .send_call(sh, name, (None, 0), move |l, left_ms| async move {
            l.link.call_flagged(call_id, left_ms, name, input, flags, trace).await
        })
        .await;
    let none = wire::frame::Timing::default();
    match sent {
        None => Err((ErrorKind::EngineUnavailable, "no engine is ready".into(), none, true)),
        Some((Reply::Ok(out, t), engine)) => Ok((out, t, Some(engine.id.clone()))),
        Some((Reply::Err(ErrorKind::NotFound, _, t), _)) if sh.store.get(name).is_ok_and(|s| s.is_some()) => Err((
            ErrorKind::EngineUnavailable,
            format!("function {name} is deployed but not running on the engine yet"),
            t,
            true,
        )),
        Some((Reply::Err(ErrorKind::EngineUnavailable, m, t), _)) if m.contains("invoke key") => Err((
            ErrorKind::BadRequest,
            format!("function {name} needs an invoke key now, and this call was accepted without one"),
            t,
            false,
        )),
        // The engine's queue for it was full, or the call waited there
        // until its deadline and never ran (the engine dispatches ordinary
        // calls first): not an attempt, only a wait.
        // (A worker may report `overloaded` itself after it ran: only the
        // engine's refusal, before any dispatch, counts as not started.)
        Some((Reply::Err(ErrorKind::Overloaded, m, t), _)) if t.exec_us == 0 => {
            Err((ErrorKind::Overloaded, m, t, true))
        }
        Some((Reply::Err(ErrorKind::Timeout, m, t), _)) if t.exec_us == 0 && t.queue_us > 0 => {
            Err((ErrorKind::Timeout, format!("{m} (it waited in the engine's queue and never ran)"), t, true))
        }
        Some((Reply::Err(k, m, t), _)) => Err((k, m, t, false)),
        Some((Reply::Unsent, _)) => Err((
            ErrorKind::EngineUnavailable,
            "the links to the engines failed before the call was sent".into(),
            none,
            true,
        )),
    }
}

/// This gateway's id: made once, kept in its state directory.
fn gateway_id(state_dir: &std::path::Path) -> std::io::Result<String> {
    let path = state_dir.join("gateway.id");
    match std::fs::read_to_string(&path) {
        Ok(s) if valid_id(s.trim()) => return Ok(s.trim().to_string()),
        Ok(_) => log::warn!("{} is not a gateway id; making a new one", path.display()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let id = new_id();
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, &id)?;
    std::fs::rename(&tmp, &path)?;
    Ok(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: &str, function: &str) -> Record {
        Record {
            id: id.into(),
            function: function.into(),
            input: Bytes::from_static(b"in"),
            input_bytes: 2,
            callback: None,
            state: State::Queued,
            attempts: 0,
            max_attempts: 2,
            backoff_ms: 10,
            retry_on: vec!["worker_crashed".into()],
            key_checked: false,
            accepted_ms: unix_ms(),
            due_ms: 0,
            started_ms: None,
            finished_ms: None,
            owner: String::new(),
            errors: Vec::new(),
            result: None,
            callback_status: None,
            replays: 0,
            not_started: 0,
            traceparent: None,
            tracestate: None,
        }
    }

    /// A queue on `store` (a second one on the same store stands for the
    /// gateway restarted: the first's threads hold the database open).
    fn open(store: &Arc<Store>, dir: &std::path::Path) -> Arc<Calls> {
        Calls::open(store.clone(), AsyncConfig::default(), dir, "127.0.0.1:1".parse().unwrap()).unwrap()
    }

    fn block<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(f)
    }

    #[test]
    fn a_call_is_stored_once_runs_once_and_is_resumed_after_a_restart() {
        let dir = std::env::temp_dir().join(format!("staccato-calls-{}", new_id()));
        std::fs::create_dir_all(&dir).unwrap();
        let settings = AsyncSettings::default();
        let a = "a".repeat(32);
        let store = Arc::new(Store::open(&dir.join("functions.redb")).unwrap());
        {
            let c = open(&store, &dir);
            block(c.accept(record(&a, "f"), &settings, 4)).unwrap();
            // The same id again (two replays at once): refused.
            assert!(matches!(block(c.accept(record(&a, "f"), &settings, 4)), Err(Refused::Duplicate(_))));
            let (starts, _) = c.take_ready();
            assert_eq!(starts.len(), 1);
            assert_eq!(starts[0].attempts, 1);
            // Queued twice by mistake, it still starts once.
            lock(&c.inner).fns.get_mut("f").unwrap().ready.push_back(a.clone());
            assert!(c.take_ready().0.is_empty());
            c.stop_for_test();
        }
        // Restarted while it ran: resumed, its attempt counted.
        let c = open(&store, &dir);
        let rec = c.get(&a).unwrap().unwrap();
        assert_eq!((rec.state, rec.attempts), (State::Queued, 1));
        assert_eq!(rec.errors[0].error, "interrupted");
        let (starts, _) = c.take_ready();
        assert_eq!(starts.len(), 1);
        block(c.finish(&a, "f", Ok((Bytes::from_static(b"out"), wire::frame::Timing::default(), None))));
        let g = lock(&c.inner);
        assert_eq!((g.running, g.bytes, g.calls.len()), (0, 0, 0));
        assert_eq!(g.fns["f"].unfinished, 0);
        drop(g);
        c.log.flush();
        let done = c.get(&a).unwrap().unwrap();
        assert_eq!(done.state, State::Ok);
        assert_eq!(done.result.unwrap().output.as_deref(), Some(&b"out"[..]));
        // A finished call is removed (this once deadlocked), then gone.
        assert!(block(c.remove(&a)).unwrap());
        assert!(c.get(&a).unwrap().is_none());
        assert!(!block(c.remove(&a)).unwrap());
        // An end for a call not running gives its slot back all the same.
        lock(&c.inner).running = 1;
        block(c.finish("b", "f", Err((ErrorKind::Timeout, String::new(), wire::frame::Timing::default(), false))));
        assert_eq!(lock(&c.inner).running, 0);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
