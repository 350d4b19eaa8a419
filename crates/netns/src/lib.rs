//! Per-container network namespaces joined to the host through a veth pair,
//! for functions whose network mode is isolated. runc joins a namespace made
//! here through `{"type": "network", "path": <Net::path>}`.
//!
//! Containers are made ahead of time in an isolation pool (Nuka §III.A), so
//! none of this is on a call's path; it still matters because it bounds how
//! fast the pool refills. The spike (docs/notes/issue4-runc-spike.md §4)
//! took 44 ms per namespace with 9 `ip`/`nft` execs; here it is 2 `ip`
//! execs and a few /proc/sys writes, and no nftables work at all per
//! namespace (see `ruleset.rs`).
//!
//! What a namespace gets, for index i (< NETS_MAX) under prefix p:
//! * netns `stc-p-i`; in it `lo` (up) and `eth0` with 10.200.0.0 + 4i + 2/30
//!   and a default route via the host side; no IPv6 address but lo's ::1;
//! * on the host, veth `st-p-i` with 10.200.0.0 + 4i + 1/30 (`host_ip`).
//!   Connecting to host_ip:P from inside reaches host 127.0.0.1:P (DNAT);
//!   nothing else on the host is reachable, and nothing is forwarded.
//!
//! Architecture invariant: only interfaces named `st-<prefix>-<digits>` and
//! namespaces named `stc-<prefix>-<digits>` are ever changed or removed; the
//! machine is shared, and no global sysctl (ip_forward) is touched.
//!
//! Needs root and the Debian packages iproute2 and nftables.
//!
//! [`testbed`] is the other use of namespaces here: test hosts standing
//! for the servers of a cluster.

#![forbid(unsafe_code)]

mod drift;
mod error;
mod exec;
mod host;
mod naming;
mod ruleset;
pub mod testbed;

pub use error::{Error, Result};
pub use naming::{NETS_MAX, NS_IF, PREFIX_LEN_MAX, SUBNET_PREFIX_LEN};

/// Whether `prefix` is one [`Networks::new`] accepts.
pub fn valid_prefix(prefix: &str) -> bool {
    naming::validate_prefix(prefix).is_ok()
}

use std::fs;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

/// One network namespace made by [`Networks::create`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Net {
    /// The netns name, `stc-<prefix>-<index>`.
    pub name: String,
    /// Its bind mount, for runc's `namespaces[].path`.
    pub path: PathBuf,
    /// The host-side veth, `st-<prefix>-<index>`.
    pub host_if: String,
    /// The host side's address: give it to the function as STACCATO_HOST_IP;
    /// host_ip:P reaches the host's 127.0.0.1:P.
    pub host_ip: Ipv4Addr,
    /// The address of [`NS_IF`] inside the namespace.
    pub ns_ip: Ipv4Addr,
    pub index: u32,
}

/// The namespaces of one prefix. Methods take `&self` and may run on
/// several threads at once for different indexes, except `cleanup`, which
/// must not overlap `create` (it removes the nft table `create` relies on).
///
/// An engine starts with `Networks::new(p)?` then `cleanup()` to remove a
/// crashed predecessor's leftovers; the next `create` puts the table back.
#[derive(Debug)]
pub struct Networks {
    prefix: String,
    table: String,
    ip: PathBuf,
    nft: PathBuf,
    /// Whether to keep IPv6 off the veths; a kernel without IPv6 rejects
    /// the commands that do so.
    ipv6: bool,
    /// Host loopback ports reachable at host_ip; None means all.
    ports: Option<Vec<u16>>,
    /// Whether our nft table is in place: `cleanup` removes it and the next
    /// `create` restores it, so a `Networks` stays usable after a cleanup.
    table_installed: Mutex<bool>,
}

impl Networks {
    /// Checks that `ip` and `nft` exist and (re)installs this prefix's nft
    /// table. `prefix` is 1 to 6 characters of [a-z0-9]; engines or tests
    /// sharing a machine need distinct prefixes *and* distinct indexes (the
    /// address block is shared; `create` refuses an index whose /30 is
    /// already routed elsewhere).
    ///
    /// Every port of host loopback is reachable at host_ip, including the
    /// engine's own loopback listeners; [`Networks::with_ports`] narrows it.
    pub fn new(prefix: &str) -> Result<Networks> {
        Networks::make(prefix, None)
    }

    /// Like [`Networks::new`], but host_ip:P reaches 127.0.0.1:P only for
    /// TCP and UDP ports in `ports` (e.g. 6379 and 5432); other packets are
    /// dropped. An empty list cuts the namespaces off the host entirely.
    pub fn with_ports(prefix: &str, ports: &[u16]) -> Result<Networks> {
        Networks::make(prefix, Some(ports.to_vec()))
    }

    fn make(prefix: &str, ports: Option<Vec<u16>>) -> Result<Networks> {
        naming::validate_prefix(prefix)?;
        let nets = Networks {
            prefix: prefix.to_string(),
            table: naming::table_name(prefix),
            ip: exec::find_tool("ip", "iproute2")?,
            nft: exec::find_tool("nft", "nftables")?,
            ipv6: host::ipv6_present(),
            ports,
            table_installed: Mutex::new(false),
        };
        // Always rewritten, never trusted as found: a crashed or older
        // engine may have left a table with other rules.
        nets.ensure_table()?;
        Ok(nets)
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The nft table (family inet) holding this prefix's rules.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The names and addresses of `index`, without creating anything.
    pub fn net_at(&self, index: u32) -> Result<Net> {
        naming::validate_index(index)?;
        let name = naming::netns_name(&self.prefix, index);
        let (_, host_ip, ns_ip) = naming::addresses(index);
        Ok(Net {
            path: Path::new(naming::NETNS_DIR).join(&name),
            name,
            host_if: naming::host_if(&self.prefix, index),
            host_ip,
            ns_ip,
            index,
        })
    }

    /// Makes namespace `index`: about 5–10 ms, two `ip` execs. Fails, and
    /// leaves nothing behind, if any part of it already exists.
    pub fn create(&self, index: u32) -> Result<Net> {
        let net = self.net_at(index)?;
        self.ensure_table()?;
        let stale = self.remnants(&net);
        if !stale.is_empty() {
            return Err(Error::Exists(stale));
        }
        self.refuse_conflicts(&net)?;
        if let Err(e) = self.build(&net) {
            return Err(match self.remove(&net) {
                Ok(()) => e,
                Err(r) => Error::UndoFailed { first: Box::new(e), name: net.name.clone(), undo: Box::new(r) },
            });
        }
        Ok(net)
    }

    /// Removes the namespace and its veth pair (there are no per-namespace
    /// nft rules). Idempotent. A process still inside the namespace keeps
    /// it alive, unnamed and unreachable, until it exits.
    ///
    /// Takes 15–40 ms, nearly all of it the kernel unregistering the veth
    /// (RCU grace periods), so call it from a background thread.
    pub fn destroy(&self, net: &Net) -> Result<()> {
        self.ours(net)?;
        self.remove(net)
    }

    /// Verifies that the namespace still holds exactly lo and its veth end,
    /// with the original addresses and routes, and that the host side is
    /// intact. One `ip` exec. Err lists every difference found.
    pub fn check(&self, net: &Net) -> Result<()> {
        self.ours(net)?;
        let mut found = self.host_side_drift(net);
        if found.is_empty() {
            let out = self.ip(&["-o", "-n", &net.name], "link show\naddr show\nroute show\n")?;
            let (subnet, _, _) = naming::addresses(net.index);
            let expected = drift::Expected {
                ns_if: NS_IF,
                ns_ip: net.ns_ip,
                host_ip: net.host_ip,
                subnet,
                prefix_len: SUBNET_PREFIX_LEN,
                host_ifindex: host::ifindex(&net.host_if)?,
            };
            found = drift::drift(&out, &expected);
        }
        if found.is_empty() {
            return Ok(());
        }
        Err(Error::Drifted { name: net.name.clone(), found })
    }

    /// Removes every namespace, veth and the nft table of this prefix,
    /// whoever made them (a crashed engine's too). Err lists what remains.
    pub fn cleanup(&self) -> Result<()> {
        let netns_lead = naming::netns_lead(&self.prefix);
        let if_lead = naming::host_if_lead(&self.prefix);
        let find = || -> Result<(Vec<String>, Vec<String>)> {
            let namespaces = match fs::read_dir(naming::NETNS_DIR) {
                Ok(dir) => dir.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect(),
                // No directory: `ip netns add` has never run here.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
                Err(e) => return Err(Error::Io { what: format!("listing {}", naming::NETNS_DIR), error: e }),
            };
            let namespaces = namespaces.into_iter().filter(|n| naming::index_in(n, &netns_lead).is_some()).collect();
            let links = host::interfaces()?.into_iter().filter(|n| naming::index_in(n, &if_lead).is_some()).collect();
            Ok((namespaces, links))
        };
        let (namespaces, links) = find()?;
        let mut ip_error = None;
        if !namespaces.is_empty() || !links.is_empty() {
            // Links first: deleting a veth is synchronous, while a deleted
            // namespace takes its veth down later, from a kernel worker.
            let input: String = links
                .iter()
                .map(|l| format!("link del {l}\n"))
                .chain(namespaces.iter().map(|n| format!("netns del {n}\n")))
                .collect();
            // -force: one end of a stale pair vanishes with the other, and
            // its own delete failing must not stop the batch. Such errors
            // matter only if something is left, which is checked below.
            ip_error = self.ip(&["-force"], &input).err();
        }
        let mut installed = self.table_installed.lock().unwrap_or_else(PoisonError::into_inner);
        exec::run(&self.nft, &["-f", "-"], &ruleset::remove(&self.table))?;
        *installed = false;
        drop(installed);
        let (namespaces, links) = find()?;
        if namespaces.is_empty() && links.is_empty() {
            return Ok(());
        }
        let left: Vec<String> = namespaces.into_iter().chain(links).collect();
        Err(Error::Leftovers { prefix: self.prefix.clone(), left, cause: ip_error.map(Box::new) })
    }

    fn ensure_table(&self) -> Result<()> {
        let mut installed = self.table_installed.lock().unwrap_or_else(PoisonError::into_inner);
        if !*installed {
            let rules = ruleset::install(&self.table, &naming::host_if_lead(&self.prefix), self.ports.as_deref());
            exec::run(&self.nft, &["-f", "-"], &rules)?;
            *installed = true;
        }
        Ok(())
    }

    /// Runs one `ip` batch: each line of `input` is an `ip` command.
    fn ip(&self, options: &[&str], input: &str) -> Result<String> {
        let args: Vec<&str> = options.iter().copied().chain(["-batch", "-"]).collect();
        exec::run(&self.ip, &args, input)
    }

    /// Refuses a `Net` this `Networks` would not have made, so destroy and
    /// check never act on names outside our prefix.
    fn ours(&self, net: &Net) -> Result<()> {
        match self.net_at(net.index) {
            Ok(mine) if mine == *net => Ok(()),
            _ => Err(Error::NotOurs { name: net.name.clone(), index: net.index, prefix: self.prefix.clone() }),
        }
    }

    /// The parts of `net` that exist now.
    fn remnants(&self, net: &Net) -> Vec<String> {
        let mut found = Vec::new();
        if net.path.exists() {
            found.push(format!("netns {}", net.name));
        }
        if host::interface_exists(&net.host_if) {
            found.push(format!("interface {}", net.host_if));
        }
        found
    }

    fn refuse_conflicts(&self, net: &Net) -> Result<()> {
        let (subnet, _, _) = naming::addresses(net.index);
        let conflicts = host::conflicts(&host::routes()?, subnet, &net.host_if);
        if conflicts.is_empty() {
            return Ok(());
        }
        let routes = conflicts.iter().map(|r| format!("{}/{} dev {}", r.dst, r.prefix_len, r.iface)).collect();
        Err(Error::Routed { subnet, index: net.index, routes })
    }

    /// The steps of `create`; it undoes them all on any error.
    fn build(&self, net: &Net) -> Result<()> {
        self.ip(&[], &self.host_batch(net))?;
        // Again now that our route exists: a concurrent create of the same
        // index under another prefix may have raced past the first check.
        self.refuse_conflicts(net)?;
        self.set_host_sysctls(net)?;
        self.ip(&["-n", &net.name], &self.ns_batch(net))?;
        Ok(())
    }

    /// The namespace and the pair are made in one step (the peer is created
    /// directly inside the namespace, never visible on the host), and
    /// addrgenmode none keeps IPv6 link-local addresses off both ends, so
    /// no IPv6 address can carry traffic between them.
    fn host_batch(&self, net: &Net) -> String {
        let (name, host_if) = (&net.name, &net.host_if);
        let mut b = format!("netns add {name}\nlink add {host_if} type veth peer name {NS_IF} netns {name}\n");
        if self.ipv6 {
            b += &format!("link set {host_if} addrgenmode none\n");
        }
        b += &format!("addr add {}/{SUBNET_PREFIX_LEN} dev {host_if}\nlink set {host_if} up\n", net.host_ip);
        b
    }

    fn ns_batch(&self, net: &Net) -> String {
        let mut b = String::from("link set lo up\n");
        if self.ipv6 {
            b += &format!("link set {NS_IF} addrgenmode none\n");
        }
        b += &format!("addr add {}/{SUBNET_PREFIX_LEN} dev {NS_IF}\n", net.ns_ip);
        b += &format!("link set {NS_IF} up\nroute add default via {} dev {NS_IF}\n", net.host_ip);
        b
    }

    /// Written straight to /proc/sys, for our interface only:
    /// * route_localnet: the DNAT rewrites the destination to 127.0.0.1,
    ///   which the kernel otherwise drops as a martian on a non-loopback
    ///   interface;
    /// * arp_ignore 1: answer ARP only for host_ip, so the namespace cannot
    ///   probe which other addresses the host has;
    /// * arp_announce 2: ARP requests on this link always carry host_ip as
    ///   sender, never another host address the namespace should not learn;
    /// * disable_ipv6: the host side drops any IPv6 packet the namespace
    ///   sends, whatever addresses it gives itself.
    fn set_host_sysctls(&self, net: &Net) -> Result<()> {
        let h = &net.host_if;
        host::set_sysctl("ipv4", h, "route_localnet", "1")?;
        host::set_sysctl("ipv4", h, "arp_ignore", "1")?;
        host::set_sysctl("ipv4", h, "arp_announce", "2")?;
        if self.ipv6 {
            host::set_sysctl("ipv6", h, "disable_ipv6", "1")?;
        }
        Ok(())
    }

    /// Host-side checks that need no exec.
    fn host_side_drift(&self, net: &Net) -> Vec<String> {
        let h = &net.host_if;
        if !host::interface_exists(h) {
            return vec![format!("host interface {h} is gone")];
        }
        let mut found = Vec::new();
        match host::get_sysctl("ipv4", h, "route_localnet") {
            Ok(v) if v == "1" => {}
            Ok(v) => found.push(format!("{h} route_localnet is {v}, not 1")),
            Err(e) => found.push(e.to_string()),
        }
        let (subnet, _, _) = naming::addresses(net.index);
        match host::routes() {
            Err(e) => found.push(e.to_string()),
            Ok(routes) => {
                let own = host::Route { iface: h.clone(), dst: subnet, prefix_len: SUBNET_PREFIX_LEN };
                if !routes.contains(&own) {
                    found
                        .push(format!("no route {subnet}/{SUBNET_PREFIX_LEN} dev {h} (host side down or readdressed)"));
                }
                for r in host::conflicts(&routes, subnet, h) {
                    found.push(format!("{}/{} is also routed to {}", r.dst, r.prefix_len, r.iface));
                }
            }
        }
        found
    }

    /// Deletes what exists of `net`, then reports what still does. Skips
    /// the exec when nothing is left, so destroy is idempotent and cheap.
    fn remove(&self, net: &Net) -> Result<()> {
        let mut input = String::new();
        // The link first: see cleanup.
        if host::interface_exists(&net.host_if) {
            input += &format!("link del {}\n", net.host_if);
        }
        if net.path.exists() {
            input += &format!("netns del {}\n", net.name);
        }
        if input.is_empty() {
            return Ok(());
        }
        let result = self.ip(&["-force"], &input);
        let left = self.remnants(net);
        match (left.is_empty(), result) {
            (true, _) => Ok(()),
            (false, result) => Err(Error::Remains { left, cause: result.err().map(Box::new) }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn networks(ipv6: bool) -> Networks {
        Networks {
            prefix: "ab".into(),
            table: naming::table_name("ab"),
            ip: "/usr/sbin/ip".into(),
            nft: "/usr/sbin/nft".into(),
            ipv6,
            ports: None,
            table_installed: Mutex::new(true),
        }
    }

    #[test]
    fn net_at_names_and_addresses() {
        let net = networks(true).net_at(65).unwrap();
        assert_eq!(net.name, "stc-ab-65");
        assert_eq!(net.path, Path::new("/run/netns/stc-ab-65"));
        assert_eq!(net.host_if, "st-ab-65");
        assert_eq!(net.host_ip, Ipv4Addr::new(10, 200, 1, 5));
        assert_eq!(net.ns_ip, Ipv4Addr::new(10, 200, 1, 6));
        assert!(networks(true).net_at(NETS_MAX).is_err());
    }

    #[test]
    fn batches() {
        let n = networks(true);
        let net = n.net_at(1).unwrap();
        assert_eq!(
            n.host_batch(&net),
            "netns add stc-ab-1\nlink add st-ab-1 type veth peer name eth0 netns stc-ab-1\n\
             link set st-ab-1 addrgenmode none\naddr add 10.200.0.5/30 dev st-ab-1\nlink set st-ab-1 up\n"
        );
        assert_eq!(
            n.ns_batch(&net),
            "link set lo up\nlink set eth0 addrgenmode none\naddr add 10.200.0.6/30 dev eth0\n\
             link set eth0 up\nroute add default via 10.200.0.5 dev eth0\n"
        );
        assert!(!networks(false).ns_batch(&net).contains("addrgenmode"));
    }

    #[test]
    fn foreign_nets_are_refused() {
        let n = networks(true);
        let mut net = n.net_at(3).unwrap();
        assert!(n.ours(&net).is_ok());
        net.host_if = "eth0".into();
        assert!(n.ours(&net).is_err());
        let other = Networks { prefix: "cd".into(), ..networks(true) };
        assert!(other.ours(&n.net_at(3).unwrap()).is_err());
    }
}
