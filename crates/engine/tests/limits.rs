//! The engine's limits and its one-record-per-call rule, attacked over a
//! real engine's TCP port by a peer that holds its secret (what a gateway
//! is), with real Python workers (process isolation: no root needed).

use api::auth::{Role, Secret};
use api::control::{Reply, Request};
use api::spec::{FunctionSpec, Runtime};
use std::collections::HashMap;
use std::io::Write;
use std::net::TcpStream;
use std::path::PathBuf;
use std::time::Duration;
use wire::frame::{call_frame, FrameKind};
use wire::ErrorKind;

const SLOW: &str = "import time\n\ndef handle(ctx, data):\n    time.sleep(0.4)\n    return data\n";

struct Fixture {
    dir: PathBuf,
    secret: Secret,
    engine: staccato_engine::Engine,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        self.engine.shutdown();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("repository root")
}

fn start(name: &str) -> Fixture {
    let dir = std::env::temp_dir().join(format!("staccato-limits-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let ipc = PathBuf::from(format!("/dev/shm/staccato-limits-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&ipc);
    let mut cfg = staccato_engine::EngineConfig::new(
        "127.0.0.1:0".parse().expect("address"),
        ipc,
        dir.join("state"),
        repo().join("runtimes"),
    );
    cfg.io_threads = 2;
    cfg.secret = Secret::new("limits-test").expect("a token");
    let secret = cfg.secret.clone();
    let engine = staccato_engine::start(cfg).expect("engine starts");
    Fixture { dir, secret, engine }
}

fn connect(f: &Fixture, role: Role) -> TcpStream {
    let mut s = TcpStream::connect(f.engine.addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(30))).expect("timeout");
    api::link::client(&mut s, &f.secret, role, 0).expect("handshake");
    s
}

/// Registers a slow Python echo with one worker and room for `max_queue`.
fn register(f: &Fixture, name: &str, max_queue: u32) {
    let src = f.dir.join("src");
    std::fs::create_dir_all(&src).expect("source dir");
    std::fs::write(src.join("slow.py"), SLOW).expect("handler");
    let archive = api::archive::pack(&src, &api::archive::Limits::DEFAULT).expect("pack");
    let spec = FunctionSpec {
        name: name.into(),
        runtime: Runtime::Python,
        handler: "slow:handle".into(),
        source: api::archive::digest(&archive),
        min_workers: 1,
        max_workers: 1,
        timeout_ms: 20_000,
        max_queue,
        env: Default::default(),
        memory_bytes: api::spec::default_memory_bytes(),
        pids: api::spec::default_pids(),
        worker_mode: Default::default(),
        cpu_shares: None,
        placement: Default::default(),
        auth: Default::default(),
        secrets: Vec::new(),
        async_calls: Default::default(),
        grpc: Vec::new(),
    };
    let mut c = connect(f, Role::Control);
    api::control::write_request(&mut c, &Request::Register { spec, secrets: Default::default() }, &archive)
        .expect("send register");
    match api::control::read_answer(&mut c).expect("answer") {
        Ok(Reply::Registered { .. }) => {}
        other => panic!("registration failed: {other:?}"),
    }
}

/// Reads `n` answers: call id -> every (error kind or 0, body) it got.
fn answers(s: &mut TcpStream, n: usize) -> HashMap<u64, Vec<(u16, String)>> {
    let mut out: HashMap<u64, Vec<(u16, String)>> = HashMap::new();
    for _ in 0..n {
        let (h, body) = api::link::read_frame(s, 1 << 20).expect("an answer frame");
        assert!(matches!(h.kind, FrameKind::Result | FrameKind::Error), "{h:?}");
        let kind = if h.kind == FrameKind::Error { h.error_kind } else { 0 };
        out.entry(h.call_id).or_default().push((kind, String::from_utf8_lossy(&body).into_owned()));
    }
    out
}

/// No frame arrives within `ms`: nothing was answered twice.
fn silent_for(s: &mut TcpStream, ms: u64) -> bool {
    s.set_read_timeout(Some(Duration::from_millis(ms))).expect("timeout");
    let mut b = [0u8; 1];
    let silent = matches!(std::io::Read::read(s, &mut b), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock);
    s.set_read_timeout(Some(Duration::from_secs(30))).expect("timeout");
    silent
}

const ID: u64 = wire::GATEWAY_CALL_ID_BIT | 0x100;

#[test]
fn a_full_queue_answers_overloaded_at_once_and_serves_the_rest() {
    let f = start("queue");
    register(&f, "slow", 2);
    let mut s = connect(&f, Role::Data);
    // One runs, two wait, two find the queue full.
    for i in 0..5u64 {
        s.write_all(&call_frame(ID + i, 0, "slow", format!("in-{i}").as_bytes())).expect("send");
    }
    let t0 = std::time::Instant::now();
    let first_two = answers(&mut s, 2);
    // Refused before any call finished: the handler sleeps 0.4 s.
    assert!(t0.elapsed() < Duration::from_millis(350), "{:?}", t0.elapsed());
    for i in [3, 4] {
        let got = &first_two[&(ID + i)];
        assert_eq!(got.len(), 1);
        assert_eq!(ErrorKind::from_code(got[0].0), Some(ErrorKind::Overloaded), "{got:?}");
        assert!(got[0].1.contains("max_queue"), "{got:?}");
    }
    let rest = answers(&mut s, 3);
    for i in 0..3 {
        assert_eq!(rest[&(ID + i)], vec![(0, format!("in-{i}"))]);
    }
    assert!(silent_for(&mut s, 300));
    // The queue has room again.
    s.write_all(&call_frame(ID + 9, 0, "slow", b"again")).expect("send");
    assert_eq!(answers(&mut s, 1)[&(ID + 9)], vec![(0, "again".to_string())]);
}

#[test]
fn a_call_id_already_in_flight_is_refused_and_the_first_call_answered_once() {
    let f = start("dup");
    register(&f, "slow", 16);
    let mut s = connect(&f, Role::Data);
    s.write_all(&call_frame(ID, 0, "slow", b"first")).expect("send");
    s.write_all(&call_frame(ID, 0, "slow", b"second")).expect("send");
    let got = answers(&mut s, 2);
    let got = &got[&ID];
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(ErrorKind::from_code(got[0].0), Some(ErrorKind::BadRequest), "{got:?}");
    assert!(got[0].1.contains("already in flight"), "{got:?}");
    assert_eq!(got[1], (0, "first".to_string()));
    assert!(silent_for(&mut s, 300));
}
