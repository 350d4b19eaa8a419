//! Authentication on the gateway–engine link (docs/protocol.md §2,
//! "Handshake") and of bearer tokens.
//!
//! Every connection to an engine proves, before the engine looks at any
//! other frame, that the peer knows the engine's secret; the engine proves
//! the same back, so a gateway never sends calls to an impostor. Both proofs
//! are HMAC-SHA256 over both sides' fresh nonces, so a recorded handshake
//! cannot be replayed. The secret itself never crosses the wire.
//!
//! ```text
//! gateway                                   engine
//!   Hello {magic, version, role, nonce_c} ──▶
//!                                         ◀── Challenge {version, nonce_e, proof_e}
//!   (checks proof_e)
//!   Auth {proof_c}                        ──▶ (checks proof_c)
//!                                         ◀── Welcome            (or Error, then close)
//! ```
//!
//! The frames after the handshake are not encrypted or signed: the link
//! belongs on loopback or a private network (README, "Security model").

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// The link's protocol version. 1 was the unauthenticated link, 2 had
/// untyped control replies, 3 had no `overloaded` error kind and no
/// `max_queue` in a spec, 4 had no `superseded` and `busy` refusals, 5 no
/// `Forward` frames (internal calls across servers) and no placement in a
/// spec, 6 no `auth` in a spec (an engine of 6 would serve a function that
/// needs an invoke key at its front door without one), 7 no trace context
/// in a `Call` frame (an engine of 7 would read its 25 bytes as the
/// function's name), 8 no `tracestate` in it and no trace context in a
/// `Forward` frame; an engine refuses every other version with a message
/// saying which it speaks.
pub const PROTOCOL_VERSION: u16 = 9;

/// The first bytes of a `Hello` body: tells a Staccato peer from a stray one.
pub const HELLO_MAGIC: [u8; 4] = *b"STCO";

pub const NONCE_LEN: usize = 32;
pub const PROOF_LEN: usize = 32;
pub const HELLO_LEN: usize = 4 + 2 + 1 + 1 + NONCE_LEN;
pub const CHALLENGE_LEN: usize = 2 + 2 + NONCE_LEN + PROOF_LEN;
pub const AUTH_LEN: usize = PROOF_LEN;

/// The largest handshake frame body: anything longer is not a handshake, and
/// an unauthenticated peer must not make the engine allocate more.
pub const HANDSHAKE_BODY_LEN_MAX: usize = 256;

/// What a connection is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Role {
    /// Calls and their results, served by an engine I/O thread.
    Data = 0,
    /// Deploys, removals, status, traces.
    Control = 1,
}

impl Role {
    fn from_byte(b: u8) -> Option<Role> {
        match b {
            0 => Some(Role::Data),
            1 => Some(Role::Control),
            _ => None,
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HandshakeError {
    #[error(
        "the peer does not speak the authenticated engine protocol (a Staccato older than protocol version \
         {PROTOCOL_VERSION}, or not Staccato at all)"
    )]
    NotAHello,
    #[error("protocol version {theirs} is not supported: this side speaks version {PROTOCOL_VERSION}")]
    Version { theirs: u16 },
    #[error("unknown connection role {0}")]
    Role(u8),
    #[error("malformed handshake frame ({0} bytes)")]
    Malformed(usize),
    #[error("authentication failed: the peer does not know this engine's secret (check --engine-token on both sides)")]
    BadProof,
    #[error("no randomness available for a nonce: {0}")]
    Random(String),
}

/// The secret both sides hold. Wraps the token's bytes; never printed.
#[derive(Clone)]
pub struct Secret(Vec<u8>);

impl Secret {
    /// A secret from a token given on the command line, in the environment
    /// or in a file (surrounding white space is not part of it).
    pub fn new(token: &str) -> Option<Secret> {
        let t = token.trim();
        (!t.is_empty()).then(|| Secret(t.as_bytes().to_vec()))
    }

    /// A fresh random secret, for a gateway and engine started together.
    pub fn random() -> Result<Secret, HandshakeError> {
        Ok(Secret(random_token()?.into_bytes()))
    }

    fn mac(&self, label: &[u8], version: u16, role: Role, nonce_c: &[u8], nonce_e: &[u8]) -> [u8; PROOF_LEN] {
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(&self.0).expect("HMAC takes keys of any length");
        m.update(label);
        m.update(&version.to_le_bytes());
        m.update(&[role as u8]);
        m.update(nonce_c);
        m.update(nonce_e);
        m.finalize().into_bytes().into()
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

const ENGINE_LABEL: &[u8] = b"staccato engine proof\0";
const CLIENT_LABEL: &[u8] = b"staccato client proof\0";

pub fn nonce() -> Result<[u8; NONCE_LEN], HandshakeError> {
    let mut n = [0u8; NONCE_LEN];
    getrandom::fill(&mut n).map_err(|e| HandshakeError::Random(e.to_string()))?;
    Ok(n)
}

/// 32 random bytes as 64 hex digits: a token for a file or a flag.
pub fn random_token() -> Result<String, HandshakeError> {
    Ok(nonce()?.iter().map(|b| format!("{b:02x}")).collect())
}

/// The client's first frame body.
pub fn hello(role: Role, nonce_c: &[u8; NONCE_LEN]) -> [u8; HELLO_LEN] {
    let mut b = [0u8; HELLO_LEN];
    b[0..4].copy_from_slice(&HELLO_MAGIC);
    b[4..6].copy_from_slice(&PROTOCOL_VERSION.to_le_bytes());
    b[6] = role as u8;
    b[8..].copy_from_slice(nonce_c);
    b
}

/// What the engine learns from a `Hello`.
#[derive(Debug, PartialEq, Eq)]
pub struct Hello {
    pub role: Role,
    pub nonce_c: [u8; NONCE_LEN],
}

/// Reads a `Hello` body. The version is checked before anything else, so a
/// peer of another version learns which one to speak.
pub fn parse_hello(body: &[u8]) -> Result<Hello, HandshakeError> {
    if body.len() < 6 || body[0..4] != HELLO_MAGIC {
        return Err(HandshakeError::NotAHello);
    }
    let version = u16::from_le_bytes([body[4], body[5]]);
    if version != PROTOCOL_VERSION {
        return Err(HandshakeError::Version { theirs: version });
    }
    if body.len() != HELLO_LEN || body[7] != 0 {
        return Err(HandshakeError::Malformed(body.len()));
    }
    let role = Role::from_byte(body[6]).ok_or(HandshakeError::Role(body[6]))?;
    let mut nonce_c = [0u8; NONCE_LEN];
    nonce_c.copy_from_slice(&body[8..]);
    Ok(Hello { role, nonce_c })
}

/// The engine's answer to a valid `Hello`: its nonce and its proof.
pub fn challenge(secret: &Secret, hello: &Hello, nonce_e: &[u8; NONCE_LEN]) -> [u8; CHALLENGE_LEN] {
    let mut b = [0u8; CHALLENGE_LEN];
    b[0..2].copy_from_slice(&PROTOCOL_VERSION.to_le_bytes());
    b[4..4 + NONCE_LEN].copy_from_slice(nonce_e);
    let proof = secret.mac(ENGINE_LABEL, PROTOCOL_VERSION, hello.role, &hello.nonce_c, nonce_e);
    b[4 + NONCE_LEN..].copy_from_slice(&proof);
    b
}

/// The client checks the engine's `Challenge` and returns the `Auth` body.
pub fn answer(
    secret: &Secret,
    role: Role,
    nonce_c: &[u8; NONCE_LEN],
    challenge: &[u8],
) -> Result<[u8; AUTH_LEN], HandshakeError> {
    if challenge.len() != CHALLENGE_LEN {
        return Err(HandshakeError::Malformed(challenge.len()));
    }
    let version = u16::from_le_bytes([challenge[0], challenge[1]]);
    if version != PROTOCOL_VERSION {
        return Err(HandshakeError::Version { theirs: version });
    }
    let nonce_e = &challenge[4..4 + NONCE_LEN];
    let want = secret.mac(ENGINE_LABEL, PROTOCOL_VERSION, role, nonce_c, nonce_e);
    if !bool::from(want.ct_eq(&challenge[4 + NONCE_LEN..])) {
        return Err(HandshakeError::BadProof);
    }
    Ok(secret.mac(CLIENT_LABEL, PROTOCOL_VERSION, role, nonce_c, nonce_e))
}

/// The engine checks the client's `Auth` body.
pub fn verify(secret: &Secret, hello: &Hello, nonce_e: &[u8; NONCE_LEN], auth: &[u8]) -> Result<(), HandshakeError> {
    if auth.len() != AUTH_LEN {
        return Err(HandshakeError::Malformed(auth.len()));
    }
    let want = secret.mac(CLIENT_LABEL, PROTOCOL_VERSION, hello.role, &hello.nonce_c, nonce_e);
    if bool::from(want.ct_eq(auth)) {
        Ok(())
    } else {
        Err(HandshakeError::BadProof)
    }
}

/// Compares a presented bearer token with the expected one in time that
/// does not depend on where they differ, nor on the expected token's length
/// (both are hashed first).
pub fn token_matches(presented: &[u8], expected: &str) -> bool {
    let a = Sha256::digest(presented);
    let b = Sha256::digest(expected.as_bytes());
    bool::from(a.ct_eq(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(engine: &Secret, client: &Secret, role: Role) -> Result<(), HandshakeError> {
        let nc = nonce()?;
        let h = parse_hello(&hello(role, &nc))?;
        assert_eq!(h.role, role);
        let ne = nonce()?;
        let ch = challenge(engine, &h, &ne);
        let auth = answer(client, role, &nc, &ch)?;
        verify(engine, &h, &ne, &auth)
    }

    #[test]
    fn same_secret_passes_both_ways() {
        let s = Secret::new("s3cret").unwrap();
        assert_eq!(run(&s, &s, Role::Data), Ok(()));
        assert_eq!(run(&s, &s, Role::Control), Ok(()));
    }

    #[test]
    fn a_wrong_secret_fails_on_either_side() {
        let (a, b) = (Secret::new("a").unwrap(), Secret::new("b").unwrap());
        // The client rejects an engine that cannot prove the secret.
        assert_eq!(run(&a, &b, Role::Control), Err(HandshakeError::BadProof));
        // An engine rejects a client that answers without knowing it.
        let nc = nonce().unwrap();
        let h = parse_hello(&hello(Role::Data, &nc)).unwrap();
        let ne = nonce().unwrap();
        assert_eq!(verify(&a, &h, &ne, &[0u8; AUTH_LEN]), Err(HandshakeError::BadProof));
    }

    #[test]
    fn a_recorded_answer_does_not_replay() {
        let s = Secret::new("k").unwrap();
        let nc = nonce().unwrap();
        let h = parse_hello(&hello(Role::Control, &nc)).unwrap();
        let ne1 = nonce().unwrap();
        let auth = answer(&s, Role::Control, &nc, &challenge(&s, &h, &ne1)).unwrap();
        let ne2 = nonce().unwrap();
        assert_eq!(verify(&s, &h, &ne2, &auth), Err(HandshakeError::BadProof));
        // The proof binds the role too.
        let h_data = Hello { role: Role::Data, nonce_c: nc };
        assert_eq!(verify(&s, &h_data, &ne1, &auth), Err(HandshakeError::BadProof));
    }

    #[test]
    fn other_versions_and_old_hellos_are_named() {
        // Protocol 1's hello was a single role byte.
        assert_eq!(parse_hello(&[1]), Err(HandshakeError::NotAHello));
        let mut b = hello(Role::Data, &[0; NONCE_LEN]);
        let other = PROTOCOL_VERSION + 1;
        b[4..6].copy_from_slice(&other.to_le_bytes());
        assert_eq!(parse_hello(&b), Err(HandshakeError::Version { theirs: other }));
        let mut b = hello(Role::Data, &[0; NONCE_LEN]);
        b[6] = 9;
        assert_eq!(parse_hello(&b), Err(HandshakeError::Role(9)));
        assert!(matches!(parse_hello(&b[..20]), Err(HandshakeError::Malformed(20))));
        assert!(HELLO_LEN.max(CHALLENGE_LEN).max(AUTH_LEN) <= HANDSHAKE_BODY_LEN_MAX);
    }

    #[test]
    fn tokens_compare_exactly() {
        assert!(token_matches(b"abc", "abc"));
        assert!(!token_matches(b"abd", "abc"));
        assert!(!token_matches(b"ab", "abc"));
        assert!(!token_matches(b"", "abc"));
        assert!(Secret::new("  ").is_none());
        assert_eq!(random_token().unwrap().len(), 64);
        assert_ne!(random_token().unwrap(), random_token().unwrap());
    }
}
