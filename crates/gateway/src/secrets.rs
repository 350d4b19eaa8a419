//! Secrets at rest: each value sealed with ChaCha20-Poly1305 (RFC 8439)
//! under a 256-bit key kept in a file of the gateway's (`secrets.key` in
//! its state directory, mode 0600, made on first start), with a fresh
//! random nonce per write and the secret's name as associated data (a
//! record moved to another name does not open). The store holds only
//! sealed records; values are opened to be sent to the engines that run a
//! function naming them. Gateways that share an etcd store must share the
//! key file too (`--secrets-key-file`).

use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{ChaCha20Poly1305, Key, Nonce};
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// A sealed secret as the store keeps it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecretRecord {
    /// 12 bytes, hex.
    pub nonce: String,
    /// The value sealed, with its 16-byte tag, hex.
    pub sealed: String,
    pub created_ms: u64,
    pub updated_ms: u64,
}

pub struct Vault {
    cipher: ChaCha20Poly1305,
    path: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum VaultError {
    #[error("secrets key file {path}: {err}")]
    Io { path: PathBuf, err: std::io::Error },
    #[error("secrets key file {0} does not hold 32 bytes in hex (64 characters)")]
    BadKey(PathBuf),
    #[error("no randomness for a secret's nonce: {0}")]
    Random(String),
    #[error(
        "secret {name} cannot be opened with this gateway's key ({path}): it was sealed with another key (gateways \
         sharing a store must share their secrets key file) or the record was changed"
    )]
    Open { name: String, path: PathBuf },
}

impl Vault {
    /// The key in `path`, made there (32 random bytes, hex, mode 0600) if
    /// the file does not exist yet.
    pub fn open(path: &Path) -> Result<Vault, VaultError> {
        let io = |err| VaultError::Io { path: path.to_path_buf(), err };
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let mut key = [0u8; 32];
                getrandom::fill(&mut key).map_err(|e| VaultError::Random(e.to_string()))?;
                let hex = hex(&key);
                // Whole or not at all: written aside, then linked in (a
                // crash leaves no empty key; of two gateways starting at
                // once on one file, the second reads the first's).
                let tmp = path.with_extension(format!("tmp{}", std::process::id()));
                let _ = std::fs::remove_file(&tmp);
                let mut f =
                    std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp).map_err(io)?;
                f.write_all(hex.as_bytes()).and_then(|()| f.sync_all()).map_err(io)?;
                let linked = std::fs::hard_link(&tmp, path);
                let _ = std::fs::remove_file(&tmp);
                match linked {
                    Ok(()) => hex,
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                        std::fs::read_to_string(path).map_err(io)?
                    }
                    Err(e) => return Err(io(e)),
                }
            }
            Err(e) => return Err(io(e)),
        };
        let key = unhex(text.trim()).filter(|k| k.len() == 32).ok_or_else(|| VaultError::BadKey(path.to_path_buf()))?;
        Ok(Vault { cipher: ChaCha20Poly1305::new(Key::from_slice(&key)), path: path.to_path_buf() })
    }

    /// Seals `value` as secret `name`.
    pub fn seal(&self, name: &str, value: &[u8], created_ms: u64, now_ms: u64) -> Result<SecretRecord, VaultError> {
        let mut nonce = [0u8; 12];
        getrandom::fill(&mut nonce).map_err(|e| VaultError::Random(e.to_string()))?;
        let sealed = self
            .cipher
            .encrypt(Nonce::from_slice(&nonce), Payload { msg: value, aad: name.as_bytes() })
            .map_err(|_| VaultError::Random("sealing failed".into()))?;
        Ok(SecretRecord { nonce: hex(&nonce), sealed: hex(&sealed), created_ms, updated_ms: now_ms })
    }

    /// Opens secret `name`'s record.
    pub fn open_record(&self, name: &str, r: &SecretRecord) -> Result<Vec<u8>, VaultError> {
        let fail = || VaultError::Open { name: name.to_string(), path: self.path.clone() };
        let nonce = unhex(&r.nonce).filter(|n| n.len() == 12).ok_or_else(fail)?;
        let sealed = unhex(&r.sealed).ok_or_else(fail)?;
        self.cipher
            .decrypt(Nonce::from_slice(&nonce), Payload { msg: &sealed, aad: name.as_bytes() })
            .map_err(|_| fail())
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_value_opens_only_under_its_name_and_key() {
        let dir = std::env::temp_dir().join(format!("staccato-vault-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let v = Vault::open(&dir.join("secrets.key")).unwrap();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(dir.join("secrets.key")).unwrap().permissions().mode() & 0o777, 0o600);
        let r = v.seal("db", b"hunter2", 1, 2).unwrap();
        assert!(!r.sealed.contains(&hex(b"hunter2")), "sealed, not encoded");
        assert_eq!(v.open_record("db", &r).unwrap(), b"hunter2");
        assert!(matches!(v.open_record("other", &r), Err(VaultError::Open { .. })), "bound to its name");
        let mut bad = r.clone();
        bad.sealed.replace_range(0..2, if &bad.sealed[0..2] == "00" { "01" } else { "00" });
        assert!(v.open_record("db", &bad).is_err(), "tampering shows");
        assert_ne!(v.seal("db", b"hunter2", 1, 2).unwrap().nonce, r.nonce, "a fresh nonce each time");
        // The same file: the same key; another file: another key.
        assert_eq!(Vault::open(&dir.join("secrets.key")).unwrap().open_record("db", &r).unwrap(), b"hunter2");
        assert!(Vault::open(&dir.join("other.key")).unwrap().open_record("db", &r).is_err());
        std::fs::write(dir.join("bad.key"), "zz").unwrap();
        assert!(matches!(Vault::open(&dir.join("bad.key")), Err(VaultError::BadKey(_))));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
