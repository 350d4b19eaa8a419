//! Node: one entry per dependency set. npm lays out a nested, deduplicated
//! node_modules tree whose shape depends on every package in it, so a
//! package cannot be shared on its own the way a Python distribution can;
//! functions with the same dependencies (and lock) share one tree.
//!
//! The key covers only what decides the tree: the install-relevant fields of
//! package.json, the lock file without the function's own name and
//! development-only packages, the project `.npmrc` (registries), and the
//! Node version, platform and native-module ABI.

use crate::key::KeyHasher;
use crate::store::{unix_now_s, EntryMeta};
use crate::tool::{self, indent, ToolError};
use crate::{Error, Kind, Result};
use serde_json::{Map, Value};
use std::fs;
use std::path::Path;
use std::process::Command;

/// The payload directory of a Node entry, linked as the function's node_modules.
pub(crate) const PAYLOAD: &str = "node_modules";

/// package.json fields that change what `npm install --omit=dev` installs.
/// Scripts are left out on purpose: the function's own lifecycle scripts
/// belong to its code, not to a shared dependency tree.
const INSTALL_FIELDS: [&str; 7] = [
    "dependencies",
    "optionalDependencies",
    "peerDependencies",
    "peerDependenciesMeta",
    "bundleDependencies",
    "bundledDependencies",
    "overrides",
];

/// Fields whose entries npm installs (the rest qualify them).
const DEPENDENCY_FIELDS: [&str; 3] = ["dependencies", "optionalDependencies", "peerDependencies"];

/// npm reads the shrinkwrap in preference to the lock.
const LOCK_FILES: [&str; 2] = ["npm-shrinkwrap.json", "package-lock.json"];

pub(crate) struct NodeDeps {
    /// The package.json written into the entry and installed from.
    manifest: Value,
    lock: Option<(&'static str, Value)>,
    npmrc: Option<Vec<u8>>,
    /// (name, spec) of what the function asked for, for labels.
    direct: Vec<(String, String)>,
}

pub(crate) fn read(package_dir: &Path) -> Result<NodeDeps> {
    let path = package_dir.join("package.json");
    let text = fs::read(&path).map_err(|e| Error::Input(format!("cannot read {}: {e}", path.display())))?;
    let original: Value = serde_json::from_slice(&text)
        .map_err(|e| Error::Input(format!("{} is not valid JSON: {e}", path.display())))?;
    let Some(original) = original.as_object() else {
        return Err(Error::Input(format!("{} is not a JSON object", path.display())));
    };
    let mut manifest = Map::new();
    // A fixed name: the function's own name must not split otherwise equal trees.
    manifest.insert("name".into(), "staccato-deps".into());
    manifest.insert("version".into(), "0.0.0".into());
    manifest.insert("private".into(), true.into());
    for field in INSTALL_FIELDS {
        if let Some(v) = original.get(field) {
            manifest.insert(field.into(), v.clone());
        }
    }
    let direct = direct_dependencies(original);
    for (name, spec) in &direct {
        if is_local_spec(spec) {
            return Err(Error::Input(format!(
                "{}: dependency {name} is a local path ({spec}); the shared package cache installs only registry, \
                 git and URL dependencies (publish it, or copy it into the function's code)",
                path.display()
            )));
        }
    }
    let mut lock = None;
    for name in LOCK_FILES {
        let p = package_dir.join(name);
        if let Ok(text) = fs::read(&p) {
            let v: Value = serde_json::from_slice(&text)
                .map_err(|e| Error::Input(format!("{} is not valid JSON: {e}", p.display())))?;
            lock = Some((name, normalize_lock(v)));
            break;
        }
    }
    let npmrc = fs::read(package_dir.join(".npmrc")).ok();
    Ok(NodeDeps { manifest: Value::Object(manifest), lock, npmrc, direct })
}

fn direct_dependencies(package: &Map<String, Value>) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for field in DEPENDENCY_FIELDS {
        for (name, spec) in package.get(field).and_then(Value::as_object).into_iter().flatten() {
            if !out.iter().any(|(n, _)| n == name) {
                out.push((name.clone(), spec.as_str().unwrap_or("").to_string()));
            }
        }
    }
    out
}

/// Specs that point into the function's own tree, which a shared entry
/// built elsewhere cannot see.
fn is_local_spec(spec: &str) -> bool {
    ["file:", "link:", "workspace:", "./", "../", "/", "~/"].iter().any(|p| spec.starts_with(p))
}

/// Drops what differs between functions without changing the installed
/// tree: the root's name and version, development-only packages (not
/// installed with `--omit=dev`), and the legacy `dependencies` section that
/// npm 7+ ignores when `packages` is present.
fn normalize_lock(mut lock: Value) -> Value {
    let Some(obj) = lock.as_object_mut() else { return lock };
    obj.remove("name");
    obj.remove("version");
    if let Some(packages) = obj.get_mut("packages").and_then(Value::as_object_mut) {
        packages.retain(|path, p| path.is_empty() || p.get("dev") != Some(&Value::Bool(true)));
        if let Some(root) = packages.get_mut("").and_then(Value::as_object_mut) {
            root.retain(|k, _| INSTALL_FIELDS.contains(&k.as_str()));
        }
        obj.remove("dependencies");
    }
    lock
}

/// JSON with object keys sorted at every level, so that key order in a file
/// (or serde_json's `preserve_order` feature) never changes a key.
fn canonical(v: &Value) -> String {
    match v {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            let fields: Vec<String> =
                keys.iter().map(|k| format!("{}:{}", Value::String((*k).clone()), canonical(&map[*k]))).collect();
            format!("{{{}}}", fields.join(","))
        }
        Value::Array(items) => format!("[{}]", items.iter().map(canonical).collect::<Vec<_>>().join(",")),
        other => other.to_string(),
    }
}

impl NodeDeps {
    pub(crate) fn is_empty(&self) -> bool {
        self.direct.is_empty()
    }

    pub(crate) fn label(&self) -> String {
        self.direct.iter().map(|(n, s)| format!("{n}@{s}")).collect::<Vec<_>>().join(" ")
    }

    pub(crate) fn id(&self, node_info: &str) -> String {
        let mut key = KeyHasher::new("staccato-pkgcache node v1");
        key.field(node_info.as_bytes()).field(canonical(&self.manifest).as_bytes());
        match &self.lock {
            Some((_, lock)) => key.field(b"lock").field(canonical(lock).as_bytes()),
            None => key.field(b"no lock"),
        };
        key.field(self.npmrc.as_deref().unwrap_or_default());
        format!("{}/{}", Kind::Node.dir_name(), &key.hex()[..24])
    }

    pub(crate) fn meta(&self, staging: &Path) -> EntryMeta {
        let names: Vec<&str> = self.direct.iter().map(|(n, _)| n.as_str()).collect();
        // The versions npm chose, read back from the tree it built.
        let versions: Vec<String> = names
            .iter()
            .map(|n| {
                fs::read(staging.join(PAYLOAD).join(n).join("package.json"))
                    .ok()
                    .and_then(|t| serde_json::from_slice::<Value>(&t).ok())
                    .and_then(|v| v["version"].as_str().map(String::from))
                    .unwrap_or_else(|| "-".into())
            })
            .collect();
        EntryMeta {
            kind: Kind::Node,
            name: names.join(","),
            version: versions.join(","),
            created_unix_s: unix_now_s(),
            size_bytes: 0,
            source: self.label(),
        }
    }
}

/// What native modules and npm's choices depend on.
pub(crate) fn probe_node() -> Result<String> {
    let script = "[process.version, process.platform, process.arch, process.versions.modules].join(' ')";
    let out = tool::run(Command::new("node").args(["-p", script])).map_err(|e| match e {
        ToolError::Spawn(e) => {
            Error::Toolchain(format!("cannot run node ({e}): install Node.js to deploy functions with a package.json"))
        }
        ToolError::Failed(lines) | ToolError::Stopped(lines) => {
            Error::Toolchain(format!("node failed to start:\n{}", indent(&lines)))
        }
    })?;
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Runs npm in the staging directory, from a copy of the manifest and lock.
pub(crate) fn install(runner: &dyn crate::Runner, deps: &NodeDeps, staging: &Path, package_dir: &Path) -> Result<()> {
    let write = |name: &str, bytes: &[u8]| {
        fs::write(staging.join(name), bytes).map_err(Error::io(format!("writing {name} for npm")))
    };
    let pretty = |v: &Value| serde_json::to_vec_pretty(v).unwrap_or_default();
    write("package.json", &pretty(&deps.manifest))?;
    if let Some((name, lock)) = &deps.lock {
        write(name, &pretty(lock))?;
    }
    if let Some(npmrc) = &deps.npmrc {
        write(".npmrc", npmrc)?;
    }
    let mut cmd = Command::new("npm");
    cmd.args(["install", "--omit=dev", "--no-audit", "--no-fund", "--loglevel=error"])
        .env("npm_config_update_notifier", "false")
        .current_dir(staging);
    let result = tool::run_in(runner, &mut cmd, &[], Some(staging));
    // A project .npmrc may hold registry tokens: never keep it in the cache.
    let _ = fs::remove_file(staging.join(".npmrc"));
    result.map(drop).map_err(|e| match e {
        ToolError::Spawn(e) => Error::Toolchain(format!(
            "cannot run npm ({e}): install npm (it comes with Node.js) to deploy functions with a package.json"
        )),
        ToolError::Failed(lines) => {
            Error::Tool(install_error(&package_dir.join("package.json").display().to_string(), &lines))
        }
        ToolError::Stopped(why) => {
            Error::Tool(format!("installing the dependencies of {}: {why}", package_dir.display()))
        }
    })
}

fn install_error(file: &str, npm_lines: &str) -> String {
    // npm 10+: "The requested resource 'x@1' could not be found"; older: "'x@1' is not in this registry".
    let not_found = npm_lines
        .lines()
        .filter(|l| l.contains("404") && (l.contains("could not be found") || l.contains("not in this registry")))
        .find_map(|l| l.split('\'').nth(1));
    let no_version =
        npm_lines.lines().find_map(|l| l.split_once("No matching version found for ").map(|(_, s)| s.trim()));
    let headline = match (not_found, no_version) {
        (Some(spec), _) => format!("cannot install the dependencies of {file}: {spec} is not in the npm registry"),
        (None, Some(spec)) => format!("cannot install the dependencies of {file}: no version of {spec} exists"),
        (None, None) => format!("cannot install the dependencies of {file}"),
    };
    format!("{headline}; npm says:\n{}", indent(npm_lines))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn deps(package: Value, lock: Option<Value>) -> NodeDeps {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("pkgcache-node-{}-{n}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("package.json"), package.to_string()).unwrap();
        if let Some(lock) = lock {
            fs::write(dir.join("package-lock.json"), lock.to_string()).unwrap();
        }
        let d = read(&dir);
        fs::remove_dir_all(&dir).unwrap();
        d.unwrap()
    }

    #[test]
    fn key_ignores_the_functions_identity_and_key_order() {
        let a = deps(json!({"name": "fn-a", "scripts": {"start": "x"}, "dependencies": {"x": "1", "y": "2"}}), None);
        let b = deps(json!({"name": "fn-b-longer", "dependencies": {"y": "2", "x": "1"}}), None);
        assert_eq!(a.id("v20"), b.id("v20"));
        assert_ne!(a.id("v20"), a.id("v22"));
        let c = deps(json!({"dependencies": {"x": "1", "y": "3"}}), None);
        assert_ne!(a.id("v20"), c.id("v20"));
        assert_eq!(a.label(), "x@1 y@2");
    }

    #[test]
    fn lock_drops_root_identity_and_dev_packages() {
        let lock = |name: &str, dev: bool| {
            let mut packages = json!({
                "": {"name": name, "version": "1.0.0", "dependencies": {"x": "1"}, "devDependencies": {"t": "9"}},
                "node_modules/x": {"version": "1.0.3"},
            });
            if dev {
                packages["node_modules/t"] = json!({"version": "9.0.0", "dev": true});
            }
            json!({"name": name, "version": "1.0.0", "lockfileVersion": 3, "packages": packages})
        };
        let a = deps(json!({"name": "a", "dependencies": {"x": "1"}}), Some(lock("a", true)));
        let b = deps(json!({"name": "bb", "dependencies": {"x": "1"}}), Some(lock("bb", false)));
        assert_eq!(a.id("v20"), b.id("v20"));
        let unlocked = deps(json!({"dependencies": {"x": "1"}}), None);
        assert_ne!(a.id("v20"), unlocked.id("v20"));
    }

    #[test]
    fn local_paths_are_refused() {
        let dir = std::env::temp_dir().join(format!("pkgcache-node-local-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("package.json"), r#"{"dependencies": {"mylib": "file:../mylib"}}"#).unwrap();
        let err = read(&dir).err().unwrap();
        fs::remove_dir_all(&dir).unwrap();
        assert!(matches!(err, Error::Input(_)), "{err:?}");
        let err = err.to_string();
        assert!(err.contains("mylib") && err.contains("local path"), "{err}");
    }

    #[test]
    fn npm_404_names_the_package() {
        let npm = "npm error code E404\n\
                   npm error 404 Not Found - GET https://registry.npmjs.org/nope-xyz - Not found\n\
                   npm error 404  The requested resource 'nope-xyz@1' could not be found or you do not have permission to access it.";
        let msg = install_error("/f/package.json", npm);
        assert!(msg
            .starts_with("cannot install the dependencies of /f/package.json: nope-xyz@1 is not in the npm registry"));
        assert!(msg.contains("E404"));
    }
}
