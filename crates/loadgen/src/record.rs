//! The run directory's files: requests.csv, invocations.csv, summary.json
//! (run.json is written by `lib.rs`, which knows the machine). Column names
//! and meanings are a contract with tools/staccato_analyzer.

use crate::config::Config;
use crate::schedule::{phase_windows, Arrival};
use crate::sender::Outcome;
use crate::stats::{group_summary, slo_latency_ms};
use serde_json::{json, Map, Value};
use std::collections::{BTreeMap, HashSet};
use std::io::Write;
use std::path::Path;

pub const REQUESTS_HEADER: &str = "instance,application,phase,warmup,scheduled_s,sent_s,done_s,latency_ms,\
uncorrected_ms,send_lag_ms,status,bytes_out,bytes_in,error,call_id,queue_ms,exec_ms,cold_ms";

pub const INVOCATIONS_HEADER: &str =
    "call_id,parent_call_id,function,receive_ns,dispatch_ns,complete_ns,queue_ms,exec_ms,outcome,cold,cpu_us";

/// One request, as written to requests.csv.
#[derive(Debug, Clone)]
pub struct Row {
    pub instance: usize,
    pub application: String,
    pub phase: usize,
    pub warmup: bool,
    pub scheduled_s: f64,
    pub sent_s: Option<f64>,
    pub done_s: Option<f64>,
    pub latency_ms: Option<f64>,
    pub uncorrected_ms: Option<f64>,
    pub send_lag_ms: Option<f64>,
    pub status: u16,
    pub bytes_out: usize,
    pub bytes_in: usize,
    /// Empty on success.
    pub error: String,
    pub call_id: String,
    pub queue_ms: Option<f64>,
    pub exec_ms: Option<f64>,
    pub cold_ms: Option<f64>,
}

impl Row {
    pub fn is_ok(&self) -> bool {
        self.error.is_empty()
    }
}

pub fn rows(cfg: &Config, arrivals: &[Arrival], outcomes: &[Outcome]) -> Vec<Row> {
    arrivals
        .iter()
        .zip(outcomes)
        .map(|(a, o)| {
            let s = |ns: u64| ns as f64 / 1e9;
            let ms = |from: u64, to: u64| to.saturating_sub(from) as f64 / 1e6;
            let r = o.response.as_ref();
            let error = match (o.transport_error, r.and_then(|r| r.error.as_deref())) {
                (Some(t), _) => t.to_string(),
                (None, Some(k)) => k.to_string(),
                (None, None) if r.is_none() => "timeout".to_string(),
                _ => String::new(),
            };
            let timing = r.and_then(|r| r.timing_us);
            let inst = &cfg.instances[a.instance as usize];
            Row {
                instance: a.instance as usize,
                application: inst.mix[a.app as usize].0.clone(),
                phase: a.phase as usize,
                warmup: a.warmup,
                scheduled_s: s(a.at_ns),
                sent_s: o.sent_ns.map(s),
                done_s: o.done_ns.map(s),
                latency_ms: r.and(o.done_ns).map(|d| ms(a.at_ns, d)),
                uncorrected_ms: r.and(o.sent_ns.zip(o.done_ns)).map(|(st, d)| ms(st, d)),
                send_lag_ms: o.sent_ns.map(|st| ms(a.at_ns, st)),
                status: r.map_or(0, |r| r.status),
                bytes_out: o.bytes_out,
                bytes_in: r.map_or(0, |r| r.bytes_in),
                error,
                call_id: r.and_then(|r| r.call_id.clone()).unwrap_or_default(),
                queue_ms: timing.map(|t| t[0] as f64 / 1e3),
                exec_ms: timing.map(|t| t[1] as f64 / 1e3),
                cold_ms: timing.map(|t| t[2] as f64 / 1e3),
            }
        })
        .collect()
}

/// Quotes a CSV field when it needs it (RFC 4180).
pub fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

fn opt(v: Option<f64>, decimals: usize) -> String {
    v.map_or(String::new(), |x| format!("{x:.decimals$}"))
}

pub fn write_requests(path: &Path, cfg: &Config, rows: &[Row]) -> std::io::Result<()> {
    let mut w = std::io::BufWriter::new(std::fs::File::create(path)?);
    writeln!(w, "{REQUESTS_HEADER}")?;
    for r in rows {
        writeln!(
            w,
            "{},{},{},{},{:.6},{},{},{},{},{},{},{},{},{},{},{},{},{}",
            csv_field(&cfg.instances[r.instance].name),
            csv_field(&r.application),
            r.phase,
            r.warmup,
            r.scheduled_s,
            opt(r.sent_s, 6),
            opt(r.done_s, 6),
            opt(r.latency_ms, 3),
            opt(r.uncorrected_ms, 3),
            opt(r.send_lag_ms, 3),
            r.status,
            r.bytes_out,
            r.bytes_in,
            csv_field(&r.error),
            csv_field(&r.call_id),
            opt(r.queue_ms, 3),
            opt(r.exec_ms, 3),
            opt(r.cold_ms, 3),
        )?;
    }
    w.flush()
}

/// Writes the engine traces that belong to this run: whose call id is one
/// of ours, or whose parent is (transitively), so nested internal calls
/// link to the requests. Returns the number of rows.
fn field(t: &Value, k: &str) -> String {
    t.get(k).map(|v| v.as_str().map_or(v.to_string(), str::to_string)).unwrap_or_default()
}

/// Which traces belong to this run: its requests' calls and, transitively,
/// the internal calls they made.
fn ours(traces: &[Value], rows: &[Row]) -> Vec<bool> {
    let mut ours: HashSet<String> = rows.iter().filter(|r| !r.call_id.is_empty()).map(|r| r.call_id.clone()).collect();
    let mut keep = vec![false; traces.len()];
    loop {
        let mut grew = false;
        for (i, t) in traces.iter().enumerate() {
            if !keep[i] && (ours.contains(&field(t, "call_id")) || ours.contains(&field(t, "parent_call_id"))) {
                keep[i] = true;
                grew |= ours.insert(field(t, "call_id"));
            }
        }
        if !grew {
            break;
        }
    }
    keep
}

/// CPU time per call by function, cold against warm, from the run's calls
/// whose runtime measured it (`staccato up --cpu-per-call`: C, C++ and
/// Python plain-def handlers, the handler's thread).
pub fn per_call_cpu(traces: &[Value], rows: &[Row]) -> Value {
    let keep = ours(traces, rows);
    let mut by: BTreeMap<String, [Vec<f64>; 2]> = BTreeMap::new();
    for (t, _) in traces.iter().zip(&keep).filter(|(_, k)| **k) {
        let Some(us) = t.get("cpu_us").and_then(Value::as_u64) else { continue };
        let cold = t.get("cold").and_then(Value::as_bool).unwrap_or(false);
        by.entry(field(t, "function")).or_default()[usize::from(cold)].push(us as f64);
    }
    if by.is_empty() {
        return json!({"available": false, "why": "no call of this run had its CPU time measured: start the engine \
                      with --cpu-per-call (C, C++ and Python plain-def handlers measure it)"});
    }
    let stats = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        if v.is_empty() {
            return Value::Null;
        }
        json!({"calls": v.len(), "mean_us": v.iter().sum::<f64>() / v.len() as f64,
               "p50_us": crate::stats::percentile(v, 50.0), "p99_us": crate::stats::percentile(v, 99.0)})
    };
    let functions: Map<String, Value> = by
        .into_iter()
        .map(|(f, [mut warm, mut cold])| (f, json!({"warm": stats(&mut warm), "cold": stats(&mut cold)})))
        .collect();
    json!({"available": true, "how": "each call's handler thread, measured by its runtime (--cpu-per-call)",
           "functions": functions})
}

pub fn write_invocations(path: &Path, traces: &[Value], rows: &[Row]) -> std::io::Result<usize> {
    let keep = ours(traces, rows);
    let mut w = std::io::BufWriter::new(std::fs::File::create(path)?);
    writeln!(w, "{INVOCATIONS_HEADER}")?;
    let mut n = 0;
    // The engine lists newest first; oldest first reads better.
    for (t, _) in traces.iter().zip(&keep).rev().filter(|(_, k)| **k) {
        let ns = |k: &str| t.get(k).and_then(Value::as_u64);
        let (rcv, dsp, cpl) = (ns("receive_ns"), ns("dispatch_ns"), ns("complete_ns"));
        let d_ms = |a: Option<u64>, b: Option<u64>| match (a, b) {
            (Some(a), Some(b)) if b >= a && a > 0 => format!("{:.3}", (b - a) as f64 / 1e6),
            _ => String::new(),
        };
        writeln!(
            w,
            "{},{},{},{},{},{},{},{},{},{},{}",
            csv_field(&field(t, "call_id")),
            csv_field(&field(t, "parent_call_id")),
            csv_field(&field(t, "function")),
            rcv.map_or(String::new(), |v| v.to_string()),
            dsp.map_or(String::new(), |v| v.to_string()),
            cpl.map_or(String::new(), |v| v.to_string()),
            d_ms(rcv, dsp),
            d_ms(dsp, cpl),
            csv_field(&field(t, "outcome")),
            t.get("cold").and_then(Value::as_bool).unwrap_or(false),
            t.get("cpu_us").and_then(Value::as_u64).map_or(String::new(), |v| v.to_string()),
        )?;
        n += 1;
    }
    w.flush()?;
    Ok(n)
}

/// summary.json: per instance, overall, per phase, and the SLO verdict.
pub fn summary(cfg: &Config, rows: &[Row]) -> Value {
    let measured: Vec<&Row> = rows.iter().filter(|r| !r.warmup).collect();
    let mut instances = Map::new();
    let mut total_offered = 0f64;
    let (mut t0, mut t1) = (f64::INFINITY, 0f64);
    for (i, inst) in cfg.instances.iter().enumerate() {
        let mine: Vec<&Row> = measured.iter().copied().filter(|r| r.instance == i).collect();
        let ws = phase_windows(cfg, inst);
        let active_s: f64 = ws.iter().map(|w| w.end_s - w.measured_start_s).sum();
        let offered = if inst.rates[0] > 0.0 {
            ws.iter().map(|w| w.rate * (w.end_s - w.measured_start_s)).sum::<f64>() / active_s.max(1e-9)
        } else {
            mine.len() as f64 / active_s.max(1e-9) // Trace: what the trace offers.
        };
        // An empty window (it sends nothing) adds no time to the span.
        for w in ws.iter().filter(|w| w.end_s > w.start_s) {
            t0 = t0.min(w.measured_start_s);
            t1 = t1.max(w.end_s);
        }
        total_offered += offered * active_s;
        instances.insert(inst.name.clone(), group_summary(&mine, offered, active_s));
    }
    // Overall rates are over the span where any instance was measured.
    let span_s = (t1 - t0).max(0.0);
    let overall_offered = if span_s > 0.0 { total_offered / span_s } else { 0.0 };
    let mut phases = Vec::new();
    for k in 0..cfg.phase_count() {
        let in_phase: Vec<&Row> = measured.iter().copied().filter(|r| r.phase == k).collect();
        let mut rate = 0f64;
        let mut active_s = 0f64;
        for inst in &cfg.instances {
            if let Some(w) = phase_windows(cfg, inst).into_iter().find(|w| w.phase == k) {
                rate += w.rate;
                active_s = active_s.max(w.end_s - w.measured_start_s);
            }
        }
        let g = group_summary(&in_phase, rate, active_s);
        let mut p = json!({
            "phase": k, "rate": rate, "p50_ms": g["latency_ms"]["p50"], "p99_ms": g["latency_ms"]["p99"],
            "achieved_rate": g["achieved_rate"], "count": g["count"], "ok": g["ok"], "errors": g["errors"],
        });
        if let Some(slo) = cfg.slo {
            let v = slo_latency_ms(&in_phase, slo.percentile);
            p["slo_latency_ms"] = json!(v.filter(|x| x.is_finite()));
            p["slo_met"] = json!(v.is_some_and(|x| x <= slo.max_ms));
        }
        phases.push(p);
    }
    let mut out = json!({
        "capacity_factor_definition": "achieved_rate / offered_rate, where achieved_rate is successful \
            (non-warmup) completions per second over the instance's measured active time",
        "latency_definition": "latency_ms is from the scheduled send time (no coordinated omission); \
            uncorrected_latency_ms from the actual send time; send_lag_ms is sent - scheduled; \
            percentiles are nearest-rank over successful, non-warmup requests (send lag: all sent)",
        "warmup_excluded": rows.len() - measured.len(),
        "overall": group_summary(&measured, overall_offered, span_s),
        "instances": instances,
        "phases": phases,
    });
    if let Some(slo) = cfg.slo {
        let best = out["phases"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|p| p["slo_met"] == json!(true))
            .filter_map(|p| p["rate"].as_f64())
            .fold(None, |m: Option<f64>, r| Some(m.map_or(r, |m| m.max(r))));
        out["slo"] = json!({
            "percentile": slo.percentile, "max_ms": slo.max_ms,
            "rule": "failed requests count as infinitely slow",
            "max_rate_meeting_slo": best,
        });
    }
    out
}
