//! The open-loop sender: one thread, one mio poll, HTTP/1.1 keep-alive
//! connections with at most one request in flight each (no pipelining). A
//! request is sent at its scheduled time whatever happened to earlier ones;
//! when every connection is busy and the pool is at its cap, the due
//! requests wait and their send lag shows it.
//!
//! Timing: epoll sleeps in whole milliseconds, so the loop waits on a
//! timerfd set to [`SPIN_NS`] before the next send and spins (zero-timeout
//! polls) only for that last stretch. (It used to spin for the last
//! millisecond: at 2,000 calls/s that kept a vCPU busy, and on a small
//! machine the server under test waited behind it for time slices.)
//!
//! An `https://` target's connections run TLS (rustls) over the same
//! non-blocking sockets: a request's bytes go into the session, which the
//! loop flushes as the socket takes them; the handshake happens with the
//! first request of each connection (as the TCP connect does), so its
//! time is in that request's latency.

use crate::http::{parse_response, Response};
use crate::schedule::Arrival;
use crate::stats::percentile;
use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token};
use std::io::{ErrorKind, Read, Write};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use sys::clock::Timer;

/// How long before a send the loop stops sleeping and spins: enough for the
/// timer's wake-up on this machine kind, where sends then left with a lag
/// of p50 0 and p99 35-60 µs at 2,050 calls/s (BENCHMARKS.md, "It was the
/// load generator"); a later wake-up shows as send lag.
const SPIN_NS: u64 = 60_000;
/// The poll token of the send timer (connections use their slot number).
const TIMER: Token = Token(usize::MAX);

/// Where a request goes: an address, and the server name to run TLS with
/// (`https://`), if any.
pub type Target = (SocketAddr, Option<rustls::pki_types::ServerName<'static>>);

/// The prebuilt request of one (instance, application) and where it goes.
pub struct Template {
    pub target: Target,
    pub bytes: Vec<u8>,
    /// The body's length, what requests.csv reports as bytes_out.
    pub body_len: usize,
}

pub struct Plan<'a> {
    pub arrivals: &'a [Arrival],
    pub templates: Vec<Template>,
    /// The template of each arrival.
    pub template_of: Vec<usize>,
}

pub struct Options {
    pub max_connections: usize,
    pub end_ns: u64,
    pub drain: Duration,
    pub progress: bool,
    /// For `https://` targets (`crate::tls`).
    pub tls: Option<Arc<rustls::ClientConfig>>,
}

/// What happened to one arrival.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    pub sent_ns: Option<u64>,
    pub done_ns: Option<u64>,
    pub bytes_out: usize,
    pub response: Option<Response>,
    /// A transport error word: connect, reset, timeout.
    pub transport_error: Option<&'static str>,
}

enum State {
    Connecting,
    Idle,
    Busy,
}

struct Conn {
    stream: TcpStream,
    /// The TLS session of an `https://` target's connection.
    tls: Option<Box<rustls::ClientConnection>>,
    target: usize,
    state: State,
    /// The arrival in flight (Connecting with a request, or Busy).
    req: Option<usize>,
    written: usize,
    rbuf: Vec<u8>,
}

struct Sender<'a> {
    plan: &'a Plan<'a>,
    opts: &'a Options,
    start: Instant,
    poll: Poll,
    conns: Vec<Option<Conn>>,
    free_slots: Vec<usize>,
    /// Idle connections per target address.
    idle: Vec<Vec<usize>>,
    targets: Vec<Target>,
    template_target: Vec<usize>,
    live: usize,
    in_flight: usize,
    out: Vec<Outcome>,
    next: usize,
    sent: usize,
    completed: usize,
    errors: usize,
    second_latencies_ns: Vec<u64>,
    timer: Timer,
    /// `start` on the timer's clock, in ns.
    start_mono_ns: u64,
    /// When the timer is set to fire (on its clock), 0 when not armed.
    armed_ns: u64,
}

/// Runs the plan; `start` is the test's time zero. Returns one outcome per arrival.
pub fn run(plan: &Plan, opts: &Options, start: Instant) -> std::io::Result<Vec<Outcome>> {
    let mut targets: Vec<Target> = Vec::new();
    let template_target = plan
        .templates
        .iter()
        .map(|t| match targets.iter().position(|a| *a == t.target) {
            Some(i) => i,
            None => {
                targets.push(t.target.clone());
                targets.len() - 1
            }
        })
        .collect();
    let poll = Poll::new()?;
    let timer = Timer::new()?;
    poll.registry().register(
        &mut mio::unix::SourceFd(&std::os::fd::AsRawFd::as_raw_fd(&timer)),
        TIMER,
        Interest::READABLE,
    )?;
    let start_mono_ns = sys::clock::monotonic_ns().saturating_sub(start.elapsed().as_nanos() as u64);
    let mut s = Sender {
        plan,
        opts,
        start,
        poll,
        conns: Vec::new(),
        free_slots: Vec::new(),
        idle: vec![Vec::new(); targets.len()],
        targets,
        template_target,
        live: 0,
        in_flight: 0,
        out: vec![Outcome::default(); plan.arrivals.len()],
        next: 0,
        sent: 0,
        completed: 0,
        errors: 0,
        second_latencies_ns: Vec::new(),
        timer,
        start_mono_ns,
        armed_ns: 0,
    };
    s.run_loop()?;
    Ok(s.out)
}

impl Sender<'_> {
    fn now_ns(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    fn run_loop(&mut self) -> std::io::Result<()> {
        let mut events = Events::with_capacity(1024);
        let deadline_ns = self.opts.end_ns + self.opts.drain.as_nanos() as u64;
        let mut next_progress_ns = 1_000_000_000;
        loop {
            let now = self.now_ns();
            let blocked = self.send_due(now);
            let n = self.plan.arrivals.len();
            if self.next == n && self.in_flight == 0 {
                break;
            }
            let now = self.now_ns();
            if now >= deadline_ns {
                self.time_out_the_rest();
                break;
            }
            if now >= next_progress_ns {
                self.progress(now);
                next_progress_ns += 1_000_000_000;
            }
            let mut wake_ns = deadline_ns.min(next_progress_ns);
            if self.next < n && !blocked {
                wake_ns = wake_ns.min(self.plan.arrivals[self.next].at_ns);
            }
            let wait_ns = wake_ns.saturating_sub(now);
            let timeout = if wait_ns > SPIN_NS {
                let at = self.start_mono_ns + wake_ns - SPIN_NS;
                if at != self.armed_ns {
                    self.timer.arm_at(at)?;
                    self.armed_ns = at;
                }
                None
            } else {
                Some(Duration::ZERO)
            };
            self.poll.poll(&mut events, timeout)?;
            for ev in events.iter() {
                if ev.token() == TIMER {
                    self.timer.clear();
                    self.armed_ns = 0;
                } else {
                    self.on_event(ev.token().0);
                }
            }
        }
        if self.opts.progress {
            self.progress(self.now_ns());
        }
        Ok(())
    }

    /// Sends every due arrival. Returns true when one is due but the pool is at its cap.
    fn send_due(&mut self, now: u64) -> bool {
        while self.next < self.plan.arrivals.len() && self.plan.arrivals[self.next].at_ns <= now {
            let tpl = self.plan.template_of[self.next];
            let target = self.template_target[tpl];
            let slot = match self.idle[target].pop() {
                Some(c) => c,
                None if self.live < self.opts.max_connections => match self.connect(target) {
                    Some(c) => c,
                    None => {
                        self.fail(self.next, "connect");
                        self.next += 1;
                        continue;
                    }
                },
                None => return true,
            };
            let i = self.next;
            self.next += 1;
            self.in_flight += 1;
            self.out[i].bytes_out = self.plan.templates[tpl].body_len;
            let c = self.conns[slot].as_mut().expect("slot just taken from the pool");
            c.req = Some(i);
            c.written = 0;
            if matches!(c.state, State::Idle) {
                c.state = State::Busy;
                self.out[i].sent_ns = Some(self.now_ns());
                self.sent += 1;
                self.write_some(slot);
            }
        }
        false
    }

    fn connect(&mut self, target: usize) -> Option<usize> {
        let (addr, name) = &self.targets[target];
        let tls = match (name, &self.opts.tls) {
            (None, _) => None,
            (Some(n), Some(cfg)) => Some(Box::new(rustls::ClientConnection::new(cfg.clone(), n.clone()).ok()?)),
            (Some(_), None) => return None,
        };
        let stream = TcpStream::connect(*addr).ok()?;
        let _ = stream.set_nodelay(true);
        let slot = self.free_slots.pop().unwrap_or_else(|| {
            self.conns.push(None);
            self.conns.len() - 1
        });
        let mut conn = Conn { stream, tls, target, state: State::Connecting, req: None, written: 0, rbuf: Vec::new() };
        if self
            .poll
            .registry()
            .register(&mut conn.stream, Token(slot), Interest::READABLE | Interest::WRITABLE)
            .is_err()
        {
            self.free_slots.push(slot);
            return None;
        }
        self.conns[slot] = Some(conn);
        self.live += 1;
        Some(slot)
    }

    fn on_event(&mut self, slot: usize) {
        let Some(c) = self.conns.get_mut(slot).and_then(Option::as_mut) else { return };
        if matches!(c.state, State::Connecting) {
            // mio's recipe: on readiness, a connect error shows in take_error;
            // NotConnected from peer_addr means the handshake is still running.
            if !matches!(c.stream.take_error(), Ok(None)) {
                return self.drop_conn(slot, "connect");
            }
            match c.stream.peer_addr() {
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::NotConnected => return,
                Err(_) => return self.drop_conn(slot, "connect"),
            }
            c.state = State::Busy;
            if let Some(i) = c.req {
                self.out[i].sent_ns = Some(self.now_ns());
                self.sent += 1;
            }
        }
        self.write_some(slot);
        self.read_some(slot);
    }

    fn write_some(&mut self, slot: usize) {
        let Some(c) = self.conns[slot].as_mut() else { return };
        if let Some(tls) = c.tls.as_mut() {
            // The handshake's records, and the request's once it is written in.
            let bytes = match (&c.state, c.req) {
                (State::Busy, Some(i)) => &self.plan.templates[self.plan.template_of[i]].bytes[..],
                _ => &[],
            };
            loop {
                let before = c.written;
                while c.written < bytes.len() {
                    match tls.writer().write(&bytes[c.written..]) {
                        // Its buffer is full until records go out, or (during
                        // the handshake) until the handshake is done: then
                        // read_some's records bring us back here.
                        Ok(0) => break,
                        Ok(n) => c.written += n,
                        Err(_) => return self.drop_conn(slot, "tls"),
                    }
                }
                match flush_tls(tls, &mut c.stream) {
                    Ok(true) if c.written < bytes.len() && c.written > before => continue,
                    Ok(_) => return,
                    Err(_) => return self.drop_conn(slot, "reset"),
                }
            }
        }
        let (State::Busy, Some(i)) = (&c.state, c.req) else { return };
        let bytes = &self.plan.templates[self.plan.template_of[i]].bytes;
        while c.written < bytes.len() {
            match c.stream.write(&bytes[c.written..]) {
                Ok(0) => return self.drop_conn(slot, "reset"),
                Ok(n) => c.written += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return self.drop_conn(slot, "reset"),
            }
        }
    }

    fn read_some(&mut self, slot: usize) {
        let mut buf = [0u8; 16 * 1024];
        loop {
            let Some(c) = self.conns[slot].as_mut() else { return };
            if let Some(tls) = c.tls.as_mut() {
                match read_tls(tls, &mut c.stream, &mut c.rbuf, &mut buf) {
                    Ok(TlsRead::More) => {
                        // The handshake's answers, and a request waiting for it.
                        self.write_some(slot);
                        if self.conns[slot].as_ref().is_some_and(|c| !c.rbuf.is_empty()) && !self.try_complete(slot) {
                            return;
                        }
                        continue;
                    }
                    Ok(TlsRead::Blocked) => return self.write_some(slot),
                    Ok(TlsRead::Closed) => return self.drop_conn(slot, "reset"),
                    Err(word) => return self.drop_conn(slot, word),
                }
            }
            match c.stream.read(&mut buf) {
                Ok(0) => return self.drop_conn(slot, "reset"),
                Ok(n) => {
                    c.rbuf.extend_from_slice(&buf[..n]);
                    if !self.try_complete(slot) {
                        return;
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return self.drop_conn(slot, "reset"),
            }
        }
    }

    /// Completes the request in flight if its response is whole. Returns
    /// false when the connection was dropped.
    fn try_complete(&mut self, slot: usize) -> bool {
        let Some(c) = self.conns[slot].as_mut() else { return false };
        match parse_response(&c.rbuf) {
            Ok(None) => true,
            Err(_) => {
                self.drop_conn(slot, "reset");
                false
            }
            Ok(Some((resp, used))) => {
                c.rbuf.drain(..used);
                let Some(i) = c.req.take() else {
                    // A response nobody asked for: the connection is confused.
                    self.drop_conn(slot, "reset");
                    return false;
                };
                let close = resp.close;
                c.state = State::Idle;
                let target = c.target;
                let now = self.now_ns();
                self.in_flight -= 1;
                self.completed += 1;
                if resp.error.is_some() {
                    self.errors += 1;
                }
                self.second_latencies_ns.push(now.saturating_sub(self.plan.arrivals[i].at_ns));
                self.out[i].done_ns = Some(now);
                self.out[i].response = Some(resp);
                if close {
                    self.drop_conn(slot, "reset");
                    false
                } else {
                    self.idle[target].push(slot);
                    true
                }
            }
        }
    }

    /// Closes a connection; its request in flight, if any, fails with `error`.
    fn drop_conn(&mut self, slot: usize, error: &'static str) {
        let Some(mut c) = self.conns[slot].take() else { return };
        let _ = self.poll.registry().deregister(&mut c.stream);
        self.idle[c.target].retain(|s| *s != slot);
        self.free_slots.push(slot);
        self.live -= 1;
        if let Some(i) = c.req {
            self.in_flight -= 1;
            self.fail(i, error);
        }
    }

    fn fail(&mut self, i: usize, error: &'static str) {
        self.errors += 1;
        self.completed += 1;
        self.out[i].done_ns = Some(self.now_ns());
        self.out[i].transport_error = Some(error);
    }

    fn time_out_the_rest(&mut self) {
        for slot in 0..self.conns.len() {
            if self.conns[slot].as_ref().is_some_and(|c| c.req.is_some()) {
                self.drop_conn(slot, "timeout");
            }
        }
        for i in self.next..self.plan.arrivals.len() {
            self.fail(i, "timeout");
            self.out[i].done_ns = None;
        }
        self.next = self.plan.arrivals.len();
    }

    fn progress(&mut self, now: u64) {
        if !self.opts.progress {
            return;
        }
        self.second_latencies_ns.sort_unstable();
        let p99 =
            percentile(&self.second_latencies_ns, 99.0).map_or("-".into(), |v| format!("{:.2} ms", v as f64 / 1e6));
        eprintln!(
            "[{:6.1}s] sent {}  completed {}  errors {}  in flight {}  connections {}  p99(last 1s) {p99}",
            now as f64 / 1e9,
            self.sent,
            self.completed,
            self.errors,
            self.in_flight,
            self.live
        );
        self.second_latencies_ns.clear();
    }
}

/// Sends the session's pending records as far as the socket takes them:
/// true when all went out.
fn flush_tls(tls: &mut rustls::ClientConnection, stream: &mut TcpStream) -> std::io::Result<bool> {
    while tls.wants_write() {
        match tls.write_tls(stream) {
            Ok(0) => return Err(ErrorKind::WriteZero.into()),
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(false),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

enum TlsRead {
    /// Records were read (the response may have grown).
    More,
    /// Nothing more until the socket is readable again.
    Blocked,
    /// The peer closed the connection.
    Closed,
}

/// Reads records from the socket into the session and its plaintext into
/// `rbuf`. Err: the transport error word.
fn read_tls(
    tls: &mut rustls::ClientConnection,
    stream: &mut TcpStream,
    rbuf: &mut Vec<u8>,
    buf: &mut [u8],
) -> Result<TlsRead, &'static str> {
    match tls.read_tls(stream) {
        Ok(0) => return Ok(TlsRead::Closed),
        Ok(_) => {}
        Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(TlsRead::Blocked),
        Err(e) if e.kind() == ErrorKind::Interrupted => return Ok(TlsRead::More),
        Err(_) => return Err("reset"),
    }
    // A bad certificate (with --tls-ca), a failed handshake, a bad record.
    let state = tls.process_new_packets().map_err(|_| "tls")?;
    let mut left = state.plaintext_bytes_to_read();
    while left > 0 {
        match tls.reader().read(buf) {
            Ok(0) => break,
            Ok(n) => {
                rbuf.extend_from_slice(&buf[..n]);
                left = left.saturating_sub(n);
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            Err(_) => return Err("reset"),
        }
    }
    if state.peer_has_closed() && rbuf.is_empty() {
        return Ok(TlsRead::Closed);
    }
    Ok(TlsRead::More)
}
