//! The workload configuration: FaaSProfiler's JSON (paper 004, Listing 1)
//! read unchanged, plus optional extensions.
//!
//! The file is deserialized into the `File*` structs below, which list every
//! key known, and `validate` then checks what serde cannot (positive rates,
//! ...) and builds [`Config`]. JSON `null` means "not given" for every key,
//! and an integer is accepted wherever a number of seconds or a rate is.
//!
//! What FaaSProfiler itself accepts is accepted here, with a warning
//! ([`Config::warnings`]) where it is odd: an unknown key (FaaSProfiler
//! reads the keys it knows and ignores the rest; the warning names the key
//! and the known ones, so a typo still shows), no instances, a test name
//! that cannot name a directory (the run directory gets a cleaned one), an
//! activity window reaching past the test (cut at its end) or empty (no
//! requests), an `endpoint` it does not know, a `runtime_script` that is
//! not a string (FaaSProfiler skips it). What makes FaaSProfiler fail
//! (a negative rate, a window that is not two numbers, no application) is
//! an error here too.
//!
//! FaaSProfiler fields (Listing 1, its README, and the example configs in its
//! repository, including the ones of its generic endpoint and trace replay):
//! `test_name`, `test_duration_in_seconds`, `random_seed` (null: a random
//! seed, recorded in run.json), `blocking_cli` (accepted and recorded only:
//! this sender is always open-loop and never waits for a response before
//! sending the next request), `endpoint` (`"local_openwhisk"` or
//! `"generic"`, recorded only: an instance with a `url` is sent there, any
//! other to the gateway), `serverless_platform` (recorded only; FaaSProfiler
//! never reads it either), `instances` {name: {`application`,
//! `distribution` (`Poisson`, `Uniform`), `rate` (0: no requests),
//! `activity_window`, `interarrivals_list`, `data_file`, `param_file`, and the
//! generic endpoint's `url`, `data` (a JSON body) and `host` (sent as the
//! Host header)}}, `perf_monitoring` {`runtime_script`, `post_script`; an
//! empty string, like null, means none}.
//!
//! `interarrivals_list` replays inter-arrival times counted from the test's
//! start up to its end, as FaaSProfiler does; `distribution` is then not
//! needed (Poisson or Uniform are accepted and ignored, as there), and nor
//! is an `activity_window` (ignored with a warning: FaaSProfiler's event
//! generator applies windows to generated arrivals only). A body comes from
//! `data_file` (sent as `Content-Type: image/jpeg` unless `headers` say
//! otherwise, as FaaSProfiler sends it), else `param_file` (any JSON value),
//! else `data`.
//!
//! Extensions: top-level `base_url`, `warmup_in_seconds`, `pause_in_seconds`,
//! `slo`; per instance `method`, `headers`, `mix`, `rates`, and the
//! distributions `Constant`, `Bursty` (`on_seconds`, `off_seconds`) and
//! `Trace` (`trace_file`); `_comment` (ignored) at the top level and in an
//! instance, since JSON has no comments.
//!
//! Relative paths are relative to the configuration file's directory, or,
//! when nothing is there, to the working directory (FaaSProfiler opens them
//! from where it runs, its repository's root); a leading `~` expands to
//! $HOME.

use crate::Error;
use serde::de::{DeserializeOwned, IgnoredAny};
use serde::{Deserialize, Deserializer};
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone)]
pub struct Config {
    /// The JSON exactly as given, for run.json.
    pub raw: Value,
    pub dir: PathBuf,
    pub test_name: String,
    pub duration_s: f64,
    pub random_seed: Option<u64>,
    pub blocking_cli: bool,
    pub base_url: Option<String>,
    pub warmup_s: f64,
    pub pause_s: f64,
    pub instances: Vec<Instance>,
    pub runtime_script: Option<PathBuf>,
    pub post_script: Option<PathBuf>,
    pub slo: Option<Slo>,
    /// What was accepted but looks wrong, one sentence each (`bench run`
    /// prints them and keeps them in run.json).
    pub warnings: Vec<String>,
}

#[derive(Debug, Clone)]
pub struct Instance {
    pub name: String,
    /// (application, weight); one entry unless `mix` is given.
    pub mix: Vec<(String, f64)>,
    pub distribution: Distribution,
    /// One rate per phase: `[rate]`, or `rates` for a sweep.
    pub rates: Vec<f64>,
    /// Seconds relative to each phase's start.
    pub window: Option<(f64, f64)>,
    pub body: Body,
    pub url: Option<String>,
    pub method: String,
    /// Includes `Host` when the instance gives `host`.
    pub headers: Vec<(String, String)>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Distribution {
    Poisson,
    /// FaaSProfiler's "Uniform": spacing 1/rate after a random shift in [0, 1/rate).
    Uniform,
    /// Spacing exactly 1/rate from the window's start.
    Constant,
    /// Poisson at `rate` during `on_seconds`, silent for `off_seconds`, repeating.
    Bursty {
        on_s: f64,
        off_s: f64,
    },
    /// Inter-arrival times in seconds from the window's start (a `trace_file`,
    /// or an `interarrivals_list` re-based on the window).
    Trace {
        inter_arrivals_s: Vec<f64>,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub enum Body {
    Empty,
    Bytes(Vec<u8>),
    Json(Vec<u8>),
    /// `bodies_file`: one JSON body per line, sent in turn.
    Lines(Vec<Vec<u8>>),
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Slo {
    pub percentile: f64,
    pub max_ms: f64,
}

// The file as written. Every field is an Option even where `validate`
// requires it: the rule then gets a message of its own, and `blame` relies
// on any single key being deserializable alone.

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    test_name: Option<String>,
    test_duration_in_seconds: Option<f64>,
    random_seed: Option<u64>,
    blocking_cli: Option<bool>,
    // Recorded (in `raw`), and checked only to warn.
    endpoint: Option<String>,
    #[serde(rename = "serverless_platform")]
    _serverless_platform: Option<IgnoredAny>,
    // Sorted by name, which is the order instances have always had.
    instances: Option<BTreeMap<String, Obj<FileInstance>>>,
    perf_monitoring: Option<Obj<FilePerfMonitoring>>,
    base_url: Option<String>,
    warmup_in_seconds: Option<f64>,
    pause_in_seconds: Option<f64>,
    slo: Option<Obj<FileSlo>>,
    #[serde(rename = "_comment")]
    _comment: Option<IgnoredAny>,
}

/// The `endpoint`s FaaSProfiler knows; recorded only here.
const ENDPOINTS: [&str; 2] = ["local_openwhisk", "generic"];

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileInstance {
    application: Option<String>,
    distribution: Option<DistributionName>,
    rate: Option<f64>,
    activity_window: Option<[f64; 2]>,
    interarrivals_list: Option<Vec<f64>>,
    data_file: Option<String>,
    param_file: Option<String>,
    url: Option<String>,
    data: Option<Value>,
    host: Option<String>,
    mix: Option<Vec<Obj<FileMixItem>>>,
    rates: Option<Vec<f64>>,
    method: Option<String>,
    headers: Option<BTreeMap<String, String>>,
    on_seconds: Option<f64>,
    off_seconds: Option<f64>,
    trace_file: Option<String>,
    bodies_file: Option<String>,
    #[serde(rename = "_comment")]
    _comment: Option<IgnoredAny>,
}

#[derive(Deserialize, Clone, Copy)]
enum DistributionName {
    Poisson,
    Uniform,
    Constant,
    Bursty,
    Trace,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileMixItem {
    application: Option<String>,
    weight: Option<f64>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct FilePerfMonitoring {
    // Any value: FaaSProfiler runs it only if it is a true string.
    runtime_script: Option<Value>,
    post_script: Option<Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileSlo {
    percentile: Option<f64>,
    max_ms: Option<f64>,
}

/// A struct from a JSON object only: serde's derive would also take an
/// array of the field values in order, which nobody writes on purpose.
struct Obj<T>(T);

impl<'de, T: DeserializeOwned> Deserialize<'de> for Obj<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let m = Map::<String, Value>::deserialize(d)?;
        T::deserialize(Value::Object(m)).map(Obj).map_err(serde::de::Error::custom)
    }
}

impl Config {
    pub fn load(path: &Path) -> Result<Config, Error> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::Io(format!("reading {}", path.display()), e))?;
        let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
        let dir = if dir.as_os_str().is_empty() { PathBuf::from(".") } else { dir };
        Config::parse(&text, &dir)
    }

    /// Parses and validates; files named in the config are read from `dir`.
    pub fn parse(text: &str, dir: &Path) -> Result<Config, Error> {
        let raw: Value = serde_json::from_str(text).map_err(|e| cfg(&format!("not valid JSON: {e}")))?;
        if !raw.is_object() {
            return Err(cfg("the configuration must be a JSON object"));
        }
        let (file, warnings): (FileConfig, _) = lenient(&raw)?;
        match file.validate(raw, dir) {
            Ok(mut c) => {
                c.warnings.splice(0..0, warnings);
                Ok(c)
            }
            // A key left out may be why: say so beside the error.
            Err(Error::Config(m)) if !warnings.is_empty() => {
                Err(Error::Config(format!("{m} (and: {})", warnings.join("; "))))
            }
            Err(e) => Err(e),
        }
    }

    /// `test_name` as a directory name: `/` and NUL become `_`; an empty
    /// name, `.` or `..` become `test`.
    pub fn dir_name(&self) -> String {
        dir_name(&self.test_name)
    }

    /// Phases in the test: the longest `rates` list (1 without sweeps).
    pub fn phase_count(&self) -> usize {
        self.instances.iter().map(|i| i.rates.len()).max().unwrap_or(1)
    }

    /// Start of phase `k`, in seconds from the test's start.
    pub fn phase_start_s(&self, k: usize) -> f64 {
        k as f64 * (self.duration_s + self.pause_s)
    }

    /// The whole test: every phase and the pauses between them.
    pub fn total_duration_s(&self) -> f64 {
        let n = self.phase_count();
        n as f64 * self.duration_s + (n - 1) as f64 * self.pause_s
    }
}

impl FileConfig {
    fn validate(self, raw: Value, dir: &Path) -> Result<Config, Error> {
        // Spelled out so that a key added to FileConfig must be handled here.
        let FileConfig {
            test_name,
            test_duration_in_seconds,
            random_seed,
            blocking_cli,
            endpoint,
            _serverless_platform,
            instances,
            perf_monitoring,
            base_url,
            warmup_in_seconds,
            pause_in_seconds,
            slo,
            _comment,
        } = self;
        let mut warnings = Vec::new();
        let test_name = test_name.ok_or_else(|| cfg("test_name is required"))?;
        if dir_name(&test_name) != test_name {
            warnings.push(format!(
                "test_name {test_name:?} cannot name a directory: the run directory is named {:?}",
                dir_name(&test_name)
            ));
        }
        if let Some(e) = endpoint.filter(|e| !ENDPOINTS.contains(&e.as_str())) {
            warnings.push(format!(
                "endpoint {e:?} is not one FaaSProfiler knows ({}); requests go to each instance's url or the gateway as always",
                ENDPOINTS.join(", ")
            ));
        }
        let duration = test_duration_in_seconds.ok_or_else(|| cfg("test_duration_in_seconds is required"))?;
        let duration_s = positive(duration, "test_duration_in_seconds")?;
        let warmup_s = non_negative(warmup_in_seconds, "warmup_in_seconds")?;
        let pause_s = non_negative(pause_in_seconds, "pause_in_seconds")?;
        let instances = validate_instances(instances, dir, duration_s, &mut warnings)?;
        let perf = perf_monitoring.map(|p| p.0).unwrap_or_default();
        let slo = slo.map(|s| s.0.validate()).transpose()?;
        let runtime_script = script(perf.runtime_script, "runtime_script", dir, &mut warnings);
        let post_script = script(perf.post_script, "post_script", dir, &mut warnings);
        Ok(Config {
            raw,
            dir: dir.to_path_buf(),
            test_name,
            duration_s,
            random_seed,
            blocking_cli: blocking_cli.unwrap_or(false),
            base_url,
            warmup_s,
            pause_s,
            instances,
            runtime_script,
            post_script,
            slo,
            warnings,
        })
    }
}

fn dir_name(name: &str) -> String {
    match name {
        "" | "." | ".." => "test".into(),
        _ => name.replace(['/', '\0'], "_"),
    }
}

fn validate_instances(
    instances: Option<BTreeMap<String, Obj<FileInstance>>>,
    dir: &Path,
    duration_s: f64,
    warnings: &mut Vec<String>,
) -> Result<Vec<Instance>, Error> {
    let instances = instances.ok_or_else(|| cfg("instances (an object of named instances) is required"))?;
    if instances.is_empty() {
        warnings.push("instances is empty: the test sends no requests".into());
    }
    instances
        .into_iter()
        .map(|(name, i)| {
            let mut mine = Vec::new();
            let r = i.0.validate(&name, dir, duration_s, &mut mine).map_err(|e| within(&format!("instance {name}"), e));
            warnings.extend(mine.into_iter().map(|w| format!("instance {name}: {w}")));
            r
        })
        .collect()
}

/// FaaSProfiler runs a script only when the field is a true string ("",
/// null, false are none); anything else it skips (a bare `except`).
fn script(v: Option<Value>, key: &str, dir: &Path, warnings: &mut Vec<String>) -> Option<PathBuf> {
    match v {
        Some(Value::String(p)) if !p.is_empty() => Some(resolve(dir, &p)),
        None | Some(Value::Null | Value::Bool(false)) | Some(Value::String(_)) => None,
        Some(other) => {
            warnings.push(format!("perf_monitoring.{key} is {other}, not a script path: not run"));
            None
        }
    }
}

impl FileSlo {
    fn validate(self) -> Result<Slo, Error> {
        let percentile = self.percentile.unwrap_or(99.0);
        if !(0.0..=100.0).contains(&percentile) {
            return Err(cfg("slo.percentile must be in [0, 100]"));
        }
        let max_ms = positive(self.max_ms.ok_or_else(|| cfg("slo.max_ms is required"))?, "slo.max_ms")?;
        Ok(Slo { percentile, max_ms })
    }
}

// Instance rules. `validate_instances` prefixes errors with the instance's name.
impl FileInstance {
    fn validate(self, name: &str, dir: &Path, duration_s: f64, warnings: &mut Vec<String>) -> Result<Instance, Error> {
        let mix = self.mix()?;
        let window = self.window(duration_s, warnings)?;
        let distribution = self.distribution(dir)?;
        let rates = self.rates(matches!(distribution, Distribution::Trace { .. }))?;
        let body = self.body(dir)?;
        let method = self.method()?;
        let mut headers = self.headers()?;
        if self.data_file.is_some() && self.bodies_file.is_none() && !has_header(&headers, "content-type") {
            headers.push(("Content-Type".into(), "image/jpeg".into()));
        }
        Ok(Instance { name: name.into(), mix, distribution, rates, window, body, url: self.url, method, headers })
    }

    fn mix(&self) -> Result<Vec<(String, f64)>, Error> {
        match (&self.application, &self.mix) {
            (Some(a), None) => Ok(vec![(a.clone(), 1.0)]),
            (None, Some(items)) => validate_mix(items),
            (Some(_), Some(_)) => Err(cfg("give either application or mix, not both")),
            (None, None) => Err(cfg("application (a function name) or mix is required")),
        }
    }

    /// The window inside the test. FaaSProfiler keeps the generated
    /// arrivals between start and end, whatever those are, and applies no
    /// window to an `interarrivals_list`.
    fn window(&self, duration_s: f64, warnings: &mut Vec<String>) -> Result<Option<(f64, f64)>, Error> {
        let Some([a, b]) = self.activity_window else { return Ok(None) };
        if !(a.is_finite() && b.is_finite()) {
            return Err(cfg("activity_window must be [start, end] in seconds"));
        }
        if self.interarrivals_list.is_some() {
            warnings.push("activity_window is ignored next to interarrivals_list (as FaaSProfiler does)".into());
            return Ok(None);
        }
        let (start, end) = (a.max(0.0), b.min(duration_s));
        if start >= end {
            warnings.push(format!(
                "activity_window [{a}, {b}] holds no time of the {duration_s} s test: this instance sends no requests"
            ));
            return Ok(Some((0.0, 0.0)));
        }
        if (start, end) != (a, b) {
            warnings.push(format!("activity_window [{a}, {b}] reaches outside the test: cut to [{start}, {end}]"));
        }
        Ok(Some((start, end)))
    }

    fn distribution(&self, dir: &Path) -> Result<Distribution, Error> {
        if let Some(list) = &self.interarrivals_list {
            return self.inline_trace(list);
        }
        let name = self.distribution.ok_or_else(|| {
            cfg("distribution (Poisson, Uniform, Constant, Bursty, Trace) or interarrivals_list is required")
        })?;
        Ok(match name {
            DistributionName::Poisson => Distribution::Poisson,
            DistributionName::Uniform => Distribution::Uniform,
            DistributionName::Constant => Distribution::Constant,
            DistributionName::Bursty => Distribution::Bursty {
                on_s: positive(self.on_seconds.ok_or_else(|| cfg("Bursty needs on_seconds"))?, "on_seconds")?,
                off_s: non_negative(self.off_seconds, "off_seconds")?,
            },
            DistributionName::Trace => {
                let f = self.trace_file.as_deref().ok_or_else(|| cfg("Trace needs trace_file"))?;
                Distribution::Trace { inter_arrivals_s: read_trace(&resolve(dir, f))? }
            }
        })
    }

    fn inline_trace(&self, list: &[f64]) -> Result<Distribution, Error> {
        // FaaSProfiler's checker allows only these two next to a list, and
        // its generator then ignores them.
        if !matches!(self.distribution, None | Some(DistributionName::Poisson | DistributionName::Uniform)) {
            return Err(cfg("interarrivals_list replaces distribution: give one of them"));
        }
        if !list.iter().all(|x| x.is_finite() && *x >= 0.0) {
            return Err(cfg("interarrivals_list must hold non-negative numbers of seconds"));
        }
        Ok(Distribution::Trace { inter_arrivals_s: list.to_vec() })
    }

    fn rates(&self, trace: bool) -> Result<Vec<f64>, Error> {
        // A sweep's `rates` wins over `rate` when both are given.
        if let Some(rs) = &self.rates {
            if rs.is_empty() || !rs.iter().all(|r| r.is_finite() && *r > 0.0) {
                return Err(cfg("rates must be a non-empty list of positive numbers"));
            }
            return Ok(rs.clone());
        }
        match self.rate {
            // FaaSProfiler documents rate 0 as "no invocations".
            Some(r) => Ok(vec![non_negative(Some(r), "rate")?]),
            // A trace's own times set its rate; 0 is what the records show.
            None if trace => Ok(vec![0.0]),
            None => Err(cfg("rate (requests per second) is required")),
        }
    }

    fn body(&self, dir: &Path) -> Result<Body, Error> {
        if let Some(f) = &self.bodies_file {
            if self.data_file.is_some() || self.param_file.is_some() || self.data.is_some() {
                return Err(cfg("bodies_file cannot be combined with data_file, param_file or data"));
            }
            return read_bodies_file(&resolve(dir, f));
        }
        if let Some(f) = &self.data_file {
            let p = resolve(dir, f);
            return std::fs::read(&p)
                .map(Body::Bytes)
                .map_err(|e| Error::Config(format!("data_file {}: {e}", p.display())));
        }
        if let Some(f) = &self.param_file {
            return read_param_file(&resolve(dir, f));
        }
        match &self.data {
            Some(d) => serde_json::to_vec(d).map(Body::Json).map_err(|e| Error::Config(format!("data: {e}"))),
            None => Ok(Body::Empty),
        }
    }

    fn method(&self) -> Result<String, Error> {
        let method = self.method.as_deref().unwrap_or("POST").to_ascii_uppercase();
        if method.is_empty() || !method.bytes().all(|b| b.is_ascii_uppercase()) {
            return Err(cfg("method must be an HTTP method name"));
        }
        Ok(method)
    }

    /// `headers` in name order, then `host` as the Host header.
    fn headers(&self) -> Result<Vec<(String, String)>, Error> {
        let mut out = Vec::new();
        for (k, v) in self.headers.iter().flatten() {
            // Each becomes one line of the request head.
            if v.contains(['\r', '\n']) || k.contains([':', '\r', '\n']) {
                return Err(Error::Config(format!("header {k:?} must be a single-line string")));
            }
            out.push((k.clone(), v.clone()));
        }
        if let Some(h) = &self.host {
            if h.contains(['\r', '\n']) {
                return Err(cfg("host must be a single-line string"));
            }
            if has_header(&out, "host") {
                return Err(cfg("give either host or a Host header, not both"));
            }
            out.push(("Host".into(), h.clone()));
        }
        Ok(out)
    }
}

fn validate_mix(items: &[Obj<FileMixItem>]) -> Result<Vec<(String, f64)>, Error> {
    let mut mix = Vec::new();
    for Obj(it) in items {
        match (&it.application, it.weight.unwrap_or(1.0)) {
            (Some(a), w) if w > 0.0 && w.is_finite() => mix.push((a.clone(), w)),
            _ => return Err(cfg("mix items must be {\"application\": name, \"weight\": positive number}")),
        }
    }
    if mix.is_empty() {
        return Err(cfg("mix is empty"));
    }
    Ok(mix)
}

fn has_header(headers: &[(String, String)], name: &str) -> bool {
    headers.iter().any(|(k, _)| k.eq_ignore_ascii_case(name))
}

/// Most lines a `bodies_file` may have (each becomes a prebuilt request).
pub const BODIES_MAX: usize = 1_000_000;

/// A `bodies_file`: one JSON value per line (blank lines skipped); the
/// requests of an instance take them in turn, the k-th request line
/// k mod n, so a seeded generator's requests are sent in its order.
fn read_bodies_file(p: &Path) -> Result<Body, Error> {
    let err = |m: String| Error::Config(format!("bodies_file {}: {m}", p.display()));
    let text = std::fs::read_to_string(p).map_err(|e| err(e.to_string()))?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        if let Err(e) = serde_json::from_str::<serde::de::IgnoredAny>(line) {
            return Err(err(format!("line {}: not JSON: {e}", i + 1)));
        }
        if out.len() == BODIES_MAX {
            return Err(err(format!("more than {BODIES_MAX} bodies")));
        }
        out.push(line.as_bytes().to_vec());
    }
    if out.is_empty() {
        return Err(err("no bodies (one JSON value per line)".into()));
    }
    Ok(Body::Lines(out))
}

/// Any JSON value, sent as it is (FaaSProfiler loads it and sends it back
/// as JSON).
fn read_param_file(p: &Path) -> Result<Body, Error> {
    let text = std::fs::read(p).map_err(|e| Error::Config(format!("param_file {}: {e}", p.display())))?;
    match serde_json::from_slice::<IgnoredAny>(&text) {
        Ok(_) => Ok(Body::Json(text)),
        Err(e) => Err(Error::Config(format!("param_file {} is not JSON: {e}", p.display()))),
    }
}

fn read_trace(p: &Path) -> Result<Vec<f64>, Error> {
    let text = std::fs::read_to_string(p).map_err(|e| Error::Config(format!("trace_file {}: {e}", p.display())))?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        match line.parse::<f64>() {
            Ok(x) if x >= 0.0 && x.is_finite() => out.push(x),
            _ => {
                return Err(Error::Config(format!(
                    "trace_file {} line {}: {line:?} is not a non-negative number",
                    p.display(),
                    i + 1
                )))
            }
        }
    }
    Ok(out)
}

/// `~` expands to $HOME; a relative path is the config directory's, or
/// the working directory's when only that one exists (where FaaSProfiler
/// would open it).
pub fn resolve(dir: &Path, p: &str) -> PathBuf {
    if let Some(rest) = p.strip_prefix("~/").or(if p == "~" { Some("") } else { None }) {
        if let Some(home) = std::env::var_os("HOME") {
            return PathBuf::from(home).join(rest);
        }
    }
    let p = Path::new(p);
    if p.is_absolute() {
        return p.to_path_buf();
    }
    let beside = dir.join(p);
    if !beside.exists() && p.exists() {
        return std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
    }
    beside
}

fn cfg(msg: &str) -> Error {
    Error::Config(msg.to_string())
}

/// A configuration error with where it was found in front: `instance a: …`.
fn within(at: &str, e: Error) -> Error {
    match e {
        Error::Config(m) => Error::Config(format!("{at}: {m}")),
        other => other,
    }
}

fn positive(x: f64, what: &str) -> Result<f64, Error> {
    if x > 0.0 && x.is_finite() {
        Ok(x)
    } else {
        Err(Error::Config(format!("{what} must be a positive number")))
    }
}

/// Not given is 0.
fn non_negative(x: Option<f64>, what: &str) -> Result<f64, Error> {
    match x {
        None => Ok(0.0),
        Some(x) if x >= 0.0 && x.is_finite() => Ok(x),
        Some(_) => Err(Error::Config(format!("{what} must be a non-negative number"))),
    }
}

/// The document as `T`, unknown keys left out with a warning each (found
/// one at a time, as serde reports them; a key inside a list, as in `mix`,
/// stays an error). Other faults are errors that name the key.
fn lenient<T: DeserializeOwned>(doc: &Value) -> Result<(T, Vec<String>), Error> {
    let mut doc = doc.clone();
    let mut warnings = Vec::new();
    loop {
        let e = match T::deserialize(&doc) {
            Ok(t) => return Ok((t, warnings)),
            Err(e) => e,
        };
        let mut path = Vec::new();
        let msg = blame::<T>(&doc, &|v| v, &mut path).unwrap_or(e).to_string();
        let unknown = msg.strip_prefix("unknown field `").and_then(|m| m.split('`').next());
        // The key at the end of the path is the unknown one only if that
        // level does not know it: an unknown key of a list item (which
        // `blame` does not descend into) can share a known key's name.
        let known_here = T::deserialize(nest(&path, Value::Null)).is_ok();
        if unknown.is_some() && unknown == path.last().map(String::as_str) && !known_here && remove_at(&mut doc, &path)
        {
            warnings.push(format!("{}; ignored, as FaaSProfiler ignores keys it does not know", describe(&path, &msg)));
            continue;
        }
        return Err(cfg(&describe(&path, &msg)));
    }
}

/// `{p0: {p1: ... {pn: leaf}}}`.
fn nest(path: &[String], leaf: Value) -> Value {
    path.iter().rev().fold(leaf, |inner, k| Value::Object(Map::from_iter([(k.clone(), inner)])))
}

/// Removes the key at `path` (object keys from the top); whether it was there.
fn remove_at(doc: &mut Value, path: &[String]) -> bool {
    let Some((last, parents)) = path.split_last() else { return false };
    let mut at = doc;
    for k in parents {
        match at.get_mut(k) {
            Some(v) => at = v,
            None => return false,
        }
    }
    at.as_object_mut().is_some_and(|m| m.remove(last).is_some())
}

/// serde names an unknown key but not the key whose value has the wrong
/// type. Every field of the `File*` structs is optional, so a document
/// holding only the path down to one key fails exactly when that key is at
/// fault: try each key alone (`wrap` rebuilds the path above it) and
/// descend into the one that fails. Pushes the keys of its path.
fn blame<T: DeserializeOwned>(
    v: &Value,
    wrap: &dyn Fn(Value) -> Value,
    path: &mut Vec<String>,
) -> Option<serde_json::Error> {
    let Value::Object(m) = v else { return None };
    for (k, sub) in m {
        let alone = |inner: Value| wrap(Value::Object(Map::from_iter([(k.clone(), inner)])));
        let Err(e) = T::deserialize(alone(sub.clone())) else { continue };
        path.push(k.clone());
        // Only where an object is welcome can the fault be deeper; else this
        // value is the wrong type as a whole.
        if T::deserialize(alone(Value::Object(Map::new()))).is_ok() {
            if let Some(inner) = blame::<T>(sub, &alone, path) {
                return Some(inner);
            }
        }
        return Some(e);
    }
    None
}

/// `instance a: rate: invalid type ...`; an unknown key, which serde's
/// message names already, is reported at its parent.
fn describe(path: &[String], msg: &str) -> String {
    let path = match path.split_last() {
        Some((last, parent)) if msg.starts_with(&format!("unknown field `{last}`")) => parent,
        _ => path,
    };
    let (head, rest) = match path {
        [top, name, rest @ ..] if top == "instances" => (format!("instance {name}: "), rest),
        _ => (String::new(), path),
    };
    if rest.is_empty() {
        format!("{head}{msg}")
    } else {
        format!("{head}{}: {msg}", rest.join("."))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub const LISTING_1: &str = r#"{
  "test_name": "sample_test",
  "test_duration_in_seconds": 25,
  "random_seed": 110,
  "blocking_cli": false,
  "instances": {
    "instance0": {
      "application": "function0",
      "distribution": "Poisson",
      "rate": 20,
      "activity_window": [5, 20]
    },
    "instance1": {
      "application": "function0",
      "distribution": "Uniform",
      "rate": 100,
      "activity_window": [10, 15]
    },
    "instance2": {
      "application": "function1",
      "data_file": "~/image.jpg",
      "distribution": "Poisson",
      "rate": 15,
      "activity_window": [1, 24]
    }
  },
  "perf_monitoring": {
    "runtime_script": "MonitoringScript.sh"
  }
}"#;

    fn tmpdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("loadgen-cfg-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn listing_1_parses_verbatim() {
        let home = tmpdir("home");
        std::fs::write(home.join("image.jpg"), b"\xff\xd8jpeg").unwrap();
        std::env::set_var("HOME", &home);
        let c = Config::parse(LISTING_1, Path::new("/cfgdir")).unwrap();
        assert_eq!(c.test_name, "sample_test");
        assert_eq!(c.duration_s, 25.0);
        assert_eq!(c.random_seed, Some(110));
        assert_eq!(c.instances.len(), 3);
        let i2 = c.instances.iter().find(|i| i.name == "instance2").unwrap();
        assert_eq!(i2.body, Body::Bytes(b"\xff\xd8jpeg".to_vec()));
        assert_eq!(i2.window, Some((1.0, 24.0)));
        let i1 = c.instances.iter().find(|i| i.name == "instance1").unwrap();
        assert_eq!(i1.distribution, Distribution::Uniform);
        assert_eq!(i1.rates, vec![100.0]);
        assert_eq!(c.runtime_script, Some(PathBuf::from("/cfgdir/MonitoringScript.sh")));
        assert_eq!(c.phase_count(), 1);
        assert_eq!(c.raw["instances"]["instance0"]["rate"], 20);
    }

    #[test]
    fn null_window_and_seed() {
        let c = Config::parse(
            r#"{"test_name":"t","test_duration_in_seconds":2,"random_seed":null,
                "instances":{"a":{"application":"f","distribution":"Poisson","rate":5,"activity_window":null}}}"#,
            Path::new("."),
        )
        .unwrap();
        assert_eq!(c.random_seed, None);
        assert_eq!(c.instances[0].window, None);
        assert_eq!(c.instances[0].body, Body::Empty);
    }

    #[test]
    fn extensions_parse() {
        let d = tmpdir("ext");
        std::fs::write(d.join("trace.txt"), "0.1\n# comment\n0.2\n\n0.3\n").unwrap();
        std::fs::write(d.join("p.json"), r#"{"n": 1}"#).unwrap();
        let c = Config::parse(
            r#"{"test_name":"t","test_duration_in_seconds":2,"pause_in_seconds":1,"warmup_in_seconds":0.5,
                "slo":{"percentile":99,"max_ms":5},
                "instances":{
                  "a":{"mix":[{"application":"f","weight":3},{"application":"g","weight":1}],
                       "distribution":"Constant","rates":[10,20,30],"param_file":"p.json",
                       "method":"get","headers":{"x-a":"b"}},
                  "b":{"application":"h","distribution":"Trace","trace_file":"trace.txt"},
                  "c":{"application":"h","distribution":"Bursty","rate":100,"on_seconds":0.1,"off_seconds":0.4}}}"#,
            &d,
        )
        .unwrap();
        assert_eq!(c.phase_count(), 3);
        assert_eq!(c.total_duration_s(), 8.0);
        assert_eq!(c.slo, Some(Slo { percentile: 99.0, max_ms: 5.0 }));
        let a = &c.instances[0];
        assert_eq!(a.mix, vec![("f".into(), 3.0), ("g".into(), 1.0)]);
        assert_eq!(a.method, "GET");
        assert_eq!(a.body, Body::Json(br#"{"n": 1}"#.to_vec()));
        assert_eq!(c.instances[1].distribution, Distribution::Trace { inter_arrivals_s: vec![0.1, 0.2, 0.3] });
        assert_eq!(c.instances[2].distribution, Distribution::Bursty { on_s: 0.1, off_s: 0.4 });
    }

    fn parse_err(text: &str) -> String {
        Config::parse(text, Path::new("/nonexistent")).unwrap_err().to_string()
    }

    #[test]
    fn invalid_configs_say_what_is_wrong() {
        let base =
            |inst: &str| format!(r#"{{"test_name":"t","test_duration_in_seconds":10,"instances":{{"a":{inst}}}}}"#);
        assert!(parse_err("{").contains("not valid JSON"));
        assert!(parse_err(r#"{"test_duration_in_seconds":1,"instances":{}}"#).contains("test_name is required"));
        assert!(parse_err(r#"{"test_name":"t","instances":{}}"#).contains("test_duration_in_seconds"));
        assert!(parse_err(&base(r#"{"application":"f","distribution":"Gauss","rate":1}"#))
            .contains("instance a: distribution: unknown variant `Gauss`, expected one of `Poisson`, `Uniform`"));
        assert!(parse_err(&base(r#"{"application":"f","distribution":"Poisson"}"#)).contains("rate"));
        assert!(parse_err(&base(r#"{"application":"f","distribution":"Poisson","rate":-1}"#))
            .contains("instance a: rate must be a non-negative number"));
        assert!(parse_err(&base(r#"{"distribution":"Poisson","rate":1}"#)).contains("application"));
        assert!(parse_err(&base(r#"{"application":"f","distribution":"Poisson","rate":1,"data_file":"nope.bin"}"#))
            .contains("instance a: data_file /nonexistent/nope.bin"));
    }

    fn warnings(text: &str) -> Vec<String> {
        Config::parse(text, Path::new("/nonexistent")).unwrap().warnings
    }

    /// FaaSProfiler ignores keys it does not know: so does this, but each
    /// is named in a warning with the keys known there, so a typo shows.
    #[test]
    fn unknown_keys_are_named_and_ignored() {
        let inst = r#""instances":{"a":{"application":"f","distribution":"Poisson","rate":1}}"#;
        let w = warnings(&format!(r#"{{"test_name":"t","test_duration_in_seconds":10,"owner":"me",{inst}}}"#));
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].starts_with("unknown field `owner`, expected one of `test_name`, `test_duration_in_seconds`"),
            "{w:?}"
        );
        assert!(w[0].ends_with("ignored, as FaaSProfiler ignores keys it does not know"), "{w:?}");
        let w = warnings(
            r#"{"test_name":"t","test_duration_in_seconds":10,"instances":{"a":{"application":"f","distribution":"Poisson","rate":1,"rats":1,"note":"x"}}}"#,
        );
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(
            w.iter().any(|w| w
                .contains("instance a: unknown field `rats`, expected one of `application`, `distribution`, `rate`")),
            "{w:?}"
        );
        let w = warnings(&format!(
            r#"{{"test_name":"t","test_duration_in_seconds":10,"perf_monitoring":{{"runtime_scirpt":"m.sh"}},{inst}}}"#
        ));
        assert!(
            w[0].contains(
                "perf_monitoring: unknown field `runtime_scirpt`, expected `runtime_script` or `post_script`"
            ),
            "{w:?}"
        );
        let w = warnings(&format!(
            r#"{{"test_name":"t","test_duration_in_seconds":10,"slo":{{"p":99,"max_ms":5}},{inst}}}"#
        ));
        assert!(w[0].contains("slo: unknown field `p`, expected `percentile` or `max_ms`"), "{w:?}");
        // A required key misspelled: the error says which key was left out.
        let e = parse_err(&format!(r#"{{"test_name":"t","test_duraton_in_seconds":10,{inst}}}"#));
        assert!(
            e.contains("test_duration_in_seconds is required (and: unknown field `test_duraton_in_seconds`"),
            "{e}"
        );
        // An unknown key named like a known one, inside a list item: an
        // error, and the instance's own `mix` is not taken for it.
        let e = parse_err(
            r#"{"test_name":"t","test_duration_in_seconds":10,
                "instances":{"a":{"mix":[{"application":"f","mix":2}],"distribution":"Poisson","rate":1}}}"#,
        );
        assert!(e.contains("unknown field `mix`, expected `application` or `weight`"), "{e}");
        // Inside a list (`mix`, an extension) an unknown key stays an error.
        let e = parse_err(
            r#"{"test_name":"t","test_duration_in_seconds":10,
                "instances":{"a":{"mix":[{"application":"f","wieght":2}],"distribution":"Poisson","rate":1}}}"#,
        );
        assert!(e.contains("instance a: mix: unknown field `wieght`, expected `application` or `weight`"), "{e}");
    }

    #[test]
    fn wrong_types_name_the_field() {
        let base =
            |inst: &str| format!(r#"{{"test_name":"t","test_duration_in_seconds":10,"instances":{{"a":{inst}}}}}"#);
        let e = parse_err(&base(r#"{"application":"f","distribution":"Poisson","rate":"fast"}"#));
        assert!(e.contains(r#"instance a: rate: invalid type: string "fast", expected f64"#), "{e}");
        let e = parse_err(&base(r#"{"application":"f","distribution":"Poisson","rate":1,"headers":{"x":5}}"#));
        assert!(e.contains("instance a: headers.x: invalid type: integer `5`, expected a string"), "{e}");
        let e = parse_err(&base(r#"{"application":"f","distribution":"Poisson","rate":1,"activity_window":[1,2,3]}"#));
        assert!(e.contains("instance a: activity_window: invalid length 3"), "{e}");
        let e = parse_err(&base(r#"{"application":"f","distribution":"Poisson","rate":{"x":1}}"#));
        assert!(e.contains("instance a: rate: invalid type: map, expected f64"), "{e}");
        let e = parse_err(&base(r#"["f"]"#));
        assert!(e.contains("instance a: invalid type: sequence, expected a map"), "{e}");
        let e = parse_err(r#"{"test_name":"t","test_duration_in_seconds":10,"random_seed":-1,"instances":{}}"#);
        assert!(e.contains("random_seed: invalid value: integer `-1`, expected u64"), "{e}");
        let e = parse_err(r#"{"test_name":"t","test_duration_in_seconds":10,"endpoint":5,"instances":{}}"#);
        assert!(e.contains("endpoint: invalid type: integer `5`, expected a string"), "{e}");
        assert!(parse_err("[1]").contains("the configuration must be a JSON object"));
        // serde's derive would take a struct as an array of its fields in order.
        let e = parse_err(r#"{"test_name":"t","test_duration_in_seconds":10,"slo":[99,5],"instances":{}}"#);
        assert!(e.contains("slo: invalid type: sequence, expected a map"), "{e}");
        let e = parse_err(&base(r#"{"mix":[["f",2]],"distribution":"Poisson","rate":1}"#));
        assert!(e.contains("instance a: mix: invalid type: sequence, expected a map"), "{e}");
    }

    fn instance<'a>(c: &'a Config, name: &str) -> &'a Instance {
        c.instances.iter().find(|i| i.name == name).unwrap()
    }

    /// The shapes of the example configs in FaaSProfiler's repository
    /// (PrincetonUniversity/faas-profiler): workload_configs.json (2019, with
    /// a window next to a list), workload_configs_local_openwhisk.json and
    /// tests/test_data/sample_workload_configs.json (the same instances),
    /// workload_configs_generic_endpoint.json, tests/test_data/
    /// stress_test_workload.json, tests/test_data/test_data_run_config.json,
    /// workload_config_IAT_rep.json and workload_configs_IAT_rpc_2.json (trace
    /// replay with `serverless_platform` and `host`), and the instances
    /// scalability_experiments/code/scalability_json_generator.py writes.
    #[test]
    fn faasprofiler_example_shapes_parse() {
        let d = tmpdir("fp");
        std::fs::write(d.join("param_file.json"), r#"{"n": 30}"#).unwrap();
        let perf = r#""perf_monitoring":{"runtime_script":"monitoring/RuntimeMonitoring.sh","post_script":null}"#;
        let openwhisk = |endpoint: &str, window3: &str| {
            format!(
                r#"{{"test_name":"example_test","test_duration_in_seconds":15,"random_seed":100,"blocking_cli":false,{endpoint}
                "instances":{{
                  "instance1":{{"application":"example_app1","distribution":"Poisson","rate":25,"activity_window":[5,10]}},
                  "instance2":{{"application":"example_app1","distribution":"Uniform","rate":10,"activity_window":[5,10]}},
                  "instance3":{{"application":"example_app2","interarrivals_list":[5,0.13,0.15,0.8,0.1,0.13,0.13,0.1,0.4]{window3}}},
                  "instance4":{{"application":"example_app3","param_file":"param_file.json","distribution":"Poisson","rate":55,"activity_window":[5,10]}}}},
                {perf}}}"#
            )
        };
        for text in [
            openwhisk("", ""),
            openwhisk(r#""endpoint":"local_openwhisk","#, ""),
            openwhisk("", r#","activity_window":[5,10]"#),
        ] {
            let c = Config::parse(&text, &d).unwrap();
            assert_eq!(c.instances.len(), 4);
            let i3 = instance(&c, "instance3");
            assert!(
                matches!(&i3.distribution, Distribution::Trace { inter_arrivals_s } if inter_arrivals_s.len() == 9)
            );
            assert_eq!(i3.rates, vec![0.0]);
            assert_eq!(instance(&c, "instance4").body, Body::Json(br#"{"n": 30}"#.to_vec()));
            assert_eq!(c.runtime_script, Some(d.join("monitoring/RuntimeMonitoring.sh")));
            assert_eq!(c.post_script, None);
        }

        let generic = format!(
            r#"{{"test_name":"example_test","test_duration_in_seconds":15,"random_seed":100,"blocking_cli":false,"endpoint":"generic",
            "instances":{{
              "instance1":{{"application":"example_app1","url":"https://fn.example/app1","data":{{"message":"sample.png"}},
                           "distribution":"Uniform","rate":1,"activity_window":[5,10]}},
              "instance2":{{"application":"example_app2_json_data","url":"https://fn.example/app2",
                           "data":{{"argument":"{{\"fileName\":\"test.mp4\"}}"}},"distribution":"Uniform","rate":5,"activity_window":[5,10]}},
              "instance3":{{"application":"example_app3_json_data_complex","url":"https://fn.example/sfn",
                           "data":{{"input":"{{\"input_image\": \"logo.jpg\"}}","stateMachineArn":"arn:x"}},
                           "distribution":"Poisson","rate":10,"activity_window":[5,10]}}}},
            {perf}}}"#
        );
        let c = Config::parse(&generic, &d).unwrap();
        let i1 = instance(&c, "instance1");
        assert_eq!(i1.url.as_deref(), Some("https://fn.example/app1"));
        assert_eq!(i1.body, Body::Json(br#"{"message":"sample.png"}"#.to_vec()));

        let stress = r#"{"test_name":"example_test","test_duration_in_seconds":15,"random_seed":100,"blocking_cli":false,
            "endpoint":"generic","instances":{"instance1":{"application":"example_app1","url":"https://127.0.0.1","data":{},
            "distribution":"Uniform","rate":2,"activity_window":[5,15]}},
            "perf_monitoring":{"runtime_script":null,"post_script":null}}"#;
        let c = Config::parse(stress, &d).unwrap();
        assert_eq!(c.instances[0].body, Body::Json(b"{}".to_vec()));
        assert_eq!((c.runtime_script.as_ref(), c.post_script.as_ref()), (None, None));

        let run_config = format!(
            r#"{{"test_name":"test_data_run","test_duration_in_seconds":20,"random_seed":100,"blocking_cli":false,
            "instances":{{"instance1":{{"application":"primes-python","distribution":"Uniform","rate":1.5,"activity_window":[5,15]}}}},{perf}}}"#
        );
        assert_eq!(Config::parse(&run_config, &d).unwrap().instances[0].rates, vec![1.5]);

        let iat_rep = r#"{"test_name":"example_test","test_duration_in_seconds":5760,"random_seed":100,"blocking_cli":false,
            "endpoint":"generic","serverless_platform":"generic","instances":{
              "instance_0":{"application":"application-d887b445","url":"http://application-d887b445.default.172.18.255.1.sslip.io/hello",
                            "host":"application-d887b445.default.172.18.255.1.sslip.io","data":{},
                            "interarrivals_list":[1.0,0.09093333333333338,479.9090666666667]}},
            "perf_monitoring":{"runtime_script":null,"post_script":null}}"#;
        let c = Config::parse(iat_rep, &d).unwrap();
        let i0 = &c.instances[0];
        assert_eq!(i0.headers, vec![("Host".into(), "application-d887b445.default.172.18.255.1.sslip.io".into())]);
        assert_eq!(
            i0.distribution,
            Distribution::Trace { inter_arrivals_s: vec![1.0, 0.09093333333333338, 479.9090666666667] }
        );

        let scalability = format!(
            r#"{{"test_name":"example_test","test_duration_in_seconds":125,"random_seed":100,"blocking_cli":false,"endpoint":"generic",
            "instances":{{"instance0":{{"application":"scalability0","url":"http://10.233.26.231:5000/forecast/app0",
                "host":"http://10.233.26.231","data":{{"conc_trace":[0.08,0,0.5],"forecast_window":1}},
                "distribution":"Uniform","rate":1,"activity_window":[0,121]}}}},{perf}}}"#
        );
        let c = Config::parse(&scalability, &d).unwrap();
        assert_eq!(c.instances[0].body, Body::Json(br#"{"conc_trace":[0.08,0,0.5],"forecast_window":1}"#.to_vec()));
    }

    #[test]
    fn repo_examples_parse() {
        for text in [
            include_str!("../../../examples/workloads/latency-modes.json"),
            include_str!("../../../examples/workloads/nightcore-table1.json"),
        ] {
            let c = Config::parse(text, Path::new(".")).unwrap();
            assert!(c.raw["_comment"].is_string());
        }
        let sample: Value =
            serde_json::from_str(include_str!("../../../examples/workloads/faasprofiler-sample.json")).unwrap();
        assert_eq!(sample, serde_json::from_str::<Value>(LISTING_1).unwrap(), "listing_1_parses_verbatim covers it");
    }

    #[test]
    fn nulls_and_empty_scripts_mean_absent() {
        let c = Config::parse(
            r#"{"test_name":"t","test_duration_in_seconds":2,"random_seed":null,"blocking_cli":null,"endpoint":null,
                "base_url":null,"warmup_in_seconds":null,"pause_in_seconds":null,"slo":null,"_comment":null,
                "perf_monitoring":{"runtime_script":"","post_script":null},
                "instances":{"a":{"application":null,"mix":[{"application":"f","weight":null}],"distribution":"Poisson",
                  "rate":5,"rates":null,"activity_window":null,"data_file":null,"param_file":null,"data":null,"url":null,
                  "host":null,"method":null,"headers":null,"interarrivals_list":null,"_comment":"x"}}}"#,
            Path::new("."),
        )
        .unwrap();
        let a = &c.instances[0];
        assert_eq!((a.mix.clone(), a.rates.clone(), a.body.clone()), (vec![("f".into(), 1.0)], vec![5.0], Body::Empty));
        assert_eq!((a.method.as_str(), a.headers.len(), a.url.as_ref()), ("POST", 0, None));
        assert_eq!((c.runtime_script, c.post_script, c.slo, c.blocking_cli), (None, None, None, false));
    }

    #[test]
    fn faasprofiler_semantics() {
        let base =
            |inst: &str| format!(r#"{{"test_name":"t","test_duration_in_seconds":10,"instances":{{"a":{inst}}}}}"#);
        // README: "A rate of zero means no invocations".
        let c =
            Config::parse(&base(r#"{"application":"f","distribution":"Poisson","rate":0}"#), Path::new(".")).unwrap();
        assert_eq!(c.instances[0].rates, vec![0.0]);
        // Its checker allows Poisson or Uniform beside a list, and the list wins.
        let c = Config::parse(
            &base(r#"{"application":"f","distribution":"Uniform","rate":3,"interarrivals_list":[1,2]}"#),
            Path::new("."),
        )
        .unwrap();
        assert_eq!(c.instances[0].distribution, Distribution::Trace { inter_arrivals_s: vec![1.0, 2.0] });
        assert!(parse_err(&base(r#"{"application":"f","distribution":"Constant","interarrivals_list":[1]}"#))
            .contains("instance a: interarrivals_list replaces distribution"));
        assert!(parse_err(&base(r#"{"application":"f","interarrivals_list":[1,-2]}"#))
            .contains("instance a: interarrivals_list must hold non-negative numbers"));
        assert!(parse_err(&base(
            r#"{"application":"f","distribution":"Poisson","rate":1,"host":"h","headers":{"host":"g"}}"#
        ))
        .contains("instance a: give either host or a Host header"));
        // A window that is not two numbers fails there too.
        assert!(parse_err(&base(r#"{"application":"f","distribution":"Poisson","rate":1,"activity_window":[1]}"#))
            .contains("instance a: activity_window: invalid length 1"));
    }

    /// What FaaSProfiler runs without complaint runs here, with a warning
    /// where it looks like a mistake.
    #[test]
    fn what_faasprofiler_accepts_is_accepted() {
        let d = tmpdir("accepts");
        std::fs::write(d.join("list.json"), "[1, 2, 3]").unwrap();
        std::fs::write(d.join("photo.jpg"), b"\xff\xd8").unwrap();
        let one = |inst: &str, top: &str| {
            Config::parse(
                &format!(r#"{{"test_name":"t","test_duration_in_seconds":10,{top}"instances":{{"a":{inst}}}}}"#),
                &d,
            )
            .unwrap()
        };
        // No instances: nothing is sent.
        let c = Config::parse(r#"{"test_name":"t","test_duration_in_seconds":10,"instances":{}}"#, &d).unwrap();
        assert_eq!((c.instances.len(), c.warnings.len()), (0, 1));
        // A window past the test's end is cut there; an empty one sends nothing.
        let c = one(r#"{"application":"f","distribution":"Poisson","rate":1,"activity_window":[-1,50]}"#, "");
        assert_eq!(c.instances[0].window, Some((0.0, 10.0)));
        assert!(c.warnings[0].contains("activity_window [-1, 50] reaches outside the test: cut to [0, 10]"), "{c:?}");
        for w in ["[7,3]", "[4,4]", "[12,20]"] {
            let c =
                one(&format!(r#"{{"application":"f","distribution":"Uniform","rate":5,"activity_window":{w}}}"#), "");
            assert!(c.warnings[0].contains("this instance sends no requests"), "{c:?}");
            assert_eq!(crate::schedule::build(&c, 1), vec![], "{w}");
        }
        // Next to an interarrivals_list the window is ignored.
        let c = one(r#"{"application":"f","interarrivals_list":[1,1],"activity_window":[5,6]}"#, "");
        assert_eq!((c.instances[0].window, c.warnings.len()), (None, 1));
        // Any test name; the run directory gets a usable one.
        for (name, dir) in [("a/b", "a_b"), ("", "test"), ("..", "test"), ("ok", "ok")] {
            let c = Config::parse(
                &format!(r#"{{"test_name":{name:?},"test_duration_in_seconds":1,"instances":{{}}}}"#),
                &d,
            )
            .unwrap();
            assert_eq!((c.test_name.as_str(), c.dir_name().as_str()), (name, dir));
            assert_eq!(c.warnings.len(), if name == dir { 1 } else { 2 }, "{:?}", c.warnings);
        }
        // An endpoint it does not know; a runtime_script that is no path.
        let c = one(r#"{"application":"f","distribution":"Poisson","rate":1}"#, r#""endpoint":"aws","#);
        assert!(c.warnings[0].contains(r#"endpoint "aws" is not one FaaSProfiler knows"#), "{c:?}");
        let c = one(
            r#"{"application":"f","distribution":"Poisson","rate":1}"#,
            r#""perf_monitoring":{"runtime_script":5,"post_script":false},"#,
        );
        assert_eq!((c.runtime_script.as_ref(), c.post_script.as_ref()), (None, None));
        assert_eq!(c.warnings, vec!["perf_monitoring.runtime_script is 5, not a script path: not run".to_string()]);
        // A param_file holding any JSON value is its body.
        let c = one(r#"{"application":"f","distribution":"Poisson","rate":1,"param_file":"list.json"}"#, "");
        assert_eq!(c.instances[0].body, Body::Json(b"[1, 2, 3]".to_vec()));
        // A data_file goes as image/jpeg, as FaaSProfiler sends it, unless
        // the instance's headers say otherwise.
        let c = one(r#"{"application":"f","distribution":"Poisson","rate":1,"data_file":"photo.jpg"}"#, "");
        assert_eq!(c.instances[0].headers, vec![("Content-Type".to_string(), "image/jpeg".to_string())]);
        let c = one(
            r#"{"application":"f","distribution":"Poisson","rate":1,"data_file":"photo.jpg","headers":{"content-type":"image/png"}}"#,
            "",
        );
        assert_eq!(c.instances[0].headers, vec![("content-type".to_string(), "image/png".to_string())]);
    }

    #[test]
    fn relative_paths_fall_back_to_the_working_directory() {
        let d = tmpdir("cwd");
        let here = format!("loadgen-cwd-{}.json", std::process::id());
        std::fs::write(&here, "{}").unwrap();
        let c = Config::parse(
            &format!(
                r#"{{"test_name":"t","test_duration_in_seconds":1,"instances":{{"a":{{"application":"f","distribution":"Poisson","rate":1,"param_file":"{here}"}}}}}}"#
            ),
            &d,
        );
        std::fs::remove_file(&here).unwrap();
        assert_eq!(c.unwrap().instances[0].body, Body::Json(b"{}".to_vec()));
        // The config's directory wins when the file is there.
        assert_eq!(resolve(&d, "x"), d.join("x"));
    }
}
