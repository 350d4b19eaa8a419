//! What can go wrong resolving and installing a function's packages. The
//! messages go to the deployer, so each says what to do about it.

use std::io;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The cache's own files: what was being done, and why it failed.
    #[error("{what}: {error}")]
    Io { what: String, error: io::Error },
    /// The interpreter or package manager is missing, broken or too old.
    #[error("{0}")]
    Toolchain(String),
    /// The deployer's files (requirements.txt, package.json, a lock file,
    /// pip's report of them) ask for something the cache cannot do.
    #[error("{0}")]
    Input(String),
    /// pip or npm ran and failed, or a limit stopped it: what it says.
    #[error("{0}")]
    Tool(String),
    #[error(
        "cache entry {id} was removed while this deploy was using it ({error}; a concurrent prune?); deploy again"
    )]
    EntryGone { id: String, error: io::Error },
    /// Several packages failed to install, each for its own reason.
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"))]
    Several(Vec<Error>),
}

impl Error {
    /// For `map_err` on an io::Result: `Error::io(format!("reading {p}"))`.
    pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(io::Error) -> Error {
        let what = what.into();
        move |error| Error::Io { what, error }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
