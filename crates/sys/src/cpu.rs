//! Which CPUs a process or thread runs on.

use std::io;

/// Number of CPUs this process may run on.
pub fn cpus_allowed() -> Vec<usize> {
    // SAFETY: cpu_set_t is plain bits; all-zero is a valid (empty) set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: we pass the true size of `set`, which the kernel fills in.
    let rc = unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if rc != 0 {
        return vec![0];
    }
    // SAFETY: CPU_ISSET reads bit `i` of the set we own; i < CPU_SETSIZE.
    (0..libc::CPU_SETSIZE as usize).filter(|&i| unsafe { libc::CPU_ISSET(i, &set) }).collect()
}

/// Pins thread or process `pid` (0 = the calling thread) to `cpus`.
pub fn set_affinity(pid: i32, cpus: &[usize]) -> io::Result<()> {
    // SAFETY: cpu_set_t is plain bits; all-zero is a valid (empty) set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in cpus {
        // SAFETY: CPU_SET writes bit `c` of the set we own; callers pass
        // CPU numbers from `cpus_allowed`, all below CPU_SETSIZE.
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    // SAFETY: `set` is initialised and we pass its true size.
    let rc = unsafe { libc::sched_setaffinity(pid, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Pins every thread of process `pid` to `cpus`: a process pinned again
/// after it started threads (Go's, a handler's) moves them all, where
/// `set_affinity(pid)` moves its main thread only.
pub fn set_affinity_all_threads(pid: u32, cpus: &[usize]) -> io::Result<()> {
    // Every thread it can, the first error after: one refused thread must
    // not leave the rest behind.
    let mut first = Ok(());
    for tid in threads_of(pid)? {
        match set_affinity(tid as i32, cpus) {
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
            Err(e) if first.is_ok() => first = Err(e),
            _ => {}
        }
    }
    first
}

/// The thread ids of process `pid`; none when it is gone.
fn threads_of(pid: u32) -> io::Result<Vec<u32>> {
    match std::fs::read_dir(format!("/proc/{pid}/task")) {
        Ok(d) => Ok(d.flatten().filter_map(|e| e.file_name().to_str()?.parse().ok()).collect()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

/// Makes the calling thread `SCHED_IDLE`: it runs only when nothing else
/// on its CPU wants to, and any waking thread preempts it at once.
pub fn set_idle_priority() -> io::Result<()> {
    // SAFETY: sched_param is a plain struct; SCHED_IDLE requires priority 0.
    let param: libc::sched_param = unsafe { std::mem::zeroed() };
    // SAFETY: pid 0 is the calling thread; `param` is initialised.
    let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Sets the nice value of every thread of process `pid` (a nice value is
/// per thread). A process or thread gone meanwhile is no error.
pub fn set_nice_all_threads(pid: u32, nice: i32) -> io::Result<()> {
    for tid in threads_of(pid)? {
        match set_nice(tid, nice) {
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
            r => r?,
        }
    }
    Ok(())
}

/// Sets the nice value of thread or process `pid` (0 = the calling thread).
/// Threads and processes it starts afterwards inherit it. Raising priority
/// again (a lower value) needs CAP_SYS_NICE.
pub fn set_nice(pid: u32, nice: i32) -> io::Result<()> {
    // SAFETY: setpriority takes plain integers; PRIO_PROCESS with a thread
    // id applies to that thread (Linux), with 0 to the calling thread.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, pid as libc::id_t, nice) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pinning_all_threads_moves_a_thread_started_before() {
        let all = cpus_allowed();
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let (back_tx, back_rx) = std::sync::mpsc::channel();
        // A thread that exists before the pin and reports its own mask after.
        let t = std::thread::spawn(move || {
            rx.recv().unwrap();
            back_tx.send(cpus_allowed()).unwrap();
        });
        set_affinity_all_threads(std::process::id(), &all[..1]).unwrap();
        tx.send(()).unwrap();
        let seen = back_rx.recv().unwrap();
        t.join().unwrap();
        set_affinity_all_threads(std::process::id(), &all).unwrap();
        assert_eq!(seen, all[..1].to_vec());
        assert_eq!(cpus_allowed(), all);
        // A process that is gone is no error.
        assert!(set_affinity_all_threads(u32::MAX >> 1, &all).is_ok());
    }
}
