//! Prometheus metrics: per-function invocation counts by outcome,
//! end-to-end latency histograms as seen by the gateway, and the engine's
//! own split of each call (time queued for a worker, time executing) and
//! its cold starts. `http::metrics` adds the engines' live state (τ,
//! workers, paused containers, up or down) and the async queue.
//!
//! Every call records here, on the HTTP thread that served it: each thread
//! has its own table behind its own (uncontended) mutex, and `/metrics`
//! merges them. One shared table made the threads queue behind each other.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;

/// Histogram bucket bounds in seconds: microsecond-scale at the bottom,
/// because that is where this runtime lives.
pub const BUCKETS_S: [f64; 18] = [
    25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3, 250e-3, 500e-3, 1.0, 2.5,
    5.0, 10.0,
];

/// A histogram over [`BUCKETS_S`].
#[derive(Default, Clone)]
struct Histogram {
    buckets: [u64; BUCKETS_S.len()],
    count: u64,
    sum_s: f64,
}

impl Histogram {
    fn observe(&mut self, s: f64) {
        if let Some(i) = BUCKETS_S.iter().position(|b| s <= *b) {
            self.buckets[i] += 1;
        }
        self.count += 1;
        self.sum_s += s;
    }

    fn add(&mut self, o: &Histogram) {
        for (b, n) in self.buckets.iter_mut().zip(o.buckets) {
            *b += n;
        }
        self.count += o.count;
        self.sum_s += o.sum_s;
    }

    /// Per-bucket counts (not cumulative), the last one for calls above
    /// every bound; and the count and sum.
    fn to_json(&self) -> serde_json::Value {
        let mut b = self.buckets.to_vec();
        b.push(self.count - self.buckets.iter().sum::<u64>());
        serde_json::json!({"buckets": b, "count": self.count, "sum_s": self.sum_s})
    }

    fn render(&self, s: &mut String, metric: &str, function: &str) {
        let mut cum = 0;
        for (i, b) in BUCKETS_S.iter().enumerate() {
            cum += self.buckets[i];
            let _ = writeln!(s, "{metric}_bucket{{function=\"{function}\",le=\"{b}\"}} {cum}");
        }
        let _ = writeln!(s, "{metric}_bucket{{function=\"{function}\",le=\"+Inf\"}} {}", self.count);
        let _ = writeln!(s, "{metric}_sum{{function=\"{function}\"}} {}", self.sum_s);
        let _ = writeln!(s, "{metric}_count{{function=\"{function}\"}} {}", self.count);
    }
}

#[derive(Default, Clone)]
struct FnMetrics {
    outcomes: BTreeMap<&'static str, u64>,
    latency: Histogram,
    /// The engine's timing of calls it answered: queued, executing.
    queue: Histogram,
    exec: Histogram,
    cold_starts: u64,
}

impl FnMetrics {
    fn add(&mut self, o: &FnMetrics) {
        for (k, n) in &o.outcomes {
            *self.outcomes.entry(k).or_default() += n;
        }
        self.latency.add(&o.latency);
        self.queue.add(&o.queue);
        self.exec.add(&o.exec);
        self.cold_starts += o.cold_starts;
    }
}

pub struct Metrics {
    /// One table per HTTP thread.
    by_thread: Vec<Mutex<BTreeMap<String, FnMetrics>>>,
}

impl Metrics {
    pub fn new(threads: usize) -> Metrics {
        Metrics { by_thread: (0..threads.max(1)).map(|_| Mutex::default()).collect() }
    }

    /// Records a call served by HTTP thread `thread`, with the engine's
    /// timing of it if an engine answered it (a call refused at the
    /// gateway has none).
    pub fn record(
        &self,
        thread: usize,
        function: &str,
        outcome: &'static str,
        latency_s: f64,
        timing: Option<wire::frame::Timing>,
    ) {
        let mut m = self.by_thread[thread % self.by_thread.len()].lock().unwrap_or_else(|p| p.into_inner());
        // One lookup per call; the name is copied only the first time.
        let f = match m.get_mut(function) {
            Some(f) => f,
            None => m.entry(function.to_string()).or_default(),
        };
        *f.outcomes.entry(outcome).or_default() += 1;
        f.latency.observe(latency_s);
        // A call the engine never dispatched has no execution to show.
        if let Some(t) = timing.filter(|t| t.queue_us > 0 || t.exec_us > 0) {
            f.queue.observe(f64::from(t.queue_us) / 1e6);
            f.exec.observe(f64::from(t.exec_us) / 1e6);
            if t.cold_us > 0 {
                f.cold_starts += 1;
            }
        }
    }

    fn merged(&self) -> BTreeMap<String, FnMetrics> {
        let mut m: BTreeMap<String, FnMetrics> = BTreeMap::new();
        for t in &self.by_thread {
            // Copied out one thread at a time: no thread waits for rendering.
            let part = t.lock().unwrap_or_else(|p| p.into_inner()).clone();
            for (name, f) in part {
                m.entry(name).or_default().add(&f);
            }
        }
        m
    }

    /// The same figures as JSON, per function, for the dashboard: counts
    /// by outcome, cold starts, and the latency, queue and execution
    /// histograms over [`BUCKETS_S`] (the page takes rates and percentiles
    /// from the difference between two snapshots).
    pub fn snapshot(&self) -> BTreeMap<String, serde_json::Value> {
        self.merged()
            .into_iter()
            .map(|(name, f)| {
                let v = serde_json::json!({
                    "outcomes": f.outcomes, "cold_starts": f.cold_starts, "latency": f.latency.to_json(),
                    "queue": f.queue.to_json(), "exec": f.exec.to_json(),
                });
                (name, v)
            })
            .collect()
    }

    pub fn render(&self) -> String {
        let m = self.merged();
        let mut s = String::new();
        s.push_str("# HELP staccato_invocations_total Function invocations through the gateway, by outcome.\n");
        s.push_str("# TYPE staccato_invocations_total counter\n");
        for (name, f) in m.iter() {
            for (outcome, n) in &f.outcomes {
                let _ = writeln!(s, "staccato_invocations_total{{function=\"{name}\",outcome=\"{outcome}\"}} {n}");
            }
        }
        type Hist = (&'static str, &'static str, fn(&FnMetrics) -> &Histogram);
        let histograms: [Hist; 3] = [
            ("staccato_invocation_duration_seconds", "End-to-end latency at the gateway.", |f| &f.latency),
            ("staccato_queue_seconds", "Time a call waited in its engine for a worker (engine's clock).", |f| &f.queue),
            ("staccato_execution_seconds", "Time a call ran on its worker (engine's clock).", |f| &f.exec),
        ];
        for (metric, help, of) in histograms {
            let _ = writeln!(s, "# HELP {metric} {help}\n# TYPE {metric} histogram");
            for (name, f) in m.iter() {
                of(f).render(&mut s, metric, name);
            }
        }
        s.push_str("# HELP staccato_cold_starts_total Calls that waited for a worker started for them.\n");
        s.push_str("# TYPE staccato_cold_starts_total counter\n");
        for (name, f) in m.iter() {
            let _ = writeln!(s, "staccato_cold_starts_total{{function=\"{name}\"}} {}", f.cold_starts);
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_is_cumulative() {
        let m = Metrics::new(2);
        let t = |q, e, c| Some(wire::frame::Timing { queue_us: q, exec_us: e, cold_us: c });
        m.record(0, "f", "ok", 30e-6, t(5, 20, 0));
        m.record(1, "f", "ok", 2.0, t(1_500_000, 400_000, 1_500_000));
        m.record(1, "f", "timeout", 100.0, None);
        let text = m.render();
        assert!(text.contains("staccato_invocations_total{function=\"f\",outcome=\"ok\"} 2"), "{text}");
        assert!(text.contains("staccato_invocations_total{function=\"f\",outcome=\"timeout\"} 1"));
        assert!(text.contains("le=\"0.00005\"} 1"), "{text}");
        assert!(text.contains("le=\"2.5\"} 2"));
        assert!(text.contains("le=\"+Inf\"} 3"));
        assert!(text.contains("_count{function=\"f\"} 3"));
        assert!(text.contains("_sum{function=\"f\"} 102.00003"), "{text}");
        // The engine's split: two calls it timed, one of them cold.
        assert!(text.contains("staccato_queue_seconds_bucket{function=\"f\",le=\"0.000025\"} 1"), "{text}");
        assert!(text.contains("staccato_queue_seconds_bucket{function=\"f\",le=\"2.5\"} 2"), "{text}");
        assert!(text.contains("staccato_execution_seconds_count{function=\"f\"} 2"), "{text}");
        assert!(text.contains("staccato_cold_starts_total{function=\"f\"} 1"), "{text}");
        let snap = m.snapshot();
        let f = &snap["f"];
        assert_eq!(f["outcomes"], serde_json::json!({"ok": 2, "timeout": 1}));
        // 30 µs in the 50 µs bucket, 2 s in the 2.5 s one, 100 s above all.
        let b = f["latency"]["buckets"].as_array().unwrap();
        assert_eq!(
            (b.len(), &b[1], &b[15], &b[18]),
            (BUCKETS_S.len() + 1, &serde_json::json!(1), &serde_json::json!(1), &serde_json::json!(1))
        );
        assert_eq!((f["exec"]["count"].as_u64(), f["cold_starts"].as_u64()), (Some(2), Some(1)));
    }
}
