//! What the gateway reads from a client's request, as pure functions of its
//! headers and bytes. The HTTP routes call these; `fuzz/` attacks them.
//! Nothing here trusts its input: every function takes any bytes and
//! answers a value or a message for the client, never a panic.

use crate::http::TIMEOUT_HEADER;
use api::control::{LogCursor, LOG_LINES_MAX};
use api::spec::FunctionSpec;
use hyper::header::{HeaderMap, AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE, HOST, ORIGIN};
use serde_json::Value;
use std::collections::HashMap;

/// The most functions one deploy request may name.
pub const DEPLOY_FUNCTIONS_MAX: usize = 256;

/// The token a request presents (`Authorization: Bearer T`), or empty.
pub fn bearer(h: &HeaderMap) -> &[u8] {
    h.get(AUTHORIZATION).and_then(|v| v.as_bytes().strip_prefix(b"Bearer ")).unwrap_or(b"")
}

/// Whether the request names this gateway by a loopback name. A page that
/// rebinds its own domain to 127.0.0.1 still sends its domain here.
pub fn loopback_host(h: &HeaderMap) -> bool {
    api::http::loopback_host(h.get(HOST).map(|v| v.as_bytes()))
}

/// Why a management request looks like it comes from another site's page
/// (browsers send `Origin` and `Sec-Fetch-Site`; the CLI and curl do not).
pub fn cross_origin(h: &HeaderMap) -> Option<String> {
    if let Some(site) = h.get("sec-fetch-site").and_then(|v| v.to_str().ok()) {
        if site != "same-origin" && site != "none" {
            return Some(format!("management requests from a web page of another site are refused ({site})"));
        }
    }
    let origin = h.get(ORIGIN)?.to_str().unwrap_or("?");
    let host = h.get(HOST).and_then(|v| v.to_str().ok()).unwrap_or("");
    let same = origin.strip_prefix("http://").or_else(|| origin.strip_prefix("https://")) == Some(host);
    (!same).then(|| format!("management requests from another origin ({origin}) are refused"))
}

/// The caller's W3C trace context (`traceparent` and `tracestate`), as a
/// `Call` frame carries it; none when `traceparent` is absent, repeated or
/// malformed (ignored, as the recommendation says: the call may start a
/// trace of its own).
pub fn trace_context(h: &HeaderMap) -> Option<Vec<u8>> {
    trace_headers(h).map(|t| t.encode())
}

/// [`trace_context`], parsed.
pub fn trace_headers(h: &HeaderMap) -> Option<api::trace::TraceContext> {
    let mut values = h.get_all(api::trace::HEADER).iter();
    let (Some(v), None) = (values.next(), values.next()) else { return None };
    let states = h.get_all(api::trace::STATE_HEADER).into_iter().map(|v| v.as_bytes());
    api::trace::TraceContext::from_headers(v.as_bytes(), states)
}

/// The request's content type, without parameters, lower case.
pub fn content_type(h: &HeaderMap) -> String {
    h.get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map(|v| v.trim().to_ascii_lowercase())
        .unwrap_or_default()
}

/// A request the gateway refuses with 400: the message says what to fix.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum BadInput {
    #[error("{TIMEOUT_HEADER} must be a whole number of milliseconds between 1 and {max}, got {0:?}", max = u32::MAX)]
    Timeout(String),
    #[error("invalid JSON: {0}")]
    Json(String),
    #[error("more than {DEPLOY_FUNCTIONS_MAX} functions in one deploy")]
    TooManyFunctions,
    #[error("invalid function spec: {0}")]
    Spec(String),
    #[error("no functions given")]
    NoFunctions,
    #[error("function {name}: {error}")]
    Invalid { name: String, error: api::spec::SpecError },
}

/// The body length the client declares, if it is a number.
pub fn content_length(h: &HeaderMap) -> Option<u64> {
    h.get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
}

/// The call's timeout from `x-staccato-timeout-ms`: 0 (the function's own)
/// when absent, else a whole number of milliseconds from 1 up.
pub fn timeout_ms(h: &HeaderMap) -> Result<u32, BadInput> {
    let Some(v) = h.get(TIMEOUT_HEADER) else { return Ok(0) };
    api::http::timeout_ms(v.as_bytes())
        .ok_or_else(|| BadInput::Timeout(String::from_utf8_lossy(v.as_bytes()).into_owned()))
}

/// The functions a deploy request names (`{"functions": [spec, ...]}` or
/// one spec), each valid on its own. Whether their sources were uploaded
/// and whether this host can give what they ask is checked later.
pub fn deploy_specs(body: &[u8]) -> Result<Vec<FunctionSpec>, BadInput> {
    let v: Value = serde_json::from_slice(body).map_err(|e| BadInput::Json(e.to_string()))?;
    let arr = match v {
        Value::Object(mut o) if o.contains_key("functions") => o.remove("functions").unwrap_or(Value::Null),
        other => Value::Array(vec![other]),
    };
    if arr.as_array().is_some_and(|a| a.len() > DEPLOY_FUNCTIONS_MAX) {
        return Err(BadInput::TooManyFunctions);
    }
    let specs: Vec<FunctionSpec> = serde_json::from_value(arr).map_err(|e| BadInput::Spec(e.to_string()))?;
    if specs.is_empty() {
        return Err(BadInput::NoFunctions);
    }
    for spec in &specs {
        spec.validate().map_err(|error| BadInput::Invalid { name: spec.name.clone(), error })?;
    }
    Ok(specs)
}

/// `GET /system/trace?function=F&limit=N`: the function (if named) and the
/// number of traces (100 unless a number is given).
pub fn trace_query(query: &str) -> (Option<String>, u64) {
    let (mut function, mut limit) = (None, 100);
    for kv in query.split('&') {
        match kv.split_once('=') {
            Some(("function", f)) => function = Some(f.to_string()),
            Some(("limit", n)) => limit = n.parse::<u64>().unwrap_or(100),
            _ => {}
        }
    }
    (function, limit)
}

/// `%XX` escapes decoded; `None` for a malformed one or bytes that are
/// not UTF-8.
fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// `GET /system/logs/NAME?lines=N&after=ENGINE~FILE~OFFSET,...`: lines from
/// the end (default 50) for engines read for the first time, and where
/// each engine's earlier read ended (from an earlier answer's `cursor`).
pub fn logs_query(query: &str) -> Result<(u32, HashMap<String, LogCursor>), String> {
    let (mut lines, mut after) = (50u32, HashMap::new());
    for kv in query.split('&').filter(|kv| !kv.is_empty()) {
        match kv.split_once('=') {
            Some(("lines", n)) => {
                lines = n
                    .parse()
                    .ok()
                    .filter(|&n| n <= LOG_LINES_MAX)
                    .ok_or_else(|| format!("lines={n:?}: a whole number of lines up to {LOG_LINES_MAX}"))?
            }
            Some(("after", v)) => {
                let v = percent_decode(v).ok_or_else(|| format!("after={v:?} is not well escaped"))?;
                for c in v.split(',').filter(|c| !c.is_empty()) {
                    let bad = || format!("after: {c:?} is not like ENGINE~FILE~OFFSET (a cursor an answer gave)");
                    let mut parts = c.split('~');
                    let (Some(id), Some(file), Some(offset), None) =
                        (parts.next(), parts.next(), parts.next(), parts.next())
                    else {
                        return Err(bad());
                    };
                    if !api::cluster::valid_engine_id(id) || after.len() >= api::cluster::ENGINES_MAX {
                        return Err(bad());
                    }
                    let (Ok(file), Ok(offset)) = (file.parse(), offset.parse()) else { return Err(bad()) };
                    after.insert(id.to_string(), LogCursor { file, offset });
                }
            }
            _ => return Err(format!("unknown query parameter in {kv:?} (lines, after)")),
        }
    }
    Ok((lines, after))
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::header::HeaderValue;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn loopback_names_only() {
        for ok in ["localhost", "LOCALHOST:8080", "127.0.0.1:1", "[::1]:8080", "127.9.9.9"] {
            assert!(loopback_host(&headers(&[("host", ok)])), "{ok}");
        }
        for bad in [
            "evil.example",
            "evil.example:8080",
            "127.0.0.1.evil.example",
            "[::2]:80",
            "localhost.:80",
            "[::1]:http://evil.example",
            "[::1]x",
            "[::1",
        ] {
            assert!(!loopback_host(&headers(&[("host", bad)])), "{bad}");
        }
        assert!(loopback_host(&HeaderMap::new()));
    }

    #[test]
    fn other_origins_are_named() {
        let same = headers(&[("host", "127.0.0.1:8080"), ("origin", "http://127.0.0.1:8080")]);
        assert_eq!(cross_origin(&same), None);
        let other = headers(&[("host", "127.0.0.1:8080"), ("origin", "http://evil.example")]);
        assert!(cross_origin(&other).unwrap().contains("evil.example"));
        let site = headers(&[("sec-fetch-site", "cross-site")]);
        assert!(cross_origin(&site).unwrap().contains("cross-site"));
    }

    #[test]
    fn timeouts_are_whole_positive_milliseconds() {
        assert_eq!(timeout_ms(&HeaderMap::new()), Ok(0));
        assert_eq!(timeout_ms(&headers(&[(TIMEOUT_HEADER, "250")])), Ok(250));
        for bad in ["0", "-1", "abc", "1.5", "4294967296", ""] {
            assert!(timeout_ms(&headers(&[(TIMEOUT_HEADER, bad)])).is_err(), "{bad}");
        }
    }

    #[test]
    fn deploy_bodies_are_checked_whole() {
        assert!(matches!(deploy_specs(b"{").unwrap_err(), BadInput::Json(_)));
        assert_eq!(deploy_specs(b"{\"functions\": []}").unwrap_err().to_string(), "no functions given");
        assert!(deploy_specs(b"{\"functions\": 3}").unwrap_err().to_string().starts_with("invalid function spec"));
        let many = format!("{{\"functions\": [{}]}}", vec!["{}"; DEPLOY_FUNCTIONS_MAX + 1].join(","));
        assert_eq!(deploy_specs(many.as_bytes()).unwrap_err(), BadInput::TooManyFunctions);
    }

    #[test]
    fn trace_queries() {
        assert_eq!(trace_query(""), (None, 100));
        assert_eq!(trace_query("function=f&limit=7"), (Some("f".into()), 7));
        assert_eq!(trace_query("limit=x&junk"), (None, 100));
    }

    #[test]
    fn log_queries_are_checked() {
        assert_eq!(logs_query("").unwrap(), (50, HashMap::new()));
        let (lines, after) = logs_query("lines=7&after=127.0.0.1%3A7000~12~34,e2~0~0").unwrap();
        assert_eq!(lines, 7);
        assert_eq!(after["127.0.0.1:7000"], LogCursor { file: 12, offset: 34 });
        assert_eq!(after["e2"], LogCursor { file: 0, offset: 0 });
        for bad in [
            "lines=-1",
            "lines=100001",
            "after=e1~1",
            "after=e1~1~2~3",
            "after=e%2F1~1~2",
            "after=e1~x~2",
            "after=%zz",
            "after=%ff~1~2",
            "follow=1",
        ] {
            assert!(logs_query(bad).is_err(), "{bad}");
        }
    }
}
