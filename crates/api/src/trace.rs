//! W3C Trace Context (<https://www.w3.org/TR/trace-context/>): the
//! `traceparent` header a client may send with an external call, and the
//! 25 bytes that carry it from a gateway to an engine in a `Call` frame
//! (`wire::frame::CALL_TRACE_CONTEXT`).
//!
//! A header that does not parse is ignored, as the recommendation says
//! (the call then starts a trace of its own if it is sampled); it is never
//! an error for the caller.

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

/// Bytes of a context in a `Call` frame: trace id, parent id, flags.
pub const WIRE_LEN: usize = 25;

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
