//! The shared store backend: function metadata and source archives in etcd
//! (v3, through its JSON gateway), so several gateways serve one truth. A
//! deploy through one gateway is stored here; the others see the store's
//! revision change within `WATCH_EVERY` and reload placements and
//! reconcile their engines (`crate::watch_store`).
//!
//! Keys, under a prefix (default `/staccato/`):
//! - `functions/NAME`: the spec (JSON); `stored_at/NAME`: when it was
//!   stored (Unix ms); `placements/NAME`: the engine ids it was placed on;
//!   `removed/NAME`: when it was removed, until it is stored again. A put
//!   or a removal changes all four in one transaction.
//! - `archives/HEX`: a source archive's size, chunk count and upload time;
//!   `chunks/HEX/NNNNN`: its bytes in chunks of `CHUNK` (etcd refuses
//!   requests over 1.5 MiB). The chunks are written first and the archive
//!   key last, so an archive that is listed is whole; its digest is checked
//!   again whenever it is read.
//! - `changed/`: written with every transaction that deletes among the
//!   keys above (`Etcd::change`), so that [`Meta::revision`] sees each
//!   change.
//!
//! Every failure to reach etcd is `StoreError::Unavailable`: the gateway
//! answers management calls 503 `store_unavailable` instead of acting on
//! what it last saw.

use crate::secrets::SecretRecord;
use crate::store::{KeyPut, Meta, StoreError};
use api::keys::KeyRecord;
use api::spec::FunctionSpec;
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::time::Duration;

/// Archive bytes per etcd value.
const CHUNK: usize = 512 << 10;

pub struct Etcd {
    agent: ureq::Agent,
    /// `http://host:port` of each endpoint; tried in turn.
    endpoints: Vec<String>,
    prefix: String,
}

/// Parses `etcd://HOST:PORT[,HOST:PORT...][/PREFIX]`.
pub fn parse_url(url: &str) -> Result<(Vec<String>, String), String> {
    let rest = url.strip_prefix("etcd://").ok_or_else(|| format!("{url:?} is not like etcd://HOST:PORT[/PREFIX]"))?;
    let (hosts, prefix) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/staccato"),
    };
    let prefix = format!("{}/", prefix.trim_end_matches('/'));
    if prefix.len() > 128 || !prefix.bytes().all(|b| b.is_ascii_alphanumeric() || b"/_.-".contains(&b)) {
        return Err(format!("etcd key prefix {prefix:?}: use up to 128 of a-z, 0-9, '/', '_', '.', '-'"));
    }
    let mut endpoints = Vec::new();
    for h in hosts.split(',') {
        let ok = !h.is_empty()
            && h.rsplit_once(':').is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok())
            && h.bytes().all(|b| b.is_ascii_alphanumeric() || b".-:[]".contains(&b));
        if !ok {
            return Err(format!("etcd endpoint {h:?} is not like HOST:PORT"));
        }
        endpoints.push(format!("http://{h}"));
    }
    Ok((endpoints, prefix))
}

fn unavailable<E: std::fmt::Display>(e: E) -> StoreError {
    StoreError::Unavailable(e.to_string())
}

fn b64(s: impl AsRef<[u8]>) -> String {
    B64.encode(s)
}

/// The key just after every key that starts with `prefix` (etcd's
/// `range_end` for a prefix).
fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    if let Some(last) = end.last_mut() {
        *last += 1; // prefixes end in '/', never 0xff
    }
    end
}

impl Etcd {
    pub fn connect(url: &str) -> Result<Etcd, StoreError> {
        let (endpoints, prefix) = parse_url(url).map_err(StoreError::Db)?;
        let config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .max_redirects(0)
            .proxy(None)
            .timeout_connect(Some(Duration::from_secs(2)))
            .timeout_global(Some(Duration::from_secs(5)))
            .build();
        let etcd = Etcd { agent: ureq::Agent::new_with_config(config), endpoints, prefix };
        // Reachable now, or the gateway does not start.
        etcd.revision()?;
        Ok(etcd)
    }

    fn key(&self, kind: &str, name: &str) -> String {
        format!("{}{kind}/{name}", self.prefix)
    }

    /// An asynchronous call's key. Beside the functions' keys, not among
    /// them: `~` sorts after every kind's name, so [`Meta::revision`]'s
    /// range (up to `~`) does not see calls come and go.
    fn call_key(&self, id: &str) -> String {
        format!("{}~calls/{id}", self.prefix)
    }

    /// One request to the first endpoint that answers.
    fn call(&self, path: &str, body: &Value) -> Result<Value, StoreError> {
        let body = serde_json::to_vec(body).map_err(unavailable)?;
        let mut last = String::new();
        for ep in &self.endpoints {
            let req = ureq::http::Request::builder()
                .method("POST")
                .uri(format!("{ep}{path}"))
                .header("content-type", "application/json")
                .body(body.as_slice())
                .map_err(unavailable)?;
            let mut resp = match self.agent.run(req) {
                Ok(r) => r,
                Err(e) => {
                    last = format!("{ep}: {e}");
                    continue;
                }
            };
            let status = resp.status().as_u16();
            let text = resp.body_mut().with_config().limit(16 << 20).read_to_vec().map_err(unavailable)?;
            let v: Value = serde_json::from_slice(&text).map_err(|e| unavailable(format!("{ep}{path}: {e}")))?;
            if status != 200 {
                let msg = v["error"].as_str().or(v["message"].as_str()).unwrap_or("").to_string();
                let msg = format!("etcd {path} answered {status}: {msg}");
                // etcd's own trouble (no leader, ...) is an outage; a
                // refusal (a request too large, a quota) is not.
                return Err(if status >= 500 { StoreError::Unavailable(msg) } else { StoreError::Db(msg) });
            }
            return Ok(v);
        }
        Err(StoreError::Unavailable(last))
    }

    /// Every key and value under `prefix`.
    fn range(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        let v = self.call("/v3/kv/range", &json!({ "key": b64(prefix), "range_end": b64(prefix_end(prefix)) }))?;
        let mut out = Vec::new();
        for kv in v["kvs"].as_array().into_iter().flatten() {
            let key = B64.decode(kv["key"].as_str().unwrap_or("")).map_err(|e| StoreError::Db(e.to_string()))?;
            let value = B64.decode(kv["value"].as_str().unwrap_or("")).map_err(|e| StoreError::Db(e.to_string()))?;
            let key = String::from_utf8_lossy(&key[prefix.len().min(key.len())..]).into_owned();
            out.push((key, value));
        }
        Ok(out)
    }

    fn get_key(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let v = self.call("/v3/kv/range", &json!({ "key": b64(key) }))?;
        match v["kvs"].as_array().and_then(|a| a.first()) {
            Some(kv) => {
                Ok(Some(B64.decode(kv["value"].as_str().unwrap_or("")).map_err(|e| StoreError::Db(e.to_string()))?))
            }
            None => Ok(None),
        }
    }

    fn put_raw(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.call("/v3/kv/put", &json!({ "key": b64(key), "value": b64(value) })).map(|_| ())
    }

    /// Every function's stamp of a kind (Unix ms; 0 if unreadable).
    fn stamps(&self, kind: &str) -> Result<HashMap<String, u64>, StoreError> {
        Ok(self
            .range(&self.key(kind, ""))?
            .into_iter()
            .map(|(name, v)| (name, String::from_utf8_lossy(&v).parse().unwrap_or(0)))
            .collect())
    }

    fn txn(&self, ops: Vec<Value>) -> Result<Value, StoreError> {
        self.call("/v3/kv/txn", &json!({ "success": ops }))
    }

    /// A transaction that may delete among what [`Meta::revision`] watches,
    /// with a write of `changed/` appended (its answers keep their places):
    /// a delete alone can put the watched keys back as they were before an
    /// earlier write (as many, the same newest), and a gateway that read
    /// the store before both would take it for unchanged.
    fn change(&self, mut ops: Vec<Value>) -> Result<Value, StoreError> {
        ops.push(put_op(&self.key("changed", ""), b""));
        self.txn(ops)
    }
}

fn put_op(key: &str, value: &[u8]) -> Value {
    json!({ "request_put": { "key": b64(key), "value": b64(value) } })
}

fn delete_op(key: &str) -> Value {
    json!({ "request_delete_range": { "key": b64(key) } })
}

impl Meta for Etcd {
    fn describe(&self) -> String {
        format!("etcd at {} under {}", self.endpoints.join(","), self.prefix)
    }

    fn put(&self, spec: &FunctionSpec, stored_ms: u64, placed: Option<&[String]>) -> Result<(), StoreError> {
        let name = &spec.name;
        let spec_json = serde_json::to_vec(spec).map_err(|e| StoreError::Db(e.to_string()))?;
        let mut ops = vec![
            put_op(&self.key("functions", name), &spec_json),
            put_op(&self.key("stored_at", name), stored_ms.to_string().as_bytes()),
            delete_op(&self.key("removed", name)),
        ];
        match placed {
            Some(ids) => ops.push(put_op(
                &self.key("placements", name),
                &serde_json::to_vec(ids).map_err(|e| StoreError::Db(e.to_string()))?,
            )),
            None => ops.push(delete_op(&self.key("placements", name))),
        }
        self.change(ops).map(|_| ())
    }

    fn set_placed(&self, name: &str, placed: &[String]) -> Result<(), StoreError> {
        let ids = serde_json::to_vec(placed).map_err(|e| StoreError::Db(e.to_string()))?;
        self.put_raw(&self.key("placements", name), &ids)
    }

    fn placements(&self) -> Result<Vec<(String, Vec<String>)>, StoreError> {
        let mut out = Vec::new();
        for (name, v) in self.range(&self.key("placements", ""))? {
            let ids = serde_json::from_slice(&v).map_err(|e| StoreError::Corrupt(name.clone(), e))?;
            out.push((name, ids));
        }
        Ok(out)
    }

    fn remove(&self, name: &str) -> Result<bool, StoreError> {
        let v = self.change(vec![
            delete_op(&self.key("functions", name)),
            delete_op(&self.key("stored_at", name)),
            delete_op(&self.key("placements", name)),
            put_op(&self.key("removed", name), crate::store::unix_ms().to_string().as_bytes()),
            // Its invoke keys go with it.
            json!({ "request_delete_range": {
                "key": b64(self.key("keys", &format!("{name}/"))),
                "range_end": b64(prefix_end(&self.key("keys", &format!("{name}/")))),
            } }),
        ])?;
        // responses[0].response_delete_range.deleted: how many functions/NAME.
        let deleted = &v["responses"][0]["response_delete_range"]["deleted"];
        Ok(deleted.as_str().and_then(|d| d.parse::<u64>().ok()).or(deleted.as_u64()).unwrap_or(0) > 0)
    }

    fn list(&self) -> Result<Vec<FunctionSpec>, StoreError> {
        let mut out = Vec::new();
        for (name, v) in self.range(&self.key("functions", ""))? {
            out.push(serde_json::from_slice(&v).map_err(|e| StoreError::Corrupt(name, e))?);
        }
        Ok(out)
    }

    fn get(&self, name: &str) -> Result<Option<FunctionSpec>, StoreError> {
        match self.get_key(&self.key("functions", name))? {
            Some(v) => Ok(Some(serde_json::from_slice(&v).map_err(|e| StoreError::Corrupt(name.into(), e))?)),
            None => Ok(None),
        }
    }

    fn shared(&self) -> bool {
        true
    }

    fn put_key(&self, name: &str, key: &KeyRecord, max: usize) -> Result<KeyPut, StoreError> {
        // The count is read first (a key made at the same moment through
        // another gateway may pass it); the function's presence and the
        // id's freshness are compared in the write's transaction.
        if self.range(&self.key("keys", &format!("{name}/")))?.len() >= max {
            return Ok(KeyPut::Full);
        }
        let bytes = serde_json::to_vec(key).map_err(|e| StoreError::Db(e.to_string()))?;
        let id_key = self.key("keys", &format!("{name}/{}", key.id));
        let function = self.key("functions", name);
        let v = self.call(
            "/v3/kv/txn",
            &json!({
                "compare": [
                    { "key": b64(&function), "target": "VERSION", "result": "GREATER", "version": "0" },
                    { "key": b64(&id_key), "target": "CREATE", "result": "EQUAL", "create_revision": "0" },
                ],
                "success": [put_op(&id_key, &bytes)],
                "failure": [{ "request_range": { "key": b64(&function) } }],
            }),
        )?;
        if v["succeeded"].as_bool().unwrap_or(false) {
            return Ok(KeyPut::Stored);
        }
        let exists = v["responses"][0]["response_range"]["kvs"].as_array().is_some_and(|a| !a.is_empty());
        Ok(if exists { KeyPut::IdTaken } else { KeyPut::NoFunction })
    }

    fn remove_key(&self, name: &str, id: &str) -> Result<bool, StoreError> {
        let v = self.change(vec![delete_op(&self.key("keys", &format!("{name}/{id}")))])?;
        let deleted = &v["responses"][0]["response_delete_range"]["deleted"];
        Ok(deleted.as_str().and_then(|d| d.parse::<u64>().ok()).or(deleted.as_u64()).unwrap_or(0) > 0)
    }

    fn keys(&self) -> Result<HashMap<String, Vec<KeyRecord>>, StoreError> {
        crate::store::keys_from(self.range(&self.key("keys", ""))?)
    }

    fn put_secret(&self, name: &str, rec: &SecretRecord, create: bool) -> Result<bool, StoreError> {
        let bytes = serde_json::to_vec(rec).map_err(|e| StoreError::Db(e.to_string()))?;
        let key = self.key("secrets", name);
        let compare = if create {
            json!({ "key": b64(&key), "target": "CREATE", "result": "EQUAL", "create_revision": "0" })
        } else {
            json!({ "key": b64(&key), "target": "VERSION", "result": "GREATER", "version": "0" })
        };
        let v = self.call("/v3/kv/txn", &json!({ "compare": [compare], "success": [put_op(&key, &bytes)] }))?;
        Ok(v["succeeded"].as_bool().unwrap_or(false))
    }

    fn secret(&self, name: &str) -> Result<Option<SecretRecord>, StoreError> {
        match self.get_key(&self.key("secrets", name))? {
            Some(v) => Ok(Some(serde_json::from_slice(&v).map_err(|e| StoreError::Corrupt(name.into(), e))?)),
            None => Ok(None),
        }
    }

    fn secrets(&self) -> Result<Vec<(String, SecretRecord)>, StoreError> {
        let mut out = Vec::new();
        for (name, v) in self.range(&self.key("secrets", ""))? {
            let rec = serde_json::from_slice(&v).map_err(|e| StoreError::Corrupt(name.clone(), e))?;
            out.push((name, rec));
        }
        Ok(out)
    }

    fn remove_secret(&self, name: &str) -> Result<bool, StoreError> {
        let v = self.change(vec![delete_op(&self.key("secrets", name))])?;
        let deleted = &v["responses"][0]["response_delete_range"]["deleted"];
        Ok(deleted.as_str().and_then(|d| d.parse::<u64>().ok()).or(deleted.as_u64()).unwrap_or(0) > 0)
    }

    fn removed(&self) -> Result<HashMap<String, u64>, StoreError> {
        self.stamps("removed")
    }

    fn stored_at(&self) -> Result<HashMap<String, u64>, StoreError> {
        self.stamps("stored_at")
    }

    /// What changes when functions, placements, keys or secrets do: the
    /// newest modification revision among their keys and how many there
    /// are (every write raises the newest; a delete comes with a write,
    /// `Etcd::change`). The asynchronous calls (beyond `~`) are left out:
    /// they change all the time and no gateway needs to reread the
    /// functions for them.
    fn revision(&self) -> Result<Option<u64>, StoreError> {
        let end = format!("{}~", self.prefix);
        let v = self.call(
            "/v3/kv/range",
            &json!({ "key": b64(&self.prefix), "range_end": b64(&end), "keys_only": true, "limit": 1,
                     "sort_order": "DESCEND", "sort_target": "MOD" }),
        )?;
        let num = |x: &Value| x.as_str().and_then(|s| s.parse::<u64>().ok()).or(x.as_u64());
        let newest = num(&v["kvs"][0]["mod_revision"]).unwrap_or(0);
        let count = num(&v["count"]).unwrap_or(0);
        if v["header"]["revision"].is_null() {
            return Err(StoreError::Db(format!("etcd answered a range without a revision: {v}")));
        }
        Ok(Some(newest.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ count))
    }

    fn write_calls(&self, changes: &[(&str, Option<&[u8]>)]) -> Result<(), StoreError> {
        // etcd refuses a transaction naming a key twice (each key's last
        // change is the one that counts), or with more than 128 operations
        // (its default --max-txn-ops).
        let mut ops: Vec<(String, Value)> = Vec::new();
        for (id, rec) in changes {
            let k = self.call_key(id);
            ops.retain(|(x, _)| *x != k);
            let op = match rec {
                Some(rec) => put_op(&k, rec),
                None => delete_op(&k),
            };
            ops.push((k, op));
        }
        let mut size = 0;
        let mut batch = Vec::new();
        for (_, op) in ops {
            let len = op.to_string().len();
            if !batch.is_empty() && (batch.len() == 128 || size + len > 1 << 20) {
                self.txn(std::mem::take(&mut batch))?;
                size = 0;
            }
            size += len;
            batch.push(op);
        }
        if !batch.is_empty() {
            self.txn(batch)?;
        }
        Ok(())
    }

    /// Read in pages of 8: one answer is at most 16 MiB here (and etcd's
    /// own limit is near that), and a record is up to ~2 MiB as etcd's JSON
    /// sends it (a dead letter keeps a 1 MiB input).
    fn calls(&self) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        let prefix = self.call_key("");
        let end = prefix_end(&prefix);
        let mut from = prefix.clone().into_bytes();
        let mut out = Vec::new();
        loop {
            let v = self.call("/v3/kv/range", &json!({ "key": b64(&from), "range_end": b64(&end), "limit": 8 }))?;
            let kvs = v["kvs"].as_array().cloned().unwrap_or_default();
            let mut last = None;
            for kv in &kvs {
                let key = B64.decode(kv["key"].as_str().unwrap_or("")).map_err(|e| StoreError::Db(e.to_string()))?;
                let value =
                    B64.decode(kv["value"].as_str().unwrap_or("")).map_err(|e| StoreError::Db(e.to_string()))?;
                out.push((String::from_utf8_lossy(&key[prefix.len().min(key.len())..]).into_owned(), value));
                last = Some(key);
            }
            match (v["more"].as_bool().unwrap_or(false), last) {
                (true, Some(mut key)) => {
                    key.push(0); // the next key after it
                    from = key;
                }
                _ => return Ok(out),
            }
        }
    }

    fn call(&self, id: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.get_key(&self.call_key(id))
    }

    fn put_archive(&self, digest: &str, archive: &[u8]) -> Result<(), StoreError> {
        let hex = &digest[7..];
        if self.get_key(&self.key("archives", hex))?.is_some() {
            return Ok(());
        }
        let chunks = archive.chunks(CHUNK).count();
        for (i, c) in archive.chunks(CHUNK).enumerate() {
            self.put_raw(&self.key("chunks", &format!("{hex}/{i:05}")), c)?;
        }
        let meta = json!({ "bytes": archive.len(), "chunks": chunks, "uploaded_ms": crate::store::unix_ms() });
        self.put_raw(&self.key("archives", hex), meta.to_string().as_bytes())
    }

    fn archive(&self, digest: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let hex = &digest[7..];
        let Some(meta) = self.get_key(&self.key("archives", hex))? else { return Ok(None) };
        let meta: Value = serde_json::from_slice(&meta).map_err(|e| StoreError::Corrupt(digest.into(), e))?;
        let (Some(n), Some(len)) = (meta["chunks"].as_u64(), meta["bytes"].as_u64()) else {
            return Err(StoreError::SourceCorrupt(digest.into()));
        };
        if len > api::archive::Limits::default().archive_bytes_max || n > len / CHUNK as u64 + 1 {
            return Err(StoreError::SourceCorrupt(digest.into()));
        }
        // One chunk per request: a range over all of them could be a
        // response larger than etcd sends.
        let mut out = Vec::with_capacity(len as usize);
        for i in 0..n {
            match self.get_key(&self.key("chunks", &format!("{hex}/{i:05}")))? {
                Some(c) => out.extend_from_slice(&c),
                None => return Err(StoreError::SourceCorrupt(digest.into())),
            }
        }
        Ok(Some(out))
    }

    fn archives(&self) -> Result<Vec<(String, u64)>, StoreError> {
        Ok(self
            .range(&self.key("archives", ""))?
            .into_iter()
            .map(|(hex, v)| {
                let at = serde_json::from_slice::<Value>(&v).ok().and_then(|m| m["uploaded_ms"].as_u64()).unwrap_or(0);
                (format!("sha256:{hex}"), at)
            })
            .collect())
    }

    fn remove_archive(&self, digest: &str) -> Result<(), StoreError> {
        let hex = &digest[7..];
        let chunks = self.key("chunks", &format!("{hex}/"));
        self.change(vec![
            delete_op(&self.key("archives", hex)),
            json!({ "request_delete_range": { "key": b64(&chunks), "range_end": b64(prefix_end(&chunks)) } }),
        ])
        .map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_urls_are_checked() {
        assert_eq!(
            parse_url("etcd://127.0.0.1:2379").unwrap(),
            (vec!["http://127.0.0.1:2379".to_string()], "/staccato/".to_string())
        );
        assert_eq!(
            parse_url("etcd://a:1,b:2/team/x/").unwrap(),
            (vec!["http://a:1".to_string(), "http://b:2".to_string()], "/team/x/".to_string())
        );
        for bad in
            ["http://a:1", "etcd://", "etcd://a", "etcd://a:x", "etcd://a:1/sp ace", "etcd://a:1,/p", "etcd://a@b:1"]
        {
            assert!(parse_url(bad).is_err(), "{bad}");
        }
        assert_eq!(prefix_end("/staccato/"), b"/staccato0".to_vec());
    }
}
