//! An engine I/O thread: one epoll loop (mio) over its gateway connections,
//! the worker channels it reads, and its mailbox (Nightcore §4.1, Figure 5).
//!
//! Architecture invariant: an I/O thread never blocks. Every fd it polls is
//! non-blocking; pipe writes of one message cannot block (they are atomic and
//! the pipes are sized for far more messages than a worker has in flight);
//! payload files live on tmpfs, so reading and writing them is a memory copy.

use crate::remote::{self, OutCall};
use crate::shared::{lock, CallRecord, Cmd, Function, GatewayReply, LauncherState, Origin, Outcome, Payload, Shared};
use mio::net::TcpStream;
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};
use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Duration;
use sys::channel::{MessageReader, ReadStatus};
use wire::frame::{FrameHeader, FrameKind, FRAME_HEADER_LEN};
use wire::message::{shm_file_name, Header, Kind, Message, INLINE_LEN_MAX};
use wire::ErrorKind;

/// A message a function's process may not send: the channel is closed.
#[derive(Debug, thiserror::Error)]
enum ProtocolError {
    #[error("malformed message: {0}")]
    Malformed(#[from] wire::message::MessageError),
    #[error("unexpected {0:?} message")]
    Unexpected(wire::Kind),
}

pub(crate) const WAKER: Token = Token(0);

struct Conn {
    stream: TcpStream,
    rbuf: Vec<u8>,
    wbuf: Vec<u8>,
    wants_write: bool,
    /// When its gateway last sent anything (monotonic ns).
    heard_ns: u64,
}

struct Chan {
    func: Arc<Function>,
    worker_id: u32,
    rx: File,
    reader: MessageReader,
}

/// A client connection of the front door (`front`).
pub(crate) struct HttpConn {
    stream: std::net::TcpStream,
    rbuf: Vec<u8>,
    wbuf: Vec<u8>,
    wants_write: bool,
    /// A call of its is in flight: the next request waits for its answer.
    busy: bool,
    /// Once `wbuf` is written: give it to the gateway (`Some`) or close it.
    after: After,
    /// When it was accepted, last answered, or last sent some of a body
    /// (monotonic ns): a request head must be complete within the idle
    /// timeout of it, however it trickles in.
    heard_ns: u64,
    /// Reading stopped at its limit; resume when served.
    read_paused: bool,
    /// The client sent all it will (end of file): close once what it
    /// sent is answered.
    eof: bool,
    /// An event reported the client's end of file (or an error), which
    /// may not have been read yet (reading was paused at its limit): read
    /// to it, past any short read, since no later event reports it again.
    hung_up: bool,
    /// Its client was last seen on this thread's vCPU (`follow_client`):
    /// once answered, it is what runs next here, and a spin would only
    /// keep it waiting (`IoThread::answered_here`).
    beside: bool,
    /// Its peer is on this host's loopback, so `SO_INCOMING_CPU` names the
    /// vCPU the client sends from. For a client elsewhere it names the vCPU
    /// that received its packets from the NIC: never `beside`.
    loopback: bool,
    /// Its place among the gateway's connections.
    _slot: Box<dyn Send>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum After {
    Serve,
    HandOver,
    Close,
}

enum Entry {
    Conn(Conn),
    Chan(Chan),
    Http(HttpConn),
    Listener(std::net::TcpListener),
}

pub(crate) struct IoThread {
    idx: usize,
    shared: Arc<Shared>,
    poll: Poll,
    entries: HashMap<Token, Entry>,
    next_token: usize,
    spin_until_ns: u64,
    /// This iteration answered a caller that runs on this thread's vCPU (a
    /// front-door client beside it, or a worker whose channel a thread on
    /// this vCPU reads),
    /// which is then what runs next here: no spin follows, since yielding
    /// to each other, this thread and a spinning worker could keep that
    /// caller waiting for their whole spins (EEVDF does not run a task
    /// preempted a moment ago before it is eligible again; BENCHMARKS.md,
    /// "Two spinners on one vCPU"). Its next message comes from this vCPU,
    /// so a spin could not catch it sooner anyway.
    answered_here: bool,
    /// Connections with bytes to flush at the end of this loop iteration:
    /// replies produced by one batch of events leave in one write.
    dirty: Vec<Token>,
    /// Front-door connections answered in this iteration, whose next
    /// request (pipelined, or read meanwhile) is to be served.
    answered: Vec<Token>,
    /// Call ids of the front door's calls: like a gateway thread's
    /// (docs/protocol.md "Call ids"), thread field 0x40 + this thread.
    id_tag: u64,
    next_seq: u64,
    /// The messages of one channel read, kept for the next (empty between).
    msgs: Vec<Message>,
    /// What a socket read lands in before its connection's buffer takes
    /// it: one per thread, made once (a 64 KiB array zeroed on the stack
    /// for every read was a memset and a flushed L1 cache per call).
    scratch: Box<[u8]>,
}

/// Bytes a socket read asks for at most.
const READ_CHUNK: usize = 64 * 1024;

impl IoThread {
    pub fn new(idx: usize, shared: Arc<Shared>, poll: Poll) -> IoThread {
        let id_tag = wire::GATEWAY_CALL_ID_BIT | ((0x40 | (idx as u64 & 0x3f)) << 56) | (random_bits() << 32);
        IoThread {
            idx,
            shared,
            poll,
            entries: HashMap::new(),
            next_token: 1,
            spin_until_ns: 0,
            answered_here: false,
            dirty: Vec::new(),
            answered: Vec::new(),
            id_tag,
            next_seq: 0,
            msgs: Vec::new(),
            scratch: vec![0; READ_CHUNK].into_boxed_slice(),
        }
    }

    pub fn run(mut self) {
        if let Some(cpu) = self.shared.cpu_of(self.idx) {
            if let Err(e) = sys::cpu::set_affinity(0, &[cpu]) {
                log::warn!("pinning I/O thread {} to CPU {cpu}: {e}", self.idx);
            }
        }
        let mut events = Events::with_capacity(256);
        // Read once per iteration, after its events are served: it starts
        // the spin, and at the top of the next iteration says whether the
        // spin is over (one clock read per iteration where there were two).
        let mut now = sys::clock::monotonic_ns();
        loop {
            let timeout = self.poll_timeout(now);
            if timeout == Some(Duration::ZERO) {
                // Spinning: let whatever runs on this vCPU (often the worker
                // we just dispatched to) go first.
                std::thread::yield_now();
            }
            if let Err(e) = self.poll.poll(&mut events, timeout) {
                if e.kind() != io::ErrorKind::Interrupted {
                    log::error!("I/O thread {}: poll: {e}", self.idx);
                }
                continue;
            }
            for ev in events.iter() {
                match ev.token() {
                    WAKER => self.drain_mailbox(),
                    t => {
                        // The peer's end of file, or a socket error: no
                        // later event reports either again.
                        let gone = ev.is_read_closed() || ev.is_error();
                        self.on_ready(t, ev.is_readable() || gone, ev.is_writable(), gone)
                    }
                }
            }
            now = sys::clock::monotonic_ns();
            if !events.is_empty() {
                if self.shared.cfg.engine_spin_us > 0 {
                    self.spin_until_ns = now + u64::from(self.shared.cfg.engine_spin_us) * 1000;
                }
                self.shared.awake.saw_events(now);
            }
            // Serving may answer at once, and a written answer may let the
            // next request be served: until both are done.
            while !self.answered.is_empty() || !self.dirty.is_empty() {
                self.serve_answered();
                self.flush_dirty();
            }
            if std::mem::take(&mut self.answered_here) {
                self.spin_until_ns = 0;
            }
        }
    }

    /// The wait's timeout; `now` is the clock read after the last
    /// iteration's events (flushing since then takes microseconds, against
    /// a spin of tens).
    fn poll_timeout(&self, now: u64) -> Option<Duration> {
        if now < self.spin_until_ns {
            return Some(Duration::ZERO);
        }
        // No timeout otherwise: deadlines and housekeeping live on the
        // engine's clock thread, so an idle wait arms no timer.
        None
    }

    /// This thread and the workers whose channels it reads share a vCPU
    /// that is one of several (packed placement): see `answered_here`, and
    /// `follow_client` for one vCPU.
    fn beside_its_workers(&self) -> bool {
        self.shared.cpus.len() >= 2 && self.shared.cpu_of(self.idx).is_some()
    }

    fn token(&mut self) -> Token {
        self.next_token += 1;
        Token(self.next_token)
    }

    fn drain_mailbox(&mut self) {
        let cmds = std::mem::take(&mut *lock(&self.shared.mailboxes[self.idx].queue));
        for cmd in cmds {
            match cmd {
                Cmd::AdoptConn(s) => self.adopt_conn(s),
                Cmd::AdoptChannel { func, worker_id, rx } => self.adopt_channel(func, worker_id, rx),
                Cmd::DropChannel { func, worker_id } => {
                    let t = self.entries.iter().find_map(|(t, e)| match e {
                        Entry::Chan(c) if c.worker_id == worker_id && Arc::ptr_eq(&c.func, &func) => Some(*t),
                        _ => None,
                    });
                    if let Some(t) = t {
                        self.remove_entry(t);
                        sys::channel::EngineChannel::remove_files(&func.dir, worker_id);
                    }
                }
                Cmd::Reply { conn, frame } => self.queue_write(conn, &frame),
                Cmd::CheckConns => self.close_silent_conns(),
                Cmd::AdoptHttp(c) => self.adopt_http(*c),
                Cmd::Listen(l) => {
                    let t = self.token();
                    let fd = l.as_raw_fd();
                    match self.poll.registry().register(&mut SourceFd(&fd), t, Interest::READABLE) {
                        Ok(()) => {
                            self.entries.insert(t, Entry::Listener(l));
                            self.accept(t);
                        }
                        Err(e) => log::error!("I/O thread {}: registering a listener: {e}", self.idx),
                    }
                }
            }
        }
    }

    fn adopt_conn(&mut self, s: std::net::TcpStream) {
        if let Err(e) = s.set_nonblocking(true) {
            log::error!("gateway connection: {e}");
            return;
        }
        let _ = s.set_nodelay(true);
        let mut stream = TcpStream::from_std(s);
        let t = self.token();
        if let Err(e) = self.poll.registry().register(&mut stream, t, Interest::READABLE) {
            log::error!("registering gateway connection: {e}");
            return;
        }
        let heard_ns = sys::clock::monotonic_ns();
        self.entries
            .insert(t, Entry::Conn(Conn { stream, rbuf: Vec::new(), wbuf: Vec::new(), wants_write: false, heard_ns }));
        self.shared.remote.add_conn(self.idx, t);
    }

    /// Closes gateway connections that brought nothing for
    /// `ENGINE_SILENCE_MAX_MS` (their gateway pings every 200 ms): a cut
    /// link, or a gateway that died without a reset. Calls sent to other
    /// servers on them are answered (`remove_entry`).
    fn close_silent_conns(&mut self) {
        let now = sys::clock::monotonic_ns();
        let max = wire::frame::ENGINE_SILENCE_MAX_MS * 1_000_000;
        let idle_max = self.shared.front.get().map_or(u64::MAX, |f| f.idle_timeout().as_nanos() as u64);
        let mut idle = Vec::new();
        let silent: Vec<Token> = self
            .entries
            .iter()
            .filter_map(|(t, e)| match e {
                Entry::Conn(c) if now.saturating_sub(c.heard_ns) > max => Some(*t),
                // A client that sends no complete request for this long
                // (idle between calls, or sending a head too slowly).
                Entry::Http(c) if !c.busy && c.wbuf.is_empty() && now.saturating_sub(c.heard_ns) > idle_max => {
                    idle.push(*t);
                    None
                }
                _ => None,
            })
            .collect();
        for t in silent {
            log::warn!("a gateway connection sent nothing for {} ms; closing it", wire::frame::ENGINE_SILENCE_MAX_MS);
            self.remove_entry(t);
        }
        for t in idle {
            self.remove_entry(t);
        }
        // Edge-triggered: a listener whose accept failed (out of file
        // descriptors) reports nothing until the next connection comes.
        let listeners: Vec<Token> =
            self.entries.iter().filter_map(|(t, e)| matches!(e, Entry::Listener(_)).then_some(*t)).collect();
        for t in listeners {
            self.accept(t);
        }
    }

    fn adopt_channel(&mut self, func: Arc<Function>, worker_id: u32, rx: File) {
        let t = self.token();
        let fd = rx.as_raw_fd();
        if let Err(e) = self.poll.registry().register(&mut SourceFd(&fd), t, Interest::READABLE) {
            log::error!("{}: registering channel {worker_id}: {e}", func.spec.name);
            return;
        }
        self.entries.insert(t, Entry::Chan(Chan { func, worker_id, rx, reader: MessageReader::default() }));
    }

    fn remove_entry(&mut self, t: Token) -> Option<Entry> {
        let e = self.entries.remove(&t)?;
        let _ = match &e {
            Entry::Conn(c) => self.poll.registry().deregister(&mut SourceFd(&c.stream.as_raw_fd())),
            Entry::Chan(c) => self.poll.registry().deregister(&mut SourceFd(&c.rx.as_raw_fd())),
            Entry::Http(c) => self.poll.registry().deregister(&mut SourceFd(&c.stream.as_raw_fd())),
            Entry::Listener(l) => self.poll.registry().deregister(&mut SourceFd(&l.as_raw_fd())),
        };
        if let Entry::Conn(_) = e {
            // Calls sent to other servers on it: their answers cannot come.
            for (call_id, o) in self.shared.remote.remove_conn(self.idx, t) {
                let msg = format!(
                    "{} runs on another server; the gateway connection its call went through closed before it was \
                     answered",
                    o.callee
                );
                remote::answer(&self.shared, call_id, o, Outcome::Err(ErrorKind::EngineUnavailable, msg));
            }
        }
        Some(e)
    }

    fn on_ready(&mut self, t: Token, readable: bool, writable: bool, hung_up: bool) {
        match self.entries.get(&t) {
            Some(Entry::Conn(_)) => {
                if writable {
                    self.flush(t);
                }
                if readable {
                    self.read_conn(t, hung_up);
                }
            }
            Some(Entry::Chan(_)) => self.read_chan(t, hung_up),
            Some(Entry::Http(_)) => {
                if writable {
                    self.flush(t);
                }
                if readable {
                    self.read_http(t, hung_up);
                }
            }
            Some(Entry::Listener(_)) => self.accept(t),
            None => {}
        }
    }

    // ---- worker and launcher channels ----

    /// `hung_up`: the event also reported the writer gone. Registrations are
    /// edge-triggered and `fill` stops at a short read, so a peer that
    /// writes its last message and dies produces one event carrying both;
    /// no later event would report the end of file.
    fn read_chan(&mut self, t: Token, hung_up: bool) {
        let Some(Entry::Chan(c)) = self.entries.get_mut(&t) else { return };
        let status = c.reader.fill(&c.rx);
        let (func, worker_id) = (c.func.clone(), c.worker_id);
        // Taken out (on_message needs `self`) and put back: no allocation
        // per read.
        let mut msgs = std::mem::take(&mut self.msgs);
        while let Some(m) = c.reader.next_message() {
            msgs.push(m);
        }
        let mut closed = hung_up || !matches!(status, Ok(ReadStatus::Drained));
        for m in msgs.drain(..) {
            if let Err(e) = self.on_message(&func, worker_id, m) {
                log::error!("{}: channel {worker_id}: {e}; closing it", func.spec.name);
                closed = true;
                break;
            }
        }
        self.msgs = msgs;
        if closed {
            self.remove_entry(t);
            self.channel_closed(&func, worker_id);
        }
    }

    fn channel_closed(&mut self, func: &Arc<Function>, worker_id: u32) {
        if worker_id == 0 {
            self.launcher_gone(func);
        } else {
            let replies = self.shared.worker_gone(func, worker_id, self.idx);
            self.send_replies(replies);
        }
    }

    fn on_message(&mut self, func: &Arc<Function>, worker_id: u32, m: Message) -> Result<(), ProtocolError> {
        let h = m.header()?;
        match (worker_id, h.kind) {
            (0, Kind::LauncherHello) => self.on_launcher_hello(func, h.aux),
            (w, Kind::WorkerHello) if w != 0 && h.worker_id == w => self.on_worker_hello(func, w, h.aux),
            (w, Kind::Completion | Kind::Failure) if w != 0 => self.on_result(func, w, &h, &m),
            (w, Kind::Invoke) if w != 0 => self.on_invoke(func, w, &h, &m),
            (_, k) => return Err(ProtocolError::Unexpected(k)),
        }
        Ok(())
    }

    fn on_launcher_hello(&mut self, func: &Arc<Function>, pid: u32) {
        {
            let mut core = func.lock_core();
            core.launcher.state = LauncherState::Ready;
            core.launcher.ready_at = Some(std::time::Instant::now());
            core.launcher.crashed_mid_call = false;
            core.launcher.pid = pid;
            core.launcher.failed_at = None;
            core.launcher.last_error.clear();
        }
        log::info!("{}: launcher ready (pid {pid})", func.spec.name);
        let replies = self.shared.pump(func, self.idx);
        self.send_replies(replies);
    }

    fn launcher_gone(&mut self, func: &Arc<Function>) {
        let (dropped, never_ready) = {
            let mut core = func.lock_core();
            let never_ready = core.launcher.state == LauncherState::Starting;
            // Under the lock: once `Down` is visible, another thread may
            // start a new launcher whose FIFOs have these names.
            sys::channel::EngineChannel::remove_files(&func.dir, 0);
            core.launcher.state = LauncherState::Down;
            core.launcher.tx = None;
            core.launcher.pid = 0;
            // A launcher that dies soon after starting is in a crash loop:
            // back off as for one that never started, instead of forking
            // a new one at once, again and again.
            let mid_call = core.launcher.crashed_mid_call || core.sched.running() > 0;
            let young = core.launcher.ready_at.is_some_and(|t| t.elapsed() < crate::shared::LAUNCH_RETRY);
            // A death in the middle of a call is the call's crash (it is told
            // so): it neither counts toward a crash loop nor ends one, since a
            // call may be handed to a launcher that is already on its way out.
            if !mid_call {
                core.launcher.quick_crashes = if young { core.launcher.quick_crashes + 1 } else { 0 };
            }
            if never_ready {
                core.launcher.failed_at = Some(std::time::Instant::now());
                core.launcher.last_error = crate::supervisor::log_tail(&func.log);
            } else if core.launcher.quick_crashes >= crate::shared::CRASH_LOOP_AFTER {
                core.launcher.failed_at = Some(std::time::Instant::now());
                core.launcher.last_error = format!(
                    "it keeps exiting right after it starts ({} times in a row); its log:\n{}",
                    core.launcher.quick_crashes,
                    crate::supervisor::log_tail(&func.log)
                );
            }
            core.launcher.ready_at = None;
            if let Some(c) = core.launcher.container.take() {
                // Everything left in it is killed when the pool cleans it; a
                // container whose limit was hit is destroyed, not reused.
                let oom = c.oom_since_start();
                if oom {
                    core.oom_at = Some(std::time::Instant::now());
                }
                core.frozen_at = None;
                if let Some(pool) = &self.shared.pool {
                    pool.give_back(c, !oom);
                }
            }
            let dropped = core.sched.drop_starting();
            for id in &dropped {
                core.workers.remove(id);
            }
            (dropped, never_ready)
        };
        for worker_id in dropped {
            // Only its reader thread holds it; the others ignore the command.
            for i in 0..self.shared.mailboxes.len() {
                self.shared.post(i, Cmd::DropChannel { func: func.clone(), worker_id });
            }
        }
        self.shared.sweep_ipc_dir(func);
        if never_ready {
            log::error!("{}: launcher exited before it was ready", func.spec.name);
        } else {
            log::warn!("{}: launcher exited; restarting it", func.spec.name);
        }
        let replies = self.shared.pump(func, self.idx);
        self.send_replies(replies);
    }

    fn on_worker_hello(&mut self, func: &Arc<Function>, worker_id: u32, pid: u32) {
        let multiplexed = func.spec.runtime.multiplexed();
        let home_of = |core: &crate::shared::FnCore| core.follow.home.unwrap_or(core.launcher.owner);
        let (known, container, home) = {
            let mut core = func.lock_core();
            let ok = core.sched.worker_ready(worker_id, sys::clock::monotonic_ns());
            if let Some(h) = core.workers.get_mut(&worker_id) {
                h.pid = pid;
            }
            (ok, core.launcher.container.clone(), home_of(&core))
        };
        if !known {
            log::warn!("{}: hello from unexpected worker {worker_id}", func.spec.name);
            return;
        }
        // A worker runs on the vCPU of the thread that reads its channel
        // (Placement::Packed), so a dispatch and its reply never cross vCPUs.
        // A Python, Node.js or Go process serves all its channels, read by
        // one thread (its home, which may have moved since this worker was
        // asked for: `Follow`); all its threads go there, Go's included.
        let mut thread = if multiplexed { home } else { self.idx };
        // Read /proc (in a container) only without the lock, and only to pin.
        let host_pid = self.shared.cpu_of(thread).and_then(|_| crate::shared::host_pid(container.as_deref(), pid));
        while let (Some(cpu), Some(p)) = (self.shared.cpu_of(thread), host_pid) {
            let _ = if multiplexed {
                sys::cpu::set_affinity_all_threads(p, &[cpu])
            } else {
                sys::cpu::set_affinity(p as i32, &[cpu])
            };
            // A move between reading its home and pinning pins it there
            // too; then this pin must not be the last word.
            let now = home_of(&func.lock_core());
            if !multiplexed || now == thread {
                break;
            }
            thread = now;
        }
        let replies = self.shared.pump(func, self.idx);
        self.send_replies(replies);
    }

    fn on_result(&mut self, func: &Arc<Function>, worker_id: u32, h: &Header, m: &Message) {
        let call_id = h.call_id;
        let max = self.shared.cfg.payload_len_max;
        let outcome = if h.kind == Kind::Completion && h.payload_len as usize > max {
            // Runtimes enforce the limit themselves; this guards the frames.
            sys::payload::remove(&func.dir, &shm_file_name(call_id, Kind::Completion));
            let msg = format!("output of {} bytes exceeds the {max}-byte limit", h.payload_len);
            Outcome::Err(ErrorKind::OutputTooLarge, msg)
        } else if h.kind == Kind::Completion {
            Outcome::Ok(if h.in_shm() {
                Payload::Shm(h.payload_len as usize)
            } else {
                Payload::Bytes(m.inline(h).to_vec())
            })
        } else {
            let text = if h.in_shm() {
                sys::payload::take(&func.dir, &shm_file_name(call_id, Kind::Failure), h.payload_len as usize)
                    .unwrap_or_default()
            } else {
                m.inline(h).to_vec()
            };
            // The function's word: any kind but `not_found`, which only the
            // engine may say (it means "not started here": a gateway sends
            // such a call to another engine, so a function that ran must not
            // be able to claim it).
            let kind = match ErrorKind::from_code(h.error_kind) {
                Some(ErrorKind::NotFound) | None => ErrorKind::FunctionError,
                Some(k) => k,
            };
            Outcome::Err(kind, String::from_utf8_lossy(&text).into_owned())
        };
        let now = sys::clock::monotonic_ns();
        let mut rec = self.shared.calls.remove(call_id);
        if let Some(r) = rec.as_mut() {
            // Only an answer to the question asked, and never more than the
            // call has run: a function's word.
            let asked = self.shared.cfg.cpu_per_call && func.spec.runtime.measures_cpu();
            let ran_us = now.saturating_sub(r.dispatch_ns) / 1000;
            r.cpu_us = h.cpu_us().filter(|_| asked).map(|us| us.min(u32::try_from(ran_us).unwrap_or(u32::MAX)));
        }
        {
            let mut core = func.lock_core();
            let processing =
                rec.as_ref().map_or(0, |r| now.saturating_sub(r.dispatch_ns).saturating_sub(r.sub_queue_ns));
            core.sched.complete(worker_id, call_id, processing, now);
            match outcome {
                Outcome::Ok(_) => core.completed += 1,
                Outcome::Err(..) => core.failed += 1,
            }
        }
        let mut replies = Vec::new();
        match rec {
            Some(rec) => {
                let label = match &outcome {
                    Outcome::Ok(_) => "ok",
                    Outcome::Err(k, _) => k.name(),
                };
                self.shared.trace_at(call_id, &rec, worker_id, label, now);
                if let Origin::Worker { thread, .. } = rec.origin {
                    // The caller is pinned to the vCPU of the thread that
                    // reads its channel.
                    let cpu = self.shared.cpu_of(thread);
                    self.answered_here |= self.beside_its_workers() && cpu == self.shared.cpu_of(self.idx);
                }
                replies.extend(self.shared.deliver_at(call_id, rec, outcome, Some(&func.dir), now));
            }
            // The call timed out meanwhile: drop its output.
            None => {
                if let Outcome::Ok(Payload::Shm(_)) = outcome {
                    sys::payload::remove(&func.dir, &shm_file_name(call_id, Kind::Completion));
                }
            }
        }
        // Answer first, then dispatch what waits: the reply is on the
        // latency path, the next dispatch is not delayed by much.
        self.send_replies(replies);
        let replies = self.shared.pump_at(func, self.idx, now);
        self.send_replies(replies);
    }

    fn on_invoke(&mut self, caller: &Arc<Function>, worker_id: u32, h: &Header, m: &Message) {
        let inline = m.inline(h);
        let name_len = usize::from(h.name_len);
        let (tx, running) = {
            let core = caller.lock_core();
            let running = core.sched.worker(worker_id).and_then(|w| match w.state {
                crate::scheduler::WorkerState::Busy(call) => Some(call),
                _ => None,
            });
            (core.workers.get(&worker_id).map(|w| w.tx.clone()), running)
        };
        let Some(tx) = tx else { return };
        let reject = |kind: ErrorKind, msg: String| {
            if h.in_shm() {
                sys::payload::remove(&caller.dir, &shm_file_name(h.call_id, Kind::Invoke));
            }
            let mut f = Header::new(Kind::Failure);
            f.call_id = h.call_id;
            f.error_kind = kind.code();
            let mut b = msg.into_bytes();
            b.truncate(INLINE_LEN_MAX);
            f.payload_len = b.len() as u32;
            let _ = sys::channel::write_message(&tx, &Message::new(&f, &b));
        };
        // A channel message is the function's word, not the engine's: the
        // call id must be this worker's own (docs/protocol.md "Call ids"),
        // so no function can take over or collide with another's call, and
        // the parent is the call the engine gave this worker, whatever the
        // message claims.
        if (h.call_id >> 32) as u32 != worker_id || h.call_id as u32 == 0 {
            let msg = format!(
                "call id {:016x} is not worker {worker_id}'s: internal call ids are (worker_id << 32) | seq, seq >= 1",
                h.call_id
            );
            return reject(ErrorKind::BadRequest, msg);
        }
        let Some(parent) = running else {
            return reject(
                ErrorKind::BadRequest,
                "an internal call must be made while the caller's invocation runs".into(),
            );
        };
        // Borrowed from the message when it is UTF-8 (no copy per call).
        let name = String::from_utf8_lossy(&inline[..name_len]);
        // A call that leaves this engine, answered to this worker later.
        let leaving = |name: &str| OutCall {
            caller: caller.clone(),
            tx: tx.clone(),
            worker_id,
            parent_call_id: parent,
            callee: name.into(),
            give_up_us: 0,
            sent_ns: sys::clock::monotonic_ns(),
            conn: (0, Token(0)),
        };
        if self.shared.via_gateway.is_some() {
            if !wire::valid_function_name(&name) {
                return reject(ErrorKind::NotFound, format!("no function named {name:?}"));
            }
            if let Err((kind, msg)) = self.via_gateway(h, m, leaving(&name)) {
                reject(kind, msg);
            }
            return;
        }
        let Some(callee) = self.shared.function(&name) else {
            // Not on this server: through a gateway to one it runs on.
            if self.shared.remote.connected() && wire::valid_function_name(&name) {
                if let Err((kind, msg)) = self.forward(h, m, leaving(&name)) {
                    reject(kind, msg);
                }
                return;
            }
            return reject(ErrorKind::NotFound, format!("no function named {name:?}"));
        };
        let now_us = sys::clock::unix_us();
        let mut deadline_us = now_us + callee.spec.timeout_ms * 1000;
        if h.deadline_us != 0 {
            deadline_us = deadline_us.min(h.deadline_us);
        }
        if deadline_us <= now_us {
            return reject(ErrorKind::Timeout, "the caller's deadline has already passed".into());
        }
        let depth_max = self.shared.cfg.max_call_depth;
        let (depth, held, duplicate) = self.shared.ancestry(h.call_id, parent, Some(&callee), depth_max);
        if depth >= depth_max {
            return reject(
                ErrorKind::CallDepthExceeded,
                format!(
                    "calling {name} would make a chain of more than {depth_max} nested internal calls (runaway \
                     recursion or a call cycle?); the engine's --max-call-depth sets the limit"
                ),
            );
        }
        if held >= callee.spec.max_workers {
            return reject(
                ErrorKind::CallCycle,
                format!(
                    "{name} calls itself through its callers: all {} of its workers (max_workers) are held by \
                     calls up this chain, each waiting for this one; raise max_workers or recurse less deeply",
                    callee.spec.max_workers
                ),
            );
        }
        if duplicate {
            return reject(ErrorKind::BadRequest, format!("call id {:016x} is already in flight", h.call_id));
        }
        // Checks above, the move below: `reject` cleans the caller's directory.
        let max = self.shared.cfg.payload_len_max;
        let input = if h.in_shm() {
            let len = h.payload_len as usize;
            if len > max {
                return reject(
                    ErrorKind::PayloadTooLarge,
                    format!("input of {len} bytes exceeds the {max}-byte limit"),
                );
            }
            let file = shm_file_name(h.call_id, Kind::Invoke);
            if let Err(e) = sys::payload::forward(&caller.dir, &callee.dir, &file) {
                return reject(ErrorKind::BadRequest, format!("input payload file: {e}"));
            }
            Payload::Shm(len)
        } else {
            Payload::Bytes(inline[name_len..].to_vec())
        };
        let origin = Origin::Worker { func: caller.clone(), tx, thread: self.idx };
        let mut rec = new_record(callee, origin, input, parent, deadline_us, now_us);
        rec.nested = held > 0;
        if let Some(t) = &self.shared.tracer {
            // A traced caller's call is its child span.
            rec.trace = self.shared.calls.with(parent, |r| r.trace.as_ref().map(|p| t.child(p))).flatten();
        }
        self.submit(h.call_id, rec);
    }

    /// Sends an internal call whose callee is not on this server up a
    /// gateway connection (`remote`). An error is the caller's answer now.
    fn forward(&mut self, h: &Header, m: &Message, mut out: OutCall) -> Result<(), (ErrorKind, String)> {
        let name = out.callee.clone();
        let sent = self.leaving(h, m, &mut out)?;
        // The parent as the callee's engine will show it: its caller's id
        // for it if it too came from another server.
        let trace = sent.trace.map(|c| c.encode()).unwrap_or_default();
        let f = wire::frame::Forward {
            origin_call_id: h.call_id,
            parent_call_id: self.shared.remote.shown_id(out.parent_call_id),
            trace: &trace,
            name: name.as_bytes(),
            input: &sent.input,
        };
        let timeout_ms = sent.timeout_ms.map_or(0, |t| u32::try_from(t).unwrap_or(u32::MAX));
        let frame = wire::frame::forward_frame(h.call_id, timeout_ms, sent.depth, &f);
        let give_up_us = out.give_up_us;
        let started = self.shared.remote.start(self.idx, h.call_id, out);
        if started.is_ok() {
            // Its deadline is the clock's to watch.
            self.shared.alarm.registered(give_up_us);
        }
        match started {
            Ok((thread, conn)) if thread == self.idx => self.queue_write(conn, &frame),
            Ok((thread, conn)) => self.shared.post(thread, Cmd::Reply { conn, frame }),
            Err(_) => {
                return Err((
                    ErrorKind::EngineUnavailable,
                    format!("{name} is not on this server, and no gateway is connected to reach the one it is on"),
                ))
            }
        }
        Ok(())
    }

    /// Sends an internal call to the gateway over HTTP (`--internal-calls-via`).
    fn via_gateway(&mut self, h: &Header, m: &Message, mut out: OutCall) -> Result<(), (ErrorKind, String)> {
        let sent = self.leaving(h, m, &mut out)?;
        let job = crate::via_gateway::Job {
            call_id: h.call_id,
            out,
            input: sent.input,
            timeout_ms: sent.timeout_ms,
            trace: sent.trace,
        };
        if let Some(v) = &self.shared.via_gateway {
            v.submit(&self.shared, job);
        }
        Ok(())
    }

    /// What an internal call that leaves this engine carries: its input
    /// (taken from the caller's payload file if there is one), what is
    /// left of its deadline, and the depth of its chain. Sets when the
    /// caller stops waiting for it.
    fn leaving(&self, h: &Header, m: &Message, out: &mut OutCall) -> Result<Leaving, (ErrorKind, String)> {
        let name = out.callee.clone();
        let now_us = sys::clock::unix_us();
        // The deadline is the worker's word: no later than the longest
        // timeout any function may have from now (a callee's engine cuts
        // it to the callee's own).
        let latest_us = now_us.saturating_add(api::spec::TIMEOUT_MAX_MS * 1000);
        let deadline_us = if h.deadline_us == 0 { latest_us } else { h.deadline_us.min(latest_us) };
        if deadline_us <= now_us {
            return Err((ErrorKind::Timeout, "the caller's deadline has already passed".into()));
        }
        // What is left of it travels (the servers' clocks may differ); None
        // leaves the callee its own timeout.
        let timeout_ms = (h.deadline_us != 0).then(|| (deadline_us - now_us).div_ceil(1000));
        out.give_up_us = deadline_us.saturating_add(remote::ANSWER_SLACK_US);
        let depth_max = self.shared.cfg.max_call_depth;
        let (depth, _, duplicate) = self.shared.ancestry(h.call_id, out.parent_call_id, None, depth_max);
        if depth >= depth_max {
            return Err((
                ErrorKind::CallDepthExceeded,
                format!(
                    "calling {name} would make a chain of more than {depth_max} nested internal calls (runaway \
                     recursion or a call cycle?); the engine's --max-call-depth sets the limit"
                ),
            ));
        }
        if duplicate {
            return Err((ErrorKind::BadRequest, format!("call id {:016x} is already in flight", h.call_id)));
        }
        let max = self.shared.cfg.payload_len_max;
        let name_len = usize::from(h.name_len);
        let input = if h.in_shm() {
            let len = h.payload_len as usize;
            let file = shm_file_name(h.call_id, Kind::Invoke);
            if len > max {
                return Err((ErrorKind::PayloadTooLarge, format!("input of {len} bytes exceeds the {max}-byte limit")));
            }
            sys::payload::take(&out.caller.dir, &file, len)
                .map_err(|e| (ErrorKind::BadRequest, format!("input payload file: {e}")))?
        } else {
            m.inline(h)[name_len..].to_vec()
        };
        // The caller's context goes along (its callee's engine, or the
        // gateway's, makes the callee's span).
        let trace = if self.shared.tracer.is_some() {
            self.shared.calls.with(out.parent_call_id, |r| r.trace.as_ref().map(|c| c.outgoing())).flatten()
        } else {
            None
        };
        Ok(Leaving { input, timeout_ms, depth, trace })
    }

    fn submit(&mut self, call_id: u64, rec: CallRecord) {
        let replies = self.shared.submit(call_id, rec, self.idx);
        self.send_replies(replies);
    }

    // ---- the front door's client connections ----

    fn accept(&mut self, t: Token) {
        let Some(door) = self.shared.front.get().cloned() else { return };
        loop {
            let Some(Entry::Listener(l)) = self.entries.get(&t) else { return };
            let (stream, peer) = match l.accept() {
                Ok(accepted) => accepted,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // Out of file descriptors, most likely: retried with
                    // the connection checks (`close_silent_conns`).
                    log::warn!("I/O thread {}: accept: {e}", self.idx);
                    return;
                }
            };
            let _ = stream.set_nodelay(true);
            if stream.set_nonblocking(true).is_err() {
                continue;
            }
            // Full: the gateway answers it from its reserve, or closes it.
            let Some(slot) = door.admit() else {
                door.hand_over(self.idx, stream, Vec::new());
                continue;
            };
            let c = self.token();
            let fd = stream.as_raw_fd();
            if let Err(e) = self.poll.registry().register(&mut SourceFd(&fd), c, Interest::READABLE) {
                log::error!("registering a client connection: {e}");
                continue;
            }
            let conn = HttpConn {
                stream,
                rbuf: Vec::new(),
                wbuf: Vec::new(),
                wants_write: false,
                busy: false,
                after: After::Serve,
                heard_ns: sys::clock::monotonic_ns(),
                read_paused: false,
                eof: false,
                hung_up: false,
                beside: false,
                loopback: is_loopback(peer.ip()),
                _slot: slot,
            };
            self.entries.insert(c, Entry::Http(conn));
        }
    }

    /// Reads what a client sent (up to `HTTP_READ_MAX` buffered), then
    /// serves it if no call of its is in flight. `hung_up`: the event
    /// reported the client's end of file (or an error) too (`drained`).
    fn read_http(&mut self, t: Token, hung_up: bool) {
        let Some(Entry::Http(c)) = self.entries.get_mut(&t) else { return };
        c.hung_up |= hung_up;
        let max = self.shared.cfg.payload_len_max + api::http::HEAD_MAX;
        let mut failed = false;
        let chunk = &mut self.scratch[..];
        c.read_paused = false;
        loop {
            if c.rbuf.len() >= max {
                // Edge-triggered: nothing more is reported until this is
                // read, so resume once the buffer is served.
                c.read_paused = true;
                break;
            }
            let want = (max - c.rbuf.len()).min(READ_CHUNK);
            match c.stream.read(&mut chunk[..want]) {
                Ok(0) => {
                    c.eof = true;
                    break;
                }
                Ok(n) => {
                    c.rbuf.extend_from_slice(&chunk[..n]);
                    if drained(n, want, c.hung_up) {
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    failed = true;
                    break;
                }
            }
        }
        if failed {
            // Reset: nothing can be answered. A call running is answered
            // to no one (its answer finds no connection and is dropped).
            self.remove_entry(t);
            return;
        }
        if self.follow_client(t) {
            return;
        }
        self.serve_http(t);
        self.settle_http(t);
    }

    /// Gives a client connection whose client now sends from another vCPU
    /// (the CPU its packets were last received on, `SO_INCOMING_CPU`: for
    /// loopback, the client's own) to the I/O thread of that vCPU, with
    /// what it read, before serving it. The listener chose the thread by
    /// where the client was when it connected; a client elsewhere since
    /// has each call cross vCPUs twice, and then stays elsewhere (the
    /// kernel wakes it where it last ran while that vCPU is idle). With
    /// its thread (and that thread's worker) beside it, the answer's
    /// wake-up finds it there. Only a connection with nothing in flight or
    /// unwritten moves, and only under packed placement (where threads
    /// have vCPUs). Looked at on each read that leaves bytes to serve (one
    /// `getsockopt`), not for pipelined requests served after an answer:
    /// a worker spinning when the answer is written makes the kernel wake
    /// the client on the other vCPU now and then, and a connection that
    /// follows at once keeps the next call local, where one that followed
    /// at most once a millisecond measured no better than none
    /// (BENCHMARKS.md, "On an Intel guest"). Returns whether
    /// it moved.
    fn follow_client(&mut self, t: Token) -> bool {
        let one_cpu = self.shared.cpus.len() < 2;
        let here = self.shared.cpu_of(self.idx);
        let Some(Entry::Http(c)) = self.entries.get_mut(&t) else { return false };
        if c.busy || !c.wbuf.is_empty() || c.after != After::Serve || c.eof || c.read_paused || c.rbuf.is_empty() {
            return false;
        }
        // On one vCPU there is nowhere to go: no `getsockopt` per request.
        // Nor is a client beside the thread there in `answered_here`'s
        // sense: with no C/C++ worker spinning (`worker_spin_us_for`), the
        // thread's spin keeps the client's next request from waking it,
        // which would preempt the client in its `send`: measured faster.
        if one_cpu {
            c.beside = false;
            return false;
        }
        let Ok(cpu) = socket2::SockRef::from(&c.stream).cpu_affinity() else {
            c.beside = false;
            return false;
        };
        // Already on that vCPU (one of its threads, when there are more
        // threads than vCPUs): stay.
        c.beside = c.loopback && here == Some(cpu);
        if here == Some(cpu) {
            return false;
        }
        let Some(to) = self.shared.thread_on(cpu) else { return false };
        let Some(Entry::Http(mut c)) = self.remove_entry(t) else { return false };
        if let Some(door) = self.shared.front.get() {
            door.followed();
        }
        // Its new thread runs on the vCPU it was received on.
        c.beside = c.loopback;
        self.shared.post(to, Cmd::AdoptHttp(Box::new(c)));
        true
    }

    /// Serves a client connection another I/O thread moved here
    /// (`follow_client`), starting with what it read.
    fn adopt_http(&mut self, c: HttpConn) {
        let t = self.token();
        let fd = c.stream.as_raw_fd();
        if let Err(e) = self.poll.registry().register(&mut SourceFd(&fd), t, Interest::READABLE) {
            // The gateway serves it from here, what it read first.
            log::error!("registering a client connection: {e}");
            if let Some(door) = self.shared.front.get() {
                door.hand_over(self.idx, c.stream, c.rbuf);
            }
            return;
        }
        self.entries.insert(t, Entry::Http(c));
        self.serve_http(t);
        self.settle_http(t);
    }

    /// Serves the request at the head of a client's buffer if it can: a
    /// call this door takes, or the connection goes to the gateway.
    fn serve_http(&mut self, t: Token) {
        let Some(door) = self.shared.front.get().cloned() else { return };
        let Some(Entry::Http(c)) = self.entries.get_mut(&t) else { return };
        // One call at a time, and the next only once the last answer is
        // written: a client that pipelines and never reads holds one
        // answer here, not one per request.
        if c.busy || c.after != After::Serve || c.rbuf.is_empty() || !c.wbuf.is_empty() {
            return;
        }
        let max = self.shared.cfg.payload_len_max;
        let req = match api::http::parse_call(&c.rbuf, max, door.loopback_only()) {
            api::http::Parsed::Partial => return,
            api::http::Parsed::PartialBody => {
                // A body on its way: progress, as for the gateway (whose
                // timeout covers heads only).
                c.heard_ns = sys::clock::monotonic_ns();
                return;
            }
            api::http::Parsed::HandOver(why) => {
                log::debug!("front door: handing a connection to the gateway: {why}");
                return self.hand_over(t);
            }
            api::http::Parsed::Call(r) => r,
        };
        // Calls to a function not here, or while other engines share the
        // load, are the gateway's to route; calls that need an invoke key
        // the gateway's to check (the engine never holds keys).
        let (Some(func), true) = (self.shared.function(&req.name), door.sole_engine(&mut |_| {})) else {
            return self.hand_over(t);
        };
        if func.spec.auth != api::spec::Auth::None {
            return self.hand_over(t);
        }
        let input = c.rbuf[req.body.clone()].to_vec();
        c.rbuf.drain(..req.body.end);
        c.busy = true;
        if req.close {
            c.after = After::Close;
        }
        let mut timeout_ms = func.spec.timeout_ms;
        if req.timeout_ms > 0 {
            timeout_ms = timeout_ms.min(u64::from(req.timeout_ms));
        }
        let now_us = sys::clock::unix_us();
        let deadline_us = now_us + timeout_ms * 1000;
        self.next_seq = self.next_seq.wrapping_add(1);
        let call_id = self.id_tag | (self.next_seq & 0xffff_ffff);
        let origin = Origin::Http { thread: self.idx, conn: t, close: req.close };
        let mut rec = new_record(func, origin, Payload::Bytes(input), 0, deadline_us, now_us);
        if let Some(tr) = &self.shared.tracer {
            rec.trace = tr.root(req.trace);
        }
        self.submit(call_id, rec);
    }

    /// Serves what waits on the connections answered, or whose answers
    /// were written, in this iteration.
    fn serve_answered(&mut self) {
        while let Some(t) = self.answered.pop() {
            let paused = matches!(self.entries.get(&t), Some(Entry::Http(c)) if c.read_paused);
            if paused {
                self.read_http(t, false);
            } else {
                self.serve_http(t);
                self.settle_http(t);
            }
        }
    }

    /// Gives a client connection to the gateway once what it was answered
    /// here is written.
    fn hand_over(&mut self, t: Token) {
        let Some(Entry::Http(c)) = self.entries.get_mut(&t) else { return };
        c.after = After::HandOver;
        self.settle_http(t);
    }

    /// Once a connection has no call in flight and its answers are
    /// written: hands it over, closes it, or (a client that sent its end
    /// of file, with nothing more to serve) closes it.
    fn settle_http(&mut self, t: Token) {
        let after = match self.entries.get(&t) {
            Some(Entry::Http(c)) if !c.busy && c.wbuf.is_empty() => match c.after {
                After::Serve if c.eof => After::Close,
                After::Serve => return,
                a => a,
            },
            _ => return,
        };
        let Some(Entry::Http(c)) = self.remove_entry(t) else { return };
        // One owner at a time (ARCHITECTURE.md): nothing of it in flight
        // or unwritten here when the gateway takes it.
        debug_assert!(!c.busy && c.wbuf.is_empty(), "a connection leaves with a call in flight or unwritten");
        if after == After::HandOver {
            if let Some(door) = self.shared.front.get() {
                door.hand_over(self.idx, c.stream, c.rbuf);
            }
        }
    }

    fn flush_http(&mut self, t: Token) {
        let Some(Entry::Http(c)) = self.entries.get_mut(&t) else { return };
        let failed = write_out(&mut c.stream, &mut c.wbuf).is_err();
        let want = !c.wbuf.is_empty();
        if want != c.wants_write {
            c.wants_write = want;
            let interest = if want { Interest::READABLE | Interest::WRITABLE } else { Interest::READABLE };
            let fd = c.stream.as_raw_fd();
            let _ = self.poll.registry().reregister(&mut SourceFd(&fd), t, interest);
        }
        if failed {
            self.remove_entry(t);
        } else if !want {
            // Written: serve what waits, or let it go (`serve_answered`).
            self.answered.push(t);
        }
    }

    // ---- gateway connections ----

    fn read_conn(&mut self, t: Token, hung_up: bool) {
        let Some(Entry::Conn(c)) = self.entries.get_mut(&t) else { return };
        let mut closed = false;
        let chunk = &mut self.scratch[..];
        loop {
            match c.stream.read(chunk) {
                Ok(0) => {
                    closed = true;
                    break;
                }
                Ok(n) => {
                    c.heard_ns = sys::clock::monotonic_ns();
                    c.rbuf.extend_from_slice(&chunk[..n]);
                    if drained(n, READ_CHUNK, hung_up) {
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    closed = true;
                    break;
                }
            }
        }
        let mut frames = Vec::new();
        let mut off = 0;
        loop {
            match wire::frame::next_frame(&c.rbuf[off..]) {
                Ok(Some((fh, end))) => {
                    frames.push((fh, c.rbuf[off + FRAME_HEADER_LEN..off + end].to_vec()));
                    off += end;
                }
                Ok(None) => break,
                Err(e) => {
                    log::error!("gateway connection: {e}; closing it");
                    closed = true;
                    break;
                }
            }
        }
        c.rbuf.drain(..off);
        for (fh, body) in frames {
            self.on_frame(t, fh, body);
        }
        if closed {
            self.remove_entry(t);
        }
    }

    fn on_frame(&mut self, conn: Token, fh: FrameHeader, body: Vec<u8>) {
        let reject = |this: &mut Self, kind: ErrorKind, msg: String| {
            let mut h = FrameHeader::new(FrameKind::Error, fh.call_id, msg.len());
            h.error_kind = kind.code();
            let mut frame = h.encode().to_vec();
            frame.extend_from_slice(msg.as_bytes());
            this.queue_write(conn, &frame);
        };
        let (name, input, parent, depth, trace) = match fh.kind {
            FrameKind::Call => {
                let trace = wire::frame::call_trace(&fh, &body);
                if fh.call_traced() && trace.is_none() {
                    let msg = format!("a Call frame of {} bytes cannot hold the trace block it claims", body.len());
                    return reject(self, ErrorKind::BadRequest, msg);
                }
                let (name, input) = wire::frame::call_parts(&fh, &body);
                (name, input, None, 0, trace.unwrap_or(&[]))
            }
            FrameKind::Forward => {
                let Some(f) = wire::frame::forward_parts(&fh, &body) else {
                    let msg = format!("a Forward frame of {} bytes cannot hold its ids and name", body.len());
                    return reject(self, ErrorKind::BadRequest, msg);
                };
                (f.name, f.input, Some((f.origin_call_id, f.parent_call_id)), fh.forward_depth(), f.trace)
            }
            FrameKind::Result | FrameKind::Error => return self.on_answer(conn, fh, body),
            FrameKind::Ping => {
                let pong = FrameHeader::new(FrameKind::Pong, fh.call_id, 0).encode();
                return self.queue_write(conn, &pong);
            }
            kind => {
                log::warn!("unexpected {kind:?} frame on a data connection");
                return;
            }
        };
        let name = String::from_utf8_lossy(name).into_owned();
        let Some(func) = self.shared.function(&name) else {
            return reject(self, ErrorKind::NotFound, format!("no function named {name:?}"));
        };
        // Fail closed: a gateway whose view of the function predates its
        // `auth: key` (a deploy through another gateway, a table being
        // read again) sends the call unchecked; it is refused here, and
        // that gateway judges it again (gateway::http::invoke).
        if fh.kind == FrameKind::Call && func.spec.auth != api::spec::Auth::None && !fh.call_key_checked() {
            let msg = format!(
                "function {name} needs an invoke key and this call was not checked for one (the gateway's view of \
                 {name} is older than this engine's); retry"
            );
            return reject(self, ErrorKind::EngineUnavailable, msg);
        }
        let max = self.shared.cfg.payload_len_max;
        if input.len() > max {
            let msg = format!("input of {} bytes exceeds the {max}-byte limit", input.len());
            return reject(self, ErrorKind::PayloadTooLarge, msg);
        }
        let depth_max = self.shared.cfg.max_call_depth;
        if depth >= depth_max {
            let msg = format!(
                "calling {name} would make a chain of more than {depth_max} nested internal calls across servers \
                 (runaway recursion or a call cycle?); the engine's --max-call-depth sets the limit"
            );
            return reject(self, ErrorKind::CallDepthExceeded, msg);
        }
        let mut timeout_ms = func.spec.timeout_ms;
        if fh.call_timeout_ms() > 0 {
            timeout_ms = timeout_ms.min(u64::from(fh.call_timeout_ms()));
        }
        let now_us = sys::clock::unix_us();
        let deadline_us = now_us + timeout_ms * 1000;
        let origin = Origin::Gateway { thread: self.idx, conn };
        let mut rec = new_record(func, origin, Payload::Bytes(input.to_vec()), 0, deadline_us, now_us);
        rec.background = fh.kind == FrameKind::Call && fh.call_background();
        if let Some(t) = &self.shared.tracer {
            // A block that does not decode is ignored, as a header would be.
            let ctx = (!trace.is_empty()).then(|| api::trace::TraceContext::decode(trace)).flatten();
            rec.trace = match (parent, ctx) {
                (Some(_), Some(c)) => Some(t.forwarded(c)),
                (Some(_), None) => None,
                (None, c) => t.root(c),
            };
        }
        if let Some((origin_id, parent)) = parent {
            // Shown under its caller's ids; its chain here starts with it,
            // counting the calls above it on the caller's side.
            // Below --max-call-depth (at most 1024), checked above.
            rec.depth_above = u16::try_from(depth.max(1)).unwrap_or(u16::MAX);
            // Its callers hold workers on other servers, perhaps of this
            // very function (a cycle across servers): held back by τ it
            // could wait for ever, so it goes first and beyond τ, as a
            // nested call here does (scheduler module doc).
            rec.nested = true;
            // Not for an id in flight here (submit refuses it): its shown
            // ids would be the other call's.
            if !self.shared.calls.contains(fh.call_id) {
                self.shared.remote.came_in(fh.call_id, origin_id, parent);
            }
        }
        self.submit(fh.call_id, rec);
    }

    /// The answer to an internal call this engine sent to another server.
    fn on_answer(&mut self, conn: Token, fh: FrameHeader, body: Vec<u8>) {
        let Some(o) = self.shared.remote.finish(fh.call_id, (self.idx, conn)) else {
            // Answered here already (timed out, or its connection closed).
            return;
        };
        let t = wire::frame::Timing::from_header(&fh);
        // Its wait in the callee's queue is not the caller's processing
        // time (Nightcore §4.1), wherever the callee ran.
        self.shared.calls.with(o.parent_call_id, |p| p.sub_queue_ns += u64::from(t.queue_us) * 1000);
        let outcome = if fh.kind == FrameKind::Result {
            let max = self.shared.cfg.payload_len_max;
            if body.len() > max {
                let msg = format!("output of {} bytes exceeds the {max}-byte limit", body.len());
                Outcome::Err(ErrorKind::OutputTooLarge, msg)
            } else {
                Outcome::Ok(Payload::Bytes(body))
            }
        } else {
            let kind = ErrorKind::from_code(fh.error_kind).unwrap_or(ErrorKind::Internal);
            Outcome::Err(kind, String::from_utf8_lossy(&body).into_owned())
        };
        remote::answer(&self.shared, fh.call_id, o, outcome);
    }

    fn send_replies(&mut self, replies: Vec<GatewayReply>) {
        for r in replies {
            if r.thread == self.idx {
                self.queue_write(r.conn, &r.frame);
            } else {
                self.shared.post(r.thread, Cmd::Reply { conn: r.conn, frame: r.frame });
            }
        }
    }

    fn queue_write(&mut self, t: Token, bytes: &[u8]) {
        // The connection may be gone (the gateway went away, the client
        // hung up): drop the reply.
        match self.entries.get_mut(&t) {
            Some(Entry::Conn(c)) => {
                if c.wbuf.is_empty() {
                    self.dirty.push(t);
                }
                c.wbuf.extend_from_slice(bytes);
            }
            Some(Entry::Http(c)) => {
                if c.wbuf.is_empty() {
                    self.dirty.push(t);
                }
                c.wbuf.extend_from_slice(bytes);
                // Its one call is answered: the next request may be served.
                c.busy = false;
                self.answered_here |= c.beside;
                c.heard_ns = sys::clock::monotonic_ns();
                self.answered.push(t);
            }
            _ => {}
        }
    }

    fn flush_dirty(&mut self) {
        for t in std::mem::take(&mut self.dirty) {
            self.flush(t);
        }
    }

    fn flush(&mut self, t: Token) {
        if let Some(Entry::Http(_)) = self.entries.get(&t) {
            return self.flush_http(t);
        }
        let Some(Entry::Conn(c)) = self.entries.get_mut(&t) else { return };
        let failed = write_out(&mut c.stream, &mut c.wbuf).is_err();
        let want = !c.wbuf.is_empty();
        if want != c.wants_write {
            c.wants_write = want;
            let interest = if want { Interest::READABLE | Interest::WRITABLE } else { Interest::READABLE };
            let _ = self.poll.registry().reregister(&mut c.stream, t, interest);
        }
        if failed {
            self.remove_entry(t);
        }
    }
}

/// Whether a socket read of `n` bytes out of `want` left nothing to read:
/// registrations are edge-triggered, and a short read of a stream socket
/// took all it held, so bytes arriving later report again (one `read`
/// fewer per request than reading on to `WouldBlock`). Unless the event
/// also reported the peer's end of file or an error (`hung_up`): no later
/// event would, so read on to it.
fn drained(n: usize, want: usize, hung_up: bool) -> bool {
    n < want && !hung_up
}

/// Writes what `wbuf` holds until the socket would block, keeping the
/// rest; an error means the connection is broken.
fn write_out(stream: &mut impl Write, wbuf: &mut Vec<u8>) -> io::Result<()> {
    let mut written = 0;
    let mut result = Ok(());
    while written < wbuf.len() {
        match stream.write(&wbuf[written..]) {
            Ok(n) => written += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                result = Err(e);
                break;
            }
        }
    }
    wbuf.drain(..written);
    result
}

/// 24 random bits (from /dev/urandom; the clock if it cannot be read).
fn random_bits() -> u64 {
    let mut b = [0u8; 8];
    let random = File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b));
    let bits = match random {
        Ok(()) => u64::from_le_bytes(b),
        Err(_) => sys::clock::unix_us() ^ (u64::from(std::process::id()) << 20),
    };
    bits & 0xff_ffff
}

/// A call received now; `now_unix_us` is the wall clock its caller just read
/// (for its deadline): one clock read fewer per call.
fn new_record(
    func: Arc<Function>,
    origin: Origin,
    input: Payload,
    parent: u64,
    deadline_us: u64,
    now_unix_us: u64,
) -> CallRecord {
    CallRecord {
        func,
        origin,
        input: Some(input),
        parent_call_id: parent,
        deadline_us,
        recv_ns: sys::clock::monotonic_ns(),
        dispatch_ns: 0,
        worker: None,
        sub_queue_ns: 0,
        cold: false,
        nested: false,
        background: false,
        depth_above: 0,
        recv_unix_us: now_unix_us,
        trace: None,
        cpu_us: None,
    }
}

/// An internal call leaving this engine (`IoThread::leaving`).
struct Leaving {
    input: Vec<u8>,
    /// What is left of the caller's deadline, or None if it has none.
    timeout_ms: Option<u64>,
    depth: u32,
    /// The caller's trace context, if it has one and tracing is on.
    trace: Option<api::trace::TraceContext>,
}

/// A peer on this host's loopback, IPv4 or IPv6, or IPv4 written as IPv6
/// (a dual-stack listener's view of 127.0.0.1).
fn is_loopback(ip: std::net::IpAddr) -> bool {
    match ip {
        std::net::IpAddr::V4(a) => a.is_loopback(),
        std::net::IpAddr::V6(a) => a.is_loopback() || a.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback()),
    }
}

#[cfg(test)]
mod tests {
    use super::is_loopback;

    #[test]
    fn only_loopback_peers_count_as_on_this_host() {
        for ip in ["127.0.0.1", "127.3.2.1", "::1", "::ffff:127.0.0.1"] {
            assert!(is_loopback(ip.parse().unwrap()), "{ip}");
        }
        for ip in ["10.0.0.1", "192.168.1.2", "::ffff:10.0.0.1", "fe80::1", "0.0.0.0"] {
            assert!(!is_loopback(ip.parse().unwrap()), "{ip}");
        }
    }
}
