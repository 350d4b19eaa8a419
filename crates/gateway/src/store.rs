//! The gateway's function store: registered functions survive a restart of
//! Staccato. Their metadata (specs, placements, when each was stored) lives
//! in a [`Meta`] backend: embedded (redb, one gateway: the default) or
//! etcd (several gateways share it, `crate::etcd`). Source archives are
//! files in the state directory (`sources/<hex>.tar.gz`), named by their
//! digest and checked against it whenever they are read; with a shared
//! backend they are kept there too, and a gateway that lacks one fetches
//! it.

use crate::secrets::{SecretRecord, Vault};
use api::keys::KeyRecord;
use api::secrets::SecretValues;
use api::spec::FunctionSpec;
use redb::{Database, ReadableTable, TableDefinition};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

const FUNCTIONS: TableDefinition<&str, &[u8]> = TableDefinition::new("functions");
/// The engines a function placed on some of them was given (JSON list of
/// engine ids), for functions with `placement.engines` > 0 only.
const PLACEMENTS: TableDefinition<&str, &[u8]> = TableDefinition::new("placements");
/// When each function was stored (Unix ms): an engine's copy registered
/// before that, in another version, missed a deploy (`control::reconcile`).
const STORED_AT: TableDefinition<&str, u64> = TableDefinition::new("stored_at");
/// When each removed function was removed (Unix ms), until it is stored
/// again: an engine that was away then drops its copy when it is back.
const REMOVED: TableDefinition<&str, u64> = TableDefinition::new("removed");
/// Invoke keys' records (`api::keys::KeyRecord`, JSON), under `NAME/ID`;
/// removed with their function.
const KEYS: TableDefinition<&str, &[u8]> = TableDefinition::new("keys");
/// Sealed secrets (`crate::secrets::SecretRecord`, JSON), by secret name.
const SECRETS: TableDefinition<&str, &[u8]> = TableDefinition::new("secrets");
/// Asynchronous calls by id: the queue's write-ahead record ([`crate::calls`]).
const CALLS: TableDefinition<&str, &[u8]> = TableDefinition::new("calls");

pub(crate) fn unix_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("function store: {0}")]
    Db(String),
    /// A shared store that cannot be reached: management calls are refused
    /// (503 `store_unavailable`) rather than served from what this gateway
    /// last saw, which could split the cluster's truth.
    #[error("the shared function store is unreachable ({0}); retry when it is back")]
    Unavailable(String),
    #[error("function store holds a corrupt record for {0}: {1}")]
    Corrupt(String, serde_json::Error),
    #[error("source {0} is not in the store (upload it first: POST /system/sources)")]
    NoSource(String),
    #[error("source {digest}: {err}")]
    SourceIo { digest: String, err: std::io::Error },
    #[error("the stored source {0} no longer matches its digest (the file was changed on disk)")]
    SourceCorrupt(String),
    #[error("secret {0} does not exist (make it with `staccato secret create {0} --from-file FILE`)")]
    NoSecret(String),
    #[error("{0}")]
    Vault(#[from] crate::secrets::VaultError),
}

fn db<E: std::fmt::Display>(e: E) -> StoreError {
    StoreError::Db(e.to_string())
}

/// Where function metadata is kept. Every method is one transaction.
pub trait Meta: Send + Sync {
    /// Stores a function, when it was stored (`stored_ms`), and the engines
    /// it was placed on (`None`: none are recorded).
    fn put(&self, spec: &FunctionSpec, stored_ms: u64, placed: Option<&[String]>) -> Result<(), StoreError>;
    fn set_placed(&self, name: &str, placed: &[String]) -> Result<(), StoreError>;
    fn placements(&self) -> Result<Vec<(String, Vec<String>)>, StoreError>;
    fn remove(&self, name: &str) -> Result<bool, StoreError>;
    fn list(&self) -> Result<Vec<FunctionSpec>, StoreError>;
    fn get(&self, name: &str) -> Result<Option<FunctionSpec>, StoreError>;
    fn stored_at(&self) -> Result<HashMap<String, u64>, StoreError>;
    /// Functions removed and not stored since: when (Unix ms).
    fn removed(&self) -> Result<HashMap<String, u64>, StoreError>;
    /// Whether other gateways may write it too.
    fn shared(&self) -> bool {
        false
    }
    /// A number that changes whenever another gateway may have changed the
    /// store; `None` for a store only this gateway writes.
    fn revision(&self) -> Result<Option<u64>, StoreError> {
        Ok(None)
    }
    /// Shared copies of source archives (none for an embedded store).
    fn put_archive(&self, _digest: &str, _archive: &[u8]) -> Result<(), StoreError> {
        Ok(())
    }
    fn archive(&self, _digest: &str) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(None)
    }
    /// The shared archives: digest, and when uploaded (Unix ms).
    fn archives(&self) -> Result<Vec<(String, u64)>, StoreError> {
        Ok(Vec::new())
    }
    fn remove_archive(&self, _digest: &str) -> Result<(), StoreError> {
        Ok(())
    }
    /// What it is, for the log.
    fn describe(&self) -> String;
    /// Stores one invoke key's record for function `name`, if the function
    /// is stored, has fewer than `max` keys and none with that id.
    fn put_key(&self, name: &str, key: &KeyRecord, max: usize) -> Result<KeyPut, StoreError>;
    /// Removes key `id` of `name`; whether it was there.
    fn remove_key(&self, name: &str, id: &str) -> Result<bool, StoreError>;
    /// Every function's invoke keys (functions without keys are left out).
    fn keys(&self) -> Result<HashMap<String, Vec<KeyRecord>>, StoreError>;
    /// Stores secret `name`: only if it does not exist yet (`create`), or
    /// only if it does (not `create`). Whether it was stored.
    fn put_secret(&self, name: &str, rec: &SecretRecord, create: bool) -> Result<bool, StoreError>;
    fn secret(&self, name: &str) -> Result<Option<SecretRecord>, StoreError>;
    /// Every secret, by name.
    fn secrets(&self) -> Result<Vec<(String, SecretRecord)>, StoreError>;
    fn remove_secret(&self, name: &str) -> Result<bool, StoreError>;
    /// Writes asynchronous call records (`Some`) and removes them (`None`),
    /// in this order, in one transaction (or, where a transaction is
    /// bounded, in order: each record is written whole or not at all).
    fn write_calls(&self, ops: &[(&str, Option<&[u8]>)]) -> Result<(), StoreError>;
    /// Every asynchronous call record.
    fn calls(&self) -> Result<Vec<(String, Vec<u8>)>, StoreError>;
    fn call(&self, id: &str) -> Result<Option<Vec<u8>>, StoreError>;
}

/// What [`Meta::put_key`] did.
#[derive(Debug, PartialEq, Eq)]
pub enum KeyPut {
    Stored,
    NoFunction,
    Full,
    IdTaken,
}

pub struct Store {
    meta: Box<dyn Meta>,
    sources: PathBuf,
    /// Seals and opens secrets (none: a store for tests, without secrets).
    vault: Option<Vault>,
}

impl Store {
    /// The embedded store at `path`; source archives live in `sources/`
    /// beside it.
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        let sources = path.parent().unwrap_or(Path::new(".")).join("sources");
        Store::with(Box::new(Local::open(path)?), sources)
    }

    /// A store whose metadata is in `meta`, with its local copies of
    /// source archives in `sources`.
    pub fn with(meta: Box<dyn Meta>, sources: PathBuf) -> Result<Store, StoreError> {
        std::fs::create_dir_all(&sources).map_err(db)?;
        Ok(Store { meta, sources, vault: None })
    }

    /// The same store, sealing and opening secrets with `vault`.
    pub fn with_vault(mut self, vault: Vault) -> Store {
        self.vault = Some(vault);
        self
    }

    fn vault(&self) -> Result<&Vault, StoreError> {
        self.vault.as_ref().ok_or_else(|| StoreError::Db("this store keeps no secrets (no key)".into()))
    }

    /// Seals and stores secret `name` (`create`: only a new one; else only
    /// an existing one, keeping when it was made). Whether it was stored.
    pub fn put_secret(&self, name: &str, value: &[u8], create: bool) -> Result<bool, StoreError> {
        let now = unix_ms();
        let created = if create { now } else { self.meta.secret(name)?.map_or(now, |r| r.created_ms) };
        let rec = self.vault()?.seal(name, value, created, now)?;
        self.meta.put_secret(name, &rec, create)
    }

    /// Every secret's name and when it was made and last changed.
    pub fn secrets(&self) -> Result<Vec<(String, SecretRecord)>, StoreError> {
        self.meta.secrets()
    }

    pub fn remove_secret(&self, name: &str) -> Result<bool, StoreError> {
        self.meta.remove_secret(name)
    }

    pub fn write_calls(&self, ops: &[(&str, Option<&[u8]>)]) -> Result<(), StoreError> {
        self.meta.write_calls(ops)
    }

    pub fn calls(&self) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        self.meta.calls()
    }

    pub fn call(&self, id: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.meta.call(id)
    }

    /// The values of the secrets `names`, opened, to send to an engine.
    pub fn secret_values(&self, names: &[String]) -> Result<SecretValues, StoreError> {
        let mut out = SecretValues::default();
        for name in names {
            let rec = self.meta.secret(name)?.ok_or_else(|| StoreError::NoSecret(name.clone()))?;
            out.0.insert(name.clone(), api::secrets::Value(self.vault()?.open_record(name, &rec)?));
        }
        Ok(out)
    }

    pub fn describe(&self) -> String {
        self.meta.describe()
    }

    /// Changes when another gateway may have changed the store (`None`:
    /// none can).
    pub fn revision(&self) -> Result<Option<u64>, StoreError> {
        self.meta.revision()
    }

    /// Whether other gateways may write it too (then it is watched).
    pub fn shared(&self) -> bool {
        self.meta.shared()
    }

    /// Makes sure a shared store has the archive a deploy is about to name
    /// (this gateway's copy may be all that is left of it: another gateway
    /// may have pruned it).
    pub fn share_source(&self, digest: &str, archive: &[u8]) -> Result<(), StoreError> {
        self.meta.put_archive(digest, archive)
    }

    /// Functions removed and not stored since, and when.
    pub fn removed(&self) -> Result<HashMap<String, u64>, StoreError> {
        self.meta.removed()
    }

    fn source_path(&self, digest: &str) -> Option<PathBuf> {
        // valid_digest allows only hex after the prefix: a safe file name.
        api::archive::valid_digest(digest).then(|| self.sources.join(format!("{}.tar.gz", &digest[7..])))
    }

    fn write_local(&self, digest: &str, archive: &[u8]) -> Result<(), StoreError> {
        let path = self.source_path(digest).ok_or_else(|| StoreError::NoSource(digest.to_string()))?;
        let io = |err| StoreError::SourceIo { digest: digest.to_string(), err };
        if !path.is_file() {
            let tmp = path.with_extension(format!("tmp{}", std::process::id()));
            std::fs::write(&tmp, archive).map_err(io)?;
            std::fs::rename(&tmp, &path).map_err(io)?;
        }
        Ok(())
    }

    /// Keeps an archive (already checked by the caller); returns its digest.
    pub fn put_source(&self, archive: &[u8]) -> Result<String, StoreError> {
        let digest = api::archive::digest(archive);
        self.meta.put_archive(&digest, archive)?;
        self.write_local(&digest, archive)?;
        Ok(digest)
    }

    /// Whether the archive is here or in the shared store (fetched then).
    pub fn has_source(&self, digest: &str) -> Result<bool, StoreError> {
        if self.source_path(digest).is_some_and(|p| p.is_file()) {
            return Ok(true);
        }
        match self.source(digest) {
            Ok(_) => Ok(true),
            Err(StoreError::NoSource(_)) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// An archive, checked against its digest; fetched from the shared
    /// store (and kept here) when this gateway has no copy.
    pub fn source(&self, digest: &str) -> Result<Vec<u8>, StoreError> {
        let path = self.source_path(digest).ok_or_else(|| StoreError::NoSource(digest.to_string()))?;
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let Some(b) = self.meta.archive(digest)? else { return Err(StoreError::NoSource(digest.into())) };
                if api::archive::digest(&b) != digest {
                    return Err(StoreError::SourceCorrupt(digest.into()));
                }
                self.write_local(digest, &b)?;
                return Ok(b);
            }
            Err(err) => return Err(StoreError::SourceIo { digest: digest.into(), err }),
        };
        if api::archive::digest(&bytes) != digest {
            return Err(StoreError::SourceCorrupt(digest.into()));
        }
        Ok(bytes)
    }

    /// Removes archives no stored function names, except those uploaded in
    /// the last `grace` (a deploy may be about to use them).
    pub fn prune_sources(&self, grace: std::time::Duration) -> Result<usize, StoreError> {
        let keep: std::collections::HashSet<String> = self.list()?.into_iter().map(|s| s.source).collect();
        let mut removed = 0;
        let now = unix_ms();
        for (digest, uploaded) in self.meta.archives()? {
            if !keep.contains(&digest) && now.saturating_sub(uploaded) >= grace.as_millis() as u64 {
                self.meta.remove_archive(&digest)?;
            }
        }
        for e in std::fs::read_dir(&self.sources).map_err(db)?.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(hex) = name.strip_suffix(".tar.gz") else { continue };
            let young = e.metadata().and_then(|m| m.modified()).is_ok_and(|t| t.elapsed().is_ok_and(|a| a < grace));
            if !keep.contains(&format!("sha256:{hex}")) && !young && std::fs::remove_file(e.path()).is_ok() {
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// Stores a function, and the engines it was placed on (`None`: it
    /// runs on every engine its placement admits, and none are recorded).
    pub fn put(&self, spec: &FunctionSpec, placed: Option<&[String]>) -> Result<(), StoreError> {
        self.meta.put(spec, unix_ms(), placed)
    }

    /// Records the engines a stored function is placed on now.
    pub fn set_placed(&self, name: &str, placed: &[String]) -> Result<(), StoreError> {
        self.meta.set_placed(name, placed)
    }

    /// Every recorded placement: function → engine ids.
    pub fn placements(&self) -> Result<Vec<(String, Vec<String>)>, StoreError> {
        self.meta.placements()
    }

    pub fn put_key(&self, name: &str, key: &KeyRecord, max: usize) -> Result<KeyPut, StoreError> {
        self.meta.put_key(name, key, max)
    }

    pub fn remove_key(&self, name: &str, id: &str) -> Result<bool, StoreError> {
        self.meta.remove_key(name, id)
    }

    pub fn keys(&self) -> Result<HashMap<String, Vec<KeyRecord>>, StoreError> {
        self.meta.keys()
    }

    /// The invoke keys of one function (oldest first).
    pub fn keys_of(&self, name: &str) -> Result<Vec<KeyRecord>, StoreError> {
        Ok(self.meta.keys()?.remove(name).unwrap_or_default())
    }

    pub fn remove(&self, name: &str) -> Result<bool, StoreError> {
        self.meta.remove(name)
    }

    pub fn list(&self) -> Result<Vec<FunctionSpec>, StoreError> {
        self.meta.list()
    }

    /// When each stored function was stored (Unix ms; a store written by
    /// an older Staccato has no stamps: 0).
    pub fn stored_at(&self) -> Result<HashMap<String, u64>, StoreError> {
        self.meta.stored_at()
    }

    pub fn get(&self, name: &str) -> Result<Option<FunctionSpec>, StoreError> {
        self.meta.get(name)
    }
}

/// The embedded backend (redb): one gateway's own.
pub struct Local {
    db: Database,
}

impl Local {
    pub fn open(path: &Path) -> Result<Local, StoreError> {
        let database = Database::create(path).map_err(db)?;
        let tx = database.begin_write().map_err(db)?;
        tx.open_table(FUNCTIONS).map_err(db)?;
        tx.open_table(PLACEMENTS).map_err(db)?;
        tx.open_table(STORED_AT).map_err(db)?;
        tx.open_table(REMOVED).map_err(db)?;
        tx.open_table(KEYS).map_err(db)?;
        tx.open_table(SECRETS).map_err(db)?;
        tx.open_table(CALLS).map_err(db)?;
        tx.commit().map_err(db)?;
        Ok(Local { db: database })
    }
}

impl Meta for Local {
    fn describe(&self) -> String {
        "embedded".into()
    }

    fn put(&self, spec: &FunctionSpec, stored_ms: u64, placed: Option<&[String]>) -> Result<(), StoreError> {
        let bytes = serde_json::to_vec(spec).map_err(db)?;
        let tx = self.db.begin_write().map_err(db)?;
        tx.open_table(FUNCTIONS).map_err(db)?.insert(spec.name.as_str(), bytes.as_slice()).map_err(db)?;
        tx.open_table(STORED_AT).map_err(db)?.insert(spec.name.as_str(), stored_ms).map_err(db)?;
        tx.open_table(REMOVED).map_err(db)?.remove(spec.name.as_str()).map_err(db)?;
        {
            let mut t = tx.open_table(PLACEMENTS).map_err(db)?;
            match placed {
                Some(ids) => {
                    let ids = serde_json::to_vec(ids).map_err(db)?;
                    t.insert(spec.name.as_str(), ids.as_slice()).map_err(db)?;
                }
                None => {
                    t.remove(spec.name.as_str()).map_err(db)?;
                }
            }
        }
        tx.commit().map_err(db)
    }

    fn set_placed(&self, name: &str, placed: &[String]) -> Result<(), StoreError> {
        let ids = serde_json::to_vec(placed).map_err(db)?;
        let tx = self.db.begin_write().map_err(db)?;
        tx.open_table(PLACEMENTS).map_err(db)?.insert(name, ids.as_slice()).map_err(db)?;
        tx.commit().map_err(db)
    }

    fn placements(&self) -> Result<Vec<(String, Vec<String>)>, StoreError> {
        let tx = self.db.begin_read().map_err(db)?;
        let table = tx.open_table(PLACEMENTS).map_err(db)?;
        let mut out = Vec::new();
        for row in table.iter().map_err(db)? {
            let (k, v) = row.map_err(db)?;
            let ids = serde_json::from_slice(v.value()).map_err(|e| StoreError::Corrupt(k.value().to_string(), e))?;
            out.push((k.value().to_string(), ids));
        }
        Ok(out)
    }

    fn remove(&self, name: &str) -> Result<bool, StoreError> {
        let tx = self.db.begin_write().map_err(db)?;
        let existed = tx.open_table(FUNCTIONS).map_err(db)?.remove(name).map_err(db)?.is_some();
        tx.open_table(PLACEMENTS).map_err(db)?.remove(name).map_err(db)?;
        tx.open_table(STORED_AT).map_err(db)?.remove(name).map_err(db)?;
        tx.open_table(REMOVED).map_err(db)?.insert(name, unix_ms()).map_err(db)?;
        {
            // Its keys go with it: a new function of the same name starts
            // with none.
            let mut t = tx.open_table(KEYS).map_err(db)?;
            for k in key_names(&t, name)? {
                t.remove(k.as_str()).map_err(db)?;
            }
        }
        tx.commit().map_err(db)?;
        Ok(existed)
    }

    fn list(&self) -> Result<Vec<FunctionSpec>, StoreError> {
        let tx = self.db.begin_read().map_err(db)?;
        let table = tx.open_table(FUNCTIONS).map_err(db)?;
        let mut out = Vec::new();
        for row in table.iter().map_err(db)? {
            let (k, v) = row.map_err(db)?;
            let spec = serde_json::from_slice(v.value()).map_err(|e| StoreError::Corrupt(k.value().to_string(), e))?;
            out.push(spec);
        }
        Ok(out)
    }

    fn removed(&self) -> Result<HashMap<String, u64>, StoreError> {
        self.stamps(REMOVED)
    }

    fn get(&self, name: &str) -> Result<Option<FunctionSpec>, StoreError> {
        let tx = self.db.begin_read().map_err(db)?;
        let table = tx.open_table(FUNCTIONS).map_err(db)?;
        match table.get(name).map_err(db)? {
            Some(v) => Ok(Some(serde_json::from_slice(v.value()).map_err(|e| StoreError::Corrupt(name.into(), e))?)),
            None => Ok(None),
        }
    }

    fn stored_at(&self) -> Result<HashMap<String, u64>, StoreError> {
        self.stamps(STORED_AT)
    }

    fn put_key(&self, name: &str, key: &KeyRecord, max: usize) -> Result<KeyPut, StoreError> {
        let bytes = serde_json::to_vec(key).map_err(db)?;
        let tx = self.db.begin_write().map_err(db)?;
        let verdict = {
            let stored = tx.open_table(FUNCTIONS).map_err(db)?.get(name).map_err(db)?.is_some();
            let mut t = tx.open_table(KEYS).map_err(db)?;
            let id = format!("{name}/{}", key.id);
            if !stored {
                KeyPut::NoFunction
            } else if key_names(&t, name)?.len() >= max {
                KeyPut::Full
            } else if t.get(id.as_str()).map_err(db)?.is_some() {
                KeyPut::IdTaken
            } else {
                t.insert(id.as_str(), bytes.as_slice()).map_err(db)?;
                KeyPut::Stored
            }
        };
        tx.commit().map_err(db)?;
        Ok(verdict)
    }

    fn remove_key(&self, name: &str, id: &str) -> Result<bool, StoreError> {
        let tx = self.db.begin_write().map_err(db)?;
        let existed = tx.open_table(KEYS).map_err(db)?.remove(format!("{name}/{id}").as_str()).map_err(db)?.is_some();
        tx.commit().map_err(db)?;
        Ok(existed)
    }

    fn put_secret(&self, name: &str, rec: &SecretRecord, create: bool) -> Result<bool, StoreError> {
        let bytes = serde_json::to_vec(rec).map_err(db)?;
        let tx = self.db.begin_write().map_err(db)?;
        let stored = {
            let mut t = tx.open_table(SECRETS).map_err(db)?;
            let exists = t.get(name).map_err(db)?.is_some();
            if exists != create {
                t.insert(name, bytes.as_slice()).map_err(db)?;
                true
            } else {
                false
            }
        };
        tx.commit().map_err(db)?;
        Ok(stored)
    }

    fn secret(&self, name: &str) -> Result<Option<SecretRecord>, StoreError> {
        let tx = self.db.begin_read().map_err(db)?;
        let table = tx.open_table(SECRETS).map_err(db)?;
        match table.get(name).map_err(db)? {
            Some(v) => Ok(Some(serde_json::from_slice(v.value()).map_err(|e| StoreError::Corrupt(name.into(), e))?)),
            None => Ok(None),
        }
    }

    fn secrets(&self) -> Result<Vec<(String, SecretRecord)>, StoreError> {
        let tx = self.db.begin_read().map_err(db)?;
        let table = tx.open_table(SECRETS).map_err(db)?;
        let mut out = Vec::new();
        for row in table.iter().map_err(db)? {
            let (k, v) = row.map_err(db)?;
            let rec = serde_json::from_slice(v.value()).map_err(|e| StoreError::Corrupt(k.value().to_string(), e))?;
            out.push((k.value().to_string(), rec));
        }
        Ok(out)
    }

    fn remove_secret(&self, name: &str) -> Result<bool, StoreError> {
        let tx = self.db.begin_write().map_err(db)?;
        let existed = tx.open_table(SECRETS).map_err(db)?.remove(name).map_err(db)?.is_some();
        tx.commit().map_err(db)?;
        Ok(existed)
    }

    fn write_calls(&self, ops: &[(&str, Option<&[u8]>)]) -> Result<(), StoreError> {
        let tx = self.db.begin_write().map_err(db)?;
        {
            let mut t = tx.open_table(CALLS).map_err(db)?;
            for (id, rec) in ops {
                match rec {
                    Some(rec) => drop(t.insert(*id, *rec).map_err(db)?),
                    None => drop(t.remove(*id).map_err(db)?),
                }
            }
        }
        tx.commit().map_err(db)
    }

    fn calls(&self) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        let tx = self.db.begin_read().map_err(db)?;
        let table = tx.open_table(CALLS).map_err(db)?;
        let mut out = Vec::new();
        for row in table.iter().map_err(db)? {
            let (k, v) = row.map_err(db)?;
            out.push((k.value().to_string(), v.value().to_vec()));
        }
        Ok(out)
    }

    fn call(&self, id: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let tx = self.db.begin_read().map_err(db)?;
        let table = tx.open_table(CALLS).map_err(db)?;
        Ok(table.get(id).map_err(db)?.map(|v| v.value().to_vec()))
    }

    fn keys(&self) -> Result<HashMap<String, Vec<KeyRecord>>, StoreError> {
        let tx = self.db.begin_read().map_err(db)?;
        let table = tx.open_table(KEYS).map_err(db)?;
        let mut rows = Vec::new();
        for row in table.iter().map_err(db)? {
            let (k, v) = row.map_err(db)?;
            rows.push((k.value().to_string(), v.value().to_vec()));
        }
        keys_from(rows)
    }
}

/// The `NAME/ID` rows of function `name` in the keys table. Names are
/// `[a-z][a-z0-9_-]*`: every row of `a` sorts after `a-b`'s and before
/// `a0`, `a_b` and `ab`'s (`-` < `/` < `0` < `_` < `a`), so they are
/// contiguous from `a/`.
fn key_names(t: &impl ReadableTable<&'static str, &'static [u8]>, name: &str) -> Result<Vec<String>, StoreError> {
    let prefix = format!("{name}/");
    let mut out = Vec::new();
    for row in t.range(prefix.as_str()..).map_err(db)? {
        let k = row.map_err(db)?.0.value().to_string();
        if !k.starts_with(&prefix) {
            break;
        }
        out.push(k);
    }
    Ok(out)
}

/// Key records stored as `NAME/ID` → JSON, grouped by function, oldest
/// first. A record that does not parse is left out (logged): its function
/// keeps its other keys, and still needs one.
pub(crate) fn keys_from(rows: Vec<(String, Vec<u8>)>) -> Result<HashMap<String, Vec<KeyRecord>>, StoreError> {
    let mut out: HashMap<String, Vec<KeyRecord>> = HashMap::new();
    for (k, v) in rows {
        let Some((name, _)) = k.split_once('/') else { continue };
        match serde_json::from_slice::<KeyRecord>(&v) {
            Ok(rec) => out.entry(name.to_string()).or_default().push(rec),
            Err(e) => log::error!("the function store holds a corrupt invoke key record {k:?} ({e}); it is ignored"),
        }
    }
    for recs in out.values_mut() {
        recs.sort_by(|a, b| (a.created_ms, &a.id).cmp(&(b.created_ms, &b.id)));
    }
    Ok(out)
}

impl Local {
    fn stamps(&self, t: TableDefinition<&str, u64>) -> Result<HashMap<String, u64>, StoreError> {
        let tx = self.db.begin_read().map_err(db)?;
        let table = tx.open_table(t).map_err(db)?;
        let mut out = HashMap::new();
        for row in table.iter().map_err(db)? {
            let (k, v) = row.map_err(db)?;
            out.insert(k.value().to_string(), v.value());
        }
        Ok(out)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use api::spec::Runtime;

    /// A valid spec for tests here and in other modules.
    pub(crate) fn spec() -> FunctionSpec {
        FunctionSpec {
            name: "f".into(),
            runtime: Runtime::C,
            handler: "x.c".into(),
            source: format!("sha256:{}", "a".repeat(64)),
            min_workers: 1,
            max_workers: 2,
            timeout_ms: 10,
            max_queue: 1024,
            env: Default::default(),
            memory_bytes: 64 << 20,
            pids: 32,
            worker_mode: Default::default(),
            cpu_shares: None,
            placement: Default::default(),
            auth: Default::default(),
            secrets: Vec::new(),
            async_calls: Default::default(),
            grpc: Vec::new(),
        }
    }

    #[test]
    fn put_list_remove_survive_reopen() {
        let dir = std::env::temp_dir().join(format!("staccato-store-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("db.redb");
        let spec = spec();
        {
            let s = Store::open(&path).expect("open");
            s.put(&spec, Some(&["e1".to_string()])).expect("put");
        }
        let s = Store::open(&path).expect("reopen");
        assert_eq!(s.list().expect("list"), vec![spec.clone()]);
        let at = s.stored_at().expect("stamps")["f"];
        assert!(at.abs_diff(unix_ms()) < 60_000, "stamped when stored: {at}");
        assert_eq!(s.placements().expect("placements"), vec![("f".to_string(), vec!["e1".to_string()])]);
        s.put(&spec, None).expect("put everywhere");
        assert!(s.placements().expect("placements").is_empty());
        s.set_placed("f", &["e2".to_string()]).expect("set");
        assert_eq!(s.placements().expect("placements")[0].1, vec!["e2".to_string()]);
        assert_eq!(s.get("f").expect("get"), Some(spec.clone()));
        assert!(s.remove("f").expect("remove"));
        assert!(s.placements().expect("placements").is_empty(), "removed with its function");
        assert!(s.stored_at().expect("stamps").is_empty(), "its stamp too");
        assert!(s.removed().expect("removed").contains_key("f"), "remembered as removed");
        s.put(&spec, None).expect("stored again");
        assert!(s.removed().expect("removed").is_empty(), "no longer removed");
        assert!(s.remove("f").expect("remove"));
        assert!(!s.remove("f").expect("remove again"));
        assert!(s.list().expect("list").is_empty());

        let digest = s.put_source(b"archive bytes").expect("put source");
        assert!(s.has_source(&digest).expect("has"));
        assert_eq!(s.source(&digest).expect("read"), b"archive bytes");
        // Tampered on disk: refused, not served.
        std::fs::write(dir.join("sources").join(format!("{}.tar.gz", &digest[7..])), b"evil").expect("write");
        assert!(matches!(s.source(&digest), Err(StoreError::SourceCorrupt(_))));
        assert!(matches!(s.source("../../etc/shadow"), Err(StoreError::NoSource(_))));
        assert_eq!(s.prune_sources(std::time::Duration::ZERO).expect("prune"), 1);
        assert!(!s.has_source(&digest).expect("has"));
        let _ = std::fs::remove_dir_all(dir);
    }
}
