//! A minimal blocking HTTP/1.1 keep-alive client: enough for the CLI and for
//! the benchmark, whose measurement must not be dominated by its own client.

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
        Ok(Client { addr, host: hostport.to_string(), token, conn: None, timeout: Duration::from_secs(120) })
    }

    fn connect(&mut self) -> io::Result<&mut BufReader<TcpStream>> {
        if self.conn.is_none() {
            let s = TcpStream::connect_timeout(&self.addr, Duration::from_secs(3))?;
            s.set_nodelay(true)?;
            s.set_read_timeout(Some(self.timeout))?;
            self.conn = Some(BufReader::with_capacity(64 * 1024, s));
        }
        Ok(self.conn.as_mut().expect("connected above"))
    }

    pub fn request(&mut self, method: &str, path: &str, body: &[u8]) -> io::Result<Response> {
        self.request_with_headers(method, path, body, &[])
    }

    pub fn request_with_headers(
        &mut self,
        method: &str,
        path: &str,
        body: &[u8],
        headers: &[(&str, &str)],
    ) -> io::Result<Response> {
        let fresh = self.conn.is_none();
        match self.try_request(method, path, body, headers) {
            Ok(r) => Ok(r),
            // A kept-alive connection the server closed: retry once afresh.
            Err(_) if !fresh => {
                self.conn = None;
                self.try_request(method, path, body, headers)
            }
            Err(e) => {
                self.conn = None;
                Err(e)
            }
        }
    }

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
        read_response(c)
    }
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
