//! The only way out of a build sandbox: an HTTP `CONNECT` proxy on the
//! host's loopback that opens tunnels to an allow list of host names (the
//! package indexes dependency resolution needs) and nothing else.
//!
//! Build containers live in network namespaces that reach exactly one host
//! port, this proxy's (netns `with_ports`). pip, npm and Go all honour
//! `HTTPS_PROXY` and ask for `CONNECT host:443`: the name is checked against
//! the list, resolved here, and every address it resolves to must be a
//! public one, so an allowed name that points at loopback, a private
//! network or link-local metadata services gets nowhere either. A refused
//! tunnel answers `403` with the reason, which the tool prints.

use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The request head of a `CONNECT` is one short line plus a few headers.
const HEAD_LEN_MAX: usize = 8192;
/// Tunnels open at once; more are answered `503`.
const TUNNELS_MAX: usize = 128;
/// A client must send its request head within this.
const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);
/// A tunnel with no byte either way for this long is closed.
const IDLE_TIMEOUT: Duration = Duration::from_secs(120);
/// Ports a tunnel may go to: HTTPS only (a plain-HTTP tunnel to a CDN
/// edge could name any site in its Host header).
const PORTS: [u16; 1] = [443];
/// Tunnels one client address (one build) may hold at once.
const TUNNELS_PER_CLIENT_MAX: usize = 32;

/// Host names pip, npm and Go need with their default settings.
pub const DEFAULT_HOSTS: [&str; 5] =
    ["pypi.org", "files.pythonhosted.org", "registry.npmjs.org", "proxy.golang.org", "sum.golang.org"];

/// A name on the allow list: exact, or `*.example.org` for any name below it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostRule(String);

impl HostRule {
    pub fn parse(s: &str) -> Result<HostRule, crate::Error> {
        let s = s.trim().trim_end_matches('.').to_ascii_lowercase();
        let name = s.strip_prefix("*.").unwrap_or(&s);
        let valid = !name.is_empty()
            && name.len() <= 253
            && name.split('.').all(|l| {
                !l.is_empty()
                    && l.len() <= 63
                    && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                    && !l.starts_with('-')
                    && !l.ends_with('-')
            });
        if !valid {
            return Err(crate::Error::Config(format!(
                "{s:?} is not a host name (or *.domain) for the build allow list"
            )));
        }
        if s.starts_with("*.") && name.split('.').count() < 2 {
            return Err(crate::Error::Config(format!(
                "{s:?} allows a whole top-level domain; name a domain below it (*.example.org)"
            )));
        }
        Ok(HostRule(s))
    }

    pub fn matches(&self, host: &str) -> bool {
        match self.0.strip_prefix("*.") {
            Some(domain) => {
                host.len() > domain.len() + 1 && host.ends_with(domain) && {
                    host.as_bytes()[host.len() - domain.len() - 1] == b'.'
                }
            }
            None => host == self.0,
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The host part of a URL such as `https://user:pw@host:8443/simple` (None
/// for anything without `//`, like a local path or `off`).
pub fn url_host(url: &str) -> Option<String> {
    let rest = url.trim().split_once("://")?.1;
    let authority = rest.split(['/', '?', '#']).next()?;
    let hostport = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let host =
        if let Some(v6) = hostport.strip_prefix('[') { v6.split(']').next()? } else { hostport.split(':').next()? };
    (!host.is_empty()).then(|| host.to_ascii_lowercase())
}

/// Whether an address is on the public internet, as far as a build may
/// care: not loopback, private, shared (CGNAT), link-local, multicast,
/// unspecified or reserved.
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => public_v4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => public_v4(v4),
            None => public_v6(v6),
        },
    }
}

fn public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, ..] = ip.octets();
    !(ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_multicast()
        || ip.is_broadcast()
        || ip.is_unspecified()
        || a == 0
        || (a == 100 && (64..128).contains(&b))
        || (a == 198 && (18..20).contains(&b))
        || (a == 192 && b == 0 && ip.octets()[2] == 0)
        || a >= 240)
}

fn public_v6(ip: Ipv6Addr) -> bool {
    let seg = ip.segments();
    !(ip.is_loopback()
        || ip.is_unspecified()
        || ip.is_multicast()
        || (seg[0] & 0xfe00) == 0xfc00 // unique local
        || (seg[0] & 0xffc0) == 0xfe80 // link-local
        || (seg[0] & 0xffc0) == 0xfec0 // site-local (deprecated)
        || seg[..6] == [0; 6] // IPv4-compatible ::/96
        || (seg[0] == 0x64 && seg[1] == 0xff9b) // NAT64 (64:ff9b::/96, 64:ff9b:1::/48)
        || seg[0] == 0x2002 // 6to4: embeds an IPv4 address
        || (seg[0] == 0x2001 && seg[1] == 0)) // Teredo
}

struct Shared {
    allow: Vec<HostRule>,
    tunnels: AtomicUsize,
    per_client: std::sync::Mutex<std::collections::HashMap<IpAddr, usize>>,
}

/// A running proxy; it stops with the process.
pub struct Proxy {
    addr: SocketAddr,
}

impl Proxy {
    /// Listens on 127.0.0.1 (an ephemeral port) and serves in the background.
    pub fn start(allow: Vec<HostRule>) -> io::Result<Proxy> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared { allow, tunnels: AtomicUsize::new(0), per_client: Default::default() });
        std::thread::Builder::new().name("build-proxy".into()).spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let shared = shared.clone();
                if shared.tunnels.fetch_add(1, Ordering::AcqRel) >= TUNNELS_MAX {
                    shared.tunnels.fetch_sub(1, Ordering::AcqRel);
                    let _ = refuse(&conn, 503, "too many tunnels open at once");
                    continue;
                }
                let client = conn.peer_addr().map(|a| a.ip()).unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
                let release = {
                    let shared = shared.clone();
                    move || {
                        shared.tunnels.fetch_sub(1, Ordering::AcqRel);
                        let mut per = shared.per_client.lock().unwrap_or_else(|p| p.into_inner());
                        if let Some(n) = per.get_mut(&client) {
                            *n -= 1;
                            if *n == 0 {
                                per.remove(&client);
                            }
                        }
                    }
                };
                let held = {
                    let mut per = shared.per_client.lock().unwrap_or_else(|p| p.into_inner());
                    let n = per.entry(client).or_insert(0);
                    *n += 1;
                    *n
                };
                if held > TUNNELS_PER_CLIENT_MAX {
                    let _ = refuse(&conn, 503, "too many tunnels open from this build");
                    release();
                    continue;
                }
                let spawned = std::thread::Builder::new().name("build-tunnel".into()).spawn({
                    let (shared, release) = (shared.clone(), release.clone());
                    move || {
                        serve(&shared, conn);
                        release();
                    }
                });
                if spawned.is_err() {
                    release();
                }
            }
        })?;
        Ok(Proxy { addr })
    }

    /// Where it listens (on the host's loopback).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

fn refuse(mut conn: &TcpStream, status: u16, why: &str) -> io::Result<()> {
    let reason = match status {
        400 => "Bad Request",
        403 => "Forbidden",
        405 => "Method Not Allowed",
        502 => "Bad Gateway",
        _ => "Service Unavailable",
    };
    let body = format!("staccato build sandbox: {why}\n");
    let head = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    conn.write_all(head.as_bytes())?;
    conn.write_all(body.as_bytes())
}

/// Reads the request head: bytes up to the blank line, at most HEAD_LEN_MAX.
/// Err is the status and reason to refuse the client with.
fn read_head(mut conn: &TcpStream) -> Result<String, (u16, String)> {
    let bad = |why: String| Err((400, why));
    let mut head = Vec::with_capacity(256);
    let mut byte = [0u8; 1];
    let deadline = std::time::Instant::now() + HEAD_TIMEOUT;
    // Byte by byte: nothing after the head may be consumed (it belongs to
    // the tunnel), and a head is a few hundred bytes.
    while !head.ends_with(b"\r\n\r\n") && !head.ends_with(b"\n\n") {
        if head.len() >= HEAD_LEN_MAX {
            return bad(format!("request head longer than {HEAD_LEN_MAX} bytes"));
        }
        // One deadline for the whole head, not one per byte.
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() || conn.set_read_timeout(Some(left)).is_err() {
            return bad("request head not sent in time".into());
        }
        match conn.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            Ok(_) => return bad("connection closed before the request head ended".into()),
            Err(e) => return bad(format!("reading the request head: {e}")),
        }
    }
    String::from_utf8(head).map_err(|_| (400, "request head is not UTF-8".into()))
}

/// Parses `CONNECT host:port HTTP/1.x` into (lower-case host, port).
pub fn parse_connect(head: &str) -> Result<(String, u16), (u16, String)> {
    let line = head.lines().next().unwrap_or("");
    let mut parts = line.split(' ');
    let (method, target, version) = (parts.next(), parts.next(), parts.next());
    let (Some(method), Some(target), Some(version)) = (method, target, version) else {
        return Err((400, format!("malformed request line {line:?}")));
    };
    if !version.starts_with("HTTP/1.") || parts.next().is_some() {
        return Err((400, format!("malformed request line {line:?}")));
    }
    if method != "CONNECT" {
        return Err((405, format!("only CONNECT tunnels (HTTPS) are served, not {method}")));
    }
    let (host, port) = if let Some(v6) = target.strip_prefix('[') {
        let (h, p) = v6.split_once("]:").ok_or((400, format!("bad CONNECT target {target:?}")))?;
        (h, p)
    } else {
        target.rsplit_once(':').ok_or((400, format!("CONNECT target {target:?} has no port")))?
    };
    let port: u16 = port.parse().map_err(|_| (400, format!("bad port in CONNECT target {target:?}")))?;
    if host.is_empty() {
        return Err((400, format!("bad CONNECT target {target:?}")));
    }
    Ok((host.trim_end_matches('.').to_ascii_lowercase(), port))
}

fn serve(shared: &Shared, conn: TcpStream) {
    let _ = conn.set_read_timeout(Some(HEAD_TIMEOUT));
    let head = match read_head(&conn) {
        Ok(h) => h,
        Err((status, why)) => {
            let _ = refuse(&conn, status, &why);
            return;
        }
    };
    let (host, port) = match parse_connect(&head) {
        Ok(t) => t,
        Err((status, why)) => {
            let _ = refuse(&conn, status, &why);
            return;
        }
    };
    if !PORTS.contains(&port) {
        let _ = refuse(&conn, 403, &format!("port {port} is not allowed (only 443)"));
        return;
    }
    if !shared.allow.iter().any(|r| r.matches(&host)) {
        let why = format!("{host} is not on the allow list; an operator can add it with --build-allow-host {host}");
        log::warn!("build sandbox: refused a tunnel to {host}:{port} (not on the allow list)");
        let _ = refuse(&conn, 403, &why);
        return;
    }
    let upstream = match connect(&host, port) {
        Ok(s) => s,
        Err((status, why)) => {
            log::warn!("build sandbox: refused a tunnel to {host}:{port}: {why}");
            let _ = refuse(&conn, status, &why);
            return;
        }
    };
    if (&conn).write_all(b"HTTP/1.1 200 Connection established\r\n\r\n").is_err() {
        return;
    }
    splice(conn, upstream);
}

fn connect(host: &str, port: u16) -> Result<TcpStream, (u16, String)> {
    let addrs: Vec<SocketAddr> =
        (host, port).to_socket_addrs().map_err(|e| (502, format!("cannot resolve {host}: {e}")))?.collect();
    if let Some(bad) = addrs.iter().find(|a| !is_public(a.ip())) {
        return Err((403, format!("{host} resolves to {}, which is not a public address", bad.ip())));
    }
    let mut last = None;
    for a in &addrs {
        match TcpStream::connect_timeout(a, CONNECT_TIMEOUT) {
            Ok(s) => return Ok(s),
            Err(e) => last = Some(e),
        }
    }
    Err((502, format!("cannot connect to {host}:{port}: {}", last.map_or("no address".into(), |e| e.to_string()))))
}

/// Copies both ways until either side closes or the tunnel idles out.
fn splice(client: TcpStream, upstream: TcpStream) {
    for s in [&client, &upstream] {
        let _ = s.set_read_timeout(Some(IDLE_TIMEOUT));
        let _ = s.set_write_timeout(Some(IDLE_TIMEOUT));
    }
    let (Ok(client2), Ok(upstream2)) = (client.try_clone(), upstream.try_clone()) else { return };
    let up = std::thread::Builder::new().name("build-tunnel-up".into()).spawn(move || pump(client2, upstream2));
    pump(upstream, client);
    if let Ok(up) = up {
        let _ = up.join();
    }
}

fn pump(mut from: TcpStream, mut to: TcpStream) {
    let mut buf = vec![0u8; 32 << 10];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = to.shutdown(Shutdown::Write);
    let _ = from.shutdown(Shutdown::Read);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_match_exact_names_and_subdomains_only() {
        let exact = HostRule::parse("PyPI.org.").unwrap();
        assert!(exact.matches("pypi.org"));
        assert!(!exact.matches("evilpypi.org"));
        assert!(!exact.matches("pypi.org.evil"));
        let wild = HostRule::parse("*.example.org").unwrap();
        assert!(wild.matches("a.example.org"));
        assert!(wild.matches("a.b.example.org"));
        assert!(!wild.matches("example.org"));
        assert!(!wild.matches("badexample.org"));
        for bad in ["", "*.", "a..b", "-a.org", "a b", "a/b", "a:1", "*.*.org", "*.com", "*.org."] {
            assert!(HostRule::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn url_hosts() {
        assert_eq!(url_host("https://user:pw@Index.example:8443/simple").as_deref(), Some("index.example"));
        assert_eq!(url_host("https://pypi.org/simple").as_deref(), Some("pypi.org"));
        assert_eq!(url_host("http://[::1]:80/").as_deref(), Some("::1"));
        assert_eq!(url_host("/opt/wheels"), None);
        assert_eq!(url_host("direct"), None);
    }

    #[test]
    fn private_and_special_addresses_are_not_public() {
        for ip in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "255.255.255.255",
            "224.0.0.1",
            "::1",
            "::",
            "fe80::1",
            "fd00::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
        ] {
            assert!(!is_public(ip.parse().unwrap()), "{ip}");
        }
        for ip in ["151.101.0.223", "203.0.113.80", "2a04:4e42::223"] {
            assert!(is_public(ip.parse().unwrap()), "{ip}");
        }
    }

    #[test]
    fn connect_lines() {
        assert_eq!(parse_connect("CONNECT PyPI.org:443 HTTP/1.1\r\nHost: x\r\n\r\n"), Ok(("pypi.org".into(), 443)));
        assert_eq!(parse_connect("CONNECT [2001:db8::1]:443 HTTP/1.1\r\n\r\n"), Ok(("2001:db8::1".into(), 443)));
        assert_eq!(parse_connect("GET http://x/ HTTP/1.1\r\n\r\n").unwrap_err().0, 405);
        for bad in ["CONNECT pypi.org HTTP/1.1", "CONNECT pypi.org:x HTTP/1.1", "CONNECT :443 HTTP/1.1", "junk", ""] {
            assert_eq!(parse_connect(bad).unwrap_err().0, 400, "{bad}");
        }
    }

    fn ask(proxy: &Proxy, request: &[u8]) -> String {
        let mut s = TcpStream::connect(proxy.addr()).unwrap();
        s.write_all(request).unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    }

    #[test]
    fn refuses_names_off_the_list_and_names_that_resolve_to_loopback() {
        let proxy = Proxy::start(vec![HostRule::parse("localhost").unwrap()]).unwrap();
        let off = ask(&proxy, b"CONNECT example.org:443 HTTP/1.1\r\n\r\n");
        assert!(off.starts_with("HTTP/1.1 403"), "{off}");
        assert!(off.contains("example.org is not on the allow list"), "{off}");
        let local = ask(&proxy, b"CONNECT localhost:443 HTTP/1.1\r\n\r\n");
        assert!(local.starts_with("HTTP/1.1 403") && local.contains("not a public address"), "{local}");
        let port = ask(&proxy, b"CONNECT localhost:80 HTTP/1.1\r\n\r\n");
        assert!(port.starts_with("HTTP/1.1 403") && port.contains("port 80"), "{port}");
        let get = ask(&proxy, b"GET http://localhost/ HTTP/1.1\r\n\r\n");
        assert!(get.starts_with("HTTP/1.1 405"), "{get}");
        let long = ask(&proxy, &[b'a'; HEAD_LEN_MAX + 10]);
        assert!(long.starts_with("HTTP/1.1 400"), "{long}");
    }
}
