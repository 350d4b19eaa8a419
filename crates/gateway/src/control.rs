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

/// A request, its attachment (a registration's source archive), and where
/// the answer goes.
type Request = (Value, Vec<u8>, oneshot::Sender<Result<Value, String>>);

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
    pub fn start(addr: SocketAddr, secret: api::auth::Secret, store: Arc<Store>) -> ControlClient {
        let (tx, rx) = mpsc::channel::<Request>();
        let restored = Arc::new(AtomicBool::new(false));
        let r = restored.clone();
        std::thread::Builder::new()
            .name("gateway-control".into())
            .spawn(move || control_thread(addr, secret, store, rx, r))
            .expect("spawning the control thread");
        ControlClient { tx, restored }
    }

    /// Whether the engine has every stored function (as far as we know).
    pub fn restored(&self) -> bool {
        self.restored.load(Ordering::Acquire)
    }

    pub async fn request(&self, req: Value) -> Result<Value, String> {
        self.request_with(req, Vec::new()).await
    }

    pub async fn request_with(&self, req: Value, attachment: Vec<u8>) -> Result<Value, String> {
        let (tx, rx) = oneshot::channel();
        self.tx.send((req, attachment, tx)).map_err(|_| "control thread is gone".to_string())?;
        rx.await.map_err(|_| "control thread is gone".to_string())?
    }
}

fn control_thread(
    addr: SocketAddr,
    secret: api::auth::Secret,
    store: Arc<Store>,
    rx: mpsc::Receiver<Request>,
    restored: Arc<AtomicBool>,
) {
    let mut conn: Option<TcpStream> = None;
    let mut last_error = String::new();
    loop {
        if conn.is_none() {
            restored.store(false, Ordering::Release);
            conn = match connect(addr, &secret) {
                Ok(c) => Some(c),
                Err(e) => {
                    let e = e.to_string();
                    // Say it once, not at every retry.
                    if e != last_error {
                        log::error!("control connection to engine {addr}: {e}");
                        last_error = e;
                    }
                    None
                }
            };
            if let Some(c) = conn.as_mut() {
                last_error.clear();
                match restore(c, &store) {
                    Ok(()) => restored.store(true, Ordering::Release),
                    Err(e) => {
                        log::error!("restoring functions: {e}");
                        conn = None;
                    }
                }
            }
        }
        let (req, attachment, reply) = match rx.recv_timeout(HEARTBEAT) {
            Ok(r) => r,
            Err(mpsc::RecvTimeoutError::Disconnected) => return,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                // Heartbeat: notice an engine that restarted (and lost its
                // functions) even when nobody is deploying.
                if let Some(c) = conn.as_mut() {
                    if roundtrip(c, &json!({"op": "status"}), &[]).is_err_and(|e| e.starts_with("io:")) {
                        conn = None;
                    }
                } else {
                    std::thread::sleep(HEARTBEAT);
                }
                continue;
            }
        };
        let result = match conn.as_mut() {
            Some(c) => roundtrip(c, &req, &attachment),
            None if last_error.is_empty() => Err(format!("engine at {addr} is unreachable")),
            None => Err(format!("engine at {addr} is unreachable: {last_error}")),
        };
        if result.as_ref().is_err_and(|e| e.starts_with("io:")) {
            conn = None;
        }
        let _ = reply.send(result.map_err(|e| e.trim_start_matches("io:").to_string()));
    }
}

fn connect(addr: SocketAddr, secret: &api::auth::Secret) -> Result<TcpStream, api::link::LinkError> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.set_write_timeout(Some(Duration::from_secs(5)))?;
    api::link::client(&mut s, secret, api::auth::Role::Control, 0)?;
    // Registrations may compile for minutes: no read timeout from here on.
    s.set_read_timeout(None)?;
    s.set_write_timeout(None)?;
    Ok(s)
}

fn restore(c: &mut TcpStream, store: &Store) -> Result<(), String> {
    let status = roundtrip(c, &json!({"op": "status"}), &[])?;
    let have: Vec<String> = status["functions"]
        .as_array()
        .map(|a| a.iter().filter_map(|f| f["name"].as_str().map(String::from)).collect())
        .unwrap_or_default();
    for spec in store.list().map_err(|e| e.to_string())? {
        if have.contains(&spec.name) {
            continue;
        }
        let archive = match store.source(&spec.source) {
            Ok(a) => a,
            Err(e) => {
                log::error!("restoring function {}: {e} (deploy it again)", spec.name);
                continue;
            }
        };
        match roundtrip(c, &json!({"op": "register", "spec": spec}), &archive) {
            Ok(_) => log::info!("restored function {}", spec.name),
            Err(e) => log::error!("restoring function {}: {e}", spec.name),
        }
    }
    Ok(())
}

/// One request/reply; `attachment` follows the JSON (header field `a` then
/// gives the JSON's length). Errors starting with "io:" mean the connection
/// broke.
fn roundtrip(c: &mut TcpStream, req: &Value, attachment: &[u8]) -> Result<Value, String> {
    let body = serde_json::to_vec(req).map_err(|e| e.to_string())?;
    let mut h = FrameHeader::new(FrameKind::Control, 0, body.len() + attachment.len());
    if !attachment.is_empty() {
        h.a = body.len() as u32;
    }
    let mut frame = h.encode().to_vec();
    frame.extend_from_slice(&body);
    frame.extend_from_slice(attachment);
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
