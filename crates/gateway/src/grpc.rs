//! gRPC ingress (`--grpc-listen`): unary calls over HTTP/2 without TLS
//! (h2c, prior knowledge), `/{package.Service}/{Method}` mapped to the
//! function whose manifest names the method (`grpc:`).
//!
//! The request message's bytes are the function's input and its output is
//! the response message: the gateway frames them (the 5-byte gRPC message
//! prefix) and never decodes protobuf. Errors are gRPC statuses in
//! trailers, mapped from Staccato's error kinds ([`status_of`]);
//! `grpc-timeout` becomes the call's deadline, `authorization: Bearer`
//! metadata its invoke key. A request frame that is malformed (short, a
//! length that is not what came, compressed, more than one message) gets
//! `INTERNAL`, `UNIMPLEMENTED` or `INVALID_ARGUMENT`, and the connection
//! goes on serving.

use crate::http::{send, Sent};
use crate::keys::Verdict;
use crate::{inputs, GwShared, ThreadState};
use bytes::{Bytes, BytesMut};
use http_body_util::{BodyExt, Limited};
use hyper::body::{Body, Frame, Incoming};
use hyper::header::{HeaderMap, HeaderValue, CONTENT_TYPE};
use hyper::{Request, Response, StatusCode};
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;
use wire::ErrorKind;

/// gRPC status codes (grpc/doc/statuscodes.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Code {
    Ok = 0,
    Unknown = 2,
    InvalidArgument = 3,
    DeadlineExceeded = 4,
    NotFound = 5,
    ResourceExhausted = 8,
    Aborted = 10,
    Unimplemented = 12,
    Internal = 13,
    Unavailable = 14,
    Unauthenticated = 16,
}

/// The gRPC status for a Staccato error kind.
pub fn status_of(kind: ErrorKind) -> Code {
    match kind {
        ErrorKind::NotFound => Code::Unimplemented,
        ErrorKind::FunctionRemoved => Code::NotFound,
        ErrorKind::PayloadTooLarge | ErrorKind::OutputTooLarge => Code::ResourceExhausted,
        ErrorKind::FunctionError => Code::Unknown,
        ErrorKind::WorkerCrashed | ErrorKind::EngineUnavailable => Code::Unavailable,
        ErrorKind::Timeout => Code::DeadlineExceeded,
        ErrorKind::BadRequest => Code::InvalidArgument,
        ErrorKind::Internal => Code::Internal,
        ErrorKind::OutOfMemory | ErrorKind::Overloaded | ErrorKind::CallDepthExceeded => Code::ResourceExhausted,
        ErrorKind::CallCycle => Code::Aborted,
    }
}

/// A unary response: the message, then the trailers; or the trailers
/// alone (an error: "trailers-only", sent as the response's headers).
pub struct GrpcBody {
    data: Option<Bytes>,
    trailers: Option<HeaderMap>,
}

impl Body for GrpcBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if let Some(d) = self.data.take() {
            return Poll::Ready(Some(Ok(Frame::data(d))));
        }
        Poll::Ready(self.trailers.take().map(|t| Ok(Frame::trailers(t))))
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none() && self.trailers.is_none()
    }
}

pub type GrpcResp = Response<GrpcBody>;

/// `grpc-message`: percent-encoded outside printable ASCII (and `%`).
fn percent_encode(msg: &str) -> String {
    let mut out = String::with_capacity(msg.len());
    for b in msg.bytes().take(1024) {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn status_headers(h: &mut HeaderMap, code: Code, msg: &str) {
    h.insert("grpc-status", HeaderValue::from(code as u8 as u16));
    if !msg.is_empty() {
        if let Ok(v) = HeaderValue::from_str(&percent_encode(msg)) {
            h.insert("grpc-message", v);
        }
    }
}

/// An error, trailers-only: HTTP 200, the status in the headers.
pub fn error(code: Code, msg: &str) -> GrpcResp {
    let mut r = Response::new(GrpcBody { data: None, trailers: None });
    r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    status_headers(r.headers_mut(), code, msg);
    r
}

fn message(out: &[u8]) -> GrpcResp {
    let mut framed = BytesMut::with_capacity(5 + out.len());
    framed.extend_from_slice(&[0]);
    framed.extend_from_slice(&(out.len() as u32).to_be_bytes());
    framed.extend_from_slice(out);
    let mut trailers = HeaderMap::new();
    status_headers(&mut trailers, Code::Ok, "");
    let mut r = Response::new(GrpcBody { data: Some(framed.freeze()), trailers: Some(trailers) });
    r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    r
}

/// The one message of a unary request body (its 5-byte prefix checked).
/// `encoded`: the request named a `grpc-encoding` other than identity.
pub fn unframe(body: &[u8], encoded: bool) -> Result<&[u8], (Code, String)> {
    if body.len() < 5 {
        return Err((
            Code::Internal,
            format!("a gRPC message is a 5-byte prefix and the message; the request body has {} bytes", body.len()),
        ));
    }
    let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
    match body[0] {
        0 => {}
        // Compressed: an encoding this server does not do, or none named
        // at all (a protocol error, says the gRPC spec).
        1 if encoded => {
            return Err((
                Code::Unimplemented,
                "compressed messages are not supported (send grpc-encoding identity)".into(),
            ))
        }
        1 => return Err((Code::Internal, "a compressed message, and no grpc-encoding named".into())),
        f => return Err((Code::Internal, format!("the message prefix's flag is {f}, not 0 or 1"))),
    }
    let rest = &body[5..];
    if rest.len() < len {
        return Err((Code::Internal, format!("the message prefix says {len} bytes and {} came", rest.len())));
    }
    if rest.len() > len {
        return Err((Code::InvalidArgument, "a unary call takes one request message; more came".into()));
    }
    Ok(rest)
}

/// `grpc-timeout` (1-8 digits and a unit, H M S m u n) in milliseconds,
/// rounded up, at least 1; `None` without the header.
pub fn timeout_ms(h: &HeaderMap) -> Result<Option<u32>, String> {
    let Some(v) = h.get("grpc-timeout") else { return Ok(None) };
    let bad = || format!("grpc-timeout {v:?} is not 1-8 digits and a unit (H, M, S, m, u, n)");
    let t = v.to_str().map_err(|_| bad())?;
    if !(2..=9).contains(&t.len()) {
        return Err(bad());
    }
    let (digits, unit) = t.split_at(t.len() - 1);
    let n: u64 = digits.parse().ok().filter(|_| digits.bytes().all(|b| b.is_ascii_digit())).ok_or_else(bad)?;
    let ns: u128 = match unit {
        "H" => u128::from(n) * 3_600_000_000_000,
        "M" => u128::from(n) * 60_000_000_000,
        "S" => u128::from(n) * 1_000_000_000,
        "m" => u128::from(n) * 1_000_000,
        "u" => u128::from(n) * 1_000,
        "n" => u128::from(n),
        _ => return Err(bad()),
    };
    Ok(Some(u32::try_from(ns.div_ceil(1_000_000)).unwrap_or(u32::MAX).max(1)))
}

/// Serves one gRPC request.
pub(crate) async fn handle(sh: Arc<GwShared>, th: Rc<ThreadState>, req: Request<Incoming>) -> GrpcResp {
    let start = Instant::now();
    let ct = inputs::content_type(req.headers());
    if !(ct == "application/grpc" || ct.starts_with("application/grpc+") || ct.starts_with("application/grpc;")) {
        let mut r = error(Code::Internal, &format!("content-type must be application/grpc, not {ct:?}"));
        *r.status_mut() = StatusCode::UNSUPPORTED_MEDIA_TYPE;
        return r;
    }
    if req.method() != hyper::Method::POST {
        return error(Code::Unimplemented, "gRPC requests are POSTs");
    }
    let method = req.uri().path().trim_start_matches('/').to_string();
    let Some(name) = api::spec::valid_grpc_method(&method).then(|| sh.keys.grpc_function(&method)).flatten() else {
        return error(Code::Unimplemented, &format!("no function serves gRPC method {method:?}"));
    };
    let timeout = match timeout_ms(req.headers()) {
        Ok(t) => t.unwrap_or(0),
        Err(m) => return error(Code::InvalidArgument, &m),
    };
    let bearer = inputs::bearer(req.headers()).to_vec();
    let trace = inputs::trace_context(req.headers());
    let verdict = sh.keys.check(&name, &bearer);
    if matches!(verdict, Verdict::Missing | Verdict::Wrong) {
        sh.metrics.record(th.index(), &name, "unauthorized", start.elapsed().as_secs_f64(), None);
        return error(Code::Unauthenticated, &format!("function {name} needs an invoke key (authorization: Bearer)"));
    }
    let max = sh.cfg.payload_len_max + 5;
    let encoded = req.headers().get("grpc-encoding").is_some_and(|e| e.as_bytes() != b"identity");
    // A body that never ends holds its buffer no longer than an idle
    // connection may stay open.
    let read = tokio::time::timeout(sh.cfg.idle_timeout, Limited::new(req.into_body(), max).collect()).await;
    let Ok(read) = read else {
        return error(Code::DeadlineExceeded, "the request message did not arrive in time");
    };
    let body = match read {
        Ok(b) => b.to_bytes(),
        Err(e) if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() => {
            let msg = format!("the request message exceeds the {}-byte limit", sh.cfg.payload_len_max);
            return error(Code::ResourceExhausted, &msg);
        }
        Err(e) => return error(Code::Internal, &format!("reading the request: {e}")),
    };
    let input = match unframe(&body, encoded) {
        Ok(m) => body.slice_ref(m),
        Err((code, msg)) => return error(code, &msg),
    };
    let call_id = th.next_call_id();
    let outcome = match send(&sh, &th, &name, (call_id, timeout, trace), &input, (&bearer, &verdict)).await {
        Sent::Refused(_) => {
            sh.metrics.record(th.index(), &name, "unauthorized", start.elapsed().as_secs_f64(), None);
            return error(
                Code::Unauthenticated,
                &format!("function {name} needs an invoke key (authorization: Bearer)"),
            );
        }
        Sent::Answered(o, _) => o,
    };
    let latency_s = start.elapsed().as_secs_f64();
    match outcome {
        Ok((out, t)) => {
            sh.metrics.record(th.index(), &name, "ok", latency_s, Some(t));
            message(&out)
        }
        Err((kind, msg, t)) => {
            sh.metrics.record(th.index(), &name, kind.name(), latency_s, Some(t));
            error(status_of(kind), &format!("{}: {msg}", kind.name()))
        }
    }
}

/// Runs hyper's HTTP/2 tasks on the thread's `LocalSet` (the gateway's
/// threads are current-thread runtimes; nothing here is `Send`).
#[derive(Clone, Copy)]
pub struct LocalExec;

impl<F> hyper::rt::Executor<F> for LocalExec
where
    F: std::future::Future + 'static,
{
    fn execute(&self, fut: F) {
        tokio::task::spawn_local(fut);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_checked() {
        assert_eq!(unframe(&[0, 0, 0, 0, 2, b'h', b'i'], false).unwrap(), b"hi");
        assert_eq!(unframe(&[0, 0, 0, 0, 0], false).unwrap(), b"");
        assert_eq!(unframe(&[0, 0, 0], false).unwrap_err().0, Code::Internal);
        assert_eq!(unframe(&[0, 0, 0, 0, 9, 1], false).unwrap_err().0, Code::Internal);
        assert_eq!(unframe(&[1, 0, 0, 0, 1, 1], true).unwrap_err().0, Code::Unimplemented);
        assert_eq!(unframe(&[1, 0, 0, 0, 1, 1], false).unwrap_err().0, Code::Internal);
        assert_eq!(unframe(&[7, 0, 0, 0, 1, 1], false).unwrap_err().0, Code::Internal);
        assert_eq!(unframe(&[0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0], false).unwrap_err().0, Code::InvalidArgument);
        assert_eq!(unframe(&[0, 0xff, 0xff, 0xff, 0xff], false).unwrap_err().0, Code::Internal);
    }

    #[test]
    fn timeouts_are_read() {
        let h = |v: &str| {
            let mut m = HeaderMap::new();
            m.insert("grpc-timeout", HeaderValue::from_str(v).unwrap());
            timeout_ms(&m)
        };
        assert_eq!(timeout_ms(&HeaderMap::new()), Ok(None));
        assert_eq!(h("100m"), Ok(Some(100)));
        assert_eq!(h("2S"), Ok(Some(2000)));
        assert_eq!(h("1500u"), Ok(Some(2)));
        assert_eq!(h("1n"), Ok(Some(1)));
        assert_eq!(h("99999999H"), Ok(Some(u32::MAX)));
        for bad in ["", "m", "123456789S", "1x", "-1S", "1.5S", "+1S"] {
            assert!(h(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn statuses() {
        assert_eq!(status_of(ErrorKind::Timeout), Code::DeadlineExceeded);
        assert_eq!(status_of(ErrorKind::NotFound), Code::Unimplemented);
        assert_eq!(percent_encode("a b%\n"), "a b%25%0A");
    }
}
