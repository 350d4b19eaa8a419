//! A 1 KB channel message from a worker (docs/protocol.md §1): any bytes
//! either decode to a header that obeys every rule, or are refused.
#![no_main]

use libfuzzer_sys::fuzz_target;
use wire::message::{decode_header, encode_header, Message, INLINE_LEN_MAX, MESSAGE_LEN};

fuzz_target!(|data: &[u8]| {
    // Any length: only exactly MESSAGE_LEN bytes may decode.
    let direct = decode_header(data);
    if data.len() != MESSAGE_LEN {
        assert!(direct.is_err());
    }
    let mut m = Message::default();
    let n = data.len().min(MESSAGE_LEN);
    m.buf[..n].copy_from_slice(&data[..n]);
    if let Ok(h) = m.header() {
        // What the engine then reads stays inside the message...
        assert!(h.inline_len() <= INLINE_LEN_MAX);
        let inline = m.inline(&h);
        assert_eq!(inline.len(), h.inline_len());
        // ...and the header survives a round trip unchanged.
        let mut again = [0u8; MESSAGE_LEN];
        encode_header(&h, &mut again);
        assert_eq!(decode_header(&again), Ok(h));
        assert_eq!(again[..64], m.buf[..64]);
    }
});
