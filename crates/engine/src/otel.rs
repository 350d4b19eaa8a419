//! OpenTelemetry spans of calls, exported over OTLP/HTTP (JSON encoding)
//! to a collector (`--otlp-endpoint`).
//!
//! Which calls: an external call whose caller sent a sampled W3C
//! `traceparent` is traced in that trace (parent-based); one without a
//! parent is traced with probability `--trace-sample`, in a trace of its
//! own. An internal call is traced when its caller is, as its child: the
//! engine knows every call's parent (`CallRecord::parent_call_id`), so no
//! runtime carries anything for it; a call forwarded to another server
//! takes its context along (`Forward` frames), and one sent through a
//! gateway over HTTP (`--internal-calls-via`) its `traceparent`.
//!
//! Whatever the callers' flags say, at most [`ROOTS_PER_S`] traces start a
//! second (a client, or an SDK sampling everything, cannot make the engine
//! trace every call); a trace that started keeps all its calls.
//!
//! A call that is not recorded but came with a context (an unsampled
//! parent, or one over the limit) passes it on unchanged but for the
//! sampled flag, which says whether this engine records: its internal
//! calls, the callee engines of its forwarded calls, and its function (the
//! ctx's trace id and `traceparent`, given in the `Dispatch`) see the
//! caller's trace.
//!
//! One span per call: the function's name, from the engine's receipt of the
//! call to its completion, with queue and execution time, cold start,
//! worker, engine and outcome as attributes. Finished spans go to a bounded
//! queue (a full one drops them and counts it) that the exporter thread
//! sends in batches, off the calls' path. Without `--otlp-endpoint` a call
//! costs one branch; with it, an internal call also looks up its caller.
//! A batch the collector does not take is dropped (logged), not retried
//! beyond one fresh connection; spans still queued at exit are lost.

use api::trace::{TraceContext, TraceParent};
use client::http::Requester;
use std::cell::Cell;
use std::io::Read;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Spans waiting for the exporter; beyond this they are dropped.
const QUEUE: usize = 16_384;
/// Spans per export request, and how long a span may wait for one.
const BATCH: usize = 512;
/// Traces started per second at most, sampled parents included.
pub const ROOTS_PER_S: u64 = 1_000;
const FLUSH_EVERY: Duration = Duration::from_secs(1);

/// A call's place in its trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpanCtx {
    pub trace_id: u128,
    /// This call's span; the caller's if it is not recorded.
    pub span_id: u64,
    /// The caller's span (0 for the root of a trace).
    pub parent_span_id: u64,
    /// An internal call (its caller is a function).
    pub internal: bool,
    /// Recorded: its span is exported, and the flag it passes on says so.
    pub recorded: bool,
    /// The caller's `tracestate`, passed on as it came.
    pub state: Option<Arc<str>>,
}

impl SpanCtx {
    /// The context its own calls and function see: this span (or the one
    /// it passes on) as their parent.
    pub fn outgoing(&self) -> TraceContext {
        TraceContext {
            parent: TraceParent { trace_id: self.trace_id, parent_id: self.span_id, sampled: self.recorded },
            state: self.state.as_deref().unwrap_or("").to_owned(),
        }
    }

    /// A `Dispatch`'s prefix (docs/protocol.md: trace id, span id, flags,
    /// state) followed by `input`.
    pub fn dispatch_prefix(&self, input: &[u8]) -> Vec<u8> {
        let state = self.state.as_deref().unwrap_or("");
        let mut b = Vec::with_capacity(api::trace::WIRE_LEN + state.len() + input.len());
        b.extend_from_slice(&self.outgoing().parent.encode());
        b.extend_from_slice(state.as_bytes());
        b.extend_from_slice(input);
        b
    }
}

/// A finished call, as its span says it.
pub struct Span {
    pub ctx: SpanCtx,
    pub function: String,
    pub call_id: u64,
    pub start_unix_ns: u64,
    pub end_unix_ns: u64,
    pub queue_us: u64,
    pub exec_us: u64,
    pub cold: bool,
    pub worker: u32,
    pub outcome: &'static str,
}

pub struct Tracer {
    /// Probability that a call without a parent is traced, as a threshold
    /// on 64 random bits.
    threshold: u64,
    tx: SyncSender<Span>,
    dropped: Arc<AtomicU64>,
    /// The current second (since the engine's start) and the traces
    /// started in it: `second << 32 | count`.
    roots: AtomicU64,
    started: Instant,
}

impl Tracer {
    /// Starts the exporter thread sending to `endpoint` (`http://host:port`,
    /// optionally with a path; `/v1/traces` when it has none).
    pub fn start(endpoint: &str, ratio: f64, engine: String) -> std::io::Result<Tracer> {
        let (base, path) = split_endpoint(endpoint)?;
        let (tx, rx) = sync_channel(QUEUE);
        let dropped = Arc::new(AtomicU64::new(0));
        let d = dropped.clone();
        std::thread::Builder::new()
            .name("otlp-export".into())
            .spawn(move || export_loop(rx, &base, &path, &engine, &d))?;
        Ok(Tracer { threshold: threshold(ratio), tx, dropped, roots: AtomicU64::new(0), started: Instant::now() })
    }

    /// Takes one of this second's [`ROOTS_PER_S`] trace starts, if any is left.
    fn take_root(&self) -> bool {
        let now = self.started.elapsed().as_secs() & 0xffff_ffff;
        let mut cur = self.roots.load(Ordering::Relaxed);
        loop {
            let (sec, n) = (cur >> 32, cur & 0xffff_ffff);
            if sec == now && n >= ROOTS_PER_S {
                return false;
            }
            let next = if sec == now { n + 1 } else { 1 };
            match self.roots.compare_exchange_weak(cur, now << 32 | next, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return true,
                Err(seen) => cur = seen,
            }
        }
    }

    /// The span of an external call: in its caller's trace if that one is
    /// sampled, in a new trace if it has no parent and the dice say so;
    /// an unrecorded caller's context passed on.
    pub fn root(&self, parent: Option<TraceContext>) -> Option<SpanCtx> {
        match parent {
            Some(p) if p.parent.sampled && self.take_root() => Some(Self::recorded(&p, false)),
            Some(p) => Some(Self::passed_on(&p, false)),
            None if self.threshold > 0 && random() <= self.threshold && self.take_root() => Some(SpanCtx {
                trace_id: id128(),
                span_id: id64(),
                parent_span_id: 0,
                internal: false,
                recorded: true,
                state: None,
            }),
            None => None,
        }
    }

    /// The span of a call forwarded from another server's engine, which
    /// recorded its caller if the flag says so (its trace started within
    /// that engine's limit, so it is not counted again here).
    pub fn forwarded(&self, parent: TraceContext) -> SpanCtx {
        if parent.parent.sampled {
            Self::recorded(&parent, true)
        } else {
            Self::passed_on(&parent, true)
        }
    }

    /// The span of an internal call made by a call with a context.
    pub fn child(&self, parent: &SpanCtx) -> SpanCtx {
        if !parent.recorded {
            return SpanCtx { internal: true, ..parent.clone() };
        }
        SpanCtx {
            trace_id: parent.trace_id,
            span_id: id64(),
            parent_span_id: parent.span_id,
            internal: true,
            recorded: true,
            state: parent.state.clone(),
        }
    }

    fn recorded(p: &TraceContext, internal: bool) -> SpanCtx {
        SpanCtx {
            trace_id: p.parent.trace_id,
            span_id: id64(),
            parent_span_id: p.parent.parent_id,
            internal,
            recorded: true,
            state: (!p.state.is_empty()).then(|| p.state.as_str().into()),
        }
    }

    fn passed_on(p: &TraceContext, internal: bool) -> SpanCtx {
        SpanCtx {
            trace_id: p.parent.trace_id,
            span_id: p.parent.parent_id,
            parent_span_id: p.parent.parent_id,
            internal,
            recorded: false,
            state: (!p.state.is_empty()).then(|| p.state.as_str().into()),
        }
    }

    /// Hands a finished span to the exporter; never waits.
    pub fn finish(&self, span: Span) {
        if self.tx.try_send(span).is_err() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// `ratio` in [0, 1] as a threshold on a uniform u64 (0: never).
fn threshold(ratio: f64) -> u64 {
    if ratio <= 0.0 || ratio.is_nan() {
        0
    } else if ratio >= 1.0 {
        u64::MAX
    } else {
        (ratio * u64::MAX as f64) as u64
    }
}

fn split_endpoint(endpoint: &str) -> std::io::Result<(String, String)> {
    let rest = endpoint.strip_prefix("http://").ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("--otlp-endpoint {endpoint}: give an http:// URL"),
        )
    })?;
    let (hostport, path) = match rest.find('/') {
        Some(i) if rest[i..].len() > 1 => (&rest[..i], rest[i..].to_string()),
        Some(i) => (&rest[..i], "/v1/traces".to_string()),
        None => (rest, "/v1/traces".to_string()),
    };
    if hostport.is_empty() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("--otlp-endpoint {endpoint}: no host"),
        ));
    }
    Ok((format!("http://{hostport}"), path))
}

thread_local! {
    static RNG: Cell<u64> = Cell::new(seed());
}

fn seed() -> u64 {
    let mut b = [0u8; 8];
    let urandom = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b));
    let s = match urandom {
        Ok(()) => u64::from_le_bytes(b),
        Err(_) => sys::clock::unix_us() ^ sys::clock::monotonic_ns().rotate_left(32),
    };
    s | 1
}

/// 64 random bits (xorshift64* per thread, seeded from /dev/urandom): ids
/// and sampling, not secrets.
fn random() -> u64 {
    RNG.with(|r| {
        let mut x = r.get();
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        r.set(x);
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    })
}

/// A span id: never 0 (invalid in W3C and OTLP).
fn id64() -> u64 {
    loop {
        let x = random();
        if x != 0 {
            return x;
        }
    }
}

fn id128() -> u128 {
    u128::from(id64()) << 64 | u128::from(random())
}

fn export_loop(rx: Receiver<Span>, base: &str, path: &str, engine: &str, dropped: &AtomicU64) {
    let mut client: Option<client::http::Client> = None;
    let mut batch: Vec<Span> = Vec::with_capacity(BATCH);
    let mut oldest: Option<Instant> = None;
    let (mut warned_at, mut reported_drops) = (None::<Instant>, 0u64);
    loop {
        let wait = oldest.map_or(FLUSH_EVERY, |t| FLUSH_EVERY.saturating_sub(t.elapsed()));
        match rx.recv_timeout(wait) {
            Ok(s) => {
                oldest.get_or_insert_with(Instant::now);
                batch.push(s);
                if batch.len() < BATCH {
                    continue;
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => {
                if batch.is_empty() {
                    return;
                }
            }
        }
        if batch.is_empty() {
            continue;
        }
        let body = otlp_json(&batch, engine);
        let post = |c: Option<client::http::Client>| {
            c.map_or_else(|| client::http::Client::new(base, None), Ok).and_then(|mut c| {
                c.timeout = Duration::from_secs(5);
                let r = c.request_with_headers("POST", path, &body, &[("Content-Type", "application/json")])?;
                Ok((c, r.status))
            })
        };
        // A kept connection the collector closed meanwhile: once more on a new one.
        let reused = client.is_some();
        let sent = match post(client.take()) {
            Err(_) if reused => post(None),
            other => other,
        }
        .map(|(c, status)| {
            client = Some(c);
            status
        });
        let trouble = match sent {
            Ok(s) if (200..300).contains(&s) => None,
            Ok(s) => Some(format!("the collector answered HTTP {s}")),
            Err(e) => Some(e.to_string()),
        };
        let drops = dropped.load(Ordering::Relaxed);
        // At most one line a minute about a collector in trouble.
        if (trouble.is_some() || drops > reported_drops) && warned_at.is_none_or(|t| t.elapsed().as_secs() >= 60) {
            log::warn!(
                "OTLP export to {base}{path}: {} ({} spans in this batch; {drops} dropped so far, the queue full)",
                trouble.as_deref().unwrap_or("ok"),
                batch.len()
            );
            warned_at = Some(Instant::now());
            reported_drops = drops;
        }
        batch.clear();
        oldest = None;
    }
}

/// An `ExportTraceServiceRequest` in OTLP's JSON encoding (ids as hex,
/// 64-bit integers as strings, enums as numbers).
pub fn otlp_json(spans: &[Span], engine: &str) -> Vec<u8> {
    use serde_json::json;
    let attr_s = |k: &str, v: &str| json!({"key": k, "value": {"stringValue": v}});
    let attr_i = |k: &str, v: u64| json!({"key": k, "value": {"intValue": v.to_string()}});
    let attr_b = |k: &str, v: bool| json!({"key": k, "value": {"boolValue": v}});
    let spans: Vec<serde_json::Value> = spans
        .iter()
        .map(|s| {
            let mut v = json!({
                "traceId": format!("{:032x}", s.ctx.trace_id),
                "spanId": format!("{:016x}", s.ctx.span_id),
                "name": s.function,
                // SERVER for a call from outside, INTERNAL for a function's call.
                "kind": if s.ctx.internal { 1 } else { 2 },
                "startTimeUnixNano": s.start_unix_ns.to_string(),
                "endTimeUnixNano": s.end_unix_ns.max(s.start_unix_ns).to_string(),
                "attributes": [
                    attr_s("staccato.function", &s.function),
                    attr_s("staccato.call_id", &format!("{:016x}", s.call_id)),
                    attr_i("staccato.queue_us", s.queue_us),
                    attr_i("staccato.exec_us", s.exec_us),
                    attr_b("staccato.cold_start", s.cold),
                    attr_i("staccato.worker", u64::from(s.worker)),
                    attr_s("staccato.engine", engine),
                    attr_s("staccato.outcome", s.outcome),
                ],
                // ERROR (2) for a failed call; unset otherwise.
                "status": if s.outcome == "ok" { json!({}) } else { json!({"code": 2, "message": s.outcome}) },
            });
            if s.ctx.parent_span_id != 0 {
                v["parentSpanId"] = json!(format!("{:016x}", s.ctx.parent_span_id));
            }
            if let Some(state) = &s.ctx.state {
                v["traceState"] = json!(&**state);
            }
            v
        })
        .collect();
    let doc = json!({"resourceSpans": [{
        "resource": {"attributes": [attr_s("service.name", "staccato"), attr_s("staccato.engine", engine)]},
        "scopeSpans": [{"scope": {"name": "staccato-engine", "version": env!("CARGO_PKG_VERSION")}, "spans": spans}],
    }]});
    serde_json::to_vec(&doc).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampling_follows_the_parent_and_the_ratio() {
        let (tx, _rx) = sync_channel(1);
        let t = |ratio| Tracer {
            threshold: threshold(ratio),
            tx: tx.clone(),
            dropped: Arc::default(),
            roots: AtomicU64::new(0),
            started: Instant::now(),
        };
        let p = TraceContext { parent: TraceParent { trace_id: 5, parent_id: 6, sampled: true }, state: "a=b".into() };
        let s = t(0.0).root(Some(p.clone())).expect("a sampled parent is followed whatever the ratio");
        assert_eq!((s.trace_id, s.parent_span_id, s.internal, s.recorded), (5, 6, false, true));
        assert_eq!(s.state.as_deref(), Some("a=b"));
        assert!(s.span_id != 6);
        // An unsampled parent is passed on, not recorded, to the function and its callees.
        let unsampled = TraceContext { parent: TraceParent { sampled: false, ..p.parent }, state: String::new() };
        let u = t(1.0).root(Some(unsampled.clone())).expect("passed on");
        assert_eq!((u.trace_id, u.span_id, u.recorded, u.state.clone()), (5, 6, false, None));
        assert_eq!(u.outgoing(), unsampled);
        let uc = t(1.0).child(&u);
        assert_eq!((uc.span_id, uc.recorded, uc.internal), (6, false, true));
        assert_eq!(t(0.0).root(None), None);
        let c = t(1.0).root(None).expect("ratio 1 traces every root");
        assert!(c.trace_id != 0 && c.span_id != 0 && c.parent_span_id == 0 && c.recorded);
        let k = t(1.0).child(&c);
        assert_eq!((k.trace_id, k.parent_span_id, k.internal, k.recorded), (c.trace_id, c.span_id, true, true));
        // Across servers: a recorded caller's callee is recorded there, beyond the limit.
        let f = t(0.0).forwarded(k.outgoing());
        assert_eq!((f.trace_id, f.parent_span_id, f.internal, f.recorded), (k.trace_id, k.span_id, true, true));
        assert!(!t(0.0).forwarded(u.outgoing()).recorded);
        // The Dispatch prefix: context, then state, then the input.
        let d = s.dispatch_prefix(b"in");
        assert_eq!(
            TraceParent::decode(&d[..25]),
            Some(TraceParent { trace_id: 5, parent_id: s.span_id, sampled: true })
        );
        assert_eq!(&d[25..], b"a=bin");
        let n = (0..20_000).filter(|_| t(0.1).root(None).is_some()).count();
        assert!((1_600..2_400).contains(&n), "{n} of 20,000 at 10%");
        // A client sampling every call starts at most ROOTS_PER_S traces a second.
        let one = t(0.0);
        let started =
            (0..3 * ROOTS_PER_S).filter(|_| one.root(Some(p.clone())).is_some_and(|s| s.recorded)).count() as u64;
        assert!((ROOTS_PER_S..=2 * ROOTS_PER_S).contains(&started), "{started}");
        // Those over the limit are passed on, flagged unsampled.
        let over = (0..3 * ROOTS_PER_S).filter_map(|_| one.root(Some(p.clone()))).find(|s| !s.recorded);
        assert!(over.is_some_and(|o| !o.outgoing().parent.sampled && o.span_id == 6));
    }

    #[test]
    fn endpoints_and_the_json() {
        assert_eq!(split_endpoint("http://c:4318").unwrap(), ("http://c:4318".into(), "/v1/traces".into()));
        assert_eq!(split_endpoint("http://c:4318/").unwrap(), ("http://c:4318".into(), "/v1/traces".into()));
        assert_eq!(split_endpoint("http://c:4318/x/y").unwrap(), ("http://c:4318".into(), "/x/y".into()));
        assert!(split_endpoint("https://c").is_err() && split_endpoint("http:///v1").is_err());
        let ctx = SpanCtx {
            trace_id: 1,
            span_id: 2,
            parent_span_id: 3,
            internal: true,
            recorded: true,
            state: Some("k=v".into()),
        };
        let span = Span {
            ctx,
            function: "f".into(),
            call_id: 9,
            start_unix_ns: 10,
            end_unix_ns: 20,
            queue_us: 1,
            exec_us: 2,
            cold: false,
            worker: 4,
            outcome: "timeout",
        };
        let v: serde_json::Value = serde_json::from_slice(&otlp_json(&[span], "e1")).unwrap();
        let s = &v["resourceSpans"][0]["scopeSpans"][0]["spans"][0];
        assert_eq!(s["traceId"], "00000000000000000000000000000001");
        assert_eq!(
            (s["spanId"].as_str(), s["parentSpanId"].as_str()),
            (Some("0000000000000002"), Some("0000000000000003"))
        );
        assert_eq!((s["kind"].as_u64(), s["status"]["code"].as_u64()), (Some(1), Some(2)));
        assert_eq!((s["startTimeUnixNano"].as_str(), s["endTimeUnixNano"].as_str()), (Some("10"), Some("20")));
        assert_eq!(s["traceState"], "k=v");
    }
}
