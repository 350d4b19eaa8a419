//! Gateway ↔ engine frames over TCP (docs/protocol.md §2).

pub const FRAME_HEADER_LEN: usize = 32;

/// Upper bound on a frame body: the largest payload or source archive
/// (64 MiB) plus room for what travels with it (a name, a registration's
/// JSON). A peer announcing more is broken or hostile; the connection is
/// dropped.
pub const FRAME_BODY_LEN_MAX: usize = 66 << 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u16)]
pub enum FrameKind {
    Hello = 1,
    Call = 2,
    Result = 3,
    Error = 4,
    Control = 5,
    ControlReply = 6,
    /// Handshake (docs/protocol.md §2): the engine's nonce and proof.
    Challenge = 7,
    /// Handshake: the client's proof.
    Auth = 8,
    /// Handshake: the engine accepted the client; ordinary frames follow.
    Welcome = 9,
    /// An internal call whose callee is on another server (Nightcore §3.2):
    /// engine → gateway, to be sent on; gateway → engine, to be run. Its
    /// body starts with [`FORWARD_PREFIX_LEN`] bytes of ids ([`forward_parts`]).
    Forward = 10,
    /// Gateway → engine on a data connection, every [`PING_EVERY_MS`]: the
    /// engine answers `Pong` with the same call id at once. A link that
    /// carries nothing back for [`SILENCE_MAX_MS`] is dead (a cut cable
    /// sends no reset).
    Ping = 11,
    Pong = 12,
}

/// How often a gateway pings each data connection.
pub const PING_EVERY_MS: u64 = 200;
/// A data connection that brings a gateway no frame for this long is
/// closed, and its calls in flight answered `engine_unavailable`: with
/// pings every 200 ms, a dead link is found within 1 s.
pub const SILENCE_MAX_MS: u64 = 800;
/// An engine closes a data connection that brought nothing for this long
/// (its gateway pings every 200 ms; a test client may not).
pub const ENGINE_SILENCE_MAX_MS: u64 = 3000;

impl FrameKind {
    pub fn from_code(code: u16) -> Option<FrameKind> {
        Some(match code {
            1 => FrameKind::Hello,
            2 => FrameKind::Call,
            3 => FrameKind::Result,
            4 => FrameKind::Error,
            5 => FrameKind::Control,
            6 => FrameKind::ControlReply,
            7 => FrameKind::Challenge,
            8 => FrameKind::Auth,
            9 => FrameKind::Welcome,
            10 => FrameKind::Forward,
            11 => FrameKind::Ping,
            12 => FrameKind::Pong,
            _ => return None,
        })
    }
}

/// Decoded frame header. The three words `a`, `b`, `c` mean different
/// things per kind (docs/protocol.md §2); outside this module they are read
/// and written only through the accessors named for what they hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    pub body_len: u32,
    pub kind: FrameKind,
    pub error_kind: u16,
    pub call_id: u64,
    a: u32,
    b: u32,
    c: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameError {
    Kind(u16),
    BodyTooLong(u32),
    Reserved,
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FrameError::Kind(k) => write!(f, "unknown frame kind {k}"),
            FrameError::BodyTooLong(n) => write!(f, "frame body of {n} bytes exceeds {FRAME_BODY_LEN_MAX}"),
            FrameError::Reserved => write!(f, "reserved frame bytes are not zero"),
        }
    }
}

impl std::error::Error for FrameError {}

impl FrameHeader {
    pub fn new(kind: FrameKind, call_id: u64, body_len: usize) -> FrameHeader {
        FrameHeader { body_len: body_len as u32, kind, error_kind: 0, call_id, a: 0, b: 0, c: 0 }
    }

    /// `Call`, `Forward`: the caller's timeout in ms (0: the function's
    /// own); for `Forward`, what was left of the caller's deadline when
    /// the frame was sent.
    pub fn call_timeout_ms(&self) -> u32 {
        debug_assert!(matches!(self.kind, FrameKind::Call | FrameKind::Forward));
        self.a
    }

    /// `Call`, `Forward`: how many bytes of the name the body holds.
    pub fn call_name_len(&self) -> u32 {
        debug_assert!(matches!(self.kind, FrameKind::Call | FrameKind::Forward));
        self.b
    }

    /// `Call`: whether the gateway checked the caller's invoke key against
    /// the function's keys (`c` bit 0). An engine refuses a call of a
    /// function that needs a key without it.
    pub fn call_key_checked(&self) -> bool {
        debug_assert_eq!(self.kind, FrameKind::Call);
        self.c & CALL_KEY_CHECKED != 0
    }

    /// `Call`: the body starts with a trace block (`c` bit 2).
    pub fn call_traced(&self) -> bool {
        debug_assert_eq!(self.kind, FrameKind::Call);
        self.c & CALL_TRACE_CONTEXT != 0
    }

    /// `Call`: an asynchronous call the gateway runs from its queue (`c`
    /// bit 1): the engine runs it after ordinary calls, within τ.
    pub fn call_background(&self) -> bool {
        debug_assert_eq!(self.kind, FrameKind::Call);
        self.c & CALL_BACKGROUND != 0
    }

    /// `Forward`: how many calls are above this one in its chain, on every
    /// server it crossed (the callee's engine counts on from there).
    pub fn forward_depth(&self) -> u32 {
        debug_assert_eq!(self.kind, FrameKind::Forward);
        self.c & !FORWARD_TRACE_CONTEXT
    }

    /// `Forward`: a trace block follows the ids (`c` bit 31).
    pub fn forward_traced(&self) -> bool {
        debug_assert_eq!(self.kind, FrameKind::Forward);
        self.c & FORWARD_TRACE_CONTEXT != 0
    }

    /// `Control`: how many body bytes are JSON; 0 means all of them, and
    /// the rest is an attachment.
    pub fn control_json_len(&self) -> u32 {
        debug_assert_eq!(self.kind, FrameKind::Control);
        self.a
    }

    pub fn set_control_json_len(&mut self, len: u32) {
        debug_assert_eq!(self.kind, FrameKind::Control);
        self.a = len;
    }

    /// `Hello`: the I/O thread the gateway thread would like to be served by.
    pub fn hello_thread(&self) -> u32 {
        debug_assert_eq!(self.kind, FrameKind::Hello);
        self.c
    }

    pub fn set_hello_thread(&mut self, thread: u32) {
        debug_assert_eq!(self.kind, FrameKind::Hello);
        self.c = thread;
    }

    pub fn encode(&self) -> [u8; FRAME_HEADER_LEN] {
        let mut b = [0u8; FRAME_HEADER_LEN];
        b[0..4].copy_from_slice(&self.body_len.to_le_bytes());
        b[4..6].copy_from_slice(&(self.kind as u16).to_le_bytes());
        b[6..8].copy_from_slice(&self.error_kind.to_le_bytes());
        b[8..16].copy_from_slice(&self.call_id.to_le_bytes());
        b[16..20].copy_from_slice(&self.a.to_le_bytes());
        b[20..24].copy_from_slice(&self.b.to_le_bytes());
        b[24..28].copy_from_slice(&self.c.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8; FRAME_HEADER_LEN]) -> Result<FrameHeader, FrameError> {
        let u32_at = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"));
        let code = u16::from_le_bytes([b[4], b[5]]);
        let kind = FrameKind::from_code(code).ok_or(FrameError::Kind(code))?;
        let body_len = u32_at(0);
        if body_len as usize > FRAME_BODY_LEN_MAX {
            return Err(FrameError::BodyTooLong(body_len));
        }
        if u32_at(28) != 0 {
            return Err(FrameError::Reserved);
        }
        Ok(FrameHeader {
            body_len,
            kind,
            error_kind: u16::from_le_bytes([b[6], b[7]]),
            call_id: u64::from_le_bytes(b[8..16].try_into().expect("8 bytes")),
            a: u32_at(16),
            b: u32_at(20),
            c: u32_at(24),
        })
    }
}

/// The first whole frame at the start of `buf`, a stream of frames: its
/// header and where it ends, `None` if more bytes are needed, or why the
/// stream is broken (then the connection must close: nothing after a bad
/// header can be trusted to start a frame).
pub fn next_frame(buf: &[u8]) -> Result<Option<(FrameHeader, usize)>, FrameError> {
    let Some(hb) = buf.get(..FRAME_HEADER_LEN) else { return Ok(None) };
    let h = FrameHeader::decode(hb.try_into().expect("FRAME_HEADER_LEN bytes"))?;
    let end = FRAME_HEADER_LEN + h.body_len as usize;
    Ok((buf.len() >= end).then_some((h, end)))
}

/// A `Call` frame's body split into the function's name (`b` bytes, at
/// most the whole body) and the input, after the trace context if the
/// frame has one ([`call_trace`]).
pub fn call_parts<'a>(h: &FrameHeader, body: &'a [u8]) -> (&'a [u8], &'a [u8]) {
    let body = if h.c & CALL_TRACE_CONTEXT != 0 { trace_block_len(body).map_or(&[][..], |n| &body[n..]) } else { body };
    body.split_at((h.call_name_len() as usize).min(body.len()))
}

/// A `Call` frame's trace block (`c` bit 2, [`trace_block_len`]), if the
/// frame has a whole one.
pub fn call_trace<'a>(h: &FrameHeader, body: &'a [u8]) -> Option<&'a [u8]> {
    (h.kind == FrameKind::Call && h.c & CALL_TRACE_CONTEXT != 0)
        .then(|| Some(&body[..trace_block_len(body)?]))
        .flatten()
}

/// The length of the trace block at the start of `b`: a context of
/// [`TRACE_CONTEXT_LEN`] bytes (trace id, parent span id, flags), the
/// length of the `tracestate` that follows (u16, little endian, at most
/// [`TRACE_STATE_LEN_MAX`]), that state. None if `b` does not hold a whole
/// block or the length is too large. (`api::trace::TraceContext` reads and
/// checks what is in it.)
pub fn trace_block_len(b: &[u8]) -> Option<usize> {
    let n = usize::from(u16::from_le_bytes(b.get(TRACE_CONTEXT_LEN..TRACE_CONTEXT_LEN + 2)?.try_into().ok()?));
    let len = TRACE_CONTEXT_LEN + 2 + n;
    (n <= TRACE_STATE_LEN_MAX && b.len() >= len).then_some(len)
}

/// Timing the engine reports with each result, in microseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Timing {
    pub queue_us: u32,
    pub exec_us: u32,
    pub cold_us: u32,
}

impl Timing {
    /// Fills a `Result` or `Error` header's words.
    pub fn to_header(self, h: &mut FrameHeader) {
        h.a = self.queue_us;
        h.b = self.exec_us;
        h.c = self.cold_us;
    }

    pub fn from_header(h: &FrameHeader) -> Timing {
        Timing { queue_us: h.a, exec_us: h.b, cold_us: h.c }
    }
}

/// A complete frame of `kind` with `body` (control and handshake frames).
pub fn frame(kind: FrameKind, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(FRAME_HEADER_LEN + body.len());
    out.extend_from_slice(&FrameHeader::new(kind, 0, body.len()).encode());
    out.extend_from_slice(body);
    out
}

/// `Call` frames, `c`: the gateway checked an invoke key for this call.
pub const CALL_KEY_CHECKED: u32 = 1;
/// `Call` frames, `c`: an asynchronous call, run after ordinary ones.
pub const CALL_BACKGROUND: u32 = 2;
/// `Call` frames, `c`: the body starts with the caller's W3C trace context
/// and state, a trace block ([`trace_block_len`]).
pub const CALL_TRACE_CONTEXT: u32 = 4;
/// `Forward` frames, `c`: a trace block follows the ids (the rest of `c`
/// is the depth).
pub const FORWARD_TRACE_CONTEXT: u32 = 1 << 31;
/// A trace context's bytes: trace id, span id, flags.
pub const TRACE_CONTEXT_LEN: usize = 25;
/// `tracestate` bytes a trace block holds at most.
pub const TRACE_STATE_LEN_MAX: usize = 512;

/// Builds a complete `Call` frame: header, function name, input.
pub fn call_frame(call_id: u64, timeout_ms: u32, name: &str, input: &[u8]) -> Vec<u8> {
    checked_call_frame(call_id, timeout_ms, name, input, false)
}

/// [`call_frame`], saying whether the gateway checked an invoke key.
pub fn checked_call_frame(call_id: u64, timeout_ms: u32, name: &str, input: &[u8], key_checked: bool) -> Vec<u8> {
    let flags = if key_checked { CALL_KEY_CHECKED } else { 0 };
    flagged_call_frame(call_id, timeout_ms, name, input, flags)
}

/// [`call_frame`] with the `c` flags ([`CALL_KEY_CHECKED`], [`CALL_BACKGROUND`]).
pub fn flagged_call_frame(call_id: u64, timeout_ms: u32, name: &str, input: &[u8], flags: u32) -> Vec<u8> {
    traced_call_frame(call_id, timeout_ms, name, input, flags, None)
}

/// [`flagged_call_frame`] with the caller's trace block, if any
/// ([`CALL_TRACE_CONTEXT`]; `trace_block_len` of it must be its length).
pub fn traced_call_frame(
    call_id: u64,
    timeout_ms: u32,
    name: &str,
    input: &[u8],
    flags: u32,
    trace: Option<&[u8]>,
) -> Vec<u8> {
    debug_assert!(trace.is_none_or(|t| trace_block_len(t) == Some(t.len())), "a whole trace block");
    let ctx: &[u8] = trace.unwrap_or(&[]);
    let mut h = FrameHeader::new(FrameKind::Call, call_id, ctx.len() + name.len() + input.len());
    h.a = timeout_ms;
    h.b = name.len() as u32;
    h.c = flags | if trace.is_some() { CALL_TRACE_CONTEXT } else { 0 };
    let mut out = Vec::with_capacity(FRAME_HEADER_LEN + ctx.len() + name.len() + input.len());
    out.extend_from_slice(&h.encode());
    out.extend_from_slice(ctx);
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(input);
    out
}

/// A `Forward` body's first bytes: the call id its caller's engine gave it
/// and its parent's id there (both u64, little-endian).
pub const FORWARD_PREFIX_LEN: usize = 16;

/// An internal call on its way to another server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Forward<'a> {
    /// The id the caller's engine gave the call (its runtime's internal id).
    pub origin_call_id: u64,
    /// The caller's own call, on the caller's engine.
    pub parent_call_id: u64,
    /// Its trace block ([`trace_block_len`]); empty if it has none.
    pub trace: &'a [u8],
    pub name: &'a [u8],
    pub input: &'a [u8],
}

/// A complete `Forward` frame. `call_id` is the sender's key for the
/// answer: the caller's internal id from an engine, the gateway's hop id
/// from a gateway.
pub fn forward_frame(call_id: u64, timeout_ms: u32, depth: u32, f: &Forward<'_>) -> Vec<u8> {
    debug_assert!(f.trace.is_empty() || trace_block_len(f.trace) == Some(f.trace.len()), "a whole trace block");
    debug_assert!(depth & FORWARD_TRACE_CONTEXT == 0, "a depth below 2^31");
    let len = FORWARD_PREFIX_LEN + f.trace.len() + f.name.len() + f.input.len();
    let mut h = FrameHeader::new(FrameKind::Forward, call_id, len);
    h.a = timeout_ms;
    h.b = f.name.len() as u32;
    h.c = depth | if f.trace.is_empty() { 0 } else { FORWARD_TRACE_CONTEXT };
    let mut out = Vec::with_capacity(FRAME_HEADER_LEN + len);
    out.extend_from_slice(&h.encode());
    out.extend_from_slice(&f.origin_call_id.to_le_bytes());
    out.extend_from_slice(&f.parent_call_id.to_le_bytes());
    out.extend_from_slice(f.trace);
    out.extend_from_slice(f.name);
    out.extend_from_slice(f.input);
    out
}

/// A `Forward` body's parts; `None` if it is too short for its ids, the
/// trace block its header claims and the name length it claims.
pub fn forward_parts<'a>(h: &FrameHeader, body: &'a [u8]) -> Option<Forward<'a>> {
    let ids = body.get(..FORWARD_PREFIX_LEN)?;
    let rest = &body[FORWARD_PREFIX_LEN..];
    let (trace, rest) = if h.forward_traced() { rest.split_at(trace_block_len(rest)?) } else { (&[][..], rest) };
    let name_len = h.call_name_len() as usize;
    if name_len > rest.len() {
        return None;
    }
    let (name, input) = rest.split_at(name_len);
    Some(Forward {
        origin_call_id: u64::from_le_bytes(ids[..8].try_into().expect("8 bytes")),
        parent_call_id: u64::from_le_bytes(ids[8..].try_into().expect("8 bytes")),
        trace,
        name,
        input,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forward_frames_round_trip_and_short_ones_are_refused() {
        let f = Forward {
            origin_call_id: 7 << 32 | 3,
            parent_call_id: 1 << 63 | 9,
            trace: &[],
            name: b"callee",
            input: b"in",
        };
        let frame = forward_frame(42, 1500, 4, &f);
        let (h, end) = next_frame(&frame).expect("valid").expect("whole");
        assert_eq!((h.kind, h.call_id, end), (FrameKind::Forward, 42, frame.len()));
        assert_eq!((h.call_timeout_ms(), h.forward_depth()), (1500, 4));
        assert_eq!(forward_parts(&h, &frame[FRAME_HEADER_LEN..]), Some(f));
        // A body shorter than its ids, or than the name its header claims.
        assert_eq!(forward_parts(&h, &frame[FRAME_HEADER_LEN..FRAME_HEADER_LEN + 15]), None);
        assert_eq!(forward_parts(&h, &frame[FRAME_HEADER_LEN..FRAME_HEADER_LEN + 20]), None);
        // With a trace block: the depth is unchanged, the block between.
        let mut block = vec![7u8; TRACE_CONTEXT_LEN];
        block.extend_from_slice(&3u16.to_le_bytes());
        block.extend_from_slice(b"a=b");
        let t = Forward { trace: &block, ..f };
        let frame = forward_frame(42, 1500, 4, &t);
        let (h, _) = next_frame(&frame).expect("valid").expect("whole");
        assert_eq!(h.forward_depth(), 4);
        assert_eq!(forward_parts(&h, &frame[FRAME_HEADER_LEN..]), Some(t));
        // A block whose length runs past the body.
        let mut bad = frame.clone();
        bad[FRAME_HEADER_LEN + FORWARD_PREFIX_LEN + TRACE_CONTEXT_LEN] = 200;
        assert_eq!(forward_parts(&h, &bad[FRAME_HEADER_LEN..]), None);
    }

    #[test]
    fn a_call_carries_its_trace_context_before_the_name() {
        let mut ctx = vec![7u8; TRACE_CONTEXT_LEN];
        ctx.extend_from_slice(&2u16.to_le_bytes());
        ctx.extend_from_slice(b"ab");
        let frame = traced_call_frame(9, 100, "fn", b"input", CALL_KEY_CHECKED, Some(&ctx));
        let (h, _) = next_frame(&frame).expect("valid").expect("whole");
        let body = &frame[FRAME_HEADER_LEN..];
        assert!(h.call_key_checked());
        assert_eq!(call_trace(&h, body), Some(&ctx[..]));
        assert_eq!(call_parts(&h, body), (&b"fn"[..], &b"input"[..]));
        // Without one: as before.
        let frame = flagged_call_frame(9, 100, "fn", b"input", 0);
        let (h, _) = next_frame(&frame).expect("valid").expect("whole");
        assert_eq!(call_trace(&h, &frame[FRAME_HEADER_LEN..]), None);
        assert_eq!(call_parts(&h, &frame[FRAME_HEADER_LEN..]), (&b"fn"[..], &b"input"[..]));
        // A body too short for the context it claims: no context, no name.
        let mut h2 = h;
        h2.c = CALL_TRACE_CONTEXT;
        assert_eq!(call_trace(&h2, b"short"), None);
        assert_eq!(call_parts(&h2, b"short"), (&b""[..], &b""[..]));
        // A state longer than allowed, or than the body.
        let mut long = vec![7u8; TRACE_CONTEXT_LEN];
        long.extend_from_slice(&513u16.to_le_bytes());
        long.extend_from_slice(&[b'a'; 513]);
        assert_eq!(call_trace(&h2, &long), None);
        // A state within the limit that the body does not hold all of.
        let mut cut = vec![7u8; TRACE_CONTEXT_LEN];
        cut.extend_from_slice(&10u16.to_le_bytes());
        cut.extend_from_slice(b"k=v");
        assert_eq!(trace_block_len(&cut), None);
        cut.extend_from_slice(b"1234567");
        assert_eq!(trace_block_len(&cut), Some(TRACE_CONTEXT_LEN + 12));
    }

    #[test]
    fn round_trip() {
        let mut h = FrameHeader::new(FrameKind::Result, 1 << 63 | 5, 10);
        Timing { queue_us: 1, exec_us: 2, cold_us: 3 }.to_header(&mut h);
        assert_eq!(FrameHeader::decode(&h.encode()), Ok(h));
    }

    #[test]
    fn rejects_bad_frames() {
        let mut b = FrameHeader::new(FrameKind::Call, 1, 0).encode();
        b[4] = 99;
        assert_eq!(FrameHeader::decode(&b), Err(FrameError::Kind(99)));
        let mut b = FrameHeader::new(FrameKind::Call, 1, 0).encode();
        b[0..4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(FrameHeader::decode(&b), Err(FrameError::BodyTooLong(_))));
        let mut b = FrameHeader::new(FrameKind::Call, 1, 0).encode();
        b[31] = 1;
        assert_eq!(FrameHeader::decode(&b), Err(FrameError::Reserved));
    }
}
