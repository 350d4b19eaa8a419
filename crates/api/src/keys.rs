//! Per-function invoke keys (`auth: key` in a manifest).
//!
//! A key is `stk_` followed by 32 random bytes in hex, shown once when it
//! is made. Only its SHA-256 is stored (a stolen store gives no working
//! key), with a short id that names it in listings and removals. Invoke
//! keys authorise calls of one function; they are not management tokens,
//! and a management token is not an invoke key.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// What every invoke key starts with (tells one apart from a management
/// token in a log or a leak report).
pub const KEY_PREFIX: &str = "stk_";

/// Keys a function may have at once (rotation needs two).
pub const KEYS_MAX: usize = 16;

/// One stored key: never the key itself.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyRecord {
    /// 8 hex characters, unique among the function's keys.
    pub id: String,
    /// SHA-256 of the whole key, in hex.
    pub sha256: String,
    /// When it was made (Unix ms).
    pub created_ms: u64,
}

/// A new key and its record.
pub fn new_key(created_ms: u64) -> Result<(String, KeyRecord), getrandom::Error> {
    let mut secret = [0u8; 32];
    getrandom::fill(&mut secret)?;
    let mut id = [0u8; 4];
    getrandom::fill(&mut id)?;
    let key = format!("{KEY_PREFIX}{}", hex(&secret));
    let record = KeyRecord { id: hex(&id), sha256: hex(&Sha256::digest(key.as_bytes())), created_ms };
    Ok((key, record))
}

/// Whether `presented` is one of the keys of `records`. Compares digests
/// in constant time and always looks at every record.
pub fn matches(presented: &[u8], records: &[KeyRecord]) -> bool {
    let digest = hex(&Sha256::digest(presented));
    let mut found = false;
    for r in records {
        found |= bool::from(digest.as_bytes().ct_eq(r.sha256.as_bytes()));
    }
    found && !presented.is_empty()
}

/// Whether `id` could name a key (what `new_key` makes): safe in a URL
/// path and a store key.
pub fn valid_id(id: &str) -> bool {
    id.len() == 8 && id.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_key_matches_its_record_and_nothing_else_does() {
        let (key, rec) = new_key(7).unwrap();
        assert!(key.starts_with(KEY_PREFIX) && key.len() == KEY_PREFIX.len() + 64, "{key}");
        assert!(valid_id(&rec.id), "{}", rec.id);
        assert_eq!(rec.created_ms, 7);
        assert!(!rec.sha256.contains(&key[KEY_PREFIX.len()..]));
        let (other, other_rec) = new_key(8).unwrap();
        assert_ne!(key, other);
        let both = [other_rec.clone(), rec.clone()];
        assert!(matches(key.as_bytes(), &both));
        assert!(matches(other.as_bytes(), &both));
        assert!(!matches(key.as_bytes(), &[other_rec]));
        assert!(!matches(b"", &both));
        assert!(!matches(&key.as_bytes()[..key.len() - 1], &both));
        assert!(!matches(rec.sha256.as_bytes(), &both), "the stored digest is not a key");
        assert!(!matches(key.as_bytes(), &[]));
    }

    #[test]
    fn ids_are_eight_lowercase_hex_characters() {
        assert!(valid_id("0a1b2c3d"));
        for bad in ["", "0a1b2c3", "0a1b2c3d4", "0A1B2C3D", "../../x1", "0a1b2c3g"] {
            assert!(!valid_id(bad), "{bad:?}");
        }
    }
}
