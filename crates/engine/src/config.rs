//! Engine settings. Defaults are what `staccato up` uses.

use crate::spec::Runtime;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Where engine threads and the workers they feed run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Leave it to the kernel's scheduler.
    Kernel,
    /// I/O thread i runs on CPU i (mod the CPUs allowed), and so do the
    /// workers whose channels it reads: a call that stays on one thread's
    /// workers never has to wake another vCPU (see BENCHMARKS.md).
    Packed,
}

#[derive(Clone, Debug)]
pub struct EngineConfig {
    pub listen: SocketAddr,
    pub io_threads: usize,
    /// A tmpfs directory for FIFOs and payload files.
    pub ipc_dir: PathBuf,
    /// Copies of deployed code and the functions' logs.
    pub state_dir: PathBuf,
    /// The repository's `runtimes/` directory (Python package, C host, C header).
    pub runtimes_dir: PathBuf,
    pub payload_len_max: usize,
    /// EMA coefficient for λ and t (Nightcore §4.1 uses 1e-3).
    pub ema_alpha: f64,
    pub placement: Placement,
    /// How long a waiting worker polls its channel before blocking.
    pub worker_spin_us: u32,
    /// How long an I/O thread polls for events before blocking, after it
    /// dispatched a call whose reply may come back within microseconds.
    pub engine_spin_us: u32,
    /// For how long after the last event the engine keeps its vCPUs from
    /// halting (`awake`); 0: never.
    pub keep_awake_ms: u32,
    pub python: String,
    /// How long a registration waits for the function's launcher to come up.
    pub launcher_ready_timeout_ms: u64,
    /// Function containers, or None to run functions as plain processes.
    pub containers: Option<ContainerConfig>,
    /// The package cache (`staccato cache ls` reads `<state>/cache`).
    pub cache_dir: PathBuf,
    pub cache_budget_bytes: u64,
    /// What every gateway–engine connection must prove it knows
    /// (api::auth). Random unless set: nobody can connect then but a
    /// gateway given the same secret in the same process.
    pub secret: api::auth::Secret,
    /// The longest chain of nested internal calls (`call_depth_exceeded`
    /// beyond it): runaway recursion fails at once instead of at its timeout.
    pub max_call_depth: u32,
    /// Where sandboxed Go builds' seed caches are kept (see build::go_seed):
    /// shared by every engine of the machine, written by root only.
    pub build_seed_dir: PathBuf,
    /// Each function's log: its size before rotation and its rate.
    pub log_caps: sandbox::logs::Caps,
    /// How many calls a function runs at once.
    pub concurrency: Concurrency,
    /// Send every internal call as an HTTP request to this gateway
    /// (`http://HOST:PORT`) instead of serving it here: OpenFaaS's way,
    /// for measuring the local fast path (`via_gateway`).
    pub internal_calls_via: Option<String>,
    /// Export spans of traced calls to this OpenTelemetry collector
    /// (OTLP/HTTP, JSON; `otel`); none: no tracing.
    pub otlp_endpoint: Option<String>,
    /// The share of calls without a sampled parent that start a trace.
    pub trace_sample: f64,
    /// Ask the runtimes that can (C, C++, Python) for each call's CPU time
    /// (`wire::message::FLAG_CPU_TIME`).
    pub cpu_per_call: bool,
}

/// The default `trace_sample` (BENCHMARKS.md, "Tracing cost").
pub const TRACE_SAMPLE_DEFAULT: f64 = 0.01;

/// How many calls of a function run at once (Nightcore §3.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Concurrency {
    /// τ = λ·t from the function's measured rate and processing time.
    Managed,
    /// τ = max_workers always: as many as there are calls, up to the
    /// manifest's bound (Nightcore Figure 8's baseline, "concurrency
    /// management disabled").
    Fixed,
}

/// Container isolation (Nuka §III): the pool's settings and the reuse rule.
#[derive(Clone, Debug)]
pub struct ContainerConfig {
    pub sandbox: sandbox::Settings,
    /// The real interpreter behind `python` (pyenv's shim is a script that
    /// would not work in a container) and the prefix bound to
    /// [`CONTAINER_PYTHON`].
    pub python_exe: PathBuf,
    pub python_prefix: PathBuf,
    /// What that interpreter needs in its environment inside a container:
    /// `LD_LIBRARY_PATH` to its own libpython when it is a shared build
    /// whose library lies in the prefix. Its RUNPATH names the host path,
    /// which a container does not have, and the dynamic loader would
    /// otherwise take the system's libpython of the same soname (a
    /// different patch release, with a different `site`: the prefix's
    /// site-packages, uvloop among them, were not on the path).
    pub python_env: Vec<(String, String)>,
    /// Freeze a function's idle container (see `clock::pause_delay`).
    pub pause: bool,
    /// Bounds on the pause delay Nuka's rule computes.
    pub pause_min: std::time::Duration,
    pub pause_max: std::time::Duration,
    /// A container paused this long is destroyed and its memory returned.
    pub keep_alive: std::time::Duration,
    /// The build sandbox: limits, allowed hosts, passed environment.
    pub build: sandbox::BuildConfig,
    /// This engine's users (`sandbox.uid_base` is in it), held while it lives.
    pub uids: std::sync::Arc<sandbox::UidRange>,
}

/// Where things are inside a function container.
pub const CONTAINER_RUNTIMES: &str = "/staccato/runtimes";
pub const CONTAINER_PYTHON: &str = "/staccato/python";
/// The runtime's optional packages (uvloop), each bound alone from the
/// interpreter's site-packages: a container's Python runs without `site`.
pub const CONTAINER_VENDOR: &str = "/staccato/vendor";
pub const CONTAINER_CODE: &str = "/code";
pub const CONTAINER_IPC: &str = "/ipc";
pub const CONTAINER_DEPS: &str = "/deps";

impl EngineConfig {
    pub fn new(listen: SocketAddr, ipc_dir: PathBuf, state_dir: PathBuf, runtimes_dir: PathBuf) -> EngineConfig {
        EngineConfig {
            listen,
            io_threads: sys::cpu::cpus_allowed().len().clamp(1, 8),
            ipc_dir,
            state_dir: state_dir.clone(),
            runtimes_dir,
            payload_len_max: wire::PAYLOAD_LEN_MAX_DEFAULT,
            ema_alpha: 1e-3,
            placement: Placement::Packed,
            worker_spin_us: 30,
            engine_spin_us: 30,
            keep_awake_ms: 0,
            python: "python3".into(),
            launcher_ready_timeout_ms: 15_000,
            containers: None,
            cache_dir: state_dir.join("cache"),
            cache_budget_bytes: pkgcache::DEFAULT_BUDGET_BYTES,
            secret: api::auth::Secret::random().expect("the kernel's random numbers"),
            max_call_depth: 32,
            build_seed_dir: if sys::process::euid() == 0 {
                PathBuf::from("/var/cache/staccato/go-seed")
            } else {
                state_dir.join("go-seed")
            },
            log_caps: sandbox::logs::Caps::DEFAULT,
            concurrency: Concurrency::Managed,
            internal_calls_via: None,
            otlp_endpoint: None,
            trace_sample: TRACE_SAMPLE_DEFAULT,
            cpu_per_call: false,
        }
    }

    /// The spin (`STACCATO_SPIN_US`) a function's workers get on a machine
    /// with `cpus` usable vCPUs, `fed_from` of which have an I/O thread
    /// (`runtime` and `max_workers` its spec's). A C/C++ worker does not
    /// spin where it shares a vCPU with the engine thread that feeds it: on
    /// one vCPU, or under packed placement when the function may have a
    /// worker on every vCPU that has a thread. There a call goes to a
    /// worker pinned beside the thread that received it (ARCHITECTURE.md,
    /// "Placement and spinning"), so the next message is written on the
    /// worker's own vCPU: a spin cannot catch it sooner, and it delays the
    /// engine, or under EEVDF the client just answered (BENCHMARKS.md, "Two
    /// spinners on one vCPU"). With fewer workers allowed than vCPUs, calls
    /// from the other vCPUs cross over, and the spin is kept: it saves their
    /// wake-ups, and a client left to the kernel stays off the spinning
    /// worker's vCPU (BENCHMARKS.md, "Spinning only where the next message
    /// comes from another vCPU"). Go's spin-then-ppoll still beats its
    /// netpoller everywhere, and a Go process serves calls from every thread.
    pub fn worker_spin_us_for(&self, runtime: Runtime, max_workers: u32, fed_from: usize, cpus: usize) -> u32 {
        let everywhere = self.placement == Placement::Packed && max_workers as usize >= fed_from;
        if matches!(runtime, Runtime::C | Runtime::Cpp) && (cpus < 2 || everywhere) {
            0
        } else {
            self.worker_spin_us
        }
    }
}

/// Why [`ContainerConfig::detect`] found no containers.
#[derive(Debug)]
pub enum Unavailable {
    /// This machine cannot make them (no runc, not root, no cgroup controllers...):
    /// a caller may fall back to processes.
    Missing(String),
    /// Something that should work did not (the interpreter, the build
    /// configuration).
    Failed(String),
}

impl ContainerConfig {
    /// Container settings for an engine (or a benchmark) keeping its state
    /// in `state`, with `runtimes` (the repository's runtimes/ directory)
    /// bound into each container, or why this machine cannot have them.
    pub fn detect(
        runc: &str,
        python: &str,
        network: sandbox::Network,
        pool_size: usize,
        state: &Path,
        runtimes: &Path,
    ) -> Result<ContainerConfig, Unavailable> {
        let runc_name = runc;
        let runc = if runc.contains('/') { Some(PathBuf::from(runc)) } else { sandbox::which(runc) };
        let init = runtimes.join("container/build/staccato-init");
        let why = match &runc {
            None => Some(format!("{runc_name} not found on PATH (Debian package runc)")),
            Some(r) => sandbox::unavailable(r, &init),
        };
        if let Some(why) = why {
            return Err(Unavailable::Missing(why));
        }
        let out = Command::new(python)
            .args(["-c", PYTHON_WHERE])
            .output()
            .map_err(|e| Unavailable::Failed(format!("running {python}: {e}")))?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let mut lines = text.lines();
        let (Some(exe), Some(prefix), Some(libdir), Some(uvloop)) =
            (lines.next(), lines.next(), lines.next(), lines.next())
        else {
            let err = String::from_utf8_lossy(&out.stderr);
            return Err(Unavailable::Failed(format!("cannot ask {python} where it lives: {err}")));
        };
        let (python_exe, python_prefix) = (PathBuf::from(exe), PathBuf::from(prefix));
        let python_env = python_container_env(&python_prefix, Path::new(libdir));
        // Several engines (or a test next to a `staccato up`) must not share
        // container names, cgroups or network namespaces.
        let prefix = {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            state.hash(&mut h);
            format!("s{:05x}", h.finish() & 0xfffff)
        };
        let uids = sandbox::claim_uids().map_err(|e| Unavailable::Failed(e.to_string()))?;
        let sandbox = sandbox::Settings {
            dir: state.join("containers"),
            prefix,
            runc: runc.expect("checked above"),
            init,
            binds: vec![
                (runtimes.to_path_buf(), CONTAINER_RUNTIMES.into()),
                (python_prefix.clone(), CONTAINER_PYTHON.into()),
            ],
            network,
            host_ports: None,
            uid_base: uids.functions_base(),
            tmp_dir: "/tmp".into(),
            tmp_bytes: 64 << 20,
            neutral: sandbox::Limits { memory_bytes: 64 << 20, pids: 32, cpu_shares: None },
            pool_size,
            warm_python: None,
        };
        let mut sandbox = sandbox;
        if !uvloop.is_empty() {
            sandbox.binds.push((PathBuf::from(uvloop), Path::new(CONTAINER_VENDOR).join("uvloop")));
        }
        // Every pooled container keeps a Python interpreter with the runtime
        // imported (runtimes/python/staccato/warm.py): Python functions then
        // start without paying for it; others have it killed first (~1 ms).
        let exe = python_exe.strip_prefix(&python_prefix).unwrap_or(Path::new("bin/python3"));
        let inside = Path::new(CONTAINER_PYTHON).join(exe);
        let mut warm_env = vec![
            ("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into()),
            ("HOME".into(), "/tmp".into()),
            ("LANG".into(), "C.UTF-8".into()),
            ("PYTHONPATH".into(), format!("{CONTAINER_RUNTIMES}/python:{CONTAINER_VENDOR}")),
        ];
        warm_env.extend(python_env.iter().cloned());
        sandbox.warm_python = Some(sandbox::Command {
            // -S: as launchers start (code::launcher_command), without site.
            argv: vec![inside.display().to_string(), "-S".into(), "-u".into(), "-m".into(), "staccato.warm".into()],
            env: warm_env,
        });
        Ok(ContainerConfig {
            sandbox,
            python_exe,
            python_prefix,
            python_env,
            pause: true,
            pause_min: Duration::from_millis(100),
            pause_max: Duration::from_secs(10),
            keep_alive: Duration::from_secs(300),
            build: crate::build::build_config(&[]).map_err(|e| Unavailable::Failed(e.to_string()))?,
            uids: std::sync::Arc::new(uids),
        })
    }
}

/// Asks an interpreter for its executable, its prefix, the directory of
/// its shared libpython (an empty line for a static build), and uvloop's
/// package directory (an empty line without it).
const PYTHON_WHERE: &str = "import sys, sysconfig, importlib.util as u\n\
print(sys.executable)\n\
print(sys.base_prefix)\n\
print(sysconfig.get_config_var('LIBDIR') if sysconfig.get_config_var('Py_ENABLE_SHARED') else '')\n\
s = u.find_spec('uvloop')\n\
print(s.submodule_search_locations[0] if s and s.submodule_search_locations else '')";

/// The environment a container's interpreter (the prefix bound at
/// [`CONTAINER_PYTHON`]) needs to load its own shared libpython: the
/// library's directory as seen inside, when it lies in the prefix.
pub fn python_container_env(prefix: &Path, libdir: &Path) -> Vec<(String, String)> {
    match libdir.strip_prefix(prefix) {
        Ok(rel) if libdir.is_absolute() => {
            vec![("LD_LIBRARY_PATH".into(), Path::new(CONTAINER_PYTHON).join(rel).display().to_string())]
        }
        _ => Vec::new(),
    }
}

/// The repository's runtimes/ directory: `arg` if given, else next to the
/// binary (target/release/staccato → ../../runtimes), or the working
/// directory's.
pub fn find_runtimes(arg: Option<PathBuf>) -> Result<PathBuf, crate::Error> {
    if let Some(p) = arg {
        return Ok(p);
    }
    let mut candidates = Vec::new();
    if let Ok(exe) = std::env::current_exe() {
        for anc in exe.ancestors().skip(1).take(4) {
            candidates.push(anc.join("runtimes"));
        }
    }
    candidates.push(PathBuf::from("runtimes"));
    candidates
        .into_iter()
        .find(|p| p.join("python/staccato").is_dir())
        .map(|p| p.canonicalize().unwrap_or(p))
        .ok_or_else(|| crate::Error::Unavailable("cannot find the runtimes/ directory; pass --runtimes-dir".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c_workers_spin_only_where_calls_may_come_from_another_vcpu() {
        let dir = PathBuf::from("/nonexistent");
        let mut cfg = EngineConfig::new("127.0.0.1:0".parse().unwrap(), dir.clone(), dir.clone(), dir);
        cfg.worker_spin_us = 7;
        assert_eq!(cfg.placement, Placement::Packed, "the default");
        for rt in [Runtime::C, Runtime::Cpp] {
            // A worker may sit beside every vCPU's thread, or there is one vCPU.
            assert_eq!(cfg.worker_spin_us_for(rt, 32, 2, 2), 0);
            assert_eq!(cfg.worker_spin_us_for(rt, 2, 2, 2), 0);
            assert_eq!(cfg.worker_spin_us_for(rt, 1, 1, 1), 0);
            // 16 vCPUs, 8 of them with an I/O thread (the most it starts).
            assert_eq!(cfg.worker_spin_us_for(rt, 8, 8, 16), 0);
            // Fewer workers than vCPUs with threads: calls cross over.
            assert_eq!(cfg.worker_spin_us_for(rt, 1, 2, 2), 7);
            assert_eq!(cfg.worker_spin_us_for(rt, 4, 8, 16), 7);
        }
        // Go spins wherever it is; so do the event loops' runtimes, which
        // ignore it.
        for rt in [Runtime::Go, Runtime::Python, Runtime::Node] {
            assert_eq!(cfg.worker_spin_us_for(rt, 32, 2, 2), 7);
            assert_eq!(cfg.worker_spin_us_for(rt, 1, 1, 1), 7);
        }
        // Left to the kernel, a C worker may run on another vCPU than the
        // thread that feeds it, unless there is only one.
        cfg.placement = Placement::Kernel;
        assert_eq!(cfg.worker_spin_us_for(Runtime::C, 32, 2, 2), 7);
        assert_eq!(cfg.worker_spin_us_for(Runtime::C, 32, 1, 1), 0);
    }

    #[test]
    fn a_shared_libpython_in_the_prefix_is_found_inside_the_container() {
        let env = |prefix: &str, libdir: &str| python_container_env(Path::new(prefix), Path::new(libdir));
        assert_eq!(
            env("/root/.pyenv/versions/3.11.7", "/root/.pyenv/versions/3.11.7/lib"),
            vec![("LD_LIBRARY_PATH".to_string(), "/staccato/python/lib".to_string())]
        );
        assert_eq!(
            env("/usr", "/usr/lib/x86_64-linux-gnu"),
            vec![("LD_LIBRARY_PATH".to_string(), "/staccato/python/lib/x86_64-linux-gnu".to_string())]
        );
        // A static build (no LIBDIR given), or a library outside the
        // prefix (not in the container: nothing to point at).
        assert!(env("/usr", "").is_empty());
        assert!(env("/opt/py", "/usr/lib").is_empty());
    }
}
