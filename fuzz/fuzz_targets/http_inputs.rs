//! What a client sends the gateway: headers (Host, Origin, Sec-Fetch-Site,
//! Authorization, Content-Type, Content-Length, the timeout) and deploy
//! bodies. The first byte picks which; the rest is the value.
#![no_main]

use gateway::inputs;
use hyper::header::{HeaderMap, HeaderName, HeaderValue};
use libfuzzer_sys::fuzz_target;

const NAMES: [&str; 7] =
    ["host", "origin", "sec-fetch-site", "authorization", "content-type", "content-length", "x-staccato-timeout-ms"];

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else { return };
    if pick == 0xff {
        // A deploy body: valid specs or a message, never a panic.
        if let Ok(specs) = inputs::deploy_specs(rest) {
            assert!(!specs.is_empty() && specs.len() <= inputs::DEPLOY_FUNCTIONS_MAX);
            assert!(specs.iter().all(|s| s.validate().is_ok()));
        }
        if let Ok(q) = std::str::from_utf8(rest) {
            let _ = inputs::trace_query(q);
        }
        return;
    }
    // Up to three headers, split at 0x00 bytes, names chosen by `pick`.
    let mut h = HeaderMap::new();
    for (i, value) in rest.split(|b| *b == 0).take(3).enumerate() {
        let name = NAMES[(usize::from(pick) + i * 3) % NAMES.len()];
        if let Ok(v) = HeaderValue::from_bytes(value) {
            h.append(HeaderName::from_static(name), v);
        }
    }
    // A Host accepted as loopback is no DNS name but localhost: IP
    // literals have no letters beyond hex digits, and dotted ones (IPv4)
    // none at all. A rebinding page's own domain never passes.
    if inputs::loopback_host(&h) {
        if let Some(Ok(host)) = h.get("host").map(|v| v.to_str()) {
            let lower = host.to_ascii_lowercase();
            let rest = lower.strip_prefix("localhost").unwrap_or(&lower);
            assert!(!rest.bytes().any(|b| (b'g'..=b'z').contains(&b)), "{host}");
            assert!(!rest.contains('.') || !rest.bytes().any(|b| b.is_ascii_alphabetic()), "{host}");
        }
    }
    let _ = inputs::cross_origin(&h);
    let _ = inputs::content_type(&h);
    let _ = inputs::content_length(&h);
    let _ = inputs::bearer(&h);
    if let Ok(ms) = inputs::timeout_ms(&h) {
        assert!(ms > 0 || h.get("x-staccato-timeout-ms").is_none());
    }
});
