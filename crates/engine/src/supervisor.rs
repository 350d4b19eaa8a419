//! The engine's supervisor thread: registers and removes functions, starts
//! their launchers, reaps them. Runs apart from the I/O threads because all
//! of this may block (fork/exec, disks).
//!
//! A deploy's build (unpacking, dependencies, compilers: seconds to
//! minutes) runs on a thread of its own and comes back as
//! [`SupervisorCmd::Built`]; its launcher's start is then watched from this
//! loop. So a deploy never holds up other functions' launchers, reaping or
//! draining, nor another deploy. Of several deploys of one name, the one
//! asked for last wins whatever order they finish in (each has a sequence
//! number; an older one is answered `superseded`), and a removal asked for
//! during a deploy cancels it.

use crate::scheduler::Scheduler;
use crate::shared::{Cmd, FnCore, Function, Launcher, LauncherState, Outcome, Shared, SupervisorCmd};
use crate::spec::FunctionSpec;
use crate::Error;
use api::control::{Refusal, RefusalKind, Reply, Request};
use api::secrets::SecretValues;
use std::collections::HashMap;
use std::fs::{self, File};
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use wire::ErrorKind;

/// Where a control request's answer goes.
pub(crate) type ReplyTx = Sender<Result<Reply, Refusal>>;

/// Deploys building at once, at most; more are refused `busy` (each build
/// step also takes one of the build sandbox's slots).
const DEPLOYS_MAX: usize = 16;

pub(crate) fn run(shared: Arc<Shared>, rx: Receiver<SupervisorCmd>) {
    let mut sup = Supervisor {
        shared,
        children: Vec::new(),
        contained: Vec::new(),
        draining: Vec::new(),
        logs: HashMap::new(),
        deploys: HashMap::new(),
        next_deploy: 0,
        building: HashMap::new(),
        starting: Vec::new(),
    };
    loop {
        // A launcher starting is watched closely; otherwise wake rarely.
        let wait = if sup.starting.is_empty() { Duration::from_millis(200) } else { Duration::from_millis(2) };
        match rx.recv_timeout(wait) {
            Ok(SupervisorCmd::StartLauncher(f)) => sup.start_launcher(&f),
            Ok(SupervisorCmd::Control(req, attachment, reply)) => match *req {
                Request::Register { spec, secrets } => sup.begin_deploy(spec, secrets, attachment, reply),
                req => {
                    let _ = reply.send(sup.control(req));
                }
            },
            Ok(SupervisorCmd::Built(b)) => sup.built(*b),
            Ok(SupervisorCmd::Launched(f, launched)) => sup.launched(f, launched),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
        sup.reap();
        sup.watch_starts();
        sup.drain_tick();
    }
}

/// A deploy's build, done on its own thread.
pub(crate) struct Built {
    seq: u64,
    /// None if the build panicked (and took the spec with it).
    spec: Option<FunctionSpec>,
    name: String,
    generation: u128,
    code_dir: PathBuf,
    deps: Result<crate::code::Deps, Refusal>,
}

struct Supervisor {
    shared: Arc<Shared>,
    /// Launchers we started, to reap them and to notice one that dies
    /// before it even opens its channel (no end-of-file tells us then).
    children: Vec<(Child, Arc<Function>)>,
    /// The same for launchers in containers, whose init reports their end.
    contained: Vec<(Arc<sandbox::Container>, u32, Arc<Function>)>,
    /// Removed or replaced functions finishing the calls they were running.
    draining: Vec<Draining>,
    /// Each function's log stream, while a generation of it lives.
    logs: HashMap<String, std::sync::Weak<sandbox::logs::Stream>>,
    /// Per function name, the sequence number of the newest deploy or
    /// removal asked for; with `next_deploy`, the last one asked wins.
    deploys: HashMap<String, u64>,
    next_deploy: u64,
    /// Deploys building, by sequence number: the name, who to answer, and
    /// the values of the secrets it names.
    building: HashMap<u64, (String, ReplyTx, SecretValues)>,
    /// Deploys built, whose launcher is starting.
    starting: Vec<Starting>,
}

struct Starting {
    func: Arc<Function>,
    seq: u64,
    deadline: Instant,
    reply: ReplyTx,
}

/// The longest a deploy whose launcher is ready waits for its first
/// worker: a worker start takes well under a millisecond when the machine
/// is not overloaded. After it the deploy is installed anyway, and a worker
/// that never says hello is asked for again like any other.
const FIRST_WORKER_WAIT_MAX: Duration = Duration::from_secs(1);

/// A retired function whose running calls may still finish.
struct Draining {
    f: Arc<Function>,
    until: Instant,
    why: &'static str,
}

/// The longest a removed or replaced function's running calls are waited
/// for (their own timeout, if shorter); then they are answered
/// `function_removed` and its processes killed.
const DRAIN_MAX: Duration = Duration::from_secs(30);

impl Supervisor {
    /// One control request answered at once (registrations take
    /// `begin_deploy` instead: `run` sends them there).
    fn pool_status(&self) -> Option<api::control::PoolStatus> {
        let s = self.shared.pool.as_ref()?.stats();
        Some(api::control::PoolStatus {
            idle: s.idle as u64,
            target: s.target as u64,
            created: s.created,
            reused: s.reused,
            destroyed: s.destroyed,
            misses: s.misses,
            create_ms_last: s.create_ms_last,
        })
    }

    fn control(&mut self, req: Request) -> Result<Reply, Refusal> {
        match req {
            Request::Register { .. } => Err(Refusal::new(RefusalKind::Internal, "registration sent the wrong way")),
            Request::Unregister { name } => self.unregister(&name),
            Request::Status => Ok(Reply::Status { functions: self.shared.status(false), pool: self.pool_status() }),
            Request::Names => Ok(self.shared.names()),
            Request::StatusWithUsage => {
                Ok(Reply::Status { functions: self.shared.status(true), pool: self.pool_status() })
            }
            Request::Trace { function, limit } => Ok(self.trace(function.as_deref(), limit as usize)),
            Request::Logs { function, lines, after } => self.read_log(&function, lines, after),
        }
    }

    /// Checks a registration and starts its build on a thread of its own;
    /// the answer is sent once it is built and started (or failed).
    fn begin_deploy(&mut self, spec: FunctionSpec, secrets: SecretValues, archive: Vec<u8>, reply: ReplyTx) {
        let invalid = |m: String| Refusal::new(RefusalKind::InvalidSpec, m);
        let checked = (|| {
            spec.validate().map_err(|e| invalid(e.to_string()))?;
            secrets.check().map_err(|e| invalid(format!("secrets: {e}")))?;
            let sent: Vec<&String> = secrets.0.keys().collect();
            let mut named: Vec<&String> = spec.secrets.iter().collect();
            named.sort();
            if sent != named {
                return Err(invalid(format!(
                    "the secrets sent ({sent:?}) are not the ones the spec names ({:?})",
                    spec.secrets
                )));
            }
            spec.validate_for_host(self.shared.memory_total_bytes).map_err(|e| invalid(e.to_string()))?;
            let digest = api::archive::digest(&archive);
            if digest != spec.source {
                return Err(invalid(format!(
                    "the source archive sent ({} bytes, {digest}) is not the one the spec names ({})",
                    archive.len(),
                    spec.source
                )));
            }
            if self.building.len() >= DEPLOYS_MAX {
                return Err(Refusal::new(
                    RefusalKind::Busy,
                    format!("the engine is building {DEPLOYS_MAX} deploys, its limit; retry when one is done"),
                ));
            }
            Ok(())
        })();
        if let Err(r) = checked {
            let _ = reply.send(Err(r));
            return;
        }
        self.next_deploy += 1;
        let seq = self.next_deploy;
        let name = spec.name.clone();
        let (shared, tx) = (self.shared.clone(), crate::shared::lock(&self.shared.supervisor).clone());
        let spawned = std::thread::Builder::new().name("engine-deploy".into()).spawn(move || {
            let (name, generation) = (spec.name.clone(), deploy_generation(seq));
            let code_dir = code_dir_of(&shared, &name, generation);
            // A bug in a build must still answer its deploy.
            let built = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                build(&shared, spec, &archive, seq, generation, code_dir.clone())
            }))
            .unwrap_or_else(|_| {
                let _ = fs::remove_dir_all(&code_dir);
                Built {
                    seq,
                    spec: None,
                    name,
                    generation,
                    code_dir,
                    deps: Err(Refusal::new(RefusalKind::Internal, "the build failed inside the engine (a bug)")),
                }
            });
            let _ = tx.send(SupervisorCmd::Built(Box::new(built)));
        });
        match spawned {
            Ok(_) => {
                self.deploys.insert(name.clone(), seq);
                self.building.insert(seq, (name, reply, secrets));
            }
            Err(e) => {
                let _ = reply.send(Err(Refusal::new(RefusalKind::Internal, format!("starting the build: {e}"))));
            }
        }
    }

    /// A deploy is built: start its launcher, unless a newer deploy or a
    /// removal of the same name was asked for meanwhile.
    fn built(&mut self, b: Built) {
        let Some((_, reply, secrets)) = self.building.remove(&b.seq) else { return };
        let newest = self.newest(&b.name, b.seq);
        let (spec, deps) = match (b.spec, b.deps) {
            (Some(spec), Ok(deps)) if newest => (spec, deps),
            (_, result) => {
                self.remove_code(&b.name, &b.code_dir);
                let refusal = result.err().unwrap_or_else(|| superseded(&b.name));
                let _ = reply.send(Err(refusal));
                self.forget_deploy(&b.name);
                return;
            }
        };
        let internal = |m: String| Refusal::new(RefusalKind::Internal, m);
        let log = match self.log_stream(&spec.name, b.generation) {
            Ok(log) => log,
            Err(e) => {
                self.remove_code(&spec.name, &b.code_dir);
                let _ = reply.send(Err(internal(e.to_string())));
                self.forget_deploy(&spec.name);
                return;
            }
        };
        let shared = self.shared.clone();
        let cfg = &shared.cfg;
        let dir = cfg.ipc_dir.join(format!("{}.{}", spec.name, b.generation));
        if let Err(e) = crate::secrets::write(&dir, &secrets) {
            self.remove_code(&spec.name, &b.code_dir);
            let _ = reply.send(Err(internal(format!("writing the function's secrets: {e}"))));
            self.forget_deploy(&spec.name);
            return;
        }
        let func = Arc::new(Function {
            dir,
            log,
            code_dir: b.code_dir,
            deps,
            registered: Instant::now(),
            fingerprint: spec.fingerprint(),
            core: Mutex::new(FnCore {
                sched: Scheduler::new(spec.min_workers, spec.max_workers, cfg.ema_alpha)
                    .with_fixed_concurrency(cfg.concurrency == crate::config::Concurrency::Fixed),
                workers: HashMap::new(),
                launcher: Launcher { state: LauncherState::Starting, ..Launcher::down() },
                removed: false,
                completed: 0,
                failed: 0,
                frozen_at: None,
                last_active_ns: 0,
                oom_at: None,
                follow: Default::default(),
            }),
            spec,
        });
        self.start_launcher(&func);
        let deadline = Instant::now() + Duration::from_millis(cfg.launcher_ready_timeout_ms);
        self.starting.push(Starting { func, seq: b.seq, deadline, reply });
        self.watch_starts();
    }

    /// Removes a deploy's code, and the function's directory when nothing
    /// else of it is left. Not that directory while another deploy of the
    /// name is building: it may be making its own directory in it (two
    /// gateways restoring one engine at once do that).
    fn remove_code(&self, name: &str, code_dir: &std::path::Path) {
        if self.deploying(name) {
            let _ = fs::remove_dir_all(code_dir);
        } else {
            remove_code_dir(code_dir);
        }
    }

    /// Whether `seq` is still the newest deploy or removal of `name`.
    fn newest(&self, name: &str, seq: u64) -> bool {
        self.deploys.get(name) == Some(&seq)
    }

    /// Whether a deploy of `name` is building or starting.
    fn deploying(&self, name: &str) -> bool {
        self.building.values().any(|(n, _, _)| n == name) || self.starting.iter().any(|st| st.func.spec.name == name)
    }

    /// Forgets `name`'s sequence number once nothing of it is under way:
    /// the map holds only names with a deploy in flight.
    fn forget_deploy(&mut self, name: &str) {
        if !self.deploying(name) {
            self.deploys.remove(name);
        }
    }

    /// Installs the deploys whose launcher is ready, with its first worker
    /// if it started one; fails those whose launcher died or did not start
    /// in time.
    ///
    /// Waiting for the first worker (~0.3-1 ms after the launcher's hello)
    /// means a redeploy leaves no gap: the old version takes calls until
    /// the new one can run them, and a deploy that returns can serve at
    /// once. It also keeps the install, the old version's retirement and
    /// the deploy's answer from taking a vCPU from that worker's start.
    fn watch_starts(&mut self) {
        let mut i = 0;
        while i < self.starting.len() {
            let (state, err, awaits_worker) = {
                let core = self.starting[i].func.lock_core();
                let waited = core.launcher.ready_at.is_some_and(|t| t.elapsed() >= FIRST_WORKER_WAIT_MAX);
                (core.launcher.state, core.launcher.last_error.clone(), core.sched.awaits_first_worker() && !waited)
            };
            let st = &self.starting[i];
            let failed = match state {
                _ if !self.newest(&st.func.spec.name, st.seq) => Some(superseded(&st.func.spec.name)),
                LauncherState::Ready if awaits_worker && Instant::now() <= st.deadline => {
                    i += 1;
                    continue;
                }
                LauncherState::Ready => None,
                // A launcher that said hello and died before its first
                // worker did has no error of its own: its log says why.
                LauncherState::Down => Some(Refusal::new(
                    RefusalKind::StartFailed,
                    format!(
                        "function {} failed to start:\n{}",
                        st.func.spec.name,
                        if err.is_empty() { log_tail(&st.func.log) } else { err }
                    ),
                )),
                LauncherState::Starting if Instant::now() > st.deadline => Some(Refusal::new(
                    RefusalKind::StartFailed,
                    format!(
                        "function {} did not start within {} ms; its log:\n{}",
                        st.func.spec.name,
                        self.shared.cfg.launcher_ready_timeout_ms,
                        log_tail(&st.func.log)
                    ),
                )),
                LauncherState::Starting => {
                    i += 1;
                    continue;
                }
            };
            let st = self.starting.swap_remove(i);
            match failed {
                Some(refusal) => {
                    let why =
                        if refusal.kind == RefusalKind::Superseded { "it was superseded" } else { "deploy failed" };
                    self.retire(&st.func, why, None);
                    let _ = st.reply.send(Err(refusal));
                }
                None => {
                    let answer = self.install(&st.func);
                    let _ = st.reply.send(answer);
                }
            }
            self.forget_deploy(&st.func.spec.name);
        }
    }

    /// A started deploy becomes the function of its name.
    fn install(&mut self, func: &Arc<Function>) -> Result<Reply, Refusal> {
        let name = &func.spec.name;
        // Pinned once it runs: a failed or superseded deploy leaves the
        // running version's pins as they were. The cache is opened only if
        // there is something to pin or unpin.
        let had_deps = self.shared.function(name).is_some_and(|old| !old.deps.entries.is_empty());
        if had_deps || !func.deps.entries.is_empty() {
            let pinned = crate::code::open_cache(&self.shared.cfg).map_err(|e| e.to_string()).and_then(|cache| {
                if func.deps.entries.is_empty() { cache.unpin(name) } else { cache.pin(name, &func.deps.entries) }
                    .map_err(|e| e.to_string())
            });
            if let Err(e) = pinned {
                self.retire(func, "deploy failed", None);
                return Err(Refusal::new(RefusalKind::Internal, format!("pinning dependencies: {e} (deploy again)")));
            }
        }
        let old = self.shared.functions.write().unwrap_or_else(|p| p.into_inner()).insert(name.clone(), func.clone());
        if let Some(old) = old {
            // Its queued calls go to the new version; running ones finish.
            self.retire(&old, "it was redeployed", Some(func));
        }
        log::info!("registered {name} ({})", func.spec.runtime.name());
        Ok(Reply::Registered { name: name.clone(), notes: func.deps.summary.clone() })
    }

    /// The log of function `name`: the live one if a generation of it
    /// still runs (a redeploy's old calls and new ones share it), else a
    /// fresh FIFO drained into `<state>/logs/<name>.log`.
    fn log_stream(&mut self, name: &str, generation: u128) -> crate::Result<Arc<sandbox::logs::Stream>> {
        self.logs.retain(|_, s| s.strong_count() > 0);
        if let Some(s) = self.logs.get(name).and_then(std::sync::Weak::upgrade) {
            return Ok(s);
        }
        let cfg = &self.shared.cfg;
        let dir = cfg.state_dir.join("logs");
        fs::create_dir_all(&dir).map_err(Error::io(format!("creating {}", dir.display())))?;
        // A path of its own: a dying stream unlinks its FIFO, perhaps on
        // another thread while a new one for the same name is made.
        let fifo = cfg.ipc_dir.join(crate::LOG_FIFOS).join(format!("{name}.{generation}"));
        let s = self
            .shared
            .logs
            .open(&fifo, &dir.join(format!("{name}.log")), cfg.log_caps)
            .map_err(Error::io(format!("making the log of {name}")))?;
        self.logs.insert(name.to_string(), Arc::downgrade(&s));
        Ok(s)
    }

    /// A function's log, read for a gateway (`staccato logs`): what its
    /// stream holds is moved to the file first, so the newest output shows.
    fn read_log(&self, name: &str, lines: u32, after: Option<api::control::LogCursor>) -> Result<Reply, Refusal> {
        use api::control::{LogCursor, LOG_LINES_MAX, LOG_READ_MAX};
        // The name becomes a path: only a valid name gets that far.
        if !wire::valid_function_name(name) {
            return Err(Refusal::new(RefusalKind::NotFound, format!("no function named {name:?}")));
        }
        if lines > LOG_LINES_MAX {
            let msg = format!("{lines} lines asked for; at most {LOG_LINES_MAX}");
            return Err(Refusal::new(RefusalKind::BadRequest, msg));
        }
        if let Some(s) = self.logs.get(name).and_then(std::sync::Weak::upgrade) {
            s.drain();
        }
        let path = self.shared.cfg.state_dir.join("logs").join(format!("{name}.log"));
        if self.shared.function(name).is_none() && !path.is_file() {
            return Err(Refusal::new(RefusalKind::NotFound, format!("no log of {name} on this engine")));
        }
        let after = after.map(|c| sandbox::logs::Cursor { file: c.file, offset: c.offset });
        let (bytes, next) = sandbox::logs::read(&path, after, lines as usize, LOG_READ_MAX)
            .map_err(|e| Refusal::new(RefusalKind::Internal, format!("reading {}: {e}", path.display())))?;
        Ok(Reply::Logs {
            text: String::from_utf8_lossy(&bytes).into_owned(),
            next: LogCursor { file: next.file, offset: next.offset },
        })
    }

    fn unregister(&mut self, name: &str) -> Result<Reply, Refusal> {
        // Its deploys under way are no longer the newest: each fails as
        // superseded when its build ends (the build is not cut short).
        let deploying = self.deploying(name);
        if deploying {
            self.next_deploy += 1;
            self.deploys.insert(name.to_string(), self.next_deploy);
        }
        let old = self.shared.functions.write().unwrap_or_else(|p| p.into_inner()).remove(name);
        match old {
            Some(f) => {
                self.retire(&f, "it was removed", None);
                if let Ok(cache) = crate::code::open_cache(&self.shared.cfg) {
                    let _ = cache.unpin(name);
                }
                Ok(Reply::Unregistered { name: name.to_string() })
            }
            None if deploying => Ok(Reply::Unregistered { name: name.to_string() }),
            None => Err(Refusal::new(RefusalKind::NotFound, format!("no function named {name:?}"))),
        }
    }

    /// Stops a function for good. Nothing new is dispatched to it and its
    /// launcher is never started again. Queued calls go to `successor` (a
    /// redeploy) or are answered `function_removed`; running calls may
    /// finish for a while (`drain_tick`), then are answered the same.
    fn retire(&mut self, f: &Arc<Function>, why: &'static str, successor: Option<&Arc<Function>>) {
        let contained = self.shared.pool.is_some();
        let (queued, running) = {
            let mut core = f.lock_core();
            core.removed = true;
            let running = core.sched.running();
            if running == 0 {
                core.to_background(contained);
            }
            core.thaw();
            (core.sched.drain_queue(), running)
        };
        let mut replies = Vec::new();
        for call_id in queued {
            match successor {
                Some(new) => replies.extend(self.move_call(call_id, f, new)),
                None => {
                    let msg = format!("function {} was removed before the call ran ({why})", f.spec.name);
                    self.shared.fail_call(call_id, ErrorKind::FunctionRemoved, msg, &mut replies);
                }
            }
        }
        for r in replies {
            self.shared.post(r.thread, Cmd::Reply { conn: r.conn, frame: r.frame });
        }
        if running == 0 {
            self.finish_retire(f, why);
        } else {
            let grace = Duration::from_millis(f.spec.timeout_ms).min(DRAIN_MAX);
            log::info!("{}: {why}; waiting up to {grace:?} for {running} running calls", f.spec.name);
            self.draining.push(Draining { f: f.clone(), until: Instant::now() + grace, why });
        }
    }

    /// A queued call of a replaced function goes to its new version, with
    /// its input file, if it has one, moved to the new directory.
    fn move_call(&self, call_id: u64, old: &Arc<Function>, new: &Arc<Function>) -> Vec<crate::shared::GatewayReply> {
        let Some(mut rec) = self.shared.calls.remove(call_id) else { return Vec::new() };
        if let Some(crate::shared::Payload::Shm(_)) = rec.input {
            let name = wire::message::shm_file_name(call_id, wire::Kind::Invoke);
            if let Err(e) = sys::payload::forward(&old.dir, &new.dir, &name) {
                let mut replies = Vec::new();
                let msg =
                    format!("function {} was redeployed and the call's input could not follow: {e}", old.spec.name);
                old.lock_core().failed += 1;
                self.shared.trace(call_id, &rec, 0, ErrorKind::FunctionRemoved.name());
                replies.extend(self.shared.deliver(call_id, rec, Outcome::Err(ErrorKind::FunctionRemoved, msg), None));
                return replies;
            }
        }
        rec.func = new.clone();
        rec.nested = false;
        self.shared.submit(call_id, rec, crate::scheduler::NO_THREAD)
    }

    /// Ends retirements whose calls are done or whose grace is over.
    fn drain_tick(&mut self) {
        let now = Instant::now();
        let done: Vec<Draining> = {
            let (done, keep) = std::mem::take(&mut self.draining)
                .into_iter()
                .partition(|d| now >= d.until || d.f.lock_core().sched.running() == 0);
            self.draining = keep;
            done
        };
        for d in done {
            self.finish_retire(&d.f, d.why);
        }
    }

    /// Answers the calls still running in a retired function, then kills
    /// its processes and removes its files. The calls are answered first,
    /// so the workers' deaths that follow report nothing.
    fn finish_retire(&mut self, f: &Arc<Function>, why: &str) {
        let running: Vec<u64> = self.shared.calls.select(|r| Arc::ptr_eq(&r.func, f));
        let mut replies = Vec::new();
        for call_id in running {
            let msg = format!("function {} stopped while running the call: {why}", f.spec.name);
            self.shared.fail_call(call_id, ErrorKind::FunctionRemoved, msg, &mut replies);
        }
        for r in replies {
            self.shared.post(r.thread, Cmd::Reply { conn: r.conn, frame: r.frame });
        }
        let (pids, container) = {
            let mut core = f.lock_core();
            let mut pids: Vec<u32> = core.workers.values().map(|w| w.pid).filter(|p| *p != 0).collect();
            if core.launcher.pid != 0 {
                pids.push(core.launcher.pid);
            }
            // Its calls were answered above: whatever still runs is
            // unwanted (and may be put in the background a second time).
            if core.sched.running() == 0 {
                core.to_background(self.shared.pool.is_some());
            }
            core.thaw();
            (pids, core.launcher.container.take())
        };
        match (container, &self.shared.pool) {
            // Cleaning it kills everything inside.
            (Some(c), Some(pool)) => pool.give_back(c, true),
            // Its container went back to the pool when its launcher died,
            // and was cleaned there; the pids it left are its namespace's
            // numbers, which name other processes on the host.
            (None, Some(_)) => {}
            (_, None) => {
                for pid in pids {
                    let _ = sys::process::kill(pid);
                }
            }
        }
        let _ = fs::remove_dir_all(&f.dir);
        crate::secrets::remove(&f.dir);
        self.remove_code(&f.spec.name, &f.code_dir);
    }

    /// Starts `f`'s launcher. In a container, on a thread of its own:
    /// taking a container (a runc run, ~100 ms, when the pool has none
    /// ready), mounting and starting in it take milliseconds, and other
    /// functions' starts, deploys and reaping must not queue behind them;
    /// the thread hands the launcher back as [`SupervisorCmd::Launched`], to
    /// be reaped here. A plain process is forked here: it takes well under
    /// a millisecond, and its death signal (`kill_child_with_parent`) is
    /// tied to the thread that forks it, which must outlive it.
    fn start_launcher(&mut self, f: &Arc<Function>) {
        if self.shared.pool.is_none() || self.shared.cfg.containers.is_none() {
            let launched = launch(&self.shared, f);
            return self.launched(f.clone(), launched);
        }
        let (shared, func) = (self.shared.clone(), f.clone());
        let tx = crate::shared::lock(&self.shared.supervisor).clone();
        let spawned = std::thread::Builder::new().name("engine-start".into()).spawn(move || {
            // A bug in a start must still end the start: the function
            // would otherwise stay `starting` with nobody to retry it.
            let launched = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| launch(&shared, &func)))
                .unwrap_or_else(|_| {
                    failed(&shared, &func, "starting its launcher failed inside the engine (a bug)".into());
                    None
                });
            let _ = tx.send(SupervisorCmd::Launched(func, launched));
        });
        if let Err(e) = spawned {
            log::warn!("{}: no thread to start its launcher on ({e}); starting it here", f.spec.name);
            let launched = launch(&self.shared, f);
            self.launched(f.clone(), launched);
        }
    }

    /// A launcher started by `launch`: watched from now on.
    fn launched(&mut self, f: Arc<Function>, launched: Option<Launched>) {
        // Retired while it started, after its files were removed: what the
        // start made again goes (the start stopped its launcher itself).
        if f.lock_core().removed && self.draining.iter().all(|d| !Arc::ptr_eq(&d.f, &f)) {
            let _ = fs::remove_dir_all(&f.dir);
            crate::secrets::remove(&f.dir);
        }
        match launched {
            Some(Launched::Process(child)) => self.children.push((child, f)),
            Some(Launched::Contained(c, pid)) => self.contained.push((c, pid, f)),
            None => {}
        }
    }

    fn reap(&mut self) {
        // A contained launcher's end is reported by its container's init.
        let mut exited = Vec::new();
        self.contained.retain(|(c, pid, f)| {
            let current = f.lock_core().launcher.container.as_ref().is_some_and(|x| Arc::ptr_eq(x, c));
            // Only a container still the function's: one given back may be
            // in the pool's hands (its status lock held while it resets).
            let ended = current && c.poll_status().iter().any(|l| l.starts_with(&format!("EXIT {pid} ")));
            if ended && current {
                exited.push((*pid, f.clone()));
            }
            current && !ended
        });
        for (pid, f) in exited {
            self.launcher_exited(pid, &f);
        }
        let mut exited = Vec::new();
        self.children.retain_mut(|(c, f)| match c.try_wait() {
            Ok(None) => true,
            _ => {
                exited.push((c.id(), f.clone()));
                false
            }
        });
        for (pid, f) in exited {
            self.launcher_exited(pid, &f);
        }
    }

    /// A launcher process is gone. If it never said hello, this is the only
    /// news of it: mark the function failed with the reason from its log.
    fn launcher_exited(&mut self, pid: u32, f: &Arc<Function>) {
        {
            let mut core = f.lock_core();
            if core.launcher.pid != pid || core.launcher.state != LauncherState::Starting {
                return; // an I/O thread saw its channel close and handled it
            }
            core.launcher.state = LauncherState::Down;
            core.launcher.tx = None;
            core.launcher.pid = 0;
            core.launcher.failed_at = Some(Instant::now());
            core.launcher.last_error = log_tail(&f.log);
            if let (Some(c), Some(pool)) = (core.launcher.container.take(), &self.shared.pool) {
                pool.give_back(c, true);
            }
        }
        log::error!("{}: launcher exited before it was ready", f.spec.name);
        // Its channel never saw a writer, so no end-of-file will retire it.
        // Mailboxes keep order, so this lands before any new launcher's channel.
        for t in 0..self.shared.mailboxes.len() {
            self.shared.post(t, Cmd::DropChannel { func: f.clone(), worker_id: 0 });
        }
        for r in self.shared.pump(f, crate::scheduler::NO_THREAD) {
            self.shared.post(r.thread, Cmd::Reply { conn: r.conn, frame: r.frame });
        }
    }

    fn trace(&self, function: Option<&str>, limit: usize) -> Reply {
        // Copied under each shard's lock, formatted outside them: completing
        // calls on the I/O threads take these locks.
        let picked = self.shared.traces.recent(limit, |t| function.is_none_or(|f| t.function.name() == f));
        let shown = self.shared.remote.shown();
        Reply::Traces { traces: picked.iter().map(|t| t.to_api(&shown)).collect() }
    }
}

/// What a start thread hands the supervisor to reap.
pub(crate) enum Launched {
    Process(Child),
    /// A container and the launcher's pid inside it.
    Contained(Arc<sandbox::Container>, u32),
}

/// Starts `f`'s launcher (on a start thread). On failure the function is
/// marked down and its queued calls are answered.
fn launch(shared: &Shared, f: &Arc<Function>) -> Option<Launched> {
    // Retired before its start began: nothing to start (its files are
    // gone or going).
    if f.lock_core().removed {
        return None;
    }
    match spawn_launcher(shared, f) {
        Ok(launched) => launched,
        Err(e) => {
            log::error!("{}: starting launcher: {e}", f.spec.name);
            failed(shared, f, e.to_string());
            None
        }
    }
}

/// Marks `f`'s launcher down after a failed start and answers what waited.
fn failed(shared: &Shared, f: &Arc<Function>, why: String) {
    {
        let mut core = f.lock_core();
        core.launcher.state = LauncherState::Down;
        core.launcher.failed_at = Some(Instant::now());
        core.launcher.last_error = why;
    }
    for r in shared.pump(f, crate::scheduler::NO_THREAD) {
        shared.post(r.thread, Cmd::Reply { conn: r.conn, frame: r.frame });
    }
}

fn spawn_launcher(shared: &Shared, f: &Arc<Function>) -> crate::Result<Option<Launched>> {
    let cfg = &shared.cfg;
    fs::create_dir_all(f.dir.join("shm")).map_err(Error::io(format!("creating {}", f.dir.display())))?;
    let ch = sys::channel::EngineChannel::create(&f.dir, 0).map_err(Error::io("creating the launcher channel"))?;
    if let (Some(pool), Some(cc)) = (shared.pool.clone(), cfg.containers.clone()) {
        return spawn_in_container(shared, f, ch, pool, &cc);
    }
    let writer = || f.log.writer().map_err(Error::io(format!("opening {}", f.log.fifo().display())));
    let view = crate::code::View::host(cfg, &f.code_dir, &f.deps);
    let mut cmd = crate::code::launcher_command(cfg, &f.spec, &view)?;
    cmd.envs(&f.spec.env)
        .env("STACCATO_FUNCTION", &f.spec.name)
        .env("STACCATO_IPC_DIR", &f.dir)
        .env("STACCATO_PAYLOAD_MAX", cfg.payload_len_max.to_string())
        .env("STACCATO_SPIN_US", shared.worker_spin_us(&f.spec).to_string())
        .stdin(Stdio::null())
        .stdout(writer()?)
        .stderr(writer()?);
    if !f.spec.secrets.is_empty() {
        // No isolation here: the engine's user can read them anyway.
        cmd.env("STACCATO_SECRETS_DIR", crate::secrets::dir_of(&f.dir));
    }
    sys::process::kill_child_with_parent(&mut cmd);
    let mut child = cmd.spawn().map_err(Error::io(format!("running {:?}", cmd.get_program())))?;
    let pid = child.id();
    let owner = launcher_owner(shared, f);
    {
        let mut core = f.lock_core();
        if core.removed {
            // Retired while it started: nobody will stop it but us. The
            // supervisor still reaps it.
            drop(core);
            let _ = child.kill();
            return Ok(Some(Launched::Process(child)));
        }
        core.launcher.state = LauncherState::Starting;
        core.launcher.tx = Some(Arc::new(ch.tx));
        core.launcher.pid = pid;
        core.launcher.owner = owner;
    }
    shared.post(owner, Cmd::AdoptChannel { func: f.clone(), worker_id: 0, rx: ch.rx });
    Ok(Some(Launched::Process(child)))
}

/// The I/O thread to read a new launcher's channel: where its workers had
/// moved (`Follow`), else the next in turn.
fn launcher_owner(shared: &Shared, f: &Function) -> usize {
    let home = f.lock_core().follow.home;
    home.unwrap_or_else(|| shared.next_owner.fetch_add(1, Ordering::Relaxed) % shared.mailboxes.len())
}

/// Starts the launcher in a container from the isolation pool: no runc
/// command on this path (Nuka §III.A).
fn spawn_in_container(
    shared: &Shared,
    f: &Arc<Function>,
    ch: sys::channel::EngineChannel,
    pool: sandbox::Pool,
    cc: &crate::config::ContainerConfig,
) -> crate::Result<Option<Launched>> {
    use crate::config::{CONTAINER_CODE, CONTAINER_IPC};
    let cfg = &shared.cfg;
    let c = pool.take(f.spec.runtime == crate::spec::Runtime::Python)?;
    let start = (|| -> crate::Result<u32> {
        // The function's directory stays the engine's, so nothing in it
        // (the payload directory, the channels) can be swapped for a link
        // to the host's files while the engine works on it as root; the
        // payload directory inside it is the function's.
        let shm = f.dir.join("shm");
        if !fs::symlink_metadata(&shm).is_ok_and(|m| m.is_dir()) {
            return Err(Error::Io {
                what: format!("{} is not a directory", shm.display()),
                error: std::io::ErrorKind::InvalidData.into(),
            });
        }
        std::os::unix::fs::lchown(&shm, Some(c.uid), Some(c.uid))
            .map_err(Error::io(format!("chown {}", shm.display())))?;
        // Inputs of calls that waited while the last container went.
        sys::payload::give_all(&f.dir, c.uid).map_err(Error::io("chown queued inputs"))?;
        crate::shared::give_channel(&f.dir, 0, c.uid).map_err(Error::io("chown channel 0"))?;
        let view = crate::code::View::container(cc, &f.deps);
        let cmd = crate::code::launcher_command(cfg, &f.spec, &view)?;
        let mut env: Vec<(String, String)> = vec![
            ("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into()),
            ("HOME".into(), "/tmp".into()),
            ("LANG".into(), "C.UTF-8".into()),
        ];
        env.extend(f.spec.env.iter().map(|(k, v)| (k.clone(), v.clone())));
        if f.spec.runtime == crate::spec::Runtime::Python {
            // The interpreter's own library first; a deployer's path after
            // it (in a warm container the interpreter has started already:
            // there it is the environment of what the function starts).
            for (k, v) in &cc.python_env {
                match env.iter_mut().find(|(name, _)| name == k) {
                    Some((_, theirs)) if !theirs.is_empty() => *theirs = format!("{v}:{theirs}"),
                    Some((_, theirs)) => v.clone_into(theirs),
                    None => env.push((k.clone(), v.clone())),
                }
            }
        }
        for (k, v) in cmd.get_envs() {
            if let Some(v) = v {
                env.push((k.to_string_lossy().into_owned(), v.to_string_lossy().into_owned()));
            }
        }
        env.push(("STACCATO_FUNCTION".into(), f.spec.name.clone()));
        env.push(("STACCATO_IPC_DIR".into(), CONTAINER_IPC.into()));
        env.push(("STACCATO_PAYLOAD_MAX".into(), cfg.payload_len_max.to_string()));
        let spin = shared.worker_spin_us(&f.spec);
        env.push(("STACCATO_SPIN_US".into(), spin.to_string()));
        if let Some(n) = &c.net {
            env.push(("STACCATO_HOST_IP".into(), n.host_ip.to_string()));
        }
        let mut argv = vec![cmd.get_program().to_string_lossy().into_owned()];
        argv.extend(cmd.get_args().map(|a| a.to_string_lossy().into_owned()));
        let mut mounts = vec![
            sandbox::Mount { src: f.code_dir.clone(), dst: CONTAINER_CODE.into(), read_only: true, exec: false },
            sandbox::Mount { src: f.dir.clone(), dst: CONTAINER_IPC.into(), read_only: false, exec: false },
        ];
        if !f.spec.secrets.is_empty() {
            // Readable by this container's user only, read-only inside.
            let src = crate::secrets::give(&f.dir, c.uid).map_err(Error::io("giving the secrets"))?;
            mounts.push(sandbox::Mount { src, dst: api::secrets::SECRETS_DIR.into(), read_only: true, exec: false });
            env.push(("STACCATO_SECRETS_DIR".into(), api::secrets::SECRETS_DIR.into()));
        }
        mounts.extend(crate::code::View::dep_mounts(&f.deps));
        let limits =
            sandbox::Limits { memory_bytes: f.spec.memory_bytes, pids: f.spec.pids, cpu_shares: f.spec.cpu_shares };
        let python = f.spec.runtime == crate::spec::Runtime::Python;
        let log = f.log.fifo().to_path_buf();
        let s = sandbox::Start { mounts, limits, argv, env, cwd: CONTAINER_CODE.into(), log, python };
        Ok(c.start(&s)?)
    })();
    let pid = match start {
        Ok(pid) => pid,
        Err(e) => {
            pool.give_back(Arc::clone(&c), true);
            return Err(e);
        }
    };
    let owner = launcher_owner(shared, f);
    {
        let mut core = f.lock_core();
        if core.removed {
            // Retired while it started: cleaning the container kills it.
            drop(core);
            pool.give_back(c, true);
            return Ok(None);
        }
        core.launcher.state = LauncherState::Starting;
        core.launcher.tx = Some(Arc::new(ch.tx));
        core.launcher.pid = pid;
        core.launcher.container = Some(c.clone());
        core.launcher.idle_destroyed = false;
        core.launcher.owner = owner;
        core.oom_at = None;
    }
    shared.post(owner, Cmd::AdoptChannel { func: f.clone(), worker_id: 0, rx: ch.rx });
    Ok(Some(Launched::Contained(c, pid)))
}

fn superseded(name: &str) -> Refusal {
    Refusal::new(
        RefusalKind::Superseded,
        format!("a newer deploy or a removal of {name} was asked for while this deploy was under way"),
    )
}

/// A deploy's slow part, on its own thread: the source unpacked, its
/// dependencies installed and its code compiled, within the engine's build
/// timeout for the whole deploy.
fn build(shared: &Shared, spec: FunctionSpec, archive: &[u8], seq: u64, generation: u128, code_dir: PathBuf) -> Built {
    let cfg = &shared.cfg;
    let deadline = cfg.containers.as_ref().map(|cc| Instant::now() + cc.build.timeout);
    let deps = api::archive::unpack(archive, &code_dir, &api::archive::Limits::DEFAULT)
        .map_err(|e| Refusal::new(RefusalKind::InvalidSpec, format!("unpacking the source: {e}")))
        .and_then(|_| {
            crate::code::prepare(cfg, &shared.builds, &spec, &code_dir, deadline)
                .map_err(|e| Refusal::new(RefusalKind::BuildFailed, e.to_string()))
        });
    if deps.as_ref().is_ok_and(|d| !d.entries.is_empty()) {
        // The entries just used are safe from eviction for the cache's
        // grace period, long past this deploy's start.
        match crate::code::open_cache(cfg).and_then(|c| c.evict_to_budget().map_err(Error::io("evicting"))) {
            Ok(gone) if !gone.is_empty() => log::info!("package cache: evicted {} entries", gone.len()),
            Ok(_) => {}
            Err(e) => log::warn!("package cache eviction: {e}"),
        }
    }
    if deps.is_err() {
        // Only its own directory: the supervisor removes the function's
        // when no other deploy of it is building (`remove_code`).
        let _ = fs::remove_dir_all(&code_dir);
    }
    Built { seq, name: spec.name.clone(), spec: Some(spec), generation, code_dir, deps }
}

/// A deploy's generation: its time, made unique by its sequence number
/// (two deploys in one microsecond would share a directory).
fn deploy_generation(seq: u64) -> u128 {
    let us = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros());
    us * 1000 + u128::from(seq % 1000)
}

fn code_dir_of(shared: &Shared, name: &str, generation: u128) -> PathBuf {
    shared.cfg.state_dir.join("functions").join(name).join(format!("{generation}"))
}

/// Removes a deploy's code, and the function's directory if nothing else
/// of it is left.
fn remove_code_dir(dir: &std::path::Path) {
    let _ = fs::remove_dir_all(dir);
    if let Some(parent) = dir.parent() {
        let _ = fs::remove_dir(parent);
    }
}

/// The last lines of a function's log, to explain why it failed.
pub(crate) fn log_tail(log: &sandbox::logs::Stream) -> String {
    log.drain();
    let text = File::open(log.path()).and_then(|mut f| {
        use std::io::{Read, Seek, SeekFrom};
        let len = f.metadata()?.len();
        f.seek(SeekFrom::Start(len.saturating_sub(4000)))?;
        let mut s = String::new();
        f.read_to_string(&mut s).or(Ok::<usize, std::io::Error>(0))?;
        Ok(s)
    });
    let text = text.unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let tail = lines[lines.len().saturating_sub(15)..].join("\n");
    if tail.is_empty() {
        "(the process exited without output)".into()
    } else {
        tail
    }
}
