//! Every arrival of a run, computed before the first request is sent: each
//! instance's arrivals from its distribution and its own seed, merged and
//! sorted. Pure functions, no I/O.
//!
//! Seeds: FaaSProfiler seeds numpy once with `random_seed`, so two Poisson
//! instances of equal rate fire at identical times, and seeds Uniform with
//! `seed + hash(instance)`, which Python's per-process string hashing makes
//! irreproducible. Here each instance (and each sweep phase) gets its own
//! stream, derived from `random_seed`, the instance name and the phase index.

use crate::config::{Config, Distribution, Instance};

/// One scheduled request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Arrival {
    /// Nanoseconds from the test's start.
    pub at_ns: u64,
    pub instance: u32,
    /// Index into the instance's `mix`.
    pub app: u32,
    pub phase: u32,
    pub warmup: bool,
}

/// Where one instance is active in one phase, in seconds from the test's start.
#[derive(Debug, Clone, PartialEq)]
pub struct PhaseWindow {
    pub phase: usize,
    pub rate: f64,
    pub start_s: f64,
    pub end_s: f64,
    /// `start_s`, or later when the phase's warmup overlaps the window.
    pub measured_start_s: f64,
}

/// The phases an instance takes part in: one per entry of `rates`.
pub fn phase_windows(cfg: &Config, inst: &Instance) -> Vec<PhaseWindow> {
    let (a, b) = inst.window.unwrap_or((0.0, cfg.duration_s));
    inst.rates
        .iter()
        .enumerate()
        .map(|(k, &rate)| {
            let p0 = cfg.phase_start_s(k);
            let measured = (p0 + cfg.warmup_s).clamp(p0 + a, p0 + b);
            PhaseWindow { phase: k, rate, start_s: p0 + a, end_s: p0 + b, measured_start_s: measured }
        })
        .collect()
}

/// All arrivals of the run, sorted by time.
pub fn build(cfg: &Config, seed: u64) -> Vec<Arrival> {
    let mut all = Vec::new();
    for (i, inst) in cfg.instances.iter().enumerate() {
        for w in phase_windows(cfg, inst) {
            let mut rng = Rng::new(instance_seed(seed, &inst.name, w.phase));
            let mut pick = Rng::new(instance_seed(seed, &inst.name, w.phase) ^ 0xa5a5_a5a5_a5a5_a5a5);
            let phase_start_s = cfg.phase_start_s(w.phase);
            for t in arrival_times(&inst.distribution, w.rate, w.start_s, w.end_s, &mut rng) {
                all.push(Arrival {
                    at_ns: (t * 1e9) as u64,
                    instance: i as u32,
                    app: pick_weighted(&inst.mix, &mut pick) as u32,
                    phase: w.phase as u32,
                    warmup: t < phase_start_s + cfg.warmup_s,
                });
            }
        }
    }
    // Stable: equal times keep instance order, so the merge is deterministic.
    all.sort_by_key(|a| a.at_ns);
    all
}

/// Arrival times in [start, end) seconds.
pub fn arrival_times(dist: &Distribution, rate: f64, start: f64, end: f64, rng: &mut Rng) -> Vec<f64> {
    let mut out = Vec::new();
    // Rate 0 is FaaSProfiler's "no invocations" (1/rate would be infinite);
    // a trace's times do not depend on its rate.
    if rate <= 0.0 && !matches!(dist, Distribution::Trace { .. }) {
        return out;
    }
    match dist {
        Distribution::Poisson => poisson(rate, start, end, rng, &mut out),
        Distribution::Uniform => {
            let gap = 1.0 / rate;
            let mut t = start + rng.next_f64() * gap;
            while t < end {
                out.push(t);
                t += gap;
            }
        }
        Distribution::Constant => {
            // Multiply rather than accumulate, so rounding does not drift.
            let mut k = 0u64;
            loop {
                let t = start + k as f64 / rate;
                if t >= end {
                    break;
                }
                out.push(t);
                k += 1;
            }
        }
        Distribution::Bursty { on_s, off_s } => {
            let mut on = start;
            while on < end {
                poisson(rate, on, (on + on_s).min(end), rng, &mut out);
                on += on_s + off_s;
            }
        }
        Distribution::Trace { inter_arrivals_s } => {
            let mut t = start;
            for ia in inter_arrivals_s {
                t += ia;
                if t >= end {
                    break;
                }
                out.push(t);
            }
        }
    }
    out
}

fn poisson(rate: f64, start: f64, end: f64, rng: &mut Rng, out: &mut Vec<f64>) {
    let mut t = start + rng.exponential(rate);
    while t < end {
        out.push(t);
        t += rng.exponential(rate);
    }
}

fn pick_weighted(mix: &[(String, f64)], rng: &mut Rng) -> usize {
    if mix.len() == 1 {
        return 0;
    }
    let total: f64 = mix.iter().map(|m| m.1).sum();
    let mut x = rng.next_f64() * total;
    for (i, (_, w)) in mix.iter().enumerate() {
        if x < *w {
            return i;
        }
        x -= w;
    }
    mix.len() - 1
}

/// The seed of one instance in one phase: random_seed mixed with a hash of
/// the name (FNV-1a, stable across processes and versions) and the phase.
pub fn instance_seed(seed: u64, name: &str, phase: usize) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
    }
    splitmix64(&mut (seed ^ h ^ (phase as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)))
}

fn splitmix64(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// xoshiro256** seeded by SplitMix64: small, fast, and the same sequence on
/// every platform, which a schedule recorded by seed needs.
#[derive(Debug, Clone)]
pub struct Rng([u64; 4]);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        let mut x = seed;
        Rng([splitmix64(&mut x), splitmix64(&mut x), splitmix64(&mut x), splitmix64(&mut x)])
    }

    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.0;
        let out = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        out
    }

    /// Uniform in [0, 1), 53 random bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Exponential with mean 1/rate, by inversion; `1 - u` is in (0, 1], so ln never sees 0.
    pub fn exponential(&mut self, rate: f64) -> f64 {
        -(1.0 - self.next_f64()).ln() / rate
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn cfg(json: &str) -> Config {
        Config::parse(json, Path::new(".")).unwrap()
    }

    fn gaps(ts: &[f64]) -> Vec<f64> {
        ts.windows(2).map(|w| w[1] - w[0]).collect()
    }

    fn mean_cv(xs: &[f64]) -> (f64, f64) {
        let n = xs.len() as f64;
        let mean = xs.iter().sum::<f64>() / n;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n;
        (mean, var.sqrt() / mean)
    }

    #[test]
    fn poisson_is_exponential_with_the_right_mean() {
        let mut rng = Rng::new(42);
        let ts = arrival_times(&Distribution::Poisson, 1000.0, 0.0, 200.0, &mut rng);
        let (mean, cv) = mean_cv(&gaps(&ts));
        assert!((mean - 0.001).abs() < 0.001 * 0.02, "mean {mean}");
        assert!((cv - 1.0).abs() < 0.03, "cv {cv}");
        // Exponential: P(gap > mean) = 1/e.
        let above = gaps(&ts).iter().filter(|g| **g > 0.001).count() as f64 / ts.len() as f64;
        assert!((above - (-1f64).exp()).abs() < 0.01, "{above}");
    }

    #[test]
    fn uniform_and_constant_spacing() {
        let mut rng = Rng::new(7);
        let u = arrival_times(&Distribution::Uniform, 100.0, 10.0, 15.0, &mut rng);
        assert_eq!(u.len(), 500);
        assert!(u[0] >= 10.0 && u[0] < 10.01);
        assert!(gaps(&u).iter().all(|g| (g - 0.01).abs() < 1e-9));
        let c = arrival_times(&Distribution::Constant, 4.0, 1.0, 2.0, &mut rng);
        assert_eq!(c, vec![1.0, 1.25, 1.5, 1.75]);
    }

    #[test]
    fn zero_rate_sends_nothing() {
        let c = cfg(r#"{"test_name":"t","test_duration_in_seconds":5,"random_seed":1,"instances":{
            "a":{"application":"f","distribution":"Constant","rate":0},
            "b":{"application":"f","distribution":"Poisson","rate":0},
            "c":{"application":"f","distribution":"Uniform","rate":0},
            "d":{"application":"f","distribution":"Bursty","rate":0,"on_seconds":1}}}"#);
        assert_eq!(build(&c, 1), vec![]);
    }

    #[test]
    fn interarrivals_list_counts_from_the_test_start() {
        // FaaSProfiler's sample: a list starting 5 s in (its window, [5, 10]
        // in the 2019 sample, is ignored next to a list, as there); a list
        // is cut at the test's end.
        let c = cfg(r#"{"test_name":"t","test_duration_in_seconds":15,"random_seed":1,"instances":{
            "a":{"application":"f","interarrivals_list":[5,0.13,0.15,0.8,0.1,0.13,0.13,0.1,0.4],"activity_window":[5,10]},
            "b":{"application":"f","interarrivals_list":[5,0.13,0.15,0.8,0.1,0.13,0.13,0.1,0.4]},
            "c":{"application":"f","interarrivals_list":[1,1,1,1,1],"activity_window":[2.5,4.5]},
            "d":{"application":"f","interarrivals_list":[14,0.5,0.6]}}}"#);
        let s = build(&c, 1);
        let times =
            |i: u32| -> Vec<f64> { s.iter().filter(|x| x.instance == i).map(|x| x.at_ns as f64 / 1e9).collect() };
        let expected = [5.0, 5.13, 5.28, 6.08, 6.18, 6.31, 6.44, 6.54, 6.94];
        for i in [0, 1] {
            let t = times(i);
            assert_eq!(t.len(), 9, "{t:?}");
            assert!(t.iter().zip(expected).all(|(a, b)| (a - b).abs() < 1e-6), "{t:?}");
        }
        assert_eq!(times(2), vec![1.0, 2.0, 3.0, 4.0, 5.0]);
        assert_eq!(times(3), vec![14.0, 14.5]);
    }

    #[test]
    fn windows_respected_and_null_window_is_whole_test() {
        let c = cfg(r#"{"test_name":"t","test_duration_in_seconds":25,"random_seed":1,"instances":{
            "a":{"application":"f","distribution":"Poisson","rate":50,"activity_window":[5,20]},
            "b":{"application":"f","distribution":"Poisson","rate":50,"activity_window":null}}}"#);
        let s = build(&c, 1);
        let a: Vec<f64> = s.iter().filter(|x| x.instance == 0).map(|x| x.at_ns as f64 / 1e9).collect();
        let b: Vec<f64> = s.iter().filter(|x| x.instance == 1).map(|x| x.at_ns as f64 / 1e9).collect();
        assert!(a.iter().all(|t| (5.0..20.0).contains(t)));
        assert!(b.iter().all(|t| (0.0..25.0).contains(t)));
        assert!(*b.first().unwrap() < 1.0 && *b.last().unwrap() > 24.0);
        assert!(s.windows(2).all(|w| w[0].at_ns <= w[1].at_ns), "merged schedule is sorted");
    }

    #[test]
    fn same_seed_same_schedule_and_instances_differ() {
        let c = cfg(r#"{"test_name":"t","test_duration_in_seconds":5,"instances":{
            "a":{"application":"f","distribution":"Poisson","rate":100},
            "b":{"application":"f","distribution":"Poisson","rate":100}}}"#);
        assert_eq!(build(&c, 110), build(&c, 110));
        assert_ne!(build(&c, 110), build(&c, 111));
        let s = build(&c, 110);
        let a: Vec<u64> = s.iter().filter(|x| x.instance == 0).map(|x| x.at_ns).collect();
        let b: Vec<u64> = s.iter().filter(|x| x.instance == 1).map(|x| x.at_ns).collect();
        assert_ne!(a[..10], b[..10]);
    }

    #[test]
    fn sweep_phases_pauses_and_warmup() {
        let c = cfg(r#"{"test_name":"t","test_duration_in_seconds":2,"pause_in_seconds":1,"warmup_in_seconds":0.5,
            "random_seed":3,"instances":{
            "a":{"application":"f","distribution":"Constant","rates":[10,20,40]}}}"#);
        let s = build(&c, 3);
        for (k, rate) in [(0u32, 10usize), (1, 20), (2, 40)] {
            let p: Vec<&Arrival> = s.iter().filter(|x| x.phase == k).collect();
            assert_eq!(p.len(), 2 * rate);
            let start_ns = k as u64 * 3_000_000_000;
            assert!(p.iter().all(|x| x.at_ns >= start_ns && x.at_ns < start_ns + 2_000_000_000));
            assert_eq!(p.iter().filter(|x| x.warmup).count(), rate / 2);
            assert!(p.iter().filter(|x| x.warmup).all(|x| x.at_ns < start_ns + 500_000_000));
        }
        let w = phase_windows(&c, &c.instances[0]);
        assert_eq!(w[2], PhaseWindow { phase: 2, rate: 40.0, start_s: 6.0, end_s: 8.0, measured_start_s: 6.5 });
    }

    #[test]
    fn bursty_is_silent_when_off() {
        let mut rng = Rng::new(9);
        let d = Distribution::Bursty { on_s: 0.1, off_s: 0.4 };
        let ts = arrival_times(&d, 1000.0, 0.0, 10.0, &mut rng);
        assert!(ts.iter().all(|t| (t % 0.5) < 0.1 + 1e-9));
        let n = ts.len() as f64; // 20 bursts x 0.1 s x 1000/s
        assert!((n - 2000.0).abs() < 200.0, "{n}");
    }

    #[test]
    fn trace_replays_inter_arrivals() {
        let mut rng = Rng::new(0);
        let d = Distribution::Trace { inter_arrivals_s: vec![0.5, 0.25, 1.0, 5.0] };
        assert_eq!(arrival_times(&d, 0.0, 1.0, 4.0, &mut rng), vec![1.5, 1.75, 2.75]);
    }

    #[test]
    fn mix_follows_weights() {
        let c = cfg(r#"{"test_name":"t","test_duration_in_seconds":10,"instances":{
            "a":{"mix":[{"application":"f","weight":3},{"application":"g","weight":1}],
                 "distribution":"Constant","rate":1000}}}"#);
        let s = build(&c, 5);
        let g = s.iter().filter(|x| x.app == 1).count() as f64 / s.len() as f64;
        assert!((g - 0.25).abs() < 0.02, "{g}");
    }
}
