//! Deploy-time builds in a sandbox: pip (and the PEP 517 build backends it
//! runs), npm (and install scripts), `go build` (and module code), C and
//! C++ compilers. All of it is code the deployer controls, so none of it
//! runs on the host: each build step gets a one-shot container made like a
//! function's (own user, no capabilities, seccomp, read-only root, memory
//! and process limits), with
//!
//! * only the paths the step reads (the function's source, the toolchain),
//!   read-only at their host paths, so commands need no path translation;
//! * one writable output directory, backed by a size-limited tmpfs that is
//!   never attached on the host: the engine fills it through the detached
//!   mount's fd, and copies the result out after every process of the
//!   build is dead (checked), keeping only files, directories and symlinks
//!   that resolve inside the output through its own links, within a byte
//!   budget (nothing can race the copy, nothing points out);
//! * a network namespace that reaches only the allow-list proxy
//!   ([`crate::proxy`]): package indexes, nothing on the host;
//! * a time limit, after which everything in it is killed.
//!
//! A container costs ~40 ms to make (plus ~10 ms for its namespace): small
//! against any build, and nothing is reused between builds, so one build
//! can never leave anything for the next.

use crate::container::Container;
use crate::proxy::{HostRule, Proxy};
use crate::{Error, Limits, Mount, Network, Result, Settings, Start};
use std::collections::BTreeSet;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// A build's own tmpfs (and HOME). Host paths a build reads are bound at
/// their own paths, so this must be a path no host directory of ours lives
/// under: not /tmp, nor /var/tmp (a state directory under /var/tmp made
/// every Go build fail with "attaching ...: No such file or directory", the
/// mountpoint hidden by this tmpfs). A read beneath it is refused (`run`).
pub const BUILD_TMP: &str = "/.staccato-build-tmp";

/// Builds running at once, at most (each holds a container and a uid).
const BUILDS_MAX: u32 = 32;
/// How much of a build's output an error quotes, from the end.
const LOG_TAIL_MAX: u64 = 64 << 10;
/// Entries copied out of one build's output, at most.
const OUTPUT_ENTRIES_MAX: usize = 500_000;
const OUTPUT_DEPTH_MAX: usize = 64;

/// Limits and network of every build.
#[derive(Clone, Debug)]
pub struct BuildConfig {
    pub memory_bytes: u64,
    pub pids: u32,
    pub timeout: Duration,
    /// The build's [`BUILD_TMP`] (and HOME): tmpfs, counted against its memory.
    pub tmp_bytes: u64,
    /// The writable output: tmpfs, counted against its memory.
    pub output_bytes: u64,
    /// Host names the build may reach through the proxy.
    pub allow_hosts: Vec<HostRule>,
    /// Environment every build gets (package index settings, CA bundles).
    pub env: Vec<(String, String)>,
    /// Host paths every build may read (a local wheel directory, say).
    pub reads: Vec<PathBuf>,
}

impl BuildConfig {
    pub fn new(allow_hosts: Vec<HostRule>) -> BuildConfig {
        BuildConfig {
            memory_bytes: 2 << 30,
            pids: 1024,
            timeout: Duration::from_secs(600),
            tmp_bytes: 2 << 30,
            output_bytes: 2 << 30,
            allow_hosts,
            env: Vec::new(),
            reads: Vec::new(),
        }
    }
}

/// One build step.
#[derive(Clone, Debug, Default)]
pub struct Job {
    /// argv[0] must be an absolute path (the container's init uses execve).
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: PathBuf,
    /// Host paths it may read, visible at the same paths.
    pub reads: Vec<PathBuf>,
    /// A host directory it writes: what it holds before is copied in, and
    /// after a successful build it holds exactly what the build left there.
    pub output: Option<PathBuf>,
    /// When it is stopped, if sooner than [`BuildConfig::timeout`] from its
    /// start (the deploy's steps share one time limit).
    pub deadline: Option<Instant>,
}

/// How a build step ended, when it ran to its end.
#[derive(Debug)]
pub struct Finished {
    /// The wait status (as `std::process::ExitStatus::from_raw` takes it).
    pub wait_status: i32,
    /// The end of its standard output and error, interleaved.
    pub log: Vec<u8>,
}

impl Finished {
    pub fn success(&self) -> bool {
        self.wait_status & 0x7f == 0 && (self.wait_status >> 8) & 0xff == 0
    }
}

#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The sandbox itself failed (not the build).
    #[error("the build sandbox failed: {0}")]
    Sandbox(#[from] Error),
    #[error(
        "the build was stopped {:.1} s into the deploy: its builds together may take {} s (the engine's \
         --build-timeout-s)",
        after.as_secs_f64(),
        limit.as_secs()
    )]
    TimedOut { after: Duration, limit: Duration, log: Vec<u8> },
    #[error("the build ran out of memory (limit {} MiB, the engine's --build-memory)", limit >> 20)]
    OutOfMemory { limit: u64, log: Vec<u8> },
    /// The output could not be copied out (too many entries, too deep).
    #[error("the build's output was refused: {0}")]
    Output(io::Error),
}

pub struct Builder {
    settings: Settings,
    nets: netns::Networks,
    proxy: Proxy,
    cfg: BuildConfig,
    indexes: Mutex<BTreeSet<u32>>,
    /// Signalled when a build gives its slot back.
    freed: Condvar,
    _claim: crate::Claim,
}

impl Builder {
    /// `functions` are the function containers' settings: builds get the
    /// same runc, init and user range scheme, under their own prefix
    /// (`b` for `s`), directory and uids: the [`crate::BUILD_UIDS`] of the
    /// engine's range below the functions'. Removes what
    /// a dead engine's builds left behind, then starts the proxy.
    pub fn new(functions: &Settings, cfg: BuildConfig) -> Result<Builder> {
        if functions.uid_base < crate::BUILD_UIDS {
            return Err(Error::Config(format!(
                "uid base {} leaves no room for build users below it",
                functions.uid_base
            )));
        }
        const { assert!(BUILDS_MAX <= crate::BUILD_UIDS) };
        let tail = &functions.prefix[functions.prefix.len().saturating_sub(netns::PREFIX_LEN_MAX - 1)..];
        let prefix = format!("b{tail}");
        let claim = crate::claim(&prefix)?;
        let proxy = Proxy::start(cfg.allow_hosts.clone()).map_err(Error::io("starting the build proxy"))?;
        let settings = Settings {
            dir: functions.dir.join("build"),
            prefix: prefix.clone(),
            runc: functions.runc.clone(),
            init: functions.init.clone(),
            binds: Vec::new(),
            network: Network::Isolated,
            host_ports: Some(vec![proxy.addr().port()]),
            uid_base: functions.uid_base - crate::BUILD_UIDS,
            tmp_dir: BUILD_TMP.into(),
            tmp_bytes: cfg.tmp_bytes,
            // A quarter of a function's weight: builds yield to calls.
            neutral: Limits { memory_bytes: cfg.memory_bytes, pids: cfg.pids, cpu_shares: Some(256) },
            pool_size: 0,
            warm_python: None,
        };
        fs::create_dir_all(&settings.dir).map_err(Error::io(format!("creating {}", settings.dir.display())))?;
        let nets = netns::Networks::with_ports(&prefix, &[proxy.addr().port()])?;
        crate::pool::remove_leftovers(&settings, Some(&nets));
        let indexes = Mutex::new(BTreeSet::new());
        Ok(Builder { settings, nets, proxy, cfg, indexes, freed: Condvar::new(), _claim: claim })
    }

    pub fn config(&self) -> &BuildConfig {
        &self.cfg
    }

    /// The proxy's address on the host (tests attack it directly).
    pub fn proxy_addr(&self) -> std::net::SocketAddr {
        self.proxy.addr()
    }

    /// Runs one build step to its end (or its limit).
    pub fn run(&self, job: &Job) -> Result<Finished, BuildError> {
        if job.argv.first().is_none_or(|a| !a.starts_with('/')) {
            return Err(Error::Config(format!("build command {:?} is not an absolute path", job.argv.first())).into());
        }
        let stop_at = job.deadline.unwrap_or_else(|| Instant::now() + self.cfg.timeout);
        // Past the deploy's deadline already: no step starts, the wait for
        // a slot ends with it.
        let Some(index) = (Instant::now() < stop_at).then(|| self.take_index(stop_at)).flatten() else {
            return Err(BuildError::TimedOut {
                after: self.deploy_elapsed(job),
                limit: self.cfg.timeout,
                log: Vec::new(),
            });
        };
        let result = self.run_at(index, job);
        self.indexes.lock().unwrap_or_else(|p| p.into_inner()).remove(&index);
        self.freed.notify_one();
        result
    }

    /// How long the deploy `job` is part of has run: its deadline is the
    /// build timeout from its start.
    fn deploy_elapsed(&self, job: &Job) -> Duration {
        let left = job.deadline.map_or(self.cfg.timeout, |d| d.saturating_duration_since(Instant::now()));
        self.cfg.timeout.saturating_sub(left)
    }

    /// A free slot (a uid and a network index), waiting for one while all
    /// [`BUILDS_MAX`] are taken; `None` if none frees before `stop_at`.
    fn take_index(&self, stop_at: Instant) -> Option<u32> {
        let mut used = self.indexes.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(free) = (0..BUILDS_MAX).find(|i| !used.contains(i)) {
                used.insert(free);
                return Some(free);
            }
            let left = stop_at.checked_duration_since(Instant::now()).filter(|d| !d.is_zero())?;
            used = self.freed.wait_timeout(used, left).unwrap_or_else(|p| p.into_inner()).0;
        }
    }

    fn run_at(&self, index: u32, job: &Job) -> Result<Finished, BuildError> {
        if let Some(p) = job.reads.iter().chain(&job.output).find(|p| p.starts_with(BUILD_TMP)) {
            return Err(Error::Config(format!("{} lies under the build's own {BUILD_TMP}", p.display())).into());
        }
        // The scratch tmpfs first: the container's uid owns what is in it.
        let scratch = sys::mount::tmpfs(Path::new("/"), self.cfg.output_bytes)
            .map_err(Error::io("making the build's scratch tmpfs"))?;
        let root = scratch.path();
        let uid = self.settings.uid_base + index;
        let (out, log) = (root.join("out"), root.join("log"));
        let prepared = (|| -> io::Result<()> {
            fs::create_dir(&out)?;
            if let Some(dir) = &job.output {
                let mut budget = Budget { entries: OUTPUT_ENTRIES_MAX, bytes: self.cfg.output_bytes };
                copy_tree(dir, dir, &out, &mut budget, 0)?;
            }
            chown_tree(&out, uid)?;
            File::create(&log)?;
            Ok(())
        })();
        prepared.map_err(Error::io("preparing the build's output"))?;

        let container = Container::create(&self.settings, Some(&self.nets), index, false)?;
        let result = self.start_and_wait(&container, job, &out, &log);
        container.destroy(&self.settings, Some(&self.nets));
        // The copy-out below trusts that nothing can change the tree.
        if !container.pids().is_empty() {
            return Err(
                Error::Dirty(format!("processes of build container {} survived its removal", container.id)).into()
            );
        }
        let finished = result?;
        if finished.success() {
            if let Some(dir) = &job.output {
                let budget = Budget { entries: OUTPUT_ENTRIES_MAX, bytes: self.cfg.output_bytes };
                replace_with_copy(&out, dir, budget).map_err(BuildError::Output)?;
            }
        }
        Ok(finished)
    }

    fn start_and_wait(&self, c: &Container, job: &Job, out: &Path, log: &Path) -> Result<Finished, BuildError> {
        let host_ip = c
            .net
            .as_ref()
            .map(|n| n.host_ip)
            .ok_or(Error::Config("a build container without a network namespace".into()))?;
        let proxy = format!("http://{host_ip}:{}", self.proxy.addr().port());
        let mut env: Vec<(String, String)> = vec![
            ("PATH".into(), "/usr/local/bin:/usr/bin:/bin:/usr/local/go/bin".into()),
            ("HOME".into(), BUILD_TMP.into()),
            ("TMPDIR".into(), BUILD_TMP.into()),
            ("LANG".into(), "C.UTF-8".into()),
        ];
        for k in
            ["HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "npm_config_https_proxy", "npm_config_proxy"]
        {
            env.push((k.into(), proxy.clone()));
        }
        env.push(("NO_PROXY".into(), String::new()));
        env.push(("no_proxy".into(), String::new()));
        env.extend(self.cfg.env.iter().cloned());
        env.extend(job.env.iter().cloned());
        // Debian's alternatives (cc, c++, awk) are links through /etc.
        let alternatives = [PathBuf::from("/etc/alternatives")];
        let mut mounts: Vec<Mount> = visible(job.reads.iter().chain(&self.cfg.reads).chain(&alternatives))
            .into_iter()
            .map(|src| Mount { dst: src.clone(), src, read_only: true, exec: false })
            .collect();
        if let Some(dir) = &job.output {
            mounts.push(Mount { src: out.to_path_buf(), dst: dir.clone(), read_only: false, exec: true });
        }
        let start = Start {
            mounts,
            limits: self.settings.neutral.clone(),
            argv: job.argv.clone(),
            env,
            cwd: job.cwd.to_string_lossy().into_owned(),
            log: log.to_path_buf(),
            python: false,
        };
        let pid = c.start(&start)?;
        let started = Instant::now();
        let stop_at = job.deadline.map_or(started + self.cfg.timeout, |d| d.min(started + self.cfg.timeout));
        loop {
            for line in c.poll_status() {
                let mut f = line.split(' ');
                if f.next() == Some("EXIT") && f.next() == Some(&pid.to_string()) {
                    let wait_status = f.next().and_then(|s| s.parse().ok()).unwrap_or(-1);
                    let log = tail(log);
                    if c.oom_since_start() {
                        return Err(BuildError::OutOfMemory { limit: self.cfg.memory_bytes, log });
                    }
                    return Ok(Finished { wait_status, log });
                }
            }
            if Instant::now() >= stop_at {
                c.kill_all();
                let after = if job.deadline.is_some() { self.deploy_elapsed(job) } else { started.elapsed() };
                return Err(BuildError::TimedOut { after, limit: self.cfg.timeout, log: tail(log) });
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// The paths to bind, without duplicates, without paths inside another one
/// on the list, and without what every container sees anyway.
fn visible<'a>(paths: impl Iterator<Item = &'a PathBuf>) -> Vec<PathBuf> {
    let mut all: Vec<PathBuf> = paths
        .filter(|p| p.is_absolute() && p.components().all(|c| !matches!(c, Component::ParentDir)))
        .filter(|p| !p.starts_with("/usr") && !p.starts_with("/etc/ssl") && p.exists())
        .filter(|p| p.parent().is_some())
        .cloned()
        .collect();
    all.sort();
    all.dedup();
    let mut kept: Vec<PathBuf> = Vec::new();
    for p in all {
        if !kept.iter().any(|k| p.starts_with(k)) {
            kept.push(p);
        }
    }
    kept
}

/// The last LOG_TAIL_MAX bytes of the build's log (not following links).
fn tail(path: &Path) -> Vec<u8> {
    let Ok(mut f) = OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW).open(path) else {
        return Vec::new();
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(LOG_TAIL_MAX)));
    let mut out = Vec::new();
    let _ = f.take(LOG_TAIL_MAX).read_to_end(&mut out);
    out
}

fn chown_tree(path: &Path, uid: u32) -> io::Result<()> {
    std::os::unix::fs::lchown(path, Some(uid), Some(uid))?;
    if fs::symlink_metadata(path)?.is_dir() {
        for e in fs::read_dir(path)? {
            chown_tree(&e?.path(), uid)?;
        }
    }
    Ok(())
}

/// Empties `dst` and fills it with a sanitized copy of `src`.
fn replace_with_copy(src: &Path, dst: &Path, mut budget: Budget) -> io::Result<()> {
    for e in fs::read_dir(dst)? {
        let p = e?.path();
        if fs::symlink_metadata(&p)?.is_dir() {
            make_writable(&p)?;
            fs::remove_dir_all(&p)?;
        } else {
            fs::remove_file(&p)?;
        }
    }
    copy_tree(src, src, dst, &mut budget, 0)
}

fn make_writable(dir: &Path) -> io::Result<()> {
    fs::set_permissions(dir, fs::Permissions::from_mode(0o755))?;
    for e in fs::read_dir(dir)? {
        let p = e?.path();
        if fs::symlink_metadata(&p)?.is_dir() {
            make_writable(&p)?;
        }
    }
    Ok(())
}

/// What a copy-out may still take.
struct Budget {
    entries: usize,
    bytes: u64,
}

/// Copies the contents of `src` into the existing directory `dst`: files
/// (owner-writable, readable by all, executable if they were), directories
/// and symlinks that resolve inside the tree (following the tree's own
/// links, as the kernel would); anything else (FIFOs, sockets, links out
/// or dangling) is left out. Nothing is followed: `src` must be a tree no
/// process can change meanwhile. `root` is the top of `src`'s tree.
fn copy_tree(root: &Path, src: &Path, dst: &Path, budget: &mut Budget, depth: usize) -> io::Result<()> {
    if depth > OUTPUT_DEPTH_MAX {
        return Err(io::Error::other(format!("directories nested deeper than {OUTPUT_DEPTH_MAX}")));
    }
    for e in fs::read_dir(src)? {
        let e = e?;
        budget.entries = budget
            .entries
            .checked_sub(1)
            .ok_or_else(|| io::Error::other(format!("more than {OUTPUT_ENTRIES_MAX} entries")))?;
        let (from, to) = (e.path(), dst.join(e.file_name()));
        let meta = fs::symlink_metadata(&from)?;
        let ft = meta.file_type();
        if ft.is_dir() {
            fs::create_dir(&to)?;
            copy_tree(root, &from, &to, budget, depth + 1)?;
            fs::set_permissions(&to, fs::Permissions::from_mode(0o755))?;
        } else if ft.is_file() {
            // Counted at its full length: a sparse file is written dense.
            budget.bytes = budget.bytes.checked_sub(meta.len()).ok_or_else(|| {
                io::Error::other("more bytes than the output may hold (a sparse or hard-linked file?)")
            })?;
            let mut r = OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK).open(&from)?;
            let mode = if meta.permissions().mode() & 0o111 != 0 { 0o755 } else { 0o644 };
            let mut w = OpenOptions::new().write(true).create_new(true).mode(mode).open(&to)?;
            io::copy(&mut (&mut r).take(meta.len()), &mut w)?;
            fs::set_permissions(&to, fs::Permissions::from_mode(mode))?;
        } else if ft.is_symlink() {
            let target = fs::read_link(&from)?;
            let at = from.parent().and_then(|p| p.strip_prefix(root).ok()).unwrap_or(Path::new(""));
            if resolves_inside(root, at, &target) {
                std::os::unix::fs::symlink(&target, &to)?;
            } else {
                log::warn!("build output: left out the link {} -> {}", to.display(), target.display());
            }
        }
    }
    Ok(())
}

/// Whether a link in directory `at` (relative to `root`) with this target
/// resolves to an existing entry inside `root`, following the tree's own
/// links the way the kernel would (at most 40 of them), never leaving it.
fn resolves_inside(root: &Path, at: &Path, target: &Path) -> bool {
    use std::ffi::OsString;
    // Components still to walk, last first: None is "..".
    fn parts(p: &Path) -> Option<Vec<Option<OsString>>> {
        let mut out = Vec::new();
        for c in p.components() {
            match c {
                Component::Normal(n) => out.push(Some(n.to_owned())),
                Component::ParentDir => out.push(None),
                Component::CurDir => {}
                Component::RootDir | Component::Prefix(_) => return None,
            }
        }
        out.reverse();
        Some(out)
    }
    let Some(mut todo) = parts(target) else { return false };
    let mut here: Vec<OsString> = at.components().map(|c| c.as_os_str().to_owned()).collect();
    let mut hops = 0;
    while let Some(part) = todo.pop() {
        let Some(name) = part else {
            if here.pop().is_none() {
                return false;
            }
            continue;
        };
        let mut path = root.to_path_buf();
        path.extend(&here);
        path.push(&name);
        let Ok(meta) = fs::symlink_metadata(&path) else { return false };
        if !meta.file_type().is_symlink() {
            here.push(name);
            continue;
        }
        hops += 1;
        let Some(next) = fs::read_link(&path).ok().filter(|_| hops <= 40).and_then(|t| parts(&t)) else {
            return false;
        };
        todo.extend(next);
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn visible_paths_drop_nested_and_relative_ones() {
        let tmp = std::env::temp_dir().join(format!("sandbox-visible-{}", std::process::id()));
        fs::create_dir_all(tmp.join("a/b")).unwrap();
        let paths =
            [tmp.join("a/b"), tmp.join("a"), "rel".into(), "/usr/bin".into(), tmp.join("a/../x"), tmp.join("a")];
        assert_eq!(visible(paths.iter()), vec![tmp.join("a")]);
        fs::remove_dir_all(tmp).unwrap();
    }

    #[test]
    fn copies_files_dirs_and_inner_links_only() {
        let tmp = std::env::temp_dir().join(format!("sandbox-copy-{}", std::process::id()));
        let _ = fs::remove_dir_all(&tmp);
        let (src, dst) = (tmp.join("src"), tmp.join("dst"));
        fs::create_dir_all(src.join("d")).unwrap();
        fs::create_dir_all(&dst).unwrap();
        fs::write(src.join("d/f"), b"x").unwrap();
        fs::set_permissions(src.join("d/f"), fs::Permissions::from_mode(0o4777)).unwrap();
        std::os::unix::fs::symlink("f", src.join("d/in")).unwrap();
        std::os::unix::fs::symlink("/etc/shadow", src.join("d/abs")).unwrap();
        std::os::unix::fs::symlink("../../x", src.join("d/up")).unwrap();
        sys::pipe::mkfifo(&src.join("fifo")).unwrap();
        fs::write(dst.join("old"), b"y").unwrap();
        std::os::unix::fs::symlink(".", src.join("d/s")).unwrap();
        // Text alone says "inside"; through the link `s` it climbs out.
        std::os::unix::fs::symlink("s/s/s/s/../../../../etc/passwd", src.join("d/climb")).unwrap();
        std::os::unix::fs::symlink("../d/in", src.join("d/back")).unwrap();
        std::os::unix::fs::symlink("loop", src.join("loop")).unwrap();
        let budget = || Budget { entries: 100, bytes: 1 << 20 };
        replace_with_copy(&src, &dst, budget()).unwrap();
        assert!(!dst.join("old").exists());
        assert_eq!(fs::read(dst.join("d/f")).unwrap(), b"x");
        assert_eq!(fs::metadata(dst.join("d/f")).unwrap().permissions().mode() & 0o7777, 0o755);
        assert_eq!(fs::read_link(dst.join("d/in")).unwrap(), Path::new("f"));
        assert_eq!(fs::read_link(dst.join("d/back")).unwrap(), Path::new("../d/in"));
        assert_eq!(fs::read_link(dst.join("d/s")).unwrap(), Path::new("."));
        for gone in ["d/abs", "d/up", "fifo", "d/climb", "loop"] {
            assert!(fs::symlink_metadata(dst.join(gone)).is_err(), "{gone}");
        }
        // A sparse file larger than the budget is refused, not written dense.
        let big = File::create(src.join("sparse")).unwrap();
        big.set_len(2 << 20).unwrap();
        let err = replace_with_copy(&src, &dst, budget()).unwrap_err();
        assert!(err.to_string().contains("more bytes"), "{err}");
        fs::remove_dir_all(tmp).unwrap();
    }
}
