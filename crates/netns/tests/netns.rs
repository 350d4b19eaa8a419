//! Real namespaces, real veths, real nftables: needs root and `nft`, and
//! skips (saying why) without them. Each test has its own prefix and its own
//! indexes (the address block is shared between prefixes), all near the top
//! of the range, away from what an engine on this machine would use.
//!
//! Reachability is probed by re-running this test binary inside the
//! namespace as `connect_helper`, so no client program (python, nc) is
//! needed. Nothing listens on a non-loopback host address, and no packet is
//! sent anywhere but to loopback and to our own veth addresses.

use staccato_netns::{Net, Networks, NS_IF};
use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::process::Command;
use std::sync::mpsc::{channel, Receiver};
use std::time::Duration;

const CONNECT_ENV: &str = "STACCATO_NETNS_TEST_CONNECT";

/// Removes everything of the prefix when the test ends, panicking or not.
struct Fixture {
    nets: Networks,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        if let Err(e) = self.nets.cleanup() {
            eprintln!("cleanup after test: {e}");
        }
    }
}

fn fixture(prefix: &str) -> Option<Fixture> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let euid = status.lines().find_map(|l| l.strip_prefix("Uid:")).and_then(|u| u.split_whitespace().nth(1));
    if euid != Some("0") {
        eprintln!("SKIPPED: needs root to make network namespaces");
        return None;
    }
    match Networks::new(prefix) {
        Ok(nets) => {
            nets.cleanup().expect("cleanup before test");
            Some(Fixture { nets })
        }
        Err(e @ staccato_netns::Error::ToolMissing { .. }) => {
            eprintln!("SKIPPED: {e}");
            None
        }
        Err(e) => panic!("Networks::new: {e}"),
    }
}

/// A command's stdout, or None if it could not run or failed.
fn run(args: &[&str]) -> Option<String> {
    let out = Command::new(args[0]).args(&args[1..]).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs a command and returns its stdout; panics, with its stderr, if it fails.
fn sh(args: &[&str]) -> String {
    let out = Command::new(args[0]).args(&args[1..]).output().unwrap_or_else(|e| panic!("{args:?}: {e}"));
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn in_ns(net: &Net, args: &[&str]) -> String {
    let mut all = vec!["ip", "netns", "exec", &net.name];
    all.extend_from_slice(args);
    sh(&all)
}

/// How a connection attempt from inside a namespace ended.
#[derive(Debug, PartialEq)]
enum Outcome {
    /// Connected and read the server's greeting.
    Greeted,
    /// RST: the host answered, nothing listened.
    Refused,
    /// No answer: the packet was dropped.
    TimedOut,
    Other(String),
}

/// Not a test of its own: the body that `connect_from` runs inside a
/// namespace. Without the environment variable it does nothing.
#[test]
fn connect_helper() {
    let Ok(target) = std::env::var(CONNECT_ENV) else { return };
    let addr: SocketAddr = target.parse().expect("address");
    let outcome = match TcpStream::connect_timeout(&addr, Duration::from_millis(1500)) {
        Ok(mut s) => {
            let mut greeting = [0u8; 5];
            match s.read_exact(&mut greeting) {
                Ok(()) if &greeting == b"hello" => "greeted".to_string(),
                r => format!("other: read {r:?} {greeting:?}"),
            }
        }
        Err(e) if e.kind() == ErrorKind::ConnectionRefused => "refused".into(),
        Err(e) if e.kind() == ErrorKind::TimedOut => "timedout".into(),
        Err(e) => format!("other: {e}"),
    };
    println!("OUTCOME {outcome}");
}

fn connect_from(net: &Net, addr: SocketAddr) -> Outcome {
    let exe = std::env::current_exe().expect("current_exe");
    let out = Command::new("ip")
        .args(["netns", "exec", &net.name])
        .arg(exe)
        .args(["--exact", "connect_helper", "--nocapture", "--test-threads=1"])
        .env(CONNECT_ENV, addr.to_string())
        .output()
        .expect("ip netns exec");
    let stdout = String::from_utf8_lossy(&out.stdout);
    // libtest prints "test connect_helper ... " on the same line first.
    match stdout.split_once("OUTCOME ").and_then(|(_, rest)| rest.lines().next()) {
        Some("greeted") => Outcome::Greeted,
        Some("refused") => Outcome::Refused,
        Some("timedout") => Outcome::TimedOut,
        Some(o) => Outcome::Other(o.to_string()),
        None => Outcome::Other(format!("{stdout} {}", String::from_utf8_lossy(&out.stderr))),
    }
}

/// A server on `ip`:free port that greets each client and reports its
/// address. Its thread lives until the test binary exits.
fn greeter(ip: Ipv4Addr) -> (u16, Receiver<SocketAddr>) {
    let listener = TcpListener::bind((ip, 0)).expect("bind");
    let port = listener.local_addr().expect("local_addr").port();
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let mut conn = conn;
            let _ = conn.write_all(b"hello");
            if let Ok(peer) = conn.peer_addr() {
                let _ = tx.send(peer);
            }
        }
    });
    (port, rx)
}

/// A loopback port nothing listens on (bound, then released).
fn closed_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).and_then(|l| l.local_addr()).expect("bind").port()
}

/// (interface, family, address) of each `ip -o addr` line.
fn addresses(text: &str) -> Vec<(String, String, String)> {
    text.lines()
        .filter_map(|l| {
            let t: Vec<&str> = l.split_whitespace().collect();
            Some((t.get(1)?.to_string(), t.get(2)?.to_string(), t.get(3)?.to_string()))
        })
        .collect()
}

/// (name, flags, MAC) of each `ip -o link` line.
fn links(text: &str) -> Vec<(String, String, String)> {
    text.lines()
        .filter_map(|l| {
            let t: Vec<&str> = l.split_whitespace().collect();
            let name = t.get(1)?.trim_end_matches(':').split('@').next()?.to_string();
            let mac = t.iter().position(|w| w.starts_with("link/")).and_then(|i| t.get(i + 1)).unwrap_or(&"");
            Some((name, t.get(2)?.to_string(), mac.to_string()))
        })
        .collect()
}

#[test]
fn create_gives_only_lo_and_the_veth() {
    let Some(f) = fixture("nta") else { return };
    let net = f.nets.create(16001).expect("create");
    assert!(net.path.exists());
    assert!(net.host_if.len() <= 15);

    let addrs = addresses(&in_ns(&net, &["ip", "-o", "addr"]));
    let mut want = vec![
        ("lo".to_string(), "inet".to_string(), "127.0.0.1/8".to_string()),
        (NS_IF.to_string(), "inet".to_string(), format!("{}/30", net.ns_ip)),
    ];
    let mut got: Vec<_> = addrs.into_iter().filter(|(_, fam, a)| !(fam == "inet6" && a == "::1/128")).collect();
    want.sort();
    got.sort();
    assert_eq!(got, want);

    let names: Vec<_> = links(&in_ns(&net, &["ip", "-o", "link"]))
        .into_iter()
        .map(|(n, flags, _)| (n, flags.contains(",UP")))
        .collect();
    assert_eq!(names, [("lo".to_string(), true), (NS_IF.to_string(), true)]);
    let routes = in_ns(&net, &["ip", "route"]);
    assert!(routes.contains(&format!("default via {} dev {NS_IF}", net.host_ip)), "{routes}");
    f.nets.check(&net).expect("a fresh namespace has no drift");

    let again = f.nets.create(16001).expect_err("index in use").to_string();
    assert!(again.contains("already exist"), "{again}");
    f.nets.destroy(&net).expect("destroy");
}

#[test]
fn host_loopback_is_reachable_at_host_ip() {
    let Some(f) = fixture("ntb") else { return };
    let net = f.nets.create(16002).expect("create");
    let (port, peers) = greeter(Ipv4Addr::LOCALHOST);
    assert_eq!(connect_from(&net, SocketAddr::from((net.host_ip, port))), Outcome::Greeted);
    // The loopback service sees the namespace's own address: no masquerade.
    let peer = peers.recv_timeout(Duration::from_secs(2)).expect("server saw the client");
    assert_eq!(peer.ip(), net.ns_ip);
    f.nets.destroy(&net).expect("destroy");
}

#[test]
fn host_is_otherwise_invisible() {
    let Some(f) = fixture("ntc") else { return };
    let net = f.nets.create(16003).expect("create");
    let other = f.nets.create(16004).expect("create");

    // Nothing of the host's own shows inside: no address but loopback's,
    // no interface (our eth0 is the veth end, not the host's eth0: its MAC
    // differs from every host interface's).
    let host_addrs = addresses(&sh(&["ip", "-o", "addr"]));
    let ns_addrs = in_ns(&net, &["ip", "-o", "addr"]);
    for (iface, _, addr) in host_addrs.iter().filter(|(i, _, _)| i != "lo") {
        assert!(!ns_addrs.contains(addr.as_str()), "host address {addr} of {iface} visible inside: {ns_addrs}");
    }
    let host_macs: Vec<String> = links(&sh(&["ip", "-o", "link"])).into_iter().map(|(_, _, mac)| mac).collect();
    for (name, _, mac) in links(&in_ns(&net, &["ip", "-o", "link"])) {
        assert!(name == "lo" || name == NS_IF, "unexpected interface {name} inside");
        if name == NS_IF {
            assert!(!host_macs.contains(&mac), "{NS_IF} inside has a host interface's MAC {mac}");
        }
    }

    // Control: our own host_ip answers at once, even on a closed port (the
    // DNAT goes to loopback, which resets).
    let closed = closed_port();
    assert_eq!(connect_from(&net, SocketAddr::from((net.host_ip, closed))), Outcome::Refused);
    // The host's other addresses do not even answer: their packets are
    // dropped (a reachable host would reset the closed port at once).
    // (Our own veths' addresses are left out: other tests add and remove
    // them concurrently; `other` below stands for them.)
    let probed = host_addrs.iter().filter(|(i, f, _)| i != "lo" && !i.starts_with("st-") && f == "inet");
    for (iface, fam, addr) in probed {
        let ip: Ipv4Addr = addr.split('/').next().and_then(|a| a.parse().ok()).expect("address");
        let outcome = connect_from(&net, SocketAddr::from((ip, closed)));
        assert_eq!(outcome, Outcome::TimedOut, "{fam} {addr} of {iface}");
    }
    // Nor does another namespace's host side, even with a server bound to
    // exactly that address.
    let (port, _) = greeter(other.host_ip);
    assert_eq!(connect_from(&net, SocketAddr::from((other.host_ip, port))), Outcome::TimedOut);
    assert_eq!(connect_from(&net, SocketAddr::from((other.ns_ip, port))), Outcome::TimedOut);
}

#[test]
fn destroy_and_cleanup_remove_everything() {
    let Some(f) = fixture("ntd") else { return };
    let listed = |net: &Net| {
        let netns = sh(&["ip", "netns", "list"]);
        let links = sh(&["ip", "-o", "link"]);
        let rules = run(&["nft", "list", "table", "inet", f.nets.table()]).unwrap_or_default();
        let ip = format!("{} ", net.host_ip);
        netns.contains(&net.name)
            || links.contains(&format!(" {}:", net.host_if))
            || rules.contains(&net.host_if)
            || rules.contains(&ip)
    };

    let net = f.nets.create(16005).expect("create");
    assert!(listed(&net));
    f.nets.destroy(&net).expect("destroy");
    assert!(!listed(&net), "destroy left something of {}", net.name);
    assert!(!net.path.exists());
    f.nets.destroy(&net).expect("destroy is idempotent");

    // A crashed engine's leftovers: a namespace made through the API and
    // forgotten, a bare namespace, a lone veth pair.
    let forgotten = f.nets.create(16006).expect("create");
    sh(&["ip", "netns", "add", "stc-ntd-16007"]);
    sh(&["ip", "link", "add", "st-ntd-16008", "type", "veth", "peer", "name", "st-ntd-16009"]);
    // Names that merely look alike are not ours and must survive. (A failed
    // earlier run may have left them.)
    let _ = run(&["ip", "netns", "del", "stc-ntd-x"]);
    let _ = run(&["ip", "netns", "del", "stc-ntdx-1"]);
    sh(&["ip", "netns", "add", "stc-ntd-x"]);
    sh(&["ip", "netns", "add", "stc-ntdx-1"]);

    let restarted = Networks::new("ntd").expect("new");
    restarted.cleanup().expect("cleanup");
    let netns = sh(&["ip", "netns", "list"]);
    let links = sh(&["ip", "-o", "link"]);
    assert!(!netns.contains("stc-ntd-1"), "{netns}");
    assert!(!links.contains("st-ntd-"), "{links}");
    assert!(!listed(&forgotten));
    assert!(run(&["nft", "list", "table", "inet", restarted.table()]).is_none(), "table survived cleanup");
    assert!(netns.contains("stc-ntd-x") && netns.contains("stc-ntdx-1"), "cleanup removed foreign names: {netns}");
    sh(&["ip", "netns", "del", "stc-ntd-x"]);
    sh(&["ip", "netns", "del", "stc-ntdx-1"]);

    // Still usable after cleanup: create puts the table back.
    let net = restarted.create(16005).expect("create after cleanup");
    let (port, _) = greeter(Ipv4Addr::LOCALHOST);
    assert_eq!(connect_from(&net, SocketAddr::from((net.host_ip, port))), Outcome::Greeted);
    restarted.destroy(&net).expect("destroy");
}

#[test]
fn check_detects_drift() {
    let Some(f) = fixture("nte") else { return };
    let net = f.nets.create(16010).expect("create");
    f.nets.check(&net).expect("fresh");

    sh(&["ip", "-n", &net.name, "addr", "add", "10.9.9.9/24", "dev", NS_IF]);
    let e = f.nets.check(&net).expect_err("extra address").to_string();
    assert!(e.contains("unexpected address eth0 inet 10.9.9.9/24"), "{e}");
    sh(&["ip", "-n", &net.name, "addr", "del", "10.9.9.9/24", "dev", NS_IF]);
    f.nets.check(&net).expect("back to normal");

    sh(&["ip", "-n", &net.name, "route", "del", "default"]);
    let e = f.nets.check(&net).expect_err("missing route").to_string();
    assert!(e.contains("missing route default"), "{e}");
    sh(&["ip", "-n", &net.name, "route", "add", "default", "via", &net.host_ip.to_string()]);
    f.nets.check(&net).expect("back to normal");

    sh(&["ip", "-n", &net.name, "link", "add", "x0", "type", "veth", "peer", "name", "x1"]);
    let e = f.nets.check(&net).expect_err("extra links").to_string();
    assert!(e.contains("unexpected interface x0") && e.contains("unexpected interface x1"), "{e}");
    sh(&["ip", "-n", &net.name, "link", "del", "x0"]);

    sh(&["ip", "link", "set", &net.host_if, "down"]);
    let e = f.nets.check(&net).expect_err("host side down").to_string();
    assert!(e.contains("host side down"), "{e}");
    f.nets.destroy(&net).expect("destroy");
    let e = f.nets.check(&net).expect_err("gone").to_string();
    assert!(e.contains("gone"), "{e}");
}

#[test]
fn one_index_under_two_prefixes_is_refused() {
    let Some(f) = fixture("ntf") else { return };
    let Some(g) = fixture("ntg") else { return };
    let net = f.nets.create(16011).expect("create");
    let e = g.nets.create(16011).expect_err("same /30").to_string();
    assert!(e.contains("already routed") && e.contains(&net.host_if), "{e}");
    assert!(!g.nets.net_at(16011).expect("net_at").path.exists(), "the refused create left its netns");
    f.nets.destroy(&net).expect("destroy");
}

#[test]
fn with_ports_reaches_only_those_ports() {
    // The plain fixture only decides skipping and clears leftovers.
    if fixture("nti").is_none() {
        return;
    }
    let (allowed, allowed_rx) = greeter(Ipv4Addr::LOCALHOST);
    let (other, _) = greeter(Ipv4Addr::LOCALHOST);
    let f = Fixture { nets: Networks::with_ports("nti", &[allowed]).expect("with_ports") };
    let net = f.nets.create(16012).expect("create");
    assert_eq!(connect_from(&net, SocketAddr::from((net.host_ip, allowed))), Outcome::Greeted);
    assert_eq!(allowed_rx.recv_timeout(Duration::from_secs(2)).expect("server saw the client").ip(), net.ns_ip);
    assert_eq!(connect_from(&net, SocketAddr::from((net.host_ip, other))), Outcome::TimedOut);
}
