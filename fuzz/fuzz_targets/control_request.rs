//! The engine's control connection as a gateway that knows the secret may
//! use it (a compromised or buggy one): whatever arrives is answered or
//! ends the connection, never a panic or an unbounded allocation, and a
//! request the engine accepts means the same after a round trip.
#![no_main]

use api::control::{self, Request, CONTROL_BODY_MAX};
use libfuzzer_sys::fuzz_target;
use std::io::Cursor;

fuzz_target!(|data: &[u8]| {
    let mut r = Cursor::new(data);
    // A stream of requests, as the engine reads them.
    while let Ok(Some(parsed)) = control::read_request(&mut r) {
        let Ok((req, attachment)) = parsed else { continue };
        assert!(attachment.len() <= CONTROL_BODY_MAX);
        assert!(attachment.is_empty() || matches!(req, Request::Register { .. }));
        let mut again = Vec::new();
        control::write_request(&mut again, &req, &attachment).unwrap();
        let back = control::read_request(&mut again.as_slice()).unwrap().unwrap().unwrap();
        assert_eq!(back, (req, attachment));
    }
    // The same bytes as the gateway reads answers.
    let _ = control::read_answer(&mut Cursor::new(data));
});
