//! Network namespaces: moving the calling thread into one.

use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;

/// Moves the calling thread (only it) into the network namespace bound at
/// `path` (e.g. `/run/netns/NAME`). Sockets it opens afterwards belong to
/// that namespace; other threads, and sockets opened before, keep theirs.
/// Test hosts and benchmarks use it to be a client inside a namespace
/// without a child process.
pub fn enter_net(path: &Path) -> io::Result<()> {
    let file = std::fs::File::open(path)?;
    // SAFETY: setns reads no memory of ours; the descriptor is open and
    // owned by `file` for the whole call, and CLONE_NEWNET makes the kernel
    // refuse any descriptor that is not a network namespace.
    let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_that_is_no_namespace_is_refused() {
        let e = std::thread::spawn(|| enter_net(Path::new("/proc/self/status"))).join().unwrap().unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "{e}");
        let e = std::thread::spawn(|| enter_net(Path::new("/nonexistent/netns"))).join().unwrap().unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}");
    }

    #[test]
    fn entering_our_own_namespace_works() {
        // Root is needed for setns; the suite runs as root on this project's
        // machines.
        if crate::process::euid() != 0 {
            return;
        }
        std::thread::spawn(|| enter_net(Path::new("/proc/self/ns/net"))).join().unwrap().unwrap();
    }
}
