//! `staccato deploy`: each function's source directory is packed here, on
//! the deploying machine, uploaded as an archive, and then registered by
//! its digest. The gateway never reads a path the manifest names.

use crate::Requester;
use anyhow::{anyhow, bail, Context, Result};
use api::manifest::ManifestFunction;
use serde_json::{json, Value};

/// Packs and uploads a function's source; returns its digest.
pub fn upload_source(c: &mut impl Requester, f: &ManifestFunction) -> Result<String> {
    let dir = &f.source_dir;
    let archive = api::archive::pack(dir, &api::archive::Limits::DEFAULT)
        .map_err(|e| anyhow!("function {}: packing {}: {e}", f.spec.name, dir.display()))?;
    let digest = api::archive::digest(&archive);
    // The same source uploaded before (a redeploy) need not travel again.
    let known = c.request("GET", &format!("/system/sources/{digest}"), b"").map_err(unreachable)?;
    if known.status == 200 {
        return Ok(digest);
    }
    if known.status != 404 {
        crate::check(&known)?;
    }
    let r = c
        .request_with_headers("POST", "/system/sources", &archive, &[("Content-Type", "application/gzip")])
        .map_err(unreachable)?;
    let v = crate::check(&r).with_context(|| format!("uploading the source of {}", f.spec.name))?;
    match v["digest"].as_str() {
        Some(d) if d == digest => Ok(digest),
        other => bail!("the gateway stored the source as {other:?}, not {digest}"),
    }
}

/// Uploads the function's source and registers it. Returns the gateway's
/// answer (`notes` says what the dependency install did).
pub fn deploy_function(c: &mut impl Requester, f: &ManifestFunction) -> Result<Value> {
    let mut spec = f.spec.clone();
    spec.source = upload_source(c, f)?;
    let body = serde_json::to_vec(&json!({ "functions": [spec] }))?;
    let r = c
        .request_with_headers("POST", "/system/functions", &body, &[("Content-Type", "application/json")])
        .map_err(unreachable)?;
    crate::check(&r)
}

fn unreachable(e: std::io::Error) -> anyhow::Error {
    anyhow!("cannot reach the gateway: {e} (is `staccato up` running?)")
}
