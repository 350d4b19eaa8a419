//! Managed concurrency (Nightcore §3.3, §4.1): per function, exponential
//! moving averages of the invocation rate λ and the processing time t give
//! the concurrency hint τ = λ·t. Pure arithmetic on timestamps, no clocks
//! read here, so it is unit-tested directly.

/// An exponential moving average; the first sample initialises it.
#[derive(Clone, Copy, Debug)]
pub struct Ema {
    value: Option<f64>,
    alpha: f64,
}

impl Ema {
    pub fn new(alpha: f64) -> Ema {
        Ema { value: None, alpha }
    }

    pub fn sample(&mut self, x: f64) {
        self.value = Some(match self.value {
            None => x,
            Some(v) => v + self.alpha * (x - v),
        });
    }

    pub fn get(&self) -> Option<f64> {
        self.value
    }
}

/// Shortest inter-arrival interval counted: two calls in the same
/// microsecond would otherwise give an infinite rate sample.
const INTERVAL_NS_MIN: u64 = 1_000;

#[derive(Clone, Debug)]
pub struct ConcurrencyHint {
    rate_per_s: Ema,
    processing_s: Ema,
    last_arrival_ns: Option<u64>,
}

impl ConcurrencyHint {
    pub fn new(alpha: f64) -> ConcurrencyHint {
        ConcurrencyHint { rate_per_s: Ema::new(alpha), processing_s: Ema::new(alpha), last_arrival_ns: None }
    }

    /// A call arrived at `now_ns`. The rate sample is 1/interval since the
    /// previous arrival, as in Nightcore §4.1.
    pub fn on_arrival(&mut self, now_ns: u64) {
        if let Some(last) = self.last_arrival_ns {
            let interval = now_ns.saturating_sub(last).max(INTERVAL_NS_MIN);
            self.rate_per_s.sample(1e9 / interval as f64);
        }
        self.last_arrival_ns = Some(now_ns);
    }

    /// A call finished after `processing_ns` of processing: dispatch to
    /// completion, less the time its own sub-calls spent queued.
    pub fn on_processed(&mut self, processing_ns: u64) {
        self.processing_s.sample(processing_ns as f64 / 1e9);
    }

    /// λ as of `now_ns`. Nightcore samples the rate only at arrivals, so after
    /// a burst λ (and τ, and the pool) would stay high forever once calls
    /// stop. Here, for an idle function (`busy` false: nothing queued or
    /// running), a silence longer than the mean interval caps λ at
    /// 1/silence, so its τ decays and its pool can shrink. A busy function
    /// keeps its λ: a burst whose calls are all queued is not a silence.
    pub fn rate_per_s(&self, now_ns: u64, busy: bool) -> f64 {
        let Some(rate) = self.rate_per_s.get() else { return 0.0 };
        if busy {
            return rate;
        }
        let Some(last) = self.last_arrival_ns else { return rate };
        let silence_s = now_ns.saturating_sub(last) as f64 / 1e9;
        if silence_s * rate > 1.0 {
            1.0 / silence_s
        } else {
            rate
        }
    }

    pub fn processing_s(&self) -> f64 {
        self.processing_s.get().unwrap_or(0.0)
    }

    /// τ, clamped to `[max(min_workers, 1), max_workers]`. Never 0: a
    /// function with queued calls must be able to run one (Nightcore's τ can
    /// round to 0 and leave calls queued forever).
    ///
    /// Before the first call has finished there is no processing time to
    /// multiply by, and λ·t would be 0: τ would hold a burst to a freshly
    /// deployed function to one call at a time until the first one ends (16
    /// concurrent 1 s calls took 2 s). Without that measurement τ is
    /// max_workers while calls are queued or running, and the floor while
    /// none are (so a pool whose calls never complete, all timing out say,
    /// still shrinks); from the first completion on, λ·t bounds it as
    /// usual.
    ///
    /// The processing time is an average of many calls (α is small), so
    /// when calls become slower it lags far behind: at 10 calls/s of 1 ms
    /// turning into 200 ms, τ would stay 1 for ~500 completions while the
    /// queue grows. `running_for_s`, how long the oldest running call has
    /// run (0: none, or no call is waiting), stands in for t when it is
    /// longer: calls that have run longer than expected with others
    /// queued behind them grow τ at once. It is what the running calls
    /// show, not a guess, so a function that is merely busy with calls of
    /// one length keeps τ = λ·t, Nightcore's guard against
    /// over-provisioning (ARCHITECTURE.md says what spread-out lengths and
    /// slow callees do to it).
    pub fn tau(&self, now_ns: u64, busy: bool, min_workers: u32, max_workers: u32, running_for_s: f64) -> u32 {
        let lo = min_workers.max(1);
        let hi = max_workers.max(lo);
        if self.processing_s.get().is_none() {
            return if busy { hi } else { lo };
        }
        let t = self.processing_s().max(running_for_s);
        let raw = (self.rate_per_s(now_ns, busy) * t).ceil();
        if raw.is_nan() {
            return lo;
        }
        (raw as u32).clamp(lo, hi)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn ema_first_sample_initialises() {
        let mut e = Ema::new(0.5);
        assert_eq!(e.get(), None);
        e.sample(10.0);
        assert_eq!(e.get(), Some(10.0));
        e.sample(20.0);
        assert_eq!(e.get(), Some(15.0));
    }

    #[test]
    fn tau_is_rate_times_processing_time() {
        let mut h = ConcurrencyHint::new(1e-3);
        // 100 calls/s, 50 ms each: Little's law says 5 in flight.
        for i in 0..100 {
            h.on_arrival(i * 10 * MS);
            h.on_processed(50 * MS);
        }
        assert_eq!(h.tau(99 * 10 * MS, false, 1, 64, 0.0), 5);
        // Clamped to max_workers.
        assert_eq!(h.tau(99 * 10 * MS, false, 1, 3, 0.0), 3);
    }

    #[test]
    fn without_a_processing_time_tau_is_max_workers() {
        let mut h = ConcurrencyHint::new(1e-3);
        assert_eq!(h.tau(0, true, 0, 8, 0.0), 8);
        assert_eq!(h.tau(0, false, 0, 8, 0.0), 1, "nothing to run: the floor");
        // A burst of 16 to a fresh function: all may run at once...
        for i in 0..16 {
            h.on_arrival(i * 1000);
        }
        assert_eq!(h.tau(16_000, true, 1, 16, 0.0), 16);
        // ...and once one has finished, λ·t rules: 1 call/s of 10 ms.
        let mut h = ConcurrencyHint::new(1e-3);
        h.on_arrival(0);
        h.on_arrival(1000 * MS);
        h.on_processed(10 * MS);
        assert_eq!(h.tau(1000 * MS, false, 1, 16, 0.0), 1);
    }

    #[test]
    fn tau_never_zero() {
        let mut h = ConcurrencyHint::new(1e-3);
        h.on_processed(MS);
        assert_eq!(h.tau(0, false, 0, 8, 0.0), 1, "no rate yet");
        let mut h = ConcurrencyHint::new(1e-3);
        h.on_arrival(0);
        h.on_arrival(1000 * MS);
        h.on_processed(1_000); // 1 µs at 1 call/s: τ = 1e-6, rounds up to 1
        assert_eq!(h.tau(1000 * MS, false, 0, 8, 0.0), 1);
    }

    #[test]
    fn rate_decays_when_idle() {
        let mut h = ConcurrencyHint::new(1e-3);
        for i in 0..1000 {
            h.on_arrival(i * MS); // 1000 calls/s
            h.on_processed(10 * MS);
        }
        let last = 999 * MS;
        assert!((h.rate_per_s(last, false) - 1000.0).abs() < 1.0);
        assert_eq!(h.tau(last, false, 1, 64, 0.0), 10);
        // Two seconds of silence: λ ≤ 0.5/s, so τ falls to the floor.
        assert!(h.rate_per_s(last + 2000 * MS, false) <= 0.5);
        assert_eq!(h.tau(last + 2000 * MS, false, 1, 64, 0.0), 1);
        // ... unless calls are still queued or running: then it is no silence.
        assert_eq!(h.tau(last + 2000 * MS, true, 1, 64, 0.0), 10);
    }

    #[test]
    fn calls_running_longer_than_expected_grow_tau() {
        let mut h = ConcurrencyHint::new(1e-3);
        // 10 calls/s of 1 ms: τ = 1.
        for i in 0..1000 {
            h.on_arrival(i * 100 * MS);
            h.on_processed(MS);
        }
        let now = 999 * 100 * MS;
        assert_eq!(h.tau(now, true, 1, 64, 0.0), 1);
        // Calls turn slow: the oldest running one is 250 ms in, calls wait.
        assert_eq!(h.tau(now, true, 1, 64, 0.25), 3, "10/s × 0.25 s");
        assert_eq!(h.tau(now, true, 1, 2, 0.25), 2, "within max_workers");
        // A running call younger than the average changes nothing.
        assert_eq!(h.tau(now, true, 1, 64, 0.0005), 1);
    }

    #[test]
    fn burst_raises_rate_quickly_even_with_small_alpha() {
        let mut h = ConcurrencyHint::new(1e-3);
        h.on_arrival(0);
        h.on_arrival(1000 * MS); // 1/s
        h.on_processed(100 * MS);
        let t = 1000 * MS + 1;
        for i in 0..8 {
            h.on_arrival(t + i * 1000); // 1 µs apart: samples of 1e6/s
        }
        assert!(h.tau(t + 8000, true, 1, 64, 0.0) > 4);
    }
}
