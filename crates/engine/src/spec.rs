//! What a deployed function is: the engine's view of one manifest entry.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Runtime {
    Python,
    C,
}

impl Runtime {
    pub fn name(self) -> &'static str {
        match self {
            Runtime::Python => "python",
            Runtime::C => "c",
        }
    }
}

/// A function as registered with an engine. `source_dir` is an absolute path
/// on the engine's machine; the engine copies it at registration so later
/// edits to the source do not change a running function.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FunctionSpec {
    pub name: String,
    pub runtime: Runtime,
    /// Python: `module:function` (default `handler:handle`). C: the source
    /// file to compile into the handler library (default `handler.c`).
    #[serde(default)]
    pub handler: String,
    pub source_dir: PathBuf,
    #[serde(default = "default_min_workers")]
    pub min_workers: u32,
    #[serde(default = "default_max_workers")]
    pub max_workers: u32,
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
}

pub fn default_min_workers() -> u32 {
    1
}
pub fn default_max_workers() -> u32 {
    16
}
pub fn default_timeout_ms() -> u64 {
    30_000
}

/// The most workers one function may ask for; more would only thrash.
pub const WORKERS_MAX: u32 = 256;

impl FunctionSpec {
    /// The handler with the runtime's default filled in.
    pub fn handler_or_default(&self) -> String {
        match (self.handler.is_empty(), self.runtime) {
            (false, _) => self.handler.clone(),
            (true, Runtime::Python) => "handler:handle".into(),
            (true, Runtime::C) => "handler.c".into(),
        }
    }

    /// Checks everything that does not need the file system. Returns the
    /// first problem, phrased for the person who wrote the manifest.
    pub fn validate(&self) -> Result<(), String> {
        if !wire::valid_function_name(&self.name) {
            return Err(format!(
                "invalid function name {:?}: use 1-64 characters of a-z, 0-9, '-' and '_', starting with a letter",
                self.name
            ));
        }
        if self.max_workers == 0 || self.max_workers > WORKERS_MAX {
            return Err(format!("max_workers must be between 1 and {WORKERS_MAX}, got {}", self.max_workers));
        }
        if self.min_workers > self.max_workers {
            return Err(format!(
                "min_workers ({}) is greater than max_workers ({})",
                self.min_workers, self.max_workers
            ));
        }
        if self.timeout_ms == 0 || self.timeout_ms > 15 * 60 * 1000 {
            return Err(format!("timeout must be between 1ms and 15m, got {}ms", self.timeout_ms));
        }
        let handler = self.handler_or_default();
        match self.runtime {
            Runtime::Python => {
                let ok = handler.split_once(':').is_some_and(|(m, f)| {
                    !m.is_empty() && !f.is_empty() && m.split('.').all(is_identifier) && is_identifier(f)
                });
                if !ok {
                    return Err(format!("python handler must look like module:function, got {handler:?}"));
                }
            }
            Runtime::C => {
                if handler.contains("..") || handler.starts_with('/') || !handler.ends_with(".c") {
                    return Err(format!("c handler must be a .c file inside the source directory, got {handler:?}"));
                }
            }
        }
        for k in self.env.keys() {
            if k.is_empty() || k.contains('=') || k.starts_with("STACCATO_") {
                return Err(format!("invalid env variable name {k:?} (STACCATO_* is reserved)"));
            }
        }
        if !self.source_dir.is_absolute() {
            return Err(format!("source_dir must be absolute, got {}", self.source_dir.display()));
        }
        Ok(())
    }
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
            source_dir: "/tmp".into(),
            min_workers: 1,
            max_workers: 4,
            timeout_ms: 1000,
            env: BTreeMap::new(),
        }
    }

    #[test]
    fn validation() {
        assert_eq!(spec().validate(), Ok(()));
        assert!(FunctionSpec { min_workers: 5, ..spec() }.validate().unwrap_err().contains("greater"));
        assert!(FunctionSpec { handler: "a-b:c".into(), ..spec() }.validate().is_err());
        assert!(FunctionSpec { handler: "pkg.mod:fn_1".into(), ..spec() }.validate().is_ok());
        assert!(FunctionSpec { runtime: Runtime::C, handler: "../x.c".into(), ..spec() }.validate().is_err());
        assert!(FunctionSpec { runtime: Runtime::C, ..spec() }.validate().is_ok());
        assert!(FunctionSpec { timeout_ms: 0, ..spec() }.validate().is_err());
        assert!(FunctionSpec { source_dir: "rel".into(), ..spec() }.validate().is_err());
    }
}
