//! Just enough HTTP/1.1 for the sender: requests prebuilt as bytes, and an
//! incremental response parser (Content-Length or chunked bodies).

use std::net::{SocketAddr, ToSocketAddrs};

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum UrlError {
    #[error("{0}: only http:// and https:// URLs are supported")]
    NotHttp(String),
    #[error("{url}: cannot resolve {host}: {why}")]
    Unresolved { url: String, host: String, why: String },
}

/// `http[s]://host:port/prefix` split into an address and a path prefix.
#[derive(Debug, Clone, PartialEq)]
pub struct Url {
    pub host: String,
    pub addr: SocketAddr,
    pub path: String,
    /// `https://`: the name the server's certificate is checked against.
    pub tls: Option<String>,
}

pub fn parse_url(url: &str) -> Result<Url, UrlError> {
    let (rest, tls, port) = if let Some(r) = url.strip_prefix("http://") {
        (r, false, 80)
    } else if let Some(r) = url.strip_prefix("https://") {
        (r, true, 443)
    } else {
        return Err(UrlError::NotHttp(url.to_string()));
    };
    let (hostport, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    let with_port = if hostport.rsplit_once(':').is_some_and(|(_, p)| p.parse::<u16>().is_ok()) {
        hostport.to_string()
    } else {
        format!("{hostport}:{port}")
    };
    // The host without its port (and an IPv6 literal without brackets).
    let name = with_port.rsplit_once(':').map_or(hostport, |(h, _)| h);
    let name = name.trim_start_matches('[').trim_end_matches(']').to_string();
    let unresolved = |why: String| UrlError::Unresolved { url: url.to_string(), host: hostport.to_string(), why };
    let addr = with_port
        .to_socket_addrs()
        .map_err(|e| unresolved(e.to_string()))?
        .next()
        .ok_or_else(|| unresolved("it has no address".into()))?;
    Ok(Url { host: hostport.to_string(), addr, path: path.trim_end_matches('/').to_string(), tls: tls.then_some(name) })
}

/// The bytes of one request; `path` is the full request target.
pub fn build_request(
    method: &str,
    host: &str,
    path: &str,
    headers: &[(String, String)],
    body: &[u8],
    json: bool,
) -> Vec<u8> {
    let mut r = format!("{method} {path} HTTP/1.1\r\n");
    // A Host header from the config (FaaSProfiler's `host`) replaces the URL's.
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        r.push_str(&format!("Host: {host}\r\n"));
    }
    r.push_str(&format!("Content-Length: {}\r\n", body.len()));
    if json && !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("content-type")) {
        r.push_str("Content-Type: application/json\r\n");
    }
    for (k, v) in headers {
        r.push_str(&format!("{k}: {v}\r\n"));
    }
    r.push_str("\r\n");
    let mut out = r.into_bytes();
    out.extend_from_slice(body);
    out
}

/// What the records keep of a response.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Response {
    pub status: u16,
    pub bytes_in: usize,
    pub call_id: Option<String>,
    /// queue_us, exec_us, cold_us from x-staccato-timing.
    pub timing_us: Option<[u64; 3]>,
    /// error.kind from a JSON error body, or `http_<status>`.
    pub error: Option<String>,
    pub close: bool,
}

/// A response that is not HTTP/1.x as this parser knows it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Malformed;

/// Parses one complete response at the start of `buf`. Ok(None): need more
/// bytes; Ok(Some((resp, consumed))); Err: malformed.
pub fn parse_response(buf: &[u8]) -> Result<Option<(Response, usize)>, Malformed> {
    let Some(head_end) = find(buf, b"\r\n\r\n") else {
        return if buf.len() > 64 * 1024 { Err(Malformed) } else { Ok(None) };
    };
    let head = std::str::from_utf8(&buf[..head_end]).map_err(|_| Malformed)?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().ok_or(Malformed)?;
    let mut parts = status_line.splitn(3, ' ');
    if !parts.next().ok_or(Malformed)?.starts_with("HTTP/1.") {
        return Err(Malformed);
    }
    let status: u16 = parts.next().ok_or(Malformed)?.parse().map_err(|_| Malformed)?;
    let mut resp = Response { status, ..Default::default() };
    let mut content_length = None;
    let mut chunked = false;
    for line in lines {
        let Some((k, v)) = line.split_once(':') else { continue };
        let v = v.trim();
        if k.eq_ignore_ascii_case("content-length") {
            content_length = Some(v.parse::<usize>().map_err(|_| Malformed)?);
        } else if k.eq_ignore_ascii_case("transfer-encoding") {
            chunked = v.to_ascii_lowercase().contains("chunked");
        } else if k.eq_ignore_ascii_case("x-call-id") {
            resp.call_id = Some(v.to_string());
        } else if k.eq_ignore_ascii_case("x-staccato-timing") {
            resp.timing_us = parse_timing(v);
        } else if k.eq_ignore_ascii_case("connection") {
            resp.close = v.eq_ignore_ascii_case("close");
        }
    }
    let body_start = head_end + 4;
    let (body, consumed) = if chunked {
        match dechunk(&buf[body_start..])? {
            Some((body, used)) => (body, body_start + used),
            None => return Ok(None),
        }
    } else {
        // No length on a keep-alive response means an empty body (1xx/204/304 or a broken server).
        let n = content_length.unwrap_or(0);
        if buf.len() < body_start + n {
            return Ok(None);
        }
        (buf[body_start..body_start + n].to_vec(), body_start + n)
    };
    resp.bytes_in = body.len();
    if status >= 400 {
        resp.error = Some(error_kind(&body).unwrap_or_else(|| format!("http_{status}")));
    }
    Ok(Some((resp, consumed)))
}

fn error_kind(body: &[u8]) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    let k = v.get("error")?.get("kind")?.as_str()?;
    k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_').then(|| k.to_string())
}

pub fn parse_timing(v: &str) -> Option<[u64; 3]> {
    let mut t = [0u64; 3];
    let mut seen = 0;
    for kv in v.split(',') {
        let (k, n) = kv.trim().split_once('=')?;
        let i = match k {
            "queue_us" => 0,
            "exec_us" => 1,
            "cold_us" => 2,
            _ => continue,
        };
        t[i] = n.parse().ok()?;
        seen += 1;
    }
    (seen > 0).then_some(t)
}

/// A complete chunked body: Ok(Some((body, bytes used))), Ok(None) if incomplete.
fn dechunk(mut b: &[u8]) -> Result<Option<(Vec<u8>, usize)>, Malformed> {
    let total = b.len();
    let mut body = Vec::new();
    loop {
        let Some(eol) = find(b, b"\r\n") else { return Ok(None) };
        let size_txt = std::str::from_utf8(&b[..eol]).map_err(|_| Malformed)?;
        let size = usize::from_str_radix(size_txt.split(';').next().unwrap_or("").trim(), 16).map_err(|_| Malformed)?;
        b = &b[eol + 2..];
        if size == 0 {
            // Trailers end with an empty line.
            let Some(end) = find(b, b"\r\n") else { return Ok(None) };
            if end == 0 {
                return Ok(Some((body, total - b.len() + 2)));
            }
            let Some(end) = find(b, b"\r\n\r\n") else { return Ok(None) };
            return Ok(Some((body, total - b.len() + end + 4)));
        }
        if b.len() < size + 2 {
            return Ok(None);
        }
        body.extend_from_slice(&b[..size]);
        b = &b[size + 2..];
    }
}

fn find(h: &[u8], n: &[u8]) -> Option<usize> {
    h.windows(n.len()).position(|w| w == n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_staccato_responses() {
        let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nx-call-id: 00000000000000ab\r\n\
                   x-staccato-timing: queue_us=3,exec_us=10,cold_us=0\r\n\r\nhiHTTP/1.1";
        let (r, n) = parse_response(ok).unwrap().unwrap();
        assert_eq!(n, ok.len() - 8);
        assert_eq!(r.status, 200);
        assert_eq!(r.bytes_in, 2);
        assert_eq!(r.call_id.as_deref(), Some("00000000000000ab"));
        assert_eq!(r.timing_us, Some([3, 10, 0]));
        assert_eq!(r.error, None);
        assert_eq!(parse_response(&ok[..30]), Ok(None));
        let body = br#"{"error":{"kind":"timeout","message":"x"}}"#;
        let mut err = format!("HTTP/1.1 504 Gateway Timeout\r\ncontent-length: {}\r\n\r\n", body.len()).into_bytes();
        err.extend_from_slice(body);
        assert_eq!(parse_response(&err).unwrap().unwrap().0.error.as_deref(), Some("timeout"));
        let plain = b"HTTP/1.1 503 x\r\ncontent-length: 0\r\n\r\n";
        assert_eq!(parse_response(plain).unwrap().unwrap().0.error.as_deref(), Some("http_503"));
    }

    #[test]
    fn parses_chunked() {
        let r = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n";
        let (resp, n) = parse_response(r).unwrap().unwrap();
        assert_eq!((resp.bytes_in, n), (5, r.len()));
        assert_eq!(parse_response(&r[..r.len() - 1]), Ok(None));
    }

    #[test]
    fn urls_and_requests() {
        let u = parse_url("http://127.0.0.1:8080/").unwrap();
        assert_eq!((u.host.as_str(), u.addr.port(), u.path.as_str()), ("127.0.0.1:8080", 8080, ""));
        assert_eq!(parse_url("ftp://x"), Err(UrlError::NotHttp("ftp://x".into())));
        let u = parse_url("https://127.0.0.1/fn/").unwrap();
        assert_eq!((u.addr.port(), u.tls.as_deref(), u.path.as_str()), (443, Some("127.0.0.1"), "/fn"));
        let u = parse_url("https://localhost:8443").unwrap();
        assert_eq!((u.addr.port(), u.tls.as_deref()), (8443, Some("localhost")));
        assert_eq!(parse_url("http://127.0.0.1:9").unwrap().tls, None);
        let r = build_request("POST", "h:1", "/function/f", &[("x-a".into(), "b".into())], b"{}", true);
        assert_eq!(
            r,
            b"POST /function/f HTTP/1.1\r\nHost: h:1\r\nContent-Length: 2\r\nContent-Type: application/json\r\nx-a: b\r\n\r\n{}"
        );
        let r = build_request(
            "POST",
            "10.0.0.1:80",
            "/hello",
            &[("Host".into(), "app.default.example".into())],
            b"",
            false,
        );
        assert_eq!(r, b"POST /hello HTTP/1.1\r\nContent-Length: 0\r\nHost: app.default.example\r\n\r\n");
    }
}
