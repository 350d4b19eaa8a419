//! Function containers (Nuka §III.A on top of runc): an isolation pool of
//! pre-made containers, each with its namespaces, cgroups and (optionally)
//! network namespace ready, given to functions by mounting their files in
//! and adjusting their cgroup limits, paused and resumed with the cgroup
//! freezer, cleaned and reused when returned.
//!
//! Nothing here is on a call's path except `Container::thaw`.

mod build;
mod bundle;
pub mod cgroup;
mod container;
mod error;
pub mod logs;
mod pool;
pub mod proxy;
mod sweep;

pub use build::{BuildConfig, BuildError, Builder, Finished, Job, BUILD_TMP};
pub use container::Container;
pub use error::{Error, Result};
pub use pool::{Pool, PoolStats};
use std::path::{Path, PathBuf};
pub use sweep::{
    claim, claim_uids, sweep_dead_engines, Claim, UidRange, BUILD_UIDS, UID_FIRST, UID_RANGES, UID_RANGE_LEN,
};

/// How a function container reaches the network.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Network {
    /// The host's network namespace: fastest, no network isolation.
    Host,
    /// A network namespace per container, joined to the host by a veth pair
    /// (see the netns crate); the host's loopback services are reachable at
    /// `STACCATO_HOST_IP`.
    Isolated,
}

impl Network {
    pub fn name(self) -> &'static str {
        match self {
            Network::Host => "host",
            Network::Isolated => "isolated",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    pub memory_bytes: u64,
    pub pids: u32,
    /// None: the container's processes run in the engine's own CPU group
    /// on cgroup v1 (see [`shared_cpu_group`]), at the default weight in
    /// their own on v2; Some: a CPU group of their own with this weight
    /// (cpu.shares; cpu.weight on v2, converted).
    pub cpu_shares: Option<u32>,
}

#[derive(Clone, Debug)]
pub struct Settings {
    /// Bundles, slot FIFOs and runc's state (`<state>/containers`).
    pub dir: PathBuf,
    /// Names this engine's containers, cgroups and namespaces apart from
    /// another engine's on the same machine.
    pub prefix: String,
    pub runc: PathBuf,
    /// The static init (runtimes/container/build/staccato-init).
    pub init: PathBuf,
    /// Read-only binds every container gets: (host path, container path).
    pub binds: Vec<(PathBuf, PathBuf)>,
    pub network: Network,
    /// With an isolated network: the host loopback ports functions may
    /// reach at `STACCATO_HOST_IP` (None: all of them, including the
    /// gateway's and engine's own).
    pub host_ports: Option<Vec<u16>>,
    /// Users are `uid_base + index`: no two containers share one. From a
    /// claimed [`UidRange`] (its `functions_base`), so no two engines'
    /// containers share one either.
    pub uid_base: u32,
    /// Where the container's own tmpfs is mounted (`/tmp` for functions;
    /// builds use another place so host paths under /tmp can be bound).
    pub tmp_dir: PathBuf,
    pub tmp_bytes: u64,
    /// Limits of an idle pooled container.
    pub neutral: Limits,
    /// Containers kept ready.
    pub pool_size: usize,
    /// A warm Python launcher to keep running in pooled containers
    /// (runtimes/python/staccato/warm.py).
    pub warm_python: Option<Command>,
}

/// A program for a container's init to start: argv and environment.
#[derive(Clone, Debug)]
pub struct Command {
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
}

/// A bind mount given to one function.
#[derive(Clone, Debug)]
pub struct Mount {
    pub src: PathBuf,
    pub dst: PathBuf,
    pub read_only: bool,
    /// Writable and executable: only for a build's own output, which its
    /// install scripts may run (other writable binds are noexec).
    pub exec: bool,
}

/// What a function needs from a container.
#[derive(Clone, Debug)]
pub struct Start {
    pub mounts: Vec<Mount>,
    pub limits: Limits,
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: String,
    /// The host file that receives the launcher's stdout and stderr.
    pub log: PathBuf,
    /// A Python launcher: hand it to the container's warm interpreter, if
    /// it has one, instead of starting `argv`.
    pub python: bool,
}

/// Why containers cannot be used here, or None when they can.
pub fn unavailable(runc: &Path, init: &Path) -> Option<String> {
    if sys::process::euid() != 0 {
        return Some("containers need root (runc with cgroup limits)".into());
    }
    if !runc.is_file() {
        return Some(format!("runc not found at {} (Debian package runc)", runc.display()));
    }
    if !init.is_file() {
        return Some(format!("container init not built: {} (run `make build`)", init.display()));
    }
    cgroup::unavailable()
}

/// The first network index of an engine: engines on one machine share the
/// address block, so each starts at its own offset (256 apart) to keep
/// their /30s apart.
pub fn net_base(prefix: &str) -> u32 {
    let h = prefix.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
    (h % 63) as u32 * 256
}

/// The CPU cgroup an engine and its functions' containers share (cgroup
/// v1 only; see [`cgroup::shared_cpu_group`]).
pub fn shared_cpu_group(prefix: &str) -> Option<PathBuf> {
    cgroup::shared_cpu_group(prefix)
}

/// Finds `name` on PATH.
pub fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?.to_str()?.split(':').map(|d| Path::new(d).join(name)).find(|p| p.is_file())
}
