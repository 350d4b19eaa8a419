//! The control connection between the gateway and an engine: typed
//! requests, replies and refusals, and how they travel in `Control` /
//! `ControlReply` frames (docs/protocol.md §2). Both ends use this module, so
//! a message one side can write is one the other side can read.
//!
//! A request is JSON tagged by `"op"`; a registration's source archive
//! follows its JSON in the same frame (header field `a` gives the JSON's
//! length). An answer is `{"ok": REPLY}` or `{"refused": {"kind", "message"}}`.

use crate::secrets::SecretValues;
use crate::spec::FunctionSpec;
use serde::{Deserialize, Serialize};
use std::io::{self, Read, Write};
use wire::frame::{FrameHeader, FrameKind, FRAME_HEADER_LEN};

/// The largest control frame body either side reads: a registration carries
/// a source archive of at most [`crate::archive::Limits::DEFAULT`]'s size,
/// plus its JSON (a spec, and up to 16 secrets of 64 KiB in base64: ~1.4
/// MiB).
pub const CONTROL_BODY_MAX: usize = crate::archive::Limits::DEFAULT.archive_bytes_max as usize + (2 << 20);
const _: () = assert!(
    crate::secrets::SECRETS_PER_FUNCTION_MAX * crate::secrets::SECRET_BYTES_MAX * 4 / 3 + (256 << 10) < (2 << 20),
    "a registration's secrets and spec must fit beside the largest archive"
);
const _: () = assert!(CONTROL_BODY_MAX <= wire::frame::FRAME_BODY_LEN_MAX, "a registration must fit in a frame");

/// What the gateway asks of an engine.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
// A few requests a deploy, never on a call's path: the size of the
// largest (a whole spec) costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
pub enum Request {
    /// Build and start a function (replacing one of the same name); the
    /// frame's attachment is its source archive, whose digest the spec names.
    /// `secrets`: the values of the secrets the spec names (never logged:
    /// their Debug shows sizes only).
    Register {
        spec: FunctionSpec,
        #[serde(default, skip_serializing_if = "SecretValues::is_empty")]
        secrets: SecretValues,
    },
    /// Stop a function for good.
    Unregister { name: String },
    /// Every function the engine runs, and how.
    Status,
    /// Only the names of the functions the engine runs: what a gateway's
    /// heartbeat asks every 200 ms (an engine that restarted lost them),
    /// answered without looking into any function. An engine older than
    /// it refuses it `bad_request`; ask `Status` then.
    Names,
    /// [`Request::Status`] with each function's process usage read from
    /// the kernel (`FunctionStatus::usage`): more work, asked for only by
    /// those that want it (`bench run`).
    StatusWithUsage,
    /// A function's log: its last `lines` lines, or what was written after
    /// `after` (a cursor an earlier answer gave).
    Logs {
        function: String,
        lines: u32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        after: Option<LogCursor>,
    },
    /// The most recent call records, newest first.
    Trace {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        function: Option<String>,
        limit: u32,
    },
}

impl Request {
    /// What it is, for logs and errors.
    pub fn op(&self) -> &'static str {
        match self {
            Request::Register { .. } => "register",
            Request::Unregister { .. } => "unregister",
            Request::Status => "status",
            Request::Names => "names",
            Request::StatusWithUsage => "status with usage",
            Request::Logs { .. } => "logs",
            Request::Trace { .. } => "trace",
        }
    }
}

/// What an engine answers a request it carried out.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Reply {
    /// `notes` says what its dependencies cost (installed, cached), or is empty.
    Registered {
        name: String,
        notes: String,
    },
    Unregistered {
        name: String,
    },
    Status {
        functions: Vec<FunctionStatus>,
        /// The engine's isolation pool; none when it runs functions as
        /// plain processes.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pool: Option<PoolStatus>,
    },
    /// The names of the functions the engine runs (`Request::Names`).
    Names {
        names: Vec<String>,
    },
    Traces {
        traces: Vec<TraceRecord>,
    },
    /// Log text (invalid UTF-8 replaced), and where the next read starts.
    Logs {
        text: String,
        next: LogCursor,
    },
}

/// Where a reader of an engine's log of a function got to (which file, by
/// inode, and the offset in it); opaque to everyone but that engine.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogCursor {
    pub file: u64,
    pub offset: u64,
}

/// Log bytes one answer carries at most.
pub const LOG_READ_MAX: usize = 1 << 20;
/// Lines from the end a reader may ask for.
pub const LOG_LINES_MAX: u32 = 100_000;

/// Why an engine did not carry out a request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{message}")]
#[serde(deny_unknown_fields)]
pub struct Refusal {
    pub kind: RefusalKind,
    pub message: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RefusalKind {
    /// Not a request this engine understands (malformed frame or JSON).
    BadRequest,
    /// The spec, or the source archive sent with it, is not acceptable.
    InvalidSpec,
    /// Installing its dependencies or compiling its code failed.
    BuildFailed,
    /// Its launcher did not start (the reason is in the message).
    StartFailed,
    /// No function of that name.
    NotFound,
    /// The engine is stopping.
    ShuttingDown,
    /// Something on the engine's side failed (a disk, a directory).
    Internal,
    /// A newer deploy or a removal of the same function was asked for
    /// while this deploy was under way; that one wins.
    Superseded,
    /// The engine is doing as many of these as it may at once; retry later.
    Busy,
}

impl Refusal {
    pub fn new(kind: RefusalKind, message: impl Into<String>) -> Refusal {
        Refusal { kind, message: message.into() }
    }
}

/// What the engine reports of one function (`GET /system/functions`
/// shows it as the function's `status`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FunctionStatus {
    pub name: String,
    /// The fingerprint of the spec it runs (`FunctionSpec::fingerprint`).
    #[serde(default)]
    pub spec: String,
    /// Milliseconds since this version was registered.
    #[serde(default)]
    pub age_ms: u64,
    pub runtime: String,
    pub container: Option<ContainerStatus>,
    pub launcher: LauncherState,
    pub last_error: String,
    pub completed: u64,
    pub failed: u64,
    pub scheduler: SchedulerStatus,
    /// What its processes have used, read from the kernel now: the
    /// processes alive (a worker that exited took its share with it).
    #[serde(default)]
    pub usage: Option<ProcessUsage>,
}

/// CPU and scheduling of a function's processes (all their threads),
/// cumulative since each started.
pub use sys::process::Usage as ProcessUsage;

/// An engine's isolation pool (Nuka §III.A): containers ready, the size it
/// keeps, and what it has done since the engine started.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PoolStatus {
    /// Ready containers waiting for a function.
    pub idle: u64,
    /// How many it keeps ready.
    pub target: u64,
    /// Containers made (refills and misses).
    pub created: u64,
    /// Containers given back, cleaned and made ready again.
    pub reused: u64,
    pub destroyed: u64,
    /// Functions that found the pool empty and waited for a container.
    pub misses: u64,
    /// How long the latest container took to make, in milliseconds.
    pub create_ms_last: f64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ContainerStatus {
    pub id: String,
    pub uid: u32,
    pub paused: bool,
    /// The container's address when it has a network of its own.
    pub network: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LauncherState {
    Down,
    Starting,
    Ready,
}

/// A function's scheduler, as last seen (Nightcore §3.3's τ and its inputs).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SchedulerStatus {
    pub tau: u32,
    pub running: u32,
    pub running_max: u32,
    pub queued: usize,
    pub idle: usize,
    pub starting: usize,
    pub pool: usize,
    pub rate_per_s: f64,
    pub processing_ms: f64,
    /// Recent worker start-up times (asked for → ready), µs, oldest first.
    pub worker_ready_us: Vec<u64>,
}

/// One call as the engine recorded it; times are the engine's monotonic
/// clock in ns, ids are 16 hex digits.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceRecord {
    pub call_id: String,
    pub parent_call_id: String,
    pub function: String,
    pub worker_id: u32,
    pub receive_ns: u64,
    pub dispatch_ns: u64,
    pub complete_ns: u64,
    pub outcome: String,
    /// `out`: the callee was on another server and this engine sent the
    /// call through a gateway; `in`: this engine ran a call sent from
    /// another server; empty: a call that crossed no server.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub hop: String,
    /// It waited for a worker that started after it arrived.
    #[serde(default)]
    pub cold: bool,
    /// Its CPU time in µs, when its runtime measured it (`--cpu-per-call`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_us: Option<u32>,
}

/// The answer to a request, as it travels: written from references,
/// read into owned values.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
enum Answer<R, F> {
    Ok(R),
    Refused(F),
}

/// A control exchange that could not happen: the connection, not the
/// engine, failed (after one, the connection is not used again).
#[derive(Debug, thiserror::Error)]
pub enum LinkBroken {
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("malformed control frame: {0}")]
    Malformed(String),
}

/// Writes a request and its attachment as one `Control` frame.
pub fn write_request<W: Write>(w: &mut W, req: &Request, attachment: &[u8]) -> io::Result<()> {
    let json = serde_json::to_vec(req).map_err(io::Error::other)?;
    let mut h = FrameHeader::new(FrameKind::Control, 0, json.len() + attachment.len());
    if !attachment.is_empty() {
        h.set_control_json_len(json.len() as u32);
    }
    let mut frame = Vec::with_capacity(FRAME_HEADER_LEN + json.len() + attachment.len());
    frame.extend_from_slice(&h.encode());
    frame.extend_from_slice(&json);
    frame.extend_from_slice(attachment);
    w.write_all(&frame)
}

/// Reads the next request. `Ok(None)` is a clean end of the connection; a
/// frame that arrived whole but says nothing sensible is `Ok(Some(Err))`, to
/// be answered (the connection stays usable).
#[allow(clippy::type_complexity)]
pub fn read_request<R: Read>(r: &mut R) -> Result<Option<Result<(Request, Vec<u8>), Refusal>>, LinkBroken> {
    let mut hb = [0u8; FRAME_HEADER_LEN];
    match r.read_exact(&mut hb) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let h = FrameHeader::decode(&hb).map_err(|e| LinkBroken::Malformed(e.to_string()))?;
    let body = read_body(r, &h)?;
    Ok(Some(parse_request(&h, body)))
}

/// A request from a whole frame (the part of [`read_request`] that judges
/// what arrived; pure, for tests and fuzzing).
pub fn parse_request(h: &FrameHeader, mut body: Vec<u8>) -> Result<(Request, Vec<u8>), Refusal> {
    let bad = |m: String| Refusal::new(RefusalKind::BadRequest, m);
    if h.kind != FrameKind::Control {
        return Err(bad(format!("expected a control frame, not {:?}", h.kind)));
    }
    let json_len = if h.control_json_len() == 0 { body.len() } else { h.control_json_len() as usize };
    if json_len > body.len() {
        return Err(bad(format!("control frame: JSON length {json_len} beyond the body ({} bytes)", body.len())));
    }
    let attachment = body.split_off(json_len);
    let req: Request = serde_json::from_slice(&body).map_err(|e| bad(format!("invalid control request: {e}")))?;
    if !attachment.is_empty() && !matches!(req, Request::Register { .. }) {
        return Err(bad(format!("a {} request carries no attachment", req.op())));
    }
    Ok((req, attachment))
}

/// Writes the answer to a request as one `ControlReply` frame.
pub fn write_answer<W: Write>(w: &mut W, answer: &Result<Reply, Refusal>) -> io::Result<()> {
    let a: Answer<&Reply, &Refusal> = match answer {
        Ok(r) => Answer::Ok(r),
        Err(r) => Answer::Refused(r),
    };
    let json = serde_json::to_vec(&a).map_err(io::Error::other)?;
    let mut frame = FrameHeader::new(FrameKind::ControlReply, 0, json.len()).encode().to_vec();
    frame.extend_from_slice(&json);
    w.write_all(&frame)
}

/// Reads the answer to the request just written.
pub fn read_answer<R: Read>(r: &mut R) -> Result<Result<Reply, Refusal>, LinkBroken> {
    let mut hb = [0u8; FRAME_HEADER_LEN];
    r.read_exact(&mut hb)?;
    let h = FrameHeader::decode(&hb).map_err(|e| LinkBroken::Malformed(e.to_string()))?;
    if h.kind != FrameKind::ControlReply {
        return Err(LinkBroken::Malformed(format!("expected a control reply, not {:?}", h.kind)));
    }
    let body = read_body(r, &h)?;
    let answer: Answer<Reply, Refusal> =
        serde_json::from_slice(&body).map_err(|e| LinkBroken::Malformed(format!("control reply: {e}")))?;
    match answer {
        Answer::Ok(reply) => Ok(Ok(reply)),
        Answer::Refused(refusal) => Ok(Err(refusal)),
    }
}

fn read_body<R: Read>(r: &mut R, h: &FrameHeader) -> Result<Vec<u8>, LinkBroken> {
    let len = h.body_len as usize;
    if len > CONTROL_BODY_MAX {
        return Err(LinkBroken::Malformed(format!("a {len}-byte body is over the {CONTROL_BODY_MAX}-byte limit")));
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body)?;
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roundtrip_request(req: &Request, attachment: &[u8]) -> Result<(Request, Vec<u8>), Refusal> {
        let mut buf = Vec::new();
        write_request(&mut buf, req, attachment).unwrap();
        read_request(&mut buf.as_slice()).unwrap().unwrap()
    }

    #[test]
    fn requests_survive_the_trip() {
        let trace = Request::Trace { function: Some("f".into()), limit: 7 };
        assert_eq!(roundtrip_request(&trace, b"").unwrap(), (trace, vec![]));
        assert_eq!(roundtrip_request(&Request::Status, b"").unwrap(), (Request::Status, vec![]));
        assert_eq!(roundtrip_request(&Request::Names, b"").unwrap(), (Request::Names, vec![]));
        let spec: FunctionSpec = serde_json::from_value(serde_json::json!({
            "name": "f", "runtime": "python", "source": format!("sha256:{}", "0".repeat(64))
        }))
        .unwrap();
        let reg = Request::Register { spec, secrets: SecretValues::default() };
        assert_eq!(roundtrip_request(&reg, b"archive bytes").unwrap(), (reg, b"archive bytes".to_vec()));
    }

    #[test]
    fn the_wire_form_is_the_documented_one() {
        let v = serde_json::to_value(Request::Unregister { name: "f".into() }).unwrap();
        assert_eq!(v, serde_json::json!({"op": "unregister", "name": "f"}));
        let v = serde_json::to_value(Request::Trace { function: None, limit: 3 }).unwrap();
        assert_eq!(v, serde_json::json!({"op": "trace", "limit": 3}));
        let a: Answer<Reply, _> = Answer::Refused(Refusal::new(RefusalKind::NotFound, "no function named \"f\""));
        let v = serde_json::to_value(a).unwrap();
        assert_eq!(v, serde_json::json!({"refused": {"kind": "not_found", "message": "no function named \"f\""}}));
        let v = serde_json::to_value(Answer::<_, Refusal>::Ok(Reply::Unregistered { name: "f".into() })).unwrap();
        assert_eq!(v, serde_json::json!({"ok": {"unregistered": {"name": "f"}}}));
        assert_eq!(serde_json::to_value(Request::Names).unwrap(), serde_json::json!({"op": "names"}));
        let v = serde_json::to_value(Answer::<_, Refusal>::Ok(Reply::Names { names: vec!["f".into()] })).unwrap();
        assert_eq!(v, serde_json::json!({"ok": {"names": {"names": ["f"]}}}));
    }

    #[test]
    fn answers_survive_the_trip() {
        for answer in [
            Ok(Reply::Registered { name: "f".into(), notes: "installed 1".into() }),
            Ok(Reply::Status { functions: vec![], pool: None }),
            Ok(Reply::Names { names: vec!["a".into(), "b".into()] }),
            Ok(Reply::Status {
                functions: vec![],
                pool: Some(PoolStatus { idle: 2, target: 4, ..Default::default() }),
            }),
            Err(Refusal::new(RefusalKind::BuildFailed, "gcc: error")),
        ] {
            let mut buf = Vec::new();
            write_answer(&mut buf, &answer).unwrap();
            assert_eq!(read_answer(&mut buf.as_slice()).unwrap(), answer);
        }
    }

    fn frame(kind: FrameKind, a: u32, body: &[u8]) -> (FrameHeader, Vec<u8>) {
        let mut h = FrameHeader::new(kind, 0, body.len());
        if kind == FrameKind::Control {
            h.set_control_json_len(a);
        }
        (h, body.to_vec())
    }

    #[test]
    fn nonsense_is_refused_as_a_bad_request() {
        let cases: &[(FrameKind, u32, &[u8], &str)] = &[
            (FrameKind::Call, 0, br#"{"op":"status"}"#, "expected a control frame"),
            (FrameKind::Control, 99, br#"{"op":"status"}"#, "beyond the body"),
            (FrameKind::Control, 0, b"not json", "invalid control request"),
            (FrameKind::Control, 0, br#"{"op":"format_disk"}"#, "unknown variant"),
            (FrameKind::Control, 0, br#"{"op":"unregister"}"#, "missing field `name`"),
            (FrameKind::Control, 0, br#"{"op":"unregister","name":"f","force":true}"#, "unknown field"),
            (FrameKind::Control, 0, br#"{"op":"trace","limit":-1}"#, "invalid value"),
            (FrameKind::Control, 15, br#"{"op":"status"}extra"#, "carries no attachment"),
        ];
        for (kind, a, body, want) in cases {
            let (h, body) = frame(*kind, *a, body);
            let e = parse_request(&h, body).unwrap_err();
            assert_eq!(e.kind, RefusalKind::BadRequest, "{e}");
            assert!(e.message.contains(want), "{want:?} not in {:?}", e.message);
        }
    }

    #[test]
    fn an_oversized_body_is_not_read() {
        let mut h = FrameHeader::new(FrameKind::Control, 0, 0).encode();
        h[0..4].copy_from_slice(&(CONTROL_BODY_MAX as u32 + 1).to_le_bytes());
        // Only the header is there: reading the body would fail with EOF,
        // so a Malformed error proves the length was refused first.
        match read_request(&mut h.as_slice()) {
            Err(LinkBroken::Malformed(m)) => assert!(m.contains(&(CONTROL_BODY_MAX + 1).to_string()), "{m}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_clean_end_is_not_an_error() {
        assert!(read_request(&mut &b""[..]).unwrap().is_none());
    }
}
