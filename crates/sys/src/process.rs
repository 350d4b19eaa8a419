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

/// CPU and scheduling figures of a set of processes, summed over all
/// their threads (`/proc/PID/task/*`), as the kernel counts them. (As
/// `api::control::ProcessUsage`, a function's status carries it.)
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Usage {
    /// Time on a CPU (`schedstat`'s first field: nanoseconds).
    pub cpu_ns: u64,
    /// Time runnable but waiting for a CPU (`schedstat`'s second field).
    pub run_delay_ns: u64,
    pub voluntary_switches: u64,
    pub involuntary_switches: u64,
    /// Processes and threads found (those gone meanwhile are not counted).
    pub processes: u32,
    pub threads: u32,
}

/// The [`Usage`] of `pids`. A process that exited is skipped: its CPU time
/// is no longer anyone's to read.
pub fn usage(pids: &[u32]) -> Usage {
    let mut u = Usage::default();
    for &pid in pids {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { continue };
        u.processes += 1;
        for t in tasks.flatten() {
            let dir = t.path();
            let Ok(sched) = std::fs::read_to_string(dir.join("schedstat")) else { continue };
            let mut f = sched.split_ascii_whitespace().map(|x| x.parse::<u64>().unwrap_or(0));
            u.cpu_ns += f.next().unwrap_or(0);
            u.run_delay_ns += f.next().unwrap_or(0);
            u.threads += 1;
            if let Ok(status) = std::fs::read_to_string(dir.join("status")) {
                let (v, n) = context_switches(&status);
                u.voluntary_switches += v;
                u.involuntary_switches += n;
            }
        }
    }
    u
}

/// (voluntary, involuntary) context switches from a `status` file's text.
fn context_switches(status: &str) -> (u64, u64) {
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim_start_matches(':').trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    (field("voluntary_ctxt_switches"), field("nonvoluntary_ctxt_switches"))
}

#[cfg(test)]
mod usage_tests {
    use super::*;

    #[test]
    fn this_process_has_used_the_cpu() {
        // Burn a little CPU on a second thread so both are counted.
        let t = std::thread::spawn(|| (0..2_000_000u64).fold(0u64, |a, x| a.wrapping_add(x * x)));
        let spun = std::hint::black_box((0..2_000_000u64).fold(0u64, |a, x| a ^ x.wrapping_mul(31)));
        let _ = (t.join(), spun);
        let u = usage(&[std::process::id(), u32::MAX - 1]);
        assert_eq!(u.processes, 1, "the missing pid is skipped");
        assert!(u.threads >= 1 && u.cpu_ns > 0, "{u:?}");
        assert!(u.voluntary_switches + u.involuntary_switches > 0, "{u:?}");
    }

    #[test]
    fn context_switch_lines_are_read() {
        let s = "Name:\tx\nvoluntary_ctxt_switches:\t12\nnonvoluntary_ctxt_switches:\t3\n";
        assert_eq!(context_switches(s), (12, 3));
        assert_eq!(context_switches("Name:\tx\n"), (0, 0));
    }
}
