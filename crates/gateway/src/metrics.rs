//! Prometheus metrics: per-function invocation counts by outcome and
//! end-to-end latency histograms, as seen by the gateway.
//!
//! Every call records here, on the HTTP thread that served it: each thread
//! has its own table behind its own (uncontended) mutex, and `/metrics`
//! merges them. One shared table made the threads queue behind each other.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;

/// Histogram bucket bounds in seconds: microsecond-scale at the bottom,
/// because that is where this runtime lives.
const BUCKETS_S: [f64; 18] = [
    25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3, 250e-3, 500e-3, 1.0, 2.5,
    5.0, 10.0,
];

#[derive(Default, Clone)]
struct FnMetrics {
    outcomes: BTreeMap<&'static str, u64>,
    buckets: [u64; BUCKETS_S.len()],
    count: u64,
    sum_s: f64,
}

impl FnMetrics {
    fn add(&mut self, o: &FnMetrics) {
        for (k, n) in &o.outcomes {
            *self.outcomes.entry(k).or_default() += n;
        }
        for (b, n) in self.buckets.iter_mut().zip(o.buckets) {
            *b += n;
        }
        self.count += o.count;
        self.sum_s += o.sum_s;
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

    /// Records a call served by HTTP thread `thread`.
    pub fn record(&self, thread: usize, function: &str, outcome: &'static str, latency_s: f64) {
        let mut m = self.by_thread[thread % self.by_thread.len()].lock().unwrap_or_else(|p| p.into_inner());
        if !m.contains_key(function) {
            m.insert(function.to_string(), FnMetrics::default());
        }
        let f = m.get_mut(function).expect("inserted above");
        *f.outcomes.entry(outcome).or_default() += 1;
        if let Some(i) = BUCKETS_S.iter().position(|b| latency_s <= *b) {
            f.buckets[i] += 1;
        }
        f.count += 1;
        f.sum_s += latency_s;
    }

    pub fn render(&self) -> String {
        let mut m: BTreeMap<String, FnMetrics> = BTreeMap::new();
        for t in &self.by_thread {
            // Copied out one thread at a time: no thread waits for rendering.
            let part = t.lock().unwrap_or_else(|p| p.into_inner()).clone();
            for (name, f) in part {
                m.entry(name).or_default().add(&f);
            }
        }
        let mut s = String::new();
        s.push_str("# HELP staccato_invocations_total Function invocations through the gateway, by outcome.\n");
        s.push_str("# TYPE staccato_invocations_total counter\n");
        for (name, f) in m.iter() {
            for (outcome, n) in &f.outcomes {
                let _ = writeln!(s, "staccato_invocations_total{{function=\"{name}\",outcome=\"{outcome}\"}} {n}");
            }
        }
        s.push_str("# HELP staccato_invocation_duration_seconds End-to-end latency at the gateway.\n");
        s.push_str("# TYPE staccato_invocation_duration_seconds histogram\n");
        for (name, f) in m.iter() {
            let mut cum = 0;
            for (i, b) in BUCKETS_S.iter().enumerate() {
                cum += f.buckets[i];
                let _ =
                    writeln!(s, "staccato_invocation_duration_seconds_bucket{{function=\"{name}\",le=\"{b}\"}} {cum}");
            }
            let _ = writeln!(
                s,
                "staccato_invocation_duration_seconds_bucket{{function=\"{name}\",le=\"+Inf\"}} {}",
                f.count
            );
            let _ = writeln!(s, "staccato_invocation_duration_seconds_sum{{function=\"{name}\"}} {}", f.sum_s);
            let _ = writeln!(s, "staccato_invocation_duration_seconds_count{{function=\"{name}\"}} {}", f.count);
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
        m.record(0, "f", "ok", 30e-6);
        m.record(1, "f", "ok", 2.0);
        m.record(1, "f", "timeout", 100.0);
        let text = m.render();
        assert!(text.contains("staccato_invocations_total{function=\"f\",outcome=\"ok\"} 2"), "{text}");
        assert!(text.contains("staccato_invocations_total{function=\"f\",outcome=\"timeout\"} 1"));
        assert!(text.contains("le=\"0.00005\"} 1"), "{text}");
        assert!(text.contains("le=\"2.5\"} 2"));
        assert!(text.contains("le=\"+Inf\"} 3"));
        assert!(text.contains("_count{function=\"f\"} 3"));
        assert!(text.contains("_sum{function=\"f\"} 102.00003"), "{text}");
    }
}
