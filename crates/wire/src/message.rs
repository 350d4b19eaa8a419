//! Fixed 1 KB worker messages (docs/protocol.md §1, Nightcore §3.1).

use crate::ErrorKind;

pub const MESSAGE_LEN: usize = 1024;
pub const HEADER_LEN: usize = 64;
pub const INLINE_LEN_MAX: usize = MESSAGE_LEN - HEADER_LEN;

/// A pipe write of at most PIPE_BUF bytes is atomic (pipe(7)), so a message
/// is never interleaved with another writer's or split for the reader.
const PIPE_BUF: usize = 4096;
const _: () = assert!(MESSAGE_LEN <= PIPE_BUF);
const _: () = assert!(INLINE_LEN_MAX == 960);

/// Flag bit: the payload is in a shared-memory file, not inline.
pub const FLAG_PAYLOAD_IN_SHM: u16 = 1;
/// Flag bit: on a `Dispatch`, measure the call's CPU time; on its
/// `Completion` or `Failure`, `aux` holds it (µs, the handler's thread).
pub const FLAG_CPU_TIME: u16 = 2;
const FLAGS_KNOWN: u16 = FLAG_PAYLOAD_IN_SHM | FLAG_CPU_TIME;

/// An `Invoke` carries the callee name inline; names are at most this long.
pub const INVOKE_NAME_LEN_MAX: usize = crate::FUNCTION_NAME_LEN_MAX;

/// A `Dispatch` of a traced call starts its inline area with the call's
/// trace context (`name_len` bytes): trace id, span id, flags
/// ([`crate::frame::TRACE_CONTEXT_LEN`] bytes), then its `tracestate`.
pub const DISPATCH_TRACE_LEN_MIN: usize = crate::frame::TRACE_CONTEXT_LEN;
pub const DISPATCH_TRACE_LEN_MAX: usize = DISPATCH_TRACE_LEN_MIN + crate::frame::TRACE_STATE_LEN_MAX;
const _: () = assert!(DISPATCH_TRACE_LEN_MAX <= INLINE_LEN_MAX);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u16)]
pub enum Kind {
    LauncherHello = 1,
    WorkerHello = 2,
    CreateWorker = 3,
    StopWorker = 4,
    Dispatch = 5,
    Completion = 6,
    Failure = 7,
    Invoke = 8,
}

impl Kind {
    pub fn from_code(code: u16) -> Option<Kind> {
        Some(match code {
            1 => Kind::LauncherHello,
            2 => Kind::WorkerHello,
            3 => Kind::CreateWorker,
            4 => Kind::StopWorker,
            5 => Kind::Dispatch,
            6 => Kind::Completion,
            7 => Kind::Failure,
            8 => Kind::Invoke,
            _ => return None,
        })
    }

    /// Kinds that carry a payload and so may overflow to shared memory.
    pub fn carries_payload(self) -> bool {
        matches!(self, Kind::Dispatch | Kind::Completion | Kind::Failure | Kind::Invoke)
    }

    /// The shm file suffix for this kind's payload: inputs `i`, outputs `o`.
    pub fn shm_suffix(self) -> char {
        match self {
            Kind::Dispatch | Kind::Invoke => 'i',
            _ => 'o',
        }
    }
}

/// The 64-byte header, decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub kind: Kind,
    pub flags: u16,
    pub payload_len: u32,
    pub call_id: u64,
    pub parent_call_id: u64,
    pub worker_id: u32,
    pub name_len: u16,
    pub error_kind: u16,
    pub deadline_us: u64,
    pub send_ts_ns: u64,
    pub aux: u32,
}

impl Header {
    pub fn new(kind: Kind) -> Header {
        Header {
            kind,
            flags: 0,
            payload_len: 0,
            call_id: 0,
            parent_call_id: 0,
            worker_id: 0,
            name_len: 0,
            error_kind: 0,
            deadline_us: 0,
            send_ts_ns: 0,
            aux: 0,
        }
    }

    pub fn in_shm(&self) -> bool {
        self.flags & FLAG_PAYLOAD_IN_SHM != 0
    }

    /// A reply's CPU time of the call, in µs, if the runtime measured it.
    pub fn cpu_us(&self) -> Option<u32> {
        (self.flags & FLAG_CPU_TIME != 0 && matches!(self.kind, Kind::Completion | Kind::Failure)).then_some(self.aux)
    }

    /// Bytes of the inline area in use.
    pub fn inline_len(&self) -> usize {
        if self.in_shm() {
            usize::from(self.name_len)
        } else {
            self.payload_len as usize
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MessageError {
    Length(usize),
    Kind(u16),
    Flags(u16),
    Reserved,
    InlineTooLong(u32),
    NameLen(u16),
    ErrorKind(u16),
    ShmNotAllowed(Kind),
}

impl std::fmt::Display for MessageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MessageError::Length(n) => write!(f, "message is {n} bytes, not {MESSAGE_LEN}"),
            MessageError::Kind(k) => write!(f, "unknown message kind {k}"),
            MessageError::Flags(x) => write!(f, "unknown flag bits {x:#06x}"),
            MessageError::Reserved => write!(f, "reserved header bytes are not zero"),
            MessageError::InlineTooLong(n) => write!(f, "inline payload of {n} bytes exceeds {INLINE_LEN_MAX}"),
            MessageError::NameLen(n) => write!(f, "name_len {n} is invalid for this message"),
            MessageError::ErrorKind(e) => write!(f, "error_kind {e} is invalid for this message"),
            MessageError::ShmNotAllowed(k) => write!(f, "{k:?} cannot carry a shared-memory payload"),
        }
    }
}

impl std::error::Error for MessageError {}

/// One 1 KB message: the raw bytes, always exactly [`MESSAGE_LEN`] long.
/// Kept as bytes so it is written to and read from a pipe without copying.
#[derive(Clone)]
pub struct Message {
    pub buf: [u8; MESSAGE_LEN],
}

impl Default for Message {
    fn default() -> Self {
        Message { buf: [0; MESSAGE_LEN] }
    }
}

impl std::fmt::Debug for Message {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match decode_header(&self.buf) {
            Ok(h) => write!(f, "Message({h:?})"),
            Err(e) => write!(f, "Message(invalid: {e})"),
        }
    }
}

fn get_u16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
fn get_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4-byte slice"))
}
fn get_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8-byte slice"))
}

/// Decodes and validates a header against every rule of docs/protocol.md §1.
pub fn decode_header(buf: &[u8]) -> Result<Header, MessageError> {
    if buf.len() != MESSAGE_LEN {
        return Err(MessageError::Length(buf.len()));
    }
    let code = get_u16(buf, 0);
    let kind = Kind::from_code(code).ok_or(MessageError::Kind(code))?;
    let h = Header {
        kind,
        flags: get_u16(buf, 2),
        payload_len: get_u32(buf, 4),
        call_id: get_u64(buf, 8),
        parent_call_id: get_u64(buf, 16),
        worker_id: get_u32(buf, 24),
        name_len: get_u16(buf, 28),
        error_kind: get_u16(buf, 30),
        deadline_us: get_u64(buf, 32),
        send_ts_ns: get_u64(buf, 40),
        aux: get_u32(buf, 48),
    };
    validate(&h)?;
    if buf[52..HEADER_LEN].iter().any(|b| *b != 0) {
        return Err(MessageError::Reserved);
    }
    Ok(h)
}

fn validate(h: &Header) -> Result<(), MessageError> {
    if h.flags & !FLAGS_KNOWN != 0 {
        return Err(MessageError::Flags(h.flags & !FLAGS_KNOWN));
    }
    if h.in_shm() && !h.kind.carries_payload() {
        return Err(MessageError::ShmNotAllowed(h.kind));
    }
    if h.flags & FLAG_CPU_TIME != 0 && !matches!(h.kind, Kind::Dispatch | Kind::Completion | Kind::Failure) {
        return Err(MessageError::Flags(FLAG_CPU_TIME));
    }
    if !h.in_shm() && h.payload_len as usize > INLINE_LEN_MAX {
        return Err(MessageError::InlineTooLong(h.payload_len));
    }
    let n = usize::from(h.name_len);
    let name_ok = match h.kind {
        Kind::Invoke => (1..=INVOKE_NAME_LEN_MAX).contains(&n) && (h.in_shm() || n <= h.payload_len as usize),
        Kind::Dispatch => {
            n == 0
                || (DISPATCH_TRACE_LEN_MIN..=DISPATCH_TRACE_LEN_MAX).contains(&n)
                    && (h.in_shm() || n <= h.payload_len as usize)
        }
        _ => n == 0,
    };
    if !name_ok {
        return Err(MessageError::NameLen(h.name_len));
    }
    let error_ok =
        if h.kind == Kind::Failure { ErrorKind::from_code(h.error_kind).is_some() } else { h.error_kind == 0 };
    if !error_ok {
        return Err(MessageError::ErrorKind(h.error_kind));
    }
    Ok(())
}

/// Writes `h` into the first 64 bytes of `buf` (reserved bytes zeroed).
pub fn encode_header(h: &Header, buf: &mut [u8; MESSAGE_LEN]) {
    buf[0..2].copy_from_slice(&(h.kind as u16).to_le_bytes());
    buf[2..4].copy_from_slice(&h.flags.to_le_bytes());
    buf[4..8].copy_from_slice(&h.payload_len.to_le_bytes());
    buf[8..16].copy_from_slice(&h.call_id.to_le_bytes());
    buf[16..24].copy_from_slice(&h.parent_call_id.to_le_bytes());
    buf[24..28].copy_from_slice(&h.worker_id.to_le_bytes());
    buf[28..30].copy_from_slice(&h.name_len.to_le_bytes());
    buf[30..32].copy_from_slice(&h.error_kind.to_le_bytes());
    buf[32..40].copy_from_slice(&h.deadline_us.to_le_bytes());
    buf[40..48].copy_from_slice(&h.send_ts_ns.to_le_bytes());
    buf[48..52].copy_from_slice(&h.aux.to_le_bytes());
    buf[52..HEADER_LEN].fill(0);
}

impl Message {
    /// A message with header `h` and inline bytes `inline` (which must match
    /// `h.inline_len()`); the rest of the inline area is zero.
    pub fn new(h: &Header, inline: &[u8]) -> Message {
        debug_assert_eq!(inline.len(), h.inline_len());
        let mut m = Message::default();
        encode_header(h, &mut m.buf);
        m.buf[HEADER_LEN..HEADER_LEN + inline.len()].copy_from_slice(inline);
        m
    }

    pub fn header(&self) -> Result<Header, MessageError> {
        decode_header(&self.buf)
    }

    /// The used inline bytes, for a header already decoded from this message.
    pub fn inline<'a>(&'a self, h: &Header) -> &'a [u8] {
        &self.buf[HEADER_LEN..HEADER_LEN + h.inline_len()]
    }

    /// Overwrites header fields in place without re-encoding the payload:
    /// used when the engine forwards a message to another channel.
    pub fn set_header(&mut self, h: &Header) {
        encode_header(h, &mut self.buf);
    }
}

/// The name of the shm file holding the payload of message kind `kind` for
/// call `call_id`, relative to a function's `shm/` directory.
pub fn shm_file_name(call_id: u64, kind: Kind) -> String {
    format!("{call_id:016x}.{}", kind.shm_suffix())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trip() {
        let mut h = Header::new(Kind::Invoke);
        h.payload_len = 7;
        h.name_len = 3;
        h.call_id = u64::MAX;
        h.deadline_us = 12345;
        let m = Message::new(&h, b"abcdefg");
        let d = m.header().expect("valid");
        assert_eq!(d, h);
        assert_eq!(m.inline(&d), b"abcdefg");
    }

    #[test]
    fn shm_names() {
        assert_eq!(shm_file_name(0x1f, Kind::Dispatch), "000000000000001f.i");
        assert_eq!(shm_file_name(1 << 63, Kind::Failure), "8000000000000000.o");
    }
}
