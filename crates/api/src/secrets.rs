//! Secrets: named values a function reads as files at
//! `/var/secrets/NAME` (a manifest's `secrets: [NAME, ...]`), kept
//! encrypted by the gateway and handed to the engines that run the
//! function with its registration, never in a spec, a listing, a log or an
//! error.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Where a function finds its secrets, inside its container.
pub const SECRETS_DIR: &str = "/var/secrets";
/// The most secrets one function may name.
pub const SECRETS_PER_FUNCTION_MAX: usize = 16;
/// The largest secret value.
pub const SECRET_BYTES_MAX: usize = 64 << 10;
/// The most secrets a store holds.
pub const SECRETS_MAX: usize = 1024;

/// A secret's name: 1-63 of a-z, 0-9, '-', '_' and '.', starting with a
/// letter or digit (a file name, never `.` or `..`, safe in a URL path).
pub fn valid_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && (b[0].is_ascii_lowercase() || b[0].is_ascii_digit())
        && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, b'-' | b'_' | b'.'))
}

/// Why a name is not one (for errors).
pub fn name_rule() -> &'static str {
    "use 1-63 characters of a-z, 0-9, '-', '_' and '.', starting with a letter or digit"
}

/// Secret values on their way to an engine: name → bytes. Debug shows
/// names and sizes only, so a logged request never shows a value.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecretValues(pub BTreeMap<String, Value>);

impl SecretValues {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Checks what arrived from a peer: names, sizes, count.
    pub fn check(&self) -> Result<(), String> {
        if self.0.len() > SECRETS_PER_FUNCTION_MAX {
            return Err(format!("{} secrets, more than {SECRETS_PER_FUNCTION_MAX}", self.0.len()));
        }
        for (name, v) in &self.0 {
            if !valid_name(name) {
                return Err(format!("invalid secret name {name:?}"));
            }
            if v.0.len() > SECRET_BYTES_MAX {
                return Err(format!("secret {name} is {} bytes, more than {SECRET_BYTES_MAX}", v.0.len()));
            }
        }
        Ok(())
    }
}

impl std::fmt::Debug for SecretValues {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.0.iter().map(|(k, v)| (k, format!("<{} bytes>", v.0.len())))).finish()
    }
}

/// One secret's bytes, base64 in JSON.
#[derive(Clone, PartialEq, Eq)]
pub struct Value(pub Vec<u8>);

impl Serialize for Value {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use base64::Engine as _;
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(&self.0))
    }
}

impl<'de> Deserialize<'de> for Value {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Value, D::Error> {
        use base64::Engine as _;
        let s = String::deserialize(d)?;
        base64::engine::general_purpose::STANDARD.decode(s).map(Value).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_file_names_that_cannot_climb() {
        for ok in ["db-password", "a", "0", "tls.key", "x_y"] {
            assert!(valid_name(ok), "{ok}");
        }
        for bad in ["", ".", "..", ".hidden", "a/b", "A", "-x", "a b", &"x".repeat(64), "é"] {
            assert!(!valid_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn values_never_show_in_debug_and_round_trip_as_base64() {
        let v = SecretValues([("pw".to_string(), Value(b"hunter2".to_vec()))].into());
        let dbg = format!("{v:?}");
        assert!(!dbg.contains("hunter2") && dbg.contains("7 bytes"), "{dbg}");
        let json = serde_json::to_string(&v).unwrap();
        assert!(!json.contains("hunter2"), "{json}");
        assert_eq!(serde_json::from_str::<SecretValues>(&json).unwrap(), v);
        assert!(v.check().is_ok());
        let big = SecretValues([("pw".to_string(), Value(vec![0; SECRET_BYTES_MAX + 1]))].into());
        assert!(big.check().unwrap_err().contains("more than"));
        let bad = SecretValues([("../x".to_string(), Value(vec![]))].into());
        assert!(bad.check().is_err());
    }
}
