//! A function's secrets on the engine: one file per secret, on the IPC
//! tmpfs (never on disk), in `<ipc>/.secrets/<name>.<generation>/`: beside
//! the function's IPC directory, never inside it, so only a container given
//! that directory (mounted read-only at `/var/secrets`) sees them. Written
//! when a registration brings them, given to the container's user when a
//! container starts, removed with the function.

use api::secrets::SecretValues;
use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{lchown, DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Where the engine keeps the secrets of the function whose IPC directory
/// is `fn_dir`.
pub(crate) fn dir_of(fn_dir: &Path) -> PathBuf {
    let root = fn_dir.parent().unwrap_or(Path::new("/")).join(ROOT);
    root.join(fn_dir.file_name().unwrap_or_default())
}

/// The directory under the IPC directory that holds every function's.
pub(crate) const ROOT: &str = ".secrets";

/// Writes `secrets` for the function at `fn_dir` (nothing if there are
/// none): the directory and files the engine's only until [`give`].
pub(crate) fn write(fn_dir: &Path, secrets: &SecretValues) -> io::Result<()> {
    if secrets.is_empty() {
        return Ok(());
    }
    let dir = dir_of(fn_dir);
    let root = dir.parent().expect("dir_of has a parent");
    // Made with their modes (not the umask's, then changed).
    match fs::DirBuilder::new().mode(0o700).create(root) {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        other => other?,
    }
    fs::set_permissions(root, fs::Permissions::from_mode(0o700))?;
    let _ = fs::remove_dir_all(&dir);
    fs::DirBuilder::new().mode(0o700).create(&dir)?;
    for (name, value) in &secrets.0 {
        // Names are checked file names (api::secrets::valid_name); the
        // engine checked them on arrival (SecretValues::check).
        debug_assert!(api::secrets::valid_name(name));
        let mut f = OpenOptions::new().write(true).create_new(true).mode(0o400).open(dir.join(name))?;
        f.write_all(&value.0)?;
    }
    Ok(())
}

/// Gives the secrets of the function at `fn_dir` to user `uid` (a
/// container's): the directory becomes theirs, readable only by them.
/// Returns the directory, to mount.
pub(crate) fn give(fn_dir: &Path, uid: u32) -> io::Result<PathBuf> {
    let dir = dir_of(fn_dir);
    // lchown: nothing but the engine writes here, and nothing is followed.
    for e in fs::read_dir(&dir)? {
        lchown(e?.path(), Some(uid), Some(uid))?;
    }
    lchown(&dir, Some(uid), Some(uid))?;
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o500))?;
    Ok(dir)
}

/// Removes the secrets of the function at `fn_dir`, if it had any.
pub(crate) fn remove(fn_dir: &Path) {
    let _ = fs::remove_dir_all(dir_of(fn_dir));
}

#[cfg(test)]
mod tests {
    use super::*;
    use api::secrets::Value;

    #[test]
    fn secrets_sit_beside_the_ipc_directory_readable_by_their_owner_only() {
        let base = std::env::temp_dir().join(format!("staccato-secrets-{}", std::process::id()));
        let _ = fs::remove_dir_all(&base);
        let fn_dir = base.join("f.123");
        fs::create_dir_all(&fn_dir).unwrap();
        let s = SecretValues([("pw".to_string(), Value(b"hunter2".to_vec())), ("k".into(), Value(vec![]))].into());
        write(&fn_dir, &s).unwrap();
        let dir = dir_of(&fn_dir);
        assert_eq!(dir, base.join(".secrets").join("f.123"));
        assert!(!dir.starts_with(&fn_dir), "never inside the function's IPC directory");
        assert_eq!(fs::read(dir.join("pw")).unwrap(), b"hunter2");
        assert_eq!(fs::metadata(dir.join("pw")).unwrap().permissions().mode() & 0o777, 0o400);
        assert_eq!(fs::metadata(base.join(".secrets")).unwrap().permissions().mode() & 0o777, 0o700);
        // Written again (a redeploy of the same generation cannot happen,
        // but a leftover must not make it fail).
        write(&fn_dir, &s).unwrap();
        let me = own_uid();
        assert_eq!(give(&fn_dir, me).unwrap(), dir);
        assert_eq!(fs::metadata(&dir).unwrap().permissions().mode() & 0o777, 0o500);
        remove(&fn_dir);
        assert!(!dir.exists());
        // No secrets: nothing written.
        write(&fn_dir, &SecretValues::default()).unwrap();
        assert!(!dir.exists());
        let _ = fs::remove_dir_all(&base);
    }

    /// The test's own uid (giving to ourselves works without privileges).
    fn own_uid() -> u32 {
        use std::os::unix::fs::MetadataExt;
        fs::metadata("/proc/self").unwrap().uid()
    }
}
