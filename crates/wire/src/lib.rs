//! Staccato's wire formats, exactly as `docs/protocol.md` defines them.
//!
//! * [`message`]: the fixed 1 KB messages between the engine and
//!   launchers/workers (Nightcore §3.1).
//! * [`frame`]: length-prefixed frames between the gateway and an engine.
//! * [`ErrorKind`]: the error vocabulary shared by both and the gateway's HTTP
//!   mapping.
//!
//! No I/O and no dependencies: every field is read and written by explicit
//! little-endian offset, so the layout cannot drift between languages.
#![forbid(unsafe_code)]

pub mod frame;
pub mod message;

pub use message::{Header, Kind, Message, MessageError};

/// Why a call failed. Codes are on the wire; names are in error bodies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum ErrorKind {
    NotFound = 1,
    PayloadTooLarge = 2,
    FunctionError = 3,
    WorkerCrashed = 4,
    Timeout = 5,
    EngineUnavailable = 6,
    BadRequest = 7,
    Internal = 8,
    OutOfMemory = 9,
    OutputTooLarge = 10,
    CallCycle = 11,
    CallDepthExceeded = 12,
    FunctionRemoved = 13,
    Overloaded = 14,
}

impl ErrorKind {
    pub const ALL: [ErrorKind; 14] = [
        ErrorKind::NotFound,
        ErrorKind::PayloadTooLarge,
        ErrorKind::FunctionError,
        ErrorKind::WorkerCrashed,
        ErrorKind::Timeout,
        ErrorKind::EngineUnavailable,
        ErrorKind::BadRequest,
        ErrorKind::Internal,
        ErrorKind::OutOfMemory,
        ErrorKind::OutputTooLarge,
        ErrorKind::CallCycle,
        ErrorKind::CallDepthExceeded,
        ErrorKind::FunctionRemoved,
        ErrorKind::Overloaded,
    ];

    pub fn from_code(code: u16) -> Option<ErrorKind> {
        ErrorKind::ALL.into_iter().find(|k| *k as u16 == code)
    }

    pub fn code(self) -> u16 {
        self as u16
    }

    /// The kind a name (as in [`ErrorKind::name`]) stands for.
    pub fn from_name(name: &str) -> Option<ErrorKind> {
        ErrorKind::ALL.into_iter().find(|k| k.name() == name)
    }

    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::NotFound => "not_found",
            ErrorKind::PayloadTooLarge => "payload_too_large",
            ErrorKind::FunctionError => "function_error",
            ErrorKind::WorkerCrashed => "worker_crashed",
            ErrorKind::Timeout => "timeout",
            ErrorKind::EngineUnavailable => "engine_unavailable",
            ErrorKind::BadRequest => "bad_request",
            ErrorKind::Internal => "internal",
            ErrorKind::OutOfMemory => "out_of_memory",
            ErrorKind::OutputTooLarge => "output_too_large",
            ErrorKind::CallCycle => "call_cycle",
            ErrorKind::CallDepthExceeded => "call_depth_exceeded",
            ErrorKind::FunctionRemoved => "function_removed",
            ErrorKind::Overloaded => "overloaded",
        }
    }

    /// The HTTP status the gateway answers with. Says who is at fault:
    /// 4xx the client, 500 the function, 502/503/504 the runtime.
    pub fn http_status(self) -> u16 {
        match self {
            ErrorKind::NotFound => 404,
            ErrorKind::PayloadTooLarge => 413,
            ErrorKind::FunctionError => 500,
            ErrorKind::WorkerCrashed => 502,
            ErrorKind::Timeout => 504,
            ErrorKind::EngineUnavailable => 503,
            ErrorKind::BadRequest => 400,
            ErrorKind::Internal => 500,
            ErrorKind::OutOfMemory => 502,
            // The function's answer was too big: its fault, not the client's.
            ErrorKind::OutputTooLarge => 502,
            // The call needs a worker its own callers hold.
            ErrorKind::CallCycle => 409,
            // Loop Detected (RFC 5842): internal calls nested too deeply.
            ErrorKind::CallDepthExceeded => 508,
            // Gone: the function was removed while the call waited or ran.
            ErrorKind::FunctionRemoved => 410,
            // Retryable: the function's queue is full now, not forever.
            ErrorKind::Overloaded => 503,
        }
    }
}

/// Bit 63 marks call ids made by the gateway (docs/protocol.md "Call ids").
pub const GATEWAY_CALL_ID_BIT: u64 = 1 << 63;

/// The call id a runtime gives its `seq`-th internal call on channel `worker_id`.
pub fn internal_call_id(worker_id: u32, seq: u32) -> u64 {
    (u64::from(worker_id) << 32) | u64::from(seq)
}

/// Default largest payload, in or out: Lambda's synchronous limit.
pub const PAYLOAD_LEN_MAX_DEFAULT: usize = 6 << 20;

/// Longest function name: it must fit the inline area of an `Invoke`.
pub const FUNCTION_NAME_LEN_MAX: usize = 64;

/// Whether `name` is an acceptable function name: 1..=64 bytes of
/// `[a-z0-9-_]`, starting with a letter. It becomes a directory name in the
/// IPC directory and a URL path segment, so nothing else is allowed.
pub fn valid_function_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= FUNCTION_NAME_LEN_MAX
        && b[0].is_ascii_lowercase()
        && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-' || *c == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_codes_round_trip() {
        for k in ErrorKind::ALL {
            assert_eq!(ErrorKind::from_code(k.code()), Some(k));
            assert_eq!(ErrorKind::from_name(k.name()), Some(k));
        }
        assert_eq!(ErrorKind::from_name("Timeout"), None);
        assert_eq!(ErrorKind::from_code(0), None);
        assert_eq!(ErrorKind::from_code(15), None);
    }

    #[test]
    fn function_names() {
        assert!(valid_function_name("hello"));
        assert!(valid_function_name("a-b_c9"));
        assert!(!valid_function_name(""));
        assert!(!valid_function_name("9lives"));
        assert!(!valid_function_name("Hello"));
        assert!(!valid_function_name("../etc"));
        assert!(!valid_function_name(&"a".repeat(65)));
        assert!(valid_function_name(&"a".repeat(64)));
    }
}
