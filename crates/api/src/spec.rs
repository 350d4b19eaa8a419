//! What a deployed function is: the engine's view of one manifest entry.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Runtime {
    Python,
    C,
    Node,
    Go,
    Cpp,
}

impl Runtime {
    pub const ALL: [Runtime; 5] = [Runtime::Python, Runtime::Node, Runtime::Go, Runtime::C, Runtime::Cpp];

    pub fn name(self) -> &'static str {
        match self {
            Runtime::Python => "python",
            Runtime::C => "c",
            Runtime::Node => "node",
            Runtime::Go => "go",
            Runtime::Cpp => "cpp",
        }
    }

    /// Whether one process serves every worker channel of a function
    /// (Nightcore §4.2: Python and Node.js event loops, Go goroutines), as
    /// opposed to a process per worker (C, C++).
    pub fn multiplexed(self) -> bool {
        matches!(self, Runtime::Python | Runtime::Node | Runtime::Go)
    }

    /// Whether its runtime can measure a call's CPU time (the handler's
    /// thread: a C/C++ worker runs one call at a time; Python's plain def
    /// handlers run on the loop's thread start to end). Node.js handlers
    /// and Go goroutines share threads with other calls: not attributable.
    pub fn measures_cpu(self) -> bool {
        matches!(self, Runtime::C | Runtime::Cpp | Runtime::Python)
    }
}

/// A function as registered with an engine. `source` names its code: the
/// digest of the source archive the CLI uploaded (see [`crate::archive`]),
/// which travels with the registration; no server reads a path a user names.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FunctionSpec {
    pub name: String,
    pub runtime: Runtime,
    /// Python: `module:function` (default `handler:handle`). Node.js:
    /// `file:export` (default `handler.mjs:handle`). Go: the exported
    /// function (default `Handle`). C / C++: the source file compiled into
    /// the handler library (default `handler.c` / `handler.cpp`).
    #[serde(default)]
    pub handler: String,
    pub source: String,
    #[serde(default = "default_min_workers")]
    pub min_workers: u32,
    #[serde(default = "default_max_workers")]
    pub max_workers: u32,
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    /// Calls that may wait for a worker at once; one more is refused at
    /// once (`overloaded`, 503, retryable) instead of waiting towards its
    /// timeout behind the others.
    #[serde(default = "default_max_queue")]
    pub max_queue: u32,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// The container's memory limit (swap included); the kernel kills a
    /// function that goes beyond it and its callers get `out_of_memory`.
    #[serde(default = "default_memory_bytes")]
    pub memory_bytes: u64,
    /// The container's process limit (a fork bomb stops here).
    #[serde(default = "default_pids")]
    pub pids: u32,
    /// A CPU group of its own with this weight (cgroup cpu.shares; 1024 is
    /// a normal share). Unset: the function shares the engine's CPU group,
    /// which is faster (see sandbox::shared_cpu_group).
    #[serde(default)]
    pub cpu_shares: Option<u32>,
    /// How a Python launcher makes workers (see runtimes/python/README.md).
    #[serde(default)]
    pub worker_mode: WorkerMode,
    /// Which engines run it (a gateway's concern; an engine runs what it
    /// is given). Default: every engine.
    #[serde(default, skip_serializing_if = "Placement::is_everywhere")]
    pub placement: Placement,
    /// Who may call it from outside. Left out when `none`, so a spec from
    /// before invoke keys keeps its fingerprint.
    #[serde(default, skip_serializing_if = "Auth::is_none")]
    pub auth: Auth,
    /// Secrets it reads at `/var/secrets/NAME` (names only: values travel
    /// apart, see [`crate::secrets`]). Left out when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<String>,
    /// gRPC methods (`package.Service/Method`) the gateway's gRPC port maps
    /// to this function: the request message is its input, its output the
    /// response message.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub grpc: Vec<String>,
    /// How calls through `/async-function/{name}` are queued and retried.
    #[serde(rename = "async", default, skip_serializing_if = "AsyncSettings::is_default")]
    pub async_calls: AsyncSettings,
}

/// A function's asynchronous calls (`async:` in a manifest): queued
/// durably by the gateway, run at most `concurrency` at a time, and tried
/// again with exponential backoff after the errors in `retry_on`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AsyncSettings {
    /// Attempts after the first (0: none).
    #[serde(default = "default_async_retries")]
    pub retries: u32,
    /// Before the n-th retry the call waits `backoff_ms * 2^(n-1)` (at most
    /// [`ASYNC_BACKOFF_CAP_MS`]), give or take a quarter.
    #[serde(default = "default_async_backoff_ms")]
    pub backoff_ms: u64,
    /// Calls accepted and not finished, at most; more get 429.
    #[serde(default = "default_async_queue")]
    pub queue: u32,
    /// Async calls running at once, at most; 0: half of `max_workers`
    /// (at least one), so synchronous calls always find workers.
    #[serde(default)]
    pub concurrency: u32,
    /// The error kinds that are tried again (wire error names).
    #[serde(default = "default_async_retry_on")]
    pub retry_on: Vec<String>,
}

pub fn default_async_retries() -> u32 {
    3
}
pub fn default_async_backoff_ms() -> u64 {
    100
}
pub fn default_async_queue() -> u32 {
    1000
}
pub fn default_async_retry_on() -> Vec<String> {
    ["worker_crashed", "timeout", "engine_unavailable"].map(String::from).to_vec()
}

/// gRPC methods one function may serve, at most.
pub const GRPC_METHODS_MAX: usize = 16;

/// `package.Service/Method` (the package may be empty or dotted): what a
/// gRPC request's path is after its leading `/`. Identifiers of ASCII
/// letters, digits and `_`, not starting with a digit; 256 bytes at most.
pub fn valid_grpc_method(m: &str) -> bool {
    let ident = |s: &str| {
        !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') && !s.as_bytes()[0].is_ascii_digit()
    };
    let Some((service, method)) = m.split_once('/') else { return false };
    m.len() <= 256 && ident(method) && service.split('.').all(ident)
}

/// At most this many retries of one call.
pub const ASYNC_RETRIES_MAX: u32 = 20;
/// The longest wait between two attempts.
pub const ASYNC_BACKOFF_CAP_MS: u64 = 5 * 60 * 1000;
/// The most async calls one function may have waiting.
pub const ASYNC_QUEUE_MAX: u32 = 1_000_000;

/// The error kinds an async call may be tried again after: those of the
/// runtime and of a handler that failed. A call that cannot succeed as sent
/// (not_found, bad_request, payload_too_large, call_cycle, ...) is not.
pub const ASYNC_RETRYABLE: [&str; 6] =
    ["worker_crashed", "timeout", "engine_unavailable", "function_error", "out_of_memory", "overloaded"];

impl Default for AsyncSettings {
    fn default() -> AsyncSettings {
        AsyncSettings {
            retries: default_async_retries(),
            backoff_ms: default_async_backoff_ms(),
            queue: default_async_queue(),
            concurrency: 0,
            retry_on: default_async_retry_on(),
        }
    }
}

impl AsyncSettings {
    pub fn is_default(&self) -> bool {
        *self == AsyncSettings::default()
    }

    /// Async calls of a function with `max_workers` that may run at once.
    pub fn concurrency_for(&self, max_workers: u32) -> u32 {
        if self.concurrency > 0 {
            self.concurrency
        } else {
            (max_workers / 2).max(1)
        }
    }

    /// How long to wait before retry `n` (1-based), without the jitter.
    pub fn backoff_before(&self, n: u32) -> u64 {
        let doubled = self.backoff_ms.saturating_mul(1u64 << n.saturating_sub(1).min(40));
        doubled.min(ASYNC_BACKOFF_CAP_MS)
    }

    fn validate(&self, max_workers: u32) -> Result<(), SpecError> {
        let err = |m: String| Err(SpecError::new("async", m));
        if self.retries > ASYNC_RETRIES_MAX {
            return err(format!("async.retries must be at most {ASYNC_RETRIES_MAX}, got {}", self.retries));
        }
        if self.backoff_ms == 0 || self.backoff_ms > ASYNC_BACKOFF_CAP_MS {
            return err(format!("async.backoff must be between 1ms and 5m, got {}ms", self.backoff_ms));
        }
        if self.queue == 0 || self.queue > ASYNC_QUEUE_MAX {
            return err(format!("async.queue must be between 1 and {ASYNC_QUEUE_MAX}, got {}", self.queue));
        }
        if self.concurrency > max_workers || (self.concurrency == max_workers && max_workers > 1) {
            return err(format!(
                "async.concurrency ({}) must be less than max_workers ({max_workers}): synchronous calls would find \
                 no worker",
                self.concurrency
            ));
        }
        for (i, k) in self.retry_on.iter().enumerate() {
            if !ASYNC_RETRYABLE.contains(&k.as_str()) {
                return err(format!(
                    "async.retry_on: {k:?} is not an error that may be retried (use {})",
                    ASYNC_RETRYABLE.join(", ")
                ));
            }
            if self.retry_on[..i].contains(k) {
                return err(format!("async.retry_on names {k} twice"));
            }
        }
        Ok(())
    }
}

/// Who may call a function from outside (internal calls are always
/// allowed: the caller is a function the engine runs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Auth {
    /// Anyone who reaches the gateway.
    #[default]
    None,
    /// Only with one of the function's invoke keys (`Authorization: Bearer
    /// stk_...`; see [`crate::keys`]).
    Key,
}

impl Auth {
    pub fn is_none(&self) -> bool {
        *self == Auth::None
    }

    pub fn name(self) -> &'static str {
        match self {
            Auth::None => "none",
            Auth::Key => "key",
        }
    }
}

/// Where a function runs, among the engines that joined a gateway.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Placement {
    /// On this many engines; 0: on every engine (that has the labels).
    #[serde(default)]
    pub engines: u32,
    /// Only on engines that joined with all of these labels (`staccato
    /// engine --label KEY=VALUE`).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

/// Labels a function may ask for, at most.
pub const PLACEMENT_LABELS_MAX: usize = 16;

impl Placement {
    pub fn is_everywhere(&self) -> bool {
        self.engines == 0 && self.labels.is_empty()
    }

    /// Whether an engine with `labels` may run the function.
    pub fn admits(&self, labels: &BTreeMap<String, String>) -> bool {
        self.labels.iter().all(|(k, v)| labels.get(k) == Some(v))
    }
}

/// Python workers: coroutines in the launcher's process (`inline`: a new
/// worker costs ~0.2 ms, all share one GIL), or processes forked from the
/// launcher, which has already imported the handler (`fork`: the zygote of
/// SOCK and Nuka §III.C; ~3 ms per worker instead of ~60–120 ms for a new
/// interpreter, one GIL each, and a timed-out worker dies alone). C and C++
/// workers are always forked from their host process; Go and Node.js
/// workers always share theirs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WorkerMode {
    #[default]
    Inline,
    Fork,
}

pub fn default_memory_bytes() -> u64 {
    256 << 20
}
pub fn default_pids() -> u32 {
    256
}

/// Below this a language runtime cannot even start.
pub const MEMORY_MIN: u64 = 16 << 20;

/// More memory than any host a function lands on has; the engine also
/// refuses what its own host does not have ([`FunctionSpec::validate_for_host`]).
pub const MEMORY_MAX: u64 = 1 << 40;

/// All environment variables of a function together: they travel in one
/// 64 KiB command to the container's init, with the runtime's own.
pub const ENV_BYTES_MAX: usize = 32 << 10;

/// A handler names a file or a function: anything longer is a mistake.
pub const HANDLER_LEN_MAX: usize = 256;

pub fn default_min_workers() -> u32 {
    1
}
pub fn default_max_workers() -> u32 {
    16
}
/// The longest timeout a function may have: 15 minutes, as Lambda's.
pub const TIMEOUT_MAX_MS: u64 = 15 * 60 * 1000;

pub fn default_timeout_ms() -> u64 {
    30_000
}
pub fn default_max_queue() -> u32 {
    1024
}

/// The longest queue a function may ask for: each waiting call holds its
/// record and input in the engine's memory.
pub const QUEUE_MAX: u32 = 65_536;

/// The most workers one function may ask for; more would only thrash.
pub const WORKERS_MAX: u32 = 256;

impl FunctionSpec {
    /// A digest of the whole spec (its JSON form): two specs have the same
    /// fingerprint exactly when they are equal. Engines report it in their
    /// status, so a gateway can tell which version of a function one runs.
    pub fn fingerprint(&self) -> String {
        crate::archive::digest(&serde_json::to_vec(self).expect("a spec serializes"))
    }

    /// The handler with the runtime's default filled in.
    pub fn handler_or_default(&self) -> String {
        match (self.handler.is_empty(), self.runtime) {
            (false, _) => self.handler.clone(),
            (true, Runtime::Python) => "handler:handle".into(),
            (true, Runtime::C) => "handler.c".into(),
            (true, Runtime::Node) => "handler.mjs:handle".into(),
            (true, Runtime::Go) => "Handle".into(),
            (true, Runtime::Cpp) => "handler.cpp".into(),
        }
    }

    /// Checks everything that does not need the file system. Returns the
    /// first problem, phrased for the person who wrote the manifest.
    pub fn validate(&self) -> Result<(), SpecError> {
        self.validate_settings()?;
        if !crate::archive::valid_digest(&self.source) {
            return Err(SpecError::new(
                "source",
                format!(
                    "source must be the sha256 digest of an uploaded source archive (sha256:<64 hex digits>), got {:?}",
                    self.source
                ),
            ));
        }
        Ok(())
    }

    /// `validate` without the source, which a manifest names by path and
    /// the CLI replaces with the digest of what it uploads.
    pub fn validate_settings(&self) -> Result<(), SpecError> {
        if !wire::valid_function_name(&self.name) {
            return Err(SpecError::new(
                "name",
                format!(
                    "invalid function name {:?}: use 1-64 characters of a-z, 0-9, '-' and '_', starting with a letter",
                    self.name
                ),
            ));
        }
        if self.max_workers == 0 || self.max_workers > WORKERS_MAX {
            return Err(SpecError::new(
                "max_workers",
                format!("max_workers must be between 1 and {WORKERS_MAX}, got {}", self.max_workers),
            ));
        }
        if self.min_workers > self.max_workers {
            return Err(SpecError::new(
                "min_workers",
                format!("min_workers ({}) is greater than max_workers ({})", self.min_workers, self.max_workers),
            ));
        }
        if self.max_queue == 0 || self.max_queue > QUEUE_MAX {
            return Err(SpecError::new(
                "max_queue",
                format!("max_queue must be between 1 and {QUEUE_MAX}, got {}", self.max_queue),
            ));
        }
        if self.timeout_ms == 0 || self.timeout_ms > TIMEOUT_MAX_MS {
            return Err(SpecError::new(
                "timeout",
                format!("timeout must be between 1ms and 15m, got {}ms", self.timeout_ms),
            ));
        }
        let handler = self.handler_or_default();
        match self.runtime {
            Runtime::Python => {
                let ok = handler.split_once(':').is_some_and(|(m, f)| {
                    !m.is_empty() && !f.is_empty() && m.split('.').all(is_identifier) && is_identifier(f)
                });
                if !ok {
                    return Err(SpecError::new(
                        "handler",
                        format!("python handler must look like module:function, got {handler:?}"),
                    ));
                }
            }
            Runtime::C | Runtime::Cpp => {
                let ext = if self.runtime == Runtime::C { ".c" } else { ".cpp" };
                if !is_relative_file(&handler) || !handler.ends_with(ext) {
                    return Err(SpecError::new(
                        "handler",
                        format!(
                            "{} handler must be a {ext} file inside the source directory, got {handler:?}",
                            self.runtime.name()
                        ),
                    ));
                }
            }
            Runtime::Node => {
                let ok = handler.split_once(':').is_some_and(|(f, e)| is_relative_file(f) && is_identifier(e));
                if !ok {
                    return Err(SpecError::new(
                        "handler",
                        format!("node handler must look like file.mjs:exportName, got {handler:?}"),
                    ));
                }
            }
            Runtime::Go => {
                if !is_identifier(&handler) || !handler.starts_with(|c: char| c.is_ascii_uppercase()) {
                    return Err(SpecError::new(
                        "handler",
                        format!("go handler must be an exported function name like Handle, got {handler:?}"),
                    ));
                }
            }
        }
        if handler.len() > HANDLER_LEN_MAX {
            return Err(SpecError::new("handler", format!("handler is longer than {HANDLER_LEN_MAX} characters")));
        }
        let mut env_bytes = 0;
        for (k, v) in &self.env {
            if k.is_empty() || k.contains(['=', '\0']) || k.starts_with("STACCATO_") {
                return Err(SpecError::new("env", format!("invalid env variable name {k:?} (STACCATO_* is reserved)")));
            }
            if v.contains('\0') {
                return Err(SpecError::new("env", format!("env variable {k} contains a NUL character")));
            }
            env_bytes += k.len() + v.len() + 2;
        }
        if env_bytes > ENV_BYTES_MAX {
            return Err(SpecError::new(
                "env",
                format!("the environment (env:) is {env_bytes} bytes; at most {ENV_BYTES_MAX} are allowed"),
            ));
        }
        if self.worker_mode == WorkerMode::Fork && self.runtime != Runtime::Python {
            return Err(SpecError::new(
                "worker_mode",
                format!(
                    "worker_mode: fork is for python functions ({} workers are {})",
                    self.runtime.name(),
                    if self.runtime.multiplexed() { "goroutines or callbacks in one process" } else { "always forked" }
                ),
            ));
        }
        if self.cpu_shares.is_some_and(|s| !(2..=262_144).contains(&s)) {
            return Err(SpecError::new(
                "cpu_shares",
                format!("cpu_shares must be between 2 and 262144, got {}", self.cpu_shares.unwrap_or(0)),
            ));
        }
        if self.memory_bytes < MEMORY_MIN {
            return Err(SpecError::new(
                "memory",
                format!("memory must be at least 16Mi, got {} bytes", self.memory_bytes),
            ));
        }
        if !(8..=65536).contains(&self.pids) {
            return Err(SpecError::new("pids", format!("pids must be between 8 and 65536, got {}", self.pids)));
        }
        if self.memory_bytes > MEMORY_MAX {
            return Err(SpecError::new(
                "memory",
                format!("memory must be at most 1Ti, got {} bytes", self.memory_bytes),
            ));
        }
        let p = &self.placement;
        if p.engines as usize > crate::cluster::ENGINES_MAX {
            return Err(SpecError::new(
                "placement",
                format!("placement.engines must be at most {}, got {}", crate::cluster::ENGINES_MAX, p.engines),
            ));
        }
        if p.labels.len() > PLACEMENT_LABELS_MAX {
            return Err(SpecError::new(
                "placement",
                format!("placement.labels: at most {PLACEMENT_LABELS_MAX} labels, got {}", p.labels.len()),
            ));
        }
        for (k, v) in &p.labels {
            crate::cluster::check_label(k, v)
                .map_err(|e| SpecError::new("placement", format!("placement.labels: {e}")))?;
        }
        if self.secrets.len() > crate::secrets::SECRETS_PER_FUNCTION_MAX {
            return Err(SpecError::new(
                "secrets",
                format!(
                    "at most {} secrets per function, got {}",
                    crate::secrets::SECRETS_PER_FUNCTION_MAX,
                    self.secrets.len()
                ),
            ));
        }
        self.async_calls.validate(self.max_workers)?;
        if self.grpc.len() > GRPC_METHODS_MAX {
            return Err(SpecError::new(
                "grpc",
                format!("at most {GRPC_METHODS_MAX} gRPC methods per function, got {}", self.grpc.len()),
            ));
        }
        for (i, m) in self.grpc.iter().enumerate() {
            if !valid_grpc_method(m) {
                return Err(SpecError::new(
                    "grpc",
                    format!("{m:?} is not a gRPC method like helloworld.Greeter/SayHello (package.Service/Method)"),
                ));
            }
            if self.grpc[..i].contains(m) {
                return Err(SpecError::new("grpc", format!("gRPC method {m} is named twice")));
            }
        }
        for (i, name) in self.secrets.iter().enumerate() {
            if !crate::secrets::valid_name(name) {
                return Err(SpecError::new(
                    "secrets",
                    format!("invalid secret name {name:?}: {}", crate::secrets::name_rule()),
                ));
            }
            if self.secrets[..i].contains(name) {
                return Err(SpecError::new("secrets", format!("secret {name} is named twice")));
            }
        }
        Ok(())
    }

    /// What `validate` cannot know: whether this host can give what the
    /// function asks for. `memory_total_bytes` is the host's RAM.
    pub fn validate_for_host(&self, memory_total_bytes: u64) -> Result<(), SpecError> {
        if memory_total_bytes > 0 && self.memory_bytes > memory_total_bytes {
            return Err(SpecError::new(
                "memory",
                format!(
                    "memory {} MiB is more than this host has ({} MiB of RAM)",
                    self.memory_bytes >> 20,
                    memory_total_bytes >> 20
                ),
            ));
        }
        Ok(())
    }
}

/// A function's settings that cannot be deployed: which setting (the
/// manifest's key), and why, phrased for the person who wrote it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct SpecError {
    pub field: &'static str,
    pub message: String,
}

impl SpecError {
    pub fn new(field: &'static str, message: String) -> SpecError {
        SpecError { field, message }
    }
}

/// A relative path that stays inside the source directory.
fn is_relative_file(p: &str) -> bool {
    !p.is_empty() && !p.starts_with('/') && !p.split('/').any(|c| c == ".." || c.is_empty())
}

fn is_identifier(s: &str) -> bool {
    let mut c = s.chars();
    c.next().is_some_and(|f| f == '_' || f.is_ascii_alphabetic()) && c.all(|x| x == '_' || x.is_ascii_alphanumeric())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> FunctionSpec {
        FunctionSpec {
            name: "f".into(),
            runtime: Runtime::Python,
            handler: String::new(),
            source: format!("sha256:{}", "0".repeat(64)),
            min_workers: 1,
            max_workers: 4,
            timeout_ms: 1000,
            max_queue: 1024,
            env: BTreeMap::new(),
            memory_bytes: default_memory_bytes(),
            pids: default_pids(),
            worker_mode: WorkerMode::Inline,
            cpu_shares: None,
            placement: Placement::default(),
            auth: Auth::None,
            secrets: Vec::new(),
            async_calls: AsyncSettings::default(),
            grpc: Vec::new(),
        }
    }

    #[test]
    fn validation() {
        assert_eq!(spec().validate(), Ok(()));
        assert!(FunctionSpec { min_workers: 5, ..spec() }.validate().unwrap_err().message.contains("greater"));
        assert!(FunctionSpec { max_queue: 0, ..spec() }.validate().unwrap_err().message.contains("max_queue"));
        assert!(FunctionSpec { max_queue: QUEUE_MAX + 1, ..spec() }
            .validate()
            .unwrap_err()
            .message
            .contains("max_queue"));
        assert!(FunctionSpec { handler: "a-b:c".into(), ..spec() }.validate().is_err());
        assert!(FunctionSpec { handler: "pkg.mod:fn_1".into(), ..spec() }.validate().is_ok());
        assert!(FunctionSpec { runtime: Runtime::C, handler: "../x.c".into(), ..spec() }.validate().is_err());
        assert!(FunctionSpec { runtime: Runtime::C, ..spec() }.validate().is_ok());
        for r in Runtime::ALL {
            assert_eq!(FunctionSpec { runtime: r, ..spec() }.validate(), Ok(()), "{r:?} default handler");
        }
        assert!(FunctionSpec { runtime: Runtime::Node, handler: "x.mjs:".into(), ..spec() }.validate().is_err());
        assert!(FunctionSpec { runtime: Runtime::Node, handler: "../x.mjs:h".into(), ..spec() }.validate().is_err());
        assert!(FunctionSpec { runtime: Runtime::Go, handler: "handle".into(), ..spec() }.validate().is_err());
        assert!(FunctionSpec { runtime: Runtime::Cpp, handler: "h.c".into(), ..spec() }.validate().is_err());
        assert!(FunctionSpec { timeout_ms: 0, ..spec() }.validate().is_err());
        assert!(FunctionSpec { source: "/etc".into(), ..spec() }.validate().unwrap_err().message.contains("digest"));
        assert!(FunctionSpec { memory_bytes: u64::MAX, ..spec() }.validate().unwrap_err().message.contains("1Ti"));
        let big = FunctionSpec { memory_bytes: 64 << 30, ..spec() };
        assert!(big.validate().is_ok());
        assert!(big.validate_for_host(24 << 30).unwrap_err().message.contains("24576 MiB of RAM"));
        assert!(spec().validate_for_host(24 << 30).is_ok());
        let mut env = BTreeMap::new();
        env.insert("K".to_string(), "v".repeat(ENV_BYTES_MAX));
        assert!(FunctionSpec { env, ..spec() }.validate().unwrap_err().message.contains("environment"));
        let mut env = BTreeMap::new();
        env.insert("K".to_string(), "a\0LD_PRELOAD=/x".to_string());
        assert!(FunctionSpec { env, ..spec() }.validate().unwrap_err().message.contains("NUL"));
        assert!(FunctionSpec { handler: "x".repeat(300), ..spec() }.validate().is_err());
        assert!(FunctionSpec { memory_bytes: 1 << 20, ..spec() }.validate().unwrap_err().message.contains("16Mi"));
        assert!(FunctionSpec { pids: 2, ..spec() }.validate().unwrap_err().message.contains("pids"));
        // The field names the manifest key, for tools that point at it.
        assert_eq!(FunctionSpec { pids: 2, ..spec() }.validate().unwrap_err().field, "pids");
        assert_eq!(FunctionSpec { max_queue: 0, ..spec() }.validate().unwrap_err().field, "max_queue");
        assert_eq!(FunctionSpec { memory_bytes: 1, ..spec() }.validate().unwrap_err().field, "memory");
        assert!(FunctionSpec { worker_mode: WorkerMode::Fork, ..spec() }.validate().is_ok());
        let c_fork = FunctionSpec { runtime: Runtime::C, worker_mode: WorkerMode::Fork, ..spec() };
        assert!(c_fork.validate().unwrap_err().message.contains("always forked"));
    }

    #[test]
    fn async_settings() {
        let a = AsyncSettings::default();
        assert_eq!(a.concurrency_for(16), 8);
        assert_eq!(a.concurrency_for(1), 1);
        assert_eq!(AsyncSettings { concurrency: 3, ..a.clone() }.concurrency_for(16), 3);
        assert_eq!((a.backoff_before(1), a.backoff_before(2), a.backoff_before(4)), (100, 200, 800));
        assert_eq!(a.backoff_before(u32::MAX), ASYNC_BACKOFF_CAP_MS);
        let with = |x: AsyncSettings| FunctionSpec { async_calls: x, ..spec() }.validate();
        assert!(with(AsyncSettings { retries: 21, ..a.clone() }).unwrap_err().message.contains("retries"));
        assert!(with(AsyncSettings { backoff_ms: 0, ..a.clone() }).is_err());
        assert!(with(AsyncSettings { queue: 0, ..a.clone() }).is_err());
        // max_workers is 4 in spec(): more async calls at once would leave
        // synchronous ones no worker.
        assert!(with(AsyncSettings { concurrency: 5, ..a.clone() }).unwrap_err().message.contains("max_workers"));
        assert!(with(AsyncSettings { concurrency: 4, ..a.clone() }).is_err());
        assert!(with(AsyncSettings { concurrency: 3, ..a.clone() }).is_ok());
        let bad = AsyncSettings { retry_on: vec!["not_found".into()], ..a.clone() };
        assert_eq!(with(bad).unwrap_err().field, "async");
        let twice = AsyncSettings { retry_on: vec!["timeout".into(), "timeout".into()], ..a.clone() };
        assert!(with(twice).unwrap_err().message.contains("twice"));
        // A spec with the default settings serializes as before they existed.
        assert!(!serde_json::to_string(&spec()).unwrap().contains("async"));
        let s = FunctionSpec { async_calls: AsyncSettings { retries: 0, ..a }, ..spec() };
        let back: FunctionSpec = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(back, s);
    }

    #[test]
    fn grpc_methods() {
        for ok in ["helloworld.Greeter/SayHello", "Svc/M", "a.b.c.S_1/m2"] {
            assert!(valid_grpc_method(ok), "{ok}");
        }
        for bad in ["", "Greeter", "/SayHello", "a.Greeter/", "a..b/M", "a/b/c", "a.1b/M", "a b/M", "Ä/M"] {
            assert!(!valid_grpc_method(bad), "{bad}");
        }
        let with = |g: Vec<&str>| FunctionSpec { grpc: g.into_iter().map(String::from).collect(), ..spec() }.validate();
        assert!(with(vec!["h.G/S"]).is_ok());
        assert_eq!(with(vec!["h.G/S", "h.G/S"]).unwrap_err().field, "grpc");
        assert!(with(vec!["nope"]).unwrap_err().message.contains("package.Service/Method"));
    }
}
