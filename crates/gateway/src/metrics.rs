//! Prometheus metrics: per-function invocation counts by outcome and
//! end-to-end latency histograms, as seen by the gateway.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;

/// Histogram bucket bounds in seconds: microsecond-scale at the bottom,
/// because that is where this runtime lives.
const BUCKETS_S: [f64; 18] = [
    25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3, 250e-3, 500e-3, 1.0, 2.5,
    5.0, 10.0,
];

#[derive(Default)]
struct FnMetrics {
    outcomes: BTreeMap<&'static str, u64>,
    buckets: [u64; BUCKETS_S.len()],
    count: u64,
    sum_s: f64,
}

#[derive(Default)]
pub struct Metrics {
    by_fn: Mutex<BTreeMap<String, FnMetrics>>,
}

impl Metrics {
    pub fn record(&self, function: &str, outcome: &'static str, latency_s: f64) {
        let mut m = self.by_fn.lock().unwrap_or_else(|p| p.into_inner());
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
        let m = self.by_fn.lock().unwrap_or_else(|p| p.into_inner());
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
        let m = Metrics::default();
        m.record("f", "ok", 30e-6);
        m.record("f", "ok", 2.0);
        m.record("f", "timeout", 100.0);
        let text = m.render();
        assert!(text.contains("staccato_invocations_total{function=\"f\",outcome=\"ok\"} 2"), "{text}");
        assert!(text.contains("staccato_invocations_total{function=\"f\",outcome=\"timeout\"} 1"));
        assert!(text.contains("le=\"0.00005\"} 1"), "{text}");
        assert!(text.contains("le=\"2.5\"} 2"));
        assert!(text.contains("le=\"+Inf\"} 3"));
        assert!(text.contains("_count{function=\"f\"} 3"));
    }
}
