//! Python: pip resolves the whole requirements file once (`--dry-run
//! --report`), then each resolved distribution is its own entry, installed by
//! `pip install --no-deps --target` from the exact archive pip chose.
//!
//! Entries are keyed by what makes their installed bytes differ: the
//! interpreter's bytecode tag and ABI (pip compiles `.pyc` at install time,
//! and binary wheels are per ABI), the platform, and the archive's hash.

use crate::key::KeyHasher;
use crate::store::{path_safe, unix_now_s, EntryMeta};
use crate::tool::{self, indent, ToolError};
use crate::{Error, Kind, Result, Runner};
use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

/// pip's report of a resolution: a few KiB per distribution.
const REPORT_LEN_MAX: u64 = 32 << 20;

fn read_bounded(path: &Path, max: u64) -> std::io::Result<Vec<u8>> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW).open(path)?;
    let mut out = Vec::new();
    f.take(max + 1).read_to_end(&mut out)?;
    if out.len() as u64 > max {
        return Err(std::io::Error::other(format!("longer than {} MiB", max >> 20)));
    }
    Ok(out)
}

/// The payload directory of a Python entry: what goes on sys.path.
pub(crate) const PAYLOAD: &str = "site";

/// The first pip with `install --report`.
const PIP_REPORT_MIN: (u32, u32) = (22, 2);

/// One run prints what the content address depends on, and whether pip is
/// there at all, so a missing pip fails before any resolving.
const PROBE: &str = r#"
import sys, sysconfig
print(sys.executable)
print(sys.version.split()[0])
print(sys.implementation.cache_tag or "")
print(sysconfig.get_config_var("SOABI") or "")
print(sysconfig.get_platform())
try:
    import pip
    print(pip.__version__)
except ImportError:
    print("")
"#;

pub(crate) struct Interpreter {
    /// The interpreter itself, not a wrapper that found it: pip runs through
    /// a pyenv shim would run `pyenv rehash` afterwards, which fails when
    /// two installs race for the shims' lock.
    pub executable: PathBuf,
    /// Only in resolution memos: environment markers may test the full
    /// version, but bytecode and wheels do not differ between patch releases.
    full_version: String,
    cache_tag: String,
    soabi: String,
    platform: String,
}

/// A distribution pip's resolver chose.
pub(crate) struct Dist {
    pub name: String,
    pub version: String,
    /// What is installed: `name @ url#hash`, pinned to the archive resolved.
    install_spec: String,
    /// The content in the key: the archive hash when pip knows it, else the URL.
    identity: String,
    source: String,
}

impl Dist {
    pub(crate) fn label(&self) -> String {
        format!("{}=={}", self.name, self.version)
    }

    /// `python/<name>-<version>-<hash>`: readable in `ls`, unique by hash.
    pub(crate) fn id(&self, interp: &Interpreter) -> String {
        let mut key = KeyHasher::new("staccato-pkgcache python v1");
        key.field(interp.cache_tag.as_bytes())
            .field(interp.soabi.as_bytes())
            .field(interp.platform.as_bytes())
            .field(normalize(&self.name).as_bytes())
            .field(self.version.as_bytes())
            .field(self.identity.as_bytes());
        let hash = key.hex();
        format!(
            "{}/{}-{}-{}",
            Kind::Python.dir_name(),
            path_safe(&normalize(&self.name)),
            path_safe(&self.version),
            &hash[..24]
        )
    }

    pub(crate) fn meta(&self) -> EntryMeta {
        EntryMeta {
            kind: Kind::Python,
            name: self.name.clone(),
            version: self.version.clone(),
            created_unix_s: unix_now_s(),
            size_bytes: 0,
            source: self.source.clone(),
        }
    }
}

pub(crate) fn probe(python: &Path) -> Result<Interpreter> {
    let out = tool::run(Command::new(python).args(["-c", PROBE])).map_err(|e| match e {
        ToolError::Spawn(e) => Error::Toolchain(format!("cannot run the Python interpreter {}: {e}", python.display())),
        ToolError::Failed(lines) | ToolError::Stopped(lines) => Error::Toolchain(format!(
            "the Python interpreter {} failed to start:\n{}",
            python.display(),
            indent(&lines)
        )),
    })?;
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    let [executable, full_version, cache_tag, soabi, platform, pip_version] = lines[..] else {
        return Err(Error::Toolchain(format!("unexpected answer from {}: {text:?}", python.display())));
    };
    if pip_version.is_empty() {
        return Err(Error::Toolchain(format!(
            "{} has no pip, which installs requirements.txt; add it with `{} -m ensurepip --upgrade`",
            python.display(),
            python.display()
        )));
    }
    if !pip_at_least(pip_version, PIP_REPORT_MIN) {
        return Err(Error::Toolchain(format!(
            "pip {pip_version} of {} is too old: the package cache needs pip >= {}.{} (`pip install --report`); \
             upgrade with `{} -m pip install --upgrade pip`",
            python.display(),
            PIP_REPORT_MIN.0,
            PIP_REPORT_MIN.1,
            python.display()
        )));
    }
    // An interpreter that cannot say where it is (embedded) is run as given.
    let executable = if executable.is_empty() { python.to_path_buf() } else { PathBuf::from(executable) };
    Ok(Interpreter {
        executable,
        full_version: full_version.into(),
        cache_tag: cache_tag.into(),
        soabi: soabi.into(),
        platform: platform.into(),
    })
}

fn pip_at_least(version: &str, min: (u32, u32)) -> bool {
    let mut parts = version.split('.').map(|p| p.chars().take_while(char::is_ascii_digit).collect::<String>());
    let major: u32 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    let minor: u32 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    (major, minor) >= min
}

/// PEP 503 name normalization: `Foo_Bar.baz` and `foo-bar-baz` are one project.
pub(crate) fn normalize(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for c in name.chars() {
        if matches!(c, '-' | '_' | '.') {
            if !out.ends_with('-') {
                out.push('-');
            }
        } else {
            out.push(c.to_ascii_lowercase());
        }
    }
    out
}

// The parts of pip's installation report we read
// (https://pip.pypa.io/en/stable/reference/installation-report/).
#[derive(Deserialize)]
struct Report {
    install: Vec<ReportItem>,
}

#[derive(Deserialize)]
struct ReportItem {
    metadata: ReportMetadata,
    download_info: DownloadInfo,
}

#[derive(Deserialize)]
struct ReportMetadata {
    name: String,
    version: String,
}

#[derive(Deserialize)]
struct DownloadInfo {
    url: String,
    archive_info: Option<ArchiveInfo>,
    vcs_info: Option<VcsInfo>,
    dir_info: Option<serde_json::Value>,
    subdirectory: Option<String>,
}

#[derive(Deserialize)]
struct ArchiveInfo {
    hash: Option<String>,
    hashes: Option<BTreeMap<String, String>>,
}

#[derive(Deserialize)]
struct VcsInfo {
    vcs: String,
    commit_id: String,
}

/// Runs pip's resolver over the requirements file without installing.
/// `report` is a scratch path for pip's JSON report.
pub(crate) fn resolve(runner: &dyn Runner, python: &Path, requirements: &Path, report_dir: &Path) -> Result<Vec<Dist>> {
    let file = requirements.display();
    let report = report_dir.join("report.json");
    let mut cmd = pip(python);
    cmd.args(["install", "--dry-run", "--ignore-installed", "--quiet", "--report"])
        .arg(&report)
        .arg("-r")
        .arg(requirements);
    // Relative paths in a requirements file are relative to where pip runs.
    let reads: Vec<PathBuf> = requirements.parent().map(Path::to_path_buf).into_iter().collect();
    if let Some(dir) = requirements.parent() {
        cmd.current_dir(dir);
    }
    let result = tool::run_in(runner, &mut cmd, &reads, Some(report_dir));
    // Written by pip next to the deployer's build backends: read as hostile.
    let text = read_bounded(&report, REPORT_LEN_MAX);
    match result {
        Ok(_) => {}
        Err(ToolError::Spawn(e)) => return Err(Error::Toolchain(format!("cannot run {}: {e}", python.display()))),
        Err(ToolError::Failed(lines)) => return Err(Error::Tool(resolve_error(&file.to_string(), &lines))),
        Err(ToolError::Stopped(why)) => return Err(Error::Tool(format!("resolving {file}: {why}"))),
    }
    let text = text.map_err(|e| Error::Tool(format!("pip wrote no report for {file}: {e}")))?;
    parse_report(&text).map_err(|e| Error::Tool(format!("cannot read pip's report for {file}: {e}")))
}

fn resolve_error(file: &str, pip_lines: &str) -> String {
    const MARKER: &str = "No matching distribution found for ";
    let missing: Vec<&str> =
        pip_lines.lines().filter_map(|l| l.split_once(MARKER).map(|(_, name)| name.trim())).collect();
    if missing.is_empty() {
        format!("cannot resolve {file}; pip says:\n{}", indent(pip_lines))
    } else {
        format!(
            "cannot resolve {file}: no release of {} matches (misspelt, or not on the package index?); pip says:\n{}",
            missing.join(", "),
            indent(pip_lines)
        )
    }
}

fn parse_report(text: &[u8]) -> Result<Vec<Dist>> {
    let report: Report = serde_json::from_slice(text).map_err(|e| Error::Input(e.to_string()))?;
    report.install.into_iter().map(dist).collect()
}

fn dist(item: ReportItem) -> Result<Dist> {
    let ReportMetadata { name, version } = item.metadata;
    let info = item.download_info;
    let subdirectory = info.subdirectory.map(|s| format!("#subdirectory={s}")).unwrap_or_default();
    let (identity, url) = if let Some(vcs) = &info.vcs_info {
        // A commit id names the content exactly; the branch or tag asked for does not.
        let url = format!("{}+{}@{}{subdirectory}", vcs.vcs, info.url, vcs.commit_id);
        (format!("vcs {url}"), url)
    } else if let Some(archive) = &info.archive_info {
        // The report is written where the deployer's build backends run,
        // so it may lie: whatever URL it names, pip checks the `#sha256=`
        // fragment we put on it, so what is installed is what we keyed.
        let bare = info.url.split('#').next().unwrap_or_default();
        match archive_hash(archive) {
            Some(hash) => (format!("archive {hash}"), format!("{bare}#{hash}")),
            None => (format!("url {}", info.url), info.url.clone()),
        }
    } else if info.dir_info.is_some() {
        return Err(Error::Input(format!(
            "{name} comes from the local directory {}, which the package cache cannot address by content; \
             build a wheel of it (`pip wheel`) and list the .whl file instead",
            info.url
        )));
    } else {
        (format!("url {}", info.url), info.url.clone())
    };
    Ok(Dist { install_spec: format!("{name} @ {url}"), identity, source: info.url, name, version })
}

/// A hash strong enough to name content by: SHA-2, as hex.
fn archive_hash(archive: &ArchiveInfo) -> Option<String> {
    let strong = |algo: &str, h: &str| {
        matches!(algo, "sha256" | "sha384" | "sha512") && !h.is_empty() && h.bytes().all(|b| b.is_ascii_hexdigit())
    };
    if let Some(hashes) = &archive.hashes {
        for algo in ["sha256", "sha384", "sha512"] {
            if let Some(h) = hashes.get(algo).filter(|h| strong(algo, h)) {
                return Some(format!("{algo}={h}"));
            }
        }
    }
    let (algo, h) = archive.hash.as_deref()?.split_once('=')?;
    strong(algo, h).then(|| format!("{algo}={h}"))
}

/// Installs one distribution, without its dependencies (they are entries of
/// their own), into `<staging>/site`.
///
/// `.pyc` files are compiled now (pip's default): entries are mounted
/// read-only, so Python could not cache bytecode later and would recompile
/// every module at every cold start.
pub(crate) fn install(runner: &dyn Runner, python: &Path, reads: &[PathBuf], d: &Dist, staging: &Path) -> Result<()> {
    let mut cmd = pip(python);
    cmd.args(["install", "--no-deps", "--quiet", "--no-warn-script-location", "--target"])
        .arg(staging.join(PAYLOAD))
        .arg(&d.install_spec)
        .current_dir(staging);
    tool::run_in(runner, &mut cmd, reads, Some(staging)).map(drop).map_err(|e| match e {
        ToolError::Spawn(e) => Error::Toolchain(format!("cannot run {}: {e}", python.display())),
        ToolError::Failed(lines) => {
            Error::Tool(format!("installing {} failed; pip says:\n{}", d.label(), indent(&lines)))
        }
        ToolError::Stopped(why) => Error::Tool(format!("installing {}: {why}", d.label())),
    })
}

fn pip(python: &Path) -> Command {
    let mut cmd = Command::new(python);
    cmd.args(["-m", "pip", "--disable-pip-version-check", "--no-input", "--no-color"])
        // Deploys often run as root; pip's warning about it is noise here.
        .env("PIP_ROOT_USER_ACTION", "ignore")
        // Settings that contradict --target would make every install fail.
        .env_remove("PIP_TARGET")
        .env_remove("PIP_PREFIX")
        .env_remove("PIP_USER")
        .env_remove("PIP_REQUIRE_VIRTUALENV");
    cmd
}

// Resolution memos. pip's resolver costs about a second even when every
// package is cached (interpreter start-up, index round trips), which would
// dominate a warm deploy. A requirements file that pins every distribution
// it resolves to (`pip freeze` / `pip-compile` output) resolves the same way
// every time, so its earlier resolution is reused instead.

/// The `(normalized name, version)` pairs of a file made only of
/// `name==version` lines (and comments); `None` for anything else: ranges,
/// extras, markers, URLs, options, includes.
pub(crate) fn pinned_lines(text: &str) -> Option<BTreeSet<(String, String)>> {
    let mut pins = BTreeSet::new();
    for line in text.lines() {
        // pip's comment rule: `#` at the start or after whitespace.
        let line = match line.find(" #").or_else(|| line.find("\t#")) {
            Some(i) => &line[..i],
            None if line.trim_start().starts_with('#') => "",
            None => line,
        }
        .trim();
        if line.is_empty() {
            continue;
        }
        let (name, version) = line.split_once("==")?;
        let (name, version) = (name.trim(), version.trim());
        let name_ok = !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
        // No `*` (a prefix match) and no `=` (`===`): only exact versions pin.
        let version_ok =
            !version.is_empty() && version.chars().all(|c| c.is_ascii_alphanumeric() || "._+!-".contains(c));
        if !name_ok || !version_ok {
            return None;
        }
        pins.insert((normalize(name), version.to_string()));
    }
    (!pins.is_empty()).then_some(pins)
}

/// Whether the resolution is exactly the pinned lines: nothing unlisted was
/// pulled in, so the file alone decides it.
pub(crate) fn resolution_is_pinned(pins: &BTreeSet<(String, String)>, dists: &[Dist]) -> bool {
    let resolved: BTreeSet<(String, String)> = dists.iter().map(|d| (normalize(&d.name), d.version.clone())).collect();
    &resolved == pins
}

/// What a memo depends on besides the file: the interpreter (markers) and
/// pip's settings from the environment (indexes, find-links).
pub(crate) fn memo_key(interp: &Interpreter, requirements_text: &str) -> String {
    let mut key = KeyHasher::new("staccato-pkgcache python resolution v1");
    key.field(interp.full_version.as_bytes())
        .field(interp.cache_tag.as_bytes())
        .field(interp.soabi.as_bytes())
        .field(interp.platform.as_bytes())
        .field(requirements_text.as_bytes());
    let mut pip_env: Vec<(String, String)> = std::env::vars().filter(|(k, _)| k.starts_with("PIP_")).collect();
    pip_env.sort();
    for (k, v) in pip_env {
        key.field(k.as_bytes()).field(v.as_bytes());
    }
    key.hex()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_normalize_per_pep_503() {
        assert_eq!(normalize("Foo_Bar.baz"), "foo-bar-baz");
        assert_eq!(normalize("zope.interface"), "zope-interface");
        assert_eq!(normalize("a--_b"), "a-b");
    }

    #[test]
    fn pip_versions_compare_numerically() {
        assert!(pip_at_least("23.2.1", (22, 2)));
        assert!(pip_at_least("22.2", (22, 2)));
        assert!(pip_at_least("100.0", (22, 2)));
        assert!(!pip_at_least("22.1.2", (22, 2)));
        assert!(!pip_at_least("9.0.3", (22, 2)));
    }

    #[test]
    fn report_items_become_hash_pinned_installs() {
        let report = br#"{"version": "1", "install": [
          {"metadata": {"name": "six", "version": "1.16.0"},
           "download_info": {"url": "https://files.example/six-1.16.0-py2.py3-none-any.whl",
             "archive_info": {"hash": "sha256=8abb", "hashes": {"sha256": "8abb"}}}},
          {"metadata": {"name": "pkg", "version": "0.1"},
           "download_info": {"url": "https://github.com/o/pkg", "vcs_info": {"vcs": "git", "commit_id": "c0ffee"}}}
        ]}"#;
        let dists = parse_report(report).unwrap();
        assert_eq!(dists[0].install_spec, "six @ https://files.example/six-1.16.0-py2.py3-none-any.whl#sha256=8abb");
        assert_eq!(dists[0].identity, "archive sha256=8abb");
        assert_eq!(dists[1].install_spec, "pkg @ git+https://github.com/o/pkg@c0ffee");

        let interp = Interpreter {
            executable: "/usr/bin/python3.11".into(),
            full_version: "3.11.7".into(),
            cache_tag: "cpython-311".into(),
            soabi: "x".into(),
            platform: "linux-x86_64".into(),
        };
        let id = dists[0].id(&interp);
        assert!(id.starts_with("python/six-1.16.0-"), "{id}");
        // The same archive from a mirror is the same entry; another interpreter is not.
        let mirrored =
            parse_report(&String::from_utf8_lossy(report).replace("files.example", "mirror.example").into_bytes())
                .unwrap();
        assert_eq!(mirrored[0].id(&interp), id);
        let other = Interpreter { cache_tag: "cpython-312".into(), ..interp };
        assert_ne!(dists[0].id(&other), id);
    }

    #[test]
    fn a_lying_report_cannot_unpin_or_weaken_the_hash() {
        // A build backend can rewrite pip's report: a URL that carries its
        // own fragment still gets our hash, and a weak or malformed hash
        // names nothing (the entry is keyed by URL instead).
        let report = br#"{"install": [
          {"metadata": {"name": "six", "version": "1.16.0"},
           "download_info": {"url": "https://evil.example/x.whl#sha256=0000",
             "archive_info": {"hashes": {"sha256": "8abb"}}}},
          {"metadata": {"name": "a", "version": "1"},
           "download_info": {"url": "https://evil.example/a.whl", "archive_info": {"hash": "md5=8abb"}}},
          {"metadata": {"name": "b", "version": "1"},
           "download_info": {"url": "https://evil.example/b.whl", "archive_info": {"hashes": {"sha256": "zz#x"}}}}
        ]}"#;
        let dists = parse_report(report).unwrap();
        assert_eq!(dists[0].install_spec, "six @ https://evil.example/x.whl#sha256=8abb");
        assert_eq!(dists[1].identity, "url https://evil.example/a.whl");
        assert_eq!(dists[2].identity, "url https://evil.example/b.whl");
    }

    #[test]
    fn local_directories_are_refused_with_advice() {
        let report = br#"{"install": [{"metadata": {"name": "mylib", "version": "0.1"},
            "download_info": {"url": "file:///src/mylib", "dir_info": {}}}]}"#;
        let err = parse_report(report).err().unwrap();
        assert!(matches!(err, Error::Input(_)), "{err:?}");
        let err = err.to_string();
        assert!(err.contains("mylib") && err.contains("pip wheel"), "{err}");
    }

    #[test]
    fn missing_packages_are_named() {
        let pip = "ERROR: Could not find a version that satisfies the requirement nope-xyz (from versions: none)\n\
                   ERROR: No matching distribution found for nope-xyz";
        let msg = resolve_error("requirements.txt", pip);
        assert!(msg.starts_with("cannot resolve requirements.txt: no release of nope-xyz matches"), "{msg}");
        assert!(msg.contains("No matching distribution found for nope-xyz"));
    }

    #[test]
    fn only_fully_pinned_files_qualify_for_memos() {
        let pins = pinned_lines("# locked\nsix==1.16.0\nAttrs == 23.1.0  # why\n\n").unwrap();
        let want: BTreeSet<(String, String)> =
            [("six".into(), "1.16.0".into()), ("attrs".into(), "23.1.0".into())].into_iter().collect();
        assert_eq!(pins, want);
        for loose in [
            "six",
            "six>=1.16",
            "six==1.*",
            "six===1.16.0",
            "six[extra]==1.0",
            "six==1.16.0; python_version<'3'",
            "-r other.txt",
            "--index-url https://x\nsix==1.16.0",
            "https://x/six.whl",
            "",
        ] {
            assert!(pinned_lines(loose).is_none(), "{loose}");
        }
    }
}
