//! Percentiles and the summary of a run. Pure functions over the records.

use crate::record::Row;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;

/// Nearest-rank percentile of sorted values: the smallest value with at
/// least p% of the values at or below it (rank ceil(p/100 * n), at least 1).
/// None for no values.
pub fn percentile<T: Copy>(sorted: &[T], p: f64) -> Option<T> {
    if sorted.is_empty() {
        return None;
    }
    let n = sorted.len();
    // The epsilon keeps 99.9% of 1000 at rank 999 despite float rounding.
    let rank = ((p / 100.0) * n as f64 - 1e-9).ceil().clamp(1.0, n as f64) as usize;
    Some(sorted[rank - 1])
}

pub const PERCENTILES: [(f64, &str); 8] = [
    (50.0, "p50"),
    (75.0, "p75"),
    (90.0, "p90"),
    (99.0, "p99"),
    (99.9, "p99.9"),
    (99.99, "p99.99"),
    (99.999, "p99.999"),
    (100.0, "p100"),
];

/// {"p50": .., ..., "n": ..} of unsorted values in ms; nulls when empty.
pub fn percentiles_ms(mut v: Vec<f64>) -> Value {
    v.sort_by(f64::total_cmp);
    let mut m = Map::new();
    m.insert("n".into(), json!(v.len()));
    for (p, name) in PERCENTILES {
        m.insert(name.into(), json!(percentile(&v, p).map(round_us)));
    }
    Value::Object(m)
}

fn round_us(ms: f64) -> f64 {
    (ms * 1000.0).round() / 1000.0
}

/// The statistics of one group of requests (warmup excluded by the caller).
/// `active_s`: the measured time the group was offered load.
pub fn group_summary(rows: &[&Row], offered_rate: f64, active_s: f64) -> Value {
    let ok: Vec<&&Row> = rows.iter().filter(|r| r.is_ok()).collect();
    let mut errors: BTreeMap<&str, usize> = BTreeMap::new();
    for r in rows.iter().filter(|r| !r.is_ok()) {
        *errors.entry(r.error.as_str()).or_default() += 1;
    }
    let achieved = if active_s > 0.0 { ok.len() as f64 / active_s } else { 0.0 };
    let cold = ok.iter().filter(|r| r.cold_ms.is_some_and(|c| c > 0.0)).count();
    let with_timing = ok.iter().filter(|r| r.exec_ms.is_some()).count();
    let mean = |f: fn(&Row) -> Option<f64>| {
        let v: Vec<f64> = ok.iter().filter_map(|r| f(r)).collect();
        (!v.is_empty()).then(|| round_us(v.iter().sum::<f64>() / v.len() as f64))
    };
    json!({
        "count": rows.len(),
        "ok": ok.len(),
        "errors": errors,
        "offered_rate": offered_rate,
        "achieved_rate": achieved,
        "active_s": active_s,
        "capacity_factor": if offered_rate > 0.0 { Some(achieved / offered_rate) } else { None },
        "latency_ms": percentiles_ms(ok.iter().filter_map(|r| r.latency_ms).collect()),
        "uncorrected_latency_ms": percentiles_ms(ok.iter().filter_map(|r| r.uncorrected_ms).collect()),
        "send_lag_ms": percentiles_ms(rows.iter().filter_map(|r| r.send_lag_ms).collect()),
        "warm": with_timing - cold,
        "cold": cold,
        "mean_queue_ms": mean(|r| r.queue_ms),
        "mean_exec_ms": mean(|r| r.exec_ms),
        "mean_cold_ms": mean(|r| r.cold_ms),
    })
}

/// The p-th percentile of corrected latency with every failed request
/// counted as infinitely slow, so a phase that drops requests fails an SLO.
pub fn slo_latency_ms(rows: &[&Row], p: f64) -> Option<f64> {
    let mut v: Vec<f64> =
        rows.iter().map(|r| if r.is_ok() { r.latency_ms.unwrap_or(f64::INFINITY) } else { f64::INFINITY }).collect();
    v.sort_by(f64::total_cmp);
    percentile(&v, p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_on_known_data() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&v, 50.0), Some(50));
        assert_eq!(percentile(&v, 99.0), Some(99));
        assert_eq!(percentile(&v, 99.9), Some(100));
        assert_eq!(percentile(&v, 100.0), Some(100));
        assert_eq!(percentile(&v, 0.0), Some(1));
        let v: Vec<u64> = (1..=1000).collect();
        assert_eq!(percentile(&v, 99.9), Some(999));
        assert_eq!(percentile(&v, 99.99), Some(1000));
        // Wikipedia's nearest-rank example: 15, 20, 35, 40, 50.
        let w = [15, 20, 35, 40, 50];
        assert_eq!([5.0, 30.0, 40.0, 50.0, 100.0].map(|p| percentile(&w, p).unwrap()), [15, 20, 20, 35, 50]);
        assert_eq!(percentile::<u64>(&[], 50.0), None);
        assert_eq!(percentile(&[7], 99.999), Some(7));
    }

    #[test]
    fn percentile_table_in_ms() {
        let t = percentiles_ms(vec![3.0, 1.0, 2.0, 4.0]);
        assert_eq!(t["n"], 4);
        assert_eq!(t["p50"], 2.0);
        assert_eq!(t["p75"], 3.0);
        assert_eq!(t["p100"], 4.0);
        assert_eq!(percentiles_ms(vec![])["p99"], Value::Null);
    }
}
