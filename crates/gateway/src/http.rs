//! HTTP routes: `/function/{name}` runs a function; `/system/*` manages
//! them; `/healthz` and `/metrics` observe the gateway.
//!
//! Everything here is hostile until checked: a gateway on loopback answers
//! only requests addressed to a loopback name (a web page cannot reach it by
//! DNS rebinding); management requests must carry the token, must not come
//! from another origin's page, and must say what they send with a content
//! type no HTML form can (so a cross-site form cannot post one).

use crate::control::ControlError;
use crate::engine_link::Reply;
use crate::inputs;
use crate::{GwShared, ThreadState};
use api::control as ctl;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE, HOST};
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{json, Value};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;
use wire::frame::Timing;
use wire::ErrorKind;

pub type Resp = Response<Full<Bytes>>;

pub const CALL_ID_HEADER: &str = "x-call-id";
pub const TIMING_HEADER: &str = "x-staccato-timing";
pub const TIMEOUT_HEADER: &str = "x-staccato-timeout-ms";

/// `management_only`: the connection is beyond the connection limit and
/// may only reach `/system/*` and `/healthz` (calls get 503).
pub(crate) async fn handle(
    sh: Arc<GwShared>,
    th: Rc<ThreadState>,
    req: Request<Incoming>,
    management_only: bool,
) -> Resp {
    if sh.cfg.listen.ip().is_loopback() && !inputs::loopback_host(req.headers()) {
        let host =
            req.headers().get(HOST).map_or_else(String::new, |h| String::from_utf8_lossy(h.as_bytes()).into_owned());
        return error_resp(
            StatusCode::FORBIDDEN,
            "forbidden",
            &format!(
                "this gateway listens on loopback and answers only requests for localhost or a loopback address, \
                 not Host {host:?}"
            ),
            None,
        );
    }
    let path = req.uri().path().to_string();
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    if management_only && !matches!(segs.first(), Some(&"system" | &"healthz")) {
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
        (&Method::GET, ["healthz"]) => {
            // Healthy means calls can succeed: connected, and every stored
            // function is back on the engine after a (re)connection.
            let up = th.link.is_up() && sh.control.restored();
            let body = json!({"status": if up {"ok"} else {"degraded"}, "engine": if up {"up"} else {"down"}});
            json_resp(if up { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE }, &body)
        }
        (&Method::GET, ["metrics"]) => Response::builder()
            .header(CONTENT_TYPE, "text/plain; version=0.0.4")
            .body(Full::new(Bytes::from(sh.metrics.render())))
            .expect("static response parts"),
        (_, ["system", ..]) => {
            if let Some(why) = inputs::cross_origin(req.headers()) {
                return error_resp(StatusCode::FORBIDDEN, "forbidden", &why, None);
            }
            if !authorized(&sh, &req) {
                return error_resp(StatusCode::UNAUTHORIZED, "unauthorized", "missing or wrong bearer token", None);
            }
            system(&sh, req, &segs[1..]).await
        }
        _ => error_resp(StatusCode::NOT_FOUND, "not_found", &format!("no route for {} {path}", req.method()), None),
    }
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

async fn invoke(sh: &GwShared, th: &ThreadState, name: &str, req: Request<Incoming>) -> Resp {
    let start = Instant::now();
    let call_id = th.next_call_id();
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
            Ok(body) => match th.link.call(call_id, timeout_ms.unwrap_or(0), name, &body.to_bytes()).await {
                Reply::Ok(out, t) => Ok((out, t)),
                // Deployed, but the engine does not have it: the engine
                // restarted and the function is not restored yet (or its
                // restore failed). That is the runtime's fault, not a 404.
                Reply::Err(ErrorKind::NotFound, _, t) if sh.store.get(name).is_ok_and(|s| s.is_some()) => {
                    let msg = format!(
                        "function {name} is deployed but not running on the engine yet (it is being restored \
                         after an engine restart, or its restore failed: see the gateway log); retry shortly"
                    );
                    Err((ErrorKind::EngineUnavailable, msg, t))
                }
                Reply::Err(k, m, t) => Err((k, m, t)),
            },
        }
    };
    let latency_s = start.elapsed().as_secs_f64();
    let id = format!("{call_id:016x}");
    match outcome {
        Ok((out, t)) => {
            sh.metrics.record(th.index(), name, "ok", latency_s);
            let mut r = Response::new(Full::new(out));
            let h = r.headers_mut();
            h.insert(CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
            h.insert(CALL_ID_HEADER, HeaderValue::from_str(&id).expect("hex is a valid header"));
            h.insert(TIMING_HEADER, timing_header(t));
            r
        }
        Err((kind, msg, t)) => {
            sh.metrics.record(
                th.index(),
                if kind == ErrorKind::NotFound { "_unknown" } else { name },
                kind.name(),
                latency_s,
            );
            let status = StatusCode::from_u16(kind.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            let mut r = error_resp(status, kind.name(), &msg, Some(&id));
            r.headers_mut().insert(CALL_ID_HEADER, HeaderValue::from_str(&id).expect("hex is a valid header"));
            r.headers_mut().insert(TIMING_HEADER, timing_header(t));
            r
        }
    }
}

fn timing_header(t: Timing) -> HeaderValue {
    let s = format!("queue_us={},exec_us={},cold_us={}", t.queue_us, t.exec_us, t.cold_us);
    HeaderValue::from_str(&s).expect("ascii digits")
}

async fn system(sh: &Arc<GwShared>, req: Request<Incoming>, segs: &[&str]) -> Resp {
    let method = req.method().clone();
    let query = req.uri().query().unwrap_or("").to_string();
    match (&method, segs) {
        (&Method::GET, ["functions"]) => list(sh, None).await,
        (&Method::GET, ["functions", name]) => list(sh, Some(name)).await,
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
        (&Method::GET, ["sources", digest]) => {
            if sh.store.has_source(digest) {
                json_resp(StatusCode::OK, &json!({ "digest": digest }))
            } else {
                error_resp(StatusCode::NOT_FOUND, "not_found", &format!("no source {digest:?}"), None)
            }
        }
        (&Method::DELETE, ["functions", name]) => remove(sh, name).await,
        (&Method::GET, ["trace"]) => {
            let (function, limit) = inputs::trace_query(&query);
            let req = ctl::Request::Trace { function, limit: limit as u32 };
            match sh.control.request(req).await {
                Ok(ctl::Reply::Traces { traces }) => json_resp(StatusCode::OK, &json!(traces)),
                Ok(other) => unexpected(&other),
                Err(e) => control_error(&e),
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

async fn list(sh: &GwShared, one: Option<&str>) -> Resp {
    let specs = match sh.store.list() {
        Ok(s) => s,
        Err(e) => return error_resp(StatusCode::INTERNAL_SERVER_ERROR, "internal", &e.to_string(), None),
    };
    // Without the engine, the stored functions are listed with no status.
    let live = match sh.control.request(ctl::Request::Status).await {
        Ok(ctl::Reply::Status { functions }) => functions,
        _ => Vec::new(),
    };
    let mut out = Vec::new();
    for s in specs.iter().filter(|s| one.is_none_or(|n| n == s.name)) {
        let st = live.iter().find(|f| f.name == s.name);
        out.push(json!({
            "name": s.name,
            "runtime": s.runtime.name(),
            "handler": s.handler_or_default(),
            "min_workers": s.min_workers,
            "max_workers": s.max_workers,
            "timeout_ms": s.timeout_ms,
            "env": s.env,
            "status": st,
        }));
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
        let digest = sh2.store.put_source(&body).map_err(|e| (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
        Ok::<_, (StatusCode, String)>((digest, summary))
    })
    .await;
    match checked {
        Ok(Ok((digest, s))) => {
            json_resp(StatusCode::OK, &json!({ "digest": digest, "files": s.files, "dirs": s.dirs, "bytes": s.bytes }))
        }
        Ok(Err((status, msg))) => {
            let kind = if status == StatusCode::BAD_REQUEST { "bad_request" } else { "internal" };
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
    for spec in &specs {
        if !sh.store.has_source(&spec.source) {
            let msg =
                format!("function {}: source {} was not uploaded (POST /system/sources first)", spec.name, spec.source);
            return error_resp(StatusCode::BAD_REQUEST, "bad_request", &msg, None);
        }
    }
    let mut deployed = Vec::new();
    let mut notes = serde_json::Map::new();
    for spec in specs {
        let archive = match sh.store.source(&spec.source) {
            Ok(a) => a,
            Err(e) => return error_resp(StatusCode::INTERNAL_SERVER_ERROR, "internal", &e.to_string(), None),
        };
        let name = spec.name.clone();
        match sh.control.request_with(ctl::Request::Register { spec: spec.clone() }, archive).await {
            Ok(ctl::Reply::Registered { notes: n, .. }) if !n.is_empty() => {
                notes.insert(name, json!(n));
            }
            Ok(ctl::Reply::Registered { .. }) => {}
            Ok(other) => return unexpected(&other),
            Err(e) => return control_error(&e),
        }
        if let Err(e) = sh.store.put(&spec) {
            return error_resp(StatusCode::INTERNAL_SERVER_ERROR, "internal", &e.to_string(), None);
        }
        deployed.push(spec.name.clone());
    }
    prune_sources(sh);
    json_resp(StatusCode::OK, &json!({ "deployed": deployed, "notes": notes }))
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
        Err(e) => return error_resp(StatusCode::INTERNAL_SERVER_ERROR, "internal", &e.to_string(), None),
    };
    let in_engine = match sh.control.request(ctl::Request::Unregister { name: name.to_string() }).await {
        Ok(_) => true,
        Err(ControlError::Refused(r)) if r.kind == ctl::RefusalKind::NotFound => false,
        // Removed from the store, but the engine was not told: it runs the
        // function until it restarts (a reconnection only re-registers what
        // the store has, it removes nothing). Logged, not refused: the
        // function is gone as far as deploys and listings go.
        Err(e) if in_store => {
            log::warn!("removing function {name} from the engine: {e}");
            false
        }
        Err(e) => return control_error(&e),
    };
    if !in_store && !in_engine {
        return error_resp(StatusCode::NOT_FOUND, "not_found", &format!("no function named {name:?}"), None);
    }
    prune_sources(sh);
    json_resp(StatusCode::OK, &json!({ "removed": name }))
}

/// The answer to a request the engine did not carry out.
fn control_error(e: &ControlError) -> Resp {
    let (status, kind) = e.http();
    error_resp(status, kind, &e.to_string(), None)
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

/// An error body. Every 503 (`overloaded`, `engine_unavailable`) is worth
/// retrying and says when: `Retry-After: 1`.
pub fn error_resp(status: StatusCode, kind: &str, message: &str, call_id: Option<&str>) -> Resp {
    let mut r = json_resp(status, &json!({"error": {"kind": kind, "message": message, "call_id": call_id}}));
    if status == StatusCode::SERVICE_UNAVAILABLE {
        r.headers_mut().insert(hyper::header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    r
}
