//! Mounts into a running container's mount namespace (Nuka §III.A: a
//! pooled container gets a function's code and channels without any
//! runc command). Uses the new mount API so a read-only bind is made
//! read-only while still detached and never appears writable.

use crate::pipe::pipe;
use std::ffi::CString;
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use libc::{
    mount_attr, SYS_fsconfig, SYS_fsmount, SYS_fsopen, SYS_mount_setattr, SYS_move_mount, SYS_open_tree, AT_RECURSIVE,
    MOUNT_ATTR_NODEV, MOUNT_ATTR_NOEXEC, MOUNT_ATTR_NOSUID, MOUNT_ATTR_RDONLY, MOVE_MOUNT_F_EMPTY_PATH,
    OPEN_TREE_CLOEXEC, OPEN_TREE_CLONE,
};

fn cstr(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

fn check(rc: libc::c_long, what: &str) -> io::Result<libc::c_long> {
    if rc < 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("{what}: {e}")));
    }
    Ok(rc)
}

/// A detached mount, ready to be attached in another namespace.
pub struct Detached {
    fd: OwnedFd,
    dst: CString,
}

impl Detached {
    /// The mount's root as a path this process can reach while the
    /// mount stays detached: `/proc/self/fd/<fd>`. Lets the engine fill
    /// a scratch tmpfs and read it back without ever attaching it on
    /// the host (nothing is left behind if the engine dies).
    pub fn path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}", self.fd.as_raw_fd()))
    }
}

/// A detached recursive bind of `src` to be attached at `dst`, already
/// nosuid+nodev, and read-only or (unless `exec`) noexec.
pub fn bind(src: &Path, dst: &Path, read_only: bool, exec: bool) -> io::Result<Detached> {
    let c = cstr(src)?;
    // SAFETY: open_tree reads the NUL-terminated path and returns a new fd
    // (or -1); no memory is written.
    let fd = unsafe {
        libc::syscall(
            SYS_open_tree,
            libc::AT_FDCWD,
            c.as_ptr(),
            OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE as libc::c_uint,
        )
    };
    let fd = check(fd, &format!("open_tree {}", src.display()))?;
    // SAFETY: open_tree succeeded; the fd is ours alone.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
    let attr = mount_attr {
        attr_set: MOUNT_ATTR_NOSUID
            | MOUNT_ATTR_NODEV
            | if read_only {
                MOUNT_ATTR_RDONLY
            } else if exec {
                0
            } else {
                MOUNT_ATTR_NOEXEC
            },
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    let empty = c"";
    // SAFETY: mount_setattr reads `attr` (a live, correctly sized
    // struct) and the empty path; it writes no memory of ours.
    let rc = unsafe {
        libc::syscall(
            SYS_mount_setattr,
            fd.as_raw_fd(),
            empty.as_ptr(),
            (libc::AT_EMPTY_PATH | AT_RECURSIVE) as libc::c_uint,
            &attr as *const mount_attr,
            std::mem::size_of::<mount_attr>(),
        )
    };
    check(rc, "mount_setattr")?;
    Ok(Detached { fd, dst: cstr(dst)? })
}

/// A new tmpfs (nosuid, nodev, mode 1777) to be attached at `dst`.
pub fn tmpfs(dst: &Path, size_bytes: u64) -> io::Result<Detached> {
    // SAFETY: fsopen reads a NUL-terminated name, returns a new fd.
    let fs = check(unsafe { libc::syscall(SYS_fsopen, c"tmpfs".as_ptr(), libc::FSOPEN_CLOEXEC) }, "fsopen tmpfs")?;
    // SAFETY: fsopen succeeded; the fd is ours alone.
    let fs = unsafe { OwnedFd::from_raw_fd(fs as RawFd) };
    let size = CString::new(size_bytes.to_string()).expect("digits have no NUL");
    for (k, v) in [(c"size", size.as_c_str()), (c"mode", c"1777")] {
        // SAFETY: fsconfig reads the two NUL-terminated strings.
        let rc = unsafe {
            libc::syscall(SYS_fsconfig, fs.as_raw_fd(), libc::FSCONFIG_SET_STRING, k.as_ptr(), v.as_ptr(), 0)
        };
        check(rc, "fsconfig")?;
    }
    // SAFETY: no pointers are passed.
    let rc = unsafe {
        libc::syscall(
            SYS_fsconfig,
            fs.as_raw_fd(),
            libc::FSCONFIG_CMD_CREATE,
            std::ptr::null::<u8>(),
            std::ptr::null::<u8>(),
            0,
        )
    };
    check(rc, "fsconfig create")?;
    let attrs = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
    // SAFETY: no pointers are passed; returns a new fd.
    let m = check(unsafe { libc::syscall(SYS_fsmount, fs.as_raw_fd(), libc::FSMOUNT_CLOEXEC, attrs) }, "fsmount")?;
    // SAFETY: fsmount succeeded; the fd is ours alone.
    let fd = unsafe { OwnedFd::from_raw_fd(m as RawFd) };
    Ok(Detached { fd, dst: cstr(dst)? })
}

/// In the mount namespace of `pid`: lazily unmounts every path of
/// `unmount` (missing ones are ignored), then attaches `attach` in
/// order. Runs in a forked child, because setns(CLONE_NEWNS) refuses a
/// multi-threaded caller and must not change the engine's namespace.
pub fn apply(pid: u32, unmount: &[PathBuf], attach: &[Detached]) -> io::Result<()> {
    let ns = File::open(format!("/proc/{pid}/ns/mnt"))?;
    let unmount: Vec<CString> = unmount.iter().map(|p| cstr(p)).collect::<io::Result<_>>()?;
    let (mut r, w) = pipe()?;
    // SAFETY: between fork and _exit the child only makes raw syscalls
    // (setns, umount2, move_mount, write, _exit) on memory allocated
    // before the fork; it never allocates, locks or unwinds, so the
    // other threads' state it inherits is never touched.
    let child = unsafe { libc::fork() };
    if child < 0 {
        return Err(io::Error::last_os_error());
    }
    if child == 0 {
        // SAFETY: see above; every pointer refers to live pre-fork data.
        unsafe {
            let fail = |step: u8| -> ! {
                let err = *libc::__errno_location();
                let msg = [step, err as u8];
                libc::write(w.as_raw_fd(), msg.as_ptr().cast(), 2);
                libc::_exit(1)
            };
            if libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNS) != 0 {
                fail(0);
            }
            for p in &unmount {
                if libc::umount2(p.as_ptr(), libc::MNT_DETACH) != 0 {
                    let err = *libc::__errno_location();
                    if err != libc::EINVAL && err != libc::ENOENT {
                        fail(1);
                    }
                }
            }
            for (i, d) in attach.iter().enumerate() {
                let rc = libc::syscall(
                    SYS_move_mount,
                    d.fd.as_raw_fd(),
                    c"".as_ptr(),
                    libc::AT_FDCWD,
                    d.dst.as_ptr(),
                    MOVE_MOUNT_F_EMPTY_PATH,
                );
                if rc != 0 {
                    fail(2 + i.min(250) as u8);
                }
            }
            libc::_exit(0)
        }
    }
    drop(w);
    let mut status = 0;
    // SAFETY: waits for our own child; `status` is a valid int.
    let rc = unsafe { libc::waitpid(child, &mut status, 0) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut msg = [0u8; 2];
    if r.read_exact(&mut msg).is_ok() {
        let err = io::Error::from_raw_os_error(msg[1] as i32);
        let what = match msg[0] {
            0 => "setns into the container".to_string(),
            1 => "unmounting".to_string(),
            i => format!("attaching {}", attach[(i - 2) as usize].dst.to_string_lossy()),
        };
        return Err(io::Error::new(err.kind(), format!("{what}: {err}")));
    }
    if !(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0) {
        return Err(io::Error::other(format!("mount helper ended with status {status}")));
    }
    Ok(())
}
