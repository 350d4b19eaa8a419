//! Floors made of processes, for `bench micro`: what any design pays on
//! this machine before its own work, when its parts are separate
//! processes as Staccato's are (a client, the engine, a worker).
//!
//! * a pipe round trip between two processes, and through a relay: a third
//!   process in the middle that only moves the bytes on, as the engine
//!   sits between a caller and a callee;
//! * a plain HTTP server in a process of its own, and one that relays each
//!   request to a worker process and answers when it replies, as the
//!   engine's front door does.
//!
//! The floors of [`crate::micro`] put both ends in one process (two
//! threads): no address-space switch, which every call between processes
//! pays. The peers here are this binary run again (`staccato bench floor
//! KIND`, hidden), on the vCPUs the benchmark runs on when it starts them.
//! The relays block on one read at a time: the least a middle process can
//! do, less than the engine, which waits on many connections at once.

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, ValueEnum};
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

/// The size of a floor's message: a channel message's, as the pipe
/// floor of [`crate::micro`] sends.
const MSG: usize = wire::message::MESSAGE_LEN;

#[derive(Clone, Copy, ValueEnum)]
pub enum PeerKind {
    /// Echoes MSG-byte messages from stdin to stdout until end of file.
    Echo,
    /// Passes MSG-byte messages from stdin to an echo process and its
    /// replies to stdout.
    Relay,
    /// A plain HTTP server on a loopback port it prints.
    Http,
    /// An HTTP server that relays each request to an echo process and
    /// answers when it replies.
    HttpRelay,
}

#[derive(Args, Clone)]
pub struct FloorArgs {
    kind: PeerKind,
}

/// `staccato bench floor KIND`: a floor's peer process.
pub fn peer(a: FloorArgs) -> Result<()> {
    let stdin = File::from(std::io::stdin().as_fd().try_clone_to_owned()?);
    let stdout = File::from(std::io::stdout().as_fd().try_clone_to_owned()?);
    match a.kind {
        PeerKind::Echo => echo(stdin, stdout),
        PeerKind::Relay => {
            let mut worker = Peer::start(PeerKind::Echo)?;
            let (mut r, mut w) = (stdin, stdout);
            let mut m = [0u8; MSG];
            while r.read_exact(&mut m).is_ok() {
                worker.round_trip(&mut m)?;
                w.write_all(&m)?;
            }
            Ok(())
        }
        PeerKind::Http | PeerKind::HttpRelay => {
            let l = TcpListener::bind("127.0.0.1:0")?;
            writeln!(&stdout, "{}", l.local_addr()?.port())?;
            // Its end is the end of its stdin: when the benchmark closes
            // it, or dies (however), this process goes too.
            std::thread::spawn(move || {
                let mut stdin = stdin;
                let _ = std::io::copy(&mut stdin, &mut std::io::sink());
                std::process::exit(0);
            });
            let mut worker = match a.kind {
                PeerKind::HttpRelay => Some(Peer::start(PeerKind::Echo)?),
                _ => None,
            };
            loop {
                let (s, _) = l.accept()?;
                serve_http(s, &mut |head| match &mut worker {
                    Some(w) => {
                        let mut m = [0u8; MSG];
                        let n = head.len().min(MSG);
                        m[..n].copy_from_slice(&head.as_bytes()[..n]);
                        w.round_trip(&mut m)
                    }
                    None => Ok(()),
                });
            }
        }
    }
}

/// Writes back each MSG-byte message read, until end of file.
pub(crate) fn echo(mut r: impl Read, mut w: impl Write) -> Result<()> {
    let mut m = [0u8; MSG];
    while r.read_exact(&mut m).is_ok() {
        w.write_all(&m)?;
    }
    Ok(())
}

/// Serves one keep-alive HTTP/1.1 connection: every request answered 200
/// with an empty body, after `on_request(its request line)`. Returns when
/// the client closes or a step fails.
pub(crate) fn serve_http(s: TcpStream, on_request: &mut dyn FnMut(&str) -> Result<()>) {
    let _ = s.set_nodelay(true);
    let Ok(mut w) = s.try_clone() else { return };
    let mut r = BufReader::new(s);
    let (mut first, mut line) = (String::new(), String::new());
    loop {
        let mut len = 0usize;
        first.clear();
        loop {
            line.clear();
            if r.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            if line == "\r\n" {
                break;
            }
            if first.is_empty() {
                first.push_str(&line);
            }
            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                len = v.trim().parse().unwrap_or(0);
            }
        }
        let mut body = vec![0u8; len];
        if r.read_exact(&mut body).is_err() || on_request(&first).is_err() {
            return;
        }
        if w.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n").is_err() {
            return;
        }
    }
}

/// A floor's peer process, stopped when dropped.
pub(crate) struct Peer {
    child: Child,
    tx: Option<ChildStdin>,
    rx: ChildStdout,
}

impl Peer {
    pub(crate) fn start(kind: PeerKind) -> Result<Peer> {
        let name = kind.to_possible_value().map(|v| v.get_name().to_string()).unwrap_or_default();
        let mut child = Command::new(std::env::current_exe()?)
            .args(["bench", "floor", &name])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting the {name} floor process"))?;
        let tx = child.stdin.take().ok_or_else(|| anyhow!("{name}: no stdin"))?;
        let rx = child.stdout.take().ok_or_else(|| anyhow!("{name}: no stdout"))?;
        Ok(Peer { child, tx: Some(tx), rx })
    }

    /// Sends `m` and reads the reply into it.
    pub(crate) fn round_trip(&mut self, m: &mut [u8; MSG]) -> Result<()> {
        let tx = self.tx.as_mut().ok_or_else(|| anyhow!("floor peer closed"))?;
        tx.write_all(m)?;
        self.rx.read_exact(m).context("the floor process did not answer")?;
        Ok(())
    }

    /// The loopback address an HTTP peer printed.
    pub(crate) fn http_addr(&mut self) -> Result<SocketAddr> {
        let mut line = Vec::new();
        let mut b = [0u8; 1];
        while self.rx.read(&mut b)? == 1 && b[0] != b'\n' {
            line.push(b[0]);
        }
        let port: u16 = std::str::from_utf8(&line)?.trim().parse().context("the HTTP floor printed no port")?;
        Ok(SocketAddr::from(([127, 0, 0, 1], port)))
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        // End of file on its stdin ends every peer (and a relay's worker,
        // whose stdin the relay holds); one that has not gone within a
        // second is killed.
        self.tx.take();
        let until = Instant::now() + Duration::from_secs(1);
        while Instant::now() < until {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// MSG-byte round trips from this process to a `kind` peer (echo: two
/// processes; relay: three), `n` timed after n/10 untimed.
pub(crate) fn pipe_round_trips(kind: PeerKind, n: usize) -> Result<Vec<u64>> {
    if !matches!(kind, PeerKind::Echo | PeerKind::Relay) {
        bail!("pipe round trips go to an echo or a relay");
    }
    let mut p = Peer::start(kind)?;
    let mut m = [7u8; MSG];
    crate::micro::timed(n, || p.round_trip(&mut m))
}
