//! Capped output logs: what functions and builds print reaches the host's
//! disk only through here.
//!
//! A function never holds a host file (builds log to their own tmpfs). Its stdout and
//! stderr are the write end of a FIFO the engine made and holds open for
//! reading; one thread drains every FIFO into `<name>.log`, rotating it to
//! `<name>.log.1` past [`Caps::file_bytes`] and dropping what comes faster
//! than [`Caps::rate_bytes`] per second (a line in the log says how much).
//! So one log uses at most twice its file cap on disk however much is
//! printed. The drain reads as fast as output comes and throws the excess
//! away rather than pushing back, in turns of at most [`TURN_BYTES`] per
//! stream, so one function that never stops printing cannot make the
//! others' writers wait.

use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Registry, Token, Waker};
use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// How much of a log is kept and how fast it may grow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caps {
    /// The log is rotated once it would grow past this (one older file is kept).
    pub file_bytes: u64,
    /// Output beyond this many bytes in a second is dropped.
    pub rate_bytes: u64,
}

impl Caps {
    /// 10 MiB per file (20 MiB on disk with the rotated one), 1 MiB/s.
    pub const DEFAULT: Caps = Caps { file_bytes: 10 << 20, rate_bytes: 1 << 20 };
    /// The smallest caps accepted: one read of the drain must fit a file.
    pub const MIN: Caps = Caps { file_bytes: READ_CHUNK as u64, rate_bytes: 4096 };

    pub fn check(&self) -> Result<(), crate::Error> {
        if self.file_bytes < Caps::MIN.file_bytes {
            return Err(crate::Error::Config(format!(
                "a log file cap of {} bytes: at least {}",
                self.file_bytes,
                Caps::MIN.file_bytes
            )));
        }
        if self.rate_bytes < Caps::MIN.rate_bytes {
            return Err(crate::Error::Config(format!(
                "a log rate of {} bytes/s: at least {}",
                self.rate_bytes,
                Caps::MIN.rate_bytes
            )));
        }
        Ok(())
    }
}

const READ_CHUNK: usize = 64 << 10;
/// The FIFO's buffer: what a writer may print in a burst before the drain runs.
const PIPE_BYTES: i32 = 256 << 10;
const WAKE: Token = Token(0);
/// What one stream may have read at a turn before the others get theirs: a
/// function that never stops printing cannot starve the rest (their
/// writers would block on full FIFOs).
const TURN_BYTES: usize = 4 * PIPE_BYTES as usize;
const TICK: Duration = Duration::from_secs(1);

/// The drain thread and the streams it serves.
pub struct Logs {
    inner: Arc<LogsInner>,
}

struct LogsInner {
    registry: Registry,
    waker: Waker,
    streams: Mutex<HashMap<Token, Weak<Stream>>>,
    next: AtomicUsize,
    stop: AtomicBool,
}

impl Logs {
    /// Starts the drain thread (named `thread`).
    pub fn start(thread: &str) -> io::Result<Logs> {
        let poll = Poll::new()?;
        let inner = Arc::new(LogsInner {
            registry: poll.registry().try_clone()?,
            waker: Waker::new(poll.registry(), WAKE)?,
            streams: Mutex::new(HashMap::new()),
            next: AtomicUsize::new(1),
            stop: AtomicBool::new(false),
        });
        let run = inner.clone();
        std::thread::Builder::new().name(thread.into()).spawn(move || drain_loop(poll, &run))?;
        Ok(Logs { inner })
    }

    /// A FIFO at `fifo` (replacing anything there) drained into `file`.
    /// The stream lives as long as its last `Arc`; then the FIFO goes.
    pub fn open(&self, fifo: &Path, file: &Path, caps: Caps) -> io::Result<Arc<Stream>> {
        caps.check().map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        sys::pipe::mkfifo(fifo)?;
        // Read and write: the FIFO never reads end-of-file while writers
        // come and go, and opening it for writing never blocks.
        let rx =
            OpenOptions::new().read(true).write(true).custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW).open(fifo)?;
        sys::pipe::set_pipe_bytes(&rx, PIPE_BYTES);
        let sink = Sink::open(file, caps)?;
        let token = Token(self.inner.next.fetch_add(1, Ordering::Relaxed));
        let stream = Arc::new(Stream {
            fifo: fifo.to_path_buf(),
            file: file.to_path_buf(),
            token,
            logs: Arc::downgrade(&self.inner),
            state: Mutex::new(State { rx, sink }),
        });
        self.inner.streams.lock().unwrap_or_else(|p| p.into_inner()).insert(token, Arc::downgrade(&stream));
        self.inner.registry.register(&mut SourceFd(&stream.rx_fd()), token, Interest::READABLE)?;
        Ok(stream)
    }
}

impl Drop for Logs {
    fn drop(&mut self) {
        self.inner.stop.store(true, Ordering::Release);
        let _ = self.inner.waker.wake();
    }
}

fn drain_loop(mut poll: Poll, inner: &LogsInner) {
    let mut events = Events::with_capacity(256);
    let mut buf = vec![0u8; READ_CHUNK];
    let mut last_tick = Instant::now();
    // Streams whose turn ended with data left: events are edge-triggered,
    // so nothing would announce that data again.
    let mut pending: Vec<Arc<Stream>> = Vec::new();
    while !inner.stop.load(Ordering::Acquire) {
        let wait = if pending.is_empty() { TICK } else { Duration::ZERO };
        if let Err(e) = poll.poll(&mut events, Some(wait)) {
            if e.kind() != io::ErrorKind::Interrupted {
                log::error!("log drain: {e}");
                std::thread::sleep(TICK);
            }
            continue;
        }
        let mut ready: Vec<Arc<Stream>> = {
            let streams = inner.streams.lock().unwrap_or_else(|p| p.into_inner());
            events.iter().filter(|e| e.token() != WAKE).filter_map(|e| streams.get(&e.token())?.upgrade()).collect()
        };
        ready.append(&mut pending);
        ready.sort_by_key(|s| s.token);
        ready.dedup_by_key(|s| s.token);
        for s in ready {
            if s.lock().fill(&mut buf, TURN_BYTES) {
                pending.push(s);
            }
        }
        if last_tick.elapsed() >= TICK {
            last_tick = Instant::now();
            let all: Vec<Arc<Stream>> = {
                let mut streams = inner.streams.lock().unwrap_or_else(|p| p.into_inner());
                streams.retain(|_, w| w.strong_count() > 0);
                streams.values().filter_map(Weak::upgrade).collect()
            };
            for s in all {
                s.lock().sink.tick(Instant::now());
            }
        }
    }
}

/// One log: its FIFO and the file it is drained into.
pub struct Stream {
    fifo: PathBuf,
    file: PathBuf,
    token: Token,
    logs: Weak<LogsInner>,
    state: Mutex<State>,
}

struct State {
    rx: File,
    sink: Sink,
}

impl State {
    /// Reads what the FIFO holds now into the sink, up to `budget` bytes;
    /// true if the budget ran out first (more may be waiting).
    fn fill(&mut self, buf: &mut [u8], budget: usize) -> bool {
        let mut read = 0;
        while read < budget {
            match (&self.rx).read(buf) {
                Ok(0) => return false,
                Ok(n) => {
                    read += n;
                    self.sink.accept(&buf[..n], Instant::now());
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return false,
                Err(e) => {
                    log::warn!("log drain of {}: {e}", self.sink.path.display());
                    return false;
                }
            }
        }
        true
    }
}

impl Stream {
    /// The FIFO writers open (bind it into a container, or see [`Stream::writer`]).
    pub fn fifo(&self) -> &Path {
        &self.fifo
    }

    /// The current log file.
    pub fn path(&self) -> &Path {
        &self.file
    }

    /// A write end for a process's stdout or stderr.
    pub fn writer(&self) -> io::Result<File> {
        OpenOptions::new().write(true).custom_flags(libc::O_NOFOLLOW).open(&self.fifo)
    }

    /// Moves what is in the FIFO now into the file: call before reading
    /// the file to explain a failure that just happened.
    pub fn drain(&self) {
        let mut buf = vec![0u8; READ_CHUNK];
        let mut s = self.lock();
        // What a full FIFO holds, not what a writer keeps adding meanwhile.
        s.fill(&mut buf, PIPE_BYTES as usize);
        s.sink.say_dropped();
    }

    fn rx_fd(&self) -> i32 {
        self.lock().rx.as_raw_fd()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if let Some(logs) = self.logs.upgrade() {
            let fd = self.lock().rx.as_raw_fd();
            let _ = logs.registry.deregister(&mut SourceFd(&fd));
            logs.streams.lock().unwrap_or_else(|p| p.into_inner()).remove(&self.token);
        }
        let _ = fs::remove_file(&self.fifo);
    }
}

/// The file side of a stream: size cap with one rotation, rate cap.
struct Sink {
    path: PathBuf,
    rotated: PathBuf,
    out: Option<File>,
    len: u64,
    caps: Caps,
    window_start: Instant,
    window_bytes: u64,
    dropped: u64,
}

impl Sink {
    fn open(path: &Path, caps: Caps) -> io::Result<Sink> {
        let mut rotated = path.as_os_str().to_owned();
        rotated.push(".1");
        let mut s = Sink {
            path: path.to_path_buf(),
            rotated: rotated.into(),
            out: None,
            len: 0,
            caps,
            window_start: Instant::now(),
            window_bytes: 0,
            dropped: 0,
        };
        s.reopen()?;
        Ok(s)
    }

    fn reopen(&mut self) -> io::Result<()> {
        let f = OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o640)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&self.path)?;
        self.len = f.metadata()?.len();
        self.out = Some(f);
        Ok(())
    }

    /// Moves the full file aside (replacing the older one) and starts a new
    /// one. Tried again at the next write if it fails (say, a full disk).
    fn rotate(&mut self) {
        let was_open = self.out.take().is_some();
        let moved = match fs::rename(&self.path, &self.rotated) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => self.reopen(),
        };
        if let (Err(e), true) = (moved, was_open) {
            log::warn!("rotating {}: {e} (its output is dropped until this works)", self.path.display());
        }
    }

    /// Output read from the FIFO at `now`.
    fn accept(&mut self, data: &[u8], now: Instant) {
        self.tick(now);
        let room = self.caps.rate_bytes.saturating_sub(self.window_bytes);
        let take = (data.len() as u64).min(room) as usize;
        if take > 0 {
            self.window_bytes += take as u64;
            self.write(&data[..take]);
        }
        self.dropped += (data.len() - take) as u64;
    }

    /// Starts a new rate window once a second has passed, first saying what
    /// the last one dropped.
    fn tick(&mut self, now: Instant) {
        if now.saturating_duration_since(self.window_start) < TICK {
            return;
        }
        self.window_start = now;
        self.window_bytes = 0;
        self.say_dropped();
    }

    /// Writes the line about what was dropped, if anything was (the rate
    /// window is left as it is).
    fn say_dropped(&mut self) {
        if self.dropped > 0 {
            let line = format!(
                "\n[staccato: {} bytes of output dropped: more than {} bytes in a second (the log rate cap)]\n",
                self.dropped, self.caps.rate_bytes
            );
            self.dropped = 0;
            self.write(line.as_bytes());
        }
    }

    fn write(&mut self, data: &[u8]) {
        if self.out.is_none() || (self.len > 0 && self.len + data.len() as u64 > self.caps.file_bytes) {
            self.rotate();
        }
        if let Some(f) = &mut self.out {
            // A full disk loses log lines, never calls.
            if f.write_all(data).is_ok() {
                self.len += data.len() as u64;
            }
        }
    }
}

/// Where a reader of a log got to: the file (by inode) and the offset in
/// it. A log is rotated by renaming, so the inode follows the file it read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cursor {
    pub file: u64,
    pub offset: u64,
}

/// One file's inode and bytes `from..` (at most `max`); an absent file is
/// empty, with inode 0.
fn read_from(path: &Path, from: u64, max: usize) -> io::Result<(u64, Vec<u8>)> {
    use std::io::Seek;
    use std::os::unix::fs::MetadataExt;
    let mut f = match OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC).open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok((0, Vec::new())),
        Err(e) => return Err(e),
    };
    let meta = f.metadata()?;
    let len = meta.len();
    let from = from.min(len);
    f.seek(io::SeekFrom::Start(from))?;
    let mut out = Vec::with_capacity(((len - from) as usize).min(max));
    f.take(max as u64).read_to_end(&mut out)?;
    Ok((meta.ino(), out))
}

fn inode(path: &Path) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    fs::symlink_metadata(path).ok().filter(|m| m.is_file()).map(|m| m.ino())
}

/// Reads the log a [`Stream`] writes at `path` (and the older file its
/// rotation keeps beside it), at most `max` bytes. With no cursor: its last
/// `lines` lines. With one: what was written since (the rest of a file that
/// was rotated meanwhile, then the new one; everything there is if the
/// reader fell so far behind that its file is gone). Returns the bytes and
/// where the next read starts.
pub fn read(path: &Path, after: Option<Cursor>, lines: usize, max: usize) -> io::Result<(Vec<u8>, Cursor)> {
    let mut rotated = path.as_os_str().to_owned();
    rotated.push(".1");
    let rotated = PathBuf::from(rotated);
    match after {
        Some(c) if c.file != 0 && inode(path) == Some(c.file) => {
            let (file, out) = read_from(path, c.offset, max)?;
            Ok((out.clone(), Cursor { file, offset: c.offset.saturating_add(out.len() as u64) }))
        }
        Some(c) if c.file != 0 && inode(&rotated) == Some(c.file) => {
            let (_, mut out) = read_from(&rotated, c.offset, max)?;
            if out.len() >= max {
                let offset = c.offset.saturating_add(out.len() as u64);
                return Ok((out, Cursor { file: c.file, offset }));
            }
            let (file, more) = read_from(path, 0, max - out.len())?;
            let offset = more.len() as u64;
            out.extend_from_slice(&more);
            Ok((out, Cursor { file, offset }))
        }
        Some(_) => {
            let (file, out) = read_from(path, 0, max)?;
            let offset = out.len() as u64;
            Ok((out, Cursor { file, offset }))
        }
        None => {
            // The newest `max` bytes of the two files, then their last lines.
            let len = fs::metadata(path).map_or(0, |m| m.len());
            let (file, current) = read_from(path, len.saturating_sub(max as u64), max)?;
            let end = Cursor { file, offset: len.saturating_sub(max as u64) + current.len() as u64 };
            let mut all = Vec::new();
            if current.len() < max {
                let old = fs::metadata(&rotated).map_or(0, |m| m.len());
                let room = (max - current.len()) as u64;
                all = read_from(&rotated, old.saturating_sub(room), room as usize)?.1;
            }
            all.extend_from_slice(&current);
            Ok((last_lines(&all, lines).to_vec(), end))
        }
    }
}

/// The last `n` lines of `text` (a last line without its newline counts).
fn last_lines(text: &[u8], n: usize) -> &[u8] {
    if n == 0 {
        return &[];
    }
    let body = text.strip_suffix(b"\n").unwrap_or(text);
    let mut seen = 0;
    for (i, b) in body.iter().enumerate().rev() {
        if *b == b'\n' {
            seen += 1;
            if seen == n {
                return &text[i + 1..];
            }
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("sandbox-logs-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn output_beyond_the_rate_is_dropped_and_said_so() {
        let d = scratch("rate");
        let caps = Caps { file_bytes: 10 << 20, rate_bytes: 1 << 20 };
        let mut s = Sink::open(&d.join("f.log"), caps).unwrap();
        let t0 = s.window_start;
        for _ in 0..48 {
            s.accept(&[b'x'; 65536], t0);
        }
        assert_eq!(fs::metadata(d.join("f.log")).unwrap().len(), 1 << 20);
        s.tick(t0 + TICK);
        s.accept(b"after\n", t0 + TICK);
        let text = fs::read_to_string(d.join("f.log")).unwrap();
        assert!(text.ends_with(&format!(
            "\n[staccato: {} bytes of output dropped: more than 1048576 bytes in a second (the log rate cap)]\nafter\n",
            2 << 20
        )));
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_full_file_is_rotated_keeping_one_older_file() {
        let d = scratch("rotate");
        let caps = Caps { file_bytes: 100_000, rate_bytes: 1 << 30 };
        let path = d.join("f.log");
        fs::write(&path, b"from before\n").unwrap();
        let mut s = Sink::open(&path, caps).unwrap();
        let t0 = s.window_start;
        for i in 0..50u8 {
            s.accept(&[b'a' + i % 26; 10_000], t0);
        }
        let (now, older) = (fs::metadata(&path).unwrap().len(), fs::metadata(d.join("f.log.1")).unwrap().len());
        assert!(now <= 100_000 && older <= 100_000, "{now} {older}");
        assert_eq!((now + older) % 10_000, 0, "whole writes only: {now} {older}");
        assert!(!fs::read_to_string(d.join("f.log.1")).unwrap().contains("from before"));
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_writer_reaches_the_file_and_the_fifo_goes_with_the_stream() {
        let d = scratch("stream");
        let logs = Logs::start("test-logs").unwrap();
        let s = logs.open(&d.join("fifo"), &d.join("f.log"), Caps::DEFAULT).unwrap();
        let mut w = s.writer().unwrap();
        w.write_all(b"hello\n").unwrap();
        drop(w);
        s.drain();
        assert_eq!(fs::read_to_string(s.path()).unwrap(), "hello\n");
        // The drain thread reads on its own, too.
        s.writer().unwrap().write_all(b"more\n").unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while fs::read_to_string(s.path()).unwrap() != "hello\nmore\n" {
            assert!(Instant::now() < deadline, "the drain thread never read the FIFO");
            std::thread::sleep(Duration::from_millis(10));
        }
        drop(s);
        assert!(!d.join("fifo").exists());
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_stream_that_never_stops_does_not_starve_the_others() {
        let d = scratch("fair");
        let logs = Logs::start("test-logs-fair").unwrap();
        let loud = logs.open(&d.join("loud"), &d.join("loud.log"), Caps::DEFAULT).unwrap();
        let quiet = logs.open(&d.join("quiet"), &d.join("quiet.log"), Caps::DEFAULT).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let writers: Vec<_> = (0..2)
            .map(|_| {
                let (mut w, stop) = (loud.writer().unwrap(), stop.clone());
                std::thread::spawn(move || {
                    let chunk = vec![b'x'; 65536];
                    while !stop.load(Ordering::Relaxed) {
                        let _ = w.write_all(&chunk);
                    }
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(200));
        quiet.writer().unwrap().write_all(b"still heard\n").unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        let heard = loop {
            if fs::read_to_string(quiet.path()).unwrap() == "still heard\n" {
                break true;
            }
            if Instant::now() > deadline {
                break false;
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        stop.store(true, Ordering::Relaxed);
        for w in writers {
            w.join().unwrap();
        }
        assert!(heard, "a quiet stream was not drained while a loud one kept writing");
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn caps_below_the_minimum_are_refused() {
        assert!(Caps { file_bytes: 1000, rate_bytes: 1 << 20 }.check().is_err());
        assert!(Caps { file_bytes: 1 << 20, rate_bytes: 10 }.check().is_err());
        assert!(Caps::DEFAULT.check().is_ok());
    }

    #[test]
    fn a_reader_follows_the_log_across_a_rotation() {
        let dir = std::env::temp_dir().join(format!("staccato-logread-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("f.log");
        // No log yet: nothing, and a cursor that finds the file once made.
        let (out, c0) = read(&path, None, 10, 1 << 20).expect("read");
        assert!(out.is_empty());
        fs::write(&path, b"one\ntwo\nthree\n").expect("write");
        let (out, c1) = read(&path, None, 2, 1 << 20).expect("read");
        assert_eq!(out, b"two\nthree\n");
        assert_eq!(read(&path, Some(c0), 0, 1 << 20).expect("read").0, b"one\ntwo\nthree\n");
        // Appended: only what is new; capped: the rest at the next read.
        let mut f = OpenOptions::new().append(true).open(&path).expect("open");
        std::io::Write::write_all(&mut f, b"four\nfive\n").expect("append");
        let (out, c2) = read(&path, Some(c1), 0, 5).expect("read");
        assert_eq!(out, b"four\n");
        // Rotated (renamed aside), then a new file: the rest of the old
        // one, then the new one.
        fs::rename(&path, dir.join("f.log.1")).expect("rotate");
        fs::write(&path, b"six\n").expect("write");
        let (out, c3) = read(&path, Some(c2), 0, 1 << 20).expect("read");
        assert_eq!(out, b"five\nsix\n");
        assert_eq!(read(&path, Some(c3), 0, 1 << 20).expect("read").0, b"");
        // The last lines span both files.
        assert_eq!(read(&path, None, 3, 1 << 20).expect("read").0, b"four\nfive\nsix\n");
        // A reader whose file is gone altogether starts the current one.
        let gone = Cursor { file: u64::MAX - 1, offset: 3 };
        assert_eq!(read(&path, Some(gone), 0, 1 << 20).expect("read").0, b"six\n");
        assert_eq!(last_lines(b"a\nb", 1), b"b");
        assert_eq!(last_lines(b"a\nb\n", 5), b"a\nb\n");
        let _ = fs::remove_dir_all(dir);
    }
}
