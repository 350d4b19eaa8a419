//! HTTP routes: `/function/{name}` runs a function, `/async-function/{name}`
//! queues a call of it ([`crate::async_http`]); `/system/*` manages them; `/healthz` and `/metrics` observe the gateway.
//!
//! Everything here is hostile until checked: a gateway on loopback answers
//! only requests addressed to a loopback name (a web page cannot reach it by
//! DNS rebinding); management requests must carry the token, must not come
//! from another origin's page, and must say what they send with a content
//! type no HTML form can (so a cross-site form cannot post one).

use crate::cluster::Engine;
use crate::control::ControlError;
use crate::engine_link::Reply;
use crate::inputs;
use crate::keys::Verdict;
use crate::store::KeyPut;
use crate::{GwShared, ThreadState};
use api::control as ctl;
use api::spec::Auth;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE, HOST, WWW_AUTHENTICATE};
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{json, Value};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;
use wire::frame::Timing;
use wire::ErrorKind;

pub type Resp = Response<Full<Bytes>>;

pub use api::http::{CALL_ID_HEADER, ENGINE_HEADER, TIMEOUT_HEADER, TIMING_HEADER};

/// Every request of a gateway connection: the dashboard's event stream,
/// whose body is open-ended, or any other route ([`handle`]).
pub(crate) async fn serve(
    sh: Arc<GwShared>,
    th: Rc<ThreadState>,
    req: Request<Incoming>,
    management_only: bool,
) -> crate::dashboard::StreamResp {
    if req.method() == Method::GET && req.uri().path() == "/system/dashboard/stream" {
        if let Some(refusal) = wrong_host(&sh, &req).or_else(|| refused_management(&sh, &req)) {
            return refusal.map(BodyExt::boxed_unsync);
        }
        // The connections kept for management beyond the limit are for
        // short requests: a stream would hold one for minutes.
        if management_only {
            let msg = "the gateway is at its connection limit; the dashboard's stream waits for a free connection";
            return error_resp(StatusCode::SERVICE_UNAVAILABLE, "overloaded", msg, None).map(BodyExt::boxed_unsync);
        }
        return crate::dashboard::stream(sh);
    }
    handle(sh, th, req, management_only).await.map(BodyExt::boxed_unsync)
}

/// A gateway on loopback answers only requests addressed to a loopback
/// name (a web page cannot reach it by DNS rebinding).
fn wrong_host(sh: &GwShared, req: &Request<Incoming>) -> Option<Resp> {
    if !sh.cfg.listen.ip().is_loopback() || inputs::loopback_host(req.headers()) {
        return None;
    }
    let host = req.headers().get(HOST).map_or_else(String::new, |h| String::from_utf8_lossy(h.as_bytes()).into_owned());
    Some(error_resp(
        StatusCode::FORBIDDEN,
        "forbidden",
        &format!(
            "this gateway listens on loopback and answers only requests for localhost or a loopback address, \
             not Host {host:?}"
        ),
        None,
    ))
}

/// Management requests come from no other site's page and carry the token.
fn refused_management(sh: &GwShared, req: &Request<Incoming>) -> Option<Resp> {
    if let Some(why) = inputs::cross_origin(req.headers()) {
        return Some(error_resp(StatusCode::FORBIDDEN, "forbidden", &why, None));
    }
    if !authorized(sh, req) {
        return Some(error_resp(StatusCode::UNAUTHORIZED, "unauthorized", "missing or wrong bearer token", None));
    }
    None
}

/// `management_only`: the connection is beyond the connection limit and
/// may only reach `/system/*`, `/healthz` and `/livez` (calls get 503).
pub(crate) async fn handle(
    sh: Arc<GwShared>,
    th: Rc<ThreadState>,
    req: Request<Incoming>,
    management_only: bool,
) -> Resp {
    if let Some(refusal) = wrong_host(&sh, &req) {
        return refusal;
    }
    let path = req.uri().path().to_string();
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    if management_only && !matches!(segs.first(), Some(&"system" | &"healthz" | &"livez")) {
        return error_resp(
            StatusCode::SERVICE_UNAVAILABLE,
            "overloaded",
            &format!(
                "the gateway has {} connections open, its limit (--max-connections); retry on a fresh connection",
                sh.cfg.connections_max
            ),
            None,
        );
    }
    match (req.method(), segs.as_slice()) {
        (&Method::POST | &Method::GET, ["function", name]) => {
            let name = name.to_string();
            invoke(&sh, &th, &name, req).await
        }
        (&Method::POST, ["async-function", name]) => crate::async_http::accept(&sh, &th, name, req).await,
        (&Method::GET, ["healthz"]) => {
            // Healthy means calls can succeed: an engine is connected, and
            // every stored function is on it (after a (re)connection too).
            let up = th.any_ready(&sh);
            let body = json!({"status": if up {"ok"} else {"degraded"}, "engine": if up {"up"} else {"down"}});
            json_resp(if up { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE }, &body)
        }
        // Alive means this process answers HTTP, whatever its engines do: a
        // liveness probe on /healthz would restart a gateway whose engines
        // are away, which brings none of them back.
        (&Method::GET, ["livez"]) => json_resp(StatusCode::OK, &json!({"status": "ok"})),
        (&Method::GET, ["metrics"]) => Response::builder()
            .header(CONTENT_TYPE, "text/plain; version=0.0.4")
            .body(Full::new(Bytes::from(metrics(&sh).await)))
            .expect("static response parts"),
        // The dashboard's page: static, no data (that is behind the token).
        (&Method::GET, ["ui"] | ["ui", _]) => crate::dashboard::asset(&path).unwrap_or_else(|| {
            error_resp(StatusCode::NOT_FOUND, "not_found", &format!("no route for GET {path}"), None)
        }),
        (_, ["system", ..]) => {
            if let Some(refusal) = refused_management(&sh, &req) {
                return refusal;
            }
            system(&sh, req, &segs[1..]).await
        }
        _ => error_resp(StatusCode::NOT_FOUND, "not_found", &format!("no route for {} {path}", req.method()), None),
    }
}

/// What the engines said of themselves, asked for now; an engine that
/// does not answer is left out.
#[derive(Default)]
pub(crate) struct EngineStatus {
    /// (engine id, the state of a function it runs).
    pub functions: Vec<(String, ctl::FunctionStatus)>,
    /// (engine id, its isolation pool), for engines with containers.
    pub pools: Vec<(String, ctl::PoolStatus)>,
}

pub(crate) async fn engine_status(sh: &GwShared, usage: bool) -> EngineStatus {
    let mut out = EngineStatus::default();
    let req = if usage { ctl::Request::StatusWithUsage } else { ctl::Request::Status };
    for (e, answer) in to_all(sh, req, Vec::new()).await {
        if let Ok(ctl::Reply::Status { functions, pool }) = answer {
            out.functions.extend(functions.into_iter().map(|f| (e.id.clone(), f)));
            out.pools.extend(pool.map(|p| (e.id.clone(), p)));
        }
    }
    out
}

/// The latest calls each engine recorded (`limit` from each), with the
/// engine's id in each record; an engine that does not answer is left out.
pub(crate) async fn to_all_traces(sh: &GwShared, function: Option<String>, limit: u32) -> Vec<Value> {
    let mut out = Vec::new();
    for (e, answer) in to_all(sh, ctl::Request::Trace { function, limit }, Vec::new()).await {
        match answer {
            Ok(ctl::Reply::Traces { traces }) => out.extend(traces.into_iter().map(|t| {
                let mut v = json!(t);
                v["engine"] = json!(e.id);
                v
            })),
            Ok(other) => log::warn!("traces of engine {}: an unexpected reply: {other:?}", e.id),
            Err(err) => log::warn!("traces of engine {}: {err}", e.id),
        }
    }
    out
}

/// `/metrics`: the gateway's counts and histograms, the async queue, and
/// each engine's live state (up, and per function τ, workers, queued,
/// paused), asked for now.
async fn metrics(sh: &Arc<GwShared>) -> String {
    use std::fmt::Write as _;
    let mut s = sh.metrics.render() + &sh.calls.render_metrics();
    s.push_str("# HELP staccato_engine_up Whether an engine takes calls (1) or not (restoring, unreachable).\n");
    s.push_str("# TYPE staccato_engine_up gauge\n");
    for e in sh.engines.rows() {
        let _ = writeln!(s, "staccato_engine_up{{engine=\"{}\"}} {}", e.id, u8::from(e.state == "ready"));
    }
    s.push_str(
        "# HELP staccato_front_door_moves_total Client connections the engine's front door moved to the I/O thread \
         of the vCPU their client now sends from.\n# TYPE staccato_front_door_moves_total counter\n",
    );
    let _ = writeln!(
        s,
        "staccato_front_door_moves_total {}",
        sh.front_door_moves.load(std::sync::atomic::Ordering::Relaxed)
    );
    let status = engine_status(sh, false).await;
    type PoolFigure = (&'static str, &'static str, &'static str, fn(&ctl::PoolStatus) -> f64);
    let pool: [PoolFigure; 6] = [
        ("staccato_pool_idle", "gauge", "Containers ready in the engine's isolation pool.", |p| p.idle as f64),
        ("staccato_pool_target", "gauge", "Containers the pool keeps ready.", |p| p.target as f64),
        ("staccato_pool_created_total", "counter", "Containers the pool made (refills and misses).", |p| {
            p.created as f64
        }),
        ("staccato_pool_reused_total", "counter", "Containers given back, cleaned and made ready again.", |p| {
            p.reused as f64
        }),
        ("staccato_pool_destroyed_total", "counter", "Containers destroyed.", |p| p.destroyed as f64),
        (
            "staccato_pool_misses_total",
            "counter",
            "Functions that found the pool empty and waited for a container.",
            |p| p.misses as f64,
        ),
    ];
    for (name, kind, help, value) in pool {
        let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (engine, p) in &status.pools {
            let _ = writeln!(s, "{name}{{engine=\"{engine}\"}} {}", value(p));
        }
    }
    let rows = status.functions;
    type Gauge = (&'static str, &'static str, fn(&ctl::FunctionStatus) -> f64);
    let gauges: [Gauge; 6] = [
        ("staccato_tau", "The concurrency hint τ (Nightcore §3.3).", |f| f64::from(f.scheduler.tau)),
        ("staccato_workers", "Workers started or starting.", |f| (f.scheduler.pool + f.scheduler.starting) as f64),
        ("staccato_workers_busy", "Workers running a call.", |f| f64::from(f.scheduler.running)),
        ("staccato_queued", "Calls waiting in the engine for a worker.", |f| f.scheduler.queued as f64),
        ("staccato_worker_ready_seconds", "The latest worker start (asked for to ready).", |f| {
            f.scheduler.worker_ready_us.last().map_or(0.0, |us| *us as f64 / 1e6)
        }),
        ("staccato_container_paused", "Whether the function's container is paused (1) or running (0).", |f| {
            f.container.as_ref().map_or(0.0, |c| f64::from(u8::from(c.paused)))
        }),
    ];
    for (name, help, value) in gauges {
        let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} gauge");
        for (engine, f) in &rows {
            let _ = writeln!(s, "{name}{{function=\"{}\",engine=\"{engine}\"}} {}", f.name, value(f));
        }
    }
    s
}

fn authorized(sh: &GwShared, req: &Request<Incoming>) -> bool {
    let Some(token) = sh.cfg.token.as_deref() else { return true };
    let presented = inputs::bearer(req.headers());
    // Always compare, so a missing header takes as long as a wrong one.
    api::auth::token_matches(presented, token) && !presented.is_empty()
}

fn wrong_type(want: &str, got: &str) -> Resp {
    let got = if got.is_empty() { "none" } else { got };
    error_resp(StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type", &format!("send {want}, not {got}"), None)
}

/// The answer to a call of a function that needs an invoke key, without
/// one of its keys.
pub(crate) fn refused_key(sh: &GwShared, th: &ThreadState, name: &str, verdict: &Verdict, start: Instant) -> Resp {
    sh.metrics.record(th.index(), name, "unauthorized", start.elapsed().as_secs_f64(), None);
    let msg = if *verdict == Verdict::Missing {
        format!(
            "function {name} needs an invoke key: send Authorization: Bearer <key> (make one with \
             `staccato key create {name}`)"
        )
    } else {
        format!("that is not an invoke key of function {name} (wrong, or revoked)")
    };
    let mut r = error_resp(StatusCode::UNAUTHORIZED, "unauthorized", &msg, None);
    r.headers_mut().insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    r
}

async fn invoke(sh: &GwShared, th: &ThreadState, name: &str, req: Request<Incoming>) -> Resp {
    let start = Instant::now();
    let bearer = inputs::bearer(req.headers()).to_vec();
    let trace = inputs::trace_context(req.headers());
    let verdict = sh.keys.check(name, &bearer);
    if matches!(verdict, Verdict::Missing | Verdict::Wrong) {
        return refused_key(sh, th, name, &verdict, start);
    }
    let call_id = th.next_call_id();
    let mut served_by: Option<Arc<Engine>> = None;
    let max = sh.cfg.payload_len_max;
    let declared = inputs::content_length(req.headers());
    let timeout_ms = inputs::timeout_ms(req.headers());
    let outcome = if let Err(e) = timeout_ms {
        Err((ErrorKind::BadRequest, e.to_string(), Timing::default()))
    } else if !wire::valid_function_name(name) {
        Err((ErrorKind::NotFound, format!("no function named {name:?}"), Timing::default()))
    } else if declared.is_some_and(|n| n > max as u64) {
        Err((ErrorKind::PayloadTooLarge, format!("request body exceeds the {max}-byte limit"), Timing::default()))
    } else {
        match Limited::new(req.into_body(), max).collect().await {
            Err(e) => {
                let (kind, msg) = if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() {
                    (ErrorKind::PayloadTooLarge, format!("request body exceeds the {max}-byte limit"))
                } else {
                    (ErrorKind::BadRequest, format!("reading request body: {e}"))
                };
                Err((kind, msg, Timing::default()))
            }
            Ok(body) => {
                let (input, timeout_ms) = (body.to_bytes(), timeout_ms.unwrap_or(0));
                match send(sh, th, name, (call_id, timeout_ms, trace), &input, (&bearer, &verdict)).await {
                    Sent::Refused(v) => return refused_key(sh, th, name, &v, start),
                    Sent::Answered(outcome, engine) => {
                        served_by = engine;
                        outcome
                    }
                }
            }
        }
    };
    let latency_s = start.elapsed().as_secs_f64();
    let id = format!("{call_id:016x}");
    match outcome {
        Ok((out, t)) => {
            sh.metrics.record(th.index(), name, "ok", latency_s, Some(t));
            let mut r = Response::new(Full::new(out));
            let h = r.headers_mut();
            h.insert(CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
            h.insert(CALL_ID_HEADER, HeaderValue::from_str(&id).expect("hex is a valid header"));
            h.insert(TIMING_HEADER, timing_header(t));
            engine_header(&mut r, served_by.as_deref());
            r
        }
        Err((kind, msg, t)) => {
            sh.metrics.record(
                th.index(),
                if kind == ErrorKind::NotFound { "_unknown" } else { name },
                kind.name(),
                latency_s,
                Some(t),
            );
            let status = StatusCode::from_u16(kind.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            let mut r = error_resp(status, kind.name(), &msg, Some(&id));
            r.headers_mut().insert(CALL_ID_HEADER, HeaderValue::from_str(&id).expect("hex is a valid header"));
            r.headers_mut().insert(TIMING_HEADER, timing_header(t));
            engine_header(&mut r, served_by.as_deref());
            r
        }
    }
}

/// What [`send`] did.
pub(crate) enum Sent {
    /// The function needs an invoke key the call does not have (found out
    /// from the engine, the gateway's table being older than the store).
    Refused(Verdict),
    /// The call's outcome, and the engine that gave it.
    Answered(Result<(Bytes, Timing), (ErrorKind, String, Timing)>, Option<Arc<Engine>>),
}

/// Sends an external call to an engine that runs `name` (a second one if
/// the first cannot have started it), as `call_id` with `timeout_ms` (0:
/// the function's own); `verdict` is the gateway's judgement of `bearer`.
/// Counted in its engine's calls in flight until answered, or until the
/// client goes away (the future is dropped).
pub(crate) async fn send(
    sh: &GwShared,
    th: &ThreadState,
    name: &str,
    (call_id, timeout_ms, trace): (u64, u32, Option<Vec<u8>>),
    input: &Bytes,
    (bearer, verdict): (&[u8], &Verdict),
) -> Sent {
    let trace = trace.as_deref();
    let send = |checked: bool| {
        th.send_call(sh, name, (None, timeout_ms), move |l, left_ms| async move {
            l.link.call(call_id, left_ms, name, input, checked, trace).await
        })
    };
    let mut sent = send(*verdict == Verdict::Allowed).await;
    // Sent unchecked and refused: the engine knows the function needs a
    // key and this gateway did not yet. Judged again on what the store
    // says now (the engine never lets it through).
    if *verdict == Verdict::Open
        && matches!(&sent, Some((Reply::Err(ErrorKind::EngineUnavailable, m, _), _)) if m.contains("invoke key"))
    {
        sh.keys.refresh();
        match sh.keys.check(name, bearer) {
            Verdict::Allowed => sent = send(true).await,
            Verdict::Open => {}
            v => return Sent::Refused(v),
        }
    }
    let (reply, engine) = match sent {
        None => (
            Reply::Err(
                ErrorKind::EngineUnavailable,
                "no engine is ready: none has joined this gateway, or none is reachable".into(),
                Timing::default(),
            ),
            None,
        ),
        Some((reply, engine)) => (reply, Some(engine)),
    };
    let outcome = match reply {
        Reply::Ok(out, t) => Ok((out, t)),
        // Deployed, but the engine does not have it: the engine restarted
        // and the function is not restored yet (or its restore failed).
        // That is the runtime's fault, not a 404.
        Reply::Err(ErrorKind::NotFound, _, t) if sh.store.get(name).is_ok_and(|s| s.is_some()) => {
            let msg = format!(
                "function {name} is deployed but not running on the engine yet (it is being restored after an \
                 engine restart, or its restore failed: see the gateway log); retry shortly"
            );
            Err((ErrorKind::EngineUnavailable, msg, t))
        }
        Reply::Err(k, m, t) => Err((k, m, t)),
        Reply::Unsent => Err((
            ErrorKind::EngineUnavailable,
            "the links to the engines running it failed before the call was sent; retry shortly".into(),
            Timing::default(),
        )),
    };
    Sent::Answered(outcome, engine)
}

fn engine_header(r: &mut Resp, engine: Option<&Engine>) {
    // Engine ids are checked header-safe characters when they join.
    if let Some(v) = engine.and_then(|e| HeaderValue::from_str(&e.id).ok()) {
        r.headers_mut().insert(ENGINE_HEADER, v);
    }
}

fn timing_header(t: Timing) -> HeaderValue {
    HeaderValue::from_str(&api::http::timing_value(t.queue_us, t.exec_us, t.cold_us)).expect("ascii digits")
}

async fn system(sh: &Arc<GwShared>, req: Request<Incoming>, segs: &[&str]) -> Resp {
    let method = req.method().clone();
    let query = req.uri().query().unwrap_or("").to_string();
    match (&method, segs) {
        (&Method::GET, ["functions"]) => list(sh, None, wants_usage(&query)).await,
        (&Method::GET, ["functions", name]) => list(sh, Some(name), wants_usage(&query)).await,
        (&Method::POST | &Method::PUT, ["functions"]) => {
            let ct = inputs::content_type(req.headers());
            if ct != "application/json" {
                return wrong_type("application/json", &ct);
            }
            let body = match Limited::new(req.into_body(), 1 << 20).collect().await {
                Ok(b) => b.to_bytes(),
                Err(e) => {
                    return error_resp(StatusCode::BAD_REQUEST, "bad_request", &format!("reading body: {e}"), None)
                }
            };
            deploy(sh, &body).await
        }
        (&Method::POST, ["sources"]) => {
            let ct = inputs::content_type(req.headers());
            if !matches!(ct.as_str(), "application/gzip" | "application/x-gzip" | "application/octet-stream") {
                return wrong_type("application/gzip (a tar.gz of the function's source)", &ct);
            }
            upload_source(sh, req).await
        }
        (&Method::GET, ["sources", digest]) => match sh.store.has_source(digest) {
            Ok(true) => json_resp(StatusCode::OK, &json!({ "digest": digest })),
            Ok(false) => error_resp(StatusCode::NOT_FOUND, "not_found", &format!("no source {digest:?}"), None),
            Err(e) => store_error(&e),
        },
        (&Method::DELETE, ["functions", name]) => remove(sh, name).await,
        (&Method::GET, ["keys", name]) => list_keys(sh, name),
        (&Method::POST, ["keys", name]) => create_key(sh, name),
        (&Method::DELETE, ["keys", name, id]) => remove_key(sh, name, id),
        (&Method::GET, ["secrets"]) => list_secrets(sh),
        (&Method::POST, ["secrets"]) | (&Method::PUT, ["secrets", _]) => {
            let ct = inputs::content_type(req.headers());
            if ct != "application/json" {
                return wrong_type("application/json", &ct);
            }
            let named = segs.get(1).map(|s| s.to_string());
            // A value of at most 64 KiB, in base64, and its JSON around it.
            let body = match Limited::new(req.into_body(), 96 << 10).collect().await {
                Ok(b) => b.to_bytes(),
                Err(e) => {
                    return error_resp(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        "payload_too_large",
                        &format!("a secret's request is at most 96 KiB ({e})"),
                        None,
                    )
                }
            };
            put_secret(sh, named.as_deref(), &body)
        }
        (&Method::DELETE, ["secrets", name]) => remove_secret(sh, name),
        (&Method::GET, ["logs", name]) => logs(sh, name, &query).await,
        (&Method::GET, ["trace"]) => {
            let (function, limit) = inputs::trace_query(&query);
            json_resp(StatusCode::OK, &Value::Array(to_all_traces(sh, function, limit as u32).await))
        }
        (&Method::GET, ["dashboard"]) => json_resp(StatusCode::OK, &*crate::dashboard::shared_snapshot(sh).await),
        (&Method::GET, ["dashboard", "stream"]) => {
            // Served by `serve` before routing; reached only through `handle` alone.
            error_resp(StatusCode::NOT_FOUND, "not_found", "GET /system/dashboard/stream is an event stream", None)
        }
        (&Method::GET, ["calls"]) => crate::async_http::list(sh, &query),
        (&Method::GET, ["calls", id]) => crate::async_http::get(sh, id),
        (&Method::POST, ["calls", id, "replay"]) => crate::async_http::replay(sh, id).await,
        (&Method::DELETE, ["calls", id]) => crate::async_http::remove(sh, id).await,
        (&Method::GET, ["engines"]) => json_resp(StatusCode::OK, &json!(sh.engines.rows())),
        (&Method::POST, ["engines"]) => {
            let ct = inputs::content_type(req.headers());
            if ct != "application/json" {
                return wrong_type("application/json", &ct);
            }
            let body = match Limited::new(req.into_body(), 4096).collect().await {
                Ok(b) => b.to_bytes(),
                Err(e) => {
                    return error_resp(StatusCode::BAD_REQUEST, "bad_request", &format!("reading body: {e}"), None)
                }
            };
            join(sh, &body)
        }
        (&Method::DELETE, ["engines", id]) => {
            if sh.engines.leave(id) {
                log::info!("engine {id} left");
                json_resp(StatusCode::OK, &json!({ "left": id }))
            } else {
                error_resp(StatusCode::NOT_FOUND, "not_found", &format!("no joined engine {id:?}"), None)
            }
        }
        _ => error_resp(
            StatusCode::NOT_FOUND,
            "not_found",
            &format!("no route for {method} /system/{}", segs.join("/")),
            None,
        ),
    }
}

/// An engine joins, or renews its lease (api::cluster).
fn join(sh: &GwShared, body: &[u8]) -> Resp {
    let j: api::cluster::Join = match serde_json::from_slice(body) {
        Ok(j) => j,
        Err(e) => return error_resp(StatusCode::BAD_REQUEST, "bad_request", &format!("engine join: {e}"), None),
    };
    match sh.engines.join(&j) {
        Ok(new) => {
            if new {
                log::info!("engine {} joined from {}", j.id, j.address);
            }
            let joined =
                api::cluster::Joined { new, lease_ms: api::cluster::LEASE_MS, renew_ms: api::cluster::RENEW_MS };
            json_resp(StatusCode::OK, &json!(joined))
        }
        Err(e @ crate::cluster::JoinError::Full) => {
            error_resp(StatusCode::SERVICE_UNAVAILABLE, "overloaded", &e.to_string(), None)
        }
        Err(e) => error_resp(StatusCode::BAD_REQUEST, "bad_request", &e.to_string(), None),
    }
}

/// Sends a control request to every engine at once; the answers, in the
/// table's order.
/// A function's log from every engine that has one: each engine's text
/// and the cursor to read on from (`staccato logs --follow` sends them
/// back). An engine that cannot be asked is listed with its error.
async fn logs(sh: &GwShared, name: &str, query: &str) -> Resp {
    if !wire::valid_function_name(name) {
        return error_resp(StatusCode::NOT_FOUND, "not_found", &format!("no function named {name:?}"), None);
    }
    let (lines, after) = match inputs::logs_query(query) {
        Ok(q) => q,
        Err(m) => return error_resp(StatusCode::BAD_REQUEST, "bad_request", &m, None),
    };
    let pending: Vec<_> = sh
        .engines
        .snapshot()
        .iter()
        .map(|e| {
            let req = ctl::Request::Logs { function: name.to_string(), lines, after: after.get(&e.id).copied() };
            let c = e.control.clone();
            (e.clone(), tokio::task::spawn_local(async move { c.request(req).await }))
        })
        .collect();
    let mut out = Vec::new();
    for (e, task) in pending {
        match task.await.unwrap_or(Err(ControlError::Gone)) {
            Ok(ctl::Reply::Logs { text, next }) => out.push(json!({
                "engine": e.id,
                "text": text,
                "cursor": format!("{}~{}~{}", e.id, next.file, next.offset),
            })),
            Ok(other) => return unexpected(&other),
            Err(ControlError::Refused(r)) if r.kind == ctl::RefusalKind::NotFound => {}
            Err(err) => out.push(json!({ "engine": e.id, "error": err.to_string() })),
        }
    }
    if out.is_empty() {
        match sh.store.get(name) {
            Ok(Some(_)) => {} // deployed, nothing written yet
            Ok(None) => {
                return error_resp(StatusCode::NOT_FOUND, "not_found", &format!("no function named {name:?}"), None)
            }
            Err(e) => return store_error(&e),
        }
    }
    json_resp(StatusCode::OK, &json!({ "function": name, "engines": out }))
}

async fn to_all(
    sh: &GwShared,
    req: ctl::Request,
    attachment: Vec<u8>,
) -> Vec<(Arc<Engine>, Result<ctl::Reply, ControlError>)> {
    to_engines(&sh.engines.snapshot(), req, attachment).await
}

/// Sends a control request to each of `engines` at once; the answers, in
/// their order.
async fn to_engines(
    engines: &[Arc<Engine>],
    req: ctl::Request,
    attachment: Vec<u8>,
) -> Vec<(Arc<Engine>, Result<ctl::Reply, ControlError>)> {
    let pending: Vec<_> = engines
        .iter()
        .map(|e| {
            let (c, req, attachment) = (e.control.clone(), req.clone(), attachment.clone());
            (e.clone(), tokio::task::spawn_local(async move { c.request_with(req, attachment).await }))
        })
        .collect();
    let mut out = Vec::with_capacity(pending.len());
    for (e, task) in pending {
        out.push((e, task.await.unwrap_or(Err(ControlError::Gone))));
    }
    out
}

/// `?usage=1`: each function's process usage too (`Request::StatusWithUsage`).
fn wants_usage(query: &str) -> bool {
    query.split('&').any(|kv| kv == "usage=1" || kv == "usage=true")
}

async fn list(sh: &GwShared, one: Option<&str>, usage: bool) -> Resp {
    let specs = match sh.store.list() {
        Ok(s) => s,
        Err(e) => return store_error(&e),
    };
    // Each function's status on each engine that runs it; without engines,
    // the stored functions are listed with no status.
    let live = engine_status(sh, usage).await.functions;
    let mut out = Vec::new();
    for s in specs.iter().filter(|s| one.is_none_or(|n| n == s.name)) {
        let on: Vec<&(String, ctl::FunctionStatus)> = live.iter().filter(|(_, f)| f.name == s.name).collect();
        let st = on.first().map(|(_, f)| f);
        let engines: Vec<&str> = on.iter().map(|(id, _)| id.as_str()).collect();
        out.push(json!({
            "name": s.name,
            "runtime": s.runtime.name(),
            "handler": s.handler_or_default(),
            "min_workers": s.min_workers,
            "max_workers": s.max_workers,
            "timeout_ms": s.timeout_ms,
            "auth": s.auth.name(),
            "secrets": s.secrets,
            "env": s.env,
            "status": st,
            "engines": engines,
            // Every engine's status, where several run the function
            // (`status` is the first one's).
            "by_engine": on.iter().map(|(id, f)| json!({"engine": id, "status": f})).collect::<Vec<_>>(),
        }));
        if !s.placement.is_everywhere() {
            if let Some(last) = out.last_mut() {
                last["placement"] = json!(s.placement);
            }
        }
    }
    match (one, out.pop()) {
        (Some(n), None) => error_resp(StatusCode::NOT_FOUND, "not_found", &format!("no function named {n:?}"), None),
        (Some(_), Some(f)) => json_resp(StatusCode::OK, &f),
        (None, last) => {
            out.extend(last);
            json_resp(StatusCode::OK, &Value::Array(out))
        }
    }
}

/// Stores an uploaded source archive after checking it the way the engine
/// will unpack it (api::archive): a bad one is refused here, whole.
async fn upload_source(sh: &Arc<GwShared>, req: Request<Incoming>) -> Resp {
    let limits = api::archive::Limits::DEFAULT;
    let max = limits.archive_bytes_max as usize;
    let declared = inputs::content_length(req.headers());
    let too_large = || {
        let msg = format!("source archive exceeds the {max}-byte limit");
        error_resp(StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large", &msg, None)
    };
    if declared.is_some_and(|n| n > max as u64) {
        return too_large();
    }
    let body = match Limited::new(req.into_body(), max).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() => return too_large(),
        Err(e) => return error_resp(StatusCode::BAD_REQUEST, "bad_request", &format!("reading body: {e}"), None),
    };
    let sh2 = sh.clone();
    let checked = tokio::task::spawn_blocking(move || {
        let summary = api::archive::check(&body, &limits).map_err(|e| (StatusCode::BAD_REQUEST, e.to_string()))?;
        let digest = sh2.store.put_source(&body).map_err(|e| (store_status(&e), e.to_string()))?;
        Ok::<_, (StatusCode, String)>((digest, summary))
    })
    .await;
    match checked {
        Ok(Ok((digest, s))) => {
            json_resp(StatusCode::OK, &json!({ "digest": digest, "files": s.files, "dirs": s.dirs, "bytes": s.bytes }))
        }
        Ok(Err((status, msg))) => {
            let kind = match status {
                StatusCode::BAD_REQUEST => "bad_request",
                StatusCode::SERVICE_UNAVAILABLE => "store_unavailable",
                _ => "internal",
            };
            error_resp(status, kind, &format!("source archive: {msg}"), None)
        }
        Err(e) => error_resp(StatusCode::INTERNAL_SERVER_ERROR, "internal", &e.to_string(), None),
    }
}

async fn deploy(sh: &Arc<GwShared>, body: &[u8]) -> Resp {
    // Everything is checked before anything is deployed.
    let specs = match inputs::deploy_specs(body) {
        Ok(s) => s,
        Err(e) => return error_resp(StatusCode::BAD_REQUEST, "bad_request", &e.to_string(), None),
    };
    // A store that cannot be written is found out before any engine is
    // given anything (it would run a version the store never had).
    if let Err(e) = sh.store.revision() {
        return store_error(&e);
    }
    // A gRPC method is served by one function: the manifest's functions
    // replace their stored versions, and take no method another serves.
    let stored = match sh.store.list() {
        Ok(s) => s,
        Err(e) => return store_error(&e),
    };
    let mut claimed: std::collections::HashMap<&str, &str> = stored
        .iter()
        .filter(|s| !specs.iter().any(|n| n.name == s.name))
        .flat_map(|s| s.grpc.iter().map(|m| (m.as_str(), s.name.as_str())))
        .collect();
    for spec in &specs {
        for m in &spec.grpc {
            if let Some(other) = claimed.insert(m, &spec.name) {
                let msg = format!("gRPC method {m} is served by function {other} already");
                return error_resp(StatusCode::CONFLICT, "conflict", &format!("function {}: {msg}", spec.name), None);
            }
        }
    }
    // The values of the secrets each function names: a missing one refuses
    // the whole manifest.
    let mut values = Vec::with_capacity(specs.len());
    for spec in &specs {
        match sh.store.secret_values(&spec.secrets) {
            Ok(v) => values.push(v),
            Err(e @ crate::store::StoreError::NoSecret(_)) => {
                let msg = format!("function {}: {e}", spec.name);
                return error_resp(StatusCode::BAD_REQUEST, "bad_request", &msg, None);
            }
            Err(e) => return store_error(&e),
        }
    }
    for spec in &specs {
        let has = match sh.store.has_source(&spec.source) {
            Ok(has) => has,
            Err(e) => return store_error(&e),
        };
        if !has {
            let msg =
                format!("function {}: source {} was not uploaded (POST /system/sources first)", spec.name, spec.source);
            return error_resp(StatusCode::BAD_REQUEST, "bad_request", &msg, None);
        }
    }
    // Every function is placed before any is deployed: one that cannot be
    // refuses the whole manifest.
    let table = sh.engines.snapshot();
    if table.is_empty() {
        let msg = "no engine has joined this gateway (start one with `staccato engine --join URL`)";
        return error_resp(StatusCode::SERVICE_UNAVAILABLE, "engine_unavailable", msg, None);
    }
    let mut routes = Vec::with_capacity(specs.len());
    for spec in &specs {
        match sh.placements.decide(spec, &table) {
            Ok(r) => routes.push(r),
            Err(e) => return error_resp(StatusCode::SERVICE_UNAVAILABLE, "engine_unavailable", &e.to_string(), None),
        }
    }
    let mut deployed = Vec::new();
    let mut notes = serde_json::Map::new();
    let mut placed = serde_json::Map::new();
    for ((spec, route), secrets) in specs.into_iter().zip(routes).zip(values) {
        let archive = match sh.store.source(&spec.source) {
            Ok(a) => a,
            Err(e) => return store_error(&e),
        };
        if let Err(e) = sh.store.share_source(&spec.source, &archive) {
            return store_error(&e);
        }
        let name = spec.name.clone();
        // Needs a key from before any engine runs this version (a
        // redeploy that adds `auth: key` leaves no moment without it).
        if spec.auth == Auth::Key {
            if let Err(e) = sh.keys.require(&name) {
                return store_error(&e);
            }
        }
        let (on, off): (Vec<Arc<Engine>>, Vec<Arc<Engine>>) =
            table.iter().cloned().partition(|e| route.as_ref().is_none_or(|r| r.serves(&e.id, &e.labels)));
        let mut said: Vec<String> = Vec::new();
        let register = ctl::Request::Register { spec: spec.clone(), secrets };
        for (e, answer) in to_engines(&on, register, archive).await {
            match answer {
                // Each engine builds alike: one engine's notes stand for all.
                Ok(ctl::Reply::Registered { notes: n, .. }) => {
                    if !n.is_empty() && !said.contains(&n) {
                        said.push(n);
                    }
                }
                Ok(other) => return unexpected(&other),
                // The engines that took it keep it until the next deploy
                // or removal of the name.
                Err(err) if table.len() > 1 => return control_error_at(&err, &e.id),
                Err(err) => return control_error(&err),
            }
        }
        let chosen = route.as_ref().filter(|r| r.placement.engines > 0).map(|r| r.chosen.as_slice());
        if let Err(e) = sh.store.put(&spec, chosen) {
            return store_error(&e);
        }
        // What the store says now (a key request may have read the store
        // between `require` and here; the engines refuse unchecked calls
        // of a function that needs a key meanwhile).
        sh.keys.refresh();
        if let Some(ids) = chosen.filter(|ids| ids.len() < spec.placement.engines as usize) {
            said.push(format!(
                "placed on {} of the {} engines asked for: no more engines here are admitted by its placement; \
                 engines that join later take it",
                ids.len(),
                spec.placement.engines
            ));
        }
        // Calls follow the new placement before the engines it left drop
        // the version they have (dropped first, calls routed by the old
        // placement would find it nowhere).
        sh.placements.set(&name, route);
        for (e, answer) in to_engines(&off, ctl::Request::Unregister { name: name.clone() }, Vec::new()).await {
            match answer {
                Ok(_) => log::info!("function {name} left engine {}: it is no longer placed there", e.id),
                Err(ControlError::Refused(r)) if r.kind == ctl::RefusalKind::NotFound => {}
                Err(err) => {
                    log::warn!("removing function {name} from engine {} it is no longer placed on: {err}", e.id)
                }
            }
        }
        placed.insert(name.clone(), json!(on.iter().map(|e| e.id.as_str()).collect::<Vec<_>>()));
        if !said.is_empty() {
            notes.insert(name.clone(), json!(said.join("; ")));
        }
        deployed.push(name);
    }
    prune_sources(sh);
    json_resp(StatusCode::OK, &json!({ "deployed": deployed, "notes": notes, "placed": placed }))
}

/// Archives no function uses any more go; recent uploads stay a while, for
/// the deploy that is about to name them.
fn prune_sources(sh: &GwShared) {
    match sh.store.prune_sources(std::time::Duration::from_secs(600)) {
        Ok(0) => {}
        Ok(n) => log::info!("removed {n} unused source archives"),
        Err(e) => log::warn!("pruning source archives: {e}"),
    }
}

async fn remove(sh: &GwShared, name: &str) -> Resp {
    let in_store = match sh.store.remove(name) {
        Ok(b) => b,
        Err(e) => return store_error(&e),
    };
    sh.placements.remove(name);
    let mut in_engine = false;
    for (e, answer) in to_all(sh, ctl::Request::Unregister { name: name.to_string() }, Vec::new()).await {
        match answer {
            Ok(_) => in_engine = true,
            Err(ControlError::Refused(r)) if r.kind == ctl::RefusalKind::NotFound => {}
            // Removed from the store, but this engine was not told: the
            // store remembers the removal, and the engine's next
            // reconciliation removes it there (control::reconcile). Logged,
            // not refused: the function is gone as far as deploys and
            // listings go.
            Err(err) if in_store => log::warn!("removing function {name} from engine {}: {err}", e.id),
            Err(err) => return control_error_at(&err, &e.id),
        }
    }
    // After the engines dropped it (until then, those running it refuse
    // unchecked calls of it if it needs a key, whatever this table says).
    sh.keys.refresh();
    if !in_store && !in_engine {
        return error_resp(StatusCode::NOT_FOUND, "not_found", &format!("no function named {name:?}"), None);
    }
    prune_sources(sh);
    json_resp(StatusCode::OK, &json!({ "removed": name }))
}

/// The stored spec of function `name`, or the answer saying why not.
fn stored_spec(sh: &GwShared, name: &str) -> Result<api::spec::FunctionSpec, Box<Resp>> {
    match sh.store.get(name) {
        Ok(Some(s)) => Ok(s),
        Ok(None) => {
            Err(Box::new(error_resp(StatusCode::NOT_FOUND, "not_found", &format!("no function named {name:?}"), None)))
        }
        Err(e) => Err(Box::new(store_error(&e))),
    }
}

/// A function's invoke keys: ids and ages, never the keys.
fn list_keys(sh: &GwShared, name: &str) -> Resp {
    let spec = match stored_spec(sh, name) {
        Ok(s) => s,
        Err(r) => return *r,
    };
    match sh.store.keys_of(name) {
        Ok(keys) => {
            let keys: Vec<Value> = keys.iter().map(|k| json!({ "id": k.id, "created_ms": k.created_ms })).collect();
            json_resp(StatusCode::OK, &json!({ "function": name, "auth": spec.auth.name(), "keys": keys }))
        }
        Err(e) => store_error(&e),
    }
}

/// Makes an invoke key for a deployed function; the answer is the only
/// place the key is ever shown.
fn create_key(sh: &GwShared, name: &str) -> Resp {
    let spec = match stored_spec(sh, name) {
        Ok(s) => s,
        Err(r) => return *r,
    };
    let (key, record) = match api::keys::new_key(crate::store::unix_ms()) {
        Ok(k) => k,
        Err(e) => {
            return error_resp(StatusCode::INTERNAL_SERVER_ERROR, "internal", &format!("no randomness: {e}"), None)
        }
    };
    // Stored only if the function is still there, has room, and no key has
    // that id (checked with the write, in one transaction).
    match sh.store.put_key(name, &record, api::keys::KEYS_MAX) {
        Ok(KeyPut::Stored) => {}
        Ok(KeyPut::NoFunction) => {
            return error_resp(StatusCode::NOT_FOUND, "not_found", &format!("no function named {name:?}"), None)
        }
        Ok(KeyPut::Full) => {
            let msg = format!(
                "function {name} has {} invoke keys, the most it may have: remove one first (`staccato key rm \
                 {name} ID`)",
                api::keys::KEYS_MAX
            );
            return error_resp(StatusCode::CONFLICT, "conflict", &msg, None);
        }
        Ok(KeyPut::IdTaken) => {
            let msg = "a key with the same id was made at the same moment; try again";
            return error_resp(StatusCode::CONFLICT, "conflict", msg, None);
        }
        Err(e) => return store_error(&e),
    }
    sh.keys.refresh();
    let mut body = json!({ "function": name, "id": record.id, "key": key, "created_ms": record.created_ms });
    if spec.auth == Auth::None {
        body["note"] = json!(format!(
            "function {name} does not ask for a key (auth: none): it takes calls without one until it is deployed \
             with `auth: key`"
        ));
    }
    json_resp(StatusCode::CREATED, &body)
}

fn remove_key(sh: &GwShared, name: &str, id: &str) -> Resp {
    if !api::keys::valid_id(id) {
        return error_resp(
            StatusCode::NOT_FOUND,
            "not_found",
            &format!("no invoke key {id:?} of function {name}"),
            None,
        );
    }
    match sh.store.remove_key(name, id) {
        Ok(true) => {
            sh.keys.refresh();
            json_resp(StatusCode::OK, &json!({ "function": name, "removed": id }))
        }
        Ok(false) => {
            error_resp(StatusCode::NOT_FOUND, "not_found", &format!("no invoke key {id:?} of function {name}"), None)
        }
        Err(e) => store_error(&e),
    }
}

/// Every secret's name, ages and the functions that name it; never a value.
fn list_secrets(sh: &GwShared) -> Resp {
    let (secrets, specs) = match (sh.store.secrets(), sh.store.list()) {
        (Ok(s), Ok(f)) => (s, f),
        (Err(e), _) | (_, Err(e)) => return store_error(&e),
    };
    let rows: Vec<Value> = secrets
        .iter()
        .map(|(name, r)| {
            let used_by: Vec<&str> =
                specs.iter().filter(|f| f.secrets.contains(name)).map(|f| f.name.as_str()).collect();
            json!({ "name": name, "created_ms": r.created_ms, "updated_ms": r.updated_ms, "used_by": used_by })
        })
        .collect();
    json_resp(StatusCode::OK, &Value::Array(rows))
}

/// `POST /system/secrets` (`{"name", "value"}`, a new secret) or `PUT
/// /system/secrets/NAME` (`{"value"}`, a new value for an existing one);
/// values in base64.
fn put_secret(sh: &GwShared, named: Option<&str>, body: &[u8]) -> Resp {
    let bad = |m: String| error_resp(StatusCode::BAD_REQUEST, "bad_request", &m, None);
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Body {
        name: Option<String>,
        value: api::secrets::Value,
    }
    let b: Body = match serde_json::from_slice(body) {
        Ok(b) => b,
        // Not serde's message: it may quote part of the value.
        Err(_) => return bad("send {\"name\": NAME, \"value\": BASE64} (a new secret) or {\"value\": BASE64}".into()),
    };
    let (name, create) = match (named, b.name) {
        (None, Some(n)) => (n, true),
        (Some(n), None) => (n.to_string(), false),
        (Some(_), Some(_)) => return bad("the secret's name is in the path: leave it out of the body".into()),
        (None, None) => return bad("a new secret needs a name".into()),
    };
    if !api::secrets::valid_name(&name) {
        return bad(format!("invalid secret name {name:?}: {}", api::secrets::name_rule()));
    }
    if b.value.0.len() > api::secrets::SECRET_BYTES_MAX {
        let msg = format!("a secret is at most {} bytes, this one {}", api::secrets::SECRET_BYTES_MAX, b.value.0.len());
        return error_resp(StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large", &msg, None);
    }
    if create {
        match sh.store.secrets() {
            Ok(all) if all.len() >= api::secrets::SECRETS_MAX => {
                let msg = format!("the store holds {} secrets, its most", api::secrets::SECRETS_MAX);
                return error_resp(StatusCode::CONFLICT, "conflict", &msg, None);
            }
            Ok(_) => {}
            Err(e) => return store_error(&e),
        }
    }
    match sh.store.put_secret(&name, &b.value.0, create) {
        Ok(true) if create => json_resp(StatusCode::CREATED, &json!({ "created": name })),
        Ok(true) => {
            // Functions get a value with their registration: a new value
            // reaches them at their next deploy.
            let used_by: Vec<String> = sh
                .store
                .list()
                .map(|l| l.into_iter().filter(|f| f.secrets.contains(&name)).map(|f| f.name).collect())
                .unwrap_or_default();
            json_resp(StatusCode::OK, &json!({ "updated": name, "redeploy": used_by }))
        }
        Ok(false) if create => error_resp(
            StatusCode::CONFLICT,
            "conflict",
            &format!("secret {name} exists (change its value with `staccato secret update {name}`)"),
            None,
        ),
        Ok(false) => error_resp(StatusCode::NOT_FOUND, "not_found", &format!("no secret named {name:?}"), None),
        Err(e) => store_error(&e),
    }
}

/// Removes a secret no deployed function names.
fn remove_secret(sh: &GwShared, name: &str) -> Resp {
    if !api::secrets::valid_name(name) {
        return error_resp(StatusCode::NOT_FOUND, "not_found", &format!("no secret named {name:?}"), None);
    }
    let used_by: Vec<String> = match sh.store.list() {
        Ok(l) => l.into_iter().filter(|f| f.secrets.iter().any(|s| s == name)).map(|f| f.name).collect(),
        Err(e) => return store_error(&e),
    };
    if !used_by.is_empty() {
        let msg = format!("secret {name} is named by deployed functions: {}; remove them first", used_by.join(", "));
        return error_resp(StatusCode::CONFLICT, "conflict", &msg, None);
    }
    match sh.store.remove_secret(name) {
        Ok(true) => json_resp(StatusCode::OK, &json!({ "removed": name })),
        Ok(false) => error_resp(StatusCode::NOT_FOUND, "not_found", &format!("no secret named {name:?}"), None),
        Err(e) => store_error(&e),
    }
}

/// The answer to a request the engine did not carry out.
fn control_error(e: &ControlError) -> Resp {
    let (status, kind) = e.http();
    error_resp(status, kind, &e.to_string(), None)
}

/// The same, naming the engine (when the request went to several).
fn control_error_at(e: &ControlError, engine: &str) -> Resp {
    let (status, kind) = e.http();
    error_resp(status, kind, &format!("engine {engine}: {e}"), None)
}

/// The engine answered a request with a reply to another kind of request.
fn unexpected(reply: &ctl::Reply) -> Resp {
    let msg = format!("the engine answered with an unexpected reply: {reply:?}");
    error_resp(StatusCode::BAD_GATEWAY, "internal", &msg, None)
}

pub fn json_resp(status: StatusCode, v: &Value) -> Resp {
    Response::builder()
        .status(status)
        .header(CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(serde_json::to_vec(v).unwrap_or_default())))
        .expect("static response parts")
}

/// The status a store failure is answered with: an unreachable shared
/// store is the cluster's outage (503, retryable), anything else ours.
fn store_status(e: &crate::store::StoreError) -> StatusCode {
    match e {
        crate::store::StoreError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

pub(crate) fn store_error(e: &crate::store::StoreError) -> Resp {
    let status = store_status(e);
    let kind = if status == StatusCode::SERVICE_UNAVAILABLE { "store_unavailable" } else { "internal" };
    error_resp(status, kind, &e.to_string(), None)
}

/// An error body. Every 503 (`overloaded`, `engine_unavailable`,
/// `store_unavailable`) is worth retrying and says when: `Retry-After: 1`.
pub fn error_resp(status: StatusCode, kind: &str, message: &str, call_id: Option<&str>) -> Resp {
    let mut r = Response::builder()
        .status(status)
        .header(CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(api::http::error_body(kind, message, call_id))))
        .expect("static response parts");
    if status == StatusCode::SERVICE_UNAVAILABLE {
        r.headers_mut().insert(hyper::header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    r
}
