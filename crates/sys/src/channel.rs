//! Message channels between the engine and a worker: two FIFOs per worker
//! carrying 1 KB messages (docs/protocol.md §1, Nightcore §4.1).

use crate::clock::monotonic_ns;
use crate::pipe::{mkfifo, poll_readable, set_pipe_bytes};
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;
pub use wire::message::{Message, MESSAGE_LEN};

/// Paths of a channel's two FIFOs (docs/protocol.md "Channels and FIFOs").
pub fn channel_paths(fn_dir: &Path, id: u32) -> (PathBuf, PathBuf) {
    (fn_dir.join(format!("{id}.e2w")), fn_dir.join(format!("{id}.w2e")))
}

/// The engine's ends of a channel: `tx` writes to the worker, `rx` reads
/// from it. Made by [`EngineChannel::create`] before the peer process opens
/// its ends.
pub struct EngineChannel {
    pub tx: File,
    pub rx: File,
}

/// Bigger pipes hold more queued messages (fan-out replies) before a writer
/// would see EAGAIN. 1 MiB = 1024 messages; the kernel may cap it lower for
/// an unprivileged user, which is fine.
const PIPE_SIZE: libc::c_int = 1 << 20;

impl EngineChannel {
    /// Makes both FIFOs and opens the engine's ends: `e2w` read-write (so the
    /// peer's blocking open for reading returns at once, and our writes never
    /// fail with EPIPE), `w2e` read-only and non-blocking (so the peer's
    /// blocking open for writing returns at once; EOF there means the peer
    /// died, since nobody else holds a write end).
    pub fn create(fn_dir: &Path, id: u32) -> io::Result<EngineChannel> {
        let (e2w, w2e) = channel_paths(fn_dir, id);
        mkfifo(&e2w)?;
        mkfifo(&w2e)?;
        // The directory is the function's: between mkfifo and open it could
        // swap a FIFO for a link to a host file. Never followed, and only a
        // FIFO is taken.
        let tx = open_fifo(OpenOptions::new().read(true).write(true), &e2w)?;
        let rx = open_fifo(OpenOptions::new().read(true), &w2e)?;
        set_pipe_bytes(&tx, PIPE_SIZE);
        set_pipe_bytes(&rx, PIPE_SIZE);
        Ok(EngineChannel { tx, rx })
    }

    pub fn remove_files(fn_dir: &Path, id: u32) {
        let (e2w, w2e) = channel_paths(fn_dir, id);
        let _ = std::fs::remove_file(e2w);
        let _ = std::fs::remove_file(w2e);
    }
}

/// Opens `path` (non-blocking, not following a link) and checks it is a FIFO.
fn open_fifo(o: &mut OpenOptions, path: &Path) -> io::Result<File> {
    use std::os::unix::fs::FileTypeExt;
    let f = o.custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW).open(path)?;
    if !f.metadata()?.file_type().is_fifo() {
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("{} is not a FIFO", path.display())));
    }
    Ok(f)
}

/// Opens a channel from the worker's side (used by tests and the benches;
/// the real workers are in the language runtimes).
pub fn open_worker_side(fn_dir: &Path, id: u32) -> io::Result<(File, File)> {
    let (e2w, w2e) = channel_paths(fn_dir, id);
    let rx = OpenOptions::new().read(true).open(e2w)?;
    let tx = OpenOptions::new().write(true).open(w2e)?;
    Ok((rx, tx))
}

/// Writes one whole message. A write of at most PIPE_BUF bytes to a pipe is
/// all-or-nothing, so a short write cannot happen; EAGAIN comes back as
/// `WouldBlock` and nothing was written.
pub fn write_message(mut f: &File, m: &Message) -> io::Result<()> {
    let n = f.write(&m.buf)?;
    if n != MESSAGE_LEN {
        return Err(io::Error::other(format!("short pipe write of {n} bytes")));
    }
    Ok(())
}

/// Accumulates bytes read from a pipe and yields whole messages. Writers
/// only write whole messages, but a reader's buffer may still end mid-message
/// (e.g. after a partial read into a too-small buffer), so keep the tail.
///
/// `buf[start..end]` holds what was read and not yet taken; the rest of
/// `buf` is initialised space that the next read reuses. It is zeroed only
/// when it grows: zeroing a batch's 16 KB before every read cost ~3% of an
/// engine I/O thread's time on internal calls.
#[derive(Default)]
pub struct MessageReader {
    buf: Vec<u8>,
    start: usize,
    end: usize,
}

/// What one non-blocking read round produced.
#[derive(Debug, PartialEq, Eq)]
pub enum ReadStatus {
    /// Read everything available; more may come later.
    Drained,
    /// The writer side is closed: the peer is gone.
    Eof,
}

/// Up to this many messages are read with one syscall, batching under load.
const READ_BATCH: usize = 16;

/// Space kept between reads once a burst has been taken (a burst may
/// have grown it further).
const KEEP: usize = 4 * READ_BATCH * MESSAGE_LEN;

impl MessageReader {
    /// Reads everything currently available from a non-blocking fd.
    pub fn fill(&mut self, mut f: &File) -> io::Result<ReadStatus> {
        if self.start == self.end {
            (self.start, self.end) = (0, 0);
            if self.buf.len() > KEEP {
                self.buf.truncate(KEEP);
                self.buf.shrink_to(KEEP);
            }
        } else if self.start > 0 {
            // A partial message (which writers never leave): to the front.
            self.buf.copy_within(self.start..self.end, 0);
            (self.start, self.end) = (0, self.end - self.start);
        }
        loop {
            if self.buf.len() - self.end < READ_BATCH * MESSAGE_LEN {
                self.buf.resize(self.end + READ_BATCH * MESSAGE_LEN, 0);
            }
            let room = self.buf.len() - self.end;
            match f.read(&mut self.buf[self.end..]) {
                Ok(0) => return Ok(ReadStatus::Eof),
                Ok(n) => {
                    self.end += n;
                    if n < room {
                        return Ok(ReadStatus::Drained);
                    }
                }
                Err(e) => {
                    return match e.kind() {
                        io::ErrorKind::WouldBlock => Ok(ReadStatus::Drained),
                        io::ErrorKind::Interrupted => continue,
                        _ => Err(e),
                    };
                }
            }
        }
    }

    /// The next whole message read, if any.
    pub fn next_message(&mut self) -> Option<Message> {
        if self.end - self.start < MESSAGE_LEN {
            return None;
        }
        let mut m = Message::default();
        m.buf.copy_from_slice(&self.buf[self.start..self.start + MESSAGE_LEN]);
        self.start += MESSAGE_LEN;
        Some(m)
    }
}

/// Reads one whole message from a non-blocking fd, spinning on `read` for
/// up to `spin` before blocking in poll. Spinning wins when the reply is
/// due within microseconds and the peer runs on another vCPU: a blocked
/// vCPU must be woken by an IPI, which costs ~20 µs on this kind of guest.
pub fn read_message_spin(mut f: &File, m: &mut Message, spin: Duration) -> io::Result<()> {
    let deadline = if spin.is_zero() { 0 } else { monotonic_ns() + spin.as_nanos() as u64 };
    let mut got = 0;
    let mut iter = 0u32;
    loop {
        match f.read(&mut m.buf[got..]) {
            Ok(0) => return Err(io::Error::from(io::ErrorKind::UnexpectedEof)),
            Ok(n) => {
                got += n;
                if got == MESSAGE_LEN {
                    return Ok(());
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                iter += 1;
                if deadline == 0 || (iter.is_multiple_of(64) && monotonic_ns() > deadline) {
                    poll_readable(f.as_raw_fd())?;
                } else {
                    std::hint::spin_loop();
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipe::set_nonblocking;
    use wire::message::{Header, Kind};

    fn tmpdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("staccato-sys-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("shm")).expect("tmpdir");
        d
    }

    #[test]
    fn channel_file_names_are_the_contracts() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../testvectors/contract_v1.json");
        let c: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).expect("contract")).expect("JSON");
        let dir = Path::new("/ipc/f.1");
        for f in c["channel_files"].as_array().expect("channel_files") {
            let id = f["id"].as_u64().expect("id") as u32;
            let (e2w, w2e) = channel_paths(dir, id);
            assert_eq!(e2w, dir.join(f["e2w"].as_str().expect("e2w")));
            assert_eq!(w2e, dir.join(f["w2e"].as_str().expect("w2e")));
        }
    }

    #[test]
    fn channel_round_trip_and_eof() {
        let d = tmpdir("chan");
        let eng = EngineChannel::create(&d, 5).expect("create");
        let (wrx, wtx) = open_worker_side(&d, 5).expect("open");
        let mut h = Header::new(Kind::WorkerHello);
        h.worker_id = 5;
        write_message(&wtx, &Message::new(&h, &[])).expect("write");
        let mut r = MessageReader::default();
        assert_eq!(r.fill(&eng.rx).expect("fill"), ReadStatus::Drained);
        let m = r.next_message().expect("a message");
        assert_eq!(m.header().expect("valid").worker_id, 5);
        assert!(r.next_message().is_none());
        // Engine to worker, read with the spinning reader.
        write_message(&eng.tx, &Message::new(&Header::new(Kind::StopWorker), &[])).expect("write");
        let mut got = Message::default();
        set_nonblocking(&wrx, true).expect("nonblock");
        read_message_spin(&wrx, &mut got, Duration::from_micros(50)).expect("read");
        assert_eq!(got.header().expect("valid").kind, Kind::StopWorker);
        // A burst larger than a read batch, then a message split across
        // reads: each comes out whole, in order.
        for i in 0..(READ_BATCH as u32 * 3 + 1) {
            let mut h = Header::new(Kind::WorkerHello);
            h.worker_id = i;
            write_message(&wtx, &Message::new(&h, &[])).expect("write");
        }
        assert_eq!(r.fill(&eng.rx).expect("fill"), ReadStatus::Drained);
        for i in 0..(READ_BATCH as u32 * 3 + 1) {
            assert_eq!(r.next_message().expect("a message").header().expect("valid").worker_id, i);
        }
        assert!(r.next_message().is_none());
        let mut h = Header::new(Kind::WorkerHello);
        h.worker_id = 77;
        let m = Message::new(&h, &[]);
        (&wtx).write_all(&m.buf[..100]).expect("write");
        assert_eq!(r.fill(&eng.rx).expect("fill"), ReadStatus::Drained);
        assert!(r.next_message().is_none(), "a partial message is kept, not yielded");
        (&wtx).write_all(&m.buf[100..]).expect("write");
        assert_eq!(r.fill(&eng.rx).expect("fill"), ReadStatus::Drained);
        assert_eq!(r.next_message().expect("the whole message").header().expect("valid").worker_id, 77);
        // The worker going away is an EOF for the engine.
        drop(wtx);
        drop(wrx);
        assert_eq!(r.fill(&eng.rx).expect("fill"), ReadStatus::Eof);
        let _ = std::fs::remove_dir_all(d);
    }
}
