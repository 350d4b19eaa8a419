//! What both HTTP front doors — the gateway's and the engine's own
//! (`staccato up`) — read from a call's request and write in its answer,
//! so a client cannot tell which one served it. Pure functions of bytes;
//! none trusts its input.

use std::ops::Range;

/// The call's id, as the engine knows it (16 hex digits).
pub const CALL_ID_HEADER: &str = "x-call-id";
/// `queue_us=..,exec_us=..,cold_us=..` of the call.
pub const TIMING_HEADER: &str = "x-staccato-timing";
/// The call's timeout in milliseconds (the function's own when absent).
pub const TIMEOUT_HEADER: &str = "x-staccato-timeout-ms";
/// Which engine ran the call (its id in `/system/engines`).
pub const ENGINE_HEADER: &str = "x-staccato-engine";

/// Whether a `Host` header names a loopback address or `localhost`. A
/// page that rebinds its own domain to 127.0.0.1 still sends its domain.
/// `None` (no Host) is allowed: HTTP/1.1 requires Host, so a request
/// without one is no browser's.
pub fn loopback_host(host: Option<&[u8]>) -> bool {
    let host = match host.map(std::str::from_utf8) {
        Some(Ok(h)) => h,
        None => return true,
        Some(Err(_)) => return false,
    };
    let is_port = |p: &str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit());
    let name = match host.strip_prefix('[') {
        // `[v6]` or `[v6]:port`, nothing else after the bracket.
        Some(rest) => match rest.split_once(']') {
            Some((v6, "")) => v6,
            Some((v6, after)) if after.strip_prefix(':').is_some_and(is_port) => v6,
            _ => return false,
        },
        None => host.rsplit_once(':').map_or(host, |(n, port)| if is_port(port) { n } else { host }),
    };
    name.eq_ignore_ascii_case("localhost") || name.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// The value of `x-staccato-timeout-ms`: a whole number of milliseconds
/// from 1 to `u32::MAX`, or `None` if it is anything else.
pub fn timeout_ms(value: &[u8]) -> Option<u32> {
    std::str::from_utf8(value).ok()?.parse::<u32>().ok().filter(|ms| *ms > 0)
}

/// The longest request head this door reads; a longer one is the
/// gateway's to refuse.
pub const HEAD_MAX: usize = 16 * 1024;
const HEADERS_MAX: usize = 32;

/// A call request, recognised.
#[derive(Debug, PartialEq, Eq)]
pub struct CallRequest {
    pub name: String,
    pub body: Range<usize>,
    /// `x-staccato-timeout-ms`, 0 when absent.
    pub timeout_ms: u32,
    /// The client asked to close the connection after the answer.
    pub close: bool,
    /// Its `traceparent`, if it sent one valid header, with its
    /// `tracestate` (`crate::trace`).
    pub trace: Option<crate::trace::TraceContext>,
}

#[derive(Debug, PartialEq, Eq)]
pub enum Parsed {
    /// Not all of the request's head is here yet.
    Partial,
    /// The head of a call is, not all of its body yet.
    PartialBody,
    /// A call this door serves.
    Call(CallRequest),
    /// Anything else: the gateway's. Says why (for the debug log).
    HandOver(&'static str),
}

/// Reads the request at the start of `buf` for the engine's front door. `payload_max` bounds the body;
/// `loopback_only` requires a loopback `Host`.
pub fn parse_call(buf: &[u8], payload_max: usize, loopback_only: bool) -> Parsed {
    let mut headers = [httparse::EMPTY_HEADER; HEADERS_MAX];
    let mut req = httparse::Request::new(&mut headers);
    let head_len = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() > HEAD_MAX => return Parsed::HandOver("head too long"),
        Ok(httparse::Status::Partial) => return Parsed::Partial,
        Err(_) => return Parsed::HandOver("malformed head"),
    };
    if head_len > HEAD_MAX {
        return Parsed::HandOver("head too long");
    }
    if req.version != Some(1) {
        return Parsed::HandOver("not HTTP/1.1");
    }
    if !matches!(req.method, Some("POST" | "GET")) {
        return Parsed::HandOver("not a call's method");
    }
    let Some(name) = call_target(req.path.unwrap_or("")) else { return Parsed::HandOver("not a call's path") };
    let (mut length, mut host, mut close, mut timeout) = (None, None, false, 0);
    // (seen, the value): a second traceparent voids both.
    let mut trace: (u32, &[u8]) = (0, &[]);
    let mut states: Vec<&[u8]> = Vec::new();
    for h in req.headers.iter() {
        let n = h.name;
        if n.eq_ignore_ascii_case("content-length") {
            if length.is_some() {
                return Parsed::HandOver("two Content-Length headers");
            }
            match digits(h.value) {
                Some(v) => length = Some(v),
                None => return Parsed::HandOver("bad Content-Length"),
            }
        } else if n.eq_ignore_ascii_case("host") {
            if host.is_some() {
                return Parsed::HandOver("two Host headers");
            }
            host = Some(h.value);
        } else if n.eq_ignore_ascii_case("connection") {
            for token in h.value.split(|b| *b == b',') {
                let t = token.trim_ascii();
                if t.eq_ignore_ascii_case(b"close") {
                    close = true;
                } else if t.eq_ignore_ascii_case(b"upgrade") {
                    return Parsed::HandOver("an upgrade");
                }
            }
        } else if n.eq_ignore_ascii_case(crate::trace::HEADER) {
            trace = (trace.0 + 1, h.value);
        } else if n.eq_ignore_ascii_case(crate::trace::STATE_HEADER) {
            states.push(h.value);
        } else if n.eq_ignore_ascii_case(TIMEOUT_HEADER) {
            match timeout_ms(h.value) {
                Some(ms) if timeout == 0 => timeout = ms,
                _ => return Parsed::HandOver("bad or repeated timeout header"),
            }
        } else if n.eq_ignore_ascii_case("transfer-encoding")
            || n.eq_ignore_ascii_case("expect")
            || n.eq_ignore_ascii_case("upgrade")
        {
            return Parsed::HandOver("a body or exchange this door does not read");
        }
    }
    if loopback_only && !loopback_host(host) {
        return Parsed::HandOver("a Host that is not loopback");
    }
    let length = length.unwrap_or(0);
    if length > payload_max as u64 {
        return Parsed::HandOver("a body over the limit");
    }
    let end = head_len + length as usize;
    if buf.len() < end {
        return Parsed::PartialBody;
    }
    let trace = if trace.0 == 1 { crate::trace::TraceContext::from_headers(trace.1, states.into_iter()) } else { None };
    Parsed::Call(CallRequest { name: name.to_string(), body: head_len..end, timeout_ms: timeout, close, trace })
}

/// The function a request target names, if it is `/function/{name}` (a
/// trailing slash and a query allowed, as the gateway allows them) with a
/// valid name.
fn call_target(target: &str) -> Option<&str> {
    let path = target.split_once('?').map_or(target, |(p, _)| p);
    let rest = path.strip_prefix("/function/")?;
    let name = rest.strip_suffix('/').unwrap_or(rest);
    wire::valid_function_name(name).then_some(name)
}

/// A decimal number without sign or spaces, below 2^63.
fn digits(v: &[u8]) -> Option<u64> {
    if v.is_empty() || v.len() > 18 || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(v).ok()?.parse().ok()
}

/// The JSON body of an error answer.
pub fn error_body(kind: &str, message: &str, call_id: Option<&str>) -> Vec<u8> {
    let v = serde_json::json!({"error": {"kind": kind, "message": message, "call_id": call_id}});
    serde_json::to_vec(&v).unwrap_or_default()
}

/// The value of the timing header.
pub fn timing_value(queue_us: u32, exec_us: u32, cold_us: u32) -> String {
    format!("queue_us={queue_us},exec_us={exec_us},cold_us={cold_us}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(req: &str) -> Parsed {
        parse_call(req.as_bytes(), 1024, true)
    }

    #[test]
    fn a_traceparent_is_read_once_and_a_bad_or_repeated_one_ignored() {
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let trace_of = |headers: &str| match call(&format!("POST /function/f HTTP/1.1\r\n{headers}\r\n")) {
            Parsed::Call(c) => c.trace.map(|t| t.parent),
            other => panic!("{other:?}"),
        };
        assert_eq!(trace_of(&format!("traceparent: {tp}\r\n")), crate::trace::TraceParent::parse(tp.as_bytes()));
        assert_eq!(trace_of("Traceparent: 00-xyz\r\n"), None);
        assert_eq!(trace_of(&format!("traceparent: {tp}\r\ntraceparent: {tp}\r\n")), None);
        // Its tracestate: every header's members, in order; alone it is nothing.
        let state_of = |headers: &str| match call(&format!("POST /function/f HTTP/1.1\r\n{headers}\r\n")) {
            Parsed::Call(c) => c.trace.map(|t| t.state),
            other => panic!("{other:?}"),
        };
        let two = format!("tracestate: a=1\r\ntraceparent: {tp}\r\nTraceState: b=2, c=3\r\n");
        assert_eq!(state_of(&two).as_deref(), Some("a=1,b=2,c=3"));
        assert_eq!(state_of(&format!("traceparent: {tp}\r\ntracestate: A=1\r\n")).as_deref(), Some(""));
        assert_eq!(state_of("tracestate: a=1\r\n"), None);
    }

    #[test]
    fn serves_plain_calls() {
        let r = "POST /function/nop HTTP/1.1\r\nHost: localhost:8080\r\nContent-Length: 3\r\n\r\nabc";
        let head = r.len() - 3;
        let want = CallRequest { name: "nop".into(), body: head..r.len(), timeout_ms: 0, close: false, trace: None };
        assert_eq!(call(r), Parsed::Call(want));
        let r =
            "GET /function/a-b_c/?x=1 HTTP/1.1\r\nconnection: keep-alive, Close\r\nX-Staccato-Timeout-Ms: 250\r\n\r\n";
        let want =
            CallRequest { name: "a-b_c".into(), body: r.len()..r.len(), timeout_ms: 250, close: true, trace: None };
        assert_eq!(call(r), Parsed::Call(want));
    }

    #[test]
    fn waits_for_the_whole_request() {
        let r = "POST /function/nop HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc";
        let head = r.len() - 3;
        for cut in 1..r.len() {
            let want = if cut < head { Parsed::Partial } else { Parsed::PartialBody };
            assert_eq!(call(&r[..cut]), want, "{cut}");
        }
    }

    #[test]
    fn hands_over_everything_else() {
        for r in [
            "POST /system/functions HTTP/1.1\r\n\r\n",
            "GET /metrics HTTP/1.1\r\n\r\n",
            "POST /function/nop HTTP/1.0\r\n\r\n",
            "PUT /function/nop HTTP/1.1\r\n\r\n",
            "POST /function/../x HTTP/1.1\r\n\r\n",
            "POST /function/a/b HTTP/1.1\r\n\r\n",
            "POST //function/nop HTTP/1.1\r\n\r\n",
            "POST http://localhost/function/nop HTTP/1.1\r\n\r\n",
            "POST /function/nop HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
            "POST /function/nop HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
            "POST /function/nop HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n",
            "POST /function/nop HTTP/1.1\r\nContent-Length: +1\r\n\r\n",
            "POST /function/nop HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n",
            "POST /function/nop HTTP/1.1\r\nContent-Length: 1025\r\n\r\n",
            "POST /function/nop HTTP/1.1\r\nExpect: 100-continue\r\n\r\n",
            "POST /function/nop HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n",
            "POST /function/nop HTTP/1.1\r\nHost: evil.example\r\n\r\n",
            "POST /function/nop HTTP/1.1\r\nHost: localhost\r\nHost: evil.example\r\n\r\n",
            "POST /function/nop HTTP/1.1\r\nx-staccato-timeout-ms: 0\r\n\r\n",
            "POST /function/nop HTTP/1.1\r\nx-staccato-timeout-ms: 5\r\nx-staccato-timeout-ms: 6\r\n\r\n",
            "POST /function/nop HTTP/1.1\r\nBad Header\r\n\r\n",
            "GARBAGE\r\n\r\n",
        ] {
            assert!(matches!(call(r), Parsed::HandOver(_)), "{r:?}: {:?}", call(r));
        }
        let many: String = (0..40).map(|i| format!("x-{i}: 1\r\n")).collect();
        assert!(matches!(call(&format!("POST /function/nop HTTP/1.1\r\n{many}\r\n")), Parsed::HandOver(_)));
        let long = format!("POST /function/nop HTTP/1.1\r\nx: {}", "a".repeat(HEAD_MAX));
        assert!(matches!(call(&long), Parsed::HandOver(_)));
        // Only when listening on loopback is the host checked.
        let r = "POST /function/nop HTTP/1.1\r\nHost: evil.example\r\n\r\n";
        assert!(matches!(parse_call(r.as_bytes(), 1024, false), Parsed::Call(_)));
    }

    #[test]
    fn loopback_names_only() {
        for ok in ["localhost", "LOCALHOST:8080", "127.0.0.1", "127.0.0.1:80", "[::1]", "[::1]:8080", "127.9.9.9"] {
            assert!(loopback_host(Some(ok.as_bytes())), "{ok}");
        }
        for bad in ["evil.com", "evil.com:80", "localhost.evil.com", "[::1]x", "[::1]:", "10.0.0.1", "127.0.0.1:x"] {
            assert!(!loopback_host(Some(bad.as_bytes())), "{bad}");
        }
        assert!(!loopback_host(Some(b"\xff")));
        assert!(loopback_host(None));
    }

    #[test]
    fn timeouts() {
        assert_eq!(timeout_ms(b"250"), Some(250));
        for bad in ["0", "-1", "1.5", "", " 5", "4294967296", "ten"] {
            assert_eq!(timeout_ms(bad.as_bytes()), None, "{bad}");
        }
    }

    #[test]
    fn error_bodies_are_json() {
        let v: serde_json::Value = serde_json::from_slice(&error_body("timeout", "a \"quoted\" word", None)).unwrap();
        assert_eq!(v["error"]["kind"], "timeout");
        assert_eq!(v["error"]["message"], "a \"quoted\" word");
        assert!(v["error"]["call_id"].is_null());
    }
}
