//! What can go wrong making, handing out, checking or removing containers.

use std::io;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A host file operation (slot FIFOs, cgroup files, mounts): what was
    /// being done, and why it failed.
    #[error("{what}: {error}")]
    Io { what: String, error: io::Error },
    #[error(transparent)]
    Net(#[from] netns::Error),
    #[error("runc run {id} failed: {stderr}")]
    Runc { id: String, stderr: String },
    /// The container's init or launcher did not answer as the slot
    /// protocol says (no READY, no STARTED, a bad status line).
    #[error("{0}")]
    Slot(String),
    /// What `reset` found changed in a returned container; destroy it.
    #[error("{0}")]
    Dirty(String),
    /// Another live engine holds the container prefix.
    #[error(
        "the container prefix {prefix} is in use by another engine (pid {pid}); is another staccato running \
         with the same state directory?"
    )]
    PrefixInUse { prefix: String, pid: String },
    /// A setting this crate cannot work with (a uid base, log caps, a host rule).
    #[error("{0}")]
    Config(String),
    #[error("the engine is shutting down")]
    ShuttingDown,
}

impl Error {
    /// For `map_err` on an io::Result: `Error::io(format!("reading {p}"))`.
    pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(io::Error) -> Error {
        let what = what.into();
        move |error| Error::Io { what, error }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
