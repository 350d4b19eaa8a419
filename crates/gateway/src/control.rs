//! The gateway's control connection to the engine, on a thread of its own:
//! registrations may take seconds (compiling, starting launchers) and must
//! not stall a gateway thread's event loop.

use crate::store::Store;
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;
use wire::frame::{FrameHeader, FrameKind, FRAME_HEADER_LEN};

/// How often an idle control connection checks that the engine is still
/// the same one.
const HEARTBEAT: Duration = Duration::from_millis(200);

type Request = (Value, oneshot::Sender<Result<Value, String>>);

#[derive(Clone)]
pub struct ControlClient {
    tx: mpsc::Sender<Request>,
    /// Connected, and every stored function re-registered since.
    restored: Arc<AtomicBool>,
}

impl ControlClient {
    /// Starts the control thread. On every (re)connection it re-registers
    /// the stored functions the engine does not have: an engine that
    /// restarted comes back with everything deployed.
    pub fn start(addr: SocketAddr, store: Arc<Store>) -> ControlClient {
        let (tx, rx) = mpsc::channel::<Request>();
        let restored = Arc::new(AtomicBool::new(false));
        let r = restored.clone();
        std::thread::Builder::new()
            .name("gateway-control".into())
            .spawn(move || control_thread(addr, store, rx, r))
            .expect("spawning the control thread");
        ControlClient { tx, restored }
    }

    /// Whether the engine has every stored function (as far as we know).
    pub fn restored(&self) -> bool {
        self.restored.load(Ordering::Acquire)
    }

    pub async fn request(&self, req: Value) -> Result<Value, String> {
        let (tx, rx) = oneshot::channel();
        self.tx.send((req, tx)).map_err(|_| "control thread is gone".to_string())?;
        rx.await.map_err(|_| "control thread is gone".to_string())?
    }
}

fn control_thread(addr: SocketAddr, store: Arc<Store>, rx: mpsc::Receiver<Request>, restored: Arc<AtomicBool>) {
    let mut conn: Option<TcpStream> = None;
    loop {
        if conn.is_none() {
            restored.store(false, Ordering::Release);
            conn = connect(addr).ok();
            if let Some(c) = conn.as_mut() {
                match restore(c, &store) {
                    Ok(()) => restored.store(true, Ordering::Release),
                    Err(e) => {
                        log::error!("restoring functions: {e}");
                        conn = None;
                    }
                }
            }
        }
        let (req, reply) = match rx.recv_timeout(HEARTBEAT) {
            Ok(r) => r,
            Err(mpsc::RecvTimeoutError::Disconnected) => return,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                // Heartbeat: notice an engine that restarted (and lost its
                // functions) even when nobody is deploying.
                if let Some(c) = conn.as_mut() {
                    if roundtrip(c, &json!({"op": "status"})).is_err_and(|e| e.starts_with("io:")) {
                        conn = None;
                    }
                } else {
                    std::thread::sleep(HEARTBEAT);
                }
                continue;
            }
        };
        let result = match conn.as_mut() {
            Some(c) => roundtrip(c, &req),
            None => Err(format!("engine at {addr} is unreachable")),
        };
        if result.as_ref().is_err_and(|e| e.starts_with("io:")) {
            conn = None;
        }
        let _ = reply.send(result.map_err(|e| e.trim_start_matches("io:").to_string()));
    }
}

fn connect(addr: SocketAddr) -> std::io::Result<TcpStream> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_nodelay(true)?;
    let mut hello = FrameHeader::new(FrameKind::Hello, 0, 1).encode().to_vec();
    hello.push(1); // role: control
    s.write_all(&hello)?;
    Ok(s)
}

fn restore(c: &mut TcpStream, store: &Store) -> Result<(), String> {
    let status = roundtrip(c, &json!({"op": "status"}))?;
    let have: Vec<String> = status["functions"]
        .as_array()
        .map(|a| a.iter().filter_map(|f| f["name"].as_str().map(String::from)).collect())
        .unwrap_or_default();
    for spec in store.list().map_err(|e| e.to_string())? {
        if have.contains(&spec.name) {
            continue;
        }
        match roundtrip(c, &json!({"op": "register", "spec": spec})) {
            Ok(_) => log::info!("restored function {}", spec.name),
            Err(e) => log::error!("restoring function {}: {e}", spec.name),
        }
    }
    Ok(())
}

/// One request/reply. Errors starting with "io:" mean the connection broke.
fn roundtrip(c: &mut TcpStream, req: &Value) -> Result<Value, String> {
    let body = serde_json::to_vec(req).map_err(|e| e.to_string())?;
    let mut frame = FrameHeader::new(FrameKind::Control, 0, body.len()).encode().to_vec();
    frame.extend_from_slice(&body);
    c.write_all(&frame).map_err(|e| format!("io:{e}"))?;
    let mut hb = [0u8; FRAME_HEADER_LEN];
    c.read_exact(&mut hb).map_err(|e| format!("io:{e}"))?;
    let h = FrameHeader::decode(&hb).map_err(|e| format!("io:{e}"))?;
    let mut body = vec![0u8; h.body_len as usize];
    c.read_exact(&mut body).map_err(|e| format!("io:{e}"))?;
    let v: Value = serde_json::from_slice(&body).map_err(|e| format!("io:{e}"))?;
    if v["ok"].as_bool() == Some(true) {
        Ok(v)
    } else {
        Err(v["error"].as_str().unwrap_or("engine refused the request").to_string())
    }
}
