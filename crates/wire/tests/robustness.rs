//! Decoders face bytes from processes we do not trust (function workers, a
//! peer on the network). Feed them random and mutated input: they must never
//! panic, and whatever they accept must re-encode to the same bytes.

use staccato_wire::frame::{FrameHeader, FRAME_HEADER_LEN};
use staccato_wire::message::{decode_header, Message, HEADER_LEN, MESSAGE_LEN};

/// xorshift64*: deterministic, so a failure reproduces.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

fn check_message(buf: &[u8]) {
    if let Ok(h) = decode_header(buf) {
        let m = Message::new(&h, &buf[HEADER_LEN..HEADER_LEN + h.inline_len()]);
        assert_eq!(&m.buf[..HEADER_LEN], &buf[..HEADER_LEN], "accepted header does not round-trip");
    }
}

#[test]
fn random_messages_never_panic() {
    let mut rng = Rng(0x5eed);
    let mut buf = vec![0u8; MESSAGE_LEN];
    let mut accepted = 0;
    for i in 0..200_000 {
        // Mostly-plausible headers: small kinds and lengths, so the search
        // reaches the deeper validation rules, not just the kind check.
        for b in buf[..HEADER_LEN].iter_mut() {
            *b = if rng.next().is_multiple_of(4) { rng.next() as u8 } else { 0 };
        }
        buf[0] = (rng.next() % 10) as u8;
        buf[1] = 0;
        if i % 2 == 0 {
            buf[4..8].copy_from_slice(&((rng.next() % 1100) as u32).to_le_bytes());
        }
        check_message(&buf);
        accepted += usize::from(decode_header(&buf).is_ok());
        // Wrong lengths are always rejected.
        let cut = (rng.next() % MESSAGE_LEN as u64) as usize;
        assert!(decode_header(&buf[..cut]).is_err());
    }
    assert!(accepted > 100, "the generator never produced a valid message ({accepted})");
}

#[test]
fn random_frames_never_panic() {
    let mut rng = Rng(0xf00d);
    for _ in 0..200_000 {
        let mut b = [0u8; FRAME_HEADER_LEN];
        for x in b.iter_mut() {
            *x = if rng.next().is_multiple_of(3) { rng.next() as u8 } else { 0 };
        }
        if let Ok(h) = FrameHeader::decode(&b) {
            assert_eq!(FrameHeader::decode(&h.encode()), Ok(h));
        }
    }
}
