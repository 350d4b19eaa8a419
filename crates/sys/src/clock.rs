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
