//! Callback URLs of asynchronous calls (`X-Callback-Url`): checked when a
//! call is accepted, and posted to when it ends.
//!
//! A callback makes the gateway send an HTTP request wherever the caller
//! says, with a body the function's output decides: a way into whatever
//! the gateway can reach and the caller cannot (the store's etcd, a
//! metadata service, the engines). So only plain `http://` URLs are taken,
//! and a request goes only to a public address, or to one inside a network
//! the operator allowed (`--callback-allow CIDR`); never to the gateway's
//! own port. Names are resolved at delivery and the address checked is
//! the one connected to (a name cannot point elsewhere in between).

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv6Addr, SocketAddr, TcpStream, ToSocketAddrs};
use std::time::Duration;

/// The longest callback URL taken.
pub const URL_LEN_MAX: usize = 2048;

/// A callback URL, checked: `http://HOST[:PORT][/PATH][?QUERY]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallbackUrl {
    pub host: String,
    pub port: u16,
    /// The path and query, starting with `/`.
    pub target: String,
}

impl CallbackUrl {
    pub fn parse(url: &str) -> Result<CallbackUrl, String> {
        if url.len() > URL_LEN_MAX {
            return Err(format!("the callback URL is longer than {URL_LEN_MAX} bytes"));
        }
        if url.bytes().any(|b| !(0x21..=0x7e).contains(&b)) {
            return Err("the callback URL has a space, a control or a non-ASCII character".into());
        }
        let Some(rest) = url.strip_prefix("http://") else {
            return Err(format!("the callback URL must start with http:// (https is not supported), got {url:?}"));
        };
        let rest = rest.split('#').next().unwrap_or("");
        let (authority, target) = match rest.find(['/', '?']) {
            Some(i) if rest.as_bytes()[i] == b'/' => (&rest[..i], rest[i..].to_string()),
            Some(i) => (&rest[..i], format!("/{}", &rest[i..])),
            None => (rest, "/".to_string()),
        };
        if authority.contains('@') {
            return Err("the callback URL may not carry a user name or password".into());
        }
        let (host, port, v6) = if let Some(v6) = authority.strip_prefix('[') {
            let (h, after) = v6.split_once(']').ok_or("the callback URL's [IPv6] address is not closed")?;
            h.parse::<Ipv6Addr>().map_err(|_| format!("{h:?} is not an IPv6 address"))?;
            if !after.is_empty() && !after.starts_with(':') {
                return Err(format!("unexpected {after:?} after the callback URL's address"));
            }
            (h.to_string(), after.strip_prefix(':'), true)
        } else {
            match authority.split_once(':') {
                Some((h, p)) => (h.to_string(), Some(p), false),
                None => (authority.to_string(), None, false),
            }
        };
        let port = match port {
            None => 80,
            Some(p) => {
                p.parse::<u16>().ok().filter(|&p| p != 0).ok_or(format!("bad port {p:?} in the callback URL"))?
            }
        };
        let name_ok = !host.is_empty()
            && host.len() <= 253
            && (v6 || host.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-'));
        if !name_ok {
            return Err(format!("the callback URL's host {host:?} is not a host name or an address"));
        }
        Ok(CallbackUrl { host, port, target })
    }

    fn host_header(&self) -> String {
        let host = if self.host.contains(':') { format!("[{}]", self.host) } else { self.host.clone() };
        if self.port == 80 {
            host
        } else {
            format!("{host}:{}", self.port)
        }
    }
}

/// A network: an address and how many of its leading bits count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr {
    pub addr: IpAddr,
    pub bits: u8,
}

impl std::str::FromStr for Cidr {
    type Err = String;

    fn from_str(s: &str) -> Result<Cidr, String> {
        let bad = || format!("{s:?} is not a network like 10.0.0.0/8, 127.0.0.1/32 or fd00::/8");
        let (a, b) = s.split_once('/').ok_or_else(bad)?;
        let addr: IpAddr = a.parse().map_err(|_| bad())?;
        let bits: u8 = b.parse().map_err(|_| bad())?;
        if bits > if addr.is_ipv4() { 32 } else { 128 } {
            return Err(bad());
        }
        Ok(Cidr { addr, bits })
    }
}

impl Cidr {
    pub fn contains(&self, ip: IpAddr) -> bool {
        fn masked(x: u128, bits: u8, width: u8) -> u128 {
            if bits == 0 {
                0
            } else {
                x >> (width - bits)
            }
        }
        match (self.addr, ip) {
            (IpAddr::V4(n), IpAddr::V4(a)) => {
                masked(u128::from(u32::from(n)), self.bits, 32) == masked(u128::from(u32::from(a)), self.bits, 32)
            }
            (IpAddr::V6(n), IpAddr::V6(a)) => {
                masked(u128::from(n), self.bits, 128) == masked(u128::from(a), self.bits, 128)
            }
            _ => false,
        }
    }
}

/// Where callbacks may go.
#[derive(Clone, Debug)]
pub struct Policy {
    /// Networks allowed besides public addresses.
    pub allow: Vec<Cidr>,
    /// The gateway's own address: never a callback's.
    pub gateway: SocketAddr,
}

impl Policy {
    /// Why a callback may not go to `to`, if it may not.
    pub fn refuses(&self, to: SocketAddr) -> Option<String> {
        let ip = canonical(to.ip());
        let own_port = to.port() == self.gateway.port()
            && (ip.is_loopback()
                || ip.is_unspecified()
                || ip == self.gateway.ip()
                || self.gateway.ip().is_unspecified());
        if own_port {
            return Some(format!("{to} is this gateway"));
        }
        if public(ip) || self.allow.iter().any(|c| c.contains(ip)) {
            return None;
        }
        Some(format!(
            "{ip} is not a public address; the gateway's operator can allow a network with --callback-allow CIDR"
        ))
    }

    /// Checks a URL when its call is accepted: an address in it must be
    /// allowed (a name is checked when it is resolved, at delivery).
    pub fn check(&self, url: &CallbackUrl) -> Result<(), String> {
        match url.host.parse::<IpAddr>() {
            Ok(ip) => match self.refuses(SocketAddr::new(ip, url.port)) {
                Some(why) => Err(format!("callbacks may not go to {}: {why}", url.host)),
                None => Ok(()),
            },
            Err(_) => Ok(()),
        }
    }
}

/// An IPv4 address mapped into IPv6 is judged as the IPv4 one.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// Whether an address is on the public internet: not loopback, private,
/// link-local, shared (CGNAT), multicast, documentation or reserved.
pub fn public(ip: IpAddr) -> bool {
    match canonical(ip) {
        IpAddr::V4(a) => {
            let o = a.octets();
            !(a.is_unspecified()
                || a.is_loopback()
                || a.is_private()
                || a.is_link_local()
                || a.is_broadcast()
                || a.is_multicast()
                || a.is_documentation()
                || o[0] == 0
                || (o[0] == 100 && (64..128).contains(&o[1]))
                || (o[0] == 192 && o[1] == 0 && o[2] == 0)
                || (o[0] == 198 && (18..20).contains(&o[1]))
                || o[0] >= 240)
        }
        IpAddr::V6(a) => {
            let s = a.segments();
            !(a.is_unspecified()
                || a.is_loopback()
                || a.is_multicast()
                || (s[0] & 0xfe00) == 0xfc00
                || (s[0] & 0xffc0) == 0xfe80
                || (s[0] == 0x2001 && s[1] == 0xdb8)
                // NAT64, 6to4, Teredo and the old site-local: they lead to
                // IPv4 (or local) addresses not judged here.
                || (s[0] == 0x64 && s[1] == 0xff9b)
                || s[0] == 0x2002
                || (s[0] == 0x2001 && s[1] == 0)
                || (s[0] & 0xffc0) == 0xfec0
                || s[..6] == [0, 0, 0, 0, 0, 0])
        }
    }
}

/// What a callback sends.
pub struct Delivery<'a> {
    pub content_type: &'a str,
    pub headers: &'a [(&'a str, String)],
    pub body: &'a [u8],
}

/// A delivery, all told (resolving, connecting, sending, the answer's
/// status line): a receiver that trickles holds a thread no longer.
pub const DELIVERY_TIME: Duration = Duration::from_secs(15);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(3);

/// Resolves `host`, waiting at most [`RESOLVE_TIMEOUT`] (getaddrinfo has
/// no timeout of its own: it runs on a thread left to end by itself).
fn resolve(host: &str, port: u16) -> Result<Vec<SocketAddr>, String> {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(vec![SocketAddr::new(ip, port)]);
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let name = host.to_string();
    std::thread::Builder::new()
        .name("gateway-resolve".into())
        .spawn(move || {
            let _ = tx.send((name.as_str(), port).to_socket_addrs().map(Iterator::collect::<Vec<_>>));
        })
        .map_err(|e| format!("resolving {host}: {e}"))?;
    match rx.recv_timeout(RESOLVE_TIMEOUT) {
        Ok(Ok(a)) => Ok(a),
        Ok(Err(e)) => Err(format!("resolving {host}: {e}")),
        Err(_) => Err(format!("resolving {host}: no answer within {RESOLVE_TIMEOUT:?}")),
    }
}

/// Posts `d` to `url`, to the first of its addresses the policy allows:
/// the HTTP status it answered, or why there is none. Takes at most
/// [`DELIVERY_TIME`].
pub fn post(policy: &Policy, url: &CallbackUrl, d: &Delivery) -> Result<u16, String> {
    let deadline = std::time::Instant::now() + DELIVERY_TIME;
    let left = || {
        let l = deadline.saturating_duration_since(std::time::Instant::now());
        if l.is_zero() {
            Err(format!("no answer within {DELIVERY_TIME:?}"))
        } else {
            Ok(l)
        }
    };
    let addrs = resolve(&url.host, url.port)?;
    let mut why = format!("{} has no address", url.host);
    let Some(to) = addrs.iter().copied().find(|a| match policy.refuses(*a) {
        Some(w) => {
            why = format!("callbacks may not go to {}: {w}", url.host);
            false
        }
        None => true,
    }) else {
        return Err(why);
    };
    let mut s = TcpStream::connect_timeout(&to, CONNECT_TIMEOUT.min(left()?))
        .map_err(|e| format!("connecting to {to}: {e}"))?;
    let mut head = format!(
        "POST {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: staccato-gateway\r\nConnection: close\r\nContent-Type: {}\r\n\
         Content-Length: {}\r\n",
        url.target,
        url.host_header(),
        d.content_type,
        d.body.len()
    );
    for (k, v) in d.headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    let mut out = head.into_bytes();
    out.extend_from_slice(d.body);
    // Each write and read may wait only for what is left of the time.
    let mut sent = 0;
    while sent < out.len() {
        s.set_write_timeout(Some(left()?)).map_err(|e| e.to_string())?;
        match s.write(&out[sent..]) {
            Ok(0) => return Err(format!("{to} stopped reading")),
            Ok(n) => sent += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("sending to {to}: {e}")),
        }
    }
    let mut line = Vec::new();
    let mut buf = [0u8; 512];
    while !line.contains(&b'\n') {
        if line.len() > 8192 {
            return Err(format!("{to} answered a status line longer than 8 KiB"));
        }
        s.set_read_timeout(Some(left()?)).map_err(|e| e.to_string())?;
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => line.extend_from_slice(&buf[..n]),
            Err(e) => return Err(format!("reading {to}'s answer: {e}")),
        }
    }
    let line = String::from_utf8_lossy(&line);
    let first = line.lines().next().unwrap_or("");
    let status = first
        .strip_prefix("HTTP/1.")
        .and_then(|r| r.get(2..5))
        .and_then(|c| c.parse::<u16>().ok())
        .ok_or_else(|| format!("{to} answered no HTTP status line: {:?}", first.trim_end()))?;
    Ok(status)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_checked() {
        let u = CallbackUrl::parse("http://example.com:8080/hook?x=1#frag").unwrap();
        assert_eq!((u.host.as_str(), u.port, u.target.as_str()), ("example.com", 8080, "/hook?x=1"));
        assert_eq!(CallbackUrl::parse("http://h").unwrap().target, "/");
        assert_eq!(CallbackUrl::parse("http://h?q").unwrap().target, "/?q");
        let v6 = CallbackUrl::parse("http://[::1]:9/x").unwrap();
        assert_eq!((v6.host.as_str(), v6.port), ("::1", 9));
        assert_eq!(v6.host_header(), "[::1]:9");
        for bad in [
            "https://example.com/",
            "ftp://x/",
            "http://user:pw@example.com/",
            "http://example.com:0/",
            "http://example.com:99999/",
            "http://exa mple.com/",
            "http://example.com/a\r\nX-Injected: 1",
            "http:///path",
            "http://[::1/x",
            "http://a_b.com/",
            "http://::1/",
            "http://[::1]x/",
            "http://h:1:2/",
        ] {
            assert!(CallbackUrl::parse(bad).is_err(), "{bad:?} was taken");
        }
        assert!(CallbackUrl::parse(&format!("http://h/{}", "a".repeat(URL_LEN_MAX))).is_err());
    }

    #[test]
    fn only_public_or_allowed_addresses() {
        let p = Policy { allow: vec![], gateway: "127.0.0.1:8080".parse().unwrap() };
        for private in [
            "127.0.0.1:80",
            "10.1.2.3:80",
            "172.16.0.1:80",
            "192.168.1.1:80",
            "169.254.169.254:80",
            "100.64.0.1:80",
            "0.0.0.0:80",
            "[::1]:80",
            "[fd00::1]:80",
            "[fe80::1]:80",
            "[::ffff:127.0.0.1]:80",
            "[::ffff:10.0.0.1]:80",
            "[64:ff9b::a00:1]:80",
            "[2002:a00:1::1]:80",
            "[2001:0:a00:1::1]:80",
            "[fec0::1]:80",
            "224.0.0.1:80",
        ] {
            assert!(p.refuses(private.parse().unwrap()).is_some(), "{private} allowed");
        }
        assert!(p.refuses("93.184.216.34:80".parse().unwrap()).is_none());
        assert!(p.refuses("[2606:2800:220:1::1]:80".parse().unwrap()).is_none());
        let p = Policy { allow: vec!["127.0.0.0/8".parse().unwrap(), "fd00::/8".parse().unwrap()], ..p };
        assert!(p.refuses("127.0.0.1:9000".parse().unwrap()).is_none());
        assert!(p.refuses("[fd00::5]:9000".parse().unwrap()).is_none());
        assert!(p.refuses("10.0.0.1:9000".parse().unwrap()).is_some());
        // Never the gateway itself, allowed network or not.
        assert!(p.refuses("127.0.0.1:8080".parse().unwrap()).unwrap().contains("this gateway"));
        assert!(p.check(&CallbackUrl::parse("http://10.0.0.1/").unwrap()).is_err());
        assert!(p.check(&CallbackUrl::parse("http://127.0.0.1:9/").unwrap()).is_ok());
        for bad in ["10.0.0.0", "10.0.0.0/33", "x/8", "::/129"] {
            assert!(bad.parse::<Cidr>().is_err(), "{bad}");
        }
        assert!("0.0.0.0/0".parse::<Cidr>().unwrap().contains("8.8.8.8".parse().unwrap()));
    }
}
