//! The gateway–engine handshake over a blocking stream, for both ends (the
//! gateway's async data link runs the same steps on tokio). See [`crate::auth`]
//! for what is proved and docs/protocol.md §2 for the frames.

use crate::auth::{self, HandshakeError, Role, Secret, HANDSHAKE_BODY_LEN_MAX};
use std::io::{self, Read, Write};
use wire::frame::{frame, FrameHeader, FrameKind, FRAME_HEADER_LEN};

#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("{0}")]
    Handshake(#[from] HandshakeError),
    /// The engine explained why it closed the connection.
    #[error("the engine refused the connection: {0}")]
    Refused(String),
    #[error("unexpected {0:?} frame during the handshake")]
    Unexpected(FrameKind),
}

/// Reads one frame whose body may be at most `body_max` bytes: before the
/// peer is authenticated, it must not make us allocate much.
pub fn read_frame<R: Read>(r: &mut R, body_max: usize) -> Result<(FrameHeader, Vec<u8>), LinkError> {
    let mut hb = [0u8; FRAME_HEADER_LEN];
    r.read_exact(&mut hb)?;
    let h = FrameHeader::decode(&hb).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    if h.body_len as usize > body_max {
        return Err(HandshakeError::Malformed(h.body_len as usize).into());
    }
    let mut body = vec![0u8; h.body_len as usize];
    r.read_exact(&mut body)?;
    Ok((h, body))
}

/// The gateway's side. `thread` is the data connection's preferred engine
/// I/O thread (header field `c` of the `Hello`).
pub fn client<S: Read + Write>(s: &mut S, secret: &Secret, role: Role, thread: u32) -> Result<(), LinkError> {
    let nonce_c = auth::nonce()?;
    let mut h = FrameHeader::new(FrameKind::Hello, 0, auth::HELLO_LEN);
    h.set_hello_thread(thread);
    let mut out = h.encode().to_vec();
    out.extend_from_slice(&auth::hello(role, &nonce_c));
    s.write_all(&out)?;
    let (h, body) = read_frame(s, HANDSHAKE_BODY_LEN_MAX)?;
    let proof = match h.kind {
        FrameKind::Challenge => auth::answer(secret, role, &nonce_c, &body)?,
        FrameKind::Error => return Err(LinkError::Refused(String::from_utf8_lossy(&body).into_owned())),
        k => return Err(LinkError::Unexpected(k)),
    };
    s.write_all(&frame(FrameKind::Auth, &proof))?;
    let (h, body) = read_frame(s, HANDSHAKE_BODY_LEN_MAX)?;
    match h.kind {
        FrameKind::Welcome => Ok(()),
        FrameKind::Error => Err(LinkError::Refused(String::from_utf8_lossy(&body).into_owned())),
        k => Err(LinkError::Unexpected(k)),
    }
}

/// What an authenticated connection is for.
#[derive(Debug, PartialEq, Eq)]
pub struct Accepted {
    pub role: Role,
    /// The data connection's preferred I/O thread.
    pub thread: u32,
}

/// The engine's side: nothing but handshake frames is read until the peer
/// has proved it knows `secret`. A peer that fails is told why (an `Error`
/// frame) before the connection closes.
pub fn engine<S: Read + Write>(s: &mut S, secret: &Secret) -> Result<Accepted, LinkError> {
    let refuse = |s: &mut S, e: LinkError| -> LinkError {
        let _ = s.write_all(&frame(FrameKind::Error, e.to_string().as_bytes()));
        e
    };
    let (h, body) = match read_frame(s, HANDSHAKE_BODY_LEN_MAX) {
        Ok(f) => f,
        Err(e) => return Err(refuse(s, e)),
    };
    if h.kind != FrameKind::Hello {
        return Err(refuse(s, LinkError::Unexpected(h.kind)));
    }
    let hello = auth::parse_hello(&body).map_err(|e| refuse(s, e.into()))?;
    let nonce_e = auth::nonce()?;
    s.write_all(&frame(FrameKind::Challenge, &auth::challenge(secret, &hello, &nonce_e)))?;
    let (h2, body) = read_frame(s, HANDSHAKE_BODY_LEN_MAX).map_err(|e| refuse(s, e))?;
    if h2.kind != FrameKind::Auth {
        return Err(refuse(s, LinkError::Unexpected(h2.kind)));
    }
    auth::verify(secret, &hello, &nonce_e, &body).map_err(|e| refuse(s, e.into()))?;
    s.write_all(&frame(FrameKind::Welcome, &[]))?;
    Ok(Accepted { role: hello.role, thread: h.hello_thread() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};

    fn pair(engine_secret: &str, client_secret: &str) -> (Result<Accepted, LinkError>, Result<(), LinkError>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let es = Secret::new(engine_secret).unwrap();
        let t = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            engine(&mut s, &es)
        });
        let mut c = TcpStream::connect(addr).unwrap();
        let cr = client(&mut c, &Secret::new(client_secret).unwrap(), Role::Data, 3);
        // A client that gave up closes; the engine then sees the end.
        drop(c);
        (t.join().unwrap(), cr)
    }

    #[test]
    fn handshake_over_tcp() {
        let (e, c) = pair("k", "k");
        assert_eq!(e.unwrap(), Accepted { role: Role::Data, thread: 3 });
        c.unwrap();
        let (e, c) = pair("k", "wrong");
        assert!(e.is_err() && c.is_err(), "{e:?} {c:?}");
        // The client notices first: the engine's proof is wrong.
        assert!(c.unwrap_err().to_string().contains("authentication failed"));
    }

    #[test]
    fn protocol_1_hello_gets_an_explanation() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let t = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            engine(&mut s, &Secret::new("k").unwrap()).map_err(|e| e.to_string())
        });
        let mut c = TcpStream::connect(addr).unwrap();
        // What a version-1 gateway sent: a Hello with one role byte.
        let mut old = FrameHeader::new(FrameKind::Hello, 0, 1).encode().to_vec();
        old.push(1);
        c.write_all(&old).unwrap();
        let (h, body) = read_frame(&mut c, 4096).unwrap();
        assert_eq!(h.kind, FrameKind::Error);
        let why = String::from_utf8_lossy(&body);
        assert!(why.contains(&format!("protocol version {}", crate::auth::PROTOCOL_VERSION)), "{why}");
        assert!(t.join().unwrap().is_err());
    }

    #[test]
    fn an_unauthenticated_peer_cannot_make_the_engine_allocate() {
        let mut h = FrameHeader::new(FrameKind::Hello, 0, 0);
        h.body_len = 60 << 20;
        let mut bytes = std::io::Cursor::new(h.encode().to_vec());
        assert!(matches!(read_frame(&mut bytes, HANDSHAKE_BODY_LEN_MAX), Err(LinkError::Handshake(_))));
    }
}
