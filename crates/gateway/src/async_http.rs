//! The HTTP side of asynchronous calls ([`crate::calls`]):
//! `POST /async-function/{name}` and `/system/calls[/{id}[/replay]]`.

use crate::calls::{self, Record, Refused, ReplayError, State};
use crate::http::{error_resp, json_resp, refused_key, Resp};
use crate::keys::Verdict;
use crate::{inputs, GwShared, ThreadState};
use api::spec::Auth;
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, LOCATION, RETRY_AFTER};
use hyper::{Request, StatusCode};
use serde_json::{json, Value};
use std::time::Instant;

/// The header naming where a call's result is posted.
pub const CALLBACK_HEADER: &str = "x-callback-url";

/// Calls listed at most in one answer.
const LIST_LIMIT_MAX: usize = 1000;

pub(crate) async fn accept(sh: &GwShared, th: &ThreadState, name: &str, req: Request<Incoming>) -> Resp {
    let start = Instant::now();
    let no_such = || error_resp(StatusCode::NOT_FOUND, "not_found", &format!("no function named {name:?}"), None);
    if !wire::valid_function_name(name) {
        return no_such();
    }
    let spec = match sh.store.get(name) {
        Ok(Some(s)) => s,
        Ok(None) => return no_such(),
        Err(e) => return crate::http::store_error(&e),
    };
    // The store says whether a key is needed: a call accepted now runs
    // later, so it is judged here on what is stored, not on the table.
    let bearer = inputs::bearer(req.headers()).to_vec();
    let trace = inputs::trace_headers(req.headers());
    let mut verdict = sh.keys.check(name, &bearer);
    // The table is older than the store (it says open, the store keyed):
    // read again. A call without a key of a function the table knows is
    // keyed is refused without reading anything.
    if spec.auth == Auth::Key && verdict == Verdict::Open {
        sh.keys.refresh();
        verdict = match sh.keys.check(name, &bearer) {
            Verdict::Open => Verdict::Missing,
            v => v,
        };
    }
    if matches!(verdict, Verdict::Missing | Verdict::Wrong) {
        return refused_key(sh, th, name, &verdict, start);
    }
    let callback = match req.headers().get(CALLBACK_HEADER).map(|v| v.to_str()) {
        None => None,
        Some(Err(_)) => {
            let msg = "X-Callback-Url is not ASCII";
            return error_resp(StatusCode::BAD_REQUEST, "bad_request", msg, None);
        }
        Some(Ok(url)) => match sh.calls.check_callback(url) {
            Ok(()) => Some(url.to_string()),
            Err(m) => return error_resp(StatusCode::BAD_REQUEST, "bad_request", &format!("X-Callback-Url: {m}"), None),
        },
    };
    let max =
        if sh.store.shared() { sh.cfg.payload_len_max.min(calls::SHARED_INPUT_MAX) } else { sh.cfg.payload_len_max };
    let too_large = || {
        let why = if max < sh.cfg.payload_len_max { " (async calls, with a shared store)" } else { "" };
        error_resp(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            &format!("request body exceeds the {max}-byte limit{why}"),
            None,
        )
    };
    if inputs::content_length(req.headers()).is_some_and(|n| n > max as u64) {
        return too_large();
    }
    let input = match Limited::new(req.into_body(), max).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() => return too_large(),
        Err(e) => {
            return error_resp(StatusCode::BAD_REQUEST, "bad_request", &format!("reading request body: {e}"), None)
        }
    };
    let now = crate::store::unix_ms();
    let settings = &spec.async_calls;
    let rec = Record {
        id: calls::new_id(),
        function: name.to_string(),
        input_bytes: input.len(),
        input,
        callback,
        state: State::Queued,
        attempts: 0,
        max_attempts: settings.retries + 1,
        backoff_ms: settings.backoff_ms,
        retry_on: settings.retry_on.clone(),
        key_checked: verdict == Verdict::Allowed,
        accepted_ms: now,
        due_ms: now,
        started_ms: None,
        finished_ms: None,
        owner: sh.calls.owner.clone(),
        errors: Vec::new(),
        result: None,
        callback_status: None,
        replays: 0,
        not_started: 0,
        traceparent: trace.as_ref().map(|t| {
            let p = &t.parent;
            api::trace::TraceParent::header(p.trace_id, p.parent_id, p.sampled)
        }),
        tracestate: trace.and_then(|t| (!t.state.is_empty()).then_some(t.state)),
    };
    let id = rec.id.clone();
    match sh.calls.accept(rec, settings, spec.max_workers).await {
        Ok(()) => accepted(name, &id),
        Err(r) => refused(r),
    }
}

fn accepted(name: &str, id: &str) -> Resp {
    let location = format!("/system/calls/{id}");
    let mut r = json_resp(
        StatusCode::ACCEPTED,
        &json!({ "call_id": id, "function": name, "state": "queued", "status_url": location }),
    );
    let h = r.headers_mut();
    h.insert(api::http::CALL_ID_HEADER, HeaderValue::from_str(id).expect("hex is a valid header"));
    h.insert(LOCATION, HeaderValue::from_str(&location).expect("hex is a valid header"));
    r
}

fn refused(r: Refused) -> Resp {
    match r {
        Refused::Full(m) => {
            let mut r = error_resp(StatusCode::TOO_MANY_REQUESTS, "too_many_requests", &m, None);
            r.headers_mut().insert(RETRY_AFTER, HeaderValue::from_static("1"));
            r
        }
        Refused::Unavailable(m) => error_resp(StatusCode::SERVICE_UNAVAILABLE, "store_unavailable", &m, None),
        Refused::Duplicate(m) => error_resp(StatusCode::CONFLICT, "conflict", &m, None),
    }
}

/// A call as an answer shows it: the output as text when it is UTF-8,
/// else in base64; the input only by its size.
fn view(rec: &Record, with_output: bool) -> Value {
    let mut v = json!({
        "id": rec.id,
        "function": rec.function,
        "state": rec.state.name(),
        "attempts": rec.attempts,
        "max_attempts": rec.max_attempts,
        "accepted_ms": rec.accepted_ms,
        "input_bytes": rec.input_bytes,
        "replays": rec.replays,
    });
    if rec.state == State::Queued && rec.due_ms > rec.accepted_ms {
        v["due_ms"] = json!(rec.due_ms);
    }
    if let Some(t) = rec.started_ms {
        v["started_ms"] = json!(t);
    }
    if let Some(t) = rec.finished_ms {
        v["finished_ms"] = json!(t);
    }
    if let Some(c) = &rec.callback {
        v["callback"] = json!(c);
    }
    if let Some(c) = &rec.callback_status {
        v["callback_status"] = json!(c);
    }
    if let Some(t) = &rec.traceparent {
        v["traceparent"] = json!(t);
    }
    if !rec.errors.is_empty() {
        v["errors"] = json!(rec.errors);
    }
    if let Some(o) = &rec.result {
        let mut r = json!({
            "status": o.status,
            "output_bytes": o.output_bytes,
            "queue_us": o.queue_us,
            "exec_us": o.exec_us,
            "cold_us": o.cold_us,
        });
        if let Some(e) = &o.error {
            r["error"] = json!(e);
            r["message"] = json!(o.message.as_deref().unwrap_or(""));
        }
        if let Some(e) = &o.engine {
            r["engine"] = json!(e);
        }
        if with_output {
            match o.output.as_ref().map(|b| std::str::from_utf8(b).map_err(|_| b)) {
                Some(Ok(text)) => r["output"] = json!(text),
                Some(Err(bytes)) => {
                    use base64::Engine as _;
                    r["output_base64"] = json!(base64::engine::general_purpose::STANDARD.encode(bytes));
                }
                None if o.error.is_none() => r["output_kept"] = json!(false),
                None => {}
            }
        }
        v["result"] = r;
    }
    v
}

fn bad_id(id: &str) -> Option<Resp> {
    (!calls::valid_id(id)).then(|| {
        error_resp(StatusCode::NOT_FOUND, "not_found", &format!("no async call {id:?} (ids are 32 hex digits)"), None)
    })
}

fn no_call(id: &str) -> Resp {
    error_resp(
        StatusCode::NOT_FOUND,
        "not_found",
        &format!("no async call {id} (never accepted, removed, or past its retention)"),
        None,
    )
}

pub(crate) fn get(sh: &GwShared, id: &str) -> Resp {
    if let Some(r) = bad_id(id) {
        return r;
    }
    match sh.calls.get(id) {
        Ok(Some(rec)) => json_resp(StatusCode::OK, &view(&rec, true)),
        Ok(None) => no_call(id),
        Err(e) => crate::http::store_error(&e),
    }
}

/// `?function=F&state=S&limit=N`, newest first.
pub(crate) fn list(sh: &GwShared, query: &str) -> Resp {
    let (mut function, mut state, mut limit) = (None, None, 100usize);
    for kv in query.split('&').filter(|kv| !kv.is_empty()) {
        let bad = |m: String| error_resp(StatusCode::BAD_REQUEST, "bad_request", &m, None);
        match kv.split_once('=') {
            Some(("function", f)) if wire::valid_function_name(f) => function = Some(f.to_string()),
            Some(("function", f)) => return bad(format!("function={f:?} is not a function name")),
            Some(("state", s)) => match State::parse(s) {
                Some(s) => state = Some(s),
                None => return bad(format!("state={s:?}: use queued, running, ok or failed")),
            },
            Some(("limit", n)) => match n.parse::<usize>() {
                Ok(n) if (1..=LIST_LIMIT_MAX).contains(&n) => limit = n,
                _ => return bad(format!("limit={n:?}: a number from 1 to {LIST_LIMIT_MAX}")),
            },
            _ => return bad(format!("unknown parameter {kv:?} (function, state, limit)")),
        }
    }
    let all = match sh.calls.list() {
        Ok(a) => a,
        Err(e) => return crate::http::store_error(&e),
    };
    let mut counts = json!({ "queued": 0, "running": 0, "ok": 0, "failed": 0 });
    let mut total = 0;
    let mut shown = Vec::new();
    for r in all.iter().filter(|r| function.as_ref().is_none_or(|f| *f == r.function)) {
        counts[r.state.name()] = json!(counts[r.state.name()].as_u64().unwrap_or(0) + 1);
        if state.is_some_and(|s| s != r.state) {
            continue;
        }
        total += 1;
        if shown.len() < limit {
            shown.push(view(r, false));
        }
    }
    json_resp(StatusCode::OK, &json!({ "calls": shown, "total": total, "by_state": counts }))
}

pub(crate) async fn replay(sh: &GwShared, id: &str) -> Resp {
    if let Some(r) = bad_id(id) {
        return r;
    }
    let rec = match sh.calls.get(id) {
        Ok(Some(r)) => r,
        Ok(None) => return no_call(id),
        Err(e) => return crate::http::store_error(&e),
    };
    let spec = match sh.store.get(&rec.function) {
        Ok(Some(s)) => s,
        Ok(None) => {
            let msg = format!("function {} of call {id} is not deployed any more", rec.function);
            return error_resp(StatusCode::CONFLICT, "conflict", &msg, None);
        }
        Err(e) => return crate::http::store_error(&e),
    };
    match sh.calls.replay(id, &spec.async_calls, spec.max_workers).await {
        Ok(rec) => accepted(&rec.function, &rec.id),
        Err(e) => replay_error(id, e),
    }
}

fn replay_error(id: &str, e: ReplayError) -> Resp {
    match e {
        ReplayError::NotFound => no_call(id),
        ReplayError::NotFailed(s) => error_resp(
            StatusCode::CONFLICT,
            "conflict",
            &format!("call {id} is {}: only a failed call (a dead letter) can be replayed", s.name()),
            None,
        ),
        ReplayError::Running => error_resp(
            StatusCode::CONFLICT,
            "conflict",
            &format!("call {id} is running; remove it once it has ended"),
            None,
        ),
        ReplayError::Refused(r) => refused(r),
        ReplayError::Store(m) => error_resp(StatusCode::SERVICE_UNAVAILABLE, "store_unavailable", &m, None),
    }
}

pub(crate) async fn remove(sh: &GwShared, id: &str) -> Resp {
    if let Some(r) = bad_id(id) {
        return r;
    }
    match sh.calls.remove(id).await {
        Ok(true) => json_resp(StatusCode::OK, &json!({ "removed": id })),
        Ok(false) => no_call(id),
        Err(e) => replay_error(id, e),
    }
}
