//! A minimal blocking HTTP/1.1 keep-alive client: enough for the CLI and for
//! the benchmark, whose measurement must not be dominated by its own client.
//!
//! A request is sent at most once unless it is a GET: a kept-alive
//! connection the server has closed is noticed before anything is written
//! (a non-blocking peek), and a failure after the request went out is
//! reported, never retried, since the server may have acted on it (an
//! invocation would run twice).

use std::io::{self, BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::Duration;

pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

pub struct Client {
    addr: SocketAddr,
    host: String,
    token: Option<String>,
    conn: Option<BufReader<TcpStream>>,
    /// When the connection last finished a request: only one idle for a
    /// while is checked before use (the check is three syscalls, and the
    /// benchmark's external-call figures go through this client).
    idle_since: std::time::Instant,
    pub timeout: Duration,
}

impl Client {
    /// `base` is like `http://127.0.0.1:8080`.
    pub fn new(base: &str, token: Option<String>) -> io::Result<Client> {
        let hostport = base.trim_start_matches("http://").trim_end_matches('/');
        if base.starts_with("https://") {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "https is not supported; use http://"));
        }
        let addr = hostport
            .to_socket_addrs()?
            .next()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, format!("cannot resolve {hostport}")))?;
        Ok(Client {
            addr,
            host: hostport.to_string(),
            token,
            conn: None,
            idle_since: std::time::Instant::now(),
            timeout: Duration::from_secs(120),
        })
    }

    /// Whether the gateway is on this machine's loopback.
    pub fn is_loopback(&self) -> bool {
        self.addr.ip().is_loopback()
    }

    fn connect(&mut self) -> io::Result<&mut BufReader<TcpStream>> {
        if self.conn.is_none() {
            let s = TcpStream::connect_timeout(&self.addr, Duration::from_secs(3))?;
            s.set_nodelay(true)?;
            s.set_read_timeout(Some(self.timeout))?;
            // A peer that stops reading must not hold a writer for ever.
            s.set_write_timeout(Some(self.timeout))?;
            self.conn = Some(BufReader::with_capacity(64 * 1024, s));
        }
        Ok(self.conn.as_mut().expect("connected above"))
    }
}

/// Sends one request and reads its answer: what deploying needs, from the
/// command line's client and the benchmark's alike.
pub trait Requester {
    fn request_with_headers(
        &mut self,
        method: &str,
        path: &str,
        body: &[u8],
        headers: &[(&str, &str)],
    ) -> io::Result<Response>;

    fn request(&mut self, method: &str, path: &str, body: &[u8]) -> io::Result<Response> {
        self.request_with_headers(method, path, body, &[])
    }
}

impl Requester for Client {
    fn request_with_headers(
        &mut self,
        method: &str,
        path: &str,
        body: &[u8],
        headers: &[(&str, &str)],
    ) -> io::Result<Response> {
        // A server closes idle connections after seconds (the gateway's
        // --idle-timeout-s); one used a moment ago is still open.
        let idle = self.idle_since.elapsed() > IDLE_CHECK_AFTER;
        if idle && self.conn.as_ref().is_some_and(|c| !still_open(c.get_ref())) {
            self.conn = None;
        }
        let reused = self.conn.is_some();
        match self.try_request(method, path, body, headers) {
            Ok(r) => Ok(r),
            Err(e) => {
                self.conn = None;
                // The server closed the connection between the peek and our
                // write: only a request without effects may go again.
                if reused && method == "GET" {
                    self.try_request(method, path, body, headers).inspect_err(|_| self.conn = None)
                } else {
                    Err(e)
                }
            }
        }
    }
}

impl Client {
    fn try_request(&mut self, method: &str, path: &str, body: &[u8], headers: &[(&str, &str)]) -> io::Result<Response> {
        let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Length: {}\r\n", self.host, body.len());
        for (k, v) in headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        if let Some(t) = &self.token {
            head.push_str(&format!("Authorization: Bearer {t}\r\n"));
        }
        head.push_str("\r\n");
        let mut req = head.into_bytes();
        req.extend_from_slice(body);
        let c = self.connect()?;
        c.get_mut().write_all(&req)?;
        let r = read_response(c);
        self.idle_since = std::time::Instant::now();
        r
    }
}

/// How long a connection may sit unused before it is checked for a close.
const IDLE_CHECK_AFTER: Duration = Duration::from_millis(100);

/// Whether an idle kept-alive connection can still carry a request: not
/// closed by the server, and holding no unsolicited bytes (e.g. a 408).
fn still_open(s: &TcpStream) -> bool {
    if s.set_nonblocking(true).is_err() {
        return false;
    }
    let mut b = [0u8; 1];
    let open = matches!(s.peek(&mut b), Err(e) if e.kind() == io::ErrorKind::WouldBlock);
    s.set_nonblocking(false).is_ok() && open
}

/// Reads one response with a Content-Length body (what the gateway sends).
pub fn read_response<R: BufRead>(r: &mut R) -> io::Result<Response> {
    let mut line = String::new();
    if r.read_line(&mut line)? == 0 {
        return Err(io::Error::from(io::ErrorKind::UnexpectedEof));
    }
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, format!("bad status line {line:?}")))?;
    let mut headers = Vec::new();
    let mut len = 0usize;
    loop {
        line.clear();
        r.read_line(&mut line)?;
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            let (k, v) = (k.trim().to_string(), v.trim().to_string());
            if k.eq_ignore_ascii_case("content-length") {
                len = v.parse().map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "bad content-length"))?;
            }
            headers.push((k, v));
        }
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body)?;
    Ok(Response { status, headers, body })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::net::TcpListener;

    /// A server that answers the first request on a connection and reads
    /// the second without answering, then closes: a POST that went out must
    /// not be sent again.
    #[test]
    fn a_sent_post_is_never_retried() {
        crate::test_server::check_a_sent_post_is_never_retried(|base| Client::new(base, None).unwrap());
    }

    /// A kept-alive connection the server closed while idle is noticed
    /// before anything is written: the next request goes on a new one.
    #[test]
    fn a_connection_closed_while_idle_is_replaced_before_sending() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            for s in l.incoming() {
                let Ok(mut s) = s else { return };
                let mut buf = [0u8; 4096];
                if s.read(&mut buf).is_ok_and(|n| n > 0) {
                    let _ = s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok");
                }
                // Then close it: an idle timeout.
            }
        });
        let mut c = Client::new(&format!("http://{addr}"), None).unwrap();
        assert_eq!(c.request("POST", "/function/f", b"1").unwrap().status, 200);
        std::thread::sleep(IDLE_CHECK_AFTER * 3);
        assert_eq!(c.request("POST", "/function/f", b"2").unwrap().status, 200);
    }
}
