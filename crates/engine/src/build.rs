//! Where a function's build steps run (pip, npm, `go build`, the C and C++
//! compilers): in the build sandbox ([`sandbox::Builder`]) when the engine
//! has containers, as plain child processes otherwise (process isolation
//! gives functions no isolation either; see README "Security model").

use crate::config::EngineConfig;
use crate::{Error, Result};
use pkgcache::{HostRunner, RunError, Runner};
use sandbox::proxy::{url_host, HostRule, DEFAULT_HOSTS};
use std::ffi::OsStr;
use std::fs;
use std::io;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Output};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// How many of a stopped build's last output lines an error quotes.
const QUOTED_LINES_MAX: usize = 30;

pub(crate) struct Builds {
    kind: Kind,
    /// The Go seed cache, once made (the lock is held while it is made).
    go_seed: Mutex<Option<PathBuf>>,
    /// Go source caches a build holds (see [`GoSourceCache`]), and the
    /// builds waiting for one.
    go_sources: Mutex<std::collections::HashSet<String>>,
    go_sources_freed: std::sync::Condvar,
}

/// Go builds of one uploaded source share their caches: a manifest often
/// deploys several functions from one directory (one handler each), and
/// every sandboxed build otherwise starts from the seed alone, downloading
/// and compiling all of the source's modules again (30 s each for a source
/// that uses a PostgreSQL and a Redis client). The first build of a source
/// leaves its Go build and module caches behind; later builds of the same
/// source (same digest: the same bytes) start from a copy of them, one at a
/// time. A cache is only ever used by builds of the source whose build made
/// it, so no deployed code can reach another source's build through it.
pub(crate) struct GoSourceCache<'a> {
    /// `<state>/go-cache/<seed>-<digest>`: `gocache/` and `gomod/` once made.
    pub dir: PathBuf,
    key: String,
    builds: &'a Builds,
}

impl Drop for GoSourceCache<'_> {
    fn drop(&mut self) {
        self.builds.go_sources.lock().unwrap_or_else(|p| p.into_inner()).remove(&self.key);
        self.builds.go_sources_freed.notify_all();
    }
}

/// Caches of this many sources are kept; older ones are removed when a new
/// one is made.
const GO_SOURCE_CACHES_KEPT: usize = 4;

enum Kind {
    Host,
    Sandbox(Arc<sandbox::Builder>),
    /// Containers, but no build sandbox: builds fail with this reason
    /// rather than run on the host.
    Unavailable(sandbox::Error),
}

impl Builds {
    pub fn new(cfg: &EngineConfig) -> Arc<Builds> {
        let kind = match &cfg.containers {
            None => Kind::Host,
            Some(cc) => match sandbox::Builder::new(&cc.sandbox, cc.build.clone()) {
                Ok(b) => {
                    log::info!(
                        "build sandbox: proxy on {}, allowed hosts {}",
                        b.proxy_addr(),
                        cc.build.allow_hosts.iter().map(HostRule::as_str).collect::<Vec<_>>().join(", ")
                    );
                    Kind::Sandbox(Arc::new(b))
                }
                Err(e) => {
                    log::warn!("no build sandbox ({e}): deploys that build or install dependencies will fail");
                    Kind::Unavailable(e)
                }
            },
        };
        Arc::new(Builds {
            kind,
            go_seed: Mutex::new(None),
            go_sources: Mutex::default(),
            go_sources_freed: std::sync::Condvar::new(),
        })
    }

    /// Makes the Go seed in the background, so the first Go deploy finds it.
    pub fn prepare_go(self: &Arc<Builds>, cfg: &EngineConfig) {
        if !matches!(self.kind, Kind::Sandbox(_)) || !cfg.runtimes_dir.join("go/build-function.sh").is_file() {
            return;
        }
        let (builds, cfg) = (self.clone(), cfg.clone());
        let _ = std::thread::Builder::new().name("go-seed".into()).spawn(move || {
            if let Err(e) = builds.go_seed(&cfg) {
                log::warn!("{e}");
            }
        });
    }

    /// Runs build steps; in the sandbox, each is stopped at `deadline`
    /// (the deploy's), or at the build timeout from its start if sooner.
    pub fn runner(&self, deadline: Option<Instant>) -> Result<Arc<dyn Runner>> {
        match &self.kind {
            Kind::Host => Ok(Arc::new(HostRunner)),
            Kind::Sandbox(b) => Ok(Arc::new(SandboxRunner(b.clone(), deadline))),
            Kind::Unavailable(why) => {
                Err(Error::Unavailable(format!("the build sandbox is unavailable on this engine: {why}")))
            }
        }
    }

    pub fn sandboxed(&self) -> bool {
        !matches!(self.kind, Kind::Host)
    }

    pub fn go_seed(&self, cfg: &EngineConfig) -> Result<PathBuf> {
        let mut seed = self.go_seed.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = seed.as_ref().filter(|s| s.is_dir()) {
            return Ok(s.clone());
        }
        let made = go_seed(cfg, &cfg.build_seed_dir)?;
        *seed = Some(made.clone());
        Ok(made)
    }

    /// The shared caches of Go builds of source `digest` over `seed`,
    /// held until the returned value is dropped.
    pub fn go_source_cache(&self, cfg: &EngineConfig, seed: &Path, digest: &str) -> Result<GoSourceCache<'_>> {
        let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
        if hex.is_empty() || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(Error::Source(format!("bad source digest {digest:?}")));
        }
        let seed_name = seed.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let key = format!("{seed_name}-{hex}");
        let mut held = self.go_sources.lock().unwrap_or_else(|p| p.into_inner());
        while held.contains(&key) {
            held = self.go_sources_freed.wait(held).unwrap_or_else(|p| p.into_inner());
        }
        held.insert(key.clone());
        Ok(GoSourceCache { dir: cfg.state_dir.join("go-cache").join(&key), key, builds: self })
    }

    /// Publishes what a build left in `made` (`gocache/`, `gomod/`) as the
    /// source's cache, unless it has one; prunes old ones.
    pub fn publish_go_source_cache(&self, cache: &GoSourceCache<'_>, made: &Path) -> Result<()> {
        if cache.dir.is_dir() || !made.join("gocache").is_dir() {
            return Ok(());
        }
        chmod_tree(made, Some(0o644)).map_err(Error::io("making a Go build's caches readable"))?;
        let root = cache.dir.parent().unwrap_or(Path::new("."));
        fs::create_dir_all(root).map_err(Error::io(format!("creating {}", root.display())))?;
        fs::rename(made, &cache.dir).map_err(Error::io(format!("publishing {}", cache.dir.display())))?;
        prune_oldest(root, GO_SOURCE_CACHES_KEPT);
        Ok(())
    }
}

/// Removes all but the `keep` newest directories under `root`.
fn prune_oldest(root: &Path, keep: usize) {
    let Ok(entries) = fs::read_dir(root) else { return };
    let mut dirs: Vec<(std::time::SystemTime, PathBuf)> =
        entries.flatten().filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path()))).collect();
    dirs.sort_by_key(|d| std::cmp::Reverse(d.0));
    for (_, d) in dirs.into_iter().skip(keep) {
        let _ = chmod_tree(&d, None).and_then(|()| fs::remove_dir_all(&d));
    }
}

/// Runs `std::process::Command`s in the build sandbox.
pub(crate) struct SandboxRunner(Arc<sandbox::Builder>, Option<Instant>);

impl Runner for SandboxRunner {
    fn output(&self, cmd: &mut Command, reads: &[PathBuf], output: Option<&Path>) -> Result<Output, RunError> {
        let program = absolute(cmd.get_program()).map_err(RunError::Spawn)?;
        let mut argv = vec![program];
        argv.extend(cmd.get_args().map(|a| a.to_string_lossy().into_owned()));
        // Only what the command sets; the sandbox adds its own base (PATH,
        // HOME, proxy, the operator's index settings). Removals are moot:
        // nothing of the engine's environment is inherited.
        let env = cmd
            .get_envs()
            .filter_map(|(k, v)| Some((k.to_string_lossy().into_owned(), v?.to_string_lossy().into_owned())))
            .collect();
        let cwd = cmd.get_current_dir().map(Path::to_path_buf).or(output.map(Path::to_path_buf)).unwrap_or("/".into());
        let output = output.map(Path::to_path_buf);
        let job = sandbox::Job { argv, env, cwd, reads: reads.to_vec(), output, deadline: self.1 };
        match self.0.run(&job) {
            Ok(f) => Ok(Output { status: ExitStatus::from_raw(f.wait_status), stdout: Vec::new(), stderr: f.log }),
            Err(sandbox::BuildError::Sandbox(e)) => Err(RunError::Spawn(io::Error::other(e))),
            Err(e) => {
                let log = match &e {
                    sandbox::BuildError::TimedOut { log, .. } | sandbox::BuildError::OutOfMemory { log, .. } => {
                        last_lines(log)
                    }
                    _ => String::new(),
                };
                Err(RunError::Stopped(if log.is_empty() {
                    e.to_string()
                } else {
                    format!("{e}; its last output:\n{log}")
                }))
            }
        }
    }
}

fn last_lines(log: &[u8]) -> String {
    let text = String::from_utf8_lossy(log);
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(QUOTED_LINES_MAX)..]
        .iter()
        .map(|l| format!("  {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn absolute(program: &OsStr) -> io::Result<String> {
    let p = Path::new(program);
    let found = if p.is_absolute() {
        Some(p.to_path_buf())
    } else if p.components().count() == 1 {
        sandbox::which(&program.to_string_lossy())
    } else {
        None
    };
    found.map(|p| p.to_string_lossy().into_owned()).ok_or_else(|| {
        io::Error::new(io::ErrorKind::NotFound, format!("{} not found on PATH", program.to_string_lossy()))
    })
}

/// The operator's package index settings, passed to every build, and the
/// host paths they name (a local wheel directory, a CA bundle).
const PASSED_VARS: [&str; 15] = [
    "PIP_INDEX_URL",
    "PIP_EXTRA_INDEX_URL",
    "PIP_FIND_LINKS",
    "PIP_CERT",
    "PIP_TRUSTED_HOST",
    "PIP_DEFAULT_TIMEOUT",
    "PIP_NO_INDEX",
    "GOPROXY",
    "GOSUMDB",
    "GONOSUMDB",
    "GOPRIVATE",
    "GONOPROXY",
    "GOFLAGS",
    "npm_config_registry",
    "NPM_CONFIG_REGISTRY",
];
const CA_VARS: [&str; 6] =
    ["SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "NODE_EXTRA_CA_CERTS", "GIT_SSL_CAINFO"];

/// The build settings for this engine's environment: its package index
/// variables (and the paths and hosts they name) plus `extra_hosts`.
pub fn build_config(extra_hosts: &[String]) -> Result<sandbox::BuildConfig> {
    let vars: Vec<(String, String)> = PASSED_VARS
        .iter()
        .chain(CA_VARS.iter())
        .filter_map(|k| std::env::var(k).ok().map(|v| (k.to_string(), v)))
        .collect();
    let mut hosts: Vec<HostRule> = DEFAULT_HOSTS.iter().map(|h| HostRule::parse(h).expect("valid")).collect();
    let mut reads = Vec::new();
    for (k, v) in &vars {
        for token in v.split([' ', ',', '|']).filter(|t| !t.is_empty()) {
            if let Some(path) = token.strip_prefix("file://").or(Some(token).filter(|t| t.starts_with('/'))) {
                reads.push(PathBuf::from(path));
            } else if let Some(host) = url_host(token) {
                hosts.push(HostRule::parse(&host).map_err(|e| Error::Config(format!("{k}: {e}")))?);
            } else if k == "GOSUMDB" && !matches!(token, "off") && !token.contains('/') {
                // "sum.golang.org" or "sum.golang.org+<key>" (a URL may follow).
                let name = token.split('+').next().unwrap_or(token);
                hosts.push(HostRule::parse(name).map_err(|e| Error::Config(format!("GOSUMDB: {e}")))?);
            }
        }
    }
    for h in extra_hosts {
        hosts.push(HostRule::parse(h).map_err(|e| Error::Config(format!("--build-allow-host: {e}")))?);
    }
    hosts.dedup();
    let mut cfg = sandbox::BuildConfig::new(hosts);
    cfg.env = vars;
    cfg.reads = reads;
    Ok(cfg)
}

/// The Go runtime compiled once into a build cache that every sandboxed
/// Go build starts from (a copy of it: builds never share a cache they
/// can write). Made on the host from our own sources only, with no
/// network, and kept per Go version and runtime under `seed_root`.
fn go_seed(cfg: &EngineConfig, seed_root: &Path) -> Result<PathBuf> {
    let script = cfg.runtimes_dir.join("go/build-function.sh");
    let go_dir = cfg.runtimes_dir.join("go");
    let version = Command::new(go_command())
        .args(["env", "GOVERSION"])
        .output()
        .map_err(|e| Error::Unavailable(format!("running go: {e}")))?;
    let mut key = String::from_utf8_lossy(&version.stdout).trim().to_string();
    if !version.status.success() || key.is_empty() || !key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.') {
        let stderr = String::from_utf8_lossy(&version.stderr);
        return Err(Error::Unavailable(format!("`go env GOVERSION` failed: {}", stderr.trim())));
    }
    let mut files = Vec::new();
    collect(&go_dir, &mut files).map_err(Error::io(format!("reading {}", go_dir.display())))?;
    files.sort();
    let mut bytes = key.clone().into_bytes();
    for f in &files {
        let content = fs::read(f).map_err(Error::io(format!("reading {}", f.display())))?;
        let name = f.strip_prefix(&go_dir).unwrap_or(f).to_string_lossy().into_owned();
        // Lengths first: no two different trees give the same bytes.
        bytes.extend_from_slice(format!("\n{}:{}:{}\n", name.len(), name, content.len()).as_bytes());
        bytes.extend(content);
    }
    key.push('-');
    key.push_str(&api::archive::digest(&bytes)["sha256:".len()..][..16]);
    let seed = seed_root.join(&key);
    if seed.is_dir() {
        return Ok(seed);
    }
    sweep_dead_tmp(seed_root);
    log::info!("building the Go runtime's build cache once ({})", seed.display());
    let tmp = seed_root.join(format!("tmp-{}-{}", std::process::id(), sys::clock::monotonic_ns()));
    let made = (|| -> Result<()> {
        let code = tmp.join("code");
        fs::create_dir_all(&code).map_err(Error::io(format!("creating {}", code.display())))?;
        fs::write(
            code.join("seed.go"),
            "package seed\n\nimport staccato \"staccato.local/go/staccato\"\n\n\
             func Handle(ctx *staccato.Context, in []byte) ([]byte, error) { return in, nil }\n",
        )
        .map_err(Error::io("writing the seed function"))?;
        let out = Command::new("bash")
            .arg(&script)
            .arg(&code)
            .arg("Handle")
            .arg(tmp.join("worker"))
            .env("GOCACHE", tmp.join("gocache"))
            .env("GOPATH", tmp.join("gopath"))
            .env("GOPROXY", "off")
            .env("GOTOOLCHAIN", "local")
            .output()
            .map_err(Error::io(format!("running {}", script.display())))?;
        if !out.status.success() {
            let output = String::from_utf8_lossy(&out.stderr).into_owned();
            return Err(Error::BuildFailed { what: "building the Go seed".into(), output });
        }
        chmod_tree(&tmp.join("gocache"), Some(0o644)).map_err(Error::io("making the Go seed readable"))?;
        match fs::rename(tmp.join("gocache"), &seed) {
            // Another engine made it first.
            Err(_) if seed.is_dir() => Ok(()),
            r => r.map_err(Error::io(format!("publishing {}", seed.display()))),
        }
    })();
    let _ = chmod_tree(&tmp, None).and_then(|()| fs::remove_dir_all(&tmp));
    made.map(|()| seed)
}

/// Removes what seed builds of engines that died left (`tmp-<pid>-<n>`).
fn sweep_dead_tmp(seed_root: &Path) {
    let Ok(entries) = fs::read_dir(seed_root) else { return };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let pid = name.strip_prefix("tmp-").and_then(|r| r.split('-').next()).and_then(|p| p.parse::<u32>().ok());
        if pid.is_some_and(|p| !Path::new(&format!("/proc/{p}")).exists()) {
            let _ = chmod_tree(&e.path(), None).and_then(|()| fs::remove_dir_all(e.path()));
        }
    }
}

pub(crate) fn go_command() -> String {
    std::env::var("GO")
        .ok()
        .or_else(|| sandbox::which("go").map(|p| p.display().to_string()))
        .unwrap_or_else(|| "/usr/local/go/bin/go".into())
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) -> io::Result<()> {
    for e in fs::read_dir(dir)? {
        let p = e?.path();
        let ft = fs::symlink_metadata(&p)?.file_type();
        if ft.is_dir() {
            collect(&p, out)?;
        } else if ft.is_file() && p.extension().is_some_and(|x| x == "go" || x == "mod" || x == "sh") {
            out.push(p);
        }
    }
    Ok(())
}

/// Sets every directory below `p` to 0755 (so Go's read-only module cache
/// can be removed) and, with `files`, every file to that mode.
fn chmod_tree(p: &Path, files: Option<u32>) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let meta = fs::symlink_metadata(p)?;
    if meta.is_dir() {
        fs::set_permissions(p, fs::Permissions::from_mode(0o755))?;
        for e in fs::read_dir(p)? {
            chmod_tree(&e?.path(), files)?;
        }
    } else if let Some(mode) = files.filter(|_| meta.is_file()) {
        fs::set_permissions(p, fs::Permissions::from_mode(mode))?;
    }
    Ok(())
}
