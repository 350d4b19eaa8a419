//! The gateway–engine link as a peer that does not know the secret sees
//! it: frame streams, the handshake, `Call` and `Forward` frames.
#![no_main]

use api::auth::{Secret, HANDSHAKE_BODY_LEN_MAX};
use libfuzzer_sys::fuzz_target;
use std::io::{Cursor, Read, Write};
use wire::frame::{
    call_parts, call_trace, forward_frame, forward_parts, next_frame, trace_block_len, FrameHeader, FrameKind,
    FORWARD_PREFIX_LEN, FRAME_BODY_LEN_MAX, FRAME_HEADER_LEN, TRACE_STATE_LEN_MAX,
};

/// Reads come from the fuzzer's bytes; writes go nowhere.
struct Peer(Cursor<Vec<u8>>);

impl Read for Peer {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.0.read(buf)
    }
}

impl Write for Peer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A whole trace block, if any: one that decodes encodes back to a block
/// that decodes to the same context, its state within the limit.
fn check_block(block: Option<&[u8]>) {
    let Some(b) = block else { return };
    assert_eq!(trace_block_len(b), Some(b.len()));
    if let Some(t) = api::trace::TraceContext::decode(b) {
        assert!(t.state.len() <= TRACE_STATE_LEN_MAX);
        assert_eq!(api::trace::TraceContext::decode(&t.encode()), Some(t));
    }
}

fuzz_target!(|data: &[u8]| {
    // A stream of frames is split without reading past its end, and every
    // header that decodes encodes back to the same bytes.
    let mut off = 0;
    while let Ok(Some((h, end))) = next_frame(&data[off..]) {
        assert!(h.body_len as usize <= FRAME_BODY_LEN_MAX);
        assert_eq!(end, FRAME_HEADER_LEN + h.body_len as usize);
        let hb: &[u8; FRAME_HEADER_LEN] = data[off..off + FRAME_HEADER_LEN].try_into().unwrap();
        assert_eq!(FrameHeader::decode(hb).map(|d| d.encode()), Ok(*hb));
        let body = &data[off + FRAME_HEADER_LEN..off + end];
        if h.kind == FrameKind::Call {
            // After a trace block if the frame says it has one; a body
            // without the whole block it claims has no name and input. A
            // block decodes to a context that encodes back to a block.
            let (name, input) = call_parts(&h, body);
            let ctx = call_trace(&h, body);
            let n = ctx.map_or(0, <[u8]>::len);
            assert!(
                n + name.len() + input.len() == body.len()
                    || (ctx.is_none() && name.is_empty() && input.is_empty() && trace_block_len(body).is_none())
            );
            check_block(ctx);
        }
        if h.kind == FrameKind::Forward {
            // Split within the body, or refused; a split one is written
            // back to the same body.
            if let Some(f) = forward_parts(&h, body) {
                assert_eq!(FORWARD_PREFIX_LEN + f.trace.len() + f.name.len() + f.input.len(), body.len());
                assert_eq!(h.forward_traced(), !f.trace.is_empty());
                check_block((!f.trace.is_empty()).then_some(f.trace));
                let again = forward_frame(h.call_id, h.call_timeout_ms(), h.forward_depth(), &f);
                assert_eq!(&again[FRAME_HEADER_LEN..], body);
                // The header too: its flag and depth (c) come back as they were.
                let hb: &[u8; FRAME_HEADER_LEN] = again[..FRAME_HEADER_LEN].try_into().unwrap();
                let h2 = FrameHeader::decode(hb).unwrap();
                assert_eq!((h2.forward_depth(), h2.forward_traced()), (h.forward_depth(), h.forward_traced()));
            } else {
                let rest = body.get(FORWARD_PREFIX_LEN..).unwrap_or(&[]);
                let block = if h.forward_traced() { trace_block_len(rest) } else { Some(0) };
                assert!(
                    body.len() < FORWARD_PREFIX_LEN
                        || block.is_none_or(|b| rest.len() < b + h.call_name_len() as usize)
                );
            }
        }
        off += end;
    }
    // The engine's handshake never admits a peer that does not know the
    // secret (the fuzzer cannot), whatever it sends.
    let secret = Secret::new("fuzz-secret-the-peer-does-not-know").unwrap();
    assert!(api::link::engine(&mut Peer(Cursor::new(data.to_vec())), &secret).is_err());
    // Handshake frames are small: no allocation beyond the bound.
    if let Ok((_, body)) = api::link::read_frame(&mut Cursor::new(data), HANDSHAKE_BODY_LEN_MAX) {
        assert!(body.len() <= HANDSHAKE_BODY_LEN_MAX);
        let _ = api::auth::parse_hello(&body);
    }
});
