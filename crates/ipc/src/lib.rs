//! The OS primitives Staccato's processes talk through: FIFO message
//! channels, shared-memory payload files, clocks, CPU affinity and process
//! control.
//!
//! Architecture invariant: this is the only crate with `unsafe` code. Every
//! block says which invariant it relies on.
#![deny(clippy::undocumented_unsafe_blocks)]

use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use wire::message::{Message, MESSAGE_LEN};

/// Creates a FIFO at `path` (mode 0600). An existing file there is replaced.
pub fn mkfifo(path: &Path) -> io::Result<()> {
    let _ = std::fs::remove_file(path);
    let c = CString::new(path.as_os_str().as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: `c` is a valid NUL-terminated string that outlives the call;
    // mkfifo only reads it.
    let rc = unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

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
        let tx = OpenOptions::new().read(true).write(true).custom_flags(libc::O_NONBLOCK).open(&e2w)?;
        let rx = OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(&w2e)?;
        set_pipe_size(&tx);
        set_pipe_size(&rx);
        Ok(EngineChannel { tx, rx })
    }

    pub fn remove_files(fn_dir: &Path, id: u32) {
        let (e2w, w2e) = channel_paths(fn_dir, id);
        let _ = std::fs::remove_file(e2w);
        let _ = std::fs::remove_file(w2e);
    }
}

fn set_pipe_size(f: &File) {
    // SAFETY: F_SETPIPE_SZ takes an int argument and touches no memory of
    // ours; the fd is open for the duration of the call. Failure is harmless
    // (the pipe keeps its default size), so the result is ignored.
    unsafe {
        libc::fcntl(f.as_raw_fd(), libc::F_SETPIPE_SZ, PIPE_SIZE);
    }
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
#[derive(Default)]
pub struct MessageReader {
    buf: Vec<u8>,
    start: usize,
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

impl MessageReader {
    /// Reads everything currently available from a non-blocking fd.
    pub fn fill(&mut self, mut f: &File) -> io::Result<ReadStatus> {
        if self.start > 0 && self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
        }
        loop {
            let old = self.buf.len();
            self.buf.resize(old + READ_BATCH * MESSAGE_LEN, 0);
            match f.read(&mut self.buf[old..]) {
                Ok(0) => {
                    self.buf.truncate(old);
                    return Ok(ReadStatus::Eof);
                }
                Ok(n) => {
                    self.buf.truncate(old + n);
                    if n < READ_BATCH * MESSAGE_LEN {
                        return Ok(ReadStatus::Drained);
                    }
                }
                Err(e) => {
                    self.buf.truncate(old);
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
        if self.buf.len() - self.start < MESSAGE_LEN {
            return None;
        }
        let mut m = Message::default();
        m.buf.copy_from_slice(&self.buf[self.start..self.start + MESSAGE_LEN]);
        self.start += MESSAGE_LEN;
        if self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
        }
        Some(m)
    }
}

/// Shared-memory payload files (docs/protocol.md "Shared-memory payload
/// files"). The IPC directory is a tmpfs, so these are memory: plain
/// write/read cost one copy each and need no unsafe mapping.
pub mod shm {
    use super::*;

    pub fn path(fn_dir: &Path, name: &str) -> PathBuf {
        fn_dir.join("shm").join(name)
    }

    /// Writes a whole payload file before the message announcing it is sent.
    pub fn write(fn_dir: &Path, name: &str, data: &[u8]) -> io::Result<()> {
        std::fs::write(path(fn_dir, name), data)
    }

    /// Reads a payload file and unlinks it: the receiver owns it.
    pub fn take(fn_dir: &Path, name: &str, expected_len: usize) -> io::Result<Vec<u8>> {
        let p = path(fn_dir, name);
        let data = std::fs::read(&p);
        let _ = std::fs::remove_file(&p);
        let data = data?;
        if data.len() != expected_len {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("payload file {name} has {} bytes, message said {expected_len}", data.len()),
            ));
        }
        Ok(data)
    }

    /// Moves a payload file from one function's directory to another's
    /// (internal calls forward payloads without copying them).
    pub fn forward(from_dir: &Path, to_dir: &Path, name: &str) -> io::Result<()> {
        if from_dir == to_dir {
            return Ok(());
        }
        std::fs::rename(path(from_dir, name), path(to_dir, name))
    }

    pub fn remove(fn_dir: &Path, name: &str) {
        let _ = std::fs::remove_file(path(fn_dir, name));
    }

    /// Removes payload files whose names start with `prefix` (those of calls
    /// a dead worker made, whose call ids begin with its worker id).
    pub fn remove_prefixed(fn_dir: &Path, prefix: &str) {
        if let Ok(dir) = std::fs::read_dir(fn_dir.join("shm")) {
            for e in dir.flatten() {
                if e.file_name().to_string_lossy().starts_with(prefix) {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
    }
}

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec on our stack; clock_gettime
    // writes only into it. The clocks used here always exist on Linux.
    unsafe {
        libc::clock_gettime(clock, &mut ts);
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// CLOCK_MONOTONIC in nanoseconds: comparable across processes on one
/// machine, so the engine and workers can timestamp the same call.
pub fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// Wall-clock microseconds since the Unix epoch (the unit of `deadline_us`).
pub fn unix_us() -> u64 {
    clock_ns(libc::CLOCK_REALTIME) / 1000
}

/// Number of CPUs this process may run on.
pub fn cpus_allowed() -> Vec<usize> {
    // SAFETY: cpu_set_t is plain bits; all-zero is a valid (empty) set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: we pass the true size of `set`, which the kernel fills in.
    let rc = unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if rc != 0 {
        return vec![0];
    }
    // SAFETY: CPU_ISSET reads bit `i` of the set we own; i < CPU_SETSIZE.
    (0..libc::CPU_SETSIZE as usize).filter(|&i| unsafe { libc::CPU_ISSET(i, &set) }).collect()
}

/// Pins thread or process `pid` (0 = the calling thread) to `cpus`.
pub fn set_affinity(pid: i32, cpus: &[usize]) -> io::Result<()> {
    // SAFETY: cpu_set_t is plain bits; all-zero is a valid (empty) set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in cpus {
        // SAFETY: CPU_SET writes bit `c` of the set we own; callers pass
        // CPU numbers from `cpus_allowed`, all below CPU_SETSIZE.
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    // SAFETY: `set` is initialised and we pass its true size.
    let rc = unsafe { libc::sched_setaffinity(pid, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Sends SIGKILL to `pid`. Used to recycle a worker whose call timed out.
pub fn kill(pid: u32) -> io::Result<()> {
    if pid == 0 || pid > i32::MAX as u32 {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    }
    // SAFETY: kill has no memory effects; pid > 0 so it targets one process,
    // never a process group or every process.
    let rc = unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Makes a child started from `cmd` receive SIGKILL when the thread that
/// spawned it exits, so launchers never outlive the engine.
pub fn kill_child_with_parent(cmd: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs in the forked child before exec and calls
    // only prctl, which is async-signal-safe and allocates nothing.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// An anonymous pipe (for the benchmark's raw ping-pong floor).
pub fn pipe() -> io::Result<(File, File)> {
    let mut fds: [RawFd; 2] = [-1; 2];
    // SAFETY: `fds` is a writable array of two ints, as pipe2 requires.
    let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pipe2 succeeded, so both fds are open and owned by nobody else.
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    Ok((File::from(r), File::from(w)))
}

/// Sets or clears O_NONBLOCK on `f`.
pub fn set_nonblocking(f: &File, on: bool) -> io::Result<()> {
    // SAFETY: F_GETFL/F_SETFL take and return ints; the fd is open.
    unsafe {
        let flags = libc::fcntl(f.as_raw_fd(), libc::F_GETFL);
        if flags < 0 {
            return Err(io::Error::last_os_error());
        }
        let flags = if on { flags | libc::O_NONBLOCK } else { flags & !libc::O_NONBLOCK };
        if libc::fcntl(f.as_raw_fd(), libc::F_SETFL, flags) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
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

fn poll_readable(fd: RawFd) -> io::Result<()> {
    let mut pfd = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    loop {
        // SAFETY: `pfd` is one valid pollfd we own, and we pass count 1.
        let rc = unsafe { libc::poll(&mut pfd, 1, -1) };
        if rc >= 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wire::message::{Header, Kind};

    fn tmpdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("staccato-ipc-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("shm")).expect("tmpdir");
        d
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
        // The worker going away is an EOF for the engine.
        drop(wtx);
        drop(wrx);
        assert_eq!(r.fill(&eng.rx).expect("fill"), ReadStatus::Eof);
        let _ = std::fs::remove_dir_all(d);
    }

    #[test]
    fn shm_take_checks_length_and_unlinks() {
        let d = tmpdir("shm");
        shm::write(&d, "a.i", b"hello").expect("write");
        assert!(shm::take(&d, "a.i", 4).is_err());
        assert!(!shm::path(&d, "a.i").exists());
        shm::write(&d, "b.i", b"hello").expect("write");
        assert_eq!(shm::take(&d, "b.i", 5).expect("take"), b"hello");
        let _ = std::fs::remove_dir_all(d);
    }
}
