//! One gateway thread's data connection to an engine: a persistent TCP
//! connection carrying `Call` frames out and `Result`/`Error` frames back,
//! matched by call id. Single-threaded (lives on its gateway thread's
//! current-thread runtime), so callers write straight into the socket with
//! no task hop on the fast path.
//!
//! The other way, the engine sends `Forward` frames: internal calls whose
//! callee is on another server. They go to the thread's [`ForwardTx`], and
//! their answers come back down this link ([`EngineLink::answer`]).

use bytes::Bytes;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};
use tokio::net::TcpStream;
use tokio::sync::{oneshot, Notify};
use wire::frame::{FrameHeader, FrameKind, Timing, FRAME_HEADER_LEN};
use wire::ErrorKind;

pub enum Reply {
    Ok(Bytes, Timing),
    Err(ErrorKind, String, Timing),
    /// The link failed before the call's frame was whole in the kernel's
    /// hands: the engine cannot have started it, so it may go elsewhere.
    Unsent,
}

/// A `Forward` frame an engine sent: an internal call to run elsewhere.
pub struct Forwarded {
    pub from: Rc<EngineLink>,
    pub header: FrameHeader,
    pub body: Bytes,
}

/// Where a gateway thread's links put the forwards they receive.
pub type ForwardTx = tokio::sync::mpsc::UnboundedSender<Forwarded>;

/// Forwards one engine may have waiting on one gateway thread at once;
/// more are answered `overloaded` at once (an engine is trusted with the
/// link's secret, not with the gateway's memory).
pub const FORWARDS_MAX: u32 = 4096;

pub struct EngineLink {
    addr: SocketAddr,
    secret: api::auth::Secret,
    thread: u32,
    stream: RefCell<Option<Rc<TcpStream>>>,
    out: RefCell<Vec<u8>>,
    flush: Notify,
    pending: RefCell<HashMap<u64, oneshot::Sender<Reply>>>,
    up: Cell<bool>,
    logged_down: Cell<bool>,
    /// Closed for good: the engine left the table.
    closed: Cell<bool>,
    stop: Notify,
    forwards: ForwardTx,
    /// Its forwards not answered yet.
    pub forwards_waiting: Cell<u32>,
    /// When the engine last sent anything on this connection.
    last_heard: Cell<Instant>,
    /// When the flusher last got some of `out` into the kernel: with a
    /// backlog, the peer is taking our bytes (acknowledging them).
    last_progress: Cell<Instant>,
    /// Bytes taken from the front of `out` since the connection opened.
    out_taken: Cell<u64>,
    /// Calls whose frame is not wholly out of `out` yet: id, and where in
    /// the connection's byte stream the frame ends.
    unsent: RefCell<std::collections::VecDeque<(u64, u64)>>,
}

impl EngineLink {
    /// Creates the link and starts its connect/read loop on the current
    /// `LocalSet`.
    pub fn start(addr: SocketAddr, secret: api::auth::Secret, thread: u32, forwards: ForwardTx) -> Rc<EngineLink> {
        let link = Rc::new(EngineLink {
            addr,
            secret,
            thread,
            stream: RefCell::new(None),
            out: RefCell::new(Vec::new()),
            flush: Notify::new(),
            pending: RefCell::new(HashMap::new()),
            up: Cell::new(false),
            logged_down: Cell::new(false),
            closed: Cell::new(false),
            stop: Notify::new(),
            forwards,
            forwards_waiting: Cell::new(0),
            last_heard: Cell::new(Instant::now()),
            last_progress: Cell::new(Instant::now()),
            out_taken: Cell::new(0),
            unsent: RefCell::new(std::collections::VecDeque::new()),
        });
        tokio::task::spawn_local(link.clone().run());
        link
    }

    pub fn is_up(&self) -> bool {
        self.up.get()
    }

    /// Closes the link for good (its engine left the table): calls waiting
    /// on it are answered `engine_unavailable` at once.
    pub fn close(&self) {
        self.closed.set(true);
        self.up.set(false);
        self.stop.notify_one();
    }

    /// Sends a call and waits for its reply. `key_checked`: the caller's
    /// invoke key was checked against the function's keys.
    pub async fn call(
        &self,
        call_id: u64,
        timeout_ms: u32,
        name: &str,
        input: &[u8],
        key_checked: bool,
        trace: Option<&[u8]>,
    ) -> Reply {
        let flags = if key_checked { wire::frame::CALL_KEY_CHECKED } else { 0 };
        self.call_flagged(call_id, timeout_ms, name, input, flags, trace).await
    }

    /// [`EngineLink::call`] with the Call frame's flags (`wire::frame::CALL_*`).
    pub async fn call_flagged(
        &self,
        call_id: u64,
        timeout_ms: u32,
        name: &str,
        input: &[u8],
        flags: u32,
        trace: Option<&[u8]>,
    ) -> Reply {
        self.exchange(call_id, timeout_ms, || {
            wire::frame::traced_call_frame(call_id, timeout_ms, name, input, flags, trace)
        })
        .await
    }

    /// Sends an internal call from another engine (a `Forward` frame under
    /// this gateway's `call_id`) and waits for its reply.
    pub async fn forward(&self, call_id: u64, timeout_ms: u32, depth: u32, f: &wire::frame::Forward<'_>) -> Reply {
        self.exchange(call_id, timeout_ms, || wire::frame::forward_frame(call_id, timeout_ms, depth, f)).await
    }

    /// Answers a forward this engine sent (under the engine's id for it).
    pub fn answer(&self, call_id: u64, reply: Reply) {
        let (h, body) = match reply {
            Reply::Ok(out, t) => {
                let mut h = FrameHeader::new(FrameKind::Result, call_id, out.len());
                t.to_header(&mut h);
                (h, out.to_vec())
            }
            Reply::Err(kind, msg, t) => {
                let mut h = FrameHeader::new(FrameKind::Error, call_id, msg.len());
                h.error_kind = kind.code();
                t.to_header(&mut h);
                (h, msg.into_bytes())
            }
            Reply::Unsent => {
                let msg = b"the link to the callee's engine failed before the call was sent";
                let mut h = FrameHeader::new(FrameKind::Error, call_id, msg.len());
                h.error_kind = ErrorKind::EngineUnavailable.code();
                (h, msg.to_vec())
            }
        };
        let mut frame = h.encode().to_vec();
        frame.extend_from_slice(&body);
        self.send(&frame, None);
    }

    async fn exchange(&self, call_id: u64, timeout_ms: u32, frame: impl FnOnce() -> Vec<u8>) -> Reply {
        if !self.up.get() {
            return Reply::Err(
                ErrorKind::EngineUnavailable,
                format!("engine at {} is unreachable", self.addr),
                Timing::default(),
            );
        }
        let (tx, rx) = oneshot::channel();
        self.pending.borrow_mut().insert(call_id, tx);
        self.send(&frame(), Some(call_id));
        // The engine answers every call by its deadline; this only guards
        // against a wedged engine: the longest timeout a function may have
        // (or the caller's own), plus slack.
        let limit_ms = if timeout_ms > 0 { u64::from(timeout_ms) } else { 15 * 60 * 1000 };
        match tokio::time::timeout(Duration::from_millis(limit_ms + 5_000), rx).await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => Reply::Err(ErrorKind::EngineUnavailable, "engine connection lost".into(), Timing::default()),
            Err(_) => {
                self.pending.borrow_mut().remove(&call_id);
                Reply::Err(ErrorKind::EngineUnavailable, "engine did not answer in time".into(), Timing::default())
            }
        }
    }

    /// Writes a frame, or queues what does not fit for the flusher; a
    /// call's frame is noted until it is wholly written (`Reply::Unsent`).
    fn send(&self, frame: &[u8], call: Option<u64>) {
        let stream = self.stream.borrow().clone();
        let Some(stream) = stream else { return };
        let mut out = self.out.borrow_mut();
        let mut rest = frame;
        if out.is_empty() {
            // Fast path: write now; only what does not fit waits for the
            // flusher.
            match stream.try_write(frame) {
                Ok(n) => rest = &frame[n..],
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(_) => {}
            }
        }
        if !rest.is_empty() {
            out.extend_from_slice(rest);
            if let Some(id) = call {
                self.unsent.borrow_mut().push_back((id, self.out_taken.get() + out.len() as u64));
            }
            self.flush.notify_one();
        }
    }

    async fn run(self: Rc<Self>) {
        while !self.closed.get() {
            match self.connect().await {
                Ok(_) if self.closed.get() => break,
                Ok(s) => {
                    let s = Rc::new(s);
                    *self.stream.borrow_mut() = Some(s.clone());
                    self.up.set(true);
                    self.logged_down.set(false);
                    log::info!("gateway thread {}: connected to engine {}", self.thread, self.addr);
                    let flusher = tokio::task::spawn_local(self.clone().flusher(s.clone()));
                    self.last_heard.set(Instant::now());
                    self.last_progress.set(Instant::now());
                    // Biased: what the engine sent is read before the
                    // heartbeat looks at how long ago it last sent anything
                    // (after this thread stalled, its pongs may be waiting).
                    tokio::select! {
                        biased;
                        () = self.read_loop(&s) => {}
                        () = self.stop.notified() => {}
                        () = self.heartbeat() => {
                            log::warn!(
                                "gateway thread {}: engine {} sent nothing for {} ms (a cut link, or a stopped \
                                 engine); closing the link",
                                self.thread,
                                self.addr,
                                wire::frame::SILENCE_MAX_MS
                            );
                        }
                    }
                    flusher.abort();
                    self.up.set(false);
                    *self.stream.borrow_mut() = None;
                    self.out.borrow_mut().clear();
                    self.out_taken.set(0);
                    self.fail_pending();
                    if self.closed.get() {
                        break;
                    }
                    log::warn!("gateway thread {}: lost engine {}", self.thread, self.addr);
                }
                Err(e) => {
                    // Said once per outage, not every 200 ms.
                    if self.logged_down.replace(true) {
                        log::debug!("gateway thread {}: engine {}: {e}", self.thread, self.addr);
                    } else {
                        log::warn!("gateway thread {}: cannot connect to engine {}: {e}", self.thread, self.addr);
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await
                }
            }
        }
    }

    /// Connects and authenticates (api::link) on the blocking pool: the
    /// handshake is a few small round trips, once per connection.
    async fn connect(&self) -> std::io::Result<TcpStream> {
        let (addr, secret, thread) = (self.addr, self.secret.clone(), self.thread);
        let s = tokio::task::spawn_blocking(move || -> std::io::Result<std::net::TcpStream> {
            let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
            s.set_nodelay(true)?;
            s.set_read_timeout(Some(Duration::from_secs(5)))?;
            s.set_write_timeout(Some(Duration::from_secs(5)))?;
            api::link::client(&mut s, &secret, api::auth::Role::Data, thread).map_err(std::io::Error::other)?;
            s.set_read_timeout(None)?;
            s.set_write_timeout(None)?;
            s.set_nonblocking(true)?;
            Ok(s)
        })
        .await
        .map_err(std::io::Error::other)??;
        TcpStream::from_std(s)
    }

    /// Pings the engine every `PING_EVERY_MS`; returns once the link has
    /// shown no sign of life for `SILENCE_MAX_MS`. Signs of life: any byte
    /// from the engine, or, while frames wait to be written, the kernel
    /// taking more of them (the engine is acknowledging; our ping may be
    /// queued behind a large call and not have reached it yet).
    async fn heartbeat(&self) {
        let every = Duration::from_millis(wire::frame::PING_EVERY_MS);
        let silence = Duration::from_millis(wire::frame::SILENCE_MAX_MS);
        let mut seq = 0u64;
        let mut last_tick = Instant::now();
        loop {
            tokio::time::sleep(every).await;
            // A tick that came late says this thread stalled, not that the
            // engine did: what it sent meanwhile is read first.
            let late = last_tick.elapsed() > 2 * every;
            last_tick = Instant::now();
            let writing = !self.out.borrow().is_empty() && self.last_progress.get().elapsed() <= silence;
            if !late && !writing && self.last_heard.get().elapsed() > silence {
                return;
            }
            seq += 1;
            self.send(&FrameHeader::new(FrameKind::Ping, seq, 0).encode(), None);
        }
    }

    async fn flusher(self: Rc<Self>, s: Rc<TcpStream>) {
        loop {
            self.flush.notified().await;
            while !self.out.borrow().is_empty() {
                if s.writable().await.is_err() {
                    return;
                }
                let mut out = self.out.borrow_mut();
                match s.try_write(&out) {
                    Ok(n) => {
                        if n > 0 {
                            self.last_progress.set(Instant::now());
                        }
                        out.drain(..n);
                        let taken = self.out_taken.get() + n as u64;
                        self.out_taken.set(taken);
                        let mut unsent = self.unsent.borrow_mut();
                        while unsent.front().is_some_and(|&(_, end)| end <= taken) {
                            unsent.pop_front();
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(_) => return,
                }
            }
        }
    }

    async fn read_loop(self: &Rc<Self>, s: &TcpStream) {
        let mut buf: Vec<u8> = Vec::with_capacity(64 * 1024);
        let mut chunk = vec![0u8; 64 * 1024];
        loop {
            if s.readable().await.is_err() {
                return;
            }
            match s.try_read(&mut chunk) {
                Ok(0) => return,
                Ok(n) => {
                    self.last_heard.set(Instant::now());
                    buf.extend_from_slice(&chunk[..n]);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(_) => return,
            }
            let mut off = 0;
            loop {
                match wire::frame::next_frame(&buf[off..]) {
                    Ok(Some((h, end))) => {
                        self.on_frame(h, Bytes::copy_from_slice(&buf[off + FRAME_HEADER_LEN..off + end]));
                        off += end;
                    }
                    Ok(None) => break,
                    Err(e) => {
                        log::error!("engine sent a malformed frame ({e}); reconnecting");
                        return;
                    }
                }
            }
            buf.drain(..off);
        }
    }

    fn on_frame(self: &Rc<Self>, h: FrameHeader, body: Bytes) {
        let timing = Timing::from_header(&h);
        let reply = match h.kind {
            FrameKind::Forward => {
                if self.forwards_waiting.get() >= FORWARDS_MAX {
                    let msg = format!("this engine has {FORWARDS_MAX} internal calls waiting on this gateway thread");
                    return self.answer(h.call_id, Reply::Err(ErrorKind::Overloaded, msg, Timing::default()));
                }
                self.forwards_waiting.set(self.forwards_waiting.get() + 1);
                let _ = self.forwards.send(Forwarded { from: self.clone(), header: h, body });
                return;
            }
            FrameKind::Pong => return,
            FrameKind::Result => Reply::Ok(body, timing),
            FrameKind::Error => {
                let kind = ErrorKind::from_code(h.error_kind).unwrap_or(ErrorKind::Internal);
                Reply::Err(kind, String::from_utf8_lossy(&body).into_owned(), timing)
            }
            _ => return,
        };
        if let Some(tx) = self.pending.borrow_mut().remove(&h.call_id) {
            let _ = tx.send(reply);
        }
    }

    /// The connection is gone: a call whose frame never wholly left is
    /// `Unsent` (it may go to another engine), any other was perhaps
    /// started and is answered `engine_unavailable`.
    fn fail_pending(&self) {
        let unsent: std::collections::HashSet<u64> = self.unsent.borrow_mut().drain(..).map(|(id, _)| id).collect();
        for (id, tx) in self.pending.borrow_mut().drain() {
            let _ = tx.send(if unsent.contains(&id) {
                Reply::Unsent
            } else {
                Reply::Err(
                    ErrorKind::EngineUnavailable,
                    "engine connection lost during the call".into(),
                    Timing::default(),
                )
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A link to the test's engine at `addr`, once it is up.
    async fn link_up(addr: SocketAddr, secret: api::auth::Secret) -> Rc<EngineLink> {
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        let link = EngineLink::start(addr, secret, 0, tx);
        for _ in 0..200 {
            if link.is_up() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(link.is_up(), "the link never came up");
        link
    }

    /// An engine that accepts the link and then reads nothing and answers
    /// nothing, not even pings (a stopped process, a cut cable): within
    /// the silence limit the link closes; a call whose frame it took is
    /// answered `engine_unavailable` (it may have started), one whose frame
    /// never wholly left is `Unsent` (it can go elsewhere).
    #[test]
    fn a_silent_engine_is_dropped_and_only_unsent_calls_may_go_elsewhere() {
        let secret = api::auth::Secret::new("a-test-secret").expect("secret");
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let engine_secret = secret.clone();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let engine = std::thread::spawn(move || {
            let (mut c, _) = listener.accept().expect("accept");
            api::link::engine(&mut c, &engine_secret).expect("handshake");
            // Holds the connection open, silent, until the test is done.
            let _ = done_rx.recv_timeout(Duration::from_secs(30));
            drop(c);
        });
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        let local = tokio::task::LocalSet::new();
        local.block_on(&rt, async move {
            let link = link_up(addr, secret).await;
            let l = link.clone();
            let small = tokio::task::spawn_local(async move { l.call(1, 0, "f", b"x", false, None).await });
            tokio::time::sleep(Duration::from_millis(20)).await;
            // Far more than the kernel buffers of an unread connection hold.
            let l = link.clone();
            let large =
                tokio::task::spawn_local(async move { l.call(2, 0, "f", &vec![7u8; 48 << 20], false, None).await });
            let t0 = Instant::now();
            let (small, large) = (small.await.expect("small"), large.await.expect("large"));
            let took = t0.elapsed();
            assert!(matches!(small, Reply::Err(ErrorKind::EngineUnavailable, _, _)), "the small call");
            assert!(matches!(large, Reply::Unsent), "the large call");
            let limit = Duration::from_millis(wire::frame::SILENCE_MAX_MS + 2 * wire::frame::PING_EVERY_MS + 300);
            assert!(took < limit, "{took:?}");
            assert!(!link.is_up());
            link.close();
        });
        let _ = done_tx.send(());
        engine.join().expect("engine thread");
    }

    /// An engine that is alive but slow to take a large call (it reads at
    /// 8 MiB/s and sends nothing, so the ping sits behind the call's
    /// frame): the link stays up while the engine takes bytes, however
    /// long that lasts, and is dropped only once it stops taking them.
    #[test]
    fn an_engine_taking_a_large_call_slowly_is_not_taken_for_dead() {
        let secret = api::auth::Secret::new("a-test-secret").expect("secret");
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let engine_secret = secret.clone();
        let engine = std::thread::spawn(move || {
            use std::io::Read;
            let (mut c, _) = listener.accept().expect("accept");
            api::link::engine(&mut c, &engine_secret).expect("handshake");
            let mut chunk = vec![0u8; 256 << 10];
            let mut taken = 0usize;
            while taken < (32 << 20) {
                match c.read(&mut chunk) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => taken += n,
                }
                std::thread::sleep(Duration::from_millis(31));
            }
            // Then silent, holding the connection, until the gateway drops it.
            let _ = c.read(&mut chunk);
            taken
        });
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        let local = tokio::task::LocalSet::new();
        local.block_on(&rt, async move {
            let link = link_up(addr, secret).await;
            let l = link.clone();
            let t0 = Instant::now();
            let call =
                tokio::task::spawn_local(async move { l.call(1, 0, "f", &vec![7u8; 24 << 20], false, None).await });
            let silence = Duration::from_millis(wire::frame::SILENCE_MAX_MS);
            tokio::time::sleep(2 * silence).await;
            assert!(link.is_up(), "a link whose engine was taking bytes was closed after {:?}", t0.elapsed());
            let reply = call.await.expect("call");
            // Its frame left whole, so it may have started: not Unsent.
            assert!(matches!(reply, Reply::Err(ErrorKind::EngineUnavailable, _, _)), "the call");
            assert!(!link.is_up());
            link.close();
        });
        let taken = engine.join().expect("engine thread");
        assert!(taken >= 24 << 20, "the engine took {taken} bytes, less than the call's frame");
    }
}
