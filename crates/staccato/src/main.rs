//! `staccato`: run the platform (`up`), manage functions (`deploy`, `ls`,
//! `rm`, `logs`), call them (`invoke`), and measure it (`bench`).

#![forbid(unsafe_code)]

mod bench;
mod cache_cmd;
mod calls_cmd;
mod key_cmd;
mod new;
mod secret_cmd;
mod testbed_cmd;
mod up;

use anyhow::{anyhow, bail, Context, Result};
use clap::{Parser, Subcommand};
use client::{check, Gateway, Requester};
use serde_json::Value;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(Parser)]
#[command(name = "staccato", version, about = "Serverless functions with microsecond-scale overheads")]
struct Cli {
    /// Gateway to talk to.
    #[arg(long, global = true, env = "STACCATO_GATEWAY", default_value = "http://127.0.0.1:8080")]
    gateway: String,
    /// Bearer token for the management API.
    #[arg(long, global = true, env = "STACCATO_TOKEN", hide_env_values = true)]
    token: Option<String>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Start the gateway and an engine on this machine.
    Up(up::UpArgs),
    /// Run only an engine (for a gateway elsewhere).
    Engine(up::EngineCmd),
    /// Run only a gateway, in front of engines (--engine, or engines that join).
    Gateway(up::GatewayCmd),
    /// Stop a Staccato started with `up --detach`.
    Down {
        #[arg(long, env = "STACCATO_STATE_DIR")]
        state_dir: Option<PathBuf>,
    },
    /// Scaffold a new function: NAME/staccato.yml and a handler.
    New {
        name: String,
        #[arg(long, value_enum)]
        lang: new::Lang,
        /// Directory to create NAME/ in.
        #[arg(long, default_value = ".")]
        dir: PathBuf,
    },
    /// Deploy the functions of a manifest (a file, or a directory holding staccato.yml).
    Deploy { path: PathBuf },
    /// Call a function and print its output.
    Invoke {
        name: String,
        /// Input; without it, standard input is read (unless it is a terminal).
        #[arg(short, long)]
        data: Option<String>,
        /// Give up after this many milliseconds (never longer than the function's timeout).
        #[arg(long)]
        timeout_ms: Option<u32>,
        /// Print the call id and timing to standard error.
        #[arg(short, long)]
        verbose: bool,
        /// The function's invoke key (`staccato key create`), for one
        /// deployed with `auth: key`. The management token is never sent
        /// with a call.
        #[arg(long, env = "STACCATO_INVOKE_KEY", hide_env_values = true)]
        key: Option<String>,
        /// Queue the call and print its id at once (`POST
        /// /async-function/NAME`); see it with `staccato calls get ID`.
        #[arg(long = "async")]
        async_call: bool,
        /// With --async: where the gateway posts the result when the call
        /// ends (http://HOST:PORT/PATH).
        #[arg(long, requires = "async_call")]
        callback: Option<String>,
    },
    /// List the engines a gateway sends calls to.
    Engines {
        #[arg(long)]
        json: bool,
    },
    /// List deployed functions.
    Ls {
        #[arg(long)]
        json: bool,
    },
    /// Remove functions.
    Rm {
        #[arg(required = true)]
        names: Vec<String>,
    },
    /// Print a function's log (its workers' standard output and error),
    /// from every engine that runs it, through the gateway.
    Logs {
        name: String,
        /// Read the log files under this state directory (of `staccato up`)
        /// instead of asking the gateway.
        #[arg(long, env = "STACCATO_STATE_DIR")]
        state_dir: Option<PathBuf>,
        /// Lines from the end.
        #[arg(short = 'n', long, default_value_t = 50)]
        lines: usize,
        /// Keep printing what the function writes, until interrupted.
        #[arg(short = 'f', long)]
        follow: bool,
    },
    /// The live dashboard: prints its address (with the management token,
    /// in the part after `#` that browsers never send) to open in a browser.
    Ui,
    /// Recent call traces (receive, dispatch, complete timestamps).
    Trace {
        name: Option<String>,
        #[arg(long, default_value_t = 20)]
        limit: usize,
    },
    /// Benchmarks.
    #[command(subcommand)]
    Bench(bench::BenchCmd),
    /// The local package cache of functions' Python and Node dependencies.
    #[command(subcommand)]
    Cache(cache_cmd::CacheCmd),
    /// Invoke keys of functions deployed with `auth: key`.
    #[command(subcommand)]
    Key(key_cmd::KeyCmd),
    /// Secrets functions read at /var/secrets/NAME (`secrets:` in a manifest).
    #[command(subcommand)]
    Secret(secret_cmd::SecretCmd),
    /// Asynchronous calls (`invoke --async`): list them, show one, replay a
    /// dead letter (`--state failed`), remove one.
    Calls(calls_cmd::CallsCmd),
    /// A cluster on this machine: gateways and engines on test hosts made
    /// of network namespaces (a demo, and the cluster tests' harness).
    #[command(subcommand)]
    Testbed(testbed_cmd::TestbedCmd),
}

fn main() {
    let cli = Cli::parse();
    if let Err(e) = run(cli) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

fn run(cli: Cli) -> Result<()> {
    let tok = token(&cli);
    let client = || -> Result<Gateway> {
        Gateway::new(&cli.gateway, tok.clone(), None).with_context(|| format!("gateway {}", cli.gateway))
    };
    match cli.cmd {
        Cmd::Up(args) => up::up(args),
        Cmd::Engine(args) => up::engine_only(args, cli.token.clone()),
        Cmd::Gateway(args) => up::gateway_only(args),
        Cmd::Down { state_dir } => up::down(state_dir),
        Cmd::New { ref name, lang, ref dir } => new::new(name, lang, dir),
        Cmd::Deploy { ref path } => deploy(&mut client()?, path),
        Cmd::Invoke { ref name, ref data, timeout_ms, verbose, ref key, async_call, ref callback } => {
            let mut c = Gateway::new(&cli.gateway, None, None).with_context(|| format!("gateway {}", cli.gateway))?;
            if async_call && timeout_ms.is_some() {
                bail!("--timeout-ms is for a call that waits; an async call has its function's timeout");
            }
            let how =
                Invocation { timeout_ms, verbose, key: key.as_deref(), async_call, callback: callback.as_deref() };
            invoke(&mut c, name, data.as_deref(), &how)
        }
        Cmd::Calls(cmd) => calls_cmd::run(&mut client()?, cmd),
        Cmd::Key(cmd) => key_cmd::run(&mut client()?, cmd),
        Cmd::Secret(cmd) => secret_cmd::run(&mut client()?, cmd),
        Cmd::Ls { json } => ls(&mut client()?, json),
        Cmd::Engines { json } => engines(&mut client()?, json),
        Cmd::Rm { ref names } => {
            let mut c = client()?;
            for n in names {
                function_name(n)?;
                let r =
                    c.request("DELETE", &format!("/system/functions/{n}"), b"").map_err(unreachable(&cli.gateway))?;
                check(&r)?;
                println!("Removed {n}");
            }
            Ok(())
        }
        Cmd::Logs { ref name, state_dir: None, lines, follow } => {
            function_name(name)?;
            logs(&mut client()?, &cli.gateway, name, lines, follow)
        }
        Cmd::Logs { follow: true, .. } => bail!("--follow asks the gateway; it cannot be used with --state-dir"),
        Cmd::Logs { ref name, state_dir: Some(ref state_dir), lines, .. } => {
            function_name(name)?;
            // `up` gives the engine <state-dir>/engine, which keeps the logs.
            let path = up::state_dir(Some(state_dir.clone())).join("engine").join("logs").join(format!("{name}.log"));
            let text = std::fs::read(&path).with_context(|| format!("no log for {name} at {}", path.display()))?;
            // The rotated file first, if the current one is short of lines.
            let mut older = std::fs::read(path.with_extension("log.1")).unwrap_or_default();
            older.extend_from_slice(&text);
            let text = String::from_utf8_lossy(&older);
            let all: Vec<&str> = text.lines().collect();
            for l in &all[all.len().saturating_sub(lines)..] {
                println!("{l}");
            }
            Ok(())
        }
        Cmd::Ui => {
            // Checked first, so a wrong gateway or token fails here, not in the browser.
            let r = client()?.request("GET", "/system/dashboard", b"").map_err(unreachable(&cli.gateway))?;
            check(&r)?;
            let base = cli.gateway.trim_end_matches('/');
            match &tok {
                // Percent-encoded: a token may hold any printable character.
                Some(t) => {
                    let enc: String = t
                        .bytes()
                        .map(|b| {
                            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                                (b as char).to_string()
                            } else {
                                format!("%{b:02X}")
                            }
                        })
                        .collect();
                    println!("{base}/ui#token={enc}")
                }
                None => println!("{base}/ui"),
            }
            Ok(())
        }
        Cmd::Trace { ref name, limit } => {
            let mut path = format!("/system/trace?limit={limit}");
            if let Some(n) = name {
                path.push_str(&format!("&function={}", function_name(n)?));
            }
            let r = client()?.request("GET", &path, b"").map_err(unreachable(&cli.gateway))?;
            let v = check(&r)?;
            println!(
                "{:<18} {:<18} {:<16} {:<22} {:>8} {:>10} {:>10}  outcome",
                "call", "parent", "function", "engine", "worker", "queue_us", "exec_us"
            );
            for t in v.as_array().into_iter().flatten() {
                let n = |k: &str| t[k].as_u64().unwrap_or(0);
                // A call between servers is listed twice: by the caller's
                // engine, which sent it out, and by the callee's, which ran it.
                let engine = match t["hop"].as_str() {
                    Some("out") => format!("{} ->", t["engine"].as_str().unwrap_or("")),
                    Some("in") => format!("-> {}", t["engine"].as_str().unwrap_or("")),
                    _ => t["engine"].as_str().unwrap_or("").to_string(),
                };
                let queue = n("dispatch_ns").saturating_sub(n("receive_ns")) / 1000;
                let exec =
                    if n("dispatch_ns") > 0 { n("complete_ns").saturating_sub(n("dispatch_ns")) / 1000 } else { 0 };
                println!(
                    "{:<18} {:<18} {:<16} {:<22} {:>8} {:>10} {:>10}  {}",
                    t["call_id"].as_str().unwrap_or(""),
                    t["parent_call_id"].as_str().unwrap_or(""),
                    t["function"].as_str().unwrap_or(""),
                    engine,
                    n("worker_id"),
                    queue,
                    exec,
                    t["outcome"].as_str().unwrap_or("")
                );
            }
            Ok(())
        }
        Cmd::Bench(b) => bench::run(b, &cli.gateway, tok),
        Cmd::Cache(c) => cache_cmd::run(c),
        Cmd::Testbed(c) => testbed_cmd::run(c),
    }
}

/// The management token: --token or STACCATO_TOKEN, else (like Jupyter)
/// the one `staccato up` wrote into its state directory, but only for a
/// gateway on this machine's loopback: it never goes anywhere else.
fn token(cli: &Cli) -> Option<String> {
    if cli.token.is_some() {
        return cli.token.clone();
    }
    let local = Gateway::new(&cli.gateway, None, None).is_ok_and(|c| c.is_loopback());
    let state = up::state_dir(std::env::var_os("STACCATO_STATE_DIR").map(PathBuf::from));
    local.then(|| client::read_token(&state)).flatten()
}

/// A name that can be a function's, checked before it goes into a URL: a
/// space or a slash would otherwise fail as if the gateway were down.
pub(crate) fn function_name(name: &str) -> Result<&str> {
    if !wire::valid_function_name(name) {
        bail!("invalid function name {name:?}: use 1-64 characters of a-z, 0-9, '-' and '_', starting with a letter");
    }
    Ok(name)
}

fn unreachable(gw: &str) -> impl Fn(std::io::Error) -> anyhow::Error + '_ {
    move |e| anyhow!("cannot reach the gateway at {gw}: {e} (is `staccato up` running?)")
}

fn manifest_path(path: &Path) -> PathBuf {
    if path.is_dir() {
        for name in ["staccato.yml", "staccato.yaml", "stack.yml"] {
            if path.join(name).is_file() {
                return path.join(name);
            }
        }
        return path.join("staccato.yml");
    }
    path.to_path_buf()
}

fn deploy(c: &mut Gateway, path: &Path) -> Result<()> {
    let file = manifest_path(path);
    let text = std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
    let base = file.parent().unwrap_or(Path::new("."));
    let functions = api::manifest::parse(&text, base).map_err(|e| anyhow!("{}: {e}", file.display()))?;
    for f in functions {
        let spec = &f.spec;
        print!("Deploying {} ({}) ... ", spec.name, spec.runtime.name());
        std::io::stdout().flush().ok();
        let t = Instant::now();
        match client::deploy::deploy_function(c, &f) {
            Ok(v) => {
                let mut said: Vec<String> = v["notes"][&spec.name].as_str().map(String::from).into_iter().collect();
                if !spec.placement.is_everywhere() {
                    let on: Vec<&str> = v["placed"][&spec.name]
                        .as_array()
                        .map(|a| a.iter().filter_map(|e| e.as_str()).collect())
                        .unwrap_or_default();
                    said.push(format!("on {}", on.join(", ")));
                }
                let took = t.elapsed().as_secs_f64();
                match said.is_empty() {
                    true => println!("ok ({took:.2}s)"),
                    false => println!("ok ({took:.2}s; {})", said.join("; ")),
                }
            }
            Err(e) => {
                println!("failed");
                return Err(e);
            }
        }
    }
    Ok(())
}

/// How `staccato invoke` calls.
struct Invocation<'a> {
    timeout_ms: Option<u32>,
    verbose: bool,
    key: Option<&'a str>,
    async_call: bool,
    callback: Option<&'a str>,
}

fn invoke(c: &mut Gateway, name: &str, data: Option<&str>, how: &Invocation) -> Result<()> {
    let Invocation { timeout_ms, verbose, key, async_call, callback } = *how;
    function_name(name)?;
    let input = match data {
        Some(d) => d.as_bytes().to_vec(),
        None if std::io::IsTerminal::is_terminal(&std::io::stdin()) => Vec::new(),
        None => {
            let mut b = Vec::new();
            std::io::stdin().read_to_end(&mut b)?;
            b
        }
    };
    let path = if async_call { format!("/async-function/{name}") } else { format!("/function/{name}") };
    let timeout = timeout_ms.map(|ms| ms.to_string());
    let mut headers: Vec<(&str, &str)> = timeout.iter().map(|t| ("X-Staccato-Timeout-Ms", t.as_str())).collect();
    let bearer = key.map(|k| format!("Bearer {}", k.trim()));
    if let Some(b) = &bearer {
        headers.push(("Authorization", b.as_str()));
    }
    if let Some(url) = callback {
        headers.push(("X-Callback-Url", url));
    }
    let r = c
        .request_with_headers("POST", &path, &input, &headers)
        .context("cannot reach the gateway (is `staccato up` running?)")?;
    if verbose {
        let engine = r.header("x-staccato-engine").map_or(String::new(), |e| format!("  engine {e}"));
        eprintln!(
            "call {}  status {}  {}{engine}",
            r.header("x-call-id").unwrap_or("-"),
            r.status,
            r.header("x-staccato-timing").unwrap_or("")
        );
    }
    if r.status >= 400 {
        check(&r)?;
    }
    if async_call {
        let v: Value = serde_json::from_slice(&r.body).context("the gateway's answer to an async call")?;
        let id = v["call_id"].as_str().unwrap_or("?");
        println!("{id}");
        if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
            eprintln!("Queued: see `staccato calls get {id}`");
        }
        return Ok(());
    }
    std::io::stdout().write_all(&r.body)?;
    if std::io::IsTerminal::is_terminal(&std::io::stdout()) && !r.body.ends_with(b"\n") {
        println!();
    }
    Ok(())
}

/// A management listing: printed as JSON (and `None`) with `json`, else
/// returned for a table.
fn listing(c: &mut Gateway, path: &str, json: bool) -> Result<Option<Value>> {
    let r = c.request("GET", path, b"").context("cannot reach the gateway (is `staccato up` running?)")?;
    let v = check(&r)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(None);
    }
    Ok(Some(v))
}

fn engines(c: &mut Gateway, json: bool) -> Result<()> {
    let Some(v) = listing(c, "/system/engines", json)? else { return Ok(()) };
    println!(
        "{:<24} {:<22} {:<7} {:<12} {:>9} {:>10} {:>9} {:>8} {:>9}  LABELS",
        "ID", "ADDRESS", "KIND", "STATE", "IN FLIGHT", "CALLS", "FORWARDED", "LEASE", "FUNCTIONS"
    );
    for e in v.as_array().into_iter().flatten() {
        let lease = e["lease_left_ms"].as_u64().map_or("-".to_string(), |ms| format!("{:.1}s", ms as f64 / 1e3));
        let labels: Vec<String> = e["labels"]
            .as_object()
            .map(|m| m.iter().map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or(""))).collect())
            .unwrap_or_default();
        let functions = e["functions"].as_array().map_or(0, Vec::len);
        println!(
            "{:<24} {:<22} {:<7} {:<12} {:>9} {:>10} {:>9} {:>8} {:>9}  {}",
            e["id"].as_str().unwrap_or(""),
            e["address"].as_str().unwrap_or(""),
            e["kind"].as_str().unwrap_or(""),
            e["state"].as_str().unwrap_or(""),
            // Value's Display ignores the width: print the numbers.
            e["in_flight"].as_u64().unwrap_or(0),
            e["calls"].as_u64().unwrap_or(0),
            e["forwarded"].as_u64().unwrap_or(0),
            lease,
            functions,
            labels.join(",")
        );
    }
    Ok(())
}

/// `staccato logs` through the gateway: each engine's part (prefixed with
/// the engine when several have one); with `follow`, what comes after,
/// every half second, from where each engine's last read ended.
fn logs(c: &mut Gateway, gateway: &str, name: &str, lines: usize, follow: bool) -> Result<()> {
    use std::io::Write;
    let mut cursors: std::collections::BTreeMap<String, String> = Default::default();
    let mut warned = std::collections::BTreeSet::new();
    let mut first = true;
    loop {
        // Engines read for the first time after the first round start at
        // their end: only what they write from now on.
        let mut path = format!("/system/logs/{name}?lines={}", if first { lines } else { 0 });
        if !cursors.is_empty() {
            path.push_str("&after=");
            path.push_str(&cursors.values().cloned().collect::<Vec<_>>().join(","));
        }
        let r = c.request("GET", &path, b"").map_err(unreachable(gateway))?;
        let v = check(&r)?;
        let parts = v["engines"].as_array().cloned().unwrap_or_default();
        let many = parts.len() > 1;
        let mut out = std::io::stdout().lock();
        for p in &parts {
            let engine = p["engine"].as_str().unwrap_or("");
            if let Some(err) = p["error"].as_str() {
                if warned.insert(engine.to_string()) {
                    eprintln!("warning: engine {engine}: {err}");
                }
                continue;
            }
            let text = p["text"].as_str().unwrap_or("");
            if many {
                for l in text.lines() {
                    writeln!(out, "[{engine}] {l}")?;
                }
            } else {
                write!(out, "{text}")?;
            }
            if let Some(cur) = p["cursor"].as_str() {
                cursors.insert(engine.to_string(), cur.to_string());
            }
        }
        out.flush()?;
        if !follow {
            return Ok(());
        }
        first = false;
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
}

fn ls(c: &mut Gateway, json: bool) -> Result<()> {
    let Some(v) = listing(c, "/system/functions", json)? else { return Ok(()) };
    println!(
        "{:<20} {:<8} {:<8} {:>6} {:>9} {:>5} {:>8} {:>7} {:>10} {:>7}",
        "NAME", "RUNTIME", "STATE", "POOL", "MIN/MAX", "TAU", "RUNNING", "QUEUED", "CALLS", "FAILED"
    );
    for f in v.as_array().into_iter().flatten() {
        let s = &f["status"]["scheduler"];
        let n = |x: &Value| x.as_u64().map_or("-".to_string(), |n| n.to_string());
        // ready | paused (container frozen) | starting | down
        let state = match (f["status"]["launcher"].as_str(), f["status"]["container"]["paused"].as_bool()) {
            (Some("ready"), Some(true)) => "paused",
            (Some(l), _) => l,
            (None, _) => "-",
        };
        println!(
            "{:<20} {:<8} {:<8} {:>6} {:>9} {:>5} {:>8} {:>7} {:>10} {:>7}",
            f["name"].as_str().unwrap_or(""),
            f["runtime"].as_str().unwrap_or(""),
            state,
            n(&s["pool"]),
            format!("{}/{}", f["min_workers"], f["max_workers"]),
            n(&s["tau"]),
            n(&s["running"]),
            n(&s["queued"]),
            n(&f["status"]["completed"]),
            n(&f["status"]["failed"]),
        );
    }
    Ok(())
}
