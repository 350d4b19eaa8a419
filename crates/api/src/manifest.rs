//! Function manifests: YAML in the spirit of faas-cli's stack.yml, several
//! functions per file.
//!
//! ```yaml
//! version: 1
//! functions:
//!   hello:
//!     runtime: python          # python | c
//!     handler: handler:handle  # python module:function; c: source file
//!     source: ./hello          # directory, relative to this file
//!     min_workers: 1
//!     max_workers: 8
//!     timeout: 5s              # 250ms, 5s, 2m, or a number of milliseconds
//!     max_queue: 1024          # calls waiting at once; more are `overloaded`
//!     env: { GREETING: hi }
//!     memory: 128Mi            # container memory limit (Ki, Mi, Gi or bytes)
//!     pids: 64                 # container process limit
//!     worker_mode: fork        # python: workers forked from the launcher
//!     cpu_shares: 512          # a CPU group of its own with this weight
//!     placement:               # default: every engine
//!       engines: 2             # on two engines (0: all)
//!       labels: { zone: a }    # that joined with --label zone=a
//!     auth: key                # calls need an invoke key (default: none)
//!     secrets: [db-password]   # read at /var/secrets/db-password
//!     grpc: helloworld.Greeter/SayHello  # or a list: gRPC methods it serves
//!     async:                   # calls through /async-function/{name}
//!       retries: 3             # attempts after the first (default 3)
//!       backoff: 100ms         # before retry n: backoff * 2^(n-1)
//!       queue: 1000            # accepted and unfinished, at most
//!       concurrency: 2         # running at once (default max_workers/2)
//!       retry_on: [timeout, worker_crashed, engine_unavailable]
//! ```
//!
//! Every error names the line it is about.

use crate::spec::{self, FunctionSpec, Runtime, SpecError};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// What is wrong with a manifest, and the 1-based line it is about (0
/// when no line can be named).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}{message}", if *line > 0 { format!("line {line}: ") } else { String::new() })]
pub struct ManifestError {
    pub line: usize,
    pub message: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Manifest {
    #[serde(default)]
    version: Option<u32>,
    functions: BTreeMap<String, Entry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    runtime: Runtime,
    #[serde(default)]
    handler: String,
    #[serde(default)]
    source: Option<String>,
    #[serde(default = "spec::default_min_workers")]
    min_workers: u32,
    #[serde(default = "spec::default_max_workers")]
    max_workers: u32,
    #[serde(default)]
    timeout: Option<yaml_serde::Value>,
    #[serde(default = "spec::default_max_queue")]
    max_queue: u32,
    #[serde(default)]
    env: BTreeMap<String, String>,
    #[serde(default)]
    memory: Option<yaml_serde::Value>,
    #[serde(default = "spec::default_pids")]
    pids: u32,
    #[serde(default)]
    worker_mode: spec::WorkerMode,
    #[serde(default)]
    cpu_shares: Option<u32>,
    #[serde(default)]
    placement: spec::Placement,
    #[serde(default)]
    auth: spec::Auth,
    #[serde(default)]
    secrets: Vec<String>,
    #[serde(default, rename = "async")]
    async_calls: Option<AsyncEntry>,
    #[serde(default)]
    grpc: Option<OneOrMany>,
}

/// A string, or a list of them.
#[derive(Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AsyncEntry {
    #[serde(default = "spec::default_async_retries")]
    retries: u32,
    #[serde(default)]
    backoff: Option<yaml_serde::Value>,
    #[serde(default = "spec::default_async_queue")]
    queue: u32,
    #[serde(default)]
    concurrency: u32,
    #[serde(default = "spec::default_async_retry_on")]
    retry_on: Vec<String>,
}

/// One function of a manifest: its settings, and the directory on the
/// deploying machine its source comes from (packed and uploaded by the CLI,
/// which then puts the archive's digest in `spec.source`).
#[derive(Clone, Debug, PartialEq)]
pub struct ManifestFunction {
    pub spec: FunctionSpec,
    pub source_dir: PathBuf,
}

/// Parses a manifest; relative `source` paths are resolved against `base`.
pub fn parse(text: &str, base: &Path) -> Result<Vec<ManifestFunction>, ManifestError> {
    let m: Manifest = yaml_serde::from_str(text).map_err(|e| ManifestError {
        line: e.location().map_or(0, |l| l.line()),
        message: e.to_string().split(" at line ").next().unwrap_or_default().to_string(),
    })?;
    if let Some(v) = m.version {
        if v != 1 {
            return Err(ManifestError { line: line_of(text, "version:"), message: format!("unsupported version {v}") });
        }
    }
    if m.functions.is_empty() {
        return Err(ManifestError { line: line_of(text, "functions:"), message: "no functions defined".into() });
    }
    let mut out = Vec::new();
    for (name, e) in m.functions {
        let line = line_of(text, &format!("{name}:"));
        let err = |e: SpecError| ManifestError { line, message: format!("function {name}: {e}") };
        let timeout_ms = match &e.timeout {
            None => spec::default_timeout_ms(),
            Some(v) => parse_duration_ms(v, "timeout").map_err(err)?,
        };
        let memory_bytes = match &e.memory {
            None => spec::default_memory_bytes(),
            Some(v) => parse_size(v).map_err(err)?,
        };
        let async_calls = match e.async_calls {
            None => spec::AsyncSettings::default(),
            Some(a) => spec::AsyncSettings {
                retries: a.retries,
                backoff_ms: match &a.backoff {
                    None => spec::default_async_backoff_ms(),
                    Some(v) => parse_duration_ms(v, "async.backoff").map_err(err)?,
                }
                .max(1),
                queue: a.queue,
                concurrency: a.concurrency,
                retry_on: a.retry_on,
            },
        };
        let source = e.source.as_deref().unwrap_or(".");
        let dir = base.join(source);
        let source_dir =
            dir.canonicalize().map_err(|x| err(SpecError::new("source", format!("source {}: {x}", dir.display()))))?;
        let s = FunctionSpec {
            name: name.clone(),
            runtime: e.runtime,
            handler: e.handler,
            source: String::new(),
            min_workers: e.min_workers,
            max_workers: e.max_workers,
            timeout_ms,
            max_queue: e.max_queue,
            env: e.env,
            memory_bytes,
            pids: e.pids,
            worker_mode: e.worker_mode,
            cpu_shares: e.cpu_shares,
            placement: e.placement,
            auth: e.auth,
            secrets: e.secrets,
            async_calls,
            grpc: match e.grpc {
                None => Vec::new(),
                Some(OneOrMany::One(m)) => vec![m],
                Some(OneOrMany::Many(v)) => v,
            },
        };
        s.validate_settings().map_err(err)?;
        out.push(ManifestFunction { spec: s, source_dir });
    }
    Ok(out)
}

/// A timeout: a YAML number of milliseconds or a duration string
/// ([`crate::units::parse_duration`], a bare number being milliseconds).
fn parse_duration_ms(v: &yaml_serde::Value, field: &'static str) -> Result<u64, SpecError> {
    if let Some(n) = v.as_u64() {
        return Ok(n);
    }
    let err = |message| SpecError::new(field, message);
    let s = v.as_str().ok_or_else(|| err(format!("{field} must be a duration like 5s, got {v:?}")))?;
    let d = crate::units::parse_duration(s, std::time::Duration::from_millis(1))
        .map_err(|e| err(format!("{field}: {e}")))?;
    Ok((d.as_secs_f64() * 1e3).round() as u64)
}

/// A memory limit: a YAML number of bytes or a size string
/// ([`crate::units::parse_size`]: `128Mi`, `1Gi`, `512M`).
fn parse_size(v: &yaml_serde::Value) -> Result<u64, SpecError> {
    if let Some(n) = v.as_u64() {
        return Ok(n);
    }
    let err = |message| SpecError::new("memory", message);
    let s = v.as_str().ok_or_else(|| err(format!("memory must be a size like 128Mi, got {v:?}")))?;
    crate::units::parse_size(s).map_err(|e| err(format!("memory: {e}")))
}

/// The 1-based line where `needle` first starts a (trimmed) line; 0 if none.
fn line_of(text: &str, needle: &str) -> usize {
    text.lines().position(|l| l.trim_start().starts_with(needle)).map_or(0, |i| i + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> std::path::PathBuf {
        std::env::temp_dir()
    }

    #[test]
    fn parses_several_functions() {
        let y = "version: 1\nfunctions:\n  a:\n    runtime: python\n    timeout: 250ms\n  b:\n    runtime: c\n    handler: nop.c\n    max_workers: 2\n    min_workers: 0\n    timeout: 2s\n";
        let specs: Vec<FunctionSpec> = parse(y, &base()).expect("valid").into_iter().map(|f| f.spec).collect();
        assert_eq!(specs.len(), 2);
        assert_eq!(specs[0].timeout_ms, 250);
        assert_eq!(specs[1].timeout_ms, 2000);
        assert_eq!(specs[1].runtime, Runtime::C);
        assert_eq!(specs[0].memory_bytes, spec::default_memory_bytes());
        let y = "functions:\n  a:\n    runtime: c\n    memory: 64Mi\n    pids: 32\n";
        let specs: Vec<FunctionSpec> = parse(y, &base()).expect("valid").into_iter().map(|f| f.spec).collect();
        assert_eq!((specs[0].memory_bytes, specs[0].pids), (64 << 20, 32));
        assert!(specs[0].placement.is_everywhere());
        let y = "functions:\n  a:\n    runtime: c\n    placement:\n      engines: 2\n      labels: { zone: a }\n";
        let specs: Vec<FunctionSpec> = parse(y, &base()).expect("valid").into_iter().map(|f| f.spec).collect();
        assert_eq!(specs[0].placement.engines, 2);
        assert_eq!(specs[0].placement.labels.get("zone").map(String::as_str), Some("a"));
    }

    #[test]
    fn errors_name_the_line() {
        let y = "functions:\n  a:\n    runtime: ruby\n";
        let e = parse(y, &base()).unwrap_err();
        assert_eq!(e.line, 3, "{e}");
        assert!(e.message.contains("ruby") || e.message.contains("unknown variant"), "{e}");

        let y = "functions:\n  a:\n    runtime: python\n  b:\n    runtime: python\n    min_workers: 5\n    max_workers: 2\n";
        let e = parse(y, &base()).unwrap_err();
        assert_eq!(e.line, 4, "{e}");
        assert!(e.message.contains("min_workers"), "{e}");

        let y = "functions:\n  a:\n    runtime: python\n    colour: blue\n";
        let e = parse(y, &base()).unwrap_err();
        assert!(e.line >= 3 && e.message.contains("colour"), "{e}");

        let y = "functions:\n  a:\n    runtime: python\n    timeout: soon\n";
        let e = parse(y, &base()).unwrap_err();
        assert_eq!(e.line, 2, "{e}");
        assert!(e.message.contains("soon"), "{e}");

        let y = "functions:\n  a:\n    runtime: python\n    memory: lots\n";
        let e = parse(y, &base()).unwrap_err();
        assert!(e.message.contains("lots"), "{e}");

        let y = "functions:\n  a:\n    runtime: python\n    memory: 8Mi\n";
        let e = parse(y, &base()).unwrap_err();
        assert!(e.message.contains("16Mi"), "{e}");

        let y = "functions:\n  a:\n    runtime: python\n    placement: { engines: 1, labels: { 'a b': c } }\n";
        let e = parse(y, &base()).unwrap_err();
        assert!(e.message.contains("placement.labels") && e.line == 2, "{e}");
        let y = "functions:\n  a:\n    runtime: python\n    placement: { hosts: 2 }\n";
        let e = parse(y, &base()).unwrap_err();
        assert!(e.message.contains("hosts"), "{e}");

        let e = parse("functions: [", &base()).unwrap_err();
        assert!(e.line >= 1, "{e}");

        let y = "functions:\n  a:\n    runtime: python\n    secrets: [ok, ../../etc/shadow]\n";
        let e = parse(y, &base()).unwrap_err();
        assert!(e.message.contains("invalid secret name") && e.line == 2, "{e}");
        let y = "functions:\n  a:\n    runtime: python\n    secrets: [pw, pw]\n";
        let e = parse(y, &base()).unwrap_err();
        assert!(e.message.contains("named twice"), "{e}");

        let y = "functions:\n  a:\n    runtime: python\n    auth: password\n";
        let e = parse(y, &base()).unwrap_err();
        assert!(e.message.contains("password") && e.message.contains("key"), "{e}");
    }

    #[test]
    fn auth_key_is_kept_and_none_is_the_default() {
        let y = "functions:\n  a:\n    runtime: python\n    auth: key\n  b:\n    runtime: python\n";
        let fs = parse(y, &base()).unwrap();
        assert_eq!(fs[0].spec.auth, spec::Auth::Key);
        assert_eq!(fs[1].spec.auth, spec::Auth::None);
        // A spec without auth serializes as before invoke keys existed.
        assert!(!serde_json::to_string(&fs[1].spec).unwrap().contains("auth"));
        assert!(serde_json::to_string(&fs[0].spec).unwrap().contains("\"auth\":\"key\""));
    }

    /// Manifests come from users: mutated and truncated ones must give an
    /// error (with a line when it has one), never a panic.
    #[test]
    fn mutated_manifests_never_panic() {
        let good = "version: 1\nfunctions:\n  a:\n    runtime: python\n    handler: m:f\n    min_workers: 1\n    \
                    max_workers: 4\n    timeout: 2s\n    env: { K: v }\n  b:\n    runtime: c\n    handler: x.c\n";
        let bytes = good.as_bytes();
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let alphabet = b" :-{}[],\n\t'\"#&*!|>%@`0123456789abcxyz";
        for _ in 0..3000 {
            let mut m = bytes.to_vec();
            for _ in 0..(next() % 4 + 1) {
                if m.is_empty() {
                    break;
                }
                let i = (next() % m.len() as u64) as usize;
                match next() % 3 {
                    0 => m[i] = alphabet[(next() % alphabet.len() as u64) as usize],
                    1 => {
                        m.remove(i);
                    }
                    _ => m.truncate(i.max(1)),
                }
            }
            let text = String::from_utf8_lossy(&m);
            if let Err(e) = parse(&text, &base()) {
                assert!(!e.message.is_empty());
            }
        }
    }

    #[test]
    fn async_settings_are_read() {
        let y = "functions:\n  a:\n    runtime: python\n    max_workers: 8\n    async:\n      retries: 1\n      \
                 backoff: 2s\n      queue: 5\n      retry_on: [function_error]\n  b:\n    runtime: python\n";
        let fs = parse(y, Path::new(".")).unwrap();
        let a = &fs[0].spec.async_calls;
        assert_eq!((a.retries, a.backoff_ms, a.queue, a.concurrency), (1, 2000, 5, 0));
        assert_eq!(a.retry_on, ["function_error"]);
        assert_eq!(a.concurrency_for(fs[0].spec.max_workers), 4);
        assert!(fs[1].spec.async_calls.is_default());
        let y = "functions:\n  a:\n    runtime: python\n    async: { backoff: soon }\n";
        let e = parse(y, Path::new(".")).unwrap_err();
        assert!(e.message.contains("async.backoff") && e.line == 2, "{e}");
        let y = "functions:\n  a:\n    runtime: python\n    async: { retries: 2, tries: 3 }\n";
        assert!(parse(y, Path::new(".")).unwrap_err().message.contains("tries"));
        let y = "functions:\n  a:\n    runtime: python\n    async: { retry_on: [bad_request] }\n";
        assert!(parse(y, Path::new(".")).unwrap_err().message.contains("may be retried"));
    }

    #[test]
    fn grpc_methods_are_one_or_a_list() {
        let y = "functions:\n  a:\n    runtime: python\n    grpc: helloworld.Greeter/SayHello\n  b:\n    runtime: python\n    \
                 grpc: [x.S/A, x.S/B]\n";
        let fs = parse(y, Path::new(".")).unwrap();
        assert_eq!(fs[0].spec.grpc, ["helloworld.Greeter/SayHello"]);
        assert_eq!(fs[1].spec.grpc, ["x.S/A", "x.S/B"]);
        let y = "functions:\n  a:\n    runtime: python\n    grpc: /bad\n";
        assert!(parse(y, Path::new(".")).unwrap_err().message.contains("gRPC method"));
    }
}
