//! The gateway's embedded function store (redb): registered functions
//! survive a restart of Staccato.

use engine::spec::FunctionSpec;
use redb::{Database, ReadableTable, TableDefinition};
use std::path::Path;

const FUNCTIONS: TableDefinition<&str, &[u8]> = TableDefinition::new("functions");

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("function store: {0}")]
    Db(String),
    #[error("function store holds a corrupt record for {0}: {1}")]
    Corrupt(String, serde_json::Error),
}

fn db<E: std::fmt::Display>(e: E) -> StoreError {
    StoreError::Db(e.to_string())
}

pub struct Store {
    db: Database,
}

impl Store {
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        let database = Database::create(path).map_err(db)?;
        let tx = database.begin_write().map_err(db)?;
        tx.open_table(FUNCTIONS).map_err(db)?;
        tx.commit().map_err(db)?;
        Ok(Store { db: database })
    }

    pub fn put(&self, spec: &FunctionSpec) -> Result<(), StoreError> {
        let bytes = serde_json::to_vec(spec).map_err(db)?;
        let tx = self.db.begin_write().map_err(db)?;
        tx.open_table(FUNCTIONS).map_err(db)?.insert(spec.name.as_str(), bytes.as_slice()).map_err(db)?;
        tx.commit().map_err(db)
    }

    pub fn remove(&self, name: &str) -> Result<bool, StoreError> {
        let tx = self.db.begin_write().map_err(db)?;
        let existed = tx.open_table(FUNCTIONS).map_err(db)?.remove(name).map_err(db)?.is_some();
        tx.commit().map_err(db)?;
        Ok(existed)
    }

    pub fn list(&self) -> Result<Vec<FunctionSpec>, StoreError> {
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

    pub fn get(&self, name: &str) -> Result<Option<FunctionSpec>, StoreError> {
        let tx = self.db.begin_read().map_err(db)?;
        let table = tx.open_table(FUNCTIONS).map_err(db)?;
        match table.get(name).map_err(db)? {
            Some(v) => Ok(Some(serde_json::from_slice(v.value()).map_err(|e| StoreError::Corrupt(name.into(), e))?)),
            None => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use engine::spec::Runtime;

    #[test]
    fn put_list_remove_survive_reopen() {
        let dir = std::env::temp_dir().join(format!("staccato-store-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("db.redb");
        let spec = FunctionSpec {
            name: "f".into(),
            runtime: Runtime::C,
            handler: "x.c".into(),
            source_dir: "/tmp".into(),
            min_workers: 1,
            max_workers: 2,
            timeout_ms: 10,
            env: Default::default(),
            memory_bytes: 64 << 20,
            pids: 32,
            worker_mode: Default::default(),
            cpu_shares: None,
        };
        {
            let s = Store::open(&path).expect("open");
            s.put(&spec).expect("put");
        }
        let s = Store::open(&path).expect("reopen");
        assert_eq!(s.list().expect("list"), vec![spec.clone()]);
        assert_eq!(s.get("f").expect("get"), Some(spec));
        assert!(s.remove("f").expect("remove"));
        assert!(!s.remove("f").expect("remove again"));
        assert!(s.list().expect("list").is_empty());
        let _ = std::fs::remove_dir_all(dir);
    }
}
