//! What crosses Staccato's process boundaries, shared by the gateway, the
//! engine and the CLI (which depend on this crate and never on each other):
//!
//! * [`spec`]: a function as the engine runs it, and its validation;
//! * [`manifest`]: the YAML a user deploys, parsed on the user's machine;
//! * [`archive`]: a function's source, packed by the CLI, checked by the
//!   gateway and unpacked by the engine (no server ever reads a path a
//!   request names);
//! * [`auth`], [`link`]: the gateway–engine handshake (protocol version,
//!   mutual proof of a shared secret) and constant-time token comparison;
//! * [`control`]: the typed requests, replies and refusals of the control
//!   connection that follows it;
//! * [`cluster`]: engines joining gateways, and a gateway's engine table;
//! * [`http`]: what the gateway's and the engine's HTTP front doors share;
//! * [`keys`]: per-function invoke keys;
//! * [`secrets`]: secret names and values on their way to an engine;
//! * [`trace`]: W3C trace context, from a client's header to an engine.
#![forbid(unsafe_code)]

pub mod archive;
pub mod auth;
pub mod cluster;
pub mod control;
pub mod http;
pub mod keys;
pub mod link;
pub mod manifest;
pub mod secrets;
pub mod spec;
pub mod trace;
pub mod units;
