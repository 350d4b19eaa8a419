//! What the host side needs without an exec: reading the main routing table
//! and the interface list from /proc, and writing per-interface sysctls
//! straight to /proc/sys (the `sysctl` binary would cost an exec each).
//!
//! /proc/net and /proc/sys/net show the network namespace of the calling
//! process, which is the host's (the engine's); /sys/class/net would show
//! the namespace sysfs was mounted from, so it is used only for ifindex.

use crate::naming::mask;
use crate::{Error, Result};
use std::fs;
use std::net::Ipv4Addr;
use std::path::Path;

/// One row of the main routing table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Route {
    pub iface: String,
    pub dst: Ipv4Addr,
    pub prefix_len: u8,
}

pub(crate) fn routes() -> Result<Vec<Route>> {
    let text = fs::read_to_string("/proc/net/route").map_err(Error::io("reading /proc/net/route"))?;
    Ok(parse_routes(&text))
}

/// /proc/net/route prints each address as the raw in-memory __be32 with
/// %08X, so the hex number's native-endian bytes are the address octets.
pub(crate) fn parse_routes(text: &str) -> Vec<Route> {
    let addr = |hex: &str| u32::from_str_radix(hex, 16).ok().map(|v| Ipv4Addr::from(v.to_ne_bytes()));
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (iface, dst, m) = (f.first()?, addr(f.get(1)?)?, addr(f.get(7)?)?);
            Some(Route { iface: iface.to_string(), dst, prefix_len: u32::from(m).count_ones() as u8 })
        })
        .collect()
}

/// Routes on other interfaces that overlap `subnet`/30 and are /16 or
/// narrower. Two interfaces holding the same /30 (another engine or test
/// using the same index under another prefix) would silently misroute, so
/// create() refuses. Broader routes (a 10.0.0.0/8 towards a VPC) only lose
/// this /30 to the more specific connected route, which is inherent in using
/// 10.200.0.0/16 and not worth refusing every create for.
pub(crate) fn conflicts(routes: &[Route], subnet: Ipv4Addr, own_if: &str) -> Vec<Route> {
    routes
        .iter()
        .filter(|r| r.iface != own_if && r.prefix_len >= 16)
        .filter(|r| {
            let m = mask(r.prefix_len.min(30));
            u32::from(r.dst) & m == u32::from(subnet) & m
        })
        .cloned()
        .collect()
}

/// Names of the host's interfaces, from /proc/net/dev ("  name: counters…").
pub(crate) fn interfaces() -> Result<Vec<String>> {
    let text = fs::read_to_string("/proc/net/dev").map_err(Error::io("reading /proc/net/dev"))?;
    Ok(text.lines().skip(2).filter_map(|l| l.split_once(':').map(|(name, _)| name.trim().to_string())).collect())
}

/// A stat instead of reading the whole interface list: every interface has
/// an IPv4 conf directory as long as it exists.
pub(crate) fn interface_exists(name: &str) -> bool {
    Path::new("/proc/sys/net/ipv4/conf").join(name).exists()
}

pub(crate) fn ifindex(name: &str) -> Result<u32> {
    let path = Path::new("/sys/class/net").join(name).join("ifindex");
    let text = fs::read_to_string(&path).map_err(Error::io(format!("reading {}", path.display())))?;
    text.trim().parse().map_err(|e| Error::Io {
        what: format!("{}: {:?}", path.display(), text.trim()),
        error: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
    })
}

pub(crate) fn ipv6_present() -> bool {
    Path::new("/proc/sys/net/ipv6").exists()
}

/// `family` is "ipv4" or "ipv6"; only interfaces we created are passed in.
pub(crate) fn set_sysctl(family: &str, iface: &str, key: &str, value: &str) -> Result<()> {
    let path = sysctl_path(family, iface, key);
    fs::write(&path, value).map_err(Error::io(format!("writing {value} to {path}")))
}

pub(crate) fn get_sysctl(family: &str, iface: &str, key: &str) -> Result<String> {
    let path = sysctl_path(family, iface, key);
    fs::read_to_string(&path).map(|s| s.trim().to_string()).map_err(Error::io(format!("reading {path}")))
}

fn sysctl_path(family: &str, iface: &str, key: &str) -> String {
    format!("/proc/sys/net/{family}/conf/{iface}/{key}")
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
        eth0\t00000000\t010200C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n\
        eth0\t000200C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n\
        st-a-1\t04C80A0A\t00000000\t0001\t0\t0\t0\tFCFFFFFF\t0\t0\t0\n";

    #[cfg(target_endian = "little")]
    #[test]
    fn parses_proc_net_route() {
        let r = parse_routes(SAMPLE);
        assert_eq!(r.len(), 3);
        assert_eq!(r[0], Route { iface: "eth0".into(), dst: Ipv4Addr::UNSPECIFIED, prefix_len: 0 });
        assert_eq!(r[1], Route { iface: "eth0".into(), dst: Ipv4Addr::new(192, 0, 2, 0), prefix_len: 24 });
        assert_eq!(r[2], Route { iface: "st-a-1".into(), dst: Ipv4Addr::new(10, 10, 200, 4), prefix_len: 30 });
    }

    #[test]
    fn conflicts_are_same_or_narrower_overlaps_on_other_interfaces() {
        let route = |iface: &str, dst: [u8; 4], prefix_len| Route { iface: iface.into(), dst: dst.into(), prefix_len };
        let subnet = Ipv4Addr::new(10, 200, 0, 4);
        let table = [
            route("eth0", [0, 0, 0, 0], 0),
            route("eth1", [10, 0, 0, 0], 8),
            route("st-b-1", [10, 200, 0, 4], 30),
            route("st-a-1", [10, 200, 0, 4], 30),
            route("lan", [10, 200, 0, 0], 16),
            route("tun", [10, 200, 0, 6], 32),
            route("st-b-2", [10, 200, 0, 8], 30),
        ];
        let found: Vec<String> = conflicts(&table, subnet, "st-a-1").into_iter().map(|r| r.iface).collect();
        assert_eq!(found, ["st-b-1", "lan", "tun"]);
    }
}
