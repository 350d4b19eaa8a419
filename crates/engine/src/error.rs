//! What can go wrong preparing a function's code and starting it. The
//! messages reach the person deploying, so they name the file, the tool and
//! what it said.

use std::io;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The function's source lacks what its spec names.
    #[error("{0}")]
    Source(String),
    /// Its dependencies could not be resolved or installed.
    #[error(transparent)]
    Packages(#[from] pkgcache::Error),
    #[error(transparent)]
    Sandbox(#[from] sandbox::Error),
    /// A compiler or build script ran and failed: what it was doing, and
    /// the last lines it wrote.
    #[error("{what} failed:\n{output}")]
    BuildFailed { what: String, output: String },
    /// A build step could not run, or a limit stopped it.
    #[error("{0}")]
    Build(String),
    /// Something this engine lacks: a runtime, the build sandbox.
    #[error("{0}")]
    Unavailable(String),
    /// A bad engine setting (the build allow list, the runtimes directory).
    #[error("{0}")]
    Config(String),
    /// The function's launcher did not come up: why, with its log.
    #[error("{0}")]
    Start(String),
    /// The engine's own files: what was being done, and why it failed.
    #[error("{what}: {error}")]
    Io { what: String, error: io::Error },
}

impl Error {
    /// For `map_err` on an io::Result: `Error::io(format!("creating {p}"))`.
    pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(io::Error) -> Error {
        let what = what.into();
        move |error| Error::Io { what, error }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
