//! Keeping vCPUs awake while calls come (issue 14).
//!
//! In a VM a vCPU with nothing to run halts, and waking it costs tens of
//! microseconds of host work (measured here: an idle round trip to a
//! plain C HTTP server 100 µs against 18 µs back to back; Staccato's,
//! with its extra hops, 210 against 33). A call that arrives while its
//! vCPU is awake skips that. So while calls keep coming, a poller thread
//! per CPU the engine uses spins at `SCHED_IDLE` priority, in a CPU group
//! marked idle (`sandbox::cgroup::enter_idle_cpu_group`): it runs only
//! when nothing else on its CPU wants to, so it delays no thread of the
//! engine, its functions or anything else on the machine — it only keeps
//! the vCPU from halting. It stops `keep_awake_ms` after the last event
//! any I/O thread saw and sleeps until the next: an idle engine burns
//! nothing; one that takes a call now and then burns up to
//! `keep_awake_ms` of idle-class time per CPU after each.
//!
//! The cost is the host's CPU time: a vCPU kept awake is busy to the
//! hypervisor, and so off by default (`--keep-awake-ms 0`). Measured here
//! (BENCHMARKS.md, "Keeping vCPUs awake"): C nop at 100 calls/s, pinned
//! to one vCPU, p50 277 µs without, 77 µs with a window of 1 s (plain HTTP
//! server: 76-82); but a window shorter than the gaps between calls (20 ms at
//! 100/s) made the p99 2-5 ms: a vCPU that halts right after a busy
//! period is, it seems, woken late by the host's scheduler (the same
//! with pollers that sleep-poll instead of being woken, so it is not the
//! wake-up here). Use it on a machine of your own, with a window longer
//! than your calls' gaps.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub(crate) struct Awake {
    /// Monotonic ns of the latest event an I/O thread handled.
    last_ns: AtomicU64,
    window_ns: u64,
    /// A poller is asleep (or going to sleep): the next event wakes them.
    asleep: AtomicBool,
    pollers: std::sync::Mutex<Vec<std::thread::Thread>>,
}

impl Awake {
    pub fn new(window_ms: u32) -> Awake {
        Awake {
            last_ns: AtomicU64::new(0),
            window_ns: u64::from(window_ms) * 1_000_000,
            asleep: AtomicBool::new(false),
            pollers: std::sync::Mutex::new(Vec::new()),
        }
    }

    /// Starts a poller on each of `cpus` (none if the window is 0).
    pub fn start(self: &Arc<Self>, cpus: &[usize]) {
        if self.window_ns == 0 {
            return;
        }
        for &cpu in cpus {
            let me = self.clone();
            let spawned = std::thread::Builder::new().name(format!("engine-awake-{cpu}")).spawn(move || me.poll(cpu));
            match spawned {
                Ok(h) => crate::shared::lock(&self.pollers).push(h.thread().clone()),
                Err(e) => log::warn!("starting the keep-awake poller of CPU {cpu}: {e}"),
            }
        }
    }

    /// An I/O thread handled events at `now_ns`. A store and a load when
    /// the pollers are awake; a wake-up of each when they sleep.
    #[inline]
    pub fn saw_events(&self, now_ns: u64) {
        if self.window_ns == 0 {
            return;
        }
        self.last_ns.store(now_ns, Ordering::SeqCst);
        if self.asleep.load(Ordering::SeqCst) && self.asleep.swap(false, Ordering::SeqCst) {
            for t in crate::shared::lock(&self.pollers).iter() {
                t.unpark();
            }
        }
    }

    fn poll(&self, cpu: usize) {
        if let Err(e) = sys::cpu::set_affinity(0, &[cpu]) {
            log::warn!("keep-awake poller: pinning to CPU {cpu}: {e}; it stops");
            return;
        }
        // At normal priority, or idle only within the engine's own group,
        // it would compete with real work: then it does not run at all.
        if let Err(e) = sandbox::cgroup::enter_idle_cpu_group().and_then(|()| sys::cpu::set_idle_priority()) {
            if cpu == 0 {
                log::info!("keeping vCPUs awake is off: an idle CPU group for its pollers: {e}");
            }
            return;
        }
        loop {
            let now = sys::clock::monotonic_ns();
            if now.saturating_sub(self.last_ns.load(Ordering::SeqCst)) < self.window_ns {
                // No `spin_loop` (PAUSE): in a VM, a vCPU that executes
                // PAUSE in a loop looks like a spinning lock holder's waiter
                // to the hypervisor, which takes the vCPU away (pause-loop
                // exiting), and getting it back costs up to a host tick:
                // measured, p99 4 ms with PAUSE against 0.3 ms without.
                for _ in 0..256 {
                    std::hint::black_box(self.last_ns.load(Ordering::Relaxed));
                }
                continue;
            }
            // Say so before looking again (the I/O threads store, then
            // look), so an event after this look wakes us.
            self.asleep.store(true, Ordering::SeqCst);
            if sys::clock::monotonic_ns().saturating_sub(self.last_ns.load(Ordering::SeqCst)) < self.window_ns {
                continue;
            }
            // The timeout only bounds a missed wake-up; none is expected.
            std::thread::park_timeout(Duration::from_secs(1));
        }
    }
}
