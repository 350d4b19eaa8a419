//! The engine's own HTTP front door (`staccato up`): external calls parsed
//! by the I/O thread that owns the client connection, queued and answered
//! there, without the hop through the gateway (client → gateway thread →
//! loopback TCP → engine I/O thread, and back; issue 14 measured that hop
//! as most of an external call's latency at low load).
//!
//! It serves one kind of request only: a plain `POST`/`GET
//! /function/{name}` over HTTP/1.1 with a `Content-Length` body (or none)
//! for a function this engine runs, while it is the gateway's only engine.
//! Everything else — management, metrics, other HTTP forms (chunked
//! bodies, `Expect`, upgrades, HTTP/1.0), anything malformed or over a
//! limit, a function that is not here, a request for another host — is
//! not refused here but handed over with the connection to the gateway
//! ([`FrontDoor::hand_over`]), whose hyper server answers it as it
//! answers any client. So this parser needs to recognise the one happy
//! path exactly and nothing more; its answers carry the same headers and
//! error bodies as the gateway's (`api::http`).

use std::time::Duration;

/// What the engine needs from the gateway it fronts for.
pub trait FrontDoor: Send + Sync {
    /// A place among the gateway's open connections for one served here,
    /// held until it closes; `None` when the gateway is full.
    fn admit(&self) -> Option<Box<dyn Send>>;
    /// Gives the gateway a connection this door does not serve, with the
    /// bytes read from it and not answered.
    fn hand_over(&self, thread: usize, stream: std::net::TcpStream, read: Vec<u8>);
    /// Whether this engine is the gateway's only engine (calls are then
    /// served here; with others, the gateway balances between them), and
    /// if it is, runs `f` with its id (borrowed: no copy per call).
    fn sole_engine(&self, f: &mut dyn FnMut(&str)) -> bool;
    /// Records an answered call in the gateway's metrics, with the
    /// engine's timing of it.
    fn record(&self, thread: usize, function: &str, outcome: &'static str, latency_s: f64, timing: wire::frame::Timing);
    /// Whether requests must name a loopback host (DNS rebinding).
    fn loopback_only(&self) -> bool;
    /// How long a connection may wait without a complete request.
    fn idle_timeout(&self) -> Duration;
    /// Counts a connection moved to the I/O thread of the vCPU its client
    /// now sends from (in the gateway's metrics).
    fn followed(&self);
}

/// How a call ended, for its answer.
#[derive(Clone, Copy)]
pub(crate) enum Answer<'a> {
    Ok(&'a [u8]),
    Err { status: u16, kind: &'static str, message: &'a str },
}

/// The HTTP answer to a call: the same status, headers and body the
/// gateway gives (`gateway::http::invoke`).
pub(crate) fn answer(
    call_id: u64,
    answer: Answer<'_>,
    timing: wire::frame::Timing,
    engine: Option<&str>,
    close: bool,
) -> Vec<u8> {
    // Written by hand, not with `write!`: this is on every external
    // call's path, where the formatting machinery and the temporary
    // strings it needed showed in the I/O thread's profile (BENCHMARKS.md,
    // "Fewer clock reads and allocations per call").
    let mut id = [0u8; 16];
    hex16(call_id, &mut id);
    let (status, ctype, body) = match answer {
        Answer::Ok(b) => (200, "application/octet-stream", std::borrow::Cow::Borrowed(b)),
        Answer::Err { status, kind, message } => {
            // Hex digits are ASCII.
            let id = std::str::from_utf8(&id).expect("hex digits");
            (status, "application/json", std::borrow::Cow::Owned(api::http::error_body(kind, message, Some(id))))
        }
    };
    let mut out = Vec::with_capacity(256 + body.len());
    out.extend_from_slice(b"HTTP/1.1 ");
    push_dec(&mut out, u64::from(status));
    out.push(b' ');
    out.extend_from_slice(reason(status).as_bytes());
    out.extend_from_slice(b"\r\ncontent-type: ");
    out.extend_from_slice(ctype.as_bytes());
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(api::http::CALL_ID_HEADER.as_bytes());
    out.extend_from_slice(b": ");
    out.extend_from_slice(&id);
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(api::http::TIMING_HEADER.as_bytes());
    // As `api::http::timing_value` writes it.
    out.extend_from_slice(b": queue_us=");
    push_dec(&mut out, u64::from(timing.queue_us));
    out.extend_from_slice(b",exec_us=");
    push_dec(&mut out, u64::from(timing.exec_us));
    out.extend_from_slice(b",cold_us=");
    push_dec(&mut out, u64::from(timing.cold_us));
    out.extend_from_slice(b"\r\n");
    // Engine ids are checked header-safe characters when they join.
    if let Some(e) = engine {
        out.extend_from_slice(api::http::ENGINE_HEADER.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(e.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if status == 503 {
        out.extend_from_slice(b"retry-after: 1\r\n");
    }
    if close {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(b"content-length: ");
    push_dec(&mut out, body.len() as u64);
    out.extend_from_slice(b"\r\ndate: ");
    with_date(|d| out.extend_from_slice(d.as_bytes()));
    out.extend_from_slice(b"\r\n\r\n");
    out.extend_from_slice(&body);
    out
}

/// `n` in decimal.
fn push_dec(out: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
}

/// `n` as 16 lowercase hex digits, as `{:016x}` writes it.
fn hex16(n: u64, out: &mut [u8; 16]) {
    for (i, d) in out.iter_mut().enumerate() {
        let nibble = (n >> (60 - 4 * i)) & 0xf;
        *d = b"0123456789abcdef"[nibble as usize];
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        408 => "Request Timeout",
        413 => "Payload Too Large",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        507 => "Insufficient Storage",
        508 => "Loop Detected",
        _ => "",
    }
}

/// Runs `f` with the `Date` header's value, formatted once a second per
/// thread (borrowed: no copy per call).
fn with_date(f: impl FnOnce(&str)) {
    use std::cell::RefCell;
    thread_local! {
        static DATE: RefCell<(u64, String)> = const { RefCell::new((0, String::new())) };
    }
    let now = std::time::SystemTime::now();
    let s = now.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    DATE.with(|d| {
        let mut d = d.borrow_mut();
        if d.0 != s || d.1.is_empty() {
            *d = (s, httpdate::fmt_http_date(now));
        }
        f(&d.1)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_written_as_format_writes_them() {
        for n in [0, 1, 9, 10, 99, 100, 4_294_967_295, 1 << 53, u64::MAX - 1, u64::MAX] {
            let mut d = Vec::new();
            push_dec(&mut d, n);
            assert_eq!(d, n.to_string().as_bytes());
            let mut h = [0u8; 16];
            hex16(n, &mut h);
            assert_eq!(&h[..], format!("{n:016x}").as_bytes());
        }
        let t = wire::frame::Timing { queue_us: u32::MAX, exec_us: 0, cold_us: 1_000_000 };
        let a = String::from_utf8(answer(u64::MAX, Answer::Ok(b""), t, None, false)).unwrap();
        let want = api::http::timing_value(t.queue_us, t.exec_us, t.cold_us);
        assert!(a.contains(&format!("\r\n{}: {want}\r\n", api::http::TIMING_HEADER)), "{a}");
        assert!(a.contains("\r\nx-call-id: ffffffffffffffff\r\n"), "{a}");
        assert!(a.contains("\r\ncontent-length: 0\r\ndate: ") && a.ends_with(" GMT\r\n\r\n"), "{a}");
    }

    #[test]
    fn answers_like_the_gateway() {
        let t = wire::frame::Timing { queue_us: 1, exec_us: 2, cold_us: 0 };
        let a = String::from_utf8(answer(0xab, Answer::Ok(b"out"), t, Some("e1"), false)).unwrap();
        assert!(a.starts_with("HTTP/1.1 200 OK\r\n"), "{a}");
        assert!(a.contains("\r\nx-call-id: 00000000000000ab\r\n"), "{a}");
        assert!(a.contains("\r\nx-staccato-timing: queue_us=1,exec_us=2,cold_us=0\r\n"), "{a}");
        assert!(a.contains("\r\nx-staccato-engine: e1\r\n"), "{a}");
        assert!(a.contains("\r\ncontent-length: 3\r\n") && a.ends_with("\r\n\r\nout"), "{a}");
        let e = Answer::Err { status: 503, kind: "engine_unavailable", message: "m" };
        let a = String::from_utf8(answer(1, e, t, None, true)).unwrap();
        assert!(a.starts_with("HTTP/1.1 503 Service Unavailable\r\n"), "{a}");
        assert!(a.contains("\r\nretry-after: 1\r\n") && a.contains("\r\nconnection: close\r\n"), "{a}");
        let body = a.split("\r\n\r\n").nth(1).unwrap();
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["error"]["kind"], "engine_unavailable");
        assert_eq!(v["error"]["call_id"], "0000000000000001");
    }
}
