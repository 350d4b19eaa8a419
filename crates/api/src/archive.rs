//! A function's source as it travels: a gzip-compressed tar made by the CLI
//! from the user's directory, named by its SHA-256 digest, kept by the
//! gateway and unpacked by the engine.
//!
//! The server side never reads a path a request names: it only ever sees
//! these bytes. [`unpack`] treats them as hostile: regular files and
//! directories only (no links, devices or FIFOs), relative paths that stay
//! below the destination, bounded sizes and counts checked before anything
//! is written, files created fresh (never through an existing path), and
//! modes reduced to 0644 or 0755.
//!
//! [`pack`] is deterministic (sorted entries, zero times and owners), so the
//! same source gives the same digest on every deploy.

use sha2::{Digest, Sha256};
use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

/// Bounds on one function's source.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// The compressed archive.
    pub archive_bytes_max: u64,
    /// All files together, unpacked.
    pub unpacked_bytes_max: u64,
    /// Files and directories.
    pub entries_max: usize,
    /// Directory nesting.
    pub depth_max: usize,
}

impl Limits {
    pub const DEFAULT: Limits =
        Limits { archive_bytes_max: 64 << 20, unpacked_bytes_max: 256 << 20, entries_max: 20_000, depth_max: 32 };
}

impl Default for Limits {
    fn default() -> Limits {
        Limits::DEFAULT
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    #[error("the source is larger than {limit} bytes {what}")]
    TooLarge { what: &'static str, limit: u64 },
    #[error("the source has more than {0} files and directories")]
    TooManyEntries(usize),
    #[error("the source nests directories deeper than {0}")]
    TooDeep(usize),
    #[error("source entry {path:?}: {why}")]
    BadEntry { path: String, why: &'static str },
    #[error("the source archive is not a gzip-compressed tar: {0}")]
    Corrupt(String),
    #[error("{path}: {err}")]
    Io { path: String, err: io::Error },
}

fn io_err(path: &Path, err: io::Error) -> ArchiveError {
    ArchiveError::Io { path: path.display().to_string(), err }
}

/// `sha256:<64 hex digits>` of an archive.
pub fn digest(archive: &[u8]) -> String {
    let h = Sha256::digest(archive);
    let hex: String = h.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// Whether `s` is a digest as [`digest`] writes it (and so safe as a file name).
pub fn valid_digest(s: &str) -> bool {
    s.strip_prefix("sha256:")
        .is_some_and(|h| h.len() == 64 && h.bytes().all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c)))
}

/// Directories the CLI leaves out: made again by the engine's build, or not
/// the function's code at all.
const SKIPPED_DIRS: [&str; 4] = ["__pycache__", "node_modules", ".git", ".deps"];

/// Packs `dir` (run by the CLI, as the user deploying). Symbolic links are
/// followed: they are the user's own files. Stops as soon as a limit is
/// passed, so a manifest naming `/` fails fast.
pub fn pack(dir: &Path, limits: &Limits) -> Result<Vec<u8>, ArchiveError> {
    let mut files = Vec::new();
    let mut unpacked = 0u64;
    let root = fs::metadata(dir).map_err(|e| io_err(dir, e))?;
    let mut ancestors = vec![(root.dev(), root.ino())];
    walk(dir, Path::new(""), limits, &mut ancestors, &mut files, &mut unpacked)?;
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let mut tar = tar::Builder::new(gz);
    tar.mode(tar::HeaderMode::Deterministic);
    for (rel, abs, is_dir) in &files {
        let mut h = tar::Header::new_gnu();
        h.set_mtime(0);
        h.set_uid(0);
        h.set_gid(0);
        if *is_dir {
            h.set_entry_type(tar::EntryType::Directory);
            h.set_mode(0o755);
            h.set_size(0);
            tar.append_data(&mut h, rel, io::empty()).map_err(|e| io_err(abs, e))?;
        } else {
            let meta = fs::metadata(abs).map_err(|e| io_err(abs, e))?;
            let exec = std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o111 != 0;
            h.set_entry_type(tar::EntryType::Regular);
            h.set_mode(if exec { 0o755 } else { 0o644 });
            h.set_size(meta.len());
            let f = fs::File::open(abs).map_err(|e| io_err(abs, e))?;
            tar.append_data(&mut h, rel, f.take(meta.len())).map_err(|e| io_err(abs, e))?;
        }
    }
    let gz = tar.into_inner().map_err(|e| io_err(dir, e))?;
    let bytes = gz.finish().map_err(|e| io_err(dir, e))?;
    if bytes.len() as u64 > limits.archive_bytes_max {
        return Err(ArchiveError::TooLarge { what: "compressed", limit: limits.archive_bytes_max });
    }
    Ok(bytes)
}

/// `ancestors`: (device, inode) of every directory on the way down, so a
/// link back up (a loop) is seen rather than followed until ELOOP.
fn walk(
    root: &Path,
    rel: &Path,
    limits: &Limits,
    ancestors: &mut Vec<(u64, u64)>,
    out: &mut Vec<(PathBuf, PathBuf, bool)>,
    unpacked: &mut u64,
) -> Result<(), ArchiveError> {
    if ancestors.len() > limits.depth_max + 1 {
        return Err(ArchiveError::TooDeep(limits.depth_max));
    }
    let dir = root.join(rel);
    let mut names: Vec<_> = fs::read_dir(&dir)
        .map_err(|e| io_err(&dir, e))?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<Result<_, _>>()
        .map_err(|e| io_err(&dir, e))?;
    names.sort();
    for name in names {
        let abs = dir.join(&name);
        // Follows links: a dangling one is skipped, like an editor's lock file.
        let Ok(meta) = fs::metadata(&abs) else { continue };
        let r = rel.join(&name);
        if meta.is_dir() {
            let id = (meta.dev(), meta.ino());
            // A link to a directory above: a loop, and nothing new below it.
            if SKIPPED_DIRS.iter().any(|s| name == *s) || ancestors.contains(&id) {
                continue;
            }
            out.push((r.clone(), abs, true));
            if out.len() > limits.entries_max {
                return Err(ArchiveError::TooManyEntries(limits.entries_max));
            }
            ancestors.push(id);
            walk(root, &r, limits, ancestors, out, unpacked)?;
            ancestors.pop();
        } else if meta.is_file() {
            *unpacked += meta.len();
            if *unpacked > limits.unpacked_bytes_max {
                return Err(ArchiveError::TooLarge { what: "unpacked", limit: limits.unpacked_bytes_max });
            }
            out.push((r, abs, false));
            if out.len() > limits.entries_max {
                return Err(ArchiveError::TooManyEntries(limits.entries_max));
            }
        }
        // Sockets, FIFOs, devices: not source code.
    }
    Ok(())
}

/// What [`unpack`] found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    pub files: usize,
    pub dirs: usize,
    pub bytes: u64,
}

/// Counts what a reader yields and fails once it passes a limit: the gzip
/// stream's own size says nothing about what it expands to.
struct Bounded<R> {
    inner: R,
    left: u64,
}

impl<R: Read> Read for Bounded<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        if n as u64 > self.left {
            return Err(io::Error::other("expands beyond the unpacked-size limit"));
        }
        self.left -= n as u64;
        Ok(n)
    }
}

/// Checks an archive without writing anything (the gateway, before it
/// stores one).
pub fn check(archive: &[u8], limits: &Limits) -> Result<Summary, ArchiveError> {
    each_entry(archive, limits, |_, _, _| Ok(()))
}

/// Unpacks into `dest`, which must not exist yet (it is created, with its
/// parents): nothing already there can redirect a write.
pub fn unpack(archive: &[u8], dest: &Path, limits: &Limits) -> Result<Summary, ArchiveError> {
    fs::create_dir_all(dest.parent().unwrap_or(Path::new("/"))).map_err(|e| io_err(dest, e))?;
    fs::create_dir(dest).map_err(|e| io_err(dest, e))?;
    each_entry(archive, limits, |rel, entry, exec| {
        let path = dest.join(rel);
        match entry {
            // Parents first: an archive may list `a/b/` without `a/`.
            None => fs::create_dir_all(&path),
            Some(data) => {
                use std::os::unix::fs::OpenOptionsExt;
                if let Some(parent) = path.parent() {
                    // Parents are created by name below `dest`, which holds
                    // only what this function made: no links to follow.
                    fs::create_dir_all(parent).map_err(|e| io_err(parent, e))?;
                }
                let mut f = fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(if exec { 0o755 } else { 0o644 })
                    .open(&path)
                    .map_err(|e| io_err(&path, e))?;
                f.write_all(data)
            }
        }
        .map_err(|e| io_err(&path, e))
    })
}

type Visit<'a> = dyn FnMut(&Path, Option<&[u8]>, bool) -> Result<(), ArchiveError> + 'a;

fn each_entry<F>(archive: &[u8], limits: &Limits, mut visit: F) -> Result<Summary, ArchiveError>
where
    F: FnMut(&Path, Option<&[u8]>, bool) -> Result<(), ArchiveError>,
{
    let visit: &mut Visit = &mut visit;
    if archive.len() as u64 > limits.archive_bytes_max {
        return Err(ArchiveError::TooLarge { what: "compressed", limit: limits.archive_bytes_max });
    }
    // Headers and padding count too, so allow a little beyond the content.
    let stream_max = limits.unpacked_bytes_max + (limits.entries_max as u64 + 2) * 2048;
    let gz = Bounded { inner: flate2::read::GzDecoder::new(archive), left: stream_max };
    let mut tar = tar::Archive::new(gz);
    let mut sum = Summary::default();
    let mut seen = std::collections::HashSet::new();
    // Files so far: nothing may be made below one (unpack could not); and
    // directories so far, listed or implied: no file may take one's place.
    let mut files = std::collections::HashSet::new();
    let mut dirs = std::collections::HashSet::new();
    let entries = tar.entries().map_err(|e| ArchiveError::Corrupt(e.to_string()))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| ArchiveError::Corrupt(e.to_string()))?;
        let raw_path = entry.path_bytes().into_owned();
        let shown = String::from_utf8_lossy(&raw_path).into_owned();
        let rel = safe_path(&raw_path, limits).map_err(|why| ArchiveError::BadEntry { path: shown.clone(), why })?;
        if !seen.insert(rel.clone()) {
            return Err(ArchiveError::BadEntry { path: shown, why: "appears twice" });
        }
        if rel.ancestors().skip(1).any(|a| files.contains(a)) {
            return Err(ArchiveError::BadEntry { path: shown, why: "a file of the archive is used as its directory" });
        }
        dirs.extend(rel.ancestors().skip(1).filter(|a| !a.as_os_str().is_empty()).map(Path::to_path_buf));
        if sum.files + sum.dirs >= limits.entries_max {
            return Err(ArchiveError::TooManyEntries(limits.entries_max));
        }
        match entry.header().entry_type() {
            tar::EntryType::Directory => {
                dirs.insert(rel.clone());
                sum.dirs += 1;
                visit(&rel, None, true)?;
            }
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                if dirs.contains(&rel) {
                    return Err(ArchiveError::BadEntry {
                        path: shown,
                        why: "a directory of the archive is also a file",
                    });
                }
                let size = entry.header().size().map_err(|e| ArchiveError::Corrupt(e.to_string()))?;
                if sum.bytes.saturating_add(size) > limits.unpacked_bytes_max {
                    return Err(ArchiveError::TooLarge { what: "unpacked", limit: limits.unpacked_bytes_max });
                }
                let exec = entry.header().mode().unwrap_or(0o644) & 0o111 != 0;
                let mut data = Vec::with_capacity(size as usize);
                entry.read_to_end(&mut data).map_err(|e| ArchiveError::Corrupt(e.to_string()))?;
                if data.len() as u64 != size {
                    return Err(ArchiveError::Corrupt(format!("{shown}: truncated")));
                }
                sum.bytes += size;
                sum.files += 1;
                files.insert(rel.clone());
                visit(&rel, Some(&data), exec)?;
            }
            tar::EntryType::Symlink | tar::EntryType::Link => {
                return Err(ArchiveError::BadEntry { path: shown, why: "links are not allowed" })
            }
            _ => return Err(ArchiveError::BadEntry { path: shown, why: "only files and directories are allowed" }),
        }
    }
    Ok(sum)
}

/// The longest path inside an archive, in bytes.
const PATH_LEN_MAX: usize = 3072;

/// A relative path of plain names, bounded in depth and length.
fn safe_path(raw: &[u8], limits: &Limits) -> Result<PathBuf, &'static str> {
    let s = std::str::from_utf8(raw).map_err(|_| "names must be UTF-8")?;
    // PATH_MAX is 4096 with the destination's path in front: leave it room.
    if s.is_empty() || s.len() > PATH_LEN_MAX {
        return Err("empty, or longer than 3072 bytes");
    }
    if s.bytes().any(|b| b == 0 || b == b'\\') {
        return Err("NUL or backslash in the path");
    }
    let p = Path::new(s);
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            // NAME_MAX of every Linux file system: unpack could not make it.
            Component::Normal(n) if n.len() > 255 => return Err("a name is longer than 255 bytes"),
            Component::Normal(n) => out.push(n),
            Component::CurDir => {}
            Component::ParentDir => return Err("'..' leaves the source directory"),
            Component::RootDir | Component::Prefix(_) => return Err("absolute paths are not allowed"),
        }
    }
    let depth = out.components().count();
    if depth == 0 {
        return Err("empty path");
    }
    if depth > limits.depth_max + 1 {
        return Err("nested too deeply");
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("staccato-archive-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        d
    }

    /// A tar built by hand, to say things `pack` never would.
    fn raw_tar(entries: &[(&str, tar::EntryType, &[u8])]) -> Vec<u8> {
        let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        let mut t = tar::Builder::new(gz);
        for (path, ty, data) in entries {
            if path.len() > 100 {
                // Too long for the old header: a GNU long-name entry.
                let mut h = tar::Header::new_gnu();
                h.set_entry_type(*ty);
                h.set_size(data.len() as u64);
                h.set_mode(0o644);
                t.append_data(&mut h, path, *data).unwrap();
                continue;
            }
            let mut h = tar::Header::new_old();
            // set_path refuses '..'; write the name field directly.
            h.as_old_mut().name[..path.len()].copy_from_slice(path.as_bytes());
            h.set_entry_type(*ty);
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            if *ty == tar::EntryType::Symlink {
                h.set_link_name("/etc/shadow").unwrap();
            }
            h.set_cksum();
            t.append(&h, *data).unwrap();
        }
        t.into_inner().unwrap().finish().unwrap()
    }

    #[test]
    fn pack_unpack_round_trip_is_deterministic() {
        let src = tmp("src");
        fs::create_dir_all(src.join("pkg/sub")).unwrap();
        fs::create_dir_all(src.join("__pycache__")).unwrap();
        fs::write(src.join("handler.py"), b"def handle(c, d): return d\n").unwrap();
        fs::write(src.join("pkg/sub/x.txt"), b"x").unwrap();
        fs::write(src.join("__pycache__/h.pyc"), b"junk").unwrap();
        fs::write(src.join("run.sh"), b"#!/bin/sh\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(src.join("run.sh"), fs::Permissions::from_mode(0o700)).unwrap();
        let a = pack(&src, &Limits::DEFAULT).unwrap();
        let b = pack(&src, &Limits::DEFAULT).unwrap();
        assert_eq!(digest(&a), digest(&b));
        assert!(valid_digest(&digest(&a)));
        let dest = tmp("dest");
        let s = unpack(&a, &dest, &Limits::DEFAULT).unwrap();
        assert_eq!((s.files, s.dirs), (3, 2), "{s:?}");
        assert_eq!(fs::read(dest.join("pkg/sub/x.txt")).unwrap(), b"x");
        assert!(!dest.join("__pycache__").exists());
        assert_eq!(fs::metadata(dest.join("run.sh")).unwrap().permissions().mode() & 0o777, 0o755);
        assert_eq!(fs::metadata(dest.join("handler.py")).unwrap().permissions().mode() & 0o777, 0o644);
        // Unpacking never reuses an existing directory.
        assert!(unpack(&a, &dest, &Limits::DEFAULT).is_err());
        let _ = fs::remove_dir_all(src);
        let _ = fs::remove_dir_all(dest);
    }

    #[test]
    fn hostile_entries_are_refused_before_any_write() {
        let cases: [(&str, tar::EntryType, &str); 5] = [
            ("../../etc/cron.d/x", tar::EntryType::Regular, "'..'"),
            ("/etc/passwd", tar::EntryType::Regular, "absolute"),
            ("link", tar::EntryType::Symlink, "links"),
            ("fifo", tar::EntryType::Fifo, "only files"),
            ("dev", tar::EntryType::Char, "only files"),
        ];
        for (path, ty, want) in cases {
            let t = raw_tar(&[(path, ty, b"")]);
            let e = check(&t, &Limits::DEFAULT).unwrap_err().to_string();
            assert!(e.contains(want), "{path}: {e}");
            let dest = tmp("hostile");
            assert!(unpack(&t, &dest, &Limits::DEFAULT).is_err());
            assert_eq!(fs::read_dir(&dest).unwrap().count(), 0, "{path} wrote something");
            let _ = fs::remove_dir_all(dest);
        }
        let dup = raw_tar(&[("a", tar::EntryType::Regular, b"1"), ("./a", tar::EntryType::Regular, b"2")]);
        assert!(check(&dup, &Limits::DEFAULT).unwrap_err().to_string().contains("twice"));
    }

    /// `check` (the gateway, before it stores an upload) and `unpack` (the
    /// engine) agree: what one refuses the other refuses, so a stored
    /// source never fails only when an engine unpacks it.
    #[test]
    fn check_refuses_exactly_what_unpack_cannot_do() {
        use tar::EntryType::{Directory as D, Regular as F};
        let long = "n".repeat(256);
        // 16 names of 250 bytes: each fine, the path too long for PATH_MAX.
        let deep_long = vec!["d".repeat(250); 16].join("/");
        type Entries<'a> = Vec<(&'a str, tar::EntryType, &'a [u8])>;
        let cases: Vec<(Entries, Option<&str>)> = vec![
            (vec![("a", F, b"1"), ("a/b", F, b"2")], Some("used as its directory")),
            (vec![("a", F, b"1"), ("a/b/", D, b"")], Some("used as its directory")),
            (vec![(long.as_str(), F, b"")], Some("255 bytes")),
            (vec![("a/b", F, b"1"), ("a", F, b"2")], Some("also a file")),
            (vec![("a/", D, b""), ("a", F, b"2")], Some("twice")),
            (vec![(deep_long.as_str(), F, b"")], Some("3072 bytes")),
            (vec![("a/b/", D, b""), ("a/b/c", F, b"x")], None),
            (vec![("a/b/c", F, b"x"), ("a/", D, b""), ("a/b/", D, b"")], None),
        ];
        for (entries, want) in cases {
            let t = raw_tar(&entries);
            let checked = check(&t, &Limits::DEFAULT);
            let dest = tmp("agree");
            let unpacked = unpack(&t, &dest, &Limits::DEFAULT);
            let _ = fs::remove_dir_all(&dest);
            let names: Vec<&str> = entries.iter().map(|e| e.0).collect();
            assert_eq!(checked.is_ok(), unpacked.is_ok(), "{names:?}: {checked:?} vs {unpacked:?}");
            match want {
                Some(w) => assert!(checked.unwrap_err().to_string().contains(w), "{names:?}"),
                None => assert!(checked.is_ok(), "{names:?}"),
            }
        }
    }

    #[test]
    fn limits_hold_against_bombs_and_floods() {
        let big = vec![0u8; 4 << 20]; // compresses to almost nothing
        let bomb = raw_tar(&[("zeros", tar::EntryType::Regular, &big)]);
        assert!(bomb.len() < 64 << 10);
        let small = Limits { unpacked_bytes_max: 1 << 20, ..Limits::DEFAULT };
        assert!(matches!(check(&bomb, &small), Err(ArchiveError::TooLarge { .. })));
        let many: Vec<(String, tar::EntryType, &[u8])> =
            (0..50).map(|i| (format!("f{i}"), tar::EntryType::Regular, &b""[..])).collect();
        let refs: Vec<(&str, tar::EntryType, &[u8])> = many.iter().map(|(p, t, d)| (p.as_str(), *t, *d)).collect();
        let few = Limits { entries_max: 10, ..Limits::DEFAULT };
        assert!(matches!(check(&raw_tar(&refs), &few), Err(ArchiveError::TooManyEntries(10))));
        assert!(matches!(check(b"not gzip at all", &Limits::DEFAULT), Err(ArchiveError::Corrupt(_))));
        let deep = format!("{}f", "d/".repeat(40));
        assert!(check(&raw_tar(&[(&deep, tar::EntryType::Regular, b"")]), &Limits::DEFAULT).is_err());
    }

    #[test]
    fn pack_stops_at_the_limits() {
        let src = tmp("flood");
        fs::create_dir_all(&src).unwrap();
        for i in 0..20 {
            fs::write(src.join(format!("f{i}")), b"x").unwrap();
        }
        let few = Limits { entries_max: 10, ..Limits::DEFAULT };
        assert!(matches!(pack(&src, &few), Err(ArchiveError::TooManyEntries(10))));
        // A link back up is a loop: skipped, not followed.
        std::os::unix::fs::symlink(".", src.join("self")).unwrap();
        let wide = Limits { entries_max: 100, ..Limits::DEFAULT };
        assert!(pack(&src, &wide).is_ok());
        let tiny = Limits { unpacked_bytes_max: 5, ..Limits::DEFAULT };
        assert!(matches!(pack(&src, &tiny), Err(ArchiveError::TooLarge { .. })));
        let _ = fs::remove_dir_all(src);
    }
}
