//! Compares what `ip -o` reports inside a namespace with what create() made.
//! Pure, so every kind of drift is unit-tested without namespaces.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;

/// What a namespace made by create() holds.
pub(crate) struct Expected<'a> {
    pub ns_if: &'a str,
    pub ns_ip: Ipv4Addr,
    pub host_ip: Ipv4Addr,
    pub subnet: Ipv4Addr,
    pub prefix_len: u8,
    /// The host-side veth's ifindex, which the namespace end names as its
    /// peer (`eth0@if35`): proves eth0 is still our pair's end.
    pub host_ifindex: u32,
}

/// The `ip -o link show`, `ip -o addr show` and `ip -o route show` output,
/// concatenated in any order: each line's shape tells which it is.
#[derive(Default)]
struct Seen {
    /// (name, peer ifindex, flags)
    links: Vec<(String, Option<u32>, BTreeSet<String>)>,
    /// "lo inet 127.0.0.1/8"
    addrs: BTreeSet<String>,
    /// "default via 10.200.0.1 dev eth0"; only dst, via and dev, since
    /// proto/scope/src wording varies between iproute2 versions.
    routes: BTreeSet<String>,
}

fn parse(output: &str) -> Seen {
    let mut seen = Seen::default();
    for line in output.lines() {
        // -o joins a record's lines with '\'; only the first part matters.
        let t: Vec<&str> = line.split_whitespace().take_while(|w| *w != "\\").collect();
        let Some(first) = t.first() else { continue };
        let numbered = first.strip_suffix(':').is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
        if numbered && t.get(1).is_some_and(|w| w.ends_with(':')) {
            let full = t[1].trim_end_matches(':');
            let (name, peer) = match full.split_once('@') {
                Some((n, p)) => (n, p.strip_prefix("if").and_then(|x| x.parse().ok())),
                None => (full, None),
            };
            let flags = t.get(2).map_or("", |f| f.trim_start_matches('<').trim_end_matches('>'));
            seen.links.push((name.to_string(), peer, flags.split(',').map(String::from).collect()));
        } else if numbered && t.len() >= 4 && (t[2] == "inet" || t[2] == "inet6") {
            seen.addrs.insert(format!("{} {} {}", t[1], t[2], t[3]));
        } else {
            seen.routes.insert(route_key(&t));
        }
    }
    seen
}

fn route_key(t: &[&str]) -> String {
    let mut key = t[0].to_string();
    for pair in t[1..].windows(2) {
        if pair[0] == "via" || pair[0] == "dev" {
            key.push_str(&format!(" {} {}", pair[0], pair[1]));
        }
    }
    key
}

/// Every difference between `output` and `exp`, described; empty when none.
pub(crate) fn drift(output: &str, exp: &Expected) -> Vec<String> {
    let seen = parse(output);
    let mut found = Vec::new();
    check_links(&seen, exp, &mut found);
    let ns_addr = format!("{} inet {}/{}", exp.ns_if, exp.ns_ip, exp.prefix_len);
    let required = ["lo inet 127.0.0.1/8".to_string(), ns_addr];
    // ::1 exists exactly when the kernel has IPv6; either way is fine.
    let optional = ["lo inet6 ::1/128".to_string()];
    compare("address", &seen.addrs, &required, &optional, &mut found);
    let required = [
        format!("default via {} dev {}", exp.host_ip, exp.ns_if),
        format!("{}/{} dev {}", exp.subnet, exp.prefix_len, exp.ns_if),
    ];
    compare("route", &seen.routes, &required, &[], &mut found);
    found
}

fn check_links(seen: &Seen, exp: &Expected, found: &mut Vec<String>) {
    let names: BTreeSet<&str> = seen.links.iter().map(|(n, _, _)| n.as_str()).collect();
    let wanted: BTreeSet<&str> = ["lo", exp.ns_if].into();
    for extra in names.difference(&wanted) {
        found.push(format!("unexpected interface {extra}"));
    }
    for missing in wanted.difference(&names) {
        found.push(format!("missing interface {missing}"));
    }
    for (name, peer, flags) in &seen.links {
        if !flags.contains("UP") && wanted.contains(name.as_str()) {
            found.push(format!("{name} is down"));
        }
        if name == exp.ns_if {
            // No carrier means the host side went down or away.
            if !flags.contains("LOWER_UP") {
                found.push(format!("{name} has no carrier (host side down?)"));
            }
            if *peer != Some(exp.host_ifindex) {
                found.push(format!("{name}'s peer is ifindex {peer:?}, not the host veth's {}", exp.host_ifindex));
            }
        }
    }
}

fn compare(what: &str, seen: &BTreeSet<String>, required: &[String], optional: &[String], found: &mut Vec<String>) {
    for s in seen {
        if !required.contains(s) && !optional.contains(s) {
            found.push(format!("unexpected {what} {s}"));
        }
    }
    for r in required {
        if !seen.contains(r) {
            found.push(format!("missing {what} {r}"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Real `ip -o -n stc-zz-16383 -batch -` output (link/addr/route show)
    // captured from a namespace made by create() on iproute2 6.1.
    const GOOD: &str = "\
1: lo: <LOOPBACK,UP,LOWER_UP> mtu 65536 qdisc noqueue state UNKNOWN mode DEFAULT group default qlen 1000\\    link/loopback 00:00:00:00:00:00 brd 00:00:00:00:00:00
2: eth0@if35: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1500 qdisc noqueue state UP mode DEFAULT group default qlen 1000\\    link/ether 3e:ce:b9:53:9e:5b brd ff:ff:ff:ff:ff:ff link-netnsid 0
1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever preferred_lft forever
1: lo    inet6 ::1/128 scope host \\       valid_lft forever preferred_lft forever
2: eth0    inet 10.200.255.254/30 scope global eth0\\       valid_lft forever preferred_lft forever
default via 10.200.255.253 dev eth0 
10.200.255.252/30 dev eth0 proto kernel scope link src 10.200.255.254 
";

    fn expected() -> Expected<'static> {
        Expected {
            ns_if: "eth0",
            ns_ip: Ipv4Addr::new(10, 200, 255, 254),
            host_ip: Ipv4Addr::new(10, 200, 255, 253),
            subnet: Ipv4Addr::new(10, 200, 255, 252),
            prefix_len: 30,
            host_ifindex: 35,
        }
    }

    #[test]
    fn a_fresh_namespace_has_no_drift() {
        assert_eq!(drift(GOOD, &expected()), Vec::<String>::new());
        let no_ipv6 = GOOD.lines().filter(|l| !l.contains("inet6")).collect::<Vec<_>>().join("\n");
        assert_eq!(drift(&no_ipv6, &expected()), Vec::<String>::new());
    }

    #[test]
    fn each_kind_of_drift_is_named() {
        let extras = [
            (
                "extra address",
                "2: eth0    inet 10.9.9.9/24 scope global eth0",
                "unexpected address eth0 inet 10.9.9.9/24",
            ),
            ("ipv6 address", "2: eth0    inet6 fe80::1/64 scope link", "unexpected address eth0 inet6 fe80::1/64"),
            (
                "extra route",
                "10.9.0.0/16 via 10.200.255.253 dev eth0",
                "unexpected route 10.9.0.0/16 via 10.200.255.253 dev eth0",
            ),
            ("extra link", "3: dummy0: <BROADCAST,NOARP> mtu 1500", "unexpected interface dummy0"),
        ];
        for (what, extra, want) in extras {
            let d = drift(&format!("{GOOD}{extra}\n"), &expected());
            assert_eq!(d, [want.to_string()], "{what}");
        }
        let swapped = GOOD.replace("inet 10.200.255.254/30", "inet 10.200.255.250/30");
        let d = drift(&swapped, &expected());
        assert!(d.contains(&"unexpected address eth0 inet 10.200.255.250/30".to_string()), "{d:?}");
        assert!(d.contains(&"missing address eth0 inet 10.200.255.254/30".to_string()), "{d:?}");
        let down = GOOD.replace("<BROADCAST,MULTICAST,UP,LOWER_UP>", "<BROADCAST,MULTICAST>");
        assert_eq!(drift(&down, &expected()), ["eth0 is down", "eth0 has no carrier (host side down?)"]);
        let no_default = GOOD.replace("default via 10.200.255.253 dev eth0 \n", "");
        assert_eq!(drift(&no_default, &expected()), ["missing route default via 10.200.255.253 dev eth0"]);
        let other_peer = Expected { host_ifindex: 36, ..expected() };
        assert_eq!(drift(GOOD, &other_peer), ["eth0's peer is ifindex Some(35), not the host veth's 36"]);
    }
}
