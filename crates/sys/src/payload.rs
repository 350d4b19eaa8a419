//! Shared-memory payload files (docs/protocol.md "Shared-memory payload
//! files"). The IPC directory is a tmpfs, so these are memory: plain
//! write/read cost one copy each and need no unsafe mapping.

use std::io;
use std::path::{Path, PathBuf};

pub fn path(fn_dir: &Path, name: &str) -> PathBuf {
    fn_dir.join("shm").join(name)
}

/// Writes a whole payload file before the message announcing it is sent.
/// The directory is the function's: whatever it left at that name (a
/// link to a host file, above all) is removed, never written through, and
/// the file is made new (`O_EXCL`, `O_NOFOLLOW`).
pub fn write(fn_dir: &Path, name: &str, data: &[u8]) -> io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let p = path(fn_dir, name);
    let open =
        || std::fs::OpenOptions::new().write(true).create_new(true).mode(0o644).custom_flags(libc::O_NOFOLLOW).open(&p);
    let mut f = match open() {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            std::fs::remove_file(&p)?;
            open()?
        }
        other => other?,
    };
    f.write_all(data)
}

/// Reads a payload file and unlinks it: the receiver owns it. Only a
/// regular file with one link, owned by the directory's owner (the
/// function's user), and of the announced length: a function controls its
/// own directory, and the engine reading as root must not follow a link it
/// left there to another function's or the host's files (nor block on a
/// FIFO, nor read a huge file).
pub fn take(fn_dir: &Path, name: &str, expected_len: usize) -> io::Result<Vec<u8>> {
    use std::io::Read;
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let p = path(fn_dir, name);
    let opened = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK).open(&p);
    let checked = opened.and_then(|f| {
        let m = f.metadata()?;
        let owner = std::fs::symlink_metadata(fn_dir.join("shm"))?.uid();
        let refuse =
            |why: String| Err(io::Error::new(io::ErrorKind::InvalidData, format!("payload file {name} {why}")));
        if !m.file_type().is_file() {
            return refuse("is not a regular file".into());
        }
        if m.nlink() != 1 || m.uid() != owner {
            return refuse("is not the function's own file".into());
        }
        if m.len() != expected_len as u64 {
            return refuse(format!("has {} bytes, message said {expected_len}", m.len()));
        }
        Ok(f)
    });
    let _ = std::fs::remove_file(&p);
    let mut data = Vec::with_capacity(expected_len);
    checked?.take(expected_len as u64 + 1).read_to_end(&mut data)?;
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
    // What the sender left may be a link (to the host's files, or another
    // function's): it goes, and is never followed (lchown, symlink_metadata).
    let m = std::fs::symlink_metadata(&dest)?;
    if !m.file_type().is_file() || m.nlink() != 1 {
        let _ = std::fs::remove_file(&dest);
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("payload file {name} is not a regular file")));
    }
    // The directory changes hands when its function's container is
    // replaced (`give_all` then gives its files to the new user): look
    // again after the chown, so a file that arrived meanwhile is not left
    // to the old one.
    for _ in 0..3 {
        let owner = std::fs::symlink_metadata(to_dir.join("shm"))?;
        if std::fs::symlink_metadata(&dest)?.uid() == owner.uid() {
            return Ok(());
        }
        std::os::unix::fs::lchown(&dest, Some(owner.uid()), Some(owner.gid()))?;
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

    /// A function owns its payload directory and may leave links there:
    /// the engine never reads, writes or chowns through one.
    #[test]
    fn links_a_function_leaves_are_never_followed() {
        use std::os::unix::fs::{symlink, MetadataExt};
        let root = std::env::temp_dir().join(format!("staccato-sys-links-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let (a, b) = (root.join("a"), root.join("b"));
        std::fs::create_dir_all(a.join("shm")).unwrap();
        std::fs::create_dir_all(b.join("shm")).unwrap();
        let secret = root.join("secret");
        std::fs::write(&secret, b"s3cret").unwrap();
        // Read through a link: refused, the target untouched.
        symlink(&secret, path(&a, "1.o")).unwrap();
        let e = take(&a, "1.o", 6).unwrap_err();
        assert!(e.to_string().contains("not a regular file") || e.raw_os_error() == Some(libc::ELOOP), "{e}");
        assert!(std::fs::symlink_metadata(path(&a, "1.o")).is_err(), "the link is gone");
        assert_eq!(std::fs::read(&secret).unwrap(), b"s3cret");
        // A hard link to a file of the same owner is refused too.
        std::fs::hard_link(&secret, path(&a, "2.o")).unwrap();
        assert!(take(&a, "2.o", 6).unwrap_err().to_string().contains("own file"));
        // A FIFO: refused without blocking.
        let fifo = path(&a, "3.o");
        crate::pipe::mkfifo(&fifo).unwrap();
        assert!(take(&a, "3.o", 6).unwrap_err().to_string().contains("regular file"));
        // Written through a link: the link is replaced, the target kept.
        symlink(&secret, path(&a, "4.i")).unwrap();
        write(&a, "4.i", b"attacker").unwrap();
        assert_eq!(std::fs::read(&secret).unwrap(), b"s3cret");
        assert!(std::fs::symlink_metadata(path(&a, "4.i")).unwrap().file_type().is_file());
        // Forwarded: a link is dropped, and its target's owner unchanged.
        let before = std::fs::metadata(&secret).unwrap().uid();
        symlink(&secret, path(&a, "5.i")).unwrap();
        assert!(forward(&a, &b, "5.i").is_err());
        assert!(std::fs::symlink_metadata(path(&b, "5.i")).is_err());
        assert_eq!(std::fs::metadata(&secret).unwrap().uid(), before);
        // A real file still goes through.
        write(&a, "6.i", b"ok").unwrap();
        forward(&a, &b, "6.i").unwrap();
        assert_eq!(take(&b, "6.i", 2).unwrap(), b"ok");
        let _ = std::fs::remove_dir_all(root);
    }
}
