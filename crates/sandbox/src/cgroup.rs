//! The containers' control groups on either hierarchy the host mounts.
//!
//! * **v1** (this project's development machines: hybrid): one directory
//!   per controller, `/sys/fs/cgroup/<controller>/staccato/<id>`;
//!   `memory.limit_in_bytes` + `memory.memsw.limit_in_bytes`, `pids.max`,
//!   `cpu.shares`, the freezer's `freezer.state`, OOM kills in
//!   `memory.oom_control`.
//! * **v2** (unified; Kubernetes nodes, current distributions): one
//!   directory, `/sys/fs/cgroup/staccato/<id>`; `memory.max` +
//!   `memory.swap.max` 0, `pids.max`, `cpu.weight`, `cgroup.freeze`, OOM
//!   kills in `memory.events`.
//!
//! runc makes each container's group from the bundle (`cgroupsPath`
//! `/staccato/<id>`, same on both); the engine writes limits, freezes and
//! reads counters here without another runc command.
//!
//! One v1 feature has no v2 equivalent: a process is in one group for
//! every controller on v2, so a container cannot be in its own memory
//! group and in the engine's CPU group at once ([`shared_cpu_group`] is
//! None there) and each container is a CPU group of its own.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

const ROOT: &str = "/sys/fs/cgroup";
/// The parent of every container's group, under the root (each controller's
/// root on v1).
const PARENT: &str = "staccato";
/// The v1 controllers a container has a directory in; the others runc
/// makes are removed by the sweep's wider list.
const V1_CONTROLLERS: [&str; 4] = ["memory", "cpu", "pids", "freezer"];
/// The v1 controllers runc may have made a directory in.
const V1_ALL: [&str; 9] = ["memory", "cpu", "pids", "freezer", "cpuacct", "cpuset", "blkio", "devices", "systemd"];
/// The v2 controllers the containers need enabled.
const V2_NEEDED: [&str; 3] = ["memory", "pids", "cpu"];
/// Where the processes of a cgroup namespace's root go on v2 (a
/// Kubernetes pod's engine): a group with processes cannot give
/// controllers to children ("no internal processes").
const V2_ENGINE_LEAF: &str = "staccato-engine";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hierarchy {
    V1,
    V2,
}

/// What this host mounts at /sys/fs/cgroup: v2 when the root is the
/// unified hierarchy itself (it has `cgroup.controllers`), v1 otherwise
/// (a hybrid host's v2 mount at `unified/` holds no controllers).
pub fn hierarchy() -> Hierarchy {
    static H: OnceLock<Hierarchy> = OnceLock::new();
    *H.get_or_init(|| if Path::new(ROOT).join("cgroup.controllers").is_file() { Hierarchy::V2 } else { Hierarchy::V1 })
}

/// Why containers' cgroups cannot be made here, or None when they can.
pub fn unavailable() -> Option<String> {
    match hierarchy() {
        Hierarchy::V1 => V1_CONTROLLERS.iter().find_map(|c| {
            (!Path::new(ROOT).join(c).join("cgroup.procs").is_file())
                .then(|| format!("cgroup v1 controller {c} is not mounted at {ROOT}/{c}"))
        }),
        Hierarchy::V2 => {
            let have = fs::read_to_string(Path::new(ROOT).join("cgroup.controllers")).unwrap_or_default();
            let missing: Vec<&str> =
                V2_NEEDED.iter().copied().filter(|c| !have.split_whitespace().any(|h| h == *c)).collect();
            if !missing.is_empty() {
                return Some(format!(
                    "cgroup v2 controllers {missing:?} are not available at {ROOT} (it has: {have:?})"
                ));
            }
            None
        }
    }
}

/// Makes the parent group ready for containers. On v2 the controllers must
/// be enabled in the root's and the parent's `cgroup.subtree_control`.
/// When the root refuses (EBUSY: it is a cgroup namespace's root with
/// processes in it, as in a Kubernetes pod, and a group with processes
/// cannot hand controllers to children), its processes (this engine and
/// whatever else runs in the pod's container) move into a leaf first.
pub fn prepare() -> io::Result<()> {
    if hierarchy() == Hierarchy::V1 {
        return Ok(());
    }
    let root = Path::new(ROOT);
    let enable = |dir: &Path| -> io::Result<()> {
        let on = fs::read_to_string(dir.join("cgroup.subtree_control"))?;
        let want: Vec<String> =
            V2_NEEDED.iter().filter(|c| !on.split_whitespace().any(|o| o == **c)).map(|c| format!("+{c}")).collect();
        if want.is_empty() {
            return Ok(());
        }
        fs::write(dir.join("cgroup.subtree_control"), want.join(" "))
    };
    match enable(root) {
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
            let leaf = root.join(V2_ENGINE_LEAF);
            fs::create_dir_all(&leaf)?;
            log::info!("cgroup v2: moving the processes of {ROOT} into {} to enable controllers", leaf.display());
            // Processes may start meanwhile (each inherits the root), and
            // the kernel may answer EBUSY for a moment after the last one
            // left: a few tries.
            let mut last = Ok(());
            for _ in 0..50 {
                let procs = fs::read_to_string(root.join("cgroup.procs"))?;
                for pid in procs.split_whitespace() {
                    // One that exited meanwhile is not an error.
                    let _ = fs::write(leaf.join("cgroup.procs"), pid);
                }
                last = enable(root);
                match &last {
                    Err(e) if e.raw_os_error() == Some(libc::EBUSY) => std::thread::sleep(Duration::from_millis(10)),
                    _ => break,
                }
            }
            if let Err(e) = last {
                let left = fs::read_to_string(root.join("cgroup.procs")).unwrap_or_default();
                return Err(io::Error::new(
                    e.kind(),
                    format!(
                        "enabling controllers in {ROOT} after moving its processes to {}: {e} (still there: {})",
                        leaf.display(),
                        left.split_whitespace().collect::<Vec<_>>().join(" ")
                    ),
                ));
            }
        }
        other => other?,
    }
    let parent = root.join(PARENT);
    fs::create_dir_all(&parent)?;
    enable(&parent)
}

/// A container's group (the directories of its controllers).
#[derive(Clone, Debug)]
pub struct Group {
    id: String,
}

fn write(path: &Path, value: &str) -> io::Result<()> {
    fs::write(path, value)
        .map_err(|e| io::Error::new(e.kind(), format!("writing {value:?} to {}: {e}", path.display())))
}

fn read_u64(path: &Path) -> Option<u64> {
    fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// cpu.shares (default 1024) as cgroup v2's cpu.weight (1..10000,
/// default 100), in proportion: 1024 → 100, 512 → 50, so a function that
/// asks for the default share gets the weight of one that asks for none.
/// (runc's own formula maps 1024 to 39; the engine writes the weight after
/// runc made the group, so this one holds.)
pub fn shares_to_weight(shares: u32) -> u32 {
    ((u64::from(shares) * 100 + 512) / 1024).clamp(1, 10_000) as u32
}

impl Group {
    pub fn new(id: &str) -> Group {
        Group { id: id.to_string() }
    }

    fn v1(&self, controller: &str) -> PathBuf {
        Path::new(ROOT).join(controller).join(PARENT).join(&self.id)
    }

    fn v2(&self) -> PathBuf {
        Path::new(ROOT).join(PARENT).join(&self.id)
    }

    /// The file that lists the group's processes.
    fn procs_file(&self) -> PathBuf {
        match hierarchy() {
            Hierarchy::V1 => self.v1("pids").join("cgroup.procs"),
            Hierarchy::V2 => self.v2().join("cgroup.procs"),
        }
    }

    /// The memory limit, swap included (no swap beyond it).
    pub fn set_memory(&self, bytes: u64) -> io::Result<()> {
        let v = bytes.to_string();
        match hierarchy() {
            Hierarchy::V1 => {
                let mem = self.v1("memory");
                let (limit, memsw) = (mem.join("memory.limit_in_bytes"), mem.join("memory.memsw.limit_in_bytes"));
                let current = read_u64(&limit).unwrap_or(u64::MAX);
                // memsw must never be below the plain limit: raise it first
                // when growing, lower it last when shrinking.
                if bytes >= current {
                    write(&memsw, &v)?;
                    write(&limit, &v)
                } else {
                    write(&limit, &v)?;
                    write(&memsw, &v)
                }
            }
            Hierarchy::V2 => {
                let g = self.v2();
                // v1 reclaims down to a lower limit and refuses it (EBUSY,
                // and the container is destroyed) when it cannot; v2 would
                // take it and let the OOM killer make room, killing the
                // container's init or a warm interpreter behind the
                // caller's back. So: reclaim (page cache, mostly), then
                // refuse what is still above the limit.
                let current = || read_u64(&g.join("memory.current"));
                if let Some(used) = current().filter(|u| *u > bytes) {
                    let _ = fs::write(g.join("memory.reclaim"), (used - bytes).to_string());
                }
                if let Some(used) = current() {
                    if bytes < used {
                        return Err(io::Error::new(
                            io::ErrorKind::ResourceBusy,
                            format!("the memory limit {bytes} is below what {} uses ({used} bytes)", self.id),
                        ));
                    }
                }
                write(&g.join("memory.max"), &v)?;
                // No kernel without swap accounting has the file: nothing
                // to limit then.
                let swap = g.join("memory.swap.max");
                if swap.exists() {
                    write(&swap, "0")?;
                }
                Ok(())
            }
        }
    }

    pub fn set_pids(&self, max: u32) -> io::Result<()> {
        let dir = match hierarchy() {
            Hierarchy::V1 => self.v1("pids"),
            Hierarchy::V2 => self.v2(),
        };
        write(&dir.join("pids.max"), &max.to_string())
    }

    /// The group's CPU weight; None: the default (v1: the group is not
    /// used, its processes are in the engine's; v2: weight 100).
    pub fn set_cpu(&self, shares: Option<u32>) -> io::Result<()> {
        match (hierarchy(), shares) {
            (Hierarchy::V1, Some(s)) => write(&self.v1("cpu").join("cpu.shares"), &s.to_string()),
            (Hierarchy::V1, None) => Ok(()),
            (Hierarchy::V2, s) => write(&self.v2().join("cpu.weight"), &s.map_or(100, shares_to_weight).to_string()),
        }
    }

    /// The v1 CPU group's directory, for moving processes in.
    pub fn v1_cpu_dir(&self) -> PathBuf {
        self.v1("cpu")
    }

    pub fn freeze(&self) -> io::Result<()> {
        match hierarchy() {
            Hierarchy::V1 => write(&self.v1("freezer").join("freezer.state"), "FROZEN"),
            Hierarchy::V2 => write(&self.v2().join("cgroup.freeze"), "1"),
        }
    }

    pub fn thaw(&self) -> io::Result<()> {
        match hierarchy() {
            Hierarchy::V1 => write(&self.v1("freezer").join("freezer.state"), "THAWED"),
            Hierarchy::V2 => write(&self.v2().join("cgroup.freeze"), "0"),
        }
    }

    /// Whether the group is frozen (or freezing) now.
    pub fn frozen(&self) -> bool {
        match hierarchy() {
            Hierarchy::V1 => {
                fs::read_to_string(self.v1("freezer").join("freezer.state")).is_ok_and(|s| s.trim() != "THAWED")
            }
            Hierarchy::V2 => fs::read_to_string(self.v2().join("cgroup.freeze")).is_ok_and(|s| s.trim() == "1"),
        }
    }

    /// Host pids of every process in the group.
    pub fn procs(&self) -> Vec<u32> {
        fs::read_to_string(self.procs_file())
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }

    /// How many processes the kernel's OOM killer has killed in here.
    pub fn oom_kills(&self) -> u64 {
        let (file, key) = match hierarchy() {
            Hierarchy::V1 => (self.v1("memory").join("memory.oom_control"), "oom_kill "),
            Hierarchy::V2 => (self.v2().join("memory.events"), "oom_kill "),
        };
        fs::read_to_string(file)
            .ok()
            .and_then(|t| t.lines().find_map(|l| l.strip_prefix(key).and_then(|n| n.trim().parse().ok())))
            .unwrap_or(0)
    }

    /// Removes the group's directories (empty groups only; runc's delete
    /// usually did).
    pub fn remove(&self) {
        match hierarchy() {
            Hierarchy::V1 => {
                for c in V1_ALL {
                    let _ = fs::remove_dir(self.v1(c));
                }
            }
            Hierarchy::V2 => {
                let _ = fs::remove_dir(self.v2());
            }
        }
    }
}

/// Every container group whose id satisfies `keep`.
pub fn groups(keep: impl Fn(&str) -> bool) -> Vec<Group> {
    let base = match hierarchy() {
        // Every container has a freezer group on v1.
        Hierarchy::V1 => Path::new(ROOT).join("freezer").join(PARENT),
        Hierarchy::V2 => Path::new(ROOT).join(PARENT),
    };
    let mut out: Vec<Group> = fs::read_dir(base)
        .map(|d| {
            d.flatten()
                .filter(|e| e.path().is_dir())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| keep(n))
                .map(|n| Group { id: n })
                .collect()
        })
        .unwrap_or_default();
    if hierarchy() == Hierarchy::V1 {
        // A group runc made in another controller only (a crash midway).
        for c in V1_ALL {
            for e in fs::read_dir(Path::new(ROOT).join(c).join(PARENT)).into_iter().flatten().flatten() {
                let n = e.file_name().to_string_lossy().into_owned();
                if e.path().is_dir() && keep(&n) && !out.iter().any(|g| g.id == n) {
                    out.push(Group { id: n });
                }
            }
        }
    }
    out
}

/// The CPU group an engine and its functions' containers share, on v1. A
/// wakeup between tasks of two CPU groups (or two autogroups) goes through
/// group scheduling, and a container in a group of its own cost a third of
/// the external call throughput here (BENCHMARKS.md); so by default the
/// engine moves itself into this group and puts every container in it, and
/// only a function that asks for a CPU share gets a group of its own. None
/// on v2, where a process's CPU group is its memory group too.
pub fn shared_cpu_group(prefix: &str) -> Option<PathBuf> {
    match hierarchy() {
        Hierarchy::V1 => Some(Path::new(ROOT).join("cpu").join(PARENT).join(prefix)),
        Hierarchy::V2 => None,
    }
}

/// Moves the calling thread into a CPU group of its own, marked idle
/// (`cpu.idle`), beside the root's other groups: its threads then yield
/// to every other task on the machine, whatever group that task is in.
/// (`SCHED_IDLE` alone yields only within its own group: a group with a
/// busy idle-policy thread still competes as a whole with the rest, and
/// a task woken beside it waited up to a tick, 4 ms, here.) v1 only: on
/// v2 one thread of a process cannot leave its process's group.
pub fn enter_idle_cpu_group() -> io::Result<()> {
    if hierarchy() == Hierarchy::V2 {
        return Err(io::Error::new(io::ErrorKind::Unsupported, "on cgroup v2, threads share their process's group"));
    }
    let dir = Path::new(ROOT).join("cpu").join(IDLE_GROUP);
    fs::create_dir_all(&dir)?;
    fs::write(dir.join("cpu.idle"), "1")?;
    // v1: 0 in `tasks` is the writing thread.
    fs::write(dir.join("tasks"), "0")
}

/// The idle CPU group of `enter_idle_cpu_group`, shared by every engine.
const IDLE_GROUP: &str = "staccato-awake";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_map_onto_weights_in_proportion() {
        // The default share is the default weight.
        assert_eq!(shares_to_weight(1024), 100);
        assert_eq!(shares_to_weight(512), 50);
        assert_eq!(shares_to_weight(256), 25);
        assert_eq!(shares_to_weight(2), 1, "never 0");
        assert_eq!(shares_to_weight(0), 1, "clamped");
        assert_eq!(shares_to_weight(262_144), 10_000, "the largest weight");
    }
}
