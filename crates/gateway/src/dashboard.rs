//! The live dashboard: `GET /ui` (a page and its script, static, no build
//! chain) and the data behind it, `GET /system/dashboard` (one snapshot)
//! and `GET /system/dashboard/stream` (a snapshot a second as server-sent
//! events). The data routes are management routes (token, same origin);
//! the page holds no data and asks for the token, which it keeps in the
//! tab's sessionStorage and sends as a bearer token.
//!
//! A snapshot carries cumulative counts and histograms: the page takes
//! rates and windowed percentiles from the difference between two, so the
//! gateway keeps no per-viewer state.

use crate::http::{engine_status, to_all_traces};
use crate::metrics::BUCKETS_S;
use crate::GwShared;
use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Frame};
use hyper::header::{CACHE_CONTROL, CONTENT_TYPE};
use hyper::Response;
use serde_json::{json, Map, Value};
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::sync::Mutex;
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub type StreamResp = Response<UnsyncBoxBody<Bytes, Infallible>>;

/// Recent calls a snapshot carries (all engines together).
const RECENT: u32 = 60;
/// A stream ends after this long; the page opens another (so a tab left
/// open does not hold a connection slot for ever without a fresh check
/// of its token).
const STREAM_FOR: Duration = Duration::from_secs(600);
const PERIOD: Duration = Duration::from_secs(1);

const PAGE: &str = include_str!("ui/index.html");
const SCRIPT: &str = include_str!("ui/app.js");

/// What the page may load: its own script, nothing from elsewhere, and it
/// may not be framed.
const CSP: &str = "default-src 'none'; script-src 'self'; connect-src 'self'; style-src 'unsafe-inline'; \
                   img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'none'";

/// `/ui` and `/ui/app.js`.
pub fn asset(path: &str) -> Option<Response<Full<Bytes>>> {
    let (body, ctype) = match path {
        "/ui" | "/ui/" => (PAGE, "text/html; charset=utf-8"),
        "/ui/app.js" => (SCRIPT, "text/javascript; charset=utf-8"),
        _ => return None,
    };
    Some(
        Response::builder()
            .header(CONTENT_TYPE, ctype)
            .header("content-security-policy", CSP)
            .header("x-content-type-options", "nosniff")
            .header("referrer-policy", "no-referrer")
            .header(CACHE_CONTROL, "no-cache")
            .body(Full::new(Bytes::from_static(body.as_bytes())))
            .expect("static response parts"),
    )
}

/// Streams open at once, on all threads: each asks the engines for their
/// state once a second at most (the snapshot is shared, `Board`).
const STREAMS_MAX: usize = 32;

/// What the viewers share: the latest snapshot (one a second is taken,
/// however many watch), and the streams open.
#[derive(Default)]
pub struct Board {
    latest: Mutex<Option<(Instant, Arc<Value>)>>,
    streams: AtomicUsize,
}

/// One open stream, counted while it lives.
struct StreamSlot(Arc<GwShared>);

impl Drop for StreamSlot {
    fn drop(&mut self) {
        self.0.dashboard.streams.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The latest snapshot if it was begun less than half a tick ago, else a
/// new one (viewers on different threads may each take one at the same
/// moment; at most one a half tick each).
pub async fn shared_snapshot(sh: &Arc<GwShared>) -> Arc<Value> {
    if let Some((at, v)) = sh.dashboard.latest.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
        if at.elapsed() < PERIOD / 2 {
            return v.clone();
        }
    }
    let begun = Instant::now();
    let v = Arc::new(snapshot(sh).await);
    *sh.dashboard.latest.lock().unwrap_or_else(|p| p.into_inner()) = Some((begun, v.clone()));
    v
}

/// One snapshot: per function the gateway's counts and histograms and
/// each engine's live state of it; the engines; the latest calls.
pub async fn snapshot(sh: &Arc<GwShared>) -> Value {
    let mut functions: Map<String, Value> =
        sh.metrics.snapshot().into_iter().map(|(k, mut v)| (k, std::mem::take(&mut v))).collect();
    let status = engine_status(sh, false).await;
    for (engine, f) in status.functions {
        let entry = functions.entry(f.name.clone()).or_insert_with(|| json!({}));
        let live = json!({
            "engine": engine, "runtime": f.runtime, "tau": f.scheduler.tau,
            "workers": f.scheduler.pool + f.scheduler.starting, "busy": f.scheduler.running,
            "queued": f.scheduler.queued, "paused": f.container.as_ref().map(|c| c.paused),
            "launcher": f.launcher, "last_error": f.last_error, "completed": f.completed, "failed": f.failed,
        });
        match entry.get_mut("engines").and_then(Value::as_array_mut) {
            Some(a) => a.push(live),
            None => entry["engines"] = json!([live]),
        }
    }
    let engines: Vec<Value> = sh
        .engines
        .rows()
        .into_iter()
        .map(|e| {
            let pool = status.pools.iter().find(|(id, _)| *id == e.id).map(|(_, p)| p);
            json!({"id": e.id, "state": e.state, "in_flight": e.in_flight, "calls": e.calls, "pool": pool})
        })
        .collect();
    let recent = to_all_traces(sh, None, RECENT).await;
    json!({
        "time_ms": SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64),
        "bounds_s": BUCKETS_S,
        "functions": functions,
        "engines": engines,
        "recent": recent,
    })
}

/// A snapshot a second as `text/event-stream`, for [`STREAM_FOR`]; 503
/// beyond [`STREAMS_MAX`] streams open.
pub fn stream(sh: Arc<GwShared>) -> StreamResp {
    if sh.dashboard.streams.fetch_add(1, Ordering::Relaxed) >= STREAMS_MAX {
        sh.dashboard.streams.fetch_sub(1, Ordering::Relaxed);
        let msg = format!("{STREAMS_MAX} dashboard streams are open already; close one");
        return crate::http::error_resp(hyper::StatusCode::SERVICE_UNAVAILABLE, "overloaded", &msg, None)
            .map(BodyExt::boxed_unsync);
    }
    let mut tick = tokio::time::interval(PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let slot = StreamSlot(sh.clone());
    let body = Events { sh, _slot: slot, tick, next: None, ends: tokio::time::Instant::now() + STREAM_FOR };
    Response::builder()
        .header(CONTENT_TYPE, "text/event-stream")
        .header(CACHE_CONTROL, "no-cache")
        .body(body.boxed_unsync())
        .expect("static response parts")
}

/// The stream's body: on each tick, a snapshot as one `data:` event.
struct Events {
    sh: Arc<GwShared>,
    _slot: StreamSlot,
    tick: tokio::time::Interval,
    next: Option<Pin<Box<dyn Future<Output = Bytes> + Send>>>,
    ends: tokio::time::Instant,
}

impl Body for Events {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = &mut *self;
        loop {
            if let Some(f) = this.next.as_mut() {
                let bytes = std::task::ready!(f.as_mut().poll(cx));
                this.next = None;
                return Poll::Ready(Some(Ok(Frame::data(bytes))));
            }
            if tokio::time::Instant::now() >= this.ends {
                return Poll::Ready(None);
            }
            std::task::ready!(this.tick.poll_tick(cx));
            let sh = this.sh.clone();
            this.next = Some(Box::pin(async move {
                // JSON has no raw newlines outside strings: one data line.
                let v = shared_snapshot(&sh).await;
                Bytes::from(format!("data: {v}\n\n"))
            }));
        }
    }
}
