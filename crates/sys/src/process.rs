//! Processes: signals, dying with a parent, the effective user, the
//! open-file limit.

use std::io;

/// Sends SIGKILL to `pid`. Used to recycle a worker whose call timed out.
pub fn kill(pid: u32) -> io::Result<()> {
    if pid == 0 || pid > i32::MAX as u32 {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    }
    // SAFETY: kill has no memory effects; pid > 0 so it targets one process,
    // never a process group or every process.
    let rc = unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Makes a child started from `cmd` receive SIGKILL when the thread that
/// spawned it exits, so launchers never outlive the engine.
pub fn kill_child_with_parent(cmd: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs in the forked child before exec and calls
    // only prctl, which is async-signal-safe and allocates nothing.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Sends `sig` to `pid` (which must be a single process, pid > 0).
pub fn signal(pid: u32, sig: i32) -> io::Result<()> {
    if pid == 0 || pid > i32::MAX as u32 {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    }
    // SAFETY: kill has no memory effects; pid > 0 targets one process.
    let rc = unsafe { libc::kill(pid as i32, sig) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The effective user id (containers need root to be made).
pub fn euid() -> u32 {
    // SAFETY: geteuid cannot fail and touches no memory.
    unsafe { libc::geteuid() }
}

/// Blocks SIGTERM and SIGINT in the calling thread and every thread it
/// starts afterwards, so that [`wait_termination`] can take them
/// synchronously. Call first thing in `main`. (Children started with
/// `std::process::Command` get a cleared mask.)
pub fn block_termination_signals() {
    // SAFETY: the sigset is initialised by sigemptyset before use, and
    // pthread_sigmask only reads it.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
}

/// Waits for SIGTERM or SIGINT (blocked by [`block_termination_signals`]).
pub fn wait_termination() -> i32 {
    // SAFETY: as above; sigwait writes the signal number into `sig`.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        let mut sig = 0;
        while libc::sigwait(&set, &mut sig) != 0 {}
        sig
    }
}

/// Raises this process's open-file limit to its hard limit (a gateway with
/// thousands of connections needs more than the usual soft 1024) and
/// returns the limit now in force.
pub fn raise_nofile_limit() -> io::Result<u64> {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes only into `lim`, a valid rlimit.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(io::Error::last_os_error());
    }
    if lim.rlim_cur < lim.rlim_max {
        let want = libc::rlimit { rlim_cur: lim.rlim_max, rlim_max: lim.rlim_max };
        // SAFETY: setrlimit only reads `want`, a valid rlimit.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &want) } == 0 {
            lim.rlim_cur = lim.rlim_max;
        }
    }
    Ok(lim.rlim_cur)
}
