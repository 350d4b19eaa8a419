//! A function's code on this engine: the copy taken at registration, what
//! each runtime builds from it (C/C++ libraries, Go worker binaries), its
//! dependencies (requirements.txt, package.json; go.mod is handled by the Go
//! build), and the command that starts its launcher.
//!
//! Runs on the supervisor thread: compilers and package managers may take
//! seconds and must never run on an I/O thread.

use crate::config::EngineConfig;
use crate::spec::{FunctionSpec, Runtime};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The handler library C and C++ functions are compiled into.
const NATIVE_LIBRARY: &str = "handler.so";
/// The worker binary a Go function is built into.
const GO_WORKER: &str = ".staccato-worker";
/// Where Python dependencies are installed, inside the function's code.
const PYTHON_DEPS: &str = ".deps";

pub(crate) fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    fs::create_dir_all(to)?;
    for e in fs::read_dir(from)? {
        let e = e?;
        let ty = e.file_type()?;
        let dest = to.join(e.file_name());
        if ty.is_dir() {
            // Built or installed artefacts are made again here.
            if matches!(e.file_name().to_str(), Some("__pycache__" | "node_modules" | ".deps" | ".git")) {
                continue;
            }
            copy_dir(&e.path(), &dest)?;
        } else if ty.is_file() {
            fs::copy(e.path(), dest)?;
        }
    }
    Ok(())
}

/// Builds and installs what the runtime needs. Errors are written for the
/// person deploying: which file, which tool, and the tool's own output.
pub(crate) fn prepare(cfg: &EngineConfig, spec: &FunctionSpec, code_dir: &Path) -> Result<(), String> {
    let handler = spec.handler_or_default();
    let need_file = |file: &str| {
        if code_dir.join(file).is_file() {
            Ok(())
        } else {
            Err(format!("handler file {file} not found in {}", spec.source_dir.display()))
        }
    };
    match spec.runtime {
        Runtime::Python => {
            let module = handler.split(':').next().unwrap_or("handler").replace('.', "/");
            if need_file(&format!("{module}.py")).is_err() && need_file(&format!("{module}/__init__.py")).is_err() {
                return Err(format!("handler module {module}.py not found in {}", spec.source_dir.display()));
            }
            if code_dir.join("requirements.txt").is_file() {
                let mut cmd = Command::new(&cfg.python);
                cmd.args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--target"])
                    .arg(code_dir.join(PYTHON_DEPS))
                    .args(["-r", "requirements.txt"]);
                run(cmd.current_dir(code_dir), "installing requirements.txt")?;
            }
            Ok(())
        }
        Runtime::Node => {
            need_file(handler.split(':').next().unwrap_or("handler.mjs"))?;
            if code_dir.join("package.json").is_file() {
                let mut cmd = Command::new("npm");
                cmd.args(["install", "--omit=dev", "--no-audit", "--no-fund", "--loglevel=error"]);
                run(cmd.current_dir(code_dir), "installing package.json dependencies")?;
            }
            Ok(())
        }
        Runtime::Go => {
            let script = cfg.runtimes_dir.join("go/build-function.sh");
            if !script.is_file() {
                return Err(format!("Go runtime not found at {}", script.display()));
            }
            let mut cmd = Command::new("bash");
            cmd.arg(&script).arg(code_dir).arg(&handler).arg(code_dir.join(GO_WORKER));
            run(&mut cmd, "building the Go function")
        }
        Runtime::C | Runtime::Cpp => {
            need_file(&handler)?;
            let mut cmd = if spec.runtime == Runtime::C {
                let mut c = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()));
                c.args(["-O2", "-fPIC", "-shared", "-Wall"]);
                c
            } else {
                let mut c = Command::new(std::env::var("CXX").unwrap_or_else(|_| "g++".into()));
                c.args(["-std=c++20", "-O2", "-fPIC", "-shared", "-Wall", "-I"])
                    .arg(cfg.runtimes_dir.join("cpp/include"));
                c
            };
            cmd.arg("-I").arg(cfg.runtimes_dir.join("c/include")).arg(&handler).arg("-o").arg(NATIVE_LIBRARY);
            run(cmd.current_dir(code_dir), &format!("compiling {handler}"))
        }
    }
}

fn run(cmd: &mut Command, what: &str) -> Result<(), String> {
    let out: Output = cmd.output().map_err(|e| format!("{what}: running {:?}: {e}", cmd.get_program()))?;
    if out.status.success() {
        return Ok(());
    }
    let mut text = String::from_utf8_lossy(&out.stderr).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stdout));
    let lines: Vec<&str> = text.lines().collect();
    Err(format!("{what} failed:\n{}", lines[lines.len().saturating_sub(30)..].join("\n")))
}

/// The command that starts a function's launcher (its working directory and
/// the common `STACCATO_*` environment are set by the caller).
pub(crate) fn launcher_command(cfg: &EngineConfig, spec: &FunctionSpec, code_dir: &Path) -> Result<Command, String> {
    let mut cmd = match spec.runtime {
        Runtime::Python => {
            let mut cmd = Command::new(&cfg.python);
            cmd.args(["-u", "-m", "staccato.launcher"]);
            let mut path = cfg.runtimes_dir.join("python").into_os_string();
            path.push(":");
            path.push(code_dir.join(PYTHON_DEPS));
            if let Some(old) = std::env::var_os("PYTHONPATH") {
                path.push(":");
                path.push(old);
            }
            cmd.env("PYTHONPATH", path).env("STACCATO_HANDLER", spec.handler_or_default());
            cmd
        }
        Runtime::Node => {
            let mut cmd = Command::new("node");
            cmd.arg(cfg.runtimes_dir.join("node/launcher.mjs")).env("STACCATO_HANDLER", spec.handler_or_default());
            cmd
        }
        Runtime::Go => Command::new(existing(code_dir.join(GO_WORKER), "Go worker binary")?),
        Runtime::C | Runtime::Cpp => {
            let host = existing(cfg.runtimes_dir.join("c/build/staccato-c-host"), "C runtime host (run `make build`)")?;
            let mut cmd = Command::new(host);
            cmd.env("STACCATO_HANDLER", code_dir.join(NATIVE_LIBRARY));
            cmd
        }
    };
    cmd.current_dir(code_dir);
    Ok(cmd)
}

fn existing(p: PathBuf, what: &str) -> Result<PathBuf, String> {
    if p.is_file() {
        Ok(p)
    } else {
        Err(format!("{what} not found at {}", p.display()))
    }
}
