//! Against the real PyPI and npm registries with the real pip and npm: the
//! cache's whole point is to stand in for them, so fakes would test nothing.
//! Packages are tiny and pure-Python/JS to keep the run short.

use staccato_pkgcache::{Cache, Error, Resolved, DEFAULT_BUDGET_BYTES};
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

fn python() -> PathBuf {
    std::env::var_os("PYTHON").map_or_else(|| PathBuf::from("python3"), PathBuf::from)
}

/// A fresh directory for one test; removed by `Scratch::drop`.
struct Scratch(PathBuf);

impl Scratch {
    fn new(label: &str) -> Scratch {
        let p = std::env::temp_dir().join(format!("pkgcache-it-{label}-{}", std::process::id()));
        remove_tree(&p);
        fs::create_dir_all(&p).unwrap();
        Scratch(p)
    }

    fn file(&self, name: &str, text: &str) -> PathBuf {
        let p = self.0.join(name);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(&p, text).unwrap();
        p
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        remove_tree(&self.0);
    }
}

/// Entries are read-only; as a non-root user their directories must be made
/// writable again before they can be emptied.
fn remove_tree(p: &Path) {
    fn writable(p: &Path) {
        let Ok(meta) = fs::symlink_metadata(p) else { return };
        if meta.is_dir() {
            let _ = fs::set_permissions(p, fs::Permissions::from_mode(0o755));
            for e in fs::read_dir(p).into_iter().flatten().flatten() {
                writable(&e.path());
            }
        }
    }
    writable(p);
    let _ = fs::remove_dir_all(p);
}

fn python_with_log(cache: &Cache, req: &Path) -> (Result<Resolved, Error>, Vec<String>, Duration) {
    let mut lines = Vec::new();
    let t = Instant::now();
    let r = cache.python(&python(), req, &mut |l| lines.push(l.to_string()));
    (r, lines, t.elapsed())
}

fn tmp_is_empty(cache: &Cache) -> bool {
    fs::read_dir(cache.root().join("tmp")).unwrap().count() == 0
}

#[test]
fn python_packages_are_installed_once_and_shared() {
    let dir = Scratch::new("share");
    let cache = Cache::open(&dir.0.join("cache"), DEFAULT_BUDGET_BYTES).unwrap();
    let both = dir.file("a/requirements.txt", "six==1.16.0\nattrs==23.1.0\n");

    let (cold, lines, cold_took) = python_with_log(&cache, &both);
    let cold = cold.unwrap();
    assert_eq!((cold.installed, cold.cached), (2, 0), "{lines:?}");
    assert_eq!(lines[0], "resolving requirements.txt");
    assert!(lines.iter().any(|l| l.starts_with("installing six==1.16.0 (")), "{lines:?}");
    assert!(lines.last().unwrap().starts_with("installed 2, cached 0 in "), "{lines:?}");

    let (warm, lines, warm_took) = python_with_log(&cache, &both);
    let warm = warm.unwrap();
    assert_eq!((warm.installed, warm.cached), (0, 2), "{lines:?}");
    // Every line pinned and resolved before: the earlier resolution is reused.
    assert!(lines.iter().any(|l| l.contains("pip not needed")), "{lines:?}");
    assert_eq!(warm.dirs, cold.dirs);
    eprintln!("2-package requirements.txt: cold {cold_took:.2?}, warm {warm_took:.2?}");

    // Another function sharing six: only idna is installed.
    let other = dir.file("b/requirements.txt", "six==1.16.0\nidna==3.4\n");
    let (r, lines, _) = python_with_log(&cache, &other);
    let r = r.unwrap();
    assert_eq!((r.installed, r.cached), (1, 1), "{lines:?}");
    assert!(!lines.iter().any(|l| l.contains("pip not needed")), "{lines:?}");
    assert!(lines.contains(&"cached six==1.16.0".to_string()), "{lines:?}");
    assert!(!lines.iter().any(|l| l.starts_with("installing six")), "{lines:?}");
    assert!(lines.iter().any(|l| l.starts_with("installing idna==3.4 (2/2)")), "{lines:?}");
    assert!(r.dirs.contains(&cold.dirs[0]) || r.dirs.contains(&cold.dirs[1]));
    assert_eq!(cache.list().unwrap().len(), 3);

    // The directories really import, with nothing from site-packages (-S -I).
    let mut dirs: Vec<String> = cold.dirs.iter().chain(&r.dirs).map(|d| d.display().to_string()).collect();
    dirs.dedup();
    let out = Command::new(python())
        .args(["-S", "-I", "-c"])
        .arg("import sys; sys.path[:0] = sys.argv[1:]; import six, attr, idna; print(six.__version__, attr.__version__, idna.__version__, six.__file__)")
        .args(&dirs)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.starts_with("1.16.0 23.1.0 3.4 "), "{stdout}");
    assert!(stdout.trim_end().ends_with(".py") && stdout.contains(&*cache.root().to_string_lossy()), "{stdout}");
    // Bytecode was compiled at install time: read-only entries cannot cache it later.
    let pyc =
        fs::read_dir(cold.dirs.iter().find(|d| d.to_string_lossy().contains("/six-")).unwrap().join("__pycache__"));
    assert!(pyc.is_ok_and(|mut d| d.next().is_some()));
    assert!(tmp_is_empty(&cache));
}

#[test]
fn a_nonexistent_python_package_is_named_in_the_error() {
    let dir = Scratch::new("missing");
    let cache = Cache::open(&dir.0.join("cache"), DEFAULT_BUDGET_BYTES).unwrap();
    let req = dir.file("requirements.txt", "six\nnonexistent-package-xyz-staccato==1.0\n");
    let err = python_with_log(&cache, &req).0.unwrap_err();
    assert!(matches!(err, Error::Tool(_)), "{err:?}");
    let err = err.to_string();
    assert!(err.contains("no release of nonexistent-package-xyz-staccato"), "{err}");
    assert!(err.contains("No matching distribution found for nonexistent-package-xyz-staccato"), "{err}");
    assert!(cache.list().unwrap().is_empty());
    assert!(tmp_is_empty(&cache));

    let err = cache.python(Path::new("/nonexistent/python3"), &req, &mut |_| {}).unwrap_err();
    assert!(matches!(err, Error::Toolchain(_)), "{err:?}");
    let err = err.to_string();
    assert!(err.contains("cannot run the Python interpreter /nonexistent/python3"), "{err}");
}

#[test]
fn node_dependency_sets_are_installed_once_and_linked() {
    let dir = Scratch::new("node");
    let cache = Cache::open(&dir.0.join("cache"), DEFAULT_BUDGET_BYTES).unwrap();
    dir.file("f1/package.json", r#"{"name": "f1", "dependencies": {"is-number": "7.0.0"}}"#);
    dir.file("f2/package.json", r#"{"name": "f2", "version": "2.0.0", "dependencies": {"is-number": "7.0.0"}}"#);

    let mut lines = Vec::new();
    let first = cache.node(&dir.0.join("f1"), &mut |l| lines.push(l.to_string())).unwrap();
    assert_eq!((first.installed, first.cached), (1, 0), "{lines:?}");
    assert!(first.dirs[0].ends_with("node_modules") && first.dirs[0].join("is-number/package.json").is_file());
    let mut lines = Vec::new();
    let second = cache.node(&dir.0.join("f2"), &mut |l| lines.push(l.to_string())).unwrap();
    assert_eq!((second.installed, second.cached), (0, 1), "{lines:?}");
    assert!(lines.contains(&"cached is-number@7.0.0".to_string()), "{lines:?}");
    assert_eq!(second.dirs, first.dirs);
    let entries = cache.list().unwrap();
    assert_eq!((entries.len(), entries[0].name.as_str(), entries[0].version.as_str()), (1, "is-number", "7.0.0"));

    // A function links node_modules to the entry; CommonJS and ESM both resolve it.
    std::os::unix::fs::symlink(&first.dirs[0], dir.0.join("f1/node_modules")).unwrap();
    for (flags, script) in [
        (&[][..], "console.log(require('is-number')(5))"),
        (&["--input-type=module"][..], "import isNumber from 'is-number'; console.log(isNumber(5))"),
    ] {
        let out = Command::new("node").args(flags).args(["-e", script]).current_dir(dir.0.join("f1")).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "true");
    }

    dir.file("f3/package.json", r#"{"dependencies": {"nonexistent-pkg-xyz-staccato": "1.0.0"}}"#);
    let err = cache.node(&dir.0.join("f3"), &mut |_| {}).unwrap_err();
    assert!(matches!(err, Error::Tool(_)), "{err:?}");
    let err = err.to_string();
    assert!(err.contains("nonexistent-pkg-xyz-staccato@1.0.0 is not in the npm registry"), "{err}");
    assert!(err.contains("E404"), "{err}");
    assert!(tmp_is_empty(&cache));
}

#[test]
fn eviction_removes_least_recently_used_unpinned_entries() {
    let dir = Scratch::new("evict");
    let root = dir.0.join("cache");
    let cache = Cache::open(&root, DEFAULT_BUDGET_BYTES).unwrap().with_grace(Duration::ZERO);
    let entry = |req: &str| {
        let r = cache.python(&python(), &dir.file(&format!("{req}/requirements.txt"), req), &mut |_| {}).unwrap();
        r.entries[0].clone()
    };
    let (oldest, middle, newest) = (entry("six==1.16.0"), entry("idna==3.4"), entry("attrs==23.1.0"));
    cache.pin("fn-a", std::slice::from_ref(&oldest)).unwrap();
    let size = |id: &str| cache.list().unwrap().into_iter().find(|e| e.id == id).unwrap().size_bytes;
    assert_eq!(cache.list().unwrap().iter().find(|e| e.id == oldest).unwrap().users, vec!["fn-a"]);

    // Room for all but one: the LRU unpinned entry goes, not the pinned older one.
    let budget = size(&oldest) + size(&newest);
    let cache = Cache::open(&root, budget).unwrap().with_grace(Duration::ZERO);
    let removed: Vec<String> = cache.evict_to_budget().unwrap().into_iter().map(|e| e.id).collect();
    assert_eq!(removed, vec![middle]);

    // A tiny budget cannot touch the pinned entry.
    let cache = Cache::open(&root, 1).unwrap().with_grace(Duration::ZERO);
    let removed: Vec<String> = cache.evict_to_budget().unwrap().into_iter().map(|e| e.id).collect();
    assert_eq!(removed, vec![newest]);
    let left: Vec<String> = cache.list().unwrap().into_iter().map(|e| e.id).collect();
    assert_eq!(left, vec![oldest.clone()]);
    assert!(cache.root().join(&oldest).join("site/six.py").is_file());

    // Recently used entries are safe within the grace period, pinned or not.
    cache.unpin("fn-a").unwrap();
    let careful = Cache::open(&root, 1).unwrap();
    assert!(careful.prune(None).unwrap().is_empty());
    assert_eq!(cache.prune(None).unwrap().len(), 1);
    assert!(cache.list().unwrap().is_empty());
}

#[test]
fn concurrent_deploys_of_the_same_requirements_publish_one_entry() {
    let dir = Scratch::new("race");
    let cache = Cache::open(&dir.0.join("cache"), DEFAULT_BUDGET_BYTES).unwrap();
    let req = dir.file("requirements.txt", "idna==3.4\n");
    let results: Vec<Resolved> = std::thread::scope(|s| {
        let threads: Vec<_> = (0..2).map(|_| s.spawn(|| cache.python(&python(), &req, &mut |_| {}))).collect();
        threads.into_iter().map(|t| t.join().unwrap().unwrap()).collect()
    });
    assert_eq!(results[0].dirs, results[1].dirs);
    assert_eq!(results.iter().map(|r| r.installed).sum::<usize>(), 1);
    assert_eq!(cache.list().unwrap().len(), 1);
    assert!(results[0].dirs[0].join("idna/__init__.py").is_file());
    assert!(tmp_is_empty(&cache));
}
