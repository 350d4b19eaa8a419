//! Engines joining gateways (`POST /system/engines`), and the engine table
//! a gateway serves (`GET /system/engines`).
//!
//! An engine posts [`Join`] to each gateway it joins and posts it again
//! every [`RENEW_MS`]; a gateway keeps it while renewals come, and drops it
//! [`LEASE_MS`] after the last one (or at once when it leaves: `DELETE
//! /system/engines/{id}`). The gateway owns its table; the engine only
//! proves it is alive.

use serde::{Deserialize, Serialize};
use std::net::SocketAddr;

/// How long a gateway keeps an engine that stopped renewing.
pub const LEASE_MS: u64 = 3000;
/// How often an engine renews: two renewals may be lost before it is dropped.
pub const RENEW_MS: u64 = 1000;

/// What an engine sends to join a gateway, and to renew.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Join {
    /// Unique among a gateway's engines: 1-64 of `A-Z a-z 0-9 . _ : -`.
    pub id: String,
    /// Where gateways reach it: its engine port, seen from the gateways.
    pub address: SocketAddr,
}

/// The answer to a join.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Joined {
    /// True the first time (or after the engine had been dropped).
    pub new: bool,
    pub lease_ms: u64,
    pub renew_ms: u64,
}

/// One row of a gateway's engine table.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EngineRow {
    pub id: String,
    pub address: SocketAddr,
    /// `static` (named on the gateway's command line) or `joined`.
    pub kind: String,
    /// `ready`: connected, with every stored function; `restoring`:
    /// connected, receiving the stored functions; `unreachable`.
    pub state: String,
    /// Calls this gateway has sent it and not had answered.
    pub in_flight: u64,
    /// Calls this gateway has sent it since it joined.
    pub calls: u64,
    /// Milliseconds left of its lease (none for a static engine).
    pub lease_left_ms: Option<u64>,
    pub joined_unix_ms: u64,
}

/// Whether `id` may name an engine.
pub fn valid_engine_id(id: &str) -> bool {
    (1..=64).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_alphanumeric() || b"._:-".contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_ids_are_short_plain_names() {
        for ok in ["10.210.0.2:7100", "engine-a", "node_1.rack-2"] {
            assert!(valid_engine_id(ok), "{ok}");
        }
        for bad in ["", "a b", "a/b", "é", &"x".repeat(65), "a\n"] {
            assert!(!valid_engine_id(bad), "{bad:?}");
        }
    }

    #[test]
    fn a_join_with_unknown_fields_is_refused() {
        let ok: Join = serde_json::from_str(r#"{"id": "e1", "address": "10.0.0.1:7100"}"#).unwrap();
        assert_eq!(ok.address.port(), 7100);
        assert!(serde_json::from_str::<Join>(r#"{"id": "e1", "address": "10.0.0.1:7100", "x": 1}"#).is_err());
        assert!(serde_json::from_str::<Join>(r#"{"id": "e1", "address": "nowhere"}"#).is_err());
    }
}
