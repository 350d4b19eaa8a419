//! Which functions need an invoke key (`auth: key`), and their keys'
//! digests: consulted on every external call, so held in memory and read
//! again from the store whenever it changes (here, or, with a shared
//! store, through another gateway: `watch_store`). The same reading of
//! the functions gives the gRPC methods each serves (`grpc:`; [`crate::grpc`]).

use crate::store::{Store, StoreError};
use api::keys::KeyRecord;
use api::spec::Auth;
use std::collections::HashMap;
use std::sync::{Arc, RwLock};

/// What a call presented, judged against its function's keys.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The function takes calls from anyone (or is not known here: the
    /// engine answers that).
    Open,
    /// The function needs a key and this is one of its keys.
    Allowed,
    /// The function needs a key and the call brought none.
    Missing,
    /// The function needs a key and the call brought another one.
    Wrong,
}

pub struct Keys {
    /// Functions with `auth: key`, and their keys (maybe none yet).
    table: RwLock<HashMap<String, Arc<Vec<KeyRecord>>>>,
    /// gRPC methods (`package.Service/Method`) and the function serving each.
    methods: RwLock<HashMap<String, String>>,
    store: Arc<Store>,
}

impl Keys {
    pub fn load(store: Arc<Store>) -> Result<Keys, StoreError> {
        let keys = Keys { table: RwLock::new(HashMap::new()), methods: RwLock::new(HashMap::new()), store };
        keys.reload()?;
        Ok(keys)
    }

    /// Reads every function's auth and keys from the store again.
    pub fn reload(&self) -> Result<(), StoreError> {
        let mut records = self.store.keys()?;
        let specs = self.store.list()?;
        let methods = specs.iter().flat_map(|s| s.grpc.iter().map(|m| (m.clone(), s.name.clone()))).collect();
        *self.methods.write().unwrap_or_else(|p| p.into_inner()) = methods;
        let table: HashMap<String, Arc<Vec<KeyRecord>>> = specs
            .into_iter()
            .filter(|s| s.auth == Auth::Key)
            .map(|s| {
                let keys = records.remove(&s.name).unwrap_or_default();
                (s.name, Arc::new(keys))
            })
            .collect();
        *self.table.write().unwrap_or_else(|p| p.into_inner()) = table;
        Ok(())
    }

    /// Reads the store again, logging (not failing) if it cannot: what was
    /// read last stays in force (engines refuse unchecked calls of
    /// functions that need a key whatever it says). Whether it could.
    pub fn refresh(&self) -> bool {
        match self.reload() {
            Ok(()) => true,
            Err(e) => {
                log::warn!("reading invoke keys from the store: {e}");
                false
            }
        }
    }

    /// Makes `name` need a key now, with the keys it has in the store (a
    /// deploy with `auth: key`, before any engine runs it).
    pub fn require(&self, name: &str) -> Result<(), StoreError> {
        let keys = self.store.keys_of(name)?;
        self.table.write().unwrap_or_else(|p| p.into_inner()).insert(name.to_string(), Arc::new(keys));
        Ok(())
    }

    /// The function serving gRPC method `method` (`package.Service/Method`).
    pub fn grpc_function(&self, method: &str) -> Option<String> {
        self.methods.read().unwrap_or_else(|p| p.into_inner()).get(method).cloned()
    }

    /// Judges a call of `name` that presented `bearer` (empty: none).
    pub fn check(&self, name: &str, bearer: &[u8]) -> Verdict {
        let keys = match self.table.read().unwrap_or_else(|p| p.into_inner()).get(name) {
            None => return Verdict::Open,
            Some(k) => k.clone(),
        };
        if bearer.is_empty() {
            Verdict::Missing
        } else if api::keys::matches(bearer, &keys) {
            Verdict::Allowed
        } else {
            Verdict::Wrong
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use api::spec::FunctionSpec;

    fn spec(name: &str, auth: Auth) -> FunctionSpec {
        FunctionSpec { name: name.into(), auth, ..crate::store::tests::spec() }
    }

    #[test]
    fn only_functions_that_ask_for_a_key_need_one() {
        let dir = std::env::temp_dir().join(format!("staccato-keys-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let store = Arc::new(Store::open(&dir.join("db.redb")).unwrap());
        store.put(&spec("open", Auth::None), None).unwrap();
        store.put(&spec("locked", Auth::Key), None).unwrap();
        let keys = Keys::load(store.clone()).unwrap();
        assert_eq!(keys.check("open", b""), Verdict::Open);
        assert_eq!(keys.check("nosuch", b""), Verdict::Open);
        assert_eq!(keys.check("locked", b""), Verdict::Missing);
        assert_eq!(keys.check("locked", b"stk_guess"), Verdict::Wrong, "no key made yet: nothing matches");

        let (k1, r1) = api::keys::new_key(1).unwrap();
        let (k2, r2) = api::keys::new_key(2).unwrap();
        use crate::store::KeyPut;
        assert_eq!(store.put_key("locked", &r1, 16).unwrap(), KeyPut::Stored);
        assert_eq!(store.put_key("locked", &r2, 16).unwrap(), KeyPut::Stored);
        assert_eq!(store.put_key("locked", &r2, 16).unwrap(), KeyPut::IdTaken);
        assert_eq!(store.put_key("nosuch", &r1, 16).unwrap(), KeyPut::NoFunction);
        assert_eq!(store.put_key("locked", &api::keys::new_key(3).unwrap().1, 2).unwrap(), KeyPut::Full);
        // Neighbours in the table's order keep their keys when one goes:
        // a-b, a_b, a0 and ab around a.
        for n in ["a", "a-b", "a_b", "a0", "ab"] {
            store.put(&spec(n, Auth::Key), None).unwrap();
            assert_eq!(store.put_key(n, &api::keys::new_key(4).unwrap().1, 16).unwrap(), KeyPut::Stored);
        }
        assert!(store.remove("a").unwrap());
        let left = store.keys().unwrap();
        assert!(!left.contains_key("a"));
        for n in ["a-b", "a_b", "a0", "ab"] {
            assert_eq!(left[n].len(), 1, "{n} lost its key when a was removed");
        }
        assert_eq!(keys.check("locked", k1.as_bytes()), Verdict::Wrong, "not read again yet");
        keys.reload().unwrap();
        assert_eq!(keys.check("locked", k1.as_bytes()), Verdict::Allowed);
        assert_eq!(keys.check("locked", k2.as_bytes()), Verdict::Allowed);
        assert_eq!(keys.check("open", k1.as_bytes()), Verdict::Open);
        assert_eq!(store.keys_of("locked").unwrap(), vec![r1.clone(), r2.clone()], "oldest first");

        // Revoked.
        assert!(store.remove_key("locked", &r1.id).unwrap());
        assert!(!store.remove_key("locked", &r1.id).unwrap());
        keys.reload().unwrap();
        assert_eq!(keys.check("locked", k1.as_bytes()), Verdict::Wrong);
        assert_eq!(keys.check("locked", k2.as_bytes()), Verdict::Allowed);

        // Redeployed without auth: open; with it again: the key still works.
        store.put(&spec("locked", Auth::None), None).unwrap();
        keys.reload().unwrap();
        assert_eq!(keys.check("locked", b""), Verdict::Open);
        store.put(&spec("locked", Auth::Key), None).unwrap();
        keys.reload().unwrap();
        assert_eq!(keys.check("locked", k2.as_bytes()), Verdict::Allowed);

        // Removed: its keys go with it, and a new function of that name
        // starts with none.
        assert!(store.remove("locked").unwrap());
        assert!(store.keys_of("locked").unwrap().is_empty());
        store.put(&spec("locked", Auth::Key), None).unwrap();
        keys.reload().unwrap();
        assert_eq!(keys.check("locked", k2.as_bytes()), Verdict::Wrong);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
