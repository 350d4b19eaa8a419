//! A function's code on this engine: the source unpacked at registration, what
//! each runtime builds from it (C/C++ libraries, Go worker binaries), its
//! dependencies (requirements.txt, package.json; go.mod is handled by the Go
//! build), and the command that starts its launcher.
//!
//! Runs on a deploy's own thread: compilers and package managers may take
//! minutes and must hold up neither the I/O threads nor the supervisor.

use crate::build::Builds;
use crate::config::{
    ContainerConfig, EngineConfig, CONTAINER_CODE, CONTAINER_DEPS, CONTAINER_PYTHON, CONTAINER_RUNTIMES,
};
use crate::spec::{FunctionSpec, Runtime};
use crate::{Error, Result};

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Instant;

/// The handler library C and C++ functions are compiled into.
const NATIVE_LIBRARY: &str = "handler.so";
/// The worker binary a Go function is built into.
const GO_WORKER: &str = ".staccato-worker";

/// Where a sandboxed Go build leaves its caches for the next build of the
/// same source, in its output directory.
const GO_CACHES: &str = ".go-caches";

/// Runs build-function.sh in the sandbox: the build and module caches are
/// filled from $STACCATO_GO_START first (the seed: a build cache only; or a
/// source's cache: `gocache/` and `gomod/`), and with $STACCATO_GO_PUBLISH
/// copied to `.go-caches/` in the output directory after a good build.
const GO_BUILD_WRAPPER: &str = r#"set -e
mkdir -p "$GOCACHE" "$GOPATH/pkg/mod"
if [ -d "$STACCATO_GO_START/gocache" ]; then
    cp -R "$STACCATO_GO_START/gocache/." "$GOCACHE/"
    cp -R "$STACCATO_GO_START/gomod/." "$GOPATH/pkg/mod/"
else
    cp -R "$STACCATO_GO_START/." "$GOCACHE/"
fi
bash "$@"
if [ -n "$STACCATO_GO_PUBLISH" ]; then
    mkdir -p .go-caches
    cp -R "$GOCACHE" .go-caches/gocache
    cp -R "$GOPATH/pkg/mod" .go-caches/gomod
fi"#;

/// Builds and installs what the runtime needs. Errors are written for the
/// person deploying: which file, which tool, and the tool's own output.
pub(crate) fn prepare(
    cfg: &EngineConfig,
    builds: &Builds,
    spec: &FunctionSpec,
    code_dir: &Path,
    deadline: Option<Instant>,
) -> Result<Deps> {
    let mut deps = Deps::default();
    let handler = spec.handler_or_default();
    let need_file = |file: &str| {
        if code_dir.join(file).is_file() {
            Ok(())
        } else {
            Err(Error::Source(format!("handler file {file} not found in the function's source")))
        }
    };
    match spec.runtime {
        Runtime::Python => {
            let module = handler.split(':').next().unwrap_or("handler").replace('.', "/");
            if need_file(&format!("{module}.py")).is_err() && need_file(&format!("{module}/__init__.py")).is_err() {
                return Err(Error::Source(format!("handler module {module}.py not found in the function's source")));
            }
            if code_dir.join("requirements.txt").is_file() {
                let cache = open_cache(cfg)?.with_runner(builds.runner(deadline)?);
                // In a container the real interpreter, not a shim on PATH.
                let python = cfg.containers.as_ref().map_or(Path::new(&cfg.python), |cc| cc.python_exe.as_path());
                let r = cache.python(python, &code_dir.join("requirements.txt"), &mut progress(spec))?;
                deps.python = r.dirs;
                deps.entries = r.entries;
                deps.summary = summary(r.installed, r.cached);
            }
            Ok(deps)
        }
        Runtime::Node => {
            need_file(handler.split(':').next().unwrap_or("handler.mjs"))?;
            if code_dir.join("package.json").is_file() {
                let cache = open_cache(cfg)?.with_runner(builds.runner(deadline)?);
                let r = cache.node(code_dir, &mut progress(spec))?;
                let modules =
                    r.dirs.first().cloned().ok_or(Error::Build("the package cache returned no node_modules".into()))?;
                // Node resolves packages by walking up from the handler: a
                // link for plain processes; containers mount it at /node_modules.
                std::os::unix::fs::symlink(&modules, code_dir.join("node_modules"))
                    .map_err(Error::io("linking node_modules"))?;
                deps.node = Some(modules);
                deps.entries = r.entries;
                deps.summary = summary(r.installed, r.cached);
            }
            Ok(deps)
        }
        Runtime::Go => {
            let script = cfg.runtimes_dir.join("go/build-function.sh");
            if !script.is_file() {
                return Err(Error::Unavailable(format!("Go runtime not found at {}", script.display())));
            }
            let out = BuildDir::new(code_dir)?;
            let mut reads = vec![code_dir.to_path_buf(), cfg.runtimes_dir.join("go")];
            let mut cmd = Command::new("bash");
            builds.runner(deadline)?; // fails here if the engine has no build sandbox
            let mut source_cache = None;
            if builds.sandboxed() {
                // A private copy of the trusted seed cache, or of the caches
                // an earlier build of this same source left (GoSourceCache):
                // warm, and nothing a build writes reaches another source's.
                let seed = builds.go_seed(cfg)?;
                let cache = builds.go_source_cache(cfg, &seed, &spec.source)?;
                let (start, publish) = match cache.dir.is_dir() {
                    true => (cache.dir.clone(), ""),
                    false => (seed.clone(), "publish"),
                };
                cmd.args(["-c", GO_BUILD_WRAPPER])
                    .arg("go-build")
                    .env("STACCATO_GO_START", &start)
                    .env("STACCATO_GO_PUBLISH", publish)
                    .env("GOCACHE", format!("{}/gocache", sandbox::BUILD_TMP))
                    .env("GOPATH", format!("{}/go", sandbox::BUILD_TMP))
                    .env("GOTOOLCHAIN", "local");
                reads.push(start);
                source_cache = Some(cache);
            }
            cmd.arg(&script).arg(code_dir).arg(&handler).arg(out.path().join(GO_WORKER)).current_dir(out.path());
            run(builds, deadline, &mut cmd, &reads, out.path(), "building the Go function")?;
            if let Some(cache) = &source_cache {
                builds.publish_go_source_cache(cache, &out.path().join(GO_CACHES))?;
            }
            out.take(GO_WORKER, code_dir)?;
            Ok(deps)
        }
        Runtime::C | Runtime::Cpp => {
            need_file(&handler)?;
            let out = BuildDir::new(code_dir)?;
            let mut reads = vec![code_dir.to_path_buf(), cfg.runtimes_dir.join("c/include")];
            let mut cmd = if spec.runtime == Runtime::C {
                let mut c = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()));
                c.args(["-O2", "-fPIC", "-shared", "-Wall"]);
                c
            } else {
                let mut c = Command::new(std::env::var("CXX").unwrap_or_else(|_| "g++".into()));
                c.args(["-std=c++20", "-O2", "-fPIC", "-shared", "-Wall", "-I"])
                    .arg(cfg.runtimes_dir.join("cpp/include"));
                reads.push(cfg.runtimes_dir.join("cpp/include"));
                c
            };
            cmd.arg("-I")
                .arg(cfg.runtimes_dir.join("c/include"))
                .arg(&handler)
                .arg("-o")
                .arg(out.path().join(NATIVE_LIBRARY))
                .current_dir(code_dir);
            run(builds, deadline, &mut cmd, &reads, out.path(), &format!("compiling {handler}"))?;
            out.take(NATIVE_LIBRARY, code_dir)?;
            Ok(deps)
        }
    }
}

/// Where a build step writes: beside the code directory (never inside it:
/// the code is mounted read-only in the sandbox), removed when done.
struct BuildDir(PathBuf);

impl BuildDir {
    fn new(code_dir: &Path) -> Result<BuildDir> {
        let dir = code_dir.with_extension("build");
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).map_err(Error::io(format!("creating {}", dir.display())))?;
        Ok(BuildDir(dir))
    }

    fn path(&self) -> &Path {
        &self.0
    }

    /// Moves the one file the step was to make into the code directory.
    fn take(&self, name: &str, code_dir: &Path) -> Result<()> {
        let made = self.0.join(name);
        match std::fs::symlink_metadata(&made) {
            Ok(m) if m.is_file() => {}
            _ => return Err(Error::Build(format!("the build made no {name}"))),
        }
        std::fs::rename(&made, code_dir.join(name)).map_err(Error::io(format!("moving {name} into place")))
    }
}

impl Drop for BuildDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A function's dependencies, from the package cache (Nuka §III.B).
#[derive(Clone, Default, Debug)]
pub(crate) struct Deps {
    /// sys.path directories, one per distribution.
    pub python: Vec<PathBuf>,
    /// The node_modules tree.
    pub node: Option<PathBuf>,
    /// Cache entry ids, pinned while the function is deployed.
    pub entries: Vec<String>,
    /// For the person deploying: "2 installed, 1 from the cache".
    pub summary: String,
}

pub(crate) fn open_cache(cfg: &EngineConfig) -> Result<pkgcache::Cache> {
    pkgcache::Cache::open(&cfg.cache_dir, cfg.cache_budget_bytes)
        .map_err(Error::io(format!("opening the package cache {}", cfg.cache_dir.display())))
}

fn progress(spec: &FunctionSpec) -> impl FnMut(&str) + '_ {
    move |line: &str| log::info!("{}: {line}", spec.name)
}

fn summary(installed: usize, cached: usize) -> String {
    format!("dependencies: {installed} installed, {cached} from the cache")
}

fn run(
    builds: &Builds,
    deadline: Option<Instant>,
    cmd: &mut Command,
    reads: &[PathBuf],
    output: &Path,
    what: &str,
) -> Result<()> {
    let out: Output = match builds.runner(deadline)?.output(cmd, reads, Some(output)) {
        Ok(out) => out,
        Err(pkgcache::RunError::Spawn(e)) => {
            return Err(Error::Build(format!("{what}: running {:?}: {e}", cmd.get_program())))
        }
        Err(pkgcache::RunError::Stopped(why)) => return Err(Error::Build(format!("{what}: {why}"))),
    };
    if out.status.success() {
        return Ok(());
    }
    let mut text = String::from_utf8_lossy(&out.stderr).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stdout));
    let lines: Vec<&str> = text.lines().collect();
    Err(Error::BuildFailed { what: what.to_string(), output: lines[lines.len().saturating_sub(30)..].join("\n") })
}

/// Where a launcher finds things: the host's paths for a plain process, or
/// the fixed places a function container mounts them at.
pub(crate) struct View {
    deps: Deps,
    runtimes: PathBuf,
    code: PathBuf,
    python: PathBuf,
    node: PathBuf,
    inherit_pythonpath: bool,
    /// In a container: the interpreter runs without `site` (`-S`), so the
    /// prefix's site-packages stay out of a function's path (it sees the
    /// standard library, the runtime, its own dependencies), and the
    /// runtime's one optional package (uvloop) comes from here.
    isolated_site: Option<PathBuf>,
}

impl View {
    pub fn host(cfg: &EngineConfig, code_dir: &Path, deps: &Deps) -> View {
        View {
            deps: deps.clone(),
            runtimes: cfg.runtimes_dir.clone(),
            code: code_dir.to_path_buf(),
            python: cfg.python.clone().into(),
            node: "node".into(),
            inherit_pythonpath: true,
            isolated_site: None,
        }
    }

    pub fn container(cc: &ContainerConfig, deps: &Deps) -> View {
        let exe = cc.python_exe.strip_prefix(&cc.python_prefix).unwrap_or(Path::new("bin/python3"));
        let mut deps = deps.clone();
        // Mounted at /deps/<i> and /node_modules (see dep_mounts).
        let hosts = std::mem::take(&mut deps.python);
        deps.python = (0..hosts.len()).map(|i| Path::new(CONTAINER_DEPS).join(i.to_string())).collect();
        View {
            deps,
            runtimes: CONTAINER_RUNTIMES.into(),
            code: CONTAINER_CODE.into(),
            python: Path::new(CONTAINER_PYTHON).join(exe),
            // /usr is the host's, bound read-only.
            node: sandbox::which("node").unwrap_or_else(|| "/usr/bin/node".into()),
            inherit_pythonpath: false,
            isolated_site: Some(crate::config::CONTAINER_VENDOR.into()),
        }
    }

    /// Read-only mounts of the function's cached dependencies: only those
    /// it uses, never the whole cache.
    pub fn dep_mounts(deps: &Deps) -> Vec<sandbox::Mount> {
        let mut m: Vec<sandbox::Mount> = deps
            .python
            .iter()
            .cloned()
            .enumerate()
            .map(|(i, src)| sandbox::Mount {
                src,
                dst: Path::new(CONTAINER_DEPS).join(i.to_string()),
                read_only: true,
                exec: false,
            })
            .collect();
        if let Some(src) = deps.node.clone() {
            m.push(sandbox::Mount { src, dst: "/node_modules".into(), read_only: true, exec: false });
        }
        m
    }
}

/// The command that starts a function's launcher (its working directory and
/// the common `STACCATO_*` environment are set by the caller).
pub(crate) fn launcher_command(cfg: &EngineConfig, spec: &FunctionSpec, view: &View) -> Result<Command> {
    let code_dir = &view.code;
    let mut cmd = match spec.runtime {
        Runtime::Python => {
            let mut cmd = Command::new(&view.python);
            if view.isolated_site.is_some() {
                cmd.arg("-S");
            }
            cmd.args(["-u", "-m", "staccato.launcher"]);
            let mut path = view.runtimes.join("python").into_os_string();
            for d in &view.deps.python {
                path.push(":");
                path.push(d);
            }
            // After the function's own dependencies: on a cold start its
            // uvloop wins (a warm interpreter has imported this one).
            if let Some(v) = &view.isolated_site {
                path.push(":");
                path.push(v);
            }
            if let Some(old) = std::env::var_os("PYTHONPATH").filter(|_| view.inherit_pythonpath) {
                path.push(":");
                path.push(old);
            }
            cmd.env("PYTHONPATH", path).env("STACCATO_HANDLER", spec.handler_or_default());
            if spec.worker_mode == crate::spec::WorkerMode::Fork {
                cmd.env("STACCATO_WORKER_MODE", "fork");
            }
            cmd
        }
        Runtime::Node => {
            let mut cmd = Command::new(&view.node);
            // --expose-gc: for the launcher's warm-up before its hello
            // (runtime.mjs warmUp), hidden from handlers.
            cmd.arg("--expose-gc")
                .arg(view.runtimes.join("node/launcher.mjs"))
                .env("STACCATO_HANDLER", spec.handler_or_default());
            cmd
        }
        Runtime::Go => Command::new(code_dir.join(GO_WORKER)),
        Runtime::C | Runtime::Cpp => {
            // Checked on the host: a container sees the same files elsewhere.
            existing(cfg.runtimes_dir.join("c/build/staccato-c-host"), "C runtime host (run `make build`)")?;
            let mut cmd = Command::new(view.runtimes.join("c/build/staccato-c-host"));
            cmd.env("STACCATO_HANDLER", code_dir.join(NATIVE_LIBRARY));
            cmd
        }
    };
    cmd.current_dir(code_dir);
    Ok(cmd)
}

fn existing(p: PathBuf, what: &str) -> Result<PathBuf> {
    if p.is_file() {
        Ok(p)
    } else {
        Err(Error::Unavailable(format!("{what} not found at {}", p.display())))
    }
}
