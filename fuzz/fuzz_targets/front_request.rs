//! The engine's front door reads client bytes on its I/O threads
//! (api::http::parse_call): any bytes either wait for more, are handed to
//! the gateway, or are a call whose name and body lie inside them, within
//! the limits — and a call is only ever seen once all of it is there.
#![no_main]

use libfuzzer_sys::fuzz_target;
use api::http::{parse_call, Parsed, HEAD_MAX};

const PAYLOAD_MAX: usize = 4096;

fuzz_target!(|data: &[u8]| {
    let loopback = data.first().is_some_and(|b| b & 1 == 1);
    match parse_call(data, PAYLOAD_MAX, loopback) {
        Parsed::Call(c) => {
            assert!(wire::valid_function_name(&c.name), "{:?}", c.name);
            assert!(c.body.start <= c.body.end && c.body.end <= data.len());
            assert!(c.body.len() <= PAYLOAD_MAX);
            assert!(c.body.start <= HEAD_MAX);
            // The head ends with a blank line just before the body.
            assert!(data[..c.body.start].ends_with(b"\n"));
            // Nothing shorter than the whole request is a call.
            for cut in [c.body.end.saturating_sub(1), c.body.start.saturating_sub(1)] {
                if cut < c.body.end {
                    assert!(!matches!(parse_call(&data[..cut], PAYLOAD_MAX, loopback), Parsed::Call(_)));
                }
            }
            // Bytes after it (a pipelined request) change nothing about it.
            let mut more = data[..c.body.end].to_vec();
            more.extend_from_slice(b"POST /function/x HTTP/1.1\r\n");
            assert_eq!(parse_call(&more, PAYLOAD_MAX, loopback), Parsed::Call(c));
        }
        Parsed::Partial => assert!(data.len() <= HEAD_MAX),
        Parsed::PartialBody => assert!(data.len() < HEAD_MAX + PAYLOAD_MAX),
        Parsed::HandOver(why) => assert!(!why.is_empty()),
    }
});
