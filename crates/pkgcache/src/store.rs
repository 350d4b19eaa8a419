//! The cache's directory layout and the file operations that keep it
//! consistent without locks:
//!
//! ```text
//! <root>/python/<id>/entry.json    metadata (EntryMeta), written before publish
//!                    used          marker; its mtime is the entry's last use
//!                    site/         the payload: one directory for sys.path
//! <root>/node/<id>/entry.json, used, package.json, node_modules/ (the payload)
//! <root>/pins/<function>.json      entries a deployed function uses
//! <root>/resolutions/<key>.json    entries a fully pinned requirements file resolved to
//! <root>/tmp/                      entries being built, pin files being written
//! <root>/trash/                    entries being deleted
//! ```
//!
//! An entry is built under tmp/ and published by one `rename` into place, so a
//! reader sees either no entry or a complete one. Removal is the reverse: a
//! `rename` into trash/, then deletion, so a reader never sees half an entry.

use crate::Kind;
use serde::{Deserialize, Serialize};
use std::fs::{self, File};
use std::io::{self, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub(crate) const META_FILE: &str = "entry.json";
pub(crate) const USED_MARKER: &str = "used";

/// Build directories older than this belong to a crashed deploy: no pip or
/// npm run takes a day.
const STALE_TMP: Duration = Duration::from_secs(24 * 3600);

#[derive(Serialize, Deserialize, Debug, Clone)]
pub(crate) struct EntryMeta {
    pub kind: Kind,
    pub name: String,
    pub version: String,
    pub created_unix_s: u64,
    pub size_bytes: u64,
    /// Where the content came from (archive URL, dependency specs), for people.
    pub source: String,
}

/// A fully pinned requirements file's earlier resolution.
#[derive(Serialize, Deserialize)]
pub(crate) struct ResolutionMemo {
    pub entries: Vec<String>,
    pub labels: Vec<String>,
}

#[derive(Serialize, Deserialize)]
pub(crate) struct PinFile {
    pub function: String,
    pub entries: Vec<String>,
}

#[derive(Clone)]
pub(crate) struct Layout {
    pub root: PathBuf,
}

impl Layout {
    /// Creates the directories and returns the layout with an absolute,
    /// symlink-free root: returned paths are bind-mounted at the same place
    /// in containers, so they must not depend on the working directory.
    pub(crate) fn create(root: &Path) -> io::Result<Layout> {
        fs::create_dir_all(root)?;
        let layout = Layout { root: fs::canonicalize(root)? };
        for dir in [Kind::Python.dir_name(), Kind::Node.dir_name(), "pins", "resolutions", "tmp", "trash"] {
            fs::create_dir_all(layout.root.join(dir))?;
        }
        layout.clean_leftovers();
        Ok(layout)
    }

    pub(crate) fn kind_dir(&self, kind: Kind) -> PathBuf {
        self.root.join(kind.dir_name())
    }

    pub(crate) fn entry_dir(&self, id: &str) -> PathBuf {
        self.root.join(id)
    }

    pub(crate) fn pins_dir(&self) -> PathBuf {
        self.root.join("pins")
    }

    pub(crate) fn resolutions_dir(&self) -> PathBuf {
        self.root.join("resolutions")
    }

    /// A fresh, unique path under tmp/ (not created).
    pub(crate) fn tmp_path(&self, label: &str) -> PathBuf {
        self.root.join("tmp").join(unique_name(label))
    }

    pub(crate) fn exists(&self, id: &str) -> bool {
        self.entry_dir(id).join(META_FILE).is_file()
    }

    /// Records a use. Fails with NotFound when the entry is gone (evicted).
    pub(crate) fn touch(&self, id: &str) -> io::Result<()> {
        // `create` only makes the marker again if someone deleted it: a
        // vanished entry directory still fails, since its parent is missing.
        let f = File::options().write(true).create(true).truncate(false).open(self.entry_dir(id).join(USED_MARKER))?;
        f.set_modified(SystemTime::now())
    }

    pub(crate) fn read_meta(&self, id: &str) -> io::Result<EntryMeta> {
        let text = fs::read(self.entry_dir(id).join(META_FILE))?;
        serde_json::from_slice(&text).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{id}: {e}")))
    }

    pub(crate) fn last_used(&self, id: &str) -> io::Result<SystemTime> {
        fs::metadata(self.entry_dir(id).join(USED_MARKER))?.modified()
    }

    /// Takes an entry out of the namespace atomically, then deletes it.
    pub(crate) fn remove_entry(&self, id: &str) -> io::Result<()> {
        let trash = self.root.join("trash").join(unique_name("evicted"));
        fs::rename(self.entry_dir(id), &trash)?;
        remove_tree(&trash)
    }

    /// Deletes what crashed processes left behind. Best effort: another
    /// process may be deleting the same trash right now.
    fn clean_leftovers(&self) {
        let now = SystemTime::now();
        if let Ok(dir) = fs::read_dir(self.root.join("tmp")) {
            for e in dir.flatten() {
                let old = e
                    .metadata()
                    .and_then(|m| m.modified())
                    .map(|t| now.duration_since(t).unwrap_or_default() > STALE_TMP)
                    .unwrap_or(false);
                if old {
                    let _ = remove_tree(&e.path());
                }
            }
        }
        if let Ok(dir) = fs::read_dir(self.root.join("trash")) {
            for e in dir.flatten() {
                let _ = remove_tree(&e.path());
            }
        }
    }
}

/// What `Staging::publish` found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Published {
    /// Ours is now the entry.
    New,
    /// Another deploy published the same entry first; ours was discarded.
    AlreadyThere,
}

/// An entry being built under tmp/. Dropped without publishing (an install
/// failed, or another deploy won the race), it is deleted.
pub(crate) struct Staging {
    dir: PathBuf,
    published: bool,
}

impl Staging {
    pub(crate) fn new(layout: &Layout, label: &str) -> io::Result<Staging> {
        let dir = layout.tmp_path(label);
        fs::create_dir(&dir)?;
        Ok(Staging { dir, published: false })
    }

    pub(crate) fn path(&self) -> &Path {
        &self.dir
    }

    /// Seals the payload (read-only, size measured), writes the metadata and
    /// the use marker, and renames the whole directory to `<root>/<id>`.
    pub(crate) fn publish(
        mut self,
        layout: &Layout,
        id: &str,
        mut meta: EntryMeta,
        payload: &str,
    ) -> io::Result<Published> {
        // The staging directory was written by a build: nothing in it is
        // followed, and our own files replace whatever it put at their names.
        let payload_dir = self.dir.join(payload);
        match fs::symlink_metadata(&payload_dir) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                fs::remove_file(&payload_dir)?;
                fs::create_dir(&payload_dir)?;
            }
            Err(_) => fs::create_dir(&payload_dir)?,
        }
        meta.size_bytes = disk_usage(&self.dir)?;
        set_read_only(&payload_dir)?;
        let json = serde_json::to_vec_pretty(&meta).map_err(io::Error::other)?;
        for name in [META_FILE, USED_MARKER] {
            let p = self.dir.join(name);
            if fs::symlink_metadata(&p).is_ok() {
                remove_tree(&p)?;
            }
        }
        let create = |name: &str| {
            use std::os::unix::fs::OpenOptionsExt;
            fs::OpenOptions::new().write(true).create_new(true).custom_flags(libc::O_NOFOLLOW).open(self.dir.join(name))
        };
        create(META_FILE)?.write_all(&json)?;
        create(USED_MARKER)?;
        match fs::rename(&self.dir, layout.entry_dir(id)) {
            Ok(()) => {
                self.published = true;
                Ok(Published::New)
            }
            // rename(2) onto a non-empty directory: someone else's complete entry.
            Err(e) if matches!(e.kind(), io::ErrorKind::DirectoryNotEmpty | io::ErrorKind::AlreadyExists) => {
                Ok(Published::AlreadyThere)
            }
            Err(e) => Err(e),
        }
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if self.published {
            return;
        }
        let _ = remove_tree(&self.dir);
    }
}

/// Writes a file by rename so readers never see it half-written.
pub(crate) fn write_atomic(layout: &Layout, path: &Path, bytes: &[u8]) -> io::Result<()> {
    let tmp = layout.tmp_path("write");
    fs::write(&tmp, bytes)?;
    fs::rename(&tmp, path).inspect_err(|_| {
        let _ = fs::remove_file(&tmp);
    })
}

/// Space on disk, like `du`: allocated blocks, symlinks not followed.
pub(crate) fn disk_usage(path: &Path) -> io::Result<u64> {
    let meta = fs::symlink_metadata(path)?;
    let mut total = meta.blocks() * 512;
    if meta.is_dir() {
        for e in fs::read_dir(path)? {
            total += disk_usage(&e?.path())?;
        }
    }
    Ok(total)
}

/// Published payloads never change; taking write permission away makes an
/// accidental write (a host-side tool, a process running without the
/// read-only bind mount) fail instead of corrupting every user of the entry.
/// Read (and directory search) permission is given to all, whatever the
/// installer's umask: functions run under other uids than the engine.
fn set_read_only(path: &Path) -> io::Result<()> {
    let meta = fs::symlink_metadata(path)?;
    if meta.file_type().is_symlink() {
        return Ok(());
    }
    if meta.is_dir() {
        for e in fs::read_dir(path)? {
            set_read_only(&e?.path())?;
        }
    }
    let mut perms = meta.permissions();
    let mode = perms.mode();
    let exec = if meta.is_dir() || mode & 0o100 != 0 { 0o111 } else { 0 };
    perms.set_mode((mode & !0o222) | 0o444 | exec);
    fs::set_permissions(path, perms)
}

/// `remove_dir_all` that also works on our read-only payloads when not
/// running as root: unlinking needs write permission on the directory.
pub(crate) fn remove_tree(path: &Path) -> io::Result<()> {
    let meta = match fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    if !meta.is_dir() {
        return fs::remove_file(path);
    }
    make_dirs_writable(path)?;
    fs::remove_dir_all(path)
}

fn make_dirs_writable(dir: &Path) -> io::Result<()> {
    let meta = fs::symlink_metadata(dir)?;
    if !meta.is_dir() {
        return Ok(());
    }
    let mut perms = meta.permissions();
    if perms.mode() & 0o700 != 0o700 {
        perms.set_mode(perms.mode() | 0o700);
        fs::set_permissions(dir, perms)?;
    }
    for e in fs::read_dir(dir)? {
        make_dirs_writable(&e?.path())?;
    }
    Ok(())
}

/// Unique across threads (counter) and processes (pid).
fn unique_name(label: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    format!("{label}-{}-{nanos}-{}", std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed))
}

pub(crate) fn unix_now_s() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Keeps ids and names usable as single path components.
pub(crate) fn path_safe(text: &str) -> String {
    text.chars().map(|c| if c.is_ascii_alphanumeric() || "._+!-".contains(c) { c } else { '_' }).collect()
}

/// An id is `<kind dir>/<name>`: exactly two components, nothing that climbs.
pub(crate) fn valid_id(id: &str) -> bool {
    let Some((kind, name)) = id.split_once('/') else { return false };
    [Kind::Python.dir_name(), Kind::Node.dir_name()].contains(&kind)
        && !name.is_empty()
        && !name.starts_with('.')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || "._+!-".contains(c))
}

/// Function names become file names under pins/.
pub(crate) fn valid_function_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 200
        && !name.starts_with('.')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(label: &str) -> PathBuf {
        let p = std::env::temp_dir().join(unique_name(&format!("pkgcache-store-{label}")));
        fs::create_dir_all(&p).unwrap();
        p
    }

    fn meta() -> EntryMeta {
        EntryMeta {
            kind: Kind::Python,
            name: "demo".into(),
            version: "1.0".into(),
            created_unix_s: 0,
            size_bytes: 0,
            source: "test".into(),
        }
    }

    #[test]
    fn publish_is_first_writer_wins_and_loser_is_discarded() {
        let root = scratch("publish");
        let layout = Layout::create(&root).unwrap();
        let id = "python/demo-1.0-abc";
        let first = Staging::new(&layout, "a").unwrap();
        fs::create_dir(first.path().join("site")).unwrap();
        fs::write(first.path().join("site/demo.py"), "X = 1\n").unwrap();
        let second = Staging::new(&layout, "b").unwrap();
        fs::create_dir(second.path().join("site")).unwrap();
        fs::write(second.path().join("site/demo.py"), "X = 2\n").unwrap();

        assert_eq!(first.publish(&layout, id, meta(), "site").unwrap(), Published::New);
        assert_eq!(second.publish(&layout, id, meta(), "site").unwrap(), Published::AlreadyThere);
        let published = layout.entry_dir(id);
        assert_eq!(fs::read_to_string(published.join("site/demo.py")).unwrap(), "X = 1\n");
        assert!(layout.read_meta(id).unwrap().size_bytes > 0);
        assert_eq!(fs::read_dir(root.join("tmp")).unwrap().count(), 0, "the loser's build dir is deleted");
        let mode = fs::metadata(published.join("site/demo.py")).unwrap().permissions().mode();
        assert_eq!(mode & 0o666, 0o444, "{mode:o}");

        layout.touch(id).unwrap();
        layout.remove_entry(id).unwrap();
        assert!(!layout.exists(id));
        assert_eq!(layout.touch(id).unwrap_err().kind(), io::ErrorKind::NotFound);
        remove_tree(&root).unwrap();
    }

    #[test]
    fn ids_and_function_names_cannot_escape_the_root() {
        assert!(valid_id("python/six-1.16.0-0123abcd"));
        assert!(valid_id("node/0123abcd"));
        for bad in ["python", "python/", "python/..", "python/../x", "pins/f", "/etc/passwd", "node/a/b"] {
            assert!(!valid_id(bad), "{bad}");
        }
        assert!(valid_function_name("hello-world_2.v1"));
        for bad in ["", ".", "..", "a/b", ".hidden", "a b"] {
            assert!(!valid_function_name(bad), "{bad}");
        }
        assert_eq!(path_safe("1.0+local/x"), "1.0+local_x");
    }
}
