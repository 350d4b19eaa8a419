//! A misbehaving server for the clients' tests.

use crate::Requester;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A server that answers the first request on each connection, then reads
/// the second without answering and closes. Returns its address and the
/// count of request lines it has read: a client that resent the second
/// request would make it 3.
pub fn answers_once_then_hangs_up() -> (SocketAddr, Arc<AtomicUsize>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let requests = Arc::new(AtomicUsize::new(0));
    let seen = requests.clone();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { return };
            let mut served = 0;
            let mut buf = [0u8; 4096];
            while let Ok(n) = s.read(&mut buf) {
                if n == 0 {
                    break;
                }
                seen.fetch_add(buf[..n].windows(9).filter(|w| w == b"HTTP/1.1\r").count(), Ordering::SeqCst);
                served += 1;
                if served == 1 {
                    let _ = s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok");
                } else {
                    break; // read the request, answer nothing, close
                }
            }
        }
    });
    (addr, requests)
}

/// Checks that the client `connect` makes never sends a POST twice: the
/// server answers a GET, then takes the POST and hangs up; the client must
/// report the POST failed, and the server must have seen it once.
pub fn check_a_sent_post_is_never_retried<C: Requester>(connect: impl FnOnce(&str) -> C) {
    let (addr, requests) = answers_once_then_hangs_up();
    let mut c = connect(&format!("http://{addr}"));
    assert_eq!(c.request("GET", "/a", b"").unwrap().body, b"ok");
    assert!(c.request("POST", "/function/f", b"input").is_err());
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(requests.load(Ordering::SeqCst), 2, "the POST was sent again");
}
