//! Engines on one machine clean up after each other. Each engine holds an
//! `flock` on `/run/staccato/engines/<prefix>.lock` for every prefix its
//! containers, cgroups and network namespaces are named with; an engine
//! that starts takes the lock of every file there it can, and a lock it can
//! take belongs to an engine that died: it kills what is left in that
//! prefix's cgroups, removes them, its network namespaces, veths and nft
//! table, and the lock file. So a SIGKILLed engine's leftovers go at the
//! next start of any engine, not only of one with the same state directory.
//!
//! (The dead engine's runc state stays in its own state directory, which
//! only it names; its next start removes that.)

use crate::{Error, Result};
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const ENGINES_DIR: &str = "/run/staccato/engines";
const UIDS_DIR: &str = "/run/staccato/uids";

/// Users: each engine of a machine claims a range of its own (so no two
/// engines' containers or builds ever share a uid), the first
/// [`BUILD_UIDS`] of it for builds, the rest for function containers.
pub const UID_FIRST: u32 = 200_000;
pub const UID_RANGE_LEN: u32 = 65_536;
pub const UID_RANGES: u32 = 256;
pub const BUILD_UIDS: u32 = 1024;

/// A range of users this process owns, while it lives (an `flock` on
/// `/run/staccato/uids/<n>.lock`: a dead engine's range is free again).
#[derive(Debug)]
pub struct UidRange {
    pub first: u32,
    _file: File,
}

impl UidRange {
    /// The first uid of function containers; builds use the
    /// [`BUILD_UIDS`] below it.
    pub fn functions_base(&self) -> u32 {
        self.first + BUILD_UIDS
    }
}

/// Claims the first range of users no live engine holds.
pub fn claim_uids() -> Result<UidRange> {
    private_dir(Path::new(UIDS_DIR))?;
    for n in 0..UID_RANGES {
        let path = Path::new(UIDS_DIR).join(format!("{n}.lock"));
        let file = private_file(&path)?;
        // The file stays when released: unlinking a lock file races with
        // a process that has just opened it.
        if file.try_lock().is_ok() {
            return Ok(UidRange { first: UID_FIRST + n * UID_RANGE_LEN, _file: file });
        }
    }
    Err(Error::Config(format!("all {UID_RANGES} user ranges are held by live engines on this machine")))
}

/// A prefix this process owns; dropping it releases the claim.
#[derive(Debug)]
pub struct Claim {
    path: PathBuf,
    _file: File,
}

impl Drop for Claim {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.path);
    }
}

fn lock_path(prefix: &str) -> PathBuf {
    Path::new(ENGINES_DIR).join(format!("{prefix}.lock"))
}

/// Sweeps what dead engines left, then claims `prefix` for this process.
/// Fails if a live engine holds it.
pub fn claim(prefix: &str) -> Result<Claim> {
    private_dir(Path::new(ENGINES_DIR))?;
    sweep_dead_engines();
    let path = lock_path(prefix);
    let mut file = private_file(&path)?;
    match file.try_lock() {
        Ok(()) => {
            let _ = file.set_len(0);
            let _ = write!(file, "{}", std::process::id());
            Ok(Claim { path, _file: file })
        }
        Err(fs::TryLockError::WouldBlock) => {
            let pid = fs::read_to_string(&path).unwrap_or_default();
            Err(Error::PrefixInUse { prefix: prefix.to_string(), pid: pid.trim().to_string() })
        }
        Err(fs::TryLockError::Error(e)) => Err(Error::Io { what: format!("locking {}", path.display()), error: e }),
    }
}

/// A directory of lock files only its owner (root) may open: another
/// user holding a lock would stop engines from starting.
fn private_dir(dir: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    fs::create_dir_all(dir).map_err(Error::io(format!("creating {}", dir.display())))?;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
        .map_err(Error::io(format!("securing {}", dir.display())))
}

fn private_file(path: &Path) -> Result<File> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(path)
        .map_err(Error::io(format!("opening {}", path.display())))?;
    // One made by an older version may be wider.
    file.set_permissions(fs::Permissions::from_mode(0o600))
        .map_err(Error::io(format!("securing {}", path.display())))?;
    Ok(file)
}

/// Sweeps every prefix whose lock no live process holds.
pub fn sweep_dead_engines() {
    let Ok(entries) = fs::read_dir(ENGINES_DIR) else { return };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(prefix) = name.strip_suffix(".lock").filter(|p| netns::valid_prefix(p)) else { continue };
        let Ok(file) = OpenOptions::new().read(true).write(true).open(e.path()) else { continue };
        if file.try_lock().is_err() {
            continue; // alive
        }
        log::info!("removing what a dead engine left (containers prefix {prefix})");
        sweep_prefix(prefix);
        let _ = fs::remove_file(e.path());
    }
}

fn mine(prefix: &str, name: &str) -> bool {
    name.strip_prefix(prefix).is_some_and(|r| r.starts_with('-'))
}

/// Kills and removes the cgroups and namespaces named with `prefix`.
fn sweep_prefix(prefix: &str) {
    let groups = || crate::cgroup::groups(|name| mine(prefix, name));
    for g in groups() {
        let _ = g.thaw();
    }
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let pids: Vec<u32> = groups().iter().flat_map(crate::cgroup::Group::procs).collect();
        if pids.is_empty() || Instant::now() > deadline {
            break;
        }
        for p in pids {
            let _ = sys::process::kill(p);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    for g in groups() {
        g.remove();
    }
    if let Some(shared) = crate::shared_cpu_group(prefix) {
        let _ = fs::remove_dir(shared);
    }
    match netns::Networks::new(prefix).and_then(|n| n.cleanup()) {
        Ok(()) => {}
        Err(e) => log::warn!("removing the network namespaces of prefix {prefix}: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two engines (two claims) never get the same users, and a range is
    /// free again once its holder is gone.
    #[test]
    fn engines_get_disjoint_user_ranges() {
        let a = claim_uids().unwrap();
        let b = claim_uids().unwrap();
        let (lo, hi) = if a.first < b.first { (&a, &b) } else { (&b, &a) };
        assert!(lo.first + UID_RANGE_LEN <= hi.first, "{} and {} overlap", a.first, b.first);
        assert!(a.functions_base() > a.first && a.functions_base() < a.first + UID_RANGE_LEN);
        let freed = a.first;
        drop(a);
        // Another test or engine may take it meanwhile; then it is held.
        let c = claim_uids().unwrap();
        let path = Path::new(UIDS_DIR).join(format!("{}.lock", (freed - UID_FIRST) / UID_RANGE_LEN));
        let held_by_other = OpenOptions::new().write(true).open(path).unwrap().try_lock().is_err();
        assert!(c.first == freed || held_by_other, "range {freed} was not freed");
    }
}
