//! State shared by the engine's threads, and the call flows that run on
//! whichever I/O thread received the event (Nightcore §3.2, §4.1).
//!
//! Locking: a function's `core` mutex may be held while taking a shard of
//! `calls` (one at a time), never the other way round. Writes to a worker's `e2w` pipe may come
//! from any thread: each is one atomic 1 KB write (PIPE_BUF), so no
//! ownership is needed for them. A gateway connection is written only by the
//! I/O thread that owns it; other threads send it replies by mailbox.

use crate::config::{EngineConfig, Placement};
use crate::scheduler::{Removed, Scheduler};
use crate::spec::FunctionSpec;
use mio::{Token, Waker};
use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};
use wire::frame::{FrameHeader, FrameKind, Timing, FRAME_HEADER_LEN};
use wire::message::{shm_file_name, Header, Kind, Message, FLAG_PAYLOAD_IN_SHM, INLINE_LEN_MAX};
use wire::ErrorKind;

/// A deployed function on this engine.
pub(crate) struct Function {
    pub spec: FunctionSpec,
    /// This function's part of the IPC directory (`STACCATO_IPC_DIR`).
    pub dir: PathBuf,
    pub code_dir: PathBuf,
    /// Its dependencies in the package cache.
    pub deps: crate::code::Deps,
    /// Its stdout and stderr (one stream per name, shared by generations).
    pub log: Arc<sandbox::logs::Stream>,
    /// When this version was built and registered.
    pub registered: Instant,
    /// Its spec's fingerprint (reported in every status, so made once).
    pub fingerprint: String,
    pub core: Mutex<FnCore>,
}

pub(crate) struct FnCore {
    pub sched: Scheduler,
    pub workers: HashMap<u32, WorkerHandle>,
    pub launcher: Launcher,
    pub removed: bool,
    pub completed: u64,
    pub failed: u64,
    /// Its container is paused (cgroup freezer); the next call resumes it.
    pub frozen_at: Option<Instant>,
    /// Last time a call arrived or was seen running (monotonic ns).
    pub last_active_ns: u64,
    /// When the kernel's OOM killer last struck this function's container:
    /// the launcher's and the workers' channels close in any order, and
    /// each call they were running must still be told `out_of_memory`.
    pub oom_at: Option<Instant>,
    /// Where its calls come from, for a runtime whose one process serves
    /// all its workers: their channels follow them (`Scheduler::Follow`).
    pub follow: crate::scheduler::Follow,
}

impl Function {
    /// Locks the function's core. Lock order (module doc): never while
    /// holding a shard of `calls`, which debug builds check.
    pub fn lock_core(&self) -> MutexGuard<'_, FnCore> {
        debug_assert!(!crate::calls::shard_held(), "lock order: {}'s core taken inside a calls shard", self.spec.name);
        lock(&self.core)
    }
}

impl FnCore {
    /// SIGKILLs one of the function's processes. A pid is what the process
    /// itself reported; in a container that is its pid namespace's number.
    pub fn kill(&self, pid: u32) {
        let _ = match &self.launcher.container {
            Some(c) => c.kill(pid),
            None => sys::process::kill(pid),
        };
    }

    /// Puts a retired function's processes in the background (nice 19, as
    /// the isolation pool's containers wait), before they are thawed and
    /// stopped: what they still do (a launcher's exit, the kernel freeing
    /// its heap: milliseconds for Node.js) then waits for the calls and
    /// worker starts that go on, the new version's first worker included.
    /// Only for a function with no call running: those finish at their
    /// own priority. `contained`: the engine runs functions in containers
    /// (then without one there is nothing left to reach: the pids a
    /// container's processes reported are its namespace's numbers).
    pub fn to_background(&self, contained: bool) {
        debug_assert_eq!(self.sched.running(), 0, "a function running calls put in the background");
        match &self.launcher.container {
            Some(c) => {
                if let Err(e) = c.to_background() {
                    log::debug!("retiring container: {e}");
                }
            }
            None if contained => {}
            None => {
                let workers = self.workers.values().map(|w| w.pid);
                for pid in workers.chain([self.launcher.pid]).filter(|p| *p != 0) {
                    let _ = sys::cpu::set_nice_all_threads(pid, RETIRED_NICE);
                }
            }
        }
    }

    /// Resumes a paused container (~0.1 ms: one cgroup file write). Called
    /// with the lock held, so housekeeping cannot freeze it again meanwhile.
    pub fn thaw(&mut self) {
        if self.frozen_at.take().is_some() {
            if let Some(c) = &self.launcher.container {
                c.thaw();
            }
        }
    }
}

pub(crate) struct WorkerHandle {
    pub tx: Arc<File>,
    pub pid: u32,
}

pub(crate) use api::control::LauncherState;

pub(crate) struct Launcher {
    pub state: LauncherState,
    pub tx: Option<Arc<File>>,
    pub pid: u32,
    /// The I/O thread reading the launcher's channel.
    pub owner: usize,
    /// When it said hello, to tell a crash loop from a rare crash.
    pub ready_at: Option<Instant>,
    /// Launchers in a row that died within `LAUNCH_RETRY` of their hello
    /// while running no call: a crash loop. One that dies in the middle of
    /// a call crashed in the function's code, and that call is told so.
    pub quick_crashes: u32,
    /// One of its workers died running a call since its hello.
    pub crashed_mid_call: bool,
    pub failed_at: Option<Instant>,
    pub last_error: String,
    /// The container the launcher runs in (container isolation only).
    pub container: Option<Arc<sandbox::Container>>,
    /// Destroyed for being idle too long: start again only for a call.
    pub idle_destroyed: bool,
}

/// The host's pid of one of a function's processes, from the pid it
/// reported: in a container that is its namespace's number, so the host's
/// process of that number in that container, never the host's own. Reads
/// /proc in a container: not under the function's lock.
pub(crate) fn host_pid(container: Option<&sandbox::Container>, pid: u32) -> Option<u32> {
    match container {
        _ if pid == 0 => None,
        Some(c) => c.host_pid(pid),
        None => Some(pid),
    }
}

/// A worker that has not said hello this long after it was asked for is
/// given up on (its launcher failed to start it).
pub(crate) const WORKER_START_MAX_NS: u64 = 5_000_000_000;

/// The nice value of a retired function's processes on their way out.
const RETIRED_NICE: i32 = 19;

/// A worker must have been idle this long before the pool may shrink by it.
pub(crate) const WORKER_IDLE_MIN_NS: u64 = 1_000_000_000;

/// How long after an OOM kill a closing channel is blamed on it.
pub(crate) const OOM_MEMORY: Duration = Duration::from_secs(2);

/// A launcher that died before saying hello is retried no sooner than this.
pub(crate) const LAUNCH_RETRY: Duration = Duration::from_secs(1);

/// This many quick crashes in a row is a crash loop: back off like a
/// launcher that cannot start, instead of forking a new one each time.
pub(crate) const CRASH_LOOP_AFTER: u32 = 3;

/// Where a call came from, i.e. where its result goes.
pub(crate) enum Origin {
    Gateway {
        thread: usize,
        conn: Token,
    },
    Worker {
        func: Arc<Function>,
        tx: Arc<File>,
        /// The I/O thread that reads the caller's channel.
        thread: usize,
    },
    /// A client connection of the engine's own front door (`front`).
    Http {
        thread: usize,
        conn: Token,
        close: bool,
    },
}

pub(crate) enum Payload {
    Bytes(Vec<u8>),
    /// In a payload file of this length, in the directory of the function
    /// whose channel it arrived on or is going to.
    Shm(usize),
}

pub(crate) enum Outcome {
    Ok(Payload),
    Err(ErrorKind, String),
}

/// The tracing record of one in-flight call (Nightcore Figure 2 ④).
pub(crate) struct CallRecord {
    pub func: Arc<Function>,
    pub origin: Origin,
    pub input: Option<Payload>,
    pub parent_call_id: u64,
    pub deadline_us: u64,
    pub recv_ns: u64,
    /// The same instant on the wall clock, the clock deadlines use.
    pub recv_unix_us: u64,
    pub dispatch_ns: u64,
    /// The worker running it, with its pid (to recycle it on timeout).
    pub worker: Option<(u32, u32)>,
    /// Time this call's own internal calls spent queued: not part of its
    /// processing time (Nightcore §4.1).
    pub sub_queue_ns: u64,
    /// It waited for a worker that started after it arrived.
    pub cold: bool,
    /// Its callers hold workers of its function: it is dispatched first and
    /// beyond τ (scheduler module doc).
    pub nested: bool,
    /// An asynchronous call from the gateway's queue: dispatched after
    /// ordinary calls (scheduler module doc).
    pub background: bool,
    /// Its span, when it is traced (`otel`).
    pub trace: Option<crate::otel::SpanCtx>,
    /// Its CPU time (µs), when its runtime measured it (`--cpu-per-call`).
    pub cpu_us: Option<u32>,
    /// Came in from another server (`remote`): how many calls are above it
    /// there (at most `--max-call-depth`, 1024). Its `parent_call_id` here
    /// is 0, the root of a chain here.
    pub depth_above: u16,
}

/// A finished call's timeline, kept in a ring for `staccato trace`. Raw
/// numbers only: recording is on the hot path, formatting is not.
#[derive(Clone)]
pub(crate) struct TraceRecord {
    pub call_id: u64,
    pub parent_call_id: u64,
    pub function: TracedFn,
    pub worker_id: u32,
    pub receive_ns: u64,
    pub dispatch_ns: u64,
    pub complete_ns: u64,
    pub outcome: &'static str,
    pub hop: Hop,
    /// It waited for a worker that started after it arrived.
    pub cold: bool,
    /// Its CPU time (µs), if measured.
    pub cpu_us: Option<u32>,
}

/// The function a traced call ran: here, or on another server.
#[derive(Clone)]
pub(crate) enum TracedFn {
    Here(Arc<Function>),
    Elsewhere(Arc<str>),
}

impl TracedFn {
    pub fn name(&self) -> &str {
        match self {
            TracedFn::Here(f) => &f.spec.name,
            TracedFn::Elsewhere(n) => n,
        }
    }
}

/// Whether a traced call crossed servers (`remote`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Hop {
    Local,
    /// This engine sent it through a gateway to another server.
    Out,
    /// Another server's engine sent it here through a gateway.
    In,
}

/// Sent to an I/O thread's mailbox; the thread is woken through eventfd.
pub(crate) enum Cmd {
    AdoptConn(std::net::TcpStream),
    AdoptChannel {
        func: Arc<Function>,
        worker_id: u32,
        rx: File,
    },
    DropChannel {
        func: Arc<Function>,
        worker_id: u32,
    },
    Reply {
        conn: Token,
        frame: Vec<u8>,
    },
    /// Accept client connections on it (the front door).
    Listen(std::net::TcpListener),
    /// Serve this front-door client connection from now on (its client
    /// sends from this thread's CPU now).
    AdoptHttp(Box<crate::io_thread::HttpConn>),
    /// Close gateway connections that have gone silent (from the clock).
    CheckConns,
}

pub(crate) struct Mailbox {
    pub queue: Mutex<Vec<Cmd>>,
    pub waker: Waker,
}

pub(crate) enum SupervisorCmd {
    StartLauncher(Arc<Function>),
    /// A control request, the bytes attached to it, and where the answer goes.
    Control(Box<api::control::Request>, Vec<u8>, Sender<Result<api::control::Reply, api::control::Refusal>>),
    /// A deploy's build finished on its own thread.
    Built(Box<crate::supervisor::Built>),
    /// A launcher started on its own thread (None: it failed, or its
    /// function was retired meanwhile and it is already stopped).
    Launched(Arc<Function>, Option<crate::supervisor::Launched>),
}

pub(crate) struct Shared {
    pub cfg: EngineConfig,
    pub functions: RwLock<HashMap<String, Arc<Function>>>,
    pub calls: crate::calls::CallTable,
    pub mailboxes: Vec<Mailbox>,
    pub supervisor: Mutex<Sender<SupervisorCmd>>,
    pub traces: crate::calls::TraceRing,
    /// Spans to an OpenTelemetry collector, when the engine has one.
    pub tracer: Option<crate::otel::Tracer>,
    pub next_worker_id: AtomicU32,
    pub next_owner: AtomicUsize,
    pub cpus: Vec<usize>,
    /// The isolation pool, with container isolation.
    pub pool: Option<sandbox::Pool>,
    /// This host's RAM: no function may ask for more.
    pub memory_total_bytes: u64,
    /// Where deploy-time builds run.
    pub builds: Arc<crate::build::Builds>,
    /// Drains the functions' output into capped logs.
    pub logs: sandbox::logs::Logs,
    /// Internal calls to and from other servers.
    pub remote: crate::remote::Remote,
    /// With `--internal-calls-via`: where every internal call goes instead.
    pub via_gateway: Option<crate::via_gateway::ViaGateway>,
    /// The gateway this engine is the front door for (`Engine::serve_front`).
    pub front: std::sync::OnceLock<Arc<dyn crate::front::FrontDoor>>,
    /// Keeps the vCPUs from halting while calls come (`awake`).
    pub awake: Arc<crate::awake::Awake>,
    /// Wakes the clock thread for a call due before it would wake (`clock`).
    pub alarm: crate::clock::Alarm,
}

/// Locks a mutex, carrying on if a thread panicked while holding it: every
/// critical section here leaves the data consistent between statements, and
/// one panicking thread must not take the whole engine down.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What `pump` decided, done after the function's lock is released.
enum Action {
    Dispatch {
        tx: Arc<File>,
        header: Header,
        input: Payload,
        trace: Option<crate::otel::SpanCtx>,
    },
    CreateWorker {
        launcher_tx: Arc<File>,
        worker_id: u32,
    },
    StartLauncher,
    Stop {
        tx: Arc<File>,
        worker_id: u32,
    },
    /// Pins a multiplexed function's process, all its threads, to `cpu`
    /// (it moved: `Follow`); done after the function's lock is released.
    Pin {
        container: Option<Arc<sandbox::Container>>,
        pid: u32,
        cpu: usize,
    },
    Fail {
        call_id: u64,
        kind: ErrorKind,
        message: String,
    },
}

/// A reply for a gateway connection, to be written by its owner thread.
pub(crate) struct GatewayReply {
    pub thread: usize,
    pub conn: Token,
    pub frame: Vec<u8>,
}

impl Shared {
    pub fn function(&self, name: &str) -> Option<Arc<Function>> {
        self.functions.read().unwrap_or_else(|p| p.into_inner()).get(name).cloned()
    }

    pub fn functions(&self) -> Vec<Arc<Function>> {
        self.functions.read().unwrap_or_else(|p| p.into_inner()).values().cloned().collect()
    }

    pub fn post(&self, thread: usize, cmd: Cmd) {
        let mb = &self.mailboxes[thread % self.mailboxes.len()];
        lock(&mb.queue).push(cmd);
        if let Err(e) = mb.waker.wake() {
            log::error!("waking I/O thread {thread}: {e}");
        }
    }

    /// The CPU I/O thread `thread` runs on under packed placement.
    pub fn cpu_of(&self, thread: usize) -> Option<usize> {
        (self.cfg.placement == Placement::Packed).then(|| self.cpus[thread % self.cpus.len()])
    }

    /// The spin a function's workers get (`STACCATO_SPIN_US`): see
    /// `EngineConfig::worker_spin_us_for`. Its calls are received on the
    /// vCPUs that have an I/O thread, at most one per thread.
    pub fn worker_spin_us(&self, spec: &FunctionSpec) -> u32 {
        let fed_from = self.mailboxes.len().min(self.cpus.len());
        self.cfg.worker_spin_us_for(spec.runtime, spec.max_workers, fed_from, self.cpus.len())
    }

    /// The first I/O thread that runs on `cpu` under packed placement.
    pub fn thread_on(&self, cpu: usize) -> Option<usize> {
        (0..self.mailboxes.len()).find(|&i| self.cpu_of(i) == Some(cpu))
    }

    /// Registers a call and queues it on its function. `cur` is the calling
    /// I/O thread (for dispatch locality). Returns gateway replies to send.
    pub fn submit(&self, call_id: u64, rec: CallRecord, cur: usize) -> Vec<GatewayReply> {
        let func = rec.func.clone();
        let (now, nested, background, deadline_us) = (rec.recv_ns, rec.nested, rec.background, rec.deadline_us);
        if let Err(rec) = self.calls.insert(call_id, rec) {
            // Internal calls are checked earlier (`ancestry`), with a better
            // message; this is every origin's last line. The call in flight
            // keeps its record and its answer.
            let msg = format!("call id {call_id:016x} is already in flight");
            return self.deliver(call_id, *rec, Outcome::Err(ErrorKind::BadRequest, msg), None).into_iter().collect();
        }
        // Its deadline is the clock's to watch.
        self.alarm.registered(deadline_us);
        let (removed, full) = {
            let mut core = func.lock_core();
            let full = core.sched.queued() >= func.spec.max_queue as usize;
            if !core.removed && !full {
                if nested {
                    core.sched.enqueue_nested(call_id, now);
                } else if background {
                    core.sched.enqueue_background(call_id, now);
                } else {
                    core.sched.enqueue(call_id, now);
                }
                core.last_active_ns = now;
                core.thaw();
                self.follow_callers(&func, &mut core, cur, now);
            }
            (core.removed, full)
        };
        if full && !removed {
            // Shed at once: waiting behind a full queue would only end in a
            // timeout, holding the caller (and its worker) until then.
            let mut replies = Vec::new();
            let msg = format!(
                "function {} has {} calls waiting for a worker, its limit (max_queue); retry later",
                func.spec.name, func.spec.max_queue
            );
            self.fail_call(call_id, ErrorKind::Overloaded, msg, &mut replies);
            return replies;
        }
        if removed {
            // Removed between the caller's lookup and now: answer at once.
            let mut replies = Vec::new();
            let msg = format!("function {} was removed", func.spec.name);
            self.fail_call(call_id, ErrorKind::NotFound, msg, &mut replies);
            return replies;
        }
        // A clock of its own: a call moved here by a redeploy
        // (`supervisor::move_call`) was received long ago.
        self.pump(&func, cur)
    }

    /// Counts where a call of a multiplexed function was submitted, and
    /// moves the function's workers to the vCPU nearly all come from
    /// (`Follow`): only under packed placement, once its launcher is up, and
    /// not when its workers are processes of their own (Python's fork mode:
    /// each is pinned where its channel is read, and a move would fork them
    /// all again). The next pump pins its process there and stops its idle
    /// workers elsewhere (`retire_moved`).
    fn follow_callers(&self, func: &Function, core: &mut FnCore, cur: usize, now: u64) {
        if !func.spec.runtime.multiplexed() || core.launcher.state != LauncherState::Ready {
            return;
        }
        if cur >= self.mailboxes.len() {
            return; // not an I/O thread's call (the supervisor's)
        }
        let home = core.follow.home.unwrap_or(core.launcher.owner);
        let (Some(from), Some(here)) = (self.cpu_of(cur), self.cpu_of(home)) else { return };
        let Some(cpu) = core.follow.note(from, here, now) else { return };
        let launcher = core.launcher.pid;
        if core.workers.values().any(|w| w.pid != 0 && w.pid != launcher) {
            return;
        }
        // The thread that submitted the call closing the window is almost
        // always on that vCPU: with more threads than vCPUs, moved
        // functions then spread over that vCPU's threads.
        let Some(to) = (if from == cpu { Some(cur) } else { self.thread_on(cpu) }) else { return };
        core.follow.home = Some(to);
        core.follow.pin = true;
        log::info!("{}: its calls now come from vCPU {cpu}: its workers move there (I/O thread {to})", func.spec.name);
    }

    /// For a multiplexed function that moved (`follow_callers`): pins its
    /// process there, and stops its idle workers whose channels are read
    /// elsewhere before any is given a call; their replacements start on
    /// its new thread.
    fn retire_moved(&self, func: &Function, core: &mut FnCore, out: &mut Vec<Action>) {
        let Some(home) = core.follow.home else { return };
        if !func.spec.runtime.multiplexed() || core.launcher.state != LauncherState::Ready {
            return;
        }
        if std::mem::take(&mut core.follow.pin) {
            if let Some(cpu) = self.cpu_of(home) {
                out.push(Action::Pin { container: core.launcher.container.clone(), pid: core.launcher.pid, cpu });
            }
        }
        for worker_id in core.sched.retire_idle_not_of(home) {
            if let Some(h) = core.workers.get(&worker_id) {
                out.push(Action::Stop { tx: h.tx.clone(), worker_id });
            }
        }
    }

    /// How deep a new call `call_id` under `parent` would be (its callers,
    /// counted up to the external call), how many of those callers are calls
    /// of `callee`, each holding one of its workers while it waits, and
    /// whether `call_id` is already in flight.
    pub fn ancestry(
        &self,
        call_id: u64,
        parent: u64,
        callee: Option<&Arc<Function>>,
        depth_max: u32,
    ) -> (u32, u32, bool) {
        let duplicate = self.calls.contains(call_id);
        let (mut depth, mut held, mut id) = (0u32, 0u32, parent);
        // Bounded: a chain longer than depth_max is refused anyway. One
        // shard at a time: an ancestor that finishes meanwhile ends the
        // walk early, which only under-counts a chain that is unwinding.
        while id != 0 && depth <= depth_max {
            let Some((parent, mine, above)) = self
                .calls
                .with(id, |r| (r.parent_call_id, callee.is_some_and(|c| Arc::ptr_eq(&r.func, c)), r.depth_above))
            else {
                break;
            };
            // A call that came from another server counts the calls above
            // it there (its parent here is 0: the walk ends with it).
            depth = depth.saturating_add(1 + u32::from(above));
            held += u32::from(mine);
            id = parent;
        }
        (depth, held, duplicate)
    }

    /// A queued call of `f` to refuse because no worker of `f` will ever be
    /// free for it: all `max_workers` run calls that wait, through their own
    /// internal calls, for calls queued on `f`. That is several chains of
    /// calls holding the workers between them (one chain alone is refused
    /// on arrival, `ancestry`). The newest of the waiting calls, once it has
    /// waited `min_wait_ns`: refused, its chain can unwind and free workers.
    pub fn deadlock_victim(&self, f: &Arc<Function>, now_ns: u64, min_wait_ns: u64) -> Option<u64> {
        let queued = {
            let core = f.lock_core();
            // Only a nested call (its callers hold workers of `f`) can be
            // waited for by one of `f`'s running calls.
            if core.sched.running() < f.spec.max_workers || core.sched.nested_ids().is_empty() {
                return None;
            }
            core.sched.nested_ids()
        };
        let running: HashSet<u64> =
            self.calls.select(|r| r.worker.is_some() && Arc::ptr_eq(&r.func, f)).into_iter().collect();
        if running.len() < f.spec.max_workers as usize {
            return None;
        }
        let (mut waiting, mut victim) = (HashSet::new(), None::<(u64, u64)>);
        for q in queued {
            let Some((recv_ns, mut id)) = self.calls.with(q, |r| (r.recv_ns, r.parent_call_id)) else { continue };
            let mut holds = false;
            // One shard at a time, bounded like `ancestry`.
            for _ in 0..=self.cfg.max_call_depth {
                if id == 0 {
                    break;
                }
                if running.contains(&id) {
                    waiting.insert(id);
                    holds = true;
                }
                let Some(parent) = self.calls.with(id, |r| r.parent_call_id) else { break };
                id = parent;
            }
            if holds && victim.is_none_or(|(t, _)| recv_ns > t) {
                victim = Some((recv_ns, q));
            }
        }
        let (recv_ns, call_id) = victim?;
        (waiting.len() == running.len() && now_ns.saturating_sub(recv_ns) >= min_wait_ns).then_some(call_id)
    }

    /// Dispatches what τ and the idle workers allow, grows and shrinks the
    /// pool, (re)starts the launcher. Called after anything that may change
    /// what can run: an arrival, a completion, a worker joining or leaving.
    pub fn pump(&self, func: &Arc<Function>, cur: usize) -> Vec<GatewayReply> {
        self.pump_inner(func, cur, false, sys::clock::monotonic_ns())
    }

    /// `pump` at `now`, a monotonic clock reading the caller has just
    /// taken (one clock read fewer on a call's path).
    pub fn pump_at(&self, func: &Arc<Function>, cur: usize, now: u64) -> Vec<GatewayReply> {
        self.pump_inner(func, cur, false, now)
    }

    /// `pump`, plus (with `housekeeping`) stopping surplus idle workers.
    /// Shrinking happens only from the periodic housekeeping tick.
    pub fn pump_with(&self, func: &Arc<Function>, cur: usize, housekeeping: bool) -> Vec<GatewayReply> {
        self.pump_inner(func, cur, housekeeping, sys::clock::monotonic_ns())
    }

    fn pump_inner(&self, func: &Arc<Function>, cur: usize, housekeeping: bool, now: u64) -> Vec<GatewayReply> {
        let actions = {
            let mut core = func.lock_core();
            if core.removed {
                return Vec::new();
            }
            let mut actions = Vec::new();
            self.retire_moved(func, &mut core, &mut actions);
            self.plan_dispatches(&mut core, now, cur, &mut actions);
            self.plan_pool(func, &mut core, now, housekeeping, &mut actions);
            actions
        };
        let mut replies = Vec::new();
        for a in actions {
            self.act(func, a, &mut replies);
        }
        replies
    }

    fn plan_dispatches(&self, core: &mut FnCore, now: u64, cur: usize, out: &mut Vec<Action>) {
        while let Some((call_id, worker_id)) = core.sched.next_dispatch(now, cur) {
            let ready_ns = core.sched.worker(worker_id).map_or(0, |w| w.ready_ns);
            let Some(handle) = core.workers.get(&worker_id) else {
                core.sched.unreserve(worker_id);
                continue;
            };
            let pid = handle.pid;
            let taken = self.calls.with(call_id, |rec| {
                debug_assert_eq!(rec.dispatch_ns, 0, "call {call_id:016x} dispatched twice");
                // `now` may be a reading the caller took a few µs ago, before
                // another thread queued this call.
                rec.dispatch_ns = now.max(rec.recv_ns);
                rec.worker = Some((worker_id, pid));
                rec.cold = ready_ns > rec.recv_ns;
                let mut header = Header::new(Kind::Dispatch);
                if self.cfg.cpu_per_call && rec.func.spec.runtime.measures_cpu() {
                    header.flags = wire::message::FLAG_CPU_TIME;
                }
                header.call_id = call_id;
                header.parent_call_id = rec.parent_call_id;
                header.worker_id = worker_id;
                header.deadline_us = rec.deadline_us;
                let input = rec.input.take().unwrap_or(Payload::Bytes(Vec::new()));
                (header, input, now.saturating_sub(rec.recv_ns), rec.trace.clone())
            });
            let Some((header, input, queued, trace)) = taken else {
                // Timed out while queued.
                core.sched.unreserve(worker_id);
                continue;
            };
            // The caller's record is in another shard: taken after this
            // one is released, never both at once.
            if header.parent_call_id != 0 {
                self.calls.with(header.parent_call_id, |p| p.sub_queue_ns += queued);
            }
            out.push(Action::Dispatch { tx: handle.tx.clone(), header, input, trace });
        }
    }

    fn plan_pool(&self, func: &Arc<Function>, core: &mut FnCore, now: u64, housekeeping: bool, out: &mut Vec<Action>) {
        match core.launcher.state {
            LauncherState::Ready => {
                let Some(ltx) = core.launcher.tx.clone() else { return };
                let multiplexed = func.spec.runtime.multiplexed();
                // Where its workers' channels are read: the launcher's
                // thread, or the one its calls come from (`Follow`).
                let home = core.follow.home.unwrap_or(core.launcher.owner);
                let mut owners: Vec<usize> = (0..core.sched.workers_to_create(now))
                    .map(|_| {
                        if multiplexed {
                            // One process serves every channel: read them all on
                            // one thread, on the vCPU the process is pinned to.
                            home
                        } else {
                            // Workers of their own process spread over the I/O
                            // threads (and so the vCPUs); each is pinned where
                            // its channel is read.
                            self.next_owner.fetch_add(1, Ordering::Relaxed) % self.mailboxes.len()
                        }
                    })
                    .collect();
                // A thread that has calls and no worker of its own gets one
                // (`Scheduler::take_local_wanted`); not for a multiplexed
                // runtime, whose channels are all read on one thread.
                if let Some(owner) = core.sched.take_local_wanted(now, owners.len() as u32) {
                    if !multiplexed && self.cpu_of(owner).is_some() && !owners.contains(&owner) {
                        owners.push(owner);
                    }
                }
                for owner in owners {
                    let worker_id = self.next_worker_id.fetch_add(1, Ordering::Relaxed);
                    let made = sys::channel::EngineChannel::create(&func.dir, worker_id).and_then(|ch| {
                        if let Some(c) = &core.launcher.container {
                            give_channel(&func.dir, worker_id, c.uid)?;
                        }
                        Ok(ch)
                    });
                    match made {
                        Ok(ch) => {
                            core.sched.worker_starting(worker_id, owner, now);
                            core.workers.insert(worker_id, WorkerHandle { tx: Arc::new(ch.tx), pid: 0 });
                            self.post(owner, Cmd::AdoptChannel { func: func.clone(), worker_id, rx: ch.rx });
                            out.push(Action::CreateWorker { launcher_tx: ltx.clone(), worker_id });
                        }
                        Err(e) => log::error!("{}: creating channel {worker_id}: {e}", func.spec.name),
                    }
                }
                if housekeeping {
                    for worker_id in core.sched.expire_starting(now, WORKER_START_MAX_NS) {
                        log::warn!("{}: worker {worker_id} never started; asking again", func.spec.name);
                        core.workers.remove(&worker_id);
                        for t in 0..self.mailboxes.len() {
                            self.post(t, Cmd::DropChannel { func: func.clone(), worker_id });
                        }
                    }
                }
                let surplus = if housekeeping { core.sched.surplus(now, WORKER_IDLE_MIN_NS) } else { Vec::new() };
                for worker_id in surplus {
                    if let Some(h) = core.workers.get(&worker_id) {
                        out.push(Action::Stop { tx: h.tx.clone(), worker_id });
                    }
                }
            }
            LauncherState::Starting => {}
            LauncherState::Down => {
                let wanted = core.sched.queued() > 0 || (core.sched.min_workers > 0 && !core.launcher.idle_destroyed);
                let backing_off = core.launcher.failed_at.is_some_and(|t| t.elapsed() < LAUNCH_RETRY);
                if wanted && !backing_off {
                    core.launcher.state = LauncherState::Starting;
                    out.push(Action::StartLauncher);
                } else if backing_off {
                    let message = format!("function {} failed to start: {}", func.spec.name, core.launcher.last_error);
                    for call_id in core.sched.drain_queue() {
                        out.push(Action::Fail { call_id, kind: ErrorKind::FunctionError, message: message.clone() });
                    }
                }
            }
        }
    }

    fn act(&self, func: &Arc<Function>, a: Action, replies: &mut Vec<GatewayReply>) {
        match a {
            Action::Dispatch { tx, mut header, input, trace } => {
                let call_id = header.call_id;
                // A call with a trace context starts the inline area with it
                // (docs/protocol.md: the Dispatch's `name_len` bytes).
                let prefix_len =
                    trace.as_ref().map_or(0, |t| api::trace::WIRE_LEN + t.state.as_deref().map_or(0, str::len));
                debug_assert!(prefix_len <= wire::message::DISPATCH_TRACE_LEN_MAX);
                header.name_len = prefix_len as u16;
                let inline = match input {
                    Payload::Bytes(b) if prefix_len + b.len() <= INLINE_LEN_MAX => {
                        header.payload_len = (prefix_len + b.len()) as u32;
                        Some(match &trace {
                            Some(t) => t.dispatch_prefix(&b),
                            None => b,
                        })
                    }
                    Payload::Bytes(b) => {
                        header.flags |= FLAG_PAYLOAD_IN_SHM;
                        header.payload_len = b.len() as u32;
                        if let Err(e) = sys::payload::write(&func.dir, &shm_file_name(call_id, Kind::Dispatch), &b) {
                            self.dispatch_failed(func, header.worker_id, false);
                            self.fail_call(
                                call_id,
                                ErrorKind::Internal,
                                format!("writing input payload: {e}"),
                                replies,
                            );
                            return;
                        }
                        None
                    }
                    Payload::Shm(len) => {
                        header.flags |= FLAG_PAYLOAD_IN_SHM;
                        header.payload_len = len as u32;
                        None
                    }
                };
                // In shm, the context alone stays inline.
                let inline = inline.or_else(|| trace.as_ref().map(|t| t.dispatch_prefix(&[])));
                header.send_ts_ns = sys::clock::monotonic_ns();
                let msg = Message::new(&header, inline.as_deref().unwrap_or(&[]));
                if let Err(e) = sys::channel::write_message(&tx, &msg) {
                    // The worker is not reading (a full pipe): it cannot be
                    // trusted with calls; recycle it. This call fails now.
                    self.dispatch_failed(func, header.worker_id, true);
                    self.fail_call(call_id, ErrorKind::WorkerCrashed, format!("dispatching to worker: {e}"), replies);
                }
            }
            Action::CreateWorker { launcher_tx, worker_id } => {
                let mut h = Header::new(Kind::CreateWorker);
                h.worker_id = worker_id;
                if let Err(e) = sys::channel::write_message(&launcher_tx, &Message::new(&h, &[])) {
                    log::error!("{}: asking launcher for worker {worker_id}: {e}", func.spec.name);
                }
            }
            Action::StartLauncher => {
                let _ = lock(&self.supervisor).send(SupervisorCmd::StartLauncher(func.clone()));
            }
            Action::Stop { tx, worker_id } => {
                let mut h = Header::new(Kind::StopWorker);
                h.worker_id = worker_id;
                let _ = sys::channel::write_message(&tx, &Message::new(&h, &[]));
            }
            Action::Pin { container, pid, cpu } => {
                if let Some(p) = host_pid(container.as_deref(), pid) {
                    let _ = sys::cpu::set_affinity_all_threads(p, &[cpu]);
                }
            }
            Action::Fail { call_id, kind, message } => self.fail_call(call_id, kind, message, replies),
        }
    }

    /// A dispatch never reached worker `worker_id`: undo its reservation
    /// (it would otherwise stay busy forever), and with `kill` recycle it.
    fn dispatch_failed(&self, func: &Function, worker_id: u32, kill: bool) {
        let mut core = func.lock_core();
        if kill {
            core.sched.abandon(worker_id);
            if let Some(pid) = core.workers.get(&worker_id).map(|w| w.pid).filter(|p| *p != 0) {
                core.kill(pid);
            }
        } else {
            core.sched.unreserve(worker_id);
        }
    }

    /// Ends a call with an error, if it is still in flight.
    pub fn fail_call(&self, call_id: u64, kind: ErrorKind, message: String, replies: &mut Vec<GatewayReply>) {
        let rec = self.calls.remove(call_id);
        if let Some(rec) = rec {
            rec.func.lock_core().failed += 1;
            self.trace(call_id, &rec, 0, kind.name());
            replies.extend(self.deliver(call_id, rec, Outcome::Err(kind, message), None));
        }
    }

    /// Sends a call's outcome to where the call came from. `from_dir` is the
    /// directory of the function that produced an shm payload.
    pub fn deliver(
        &self,
        call_id: u64,
        rec: CallRecord,
        outcome: Outcome,
        from_dir: Option<&PathBuf>,
    ) -> Option<GatewayReply> {
        self.deliver_at(call_id, rec, outcome, from_dir, sys::clock::monotonic_ns())
    }

    /// `deliver`, with `now` a monotonic clock reading just taken.
    pub fn deliver_at(
        &self,
        call_id: u64,
        rec: CallRecord,
        outcome: Outcome,
        from_dir: Option<&PathBuf>,
        now: u64,
    ) -> Option<GatewayReply> {
        match rec.origin {
            Origin::Gateway { thread, conn } => {
                let timing = timing_of(&rec, now);
                let frame = gateway_frame(call_id, outcome, timing, from_dir);
                Some(GatewayReply { thread, conn, frame })
            }
            Origin::Worker { ref func, ref tx, .. } => {
                let msg = worker_reply(call_id, outcome, from_dir, &func.dir);
                if let Err(e) = sys::channel::write_message(tx, &msg) {
                    log::warn!("{}: reply to caller lost: {e}", func.spec.name);
                }
                None
            }
            Origin::Http { thread, conn, close } => {
                let timing = timing_of(&rec, now);
                let out = output(call_id, outcome, from_dir);
                let (label, answer) = match &out {
                    Ok(b) => ("ok", crate::front::Answer::Ok(b)),
                    Err((k, m)) => {
                        let status = k.http_status();
                        (k.name(), crate::front::Answer::Err { status, kind: k.name(), message: m })
                    }
                };
                let mut frame = None;
                if let Some(f) = self.front.get() {
                    let latency_s = now.saturating_sub(rec.recv_ns) as f64 / 1e9;
                    f.record(thread, &rec.func.spec.name, label, latency_s, timing);
                    f.sole_engine(&mut |id| {
                        frame = Some(crate::front::answer(call_id, answer, timing, Some(id), close))
                    });
                }
                let frame = frame.unwrap_or_else(|| crate::front::answer(call_id, answer, timing, None, close));
                Some(GatewayReply { thread, conn, frame })
            }
        }
    }

    pub fn trace(&self, call_id: u64, rec: &CallRecord, worker_id: u32, outcome: &'static str) {
        self.trace_at(call_id, rec, worker_id, outcome, sys::clock::monotonic_ns());
    }

    /// `trace` of a call that completed at `now` (monotonic ns).
    pub fn trace_at(&self, call_id: u64, rec: &CallRecord, worker_id: u32, outcome: &'static str, now: u64) {
        let t = TraceRecord {
            call_id,
            parent_call_id: rec.parent_call_id,
            function: TracedFn::Here(rec.func.clone()),
            worker_id,
            receive_ns: rec.recv_ns,
            dispatch_ns: rec.dispatch_ns,
            complete_ns: now,
            outcome,
            hop: if rec.depth_above > 0 { Hop::In } else { Hop::Local },
            cold: rec.cold,
            cpu_us: rec.cpu_us,
        };
        if let (Some(tracer), Some(ctx)) = (&self.tracer, rec.trace.as_ref().filter(|c| c.recorded)) {
            let start_unix_ns = rec.recv_unix_us * 1000;
            let dispatched = t.dispatch_ns >= t.receive_ns && t.dispatch_ns > 0;
            tracer.finish(crate::otel::Span {
                ctx: ctx.clone(),
                function: rec.func.spec.name.clone(),
                call_id,
                start_unix_ns,
                end_unix_ns: start_unix_ns + t.complete_ns.saturating_sub(t.receive_ns),
                queue_us: if dispatched { (t.dispatch_ns - t.receive_ns) / 1000 } else { 0 },
                exec_us: if dispatched { t.complete_ns.saturating_sub(t.dispatch_ns) / 1000 } else { 0 },
                cold: rec.cold,
                worker: worker_id,
                outcome,
            });
        }
        self.traces.push(t);
    }

    /// A worker's channel closed. Fails the call it was running, cleans its
    /// files, and lets the pool replace it.
    pub fn worker_gone(&self, func: &Arc<Function>, worker_id: u32, cur: usize) -> Vec<GatewayReply> {
        let (removed, pid, oom) = {
            let mut core = func.lock_core();
            let r = core.sched.remove_worker(worker_id);
            let pid = core.workers.remove(&worker_id).map_or(0, |h| h.pid);
            let oom = core.launcher.container.as_ref().is_some_and(|c| c.oom_since_start())
                || core.oom_at.is_some_and(|t| t.elapsed() < OOM_MEMORY);
            if oom && core.oom_at.is_none() {
                core.oom_at = Some(Instant::now());
            }
            if oom && core.launcher.pid != 0 {
                // Replace the whole container (Nuka: a container that hit its
                // limit is not trusted again): its launcher's end returns it.
                let l = core.launcher.pid;
                core.kill(l);
            }
            (r, pid, oom)
        };
        sys::channel::EngineChannel::remove_files(&func.dir, worker_id);
        sys::payload::remove_prefixed(&func.dir, &format!("{worker_id:08x}"));
        let mut replies = Vec::new();
        match removed {
            Removed::CrashedDuring(call_id) => {
                func.lock_core().launcher.crashed_mid_call = true;
                sys::payload::remove(&func.dir, &shm_file_name(call_id, Kind::Dispatch));
                let (kind, msg) = if oom {
                    (ErrorKind::OutOfMemory, oom_message(func))
                } else {
                    let m = format!(
                        "worker {worker_id} (pid {pid}) of function {} exited while running the call",
                        func.spec.name
                    );
                    (ErrorKind::WorkerCrashed, m)
                };
                log::warn!("{msg}");
                self.fail_call(call_id, kind, msg, &mut replies);
            }
            Removed::Crashed => log::warn!("{}: idle worker {worker_id} (pid {pid}) exited", func.spec.name),
            Removed::Expected | Removed::Unknown => {}
        }
        replies.extend(self.pump(func, cur));
        replies
    }

    /// The function's launcher is gone and its container with it: every
    /// file in its IPC directory but the channels and the inputs of calls
    /// still waiting for it goes too. What a function writes there counts
    /// against its memory limit while its container lives (tmpfs pages are
    /// charged to the writer's memory cgroup), and must not outlive it on
    /// the host's /dev/shm.
    pub fn sweep_ipc_dir(&self, func: &Arc<Function>) {
        let keep: std::collections::HashSet<std::ffi::OsString> = self
            .calls
            .select(|r| Arc::ptr_eq(&r.func, func) && r.dispatch_ns == 0 && matches!(r.input, Some(Payload::Shm(_))))
            .into_iter()
            .map(|id| shm_file_name(id, Kind::Invoke).into())
            .collect();
        let shm = func.dir.join("shm");
        for dir in [&func.dir, &shm] {
            let Ok(entries) = std::fs::read_dir(dir) else { continue };
            for e in entries.flatten() {
                let path = e.path();
                // file_type does not follow links: a link is removed, never its target.
                let Ok(ty) = e.file_type() else { continue };
                if path == shm || keep.contains(&e.file_name()) {
                    continue;
                }
                if std::os::unix::fs::FileTypeExt::is_fifo(&ty) {
                    continue; // channels: removed with their workers
                }
                let _ = if ty.is_dir() { std::fs::remove_dir_all(&path) } else { std::fs::remove_file(&path) };
            }
        }
    }

    /// The names of the functions it runs (`Request::Names`), sorted as
    /// `status` sorts them: no function's lock taken.
    pub fn names(&self) -> api::control::Reply {
        let mut names: Vec<String> = self.functions().iter().map(|f| f.spec.name.clone()).collect();
        names.sort_unstable();
        api::control::Reply::Names { names }
    }

    /// Every function's state; with `usage`, its processes' CPU and
    /// scheduling read from /proc too (after its lock is let go).
    pub fn status(&self, usage: bool) -> Vec<api::control::FunctionStatus> {
        use api::control::{ContainerStatus, FunctionStatus};
        let now = sys::clock::monotonic_ns();
        let mut out: Vec<FunctionStatus> = self
            .functions()
            .iter()
            .map(|f| {
                let core = f.lock_core();
                // Whose CPU to read, found under the lock, read after it.
                let container_of = core.launcher.container.clone();
                let mut pids: Vec<u32> = Vec::new();
                if usage && container_of.is_none() {
                    pids.extend((core.launcher.pid != 0).then_some(core.launcher.pid));
                    pids.extend(core.workers.values().map(|w| w.pid).filter(|p| *p != 0));
                    pids.sort_unstable();
                    pids.dedup();
                }
                let container = core.launcher.container.as_ref().map(|c| ContainerStatus {
                    id: c.id.clone(),
                    uid: c.uid,
                    paused: core.frozen_at.is_some(),
                    network: c.net.as_ref().map(|n| n.ns_ip.to_string()),
                });
                let mut status = FunctionStatus {
                    name: f.spec.name.clone(),
                    spec: f.fingerprint.clone(),
                    age_ms: f.registered.elapsed().as_millis() as u64,
                    runtime: f.spec.runtime.name().to_string(),
                    container,
                    launcher: core.launcher.state,
                    last_error: core.launcher.last_error.clone(),
                    completed: core.completed,
                    failed: core.failed,
                    scheduler: core.sched.status(now),
                    usage: None,
                };
                drop(core);
                if !usage {
                    return status;
                }
                let pids = match container_of {
                    Some(c) => c.pids(),
                    None => pids,
                };
                status.usage = Some(sys::process::usage(&pids));
                status
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }
}

impl TraceRecord {
    /// As `staccato trace` shows it: a call that came from another server
    /// under the ids its caller's engine knows (`remote::ShownIds`).
    pub fn to_api(&self, shown: &crate::remote::ShownIds) -> api::control::TraceRecord {
        let (call_id, parent_call_id) = shown.ids(self.call_id, self.parent_call_id);
        api::control::TraceRecord {
            call_id: format!("{call_id:016x}"),
            parent_call_id: format!("{parent_call_id:016x}"),
            function: self.function.name().to_string(),
            worker_id: self.worker_id,
            receive_ns: self.receive_ns,
            dispatch_ns: self.dispatch_ns,
            complete_ns: self.complete_ns,
            outcome: self.outcome.to_string(),
            hop: match self.hop {
                Hop::Local => String::new(),
                Hop::Out => "out".into(),
                Hop::In => "in".into(),
            },
            cold: self.cold,
            cpu_us: self.cpu_us,
        }
    }
}

impl Launcher {
    pub fn down() -> Launcher {
        Launcher {
            state: LauncherState::Down,
            tx: None,
            pid: 0,
            owner: 0,
            ready_at: None,
            quick_crashes: 0,
            crashed_mid_call: false,
            failed_at: None,
            last_error: String::new(),
            container: None,
            idle_destroyed: false,
        }
    }
}

/// Lets a container's user open a channel's FIFOs (they are made 0600 by
/// root; the function's directory is the container's only view of them).
pub(crate) fn give_channel(dir: &Path, id: u32, uid: u32) -> std::io::Result<()> {
    let (e2w, w2e) = sys::channel::channel_paths(dir, id);
    // lchown: the directory is the function's, and a link it left is not
    // followed to a host file.
    std::os::unix::fs::lchown(e2w, Some(uid), Some(uid))?;
    std::os::unix::fs::lchown(w2e, Some(uid), Some(uid))
}

pub(crate) fn oom_message(func: &Function) -> String {
    format!(
        "function {} ran out of memory: it went beyond its limit of {} MiB and the kernel killed it \
         (raise `memory:` in its manifest); its container is being replaced",
        func.spec.name,
        func.spec.memory_bytes >> 20
    )
}

fn us(ns: u64) -> u32 {
    (ns / 1000).min(u64::from(u32::MAX)) as u32
}

fn timing_of(rec: &CallRecord, now: u64) -> Timing {
    if rec.dispatch_ns == 0 {
        return Timing { queue_us: us(now.saturating_sub(rec.recv_ns)), exec_us: 0, cold_us: 0 };
    }
    let queue_ns = rec.dispatch_ns.saturating_sub(rec.recv_ns);
    Timing {
        queue_us: us(queue_ns),
        exec_us: us(now.saturating_sub(rec.dispatch_ns)),
        cold_us: if rec.cold { us(queue_ns) } else { 0 },
    }
}

/// A call's output bytes (read from its payload file if there is one), or
/// its error.
fn output(call_id: u64, outcome: Outcome, from_dir: Option<&PathBuf>) -> Result<Vec<u8>, (ErrorKind, String)> {
    match outcome {
        Outcome::Ok(Payload::Bytes(b)) => Ok(b),
        Outcome::Ok(Payload::Shm(len)) => {
            let name = shm_file_name(call_id, Kind::Completion);
            match from_dir.map(|d| sys::payload::take(d, &name, len)) {
                Some(Ok(b)) => Ok(b),
                Some(Err(e)) => Err((ErrorKind::Internal, format!("reading output: {e}"))),
                None => Err((ErrorKind::Internal, "output file missing".into())),
            }
        }
        Outcome::Err(k, m) => Err((k, m)),
    }
}

/// Builds the `Result`/`Error` frame for a gateway call.
fn gateway_frame(call_id: u64, outcome: Outcome, timing: Timing, from_dir: Option<&PathBuf>) -> Vec<u8> {
    let (kind, error_kind, body) = match output(call_id, outcome, from_dir) {
        Ok(b) => (FrameKind::Result, 0, b),
        Err((k, m)) => (FrameKind::Error, k.code(), m.into_bytes()),
    };
    let mut h = FrameHeader::new(kind, call_id, body.len());
    h.error_kind = error_kind;
    timing.to_header(&mut h);
    let mut frame = Vec::with_capacity(FRAME_HEADER_LEN + body.len());
    frame.extend_from_slice(&h.encode());
    frame.extend_from_slice(&body);
    frame
}

/// Builds the `Completion`/`Failure` message answering a worker's `Invoke`,
/// moving an shm output into the caller's directory.
pub(crate) fn worker_reply(call_id: u64, outcome: Outcome, from_dir: Option<&PathBuf>, to_dir: &Path) -> Message {
    // Named only when a payload file is written or moved: most answers
    // are inline, and formatting the name cost an allocation per call.
    let name = || shm_file_name(call_id, Kind::Completion);
    let (mut h, inline): (Header, Vec<u8>) = match outcome {
        Outcome::Ok(Payload::Bytes(b)) if b.len() <= INLINE_LEN_MAX => {
            let mut h = Header::new(Kind::Completion);
            h.payload_len = b.len() as u32;
            (h, b)
        }
        Outcome::Ok(Payload::Bytes(b)) => {
            let mut h = Header::new(Kind::Completion);
            match sys::payload::write(to_dir, &name(), &b) {
                Ok(()) => {
                    h.flags = FLAG_PAYLOAD_IN_SHM;
                    h.payload_len = b.len() as u32;
                    (h, Vec::new())
                }
                Err(e) => failure_header(ErrorKind::Internal, format!("writing output payload: {e}")),
            }
        }
        Outcome::Ok(Payload::Shm(len)) => match from_dir.map(|d| sys::payload::forward(d, to_dir, &name())) {
            Some(Ok(())) => {
                let mut h = Header::new(Kind::Completion);
                h.flags = FLAG_PAYLOAD_IN_SHM;
                h.payload_len = len as u32;
                (h, Vec::new())
            }
            _ => failure_header(ErrorKind::Internal, "moving output payload failed".into()),
        },
        Outcome::Err(k, m) => failure_header(k, m),
    };
    h.call_id = call_id;
    h.send_ts_ns = sys::clock::monotonic_ns();
    Message::new(&h, &inline)
}

fn failure_header(kind: ErrorKind, message: String) -> (Header, Vec<u8>) {
    let mut h = Header::new(Kind::Failure);
    h.error_kind = kind.code();
    let mut b = message.into_bytes();
    b.truncate(INLINE_LEN_MAX);
    h.payload_len = b.len() as u32;
    (h, b)
}
