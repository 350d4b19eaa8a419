//! Pipes and FIFOs: making them, their buffer size, blocking mode, and
//! waiting for one to be readable.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Creates a FIFO at `path` (mode 0600). An existing file there is replaced.
pub fn mkfifo(path: &Path) -> io::Result<()> {
    let _ = std::fs::remove_file(path);
    let c = CString::new(path.as_os_str().as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: `c` is a valid NUL-terminated string that outlives the call;
    // mkfifo only reads it.
    let rc = unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Asks for a pipe (or FIFO) buffer of `bytes`. Failure is harmless (the
/// pipe keeps its size), so it is not reported.
pub fn set_pipe_bytes(f: &File, bytes: i32) {
    // SAFETY: F_SETPIPE_SZ takes an int argument and touches no memory of
    // ours; the fd is open for the duration of the call.
    unsafe {
        libc::fcntl(f.as_raw_fd(), libc::F_SETPIPE_SZ, bytes);
    }
}

/// An anonymous pipe, both ends close-on-exec.
pub fn pipe() -> io::Result<(File, File)> {
    let mut fds: [RawFd; 2] = [-1; 2];
    // SAFETY: `fds` is a writable array of two ints, as pipe2 requires.
    let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pipe2 succeeded, so both fds are open and owned by nobody else.
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    Ok((File::from(r), File::from(w)))
}

/// Sets or clears O_NONBLOCK on `f`.
pub fn set_nonblocking(f: &File, on: bool) -> io::Result<()> {
    // SAFETY: F_GETFL/F_SETFL take and return ints; the fd is open.
    unsafe {
        let flags = libc::fcntl(f.as_raw_fd(), libc::F_GETFL);
        if flags < 0 {
            return Err(io::Error::last_os_error());
        }
        let flags = if on { flags | libc::O_NONBLOCK } else { flags & !libc::O_NONBLOCK };
        if libc::fcntl(f.as_raw_fd(), libc::F_SETFL, flags) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Waits until `fd` is readable (or at its end, or in error) for at most
/// `timeout`; returns whether it is. Interrupted waits start over with what
/// is left of the timeout.
pub fn wait_readable(fd: RawFd, timeout: std::time::Duration) -> io::Result<bool> {
    let deadline = std::time::Instant::now() + timeout;
    let mut pfd = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        // Rounded up: a wait of 0.4 ms must not become a busy poll.
        let ms = left.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32;
        // SAFETY: `pfd` is one valid pollfd we own, and we pass count 1.
        let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
        if rc >= 0 {
            return Ok(rc > 0);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

pub(crate) fn poll_readable(fd: RawFd) -> io::Result<()> {
    let mut pfd = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    loop {
        // SAFETY: `pfd` is one valid pollfd we own, and we pass count 1.
        let rc = unsafe { libc::poll(&mut pfd, 1, -1) };
        if rc >= 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}
