//! What the `staccato` command and the benchmarks share to talk to a
//! gateway: [`gateway`], the command line's client (ureq); [`http`], the
//! benchmarks' lean keep-alive HTTP/1.1 client; and [`deploy`], packing,
//! uploading and registering a manifest's functions through either.
#![forbid(unsafe_code)]

pub mod deploy;
pub mod gateway;
pub mod http;
#[cfg(test)]
mod test_server;

pub use gateway::Gateway;
pub use http::{Client, Requester, Response};

use anyhow::{bail, Result};
use serde_json::Value;
use std::path::Path;

/// Turns an error response into an error carrying the gateway's kind and
/// message; a success into its JSON body (`null` if it has none).
pub fn check(r: &Response) -> Result<Value> {
    let v: Value = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
    if r.status >= 400 {
        let kind = v["error"]["kind"].as_str().unwrap_or("error");
        let msg =
            v["error"]["message"].as_str().map(String::from).unwrap_or_else(|| String::from_utf8_lossy(&r.body).into());
        bail!("{kind} (HTTP {}): {msg}", r.status);
    }
    Ok(v)
}

/// The management token `staccato up` wrote into its state directory.
pub fn read_token(state: &Path) -> Option<String> {
    std::fs::read_to_string(state.join("token")).ok().map(|t| t.trim().to_string()).filter(|t| !t.is_empty())
}
