//! What Staccato asks of the operating system, one module per purpose:
//!
//! * [`channel`]: the engine–worker message channels (two FIFOs each);
//! * [`payload`]: shared-memory payload files for large inputs and outputs;
//! * [`pipe`]: pipes and FIFOs themselves (buffer size, blocking mode);
//! * [`clock`]: the monotonic and wall clocks calls are timed with;
//! * [`cpu`]: CPU affinity;
//! * [`process`]: signals, dying with the parent, user id, open-file limit;
//! * [`mount`]: mounts into a running container (the new mount API);
//! * [`netns`]: moving a thread into a network namespace (test hosts).
//!
//! Architecture invariant: this is the only crate with `unsafe` code. Every
//! block says which invariant it relies on.
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod channel;
pub mod clock;
pub mod cpu;
pub mod mount;
pub mod netns;
pub mod payload;
pub mod pipe;
pub mod process;
