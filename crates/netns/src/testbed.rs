//! Test hosts: N network namespaces standing for N servers, joined by a
//! bridge in a switch namespace of their own, for cluster tests and demos
//! on one machine. The host's own network namespace is never touched: no
//! interface, address or route is added to it, so test traffic between the
//! "servers" cannot leave them.
//!
//! For prefix p (as [`crate::Networks`] takes) and n hosts:
//! * `stb-p-sw`: the switch, holding bridge `br0` and one veth end `h<i>`
//!   per host, enslaved to it;
//! * `stb-p-<i>`, i < n: host i, holding `lo` and `eth0` (the other end of
//!   `h<i>`) with [`host_addr`]`(i)`/24.
//!
//! A host's "cable" is its `eth0`: [`Testbed::set_link`] takes it down and
//! up, as pulling a server's cable would. Processes run in a host through
//! [`Testbed::command`] (`nsenter --net`: only the network namespace
//! changes, unlike `ip netns exec`, which also remounts /sys and so hides
//! the cgroup hierarchy an engine's containers need); loopback in each host
//! is its own.
//!
//! Architecture invariant: only namespaces named `stb-<prefix>-sw` and
//! `stb-<prefix>-<digits>` are made or removed here.

use crate::exec;
use crate::naming;
use crate::{Error, Result};
use std::fs;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::Command;

/// Hosts in one testbed at most: one /24, less the network and broadcast
/// addresses.
pub const HOSTS_MAX: u32 = 253;

/// The address of host `index` on the testbed's network, 10.210.0.0/24.
/// Every testbed has the same addresses: each lives in its own namespaces,
/// so two never meet.
pub fn host_addr(index: u32) -> Ipv4Addr {
    Ipv4Addr::new(10, 210, 0, (index + 1) as u8)
}

/// One test host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TestHost {
    pub index: u32,
    /// Its network namespace, `stb-<prefix>-<index>`.
    pub netns: String,
    pub addr: Ipv4Addr,
}

/// A set of test hosts. Dropping it removes them (and the switch); a
/// process still inside a host keeps that namespace alive, unnamed and cut
/// off, until it exits, so stop them first.
#[derive(Debug)]
pub struct Testbed {
    prefix: String,
    ip: PathBuf,
    hosts: Vec<TestHost>,
    /// Made by this value (removed on drop), or found by [`Testbed::existing`].
    owned: bool,
}

impl Testbed {
    /// Makes `n` hosts (1 to [`HOSTS_MAX`]) under `prefix`, first removing
    /// any a crashed run left under the same prefix.
    pub fn create(prefix: &str, n: u32) -> Result<Testbed> {
        naming::validate_prefix(prefix)?;
        if n == 0 || n > HOSTS_MAX {
            return Err(Error::HostCount(n));
        }
        let ip = exec::find_tool("ip", "iproute2")?;
        let hosts = (0..n).map(|i| TestHost { index: i, netns: host_netns(prefix, i), addr: host_addr(i) }).collect();
        let bed = Testbed { prefix: prefix.to_string(), ip, hosts, owned: true };
        bed.remove_all()?;
        if let Err(e) = bed.build() {
            return Err(match bed.remove_all() {
                Ok(()) => e,
                Err(undo) => Error::UndoFailed { first: Box::new(e), name: switch_netns(prefix), undo: Box::new(undo) },
            });
        }
        Ok(bed)
    }

    /// The testbed another process made under `prefix`, to run commands in
    /// its hosts or pull their cables; dropping it leaves the hosts
    /// ([`Testbed::destroy`] removes them).
    pub fn existing(prefix: &str) -> Result<Testbed> {
        naming::validate_prefix(prefix)?;
        let ip = exec::find_tool("ip", "iproute2")?;
        let lead = format!("stb-{prefix}-");
        let found = testbed_namespaces(prefix)?;
        let mut indices: Vec<u32> = found.iter().filter_map(|n| naming::index_in(n, &lead)).collect();
        indices.sort_unstable();
        if indices.is_empty() || indices.iter().enumerate().any(|(i, &x)| i as u32 != x) {
            return Err(Error::NoTestbed { prefix: prefix.to_string(), found });
        }
        let hosts =
            indices.into_iter().map(|i| TestHost { index: i, netns: host_netns(prefix, i), addr: host_addr(i) });
        Ok(Testbed { prefix: prefix.to_string(), ip, hosts: hosts.collect(), owned: false })
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    pub fn hosts(&self) -> &[TestHost] {
        &self.hosts
    }

    pub fn host(&self, index: u32) -> &TestHost {
        &self.hosts[index as usize]
    }

    /// `program` to be run inside host `index`: `nsenter` moves into its
    /// network namespace and execs it, so the child's pid is the program's.
    pub fn command(&self, index: u32, program: &str) -> Command {
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net={}", self.host(index).path().display())).arg("--").arg(program);
        cmd
    }

    /// Every process whose network namespace is host `index`'s (or the
    /// switch's, for `None`) — those a test started there.
    pub fn pids(&self, index: Option<u32>) -> Result<Vec<u32>> {
        let ns = index.map_or_else(|| switch_netns(&self.prefix), |i| self.host(i).netns.clone());
        let out = exec::run(&self.ip, &["netns", "pids", &ns], "")?;
        Ok(out.split_whitespace().filter_map(|p| p.parse().ok()).collect())
    }

    /// Plugs host `index`'s cable in (`up`) or pulls it out.
    pub fn set_link(&self, index: u32, up: bool) -> Result<()> {
        let state = if up { "up" } else { "down" };
        let args = ["-n", self.host(index).netns.as_str(), "-batch", "-"];
        exec::run(&self.ip, &args, &format!("link set eth0 {state}\n")).map(drop)
    }

    /// Removes every host and the switch now (Drop does it too, for a
    /// testbed this value made).
    pub fn destroy(mut self) -> Result<()> {
        self.owned = false;
        self.remove_all()
    }

    /// The switch and its bridge first, then each host's end of its cable.
    fn build(&self) -> Result<()> {
        let sw = switch_netns(&self.prefix);
        let mut root = format!("netns add {sw}\n");
        for h in &self.hosts {
            root += &format!("netns add {}\n", h.netns);
        }
        exec::run(&self.ip, &["-batch", "-"], &root)?;
        // Each pair is made inside the switch with its peer created straight
        // in the host's namespace: it never exists in ours.
        let mut switch = String::from("link set lo up\nlink add br0 type bridge\nlink set br0 up\n");
        for h in &self.hosts {
            let port = format!("h{}", h.index);
            switch += &format!("link add {port} type veth peer name eth0 netns {}\n", h.netns);
            switch += &format!("link set {port} master br0\nlink set {port} up\n");
        }
        exec::run(&self.ip, &["-n", &sw, "-batch", "-"], &switch)?;
        for h in &self.hosts {
            let batch = format!("link set lo up\naddr add {}/24 dev eth0\nlink set eth0 up\n", h.addr);
            exec::run(&self.ip, &["-n", &h.netns, "-batch", "-"], &batch)?;
        }
        Ok(())
    }

    /// Deletes every `stb-<prefix>-*` namespace that exists (ours, or a
    /// crashed run's), then checks none is left.
    fn remove_all(&self) -> Result<()> {
        let found = testbed_namespaces(&self.prefix)?;
        if found.is_empty() {
            return Ok(());
        }
        let batch: String = found.iter().map(|n| format!("netns del {n}\n")).collect();
        let result = exec::run(&self.ip, &["-force", "-batch", "-"], &batch);
        let left = testbed_namespaces(&self.prefix)?;
        if left.is_empty() {
            return Ok(());
        }
        Err(Error::Remains { left, cause: result.err().map(Box::new) })
    }
}

impl Drop for Testbed {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        if let Err(e) = self.remove_all() {
            // Drop cannot fail; the next `create` with this prefix retries.
            eprintln!("removing testbed {}: {e}", self.prefix);
        }
    }
}

impl TestHost {
    /// Where its namespace is bound: what `setns` and `nsenter` open.
    pub fn path(&self) -> PathBuf {
        std::path::Path::new(naming::NETNS_DIR).join(&self.netns)
    }
}

fn switch_netns(prefix: &str) -> String {
    format!("stb-{prefix}-sw")
}

fn host_netns(prefix: &str, index: u32) -> String {
    format!("stb-{prefix}-{index}")
}

/// The testbed namespaces of `prefix` that exist now. Names of other
/// prefixes never match: a prefix has no '-', which ends it.
fn testbed_namespaces(prefix: &str) -> Result<Vec<String>> {
    let lead = format!("stb-{prefix}-");
    let names: Vec<String> = match fs::read_dir(naming::NETNS_DIR) {
        Ok(dir) => dir.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(Error::Io { what: format!("listing {}", naming::NETNS_DIR), error: e }),
    };
    Ok(names.into_iter().filter(|n| n == &switch_netns(prefix) || naming::index_in(n, &lead).is_some()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_addresses() {
        assert_eq!(host_netns("ab", 2), "stb-ab-2");
        assert_eq!(switch_netns("ab"), "stb-ab-sw");
        assert_eq!(host_addr(0), Ipv4Addr::new(10, 210, 0, 1));
        assert_eq!(host_addr(HOSTS_MAX - 1), Ipv4Addr::new(10, 210, 0, 253));
        assert!(Testbed::create("ab", 0).is_err());
        assert!(Testbed::create("ab", HOSTS_MAX + 1).is_err());
        assert!(Testbed::create("a-b", 1).is_err());
    }
}
