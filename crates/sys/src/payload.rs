//! Shared-memory payload files (docs/protocol.md "Shared-memory payload
//! files"). The IPC directory is a tmpfs, so these are memory: plain
//! write/read cost one copy each and need no unsafe mapping.

use std::io;
use std::path::{Path, PathBuf};

pub fn path(fn_dir: &Path, name: &str) -> PathBuf {
    fn_dir.join("shm").join(name)
}

/// Writes a whole payload file before the message announcing it is sent.
pub fn write(fn_dir: &Path, name: &str, data: &[u8]) -> io::Result<()> {
    std::fs::write(path(fn_dir, name), data)
}

/// Reads a payload file and unlinks it: the receiver owns it.
pub fn take(fn_dir: &Path, name: &str, expected_len: usize) -> io::Result<Vec<u8>> {
    let p = path(fn_dir, name);
    let data = std::fs::read(&p);
    let _ = std::fs::remove_file(&p);
    let data = data?;
    if data.len() != expected_len {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("payload file {name} has {} bytes, message said {expected_len}", data.len()),
        ));
    }
    Ok(data)
}

/// Moves a payload file from one function's directory to another's
/// (internal calls forward payloads without copying them). The file
/// then belongs to the receiving directory's owner: with containers,
/// each function runs as its own user and may read only its own files.
pub fn forward(from_dir: &Path, to_dir: &Path, name: &str) -> io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    if from_dir == to_dir {
        return Ok(());
    }
    let dest = path(to_dir, name);
    std::fs::rename(path(from_dir, name), &dest)?;
    // The directory changes hands when its function's container is
    // replaced (`give_all` then gives its files to the new user): look
    // again after the chown, so a file that arrived meanwhile is not left
    // to the old one.
    for _ in 0..3 {
        let owner = std::fs::metadata(to_dir.join("shm"))?;
        if std::fs::metadata(&dest)?.uid() == owner.uid() {
            return Ok(());
        }
        std::os::unix::fs::chown(&dest, Some(owner.uid()), Some(owner.gid()))?;
    }
    Ok(())
}

/// Gives the payload files in a function's directory to `uid`: those of
/// calls that waited while its container was replaced belong to the old
/// container's user, whom the new one is not.
pub fn give_all(fn_dir: &Path, uid: u32) -> io::Result<()> {
    for e in std::fs::read_dir(fn_dir.join("shm"))?.flatten() {
        // lchown: a link a function left is not followed.
        match std::os::unix::fs::lchown(e.path(), Some(uid), Some(uid)) {
            // Taken meanwhile (dispatched, or its call ended).
            Err(err) if err.kind() == io::ErrorKind::NotFound => {}
            other => other?,
        }
    }
    Ok(())
}

pub fn remove(fn_dir: &Path, name: &str) {
    let _ = std::fs::remove_file(path(fn_dir, name));
}

/// Removes payload files whose names start with `prefix` (those of calls
/// a dead worker made, whose call ids begin with its worker id).
pub fn remove_prefixed(fn_dir: &Path, prefix: &str) {
    if let Ok(dir) = std::fs::read_dir(fn_dir.join("shm")) {
        for e in dir.flatten() {
            if e.file_name().to_string_lossy().starts_with(prefix) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shm_take_checks_length_and_unlinks() {
        let d = std::env::temp_dir().join(format!("staccato-sys-payload-{}", std::process::id()));
        std::fs::create_dir_all(d.join("shm")).expect("tmpdir");
        write(&d, "a.i", b"hello").expect("write");
        assert!(take(&d, "a.i", 4).is_err());
        assert!(!path(&d, "a.i").exists());
        write(&d, "b.i", b"hello").expect("write");
        assert_eq!(take(&d, "b.i", 5).expect("take"), b"hello");
        let _ = std::fs::remove_dir_all(d);
    }
}
