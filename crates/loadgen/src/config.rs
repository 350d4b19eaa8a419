//! The workload configuration: FaaSProfiler's JSON (paper 004, Listing 1)
//! read unchanged, plus optional extensions.
//!
//! FaaSProfiler fields: `test_name`, `test_duration_in_seconds`,
//! `random_seed` (null: a random seed, recorded in run.json), `blocking_cli`
//! (accepted and recorded only: this sender is always open-loop and never
//! waits for a response before sending the next request), `instances`
//! {name: {`application`, `distribution`, `rate`, `activity_window`,
//! `data_file`, `param_file`}}, `perf_monitoring` {`runtime_script`,
//! `post_script`}.
//!
//! Extensions: top-level `base_url`, `warmup_in_seconds`, `pause_in_seconds`,
//! `slo`; per instance `url`, `method`, `headers`, `mix`, `rates`, and the
//! distributions `Constant`, `Bursty` (`on_seconds`, `off_seconds`) and
//! `Trace` (`trace_file`).
//!
//! Relative paths are relative to the configuration file's directory; a
//! leading `~` expands to $HOME.

use crate::Error;
use serde_json::{Map, Value};
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
    /// Inter-arrival times in seconds, one per line, from the window's start.
    Trace {
        inter_arrivals_s: Vec<f64>,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub enum Body {
    Empty,
    Bytes(Vec<u8>),
    Json(Vec<u8>),
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Slo {
    pub percentile: f64,
    pub max_ms: f64,
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
        let raw: Value = serde_json::from_str(text).map_err(|e| Error::Config(format!("not valid JSON: {e}")))?;
        let top = raw.as_object().ok_or_else(|| cfg("the configuration must be a JSON object"))?;
        let test_name = req_str(top, "test_name", "")?.to_string();
        if test_name.is_empty() || test_name.contains('/') {
            return Err(cfg("test_name must be a non-empty name without '/'"));
        }
        let duration_s = positive(top, "test_duration_in_seconds", "")?
            .ok_or_else(|| cfg("test_duration_in_seconds is required"))?;
        let random_seed = match top.get("random_seed") {
            None | Some(Value::Null) => None,
            Some(v) => Some(v.as_u64().ok_or_else(|| cfg("random_seed must be a non-negative integer or null"))?),
        };
        let blocking_cli = match top.get("blocking_cli") {
            None | Some(Value::Null) => false,
            Some(v) => v.as_bool().ok_or_else(|| cfg("blocking_cli must be true or false"))?,
        };
        let base_url = opt_str(top, "base_url", "")?.map(str::to_string);
        let warmup_s = non_negative(top, "warmup_in_seconds")?;
        let pause_s = non_negative(top, "pause_in_seconds")?;
        let insts = top
            .get("instances")
            .and_then(Value::as_object)
            .ok_or_else(|| cfg("instances must be an object of named instances"))?;
        if insts.is_empty() {
            return Err(cfg("instances is empty"));
        }
        let mut instances = Vec::new();
        for (name, v) in insts {
            instances.push(Instance::parse(name, v, dir, duration_s)?);
        }
        let (runtime_script, post_script) = match top.get("perf_monitoring") {
            None | Some(Value::Null) => (None, None),
            Some(Value::Object(m)) => (
                opt_str(m, "runtime_script", "perf_monitoring.")?.map(|s| resolve(dir, s)),
                opt_str(m, "post_script", "perf_monitoring.")?.map(|s| resolve(dir, s)),
            ),
            Some(_) => return Err(cfg("perf_monitoring must be an object")),
        };
        let slo = match top.get("slo") {
            None | Some(Value::Null) => None,
            Some(Value::Object(m)) => {
                let percentile = m.get("percentile").and_then(Value::as_f64).unwrap_or(99.0);
                if !(0.0..=100.0).contains(&percentile) {
                    return Err(cfg("slo.percentile must be in [0, 100]"));
                }
                let max_ms = positive(m, "max_ms", "slo.")?.ok_or_else(|| cfg("slo.max_ms is required"))?;
                Some(Slo { percentile, max_ms })
            }
            Some(_) => return Err(cfg("slo must be an object {\"percentile\": 99, \"max_ms\": X}")),
        };
        Ok(Config {
            raw: raw.clone(),
            dir: dir.to_path_buf(),
            test_name,
            duration_s,
            random_seed,
            blocking_cli,
            base_url,
            warmup_s,
            pause_s,
            instances,
            runtime_script,
            post_script,
            slo,
        })
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

impl Instance {
    fn parse(name: &str, v: &Value, dir: &Path, duration_s: f64) -> Result<Instance, Error> {
        let m = v.as_object().ok_or_else(|| cfg(&format!("instance {name}: must be an object")))?;
        let at = format!("instances.{name}.");
        let err = |msg: &str| cfg(&format!("instance {name}: {msg}"));
        let mix = match (m.get("application"), m.get("mix")) {
            (Some(Value::String(a)), None) => vec![(a.clone(), 1.0)],
            (None, Some(Value::Array(items))) => parse_mix(items).map_err(|e| err(&e))?,
            (Some(_), Some(_)) => return Err(err("give either application or mix, not both")),
            (Some(_), None) => return Err(err("application must be a string")),
            _ => return Err(err("application (a function name) or mix is required")),
        };
        let dist_name = req_str(m, "distribution", &at)?;
        let distribution = match dist_name {
            "Poisson" => Distribution::Poisson,
            "Uniform" => Distribution::Uniform,
            "Constant" => Distribution::Constant,
            "Bursty" => Distribution::Bursty {
                on_s: positive(m, "on_seconds", &at)?.ok_or_else(|| err("Bursty needs on_seconds"))?,
                off_s: non_negative(m, "off_seconds")?,
            },
            "Trace" => {
                let f = req_str(m, "trace_file", &at)?;
                Distribution::Trace { inter_arrivals_s: read_trace(&resolve(dir, f)).map_err(|e| err(&e))? }
            }
            d => return Err(err(&format!("unknown distribution {d:?} (Poisson, Uniform, Constant, Bursty, Trace)"))),
        };
        let rates = match (m.get("rate"), m.get("rates")) {
            (_, Some(Value::Array(rs))) => {
                let rs: Option<Vec<f64>> = rs.iter().map(|r| r.as_f64().filter(|x| *x > 0.0)).collect();
                rs.filter(|r| !r.is_empty()).ok_or_else(|| err("rates must be a non-empty list of positive numbers"))?
            }
            (Some(r), None) => vec![r.as_f64().filter(|x| *x > 0.0).ok_or_else(|| err("rate must be positive"))?],
            (None, None) if matches!(distribution, Distribution::Trace { .. }) => vec![0.0],
            _ => return Err(err("rate (requests per second) is required")),
        };
        let window = match m.get("activity_window") {
            None | Some(Value::Null) => None,
            Some(Value::Array(w)) if w.len() == 2 => {
                let (a, b) = (w[0].as_f64(), w[1].as_f64());
                match (a, b) {
                    (Some(a), Some(b)) if 0.0 <= a && a < b && b <= duration_s => Some((a, b)),
                    _ => {
                        return Err(err(&format!(
                            "activity_window must be [start, end] with 0 <= start < end <= {duration_s}"
                        )))
                    }
                }
            }
            Some(_) => return Err(err("activity_window must be [start, end] or null")),
        };
        let body = if let Some(f) = opt_str(m, "data_file", &at)? {
            let p = resolve(dir, f);
            Body::Bytes(std::fs::read(&p).map_err(|e| err(&format!("data_file {}: {e}", p.display())))?)
        } else if let Some(f) = opt_str(m, "param_file", &at)? {
            let p = resolve(dir, f);
            let text = std::fs::read(&p).map_err(|e| err(&format!("param_file {}: {e}", p.display())))?;
            match serde_json::from_slice::<Value>(&text) {
                Ok(Value::Object(_)) => Body::Json(text),
                _ => return Err(err(&format!("param_file {} must hold a JSON object", p.display()))),
            }
        } else {
            Body::Empty
        };
        let method = opt_str(m, "method", &at)?.unwrap_or("POST").to_ascii_uppercase();
        if method.is_empty() || !method.bytes().all(|b| b.is_ascii_uppercase()) {
            return Err(err("method must be an HTTP method name"));
        }
        let headers = match m.get("headers") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Object(h)) => h
                .iter()
                .map(|(k, v)| match v.as_str() {
                    Some(s) if !s.contains(['\r', '\n']) && !k.contains([':', '\r', '\n']) => Ok((k.clone(), s.into())),
                    _ => Err(err(&format!("header {k:?} must be a single-line string"))),
                })
                .collect::<Result<_, _>>()?,
            Some(_) => return Err(err("headers must be an object of strings")),
        };
        let url = opt_str(m, "url", &at)?.map(str::to_string);
        Ok(Instance { name: name.into(), mix, distribution, rates, window, body, url, method, headers })
    }
}

fn parse_mix(items: &[Value]) -> Result<Vec<(String, f64)>, String> {
    let mut mix = Vec::new();
    for it in items {
        let app = it.get("application").and_then(Value::as_str);
        let w = it.get("weight").map_or(Some(1.0), Value::as_f64);
        match (app, w) {
            (Some(a), Some(w)) if w > 0.0 => mix.push((a.to_string(), w)),
            _ => return Err("mix items must be {\"application\": name, \"weight\": positive number}".into()),
        }
    }
    if mix.is_empty() {
        return Err("mix is empty".into());
    }
    Ok(mix)
}

fn read_trace(p: &Path) -> Result<Vec<f64>, String> {
    let text = std::fs::read_to_string(p).map_err(|e| format!("trace_file {}: {e}", p.display()))?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        match line.parse::<f64>() {
            Ok(x) if x >= 0.0 && x.is_finite() => out.push(x),
            _ => {
                return Err(format!("trace_file {} line {}: {line:?} is not a non-negative number", p.display(), i + 1))
            }
        }
    }
    Ok(out)
}

/// `~` expands to $HOME; relative paths are relative to the config's directory.
pub fn resolve(dir: &Path, p: &str) -> PathBuf {
    if let Some(rest) = p.strip_prefix("~/").or(if p == "~" { Some("") } else { None }) {
        if let Some(home) = std::env::var_os("HOME") {
            return PathBuf::from(home).join(rest);
        }
    }
    let p = Path::new(p);
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        dir.join(p)
    }
}

fn cfg(msg: &str) -> Error {
    Error::Config(msg.to_string())
}

fn req_str<'a>(m: &'a Map<String, Value>, key: &str, at: &str) -> Result<&'a str, Error> {
    opt_str(m, key, at)?.ok_or_else(|| cfg(&format!("{at}{key} is required")))
}

fn opt_str<'a>(m: &'a Map<String, Value>, key: &str, at: &str) -> Result<Option<&'a str>, Error> {
    match m.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(cfg(&format!("{at}{key} must be a string"))),
    }
}

fn positive(m: &Map<String, Value>, key: &str, at: &str) -> Result<Option<f64>, Error> {
    match m.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_f64() {
            Some(x) if x > 0.0 && x.is_finite() => Ok(Some(x)),
            _ => Err(cfg(&format!("{at}{key} must be a positive number"))),
        },
    }
}

fn non_negative(m: &Map<String, Value>, key: &str) -> Result<f64, Error> {
    match m.get(key) {
        None | Some(Value::Null) => Ok(0.0),
        Some(v) => match v.as_f64() {
            Some(x) if x >= 0.0 && x.is_finite() => Ok(x),
            _ => Err(cfg(&format!("{key} must be a non-negative number"))),
        },
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
            .contains("unknown distribution \"Gauss\""));
        assert!(parse_err(&base(r#"{"application":"f","distribution":"Poisson"}"#)).contains("rate"));
        assert!(parse_err(&base(r#"{"application":"f","distribution":"Poisson","rate":-1}"#))
            .contains("rate must be positive"));
        assert!(parse_err(&base(r#"{"application":"f","distribution":"Poisson","rate":1,"activity_window":[5,50]}"#))
            .contains("activity_window"));
        assert!(parse_err(&base(r#"{"distribution":"Poisson","rate":1}"#)).contains("application"));
        assert!(parse_err(&base(r#"{"application":"f","distribution":"Poisson","rate":1,"data_file":"nope.bin"}"#))
            .contains("instance a: data_file /nonexistent/nope.bin"));
    }
}
