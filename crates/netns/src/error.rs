//! What can go wrong making, checking or removing namespaces.

use std::io;
use std::net::Ipv4Addr;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "network prefix {0:?} must be 1 to {max} characters of [a-z0-9] \
         (it becomes part of 15-byte interface names)",
        max = crate::PREFIX_LEN_MAX
    )]
    BadPrefix(String),
    #[error("network index {0} out of range: 10.200.0.0/16 holds {max} /30 subnets", max = crate::NETS_MAX)]
    IndexOutOfRange(u32),
    #[error("a testbed has 1 to {max} hosts, not {0}", max = crate::testbed::HOSTS_MAX)]
    HostCount(u32),
    #[error("no testbed {prefix:?} exists (found namespaces {found:?}): make one first")]
    NoTestbed { prefix: String, found: Vec<String> },
    #[error("`{tool}` not found in PATH or /usr/sbin: install the Debian package {package}")]
    ToolMissing { tool: String, package: String },
    /// Reading or writing /proc, /sys or /run/netns.
    #[error("{what}: {error}")]
    Io { what: String, error: io::Error },
    /// `ip` or `nft` could not run, or exited non-zero: the command, and
    /// why (exit status, stderr and the numbered batch input).
    #[error("{command} {detail}")]
    Command { command: String, detail: String },
    #[error("{} already exist(s): in use, or left by a crashed engine (cleanup() removes it)", .0.join(" and "))]
    Exists(Vec<String>),
    #[error(
        "{subnet}/{len} of index {index} is already routed ({}): another engine or test uses this index",
        routes.join(", "), len = crate::SUBNET_PREFIX_LEN
    )]
    Routed { subnet: Ipv4Addr, index: u32, routes: Vec<String> },
    #[error("{name} (index {index}) was not made by the networks of prefix {prefix}")]
    NotOurs { name: String, index: u32, prefix: String },
    #[error("network namespace {name} drifted: {}", found.join("; "))]
    Drifted { name: String, found: Vec<String> },
    /// Part of a namespace outlived its removal; `cause` is `ip`'s error,
    /// or None when `ip` reported success.
    #[error("{} still exist(s){}", left.join(" and "), cause.as_ref().map_or(" after `ip` reported success".to_string(), |c| format!(": {c}")))]
    Remains { left: Vec<String>, cause: Option<Box<Error>> },
    #[error("{first}; then removing the partial {name} failed too: {undo}")]
    UndoFailed { first: Box<Error>, name: String, undo: Box<Error> },
    #[error("cleanup of prefix {prefix} left [{}]: {}", left.join(", "), cause.as_ref().map_or(String::new(), ToString::to_string))]
    Leftovers { prefix: String, left: Vec<String>, cause: Option<Box<Error>> },
}

impl Error {
    pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(io::Error) -> Error {
        let what = what.into();
        move |error| Error::Io { what, error }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
