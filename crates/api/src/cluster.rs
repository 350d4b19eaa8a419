//! Engines joining gateways (`POST /system/engines`), and the engine table
//! a gateway serves (`GET /system/engines`).
//!
//! An engine posts [`Join`] to each gateway it joins and posts it again
//! every [`RENEW_MS`]; a gateway keeps it while renewals come, and drops it
//! [`LEASE_MS`] after the last one (or at once when it leaves: `DELETE
//! /system/engines/{id}`). The gateway owns its table; the engine only
//! proves it is alive.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::SocketAddr;

/// How long a gateway keeps an engine that stopped renewing.
pub const LEASE_MS: u64 = 3000;
/// How often an engine renews: two renewals may be lost before it is dropped.
pub const RENEW_MS: u64 = 1000;
/// Engines in one gateway's table, at most.
pub const ENGINES_MAX: usize = 256;
/// Labels one engine may carry, at most.
pub const LABELS_MAX: usize = 32;

/// What an engine sends to join a gateway, and to renew.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Join {
    /// Unique among a gateway's engines: 1-64 of `A-Z a-z 0-9 . _ : -`.
    pub id: String,
    /// Where gateways reach it: its engine port, seen from the gateways.
    pub address: SocketAddr,
    /// What functions may ask for to be placed on it (`placement.labels`).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

impl Join {
    /// Everything a gateway checks before it dials the address.
    pub fn check(&self) -> Result<(), String> {
        if !valid_engine_id(&self.id) {
            return Err(format!("engine id {:?}: use 1-64 of A-Z a-z 0-9 . _ : -", self.id));
        }
        let ip = self.address.ip();
        if ip.is_unspecified() || ip.is_multicast() || self.address.port() == 0 {
            return Err(format!(
                "engine address {}: not an address a gateway can dial (unspecified, multicast or port 0)",
                self.address
            ));
        }
        if self.labels.len() > LABELS_MAX {
            return Err(format!("an engine carries at most {LABELS_MAX} labels, got {}", self.labels.len()));
        }
        for (k, v) in &self.labels {
            check_label(k, v)?;
        }
        Ok(())
    }
}

/// A label: a key of 1-63 of `a-z A-Z 0-9 . _ - /`, a value of 0-63 of
/// `a-z A-Z 0-9 . _ -` (Kubernetes' label syntax, near enough).
pub fn check_label(key: &str, value: &str) -> Result<(), String> {
    let plain = |b: u8| b.is_ascii_alphanumeric() || b"._-".contains(&b);
    if !(1..=63).contains(&key.len()) || !key.bytes().all(|b| plain(b) || b == b'/') {
        return Err(format!("label key {key:?}: use 1-63 of a-z A-Z 0-9 . _ - /"));
    }
    if value.len() > 63 || !value.bytes().all(plain) {
        return Err(format!("label {key}: value {value:?}: use at most 63 of a-z A-Z 0-9 . _ -"));
    }
    Ok(())
}

/// `KEY=VALUE` (a command-line label), checked.
pub fn parse_label(s: &str) -> Result<(String, String), String> {
    let (k, v) = s.split_once('=').ok_or_else(|| format!("label {s:?}: write KEY=VALUE"))?;
    check_label(k, v)?;
    Ok((k.to_string(), v.to_string()))
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
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Internal calls it sent to this gateway for another engine to run.
    #[serde(default)]
    pub forwarded: u64,
    /// The functions it runs, at the gateway's last heartbeat (every
    /// 200 ms) or reconciliation.
    #[serde(default)]
    pub functions: Vec<String>,
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
    fn labels_are_checked() {
        assert_eq!(parse_label("zone=eu-1"), Ok(("zone".into(), "eu-1".into())));
        assert_eq!(parse_label("gpu="), Ok(("gpu".into(), String::new())));
        assert!(parse_label("topology.kubernetes.io/zone=a").is_ok());
        for bad in ["zone", "=a", "a b=c", "k=v w", "k=a/b", &format!("{}=v", "k".repeat(64)), "k=é"] {
            assert!(parse_label(bad).is_err(), "{bad:?}");
        }
        let mut j: Join = serde_json::from_str(r#"{"id": "e1", "address": "10.0.0.1:7100"}"#).unwrap();
        assert_eq!(j.check(), Ok(()));
        j.labels = (0..=LABELS_MAX).map(|i| (format!("k{i}"), String::new())).collect();
        assert!(j.check().unwrap_err().contains("at most"));
        j.labels = [("k".to_string(), "a\nb".to_string())].into();
        assert!(j.check().is_err());
        j.labels.clear();
        j.address = "0.0.0.0:7100".parse().unwrap();
        assert!(j.check().unwrap_err().contains("can dial"));
    }

    #[test]
    fn a_join_with_unknown_fields_is_refused() {
        let ok: Join = serde_json::from_str(r#"{"id": "e1", "address": "10.0.0.1:7100"}"#).unwrap();
        assert_eq!(ok.address.port(), 7100);
        assert!(serde_json::from_str::<Join>(r#"{"id": "e1", "address": "10.0.0.1:7100", "x": 1}"#).is_err());
        assert!(serde_json::from_str::<Join>(r#"{"id": "e1", "address": "nowhere"}"#).is_err());
    }
}
