//! Clocks shared by every process on the machine.

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec on our stack; clock_gettime
    // writes only into it. The clocks used here always exist on Linux.
    unsafe {
        libc::clock_gettime(clock, &mut ts);
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// CLOCK_MONOTONIC in nanoseconds: comparable across processes on one
/// machine, so the engine and workers can timestamp the same call.
pub fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// Wall-clock microseconds since the Unix epoch (the unit of `deadline_us`).
pub fn unix_us() -> u64 {
    clock_ns(libc::CLOCK_REALTIME) / 1000
}

/// A one-shot timer on CLOCK_MONOTONIC with nanosecond resolution, as a file
/// descriptor an event loop can wait on (`epoll` only sleeps in whole
/// milliseconds). Its expiry is exact: timer slack applies to sleeps and
/// polls, not to timerfd.
pub struct Timer {
    fd: std::os::fd::OwnedFd,
}

impl Timer {
    /// A disarmed, non-blocking, close-on-exec timer.
    pub fn new() -> std::io::Result<Timer> {
        // SAFETY: timerfd_create takes no pointers; a non-negative result is
        // a descriptor nothing else owns.
        let fd = unsafe { libc::timerfd_create(libc::CLOCK_MONOTONIC, libc::TFD_NONBLOCK | libc::TFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` was just created and is owned by nothing else.
        Ok(Timer { fd: unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) } })
    }

    /// Arms the timer to fire at `at_ns` on [`monotonic_ns`]'s clock (at
    /// once if that has passed), replacing any earlier expiry.
    pub fn arm_at(&self, at_ns: u64) -> std::io::Result<()> {
        let at_ns = at_ns.max(1); // all zeros would disarm it
        let spec = libc::itimerspec {
            it_interval: libc::timespec { tv_sec: 0, tv_nsec: 0 },
            it_value: libc::timespec { tv_sec: (at_ns / 1_000_000_000) as _, tv_nsec: (at_ns % 1_000_000_000) as _ },
        };
        // SAFETY: `spec` is a valid itimerspec on our stack; the old value
        // pointer may be null; the descriptor is ours and open.
        let rc = unsafe {
            libc::timerfd_settime(
                std::os::fd::AsRawFd::as_raw_fd(&self.fd),
                libc::TFD_TIMER_ABSTIME,
                &spec,
                std::ptr::null_mut(),
            )
        };
        if rc < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// Reads off the expirations since the last call (0 if none), so an
    /// edge-triggered poll sees the next one.
    pub fn clear(&self) -> u64 {
        let mut n = 0u64;
        // SAFETY: reads at most 8 bytes into `n`, a u64 on our stack; the
        // descriptor is ours and open (non-blocking: EAGAIN when not expired).
        let got = unsafe { libc::read(std::os::fd::AsRawFd::as_raw_fd(&self.fd), (&mut n as *mut u64).cast(), 8) };
        if got == 8 {
            n
        } else {
            0
        }
    }
}

impl std::os::fd::AsRawFd for Timer {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        std::os::fd::AsRawFd::as_raw_fd(&self.fd)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timer_fires_once_at_its_time_and_not_before() {
        let t = Timer::new().unwrap();
        assert_eq!(t.clear(), 0, "a new timer is disarmed");
        let at = monotonic_ns() + 200_000_000;
        t.arm_at(at).unwrap();
        let n = t.clear();
        assert!(n == 0 || monotonic_ns() >= at, "fired early");
        let give_up = at + 2_000_000_000;
        let fired = if n > 0 {
            n
        } else {
            loop {
                let n = t.clear();
                if n > 0 || monotonic_ns() > give_up {
                    break n;
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        };
        assert_eq!(fired, 1, "a one-shot timer fires once");
        assert!(monotonic_ns() >= at, "read before its expiry");
        // Re-armed in the past: fires at once; re-armed later: replaces it.
        t.arm_at(monotonic_ns() - 1).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(1));
        assert_eq!(t.clear(), 1);
        t.arm_at(monotonic_ns() + 10_000_000_000).unwrap();
        t.arm_at(monotonic_ns() + 5_000_000).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert_eq!(t.clear(), 1, "the second arming replaced the first");
    }
}
