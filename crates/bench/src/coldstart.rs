//! `staccato bench coldstart`: how long from "start a container for
//! function F" to "F's first call served", by each way Staccato can start
//! F (Nuka §IV, Figures 6 and 7), in one run:
//!
//! * `runc run`: a fresh container made for the start (runc run, then the
//!   launcher), what an engine without a pool pays;
//! * pooled: a container from the isolation pool (mounts injected, cgroup
//!   limits written, launcher started by the container's init);
//! * resume: a paused container (cgroup freezer) thawed for the call;
//! * zygote fork: a new worker forked from F's launcher, which already
//!   imported F (Python `worker_mode: fork`; the C host always forks).
//!
//! Then concurrent starts against pools of several sizes, and the first call
//! of a Python function with two PyPI dependencies with a cold and a warm
//! package cache. This drives the sandbox crate and the real language
//! runtimes directly, speaking the engine's channel protocol itself, so the
//! engine's single supervisor thread does not serialize the starts.
//! Nothing here asserts a number.

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, ValueEnum};
use engine::config::{
    CONTAINER_CODE, CONTAINER_DEPS, CONTAINER_IPC, CONTAINER_PYTHON, CONTAINER_RUNTIMES, CONTAINER_VENDOR,
};
use serde_json::{json, Value};
use std::fs::{self, File};
use std::os::unix::fs::chown;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use wire::message::{Header, Kind, Message};

/// A container's network (as `staccato up --network`).
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum NetworkArg {
    /// The host's network namespace.
    Host,
    /// A network namespace per container, joined to the host by veth + NAT.
    Isolated,
}

#[derive(Args, Clone)]
pub struct ColdArgs {
    /// Starts per row of the method table.
    #[arg(long, default_value_t = 20)]
    reps: usize,
    /// Concurrent starts for the pool table.
    #[arg(long, value_delimiter = ',', default_value = "1,8,32,64")]
    concurrency: Vec<usize>,
    /// Pool sizes for the pool table.
    #[arg(long, value_delimiter = ',', default_value = "0,32,128")]
    pool_sizes: Vec<usize>,
    /// Languages of the method table.
    #[arg(long, value_delimiter = ',', default_value = "python,c")]
    langs: Vec<String>,
    /// Language of the pool table.
    #[arg(long, default_value = "python")]
    pool_lang: String,
    /// Containers' network (as `staccato up --network`).
    #[arg(long, value_enum, default_value = "isolated")]
    network: NetworkArg,
    /// Skip the package-cache rows (they need PyPI).
    #[arg(long)]
    no_cache: bool,
    #[arg(long, default_value = "python3")]
    python: String,
    /// Print JSON instead of tables.
    #[arg(long)]
    json: bool,
}

/// Everything one benchmark run shares.
struct Fx {
    cc: engine::ContainerConfig,
    runtimes: PathBuf,
    root: PathBuf,
    next_id: AtomicU64,
    pools: AtomicU64,
}

#[derive(Clone, Copy, PartialEq)]
enum Lang {
    Python,
    C,
}

/// One started copy of the function: its container and channels.
struct Instance {
    c: Arc<sandbox::Container>,
    dir: PathBuf,
    launcher: sys::channel::EngineChannel,
    workers: Vec<(u32, sys::channel::EngineChannel)>,
    next_call: u64,
    /// When the container had the function's files and its launcher was
    /// asked to start, and when the launcher said hello.
    started: Instant,
    hello: Instant,
}

fn uid_own(p: &Path, uid: u32) -> Result<()> {
    chown(p, Some(uid), Some(uid)).with_context(|| format!("chown {}", p.display()))
}

/// Waits for the next message on `rx` (yield-spinning for the first
/// millisecond, so sub-millisecond starts are not rounded up to a sleep).
/// A FIFO read end reads as end-of-file until its writer first opens it,
/// so a dead peer is recognised by its container's init reporting it.
fn wait_message(c: &sandbox::Container, rx: &File, want: Kind, timeout: Duration, what: &str) -> Result<Message> {
    let start = Instant::now();
    let mut reader = sys::channel::MessageReader::default();
    loop {
        let st = reader.fill(rx).with_context(|| format!("reading {what}"))?;
        if let Some(m) = reader.next_message() {
            let h = m.header().map_err(|e| anyhow!("{what}: {e}"))?;
            if h.kind != want {
                bail!("{what}: expected {want:?}, got {:?}", h.kind);
            }
            return Ok(m);
        }
        if st == sys::channel::ReadStatus::Eof {
            if let Some(exit) = c.poll_status().into_iter().find(|l| l.starts_with("EXIT")) {
                bail!("{what}: the launcher exited ({exit})");
            }
        }
        let waited = start.elapsed();
        if waited > timeout {
            bail!("{what}: nothing within {timeout:?}");
        }
        if waited < Duration::from_millis(1) {
            std::thread::yield_now();
        } else {
            // Back off: 64 waiters polling every 50 µs would starve the very
            // launchers they wait for. The error stays under 2% of the wait.
            std::thread::sleep((waited / 50).clamp(Duration::from_micros(50), Duration::from_millis(2)));
        }
    }
}

impl Fx {
    fn code_dir(&self, lang: Lang) -> PathBuf {
        self.root.join(match lang {
            Lang::Python => "code-python",
            Lang::C => "code-c",
        })
    }

    /// Starts F's launcher in `c` and waits for its hello.
    fn launch(&self, c: Arc<sandbox::Container>, lang: Lang, fork: bool, deps: &[PathBuf]) -> Result<Instance> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let dir = self.root.join("ipc").join(format!("i{id}"));
        fs::create_dir_all(dir.join("shm"))?;
        uid_own(&dir, c.uid)?;
        uid_own(&dir.join("shm"), c.uid)?;
        let launcher = sys::channel::EngineChannel::create(&dir, 0)?;
        for p in [dir.join("0.e2w"), dir.join("0.w2e")] {
            uid_own(&p, c.uid)?;
        }
        let log = self.root.join("logs").join(format!("i{id}.log"));
        File::create(&log)?;
        let mut env: Vec<(String, String)> = vec![
            ("PATH".into(), "/usr/bin:/bin".into()),
            ("HOME".into(), "/tmp".into()),
            ("LANG".into(), "C.UTF-8".into()),
            ("STACCATO_FUNCTION".into(), "coldstart".into()),
            ("STACCATO_IPC_DIR".into(), CONTAINER_IPC.into()),
            ("STACCATO_SPIN_US".into(), "0".into()),
        ];
        let mut mounts = vec![
            sandbox::Mount { src: self.code_dir(lang), dst: CONTAINER_CODE.into(), read_only: true, exec: false },
            sandbox::Mount { src: dir.clone(), dst: CONTAINER_IPC.into(), read_only: false, exec: false },
        ];
        let argv = match lang {
            Lang::Python => {
                let mut path = format!("{CONTAINER_RUNTIMES}/python");
                for (i, d) in deps.iter().enumerate() {
                    let inside = Path::new(CONTAINER_DEPS).join(i.to_string());
                    path.push_str(&format!(":{}", inside.display()));
                    mounts.push(sandbox::Mount { src: d.clone(), dst: inside, read_only: true, exec: false });
                }
                path.push_str(&format!(":{CONTAINER_VENDOR}"));
                env.push(("PYTHONPATH".into(), path));
                env.push(("STACCATO_HANDLER".into(), "handler:handle".into()));
                if fork {
                    env.push(("STACCATO_WORKER_MODE".into(), "fork".into()));
                }
                env.extend(self.cc.python_env.iter().cloned());
                let exe = self.cc.python_exe.strip_prefix(&self.cc.python_prefix).unwrap_or(Path::new("bin/python3"));
                let python = Path::new(CONTAINER_PYTHON).join(exe);
                // As the engine starts it (code::launcher_command): without site.
                vec![python.display().to_string(), "-S".into(), "-u".into(), "-m".into(), "staccato.launcher".into()]
            }
            Lang::C => {
                env.push(("STACCATO_HANDLER".into(), format!("{CONTAINER_CODE}/handler.so")));
                vec![format!("{CONTAINER_RUNTIMES}/c/build/staccato-c-host")]
            }
        };
        let start = sandbox::Start {
            mounts,
            limits: sandbox::Limits { memory_bytes: 256 << 20, pids: 256, cpu_shares: None },
            argv,
            env,
            cwd: CONTAINER_CODE.into(),
            log: log.clone(),
            python: lang == Lang::Python,
        };
        c.start(&start).map_err(|e| anyhow!(e))?;
        let started = Instant::now();
        let mut inst = Instance { c, dir, launcher, workers: Vec::new(), next_call: 1, started, hello: started };
        wait_message(&inst.c, &inst.launcher.rx, Kind::LauncherHello, Duration::from_secs(120), "launcher hello")
            .with_context(|| format!("log: {}", fs::read_to_string(&log).unwrap_or_default()))?;
        inst.hello = Instant::now();
        Ok(inst)
    }
}

impl Instance {
    /// Asks for a new worker and serves one call on it.
    fn new_worker_call(&mut self) -> Result<()> {
        let wid = self.workers.len() as u32 + 1;
        let ch = sys::channel::EngineChannel::create(&self.dir, wid)?;
        let (e2w, w2e) = sys::channel::channel_paths(&self.dir, wid);
        uid_own(&e2w, self.c.uid)?;
        uid_own(&w2e, self.c.uid)?;
        let mut h = Header::new(Kind::CreateWorker);
        h.worker_id = wid;
        sys::channel::write_message(&self.launcher.tx, &Message::new(&h, &[]))?;
        wait_message(&self.c, &ch.rx, Kind::WorkerHello, Duration::from_secs(120), "worker hello")?;
        self.workers.push((wid, ch));
        self.call(wid)
    }

    /// One call on an existing worker.
    fn call(&mut self, wid: u32) -> Result<()> {
        let ch = &self.workers.iter().find(|(w, _)| *w == wid).ok_or_else(|| anyhow!("no worker {wid}"))?.1;
        let mut h = Header::new(Kind::Dispatch);
        h.call_id = (1 << 62) | self.next_call;
        self.next_call += 1;
        h.worker_id = wid;
        h.deadline_us = sys::clock::unix_us() + 30_000_000;
        h.payload_len = 2;
        sys::channel::write_message(&ch.tx, &Message::new(&h, b"hi"))?;
        wait_message(&self.c, &ch.rx, Kind::Completion, Duration::from_secs(120), "completion")?;
        Ok(())
    }

    fn finish(self, pool: &sandbox::Pool) {
        drop(self.workers);
        drop(self.launcher);
        pool.give_back(self.c, false);
        let _ = fs::remove_dir_all(&self.dir);
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn summary(mut v: Vec<f64>) -> Value {
    v.sort_by(f64::total_cmp);
    let p = |q: f64| loadgen::stats::percentile(&v, q).unwrap_or(f64::NAN);
    let mean = if v.is_empty() { f64::NAN } else { v.iter().sum::<f64>() / v.len() as f64 };
    json!({ "n": v.len(), "p50_ms": p(50.0), "p90_ms": p(90.0), "p99_ms": p(99.0), "mean_ms": mean })
}

fn prepare_code(fx: &Fx) -> Result<()> {
    let py = fx.code_dir(Lang::Python);
    fs::create_dir_all(&py)?;
    fs::write(py.join("handler.py"), "def handle(ctx, payload):\n    return payload\n")?;
    let c = fx.code_dir(Lang::C);
    fs::create_dir_all(&c)?;
    fs::write(
        c.join("handler.c"),
        "#include <staccato.h>\nint staccato_handle(staccato_ctx *ctx, const uint8_t *in, size_t n) {\n    \
         return staccato_set_output(ctx, in, n);\n}\n",
    )?;
    let st = Command::new("cc")
        .args(["-O2", "-fPIC", "-shared", "-I"])
        .arg(fx.runtimes.join("c/include"))
        .args(["handler.c", "-o", "handler.so"])
        .current_dir(&c)
        .status()?;
    if !st.success() {
        bail!("compiling the C nop handler failed");
    }
    fs::create_dir_all(fx.root.join("logs"))?;
    Ok(())
}

pub fn run(a: ColdArgs) -> Result<()> {
    let root = std::env::temp_dir().join("staccato-coldstart");
    let _ = fs::remove_dir_all(&root);
    fs::create_dir_all(&root)?;
    let runtimes = engine::config::find_runtimes(None).map_err(|e| anyhow!(e))?;
    let network = match a.network {
        NetworkArg::Host => sandbox::Network::Host,
        NetworkArg::Isolated => sandbox::Network::Isolated,
    };
    let cc = engine::ContainerConfig::detect("runc", &a.python, network, 0, &root, &runtimes).map_err(|e| match e {
        engine::config::Unavailable::Missing(why) => anyhow!("containers are not available: {why}"),
        engine::config::Unavailable::Failed(why) => anyhow!(why),
    })?;
    let fx = Fx { cc, runtimes, root: root.clone(), next_id: AtomicU64::new(1), pools: AtomicU64::new(0) };
    prepare_code(&fx)?;
    let result = measure(&a, &fx);
    let _ = fs::remove_dir_all(&root);
    let out = result?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&out)?);
    }
    Ok(())
}

/// A pool that removes all its containers when dropped, errors included.
struct PoolGuard(sandbox::Pool);

impl std::ops::Deref for PoolGuard {
    type Target = sandbox::Pool;
    fn deref(&self) -> &sandbox::Pool {
        &self.0
    }
}

impl Drop for PoolGuard {
    fn drop(&mut self) {
        self.0.resize(0);
        self.0.shutdown();
    }
}

fn pool_of(fx: &Fx, size: usize) -> Result<PoolGuard> {
    let mut s = fx.cc.sandbox.clone();
    s.pool_size = size;
    // Pools live side by side, so each has its own names; fixed ones, so a
    // run that was killed is cleaned up by the next.
    let n = fx.pools.fetch_add(1, Ordering::Relaxed);
    s.prefix = format!("cb{}", std::char::from_digit((n % 36) as u32, 36).unwrap_or('z'));
    let pool = PoolGuard(sandbox::Pool::new(s).map_err(|e| anyhow!(e))?);
    if !pool.wait_full(Duration::from_secs(120)) {
        bail!("the pool did not fill to {size} within 2 minutes (see the errors above)");
    }
    Ok(pool)
}

fn lang_of(s: &str) -> Result<Lang> {
    match s {
        "python" => Ok(Lang::Python),
        "c" => Ok(Lang::C),
        other => bail!("bench coldstart measures python and c, not {other:?}"),
    }
}

fn measure(a: &ColdArgs, fx: &Fx) -> Result<Value> {
    let mut out = json!({ "network": fx.cc.sandbox.network.name(), "methods": {}, "pools": [], "cache": {} });
    let quiet = a.json;
    if !quiet {
        println!("Cold starts: start a container for F → F's first call served (ms; {} per row)", a.reps);
        println!("{:<8} {:<30} {:>9} {:>9} {:>9}", "lang", "method", "p50", "p90", "p99");
    }
    for l in &a.langs {
        let lang = lang_of(l)?;
        let rows = method_table(a, fx, lang)?;
        for (name, v) in &rows {
            if !quiet {
                println!(
                    "{:<8} {:<30} {:>9.2} {:>9.2} {:>9.2}",
                    l,
                    name,
                    v["p50_ms"].as_f64().unwrap_or(f64::NAN),
                    v["p90_ms"].as_f64().unwrap_or(f64::NAN),
                    v["p99_ms"].as_f64().unwrap_or(f64::NAN)
                );
            }
            out["methods"][l][name] = v.clone();
        }
        let p = |k: &str| out["methods"][l][k]["p50_ms"].as_f64().unwrap_or(f64::NAN);
        let ratio = p("runc run") / p("pooled");
        out["methods"][l]["runc_over_pooled_p50"] = json!(ratio);
        if !quiet {
            println!("{:<8} {:<30} {:>9.1}x", l, "runc run / pooled (p50)", ratio);
        }
    }
    let lang = lang_of(&a.pool_lang)?;
    if !quiet {
        println!();
        println!("Concurrent starts from the isolation pool ({} functions; ms per start, starts/s)", a.pool_lang);
        println!(
            "{:>6} {:>6} {:>9} {:>9} {:>9} {:>9} {:>10}",
            "pool", "conc", "mean", "p50", "p99", "from pool", "starts/s"
        );
    }
    for &size in &a.pool_sizes {
        let pool = pool_of(fx, size)?;
        for &c in &a.concurrency {
            if !pool.wait_full(Duration::from_secs(300)) {
                bail!("the pool did not refill to {size}");
            }
            let misses_before = pool.stats().misses;
            let t0 = Instant::now();
            let results: Vec<Result<(f64, Instance)>> = std::thread::scope(|scope| {
                let handles: Vec<_> = (0..c)
                    .map(|_| {
                        let pool = pool.clone();
                        scope.spawn(move || -> Result<(f64, Instance)> {
                            let t = Instant::now();
                            let ct = pool.take(lang == Lang::Python).map_err(|e| anyhow!(e))?;
                            let mut inst = fx.launch(ct, lang, false, &[])?;
                            inst.new_worker_call()?;
                            Ok((ms(t.elapsed()), inst))
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| h.join().unwrap_or_else(|_| Err(anyhow!("start thread panicked"))))
                    .collect()
            });
            let mut lat = Vec::new();
            let mut insts = Vec::new();
            let mut errors = Vec::new();
            for r in results {
                match r {
                    Ok((l, i)) => {
                        lat.push(l);
                        insts.push(i);
                    }
                    Err(e) => errors.push(format!("{e:#}")),
                }
            }
            let makespan = t0.elapsed().as_secs_f64();
            let from_pool = c as u64 - (pool.stats().misses - misses_before).min(c as u64);
            for i in insts {
                i.finish(&pool);
            }
            if !errors.is_empty() {
                bail!("{} of {c} starts failed; first: {}", errors.len(), errors[0]);
            }
            let s = summary(lat);
            let tput = c as f64 / makespan;
            if !quiet {
                println!(
                    "{:>6} {:>6} {:>9.2} {:>9.2} {:>9.2} {:>9} {:>10.1}",
                    size,
                    c,
                    s["mean_ms"].as_f64().unwrap_or(f64::NAN),
                    s["p50_ms"].as_f64().unwrap_or(f64::NAN),
                    s["p99_ms"].as_f64().unwrap_or(f64::NAN),
                    from_pool,
                    tput
                );
            }
            out["pools"].as_array_mut().expect("array").push(json!({
                "pool": size, "concurrency": c, "latency": s, "starts_per_s": tput, "from_pool": from_pool,
            }));
        }
        drop(pool);
    }
    if !a.no_cache {
        out["cache"] = cache_rows(fx, quiet)?;
    }
    Ok(out)
}

/// The four ways to start F, `reps` times each, one start at a time.
fn method_table(a: &ColdArgs, fx: &Fx, lang: Lang) -> Result<Vec<(&'static str, Value)>> {
    let fresh = pool_of(fx, 0)?;
    let pooled = pool_of(fx, a.reps.min(32))?;
    let (mut runc, mut pool, mut resume, mut fork) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut st_start, mut st_hello) = (Vec::new(), Vec::new());
    // One start at a time on an otherwise idle machine: the destruction of
    // the previous row's container (runc delete, veth removal: ~40 ms in the
    // pool's thread) must not overlap the next measurement.
    let settle = || std::thread::sleep(Duration::from_millis(150));
    for _ in 0..a.reps {
        // runc run: a container made for this start.
        settle();
        let t = Instant::now();
        let c = fresh.take(lang == Lang::Python).map_err(|e| anyhow!(e))?;
        let mut i = fx.launch(c, lang, false, &[])?;
        i.new_worker_call()?;
        runc.push(ms(t.elapsed()));
        i.finish(&fresh);

        // Pooled (Python: the default inline worker mode).
        pooled.wait_full(Duration::from_secs(120));
        settle();
        let t = Instant::now();
        let c = pooled.take(lang == Lang::Python).map_err(|e| anyhow!(e))?;
        let mut i = fx.launch(c, lang, false, &[])?;
        i.new_worker_call()?;
        pool.push(ms(t.elapsed()));
        st_start.push(ms(i.started - t));
        st_hello.push(ms(i.hello - t));

        // Resume: the same instance, paused, then called.
        i.c.freeze().map_err(|e| anyhow!(e))?;
        std::thread::sleep(Duration::from_millis(20));
        let t = Instant::now();
        i.c.thaw();
        i.call(1)?;
        resume.push(ms(t.elapsed()));
        i.finish(&pooled);

        // Zygote fork: a new worker from a launcher that holds F (Python in
        // worker_mode fork; the C host always forks).
        pooled.wait_full(Duration::from_secs(120));
        let c = pooled.take(lang == Lang::Python).map_err(|e| anyhow!(e))?;
        let mut i = fx.launch(c, lang, lang == Lang::Python, &[])?;
        i.new_worker_call()?;
        settle();
        let t = Instant::now();
        i.new_worker_call()?;
        fork.push(ms(t.elapsed()));
        i.finish(&pooled);
    }
    drop((fresh, pooled));
    let fork_name = if lang == Lang::Python { "zygote fork (worker_mode fork)" } else { "zygote fork (C host fork)" };
    Ok(vec![
        ("runc run", summary(runc)),
        ("pooled", summary(pool)),
        ("  pooled: files in, launcher asked", summary(st_start)),
        ("  pooled: launcher hello", summary(st_hello)),
        ("resume (freezer)", summary(resume)),
        (fork_name, summary(fork)),
    ])
}

/// First call of a Python function with two PyPI dependencies: resolve
/// them through the package cache, start F in a pooled container with them
/// mounted, serve one call. Cold: an empty cache each time; warm: filled.
fn cache_rows(fx: &Fx, quiet: bool) -> Result<Value> {
    let code = fx.code_dir(Lang::Python);
    let req = fx.root.join("requirements.txt");
    fs::write(&req, "six==1.16.0\nattrs==23.1.0\n")?;
    fs::write(code.join("handler.py"), "import six\nimport attr\n\ndef handle(ctx, payload):\n    return payload\n")?;
    let pool = pool_of(fx, 4)?;
    let mut rows = json!({});
    let warm_cache = pkgcache::Cache::open(&fx.root.join("cache-warm"), pkgcache::DEFAULT_BUDGET_BYTES)?;
    warm_cache.python(Path::new(&fx.cc.python_exe), &req, &mut |_| {}).map_err(|e| anyhow!(e))?;
    let run = |cache: &pkgcache::Cache| -> Result<(f64, f64)> {
        pool.wait_full(Duration::from_secs(60));
        std::thread::sleep(Duration::from_millis(150));
        let t = Instant::now();
        let r = cache.python(Path::new(&fx.cc.python_exe), &req, &mut |_| {}).map_err(|e| anyhow!(e))?;
        let resolved = ms(t.elapsed());
        let c = pool.take(true).map_err(|e| anyhow!(e))?;
        let mut i = fx.launch(c, Lang::Python, false, &r.dirs)?;
        i.new_worker_call()?;
        let total = ms(t.elapsed());
        i.finish(&pool);
        Ok((resolved, total))
    };
    let (mut cold, mut cold_dep, mut warm, mut warm_dep) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for k in 0..3 {
        let cache = pkgcache::Cache::open(&fx.root.join(format!("cache-cold-{k}")), pkgcache::DEFAULT_BUDGET_BYTES)?;
        let (d, t) = run(&cache)?;
        cold_dep.push(d);
        cold.push(t);
    }
    for _ in 0..10 {
        let (d, t) = run(&warm_cache)?;
        warm_dep.push(d);
        warm.push(t);
    }
    drop(pool);
    fs::write(code.join("handler.py"), "def handle(ctx, payload):\n    return payload\n")?;
    rows["cold"] = json!({ "total": summary(cold), "dependencies": summary(cold_dep) });
    rows["warm"] = json!({ "total": summary(warm), "dependencies": summary(warm_dep) });
    if !quiet {
        println!();
        println!(
            "First call of a Python function needing six + attrs from PyPI (ms; deps = resolving through the cache)"
        );
        println!("{:<12} {:>9} {:>9} {:>12}", "cache", "p50", "p90", "deps p50");
        for k in ["cold", "warm"] {
            println!(
                "{:<12} {:>9.1} {:>9.1} {:>12.1}",
                k,
                rows[k]["total"]["p50_ms"].as_f64().unwrap_or(f64::NAN),
                rows[k]["total"]["p90_ms"].as_f64().unwrap_or(f64::NAN),
                rows[k]["dependencies"]["p50_ms"].as_f64().unwrap_or(f64::NAN)
            );
        }
    }
    Ok(rows)
}
