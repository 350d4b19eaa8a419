//! Benchmarks are programs, not timed tests: nothing here asserts a number.
//! Each measures Staccato next to a floor or a baseline in the same run
//! (BENCHMARKS.md says how each figure was taken):
//!
//! * [`micro`]: raw pipes, message channels and plain HTTP as floors (in
//!   one process, and between processes: [`floor`]), then internal and
//!   external calls and throughput for every language;
//! * [`coldstart`]: container starts with `runc run`, from the isolation
//!   pool, by resuming a paused container, and by zygote fork;
//! * [`cluster`]: a cluster on test hosts: the external path to an engine
//!   on the gateway's host or another against `staccato up`, internal calls
//!   across servers, throughput and CPU per call with 1 to 3 engines;
//! * [`bed`]: a cluster on test hosts (network namespaces), for the
//!   cluster benchmarks, the demo and the cluster tests.
#![forbid(unsafe_code)]

pub mod bed;
pub mod cluster;
pub mod coldstart;
pub mod floor;
pub mod micro;

pub use micro::{find_repo, git_describe};
