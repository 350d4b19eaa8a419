//! W3C Trace Context (<https://www.w3.org/TR/trace-context/>): the
//! `traceparent` and `tracestate` headers a client may send with an
//! external call, and the block of bytes that carries them from a gateway to
//! an engine (`Call` and `Forward` frames, `wire::frame::CALL_TRACE_CONTEXT`)
//! and from an engine to a worker (a `Dispatch`'s prefix, docs/protocol.md).
//!
//! A `traceparent` that does not parse is ignored, as the recommendation
//! says (the call then starts a trace of its own if it is sampled); it is
//! never an error for the caller. A `tracestate` is kept only beside a valid
//! `traceparent` and only if it keeps the recommendation's rules (at most 32
//! members of `key=value`, here at most [`STATE_LEN_MAX`] bytes in all);
//! otherwise it is dropped, never passed on.

/// A caller's span: the trace it belongs to and its own span id, and
/// whether it was sampled (flag bit 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceParent {
    pub trace_id: u128,
    pub parent_id: u64,
    pub sampled: bool,
}

/// The header's name (lower case, as HTTP/2 and httparse compare it).
pub const HEADER: &str = "traceparent";
/// The vendors' state header, carried beside `traceparent`.
pub const STATE_HEADER: &str = "tracestate";
/// Bytes of `tracestate` kept at most (the recommendation asks vendors to
/// propagate at least 512).
pub const STATE_LEN_MAX: usize = wire::frame::TRACE_STATE_LEN_MAX;
/// List members of `tracestate` at most.
const STATE_MEMBERS_MAX: usize = 32;

/// Bytes of a context: trace id, parent id, flags.
pub const WIRE_LEN: usize = wire::frame::TRACE_CONTEXT_LEN;

impl TraceParent {
    /// Parses a `traceparent` value: `vv-<32 hex>-<16 hex>-<2 hex>`, lower
    /// case. Version `ff` is invalid; version `00` has exactly these four
    /// fields; a later version may add fields after another `-`. An all-zero
    /// trace or parent id is invalid.
    pub fn parse(v: &[u8]) -> Option<TraceParent> {
        if v.len() < 55 || v[2] != b'-' || v[35] != b'-' || v[52] != b'-' {
            return None;
        }
        let version = hex(&v[0..2])?;
        if version == 0xff || (version == 0 && v.len() != 55) || (v.len() > 55 && v[55] != b'-') {
            return None;
        }
        let trace_id = hex(&v[3..35])?;
        let parent_id = hex(&v[36..52])? as u64;
        let flags = hex(&v[53..55])?;
        (trace_id != 0 && parent_id != 0).then_some(TraceParent { trace_id, parent_id, sampled: flags & 1 == 1 })
    }

    /// The header value for a span of this trace (version 00).
    pub fn header(trace_id: u128, span_id: u64, sampled: bool) -> String {
        format!("00-{trace_id:032x}-{span_id:016x}-{:02x}", u8::from(sampled))
    }

    pub fn encode(&self) -> [u8; WIRE_LEN] {
        let mut b = [0u8; WIRE_LEN];
        b[..16].copy_from_slice(&self.trace_id.to_be_bytes());
        b[16..24].copy_from_slice(&self.parent_id.to_be_bytes());
        b[24] = u8::from(self.sampled);
        b
    }

    /// The context a gateway sent; None if it breaks the rules `parse`
    /// checks (zero ids, unknown flag bits): a frame is a peer's word.
    pub fn decode(b: &[u8]) -> Option<TraceParent> {
        let b: &[u8; WIRE_LEN] = b.try_into().ok()?;
        let trace_id = u128::from_be_bytes(b[..16].try_into().ok()?);
        let parent_id = u64::from_be_bytes(b[16..24].try_into().ok()?);
        (trace_id != 0 && parent_id != 0 && b[24] <= 1).then_some(TraceParent {
            trace_id,
            parent_id,
            sampled: b[24] == 1,
        })
    }
}

/// A trace context with its vendors' state: what a call carries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceContext {
    pub parent: TraceParent,
    /// `tracestate`, already checked; empty when there is none.
    pub state: String,
}

impl TraceContext {
    /// The context a caller sent: `traceparent` (one valid value) and its
    /// `tracestate` values, joined as the recommendation says. A state that
    /// breaks the rules is dropped; the parent stays.
    pub fn from_headers<'a>(parent: &[u8], states: impl Iterator<Item = &'a [u8]>) -> Option<TraceContext> {
        let parent = TraceParent::parse(parent)?;
        Some(TraceContext { parent, state: join_state(states).unwrap_or_default() })
    }

    /// The block a frame carries: [`WIRE_LEN`] bytes of context, the
    /// state's length (u16, little endian), the state.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(WIRE_LEN + 2 + self.state.len());
        b.extend_from_slice(&self.parent.encode());
        b.extend_from_slice(&(self.state.len() as u16).to_le_bytes());
        b.extend_from_slice(self.state.as_bytes());
        b
    }

    /// A block from a peer, checked as a header would be: None if the
    /// context is invalid or the length is not the block's; a state that
    /// breaks the rules is dropped.
    pub fn decode(b: &[u8]) -> Option<TraceContext> {
        let parent = TraceParent::decode(b.get(..WIRE_LEN)?)?;
        if block_len(b)? != b.len() {
            return None;
        }
        let state = join_state(std::iter::once(&b[WIRE_LEN + 2..])).unwrap_or_default();
        Some(TraceContext { parent, state })
    }
}

pub use wire::frame::trace_block_len as block_len;

/// `tracestate` values joined with commas, empty members dropped; None
/// if any member breaks the rules, there are too many, or it is too long.
fn join_state<'a>(values: impl Iterator<Item = &'a [u8]>) -> Option<String> {
    let mut out = String::new();
    let mut keys: Vec<&[u8]> = Vec::new();
    for v in values {
        for m in v.split(|c| *c == b',') {
            let m = trim_ows(m);
            if m.is_empty() {
                continue;
            }
            if keys.len() == STATE_MEMBERS_MAX || !state_member(m) {
                return None;
            }
            // Each key once (state_member found its '=').
            let key = &m[..m.iter().position(|c| *c == b'=')?];
            if keys.contains(&key) {
                return None;
            }
            keys.push(key);
            if !out.is_empty() {
                out.push(',');
            }
            // state_member accepted only printable ASCII.
            out.push_str(std::str::from_utf8(m).ok()?);
        }
    }
    (out.len() <= STATE_LEN_MAX).then_some(out)
}

fn trim_ows(mut m: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = m {
        m = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = m {
        m = rest;
    }
    m
}

/// `key=value` as the recommendation's grammar has it: a key of lower-case
/// letters, digits and `_-*/`, either simple (a letter first, at most 256
/// bytes) or `tenant@system` (a tenant of at most 241 starting with a
/// letter or digit, a system of at most 14 starting with a letter); a
/// value of 1 to 256 printable ASCII bytes but `,` and `=`, not ending in a
/// space.
fn state_member(m: &[u8]) -> bool {
    let Some(eq) = m.iter().position(|c| *c == b'=') else { return false };
    let (key, value) = (&m[..eq], &m[eq + 1..]);
    let key_char = |c: &u8| matches!(c, b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-' | b'*' | b'/');
    let part = |k: &[u8], max: usize, digit_first: bool| {
        !k.is_empty()
            && k.len() <= max
            && (k[0].is_ascii_lowercase() || digit_first && k[0].is_ascii_digit())
            && k.iter().all(key_char)
    };
    let key_ok = match key.iter().position(|c| *c == b'@') {
        Some(at) => part(&key[..at], 241, true) && part(&key[at + 1..], 14, false),
        None => part(key, 256, false),
    };
    let value_ok = !value.is_empty()
        && value.len() <= 256
        && value.last() != Some(&b' ')
        && value.iter().all(|c| (0x20..=0x7e).contains(c) && *c != b',' && *c != b'=');
    key_ok && value_ok
}

/// Lower-case hex digits only (the recommendation forbids upper case).
fn hex(s: &[u8]) -> Option<u128> {
    s.iter().try_fold(0u128, |acc, c| {
        let d = match c {
            b'0'..=b'9' => c - b'0',
            b'a'..=b'f' => c - b'a' + 10,
            _ => return None,
        };
        Some(acc << 4 | u128::from(d))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn the_recommendations_example_parses() {
        let t = TraceParent::parse(GOOD.as_bytes()).unwrap();
        assert_eq!(t.trace_id, 0x4bf92f3577b34da6a3ce929d0e0e4736);
        assert_eq!(t.parent_id, 0x00f067aa0ba902b7);
        assert!(t.sampled);
        assert_eq!(TraceParent::header(t.trace_id, t.parent_id, t.sampled), GOOD);
        assert_eq!(TraceParent::decode(&t.encode()), Some(t));
        let unsampled = GOOD.replace("-01", "-00");
        assert!(!TraceParent::parse(unsampled.as_bytes()).unwrap().sampled);
        // A later version may carry more after another dash.
        assert!(TraceParent::parse(format!("01{}-extra", &GOOD[2..]).as_bytes()).is_some());
    }

    #[test]
    fn states_are_joined_checked_and_carried() {
        let p = GOOD.as_bytes();
        let t =
            TraceContext::from_headers(p, [&b"rojo=00f067aa0ba902b7, congo=t61rcWkgMzE"[..], b" ,a@b=x y"].into_iter())
                .unwrap();
        assert_eq!(t.state, "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE,a@b=x y");
        assert_eq!(TraceContext::decode(&t.encode()), Some(t.clone()));
        assert_eq!(block_len(&t.encode()), Some(WIRE_LEN + 2 + t.state.len()));
        let mut long = t.encode();
        long.push(0);
        assert_eq!(TraceContext::decode(&long), None, "a block that is not its length");
        assert_eq!(block_len(&long[..30]), None, "cut short");
        for bad in [
            &b"Rojo=1"[..],
            b"rojo",
            b"rojo=",
            b"rojo=a,b",
            b"=1",
            b"rojo=a=b",
            b"rojo=a\tb",
            b"ro jo=1",
            b"r@=1",
            b"rojo=\x7f",
            b"1rojo=x",
            b"t@1sys=x",
            b"t@system-of-15chr=x",
            b"rojo=1,rojo=2",
        ] {
            let t = TraceContext::from_headers(p, std::iter::once(bad)).unwrap();
            assert_eq!(t.state, "", "{:?}", String::from_utf8_lossy(bad));
        }
        let many: Vec<String> = (0..33).map(|i| format!("k{i}=v")).collect();
        let many = many.join(",");
        assert_eq!(TraceContext::from_headers(p, std::iter::once(many.as_bytes())).unwrap().state, "");
        let big = format!("k={}", "v".repeat(250)).repeat(1) + &format!(",j={}", "v".repeat(250)) + ",z=zzzzzz";
        assert!(big.len() > STATE_LEN_MAX);
        assert_eq!(TraceContext::from_headers(p, std::iter::once(big.as_bytes())).unwrap().state, "");
        assert_eq!(TraceContext::from_headers(b"junk", std::iter::empty()), None);
    }

    #[test]
    fn anything_else_is_ignored() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01extra",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0x",
        ] {
            assert_eq!(TraceParent::parse(bad.as_bytes()), None, "{bad:?}");
        }
        let mut w = TraceParent::parse(GOOD.as_bytes()).unwrap().encode();
        w[24] = 3;
        assert_eq!(TraceParent::decode(&w), None, "unknown flag bits");
        assert_eq!(TraceParent::decode(&[0u8; WIRE_LEN]), None, "zero ids");
        assert_eq!(TraceParent::decode(&[1u8; 7]), None, "short");
    }
}
