//! The command line's HTTP client, on `ureq`: where speed does not matter,
//! a well-kept client does HTTP better than our own. The benchmarks keep
//! the lean [`crate::http::Client`], whose own cost must stay out of their
//! figures.
//!
//! ureq 3 never resends a request: a pooled connection the server closed
//! is dropped before it is used, and a failure after the request went out
//! is returned, so an invocation cannot run twice. Redirects are not
//! followed (the gateway sends none; following one would turn a POST into
//! a GET elsewhere), and no proxy from the environment is used: the token
//! goes to the gateway named and nowhere else.

use crate::http::{Requester, Response};
use std::io;
use std::net::ToSocketAddrs;
use std::time::Duration;

/// The largest response body read: above any payload limit a gateway
/// accepts, so a function's output is never cut short.
const BODY_LEN_MAX: u64 = 1 << 30;

pub struct Gateway {
    agent: ureq::Agent,
    /// `http://host:port`, without a trailing slash.
    base: String,
    token: Option<String>,
    loopback: bool,
}

impl Gateway {
    /// `base` is like `http://127.0.0.1:8080`. `timeout`, if any, bounds a
    /// whole request, from connecting to the last byte of the answer;
    /// without it only the answer may take any time (a deploy's builds, a
    /// call's own timeout), while connecting, sending and reading the body
    /// are bounded.
    pub fn new(base: &str, token: Option<String>, timeout: Option<Duration>) -> io::Result<Gateway> {
        if base.starts_with("https://") {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "https is not supported; use http://"));
        }
        let hostport = base.trim_start_matches("http://").trim_end_matches('/');
        if hostport.is_empty() || hostport.contains('/') {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{base:?} is not like http://host:port")));
        }
        let addr = hostport
            .to_socket_addrs()?
            .next()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, format!("cannot resolve {hostport}")))?;
        let config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .max_redirects(0)
            .proxy(None)
            .timeout_connect(Some(Duration::from_secs(3)))
            .timeout_send_request(Some(Duration::from_secs(60)))
            .timeout_recv_body(Some(Duration::from_secs(120)))
            .timeout_global(timeout)
            .build();
        Ok(Gateway {
            agent: ureq::Agent::new_with_config(config),
            base: format!("http://{hostport}"),
            token,
            loopback: addr.ip().is_loopback(),
        })
    }

    /// Whether the gateway is on this machine's loopback.
    pub fn is_loopback(&self) -> bool {
        self.loopback
    }
}

impl Requester for Gateway {
    fn request_with_headers(
        &mut self,
        method: &str,
        path: &str,
        body: &[u8],
        headers: &[(&str, &str)],
    ) -> io::Result<Response> {
        let mut req = ureq::http::Request::builder().method(method).uri(format!("{}{path}", self.base));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        if let Some(t) = &self.token {
            req = req.header("Authorization", format!("Bearer {t}"));
        }
        let req = req.body(body).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let mut resp = self.agent.run(req).map_err(into_io)?;
        let status = resp.status().as_u16();
        let headers = resp
            .headers()
            .iter()
            .map(|(k, v)| (k.as_str().to_string(), String::from_utf8_lossy(v.as_bytes()).into_owned()))
            .collect();
        let body = resp.body_mut().with_config().limit(BODY_LEN_MAX).read_to_vec().map_err(into_io)?;
        Ok(Response { status, headers, body })
    }
}

fn into_io(e: ureq::Error) -> io::Error {
    match e {
        ureq::Error::Io(e) => e,
        ureq::Error::Timeout(t) => io::Error::new(io::ErrorKind::TimedOut, format!("timed out ({t})")),
        other => io::Error::other(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpListener;

    /// A server that answers the first request on a connection, then reads
    /// the second without answering and closes: the POST that went out
    /// must come back as an error, never be sent a second time.
    #[test]
    fn a_sent_post_is_never_retried() {
        crate::test_server::check_a_sent_post_is_never_retried(|base| Gateway::new(base, None, None).unwrap());
    }

    /// Error statuses are answers (the gateway's JSON error body is read),
    /// the token goes in a bearer header to the gateway (never to a proxy
    /// from the environment), and a redirect is not followed.
    #[test]
    fn statuses_bodies_and_the_token_reach_the_caller() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let t = std::thread::spawn(move || {
            let mut heads = Vec::new();
            for answer in [
                &b"HTTP/1.1 503 Service Unavailable\r\nretry-after: 1\r\ncontent-length: 4\r\n\r\nbusy"[..],
                &b"HTTP/1.1 302 Found\r\nlocation: http://127.0.0.1:1/x\r\ncontent-length: 0\r\n\r\n"[..],
            ] {
                let (mut s, _) = l.accept().unwrap();
                let mut buf = [0u8; 4096];
                let n = s.read(&mut buf).unwrap();
                heads.push(String::from_utf8_lossy(&buf[..n]).to_lowercase());
                s.write_all(answer).unwrap();
            }
            heads
        });
        // A proxy in the environment is not used: the token must not leave
        // for it, and it could not reach a loopback gateway anyway.
        std::env::set_var("HTTP_PROXY", "http://127.0.0.1:9");
        std::env::set_var("ALL_PROXY", "http://127.0.0.1:9");
        let mut g =
            Gateway::new(&format!("http://{addr}/"), Some("sekrit".into()), Some(Duration::from_secs(5))).unwrap();
        let r = g.request("POST", "/function/f", b"in").unwrap();
        assert_eq!((r.status, r.header("Retry-After"), &r.body[..]), (503, Some("1"), &b"busy"[..]));
        drop(g);
        let mut g = Gateway::new(&format!("http://{addr}"), None, None).unwrap();
        assert_eq!(g.request("POST", "/function/f", b"in").unwrap().status, 302);
        let heads = t.join().unwrap();
        assert!(heads[0].contains("authorization: bearer sekrit"), "{}", heads[0]);
        assert!(!heads[1].contains("authorization"), "{}", heads[1]);
    }

    #[test]
    fn https_and_paths_in_the_base_are_refused() {
        for bad in ["https://127.0.0.1:1", "http://127.0.0.1:1/api", "http://"] {
            assert!(Gateway::new(bad, None, None).is_err(), "{bad}");
        }
    }
}
