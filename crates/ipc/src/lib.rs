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
    set_pipe_bytes(f, PIPE_SIZE);
}

/// Asks for a pipe (or FIFO) buffer of `bytes`. Failure is harmless (the
/// pipe keeps its size), so it is not reported.
pub fn set_pipe_bytes(f: &File, bytes: i32) {
    // SAFETY: F_SETPIPE_SZ takes an int argument and touches no memory of
    // ours; the fd is open for the duration of the call.
    unsafe {
        libc::fcntl(f.as_raw_fd(), libc::F_SETPIPE_SZ, bytes);
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
    /// (internal calls forward payloads without copying them). The file
    /// then belongs to the receiving directory's owner: with containers,
    /// each function runs as its own user and may read only its own files.
    pub fn forward(from_dir: &Path, to_dir: &Path, name: &str) -> io::Result<()> {
        use std::os::unix::fs::MetadataExt;
        if from_dir == to_dir {
            return Ok(());
        }
        let dest = path(to_dir, name);
        std::fs::rename(path(from_dir, name), &dest)?;
        let owner = std::fs::metadata(to_dir.join("shm"))?;
        if std::fs::metadata(&dest)?.uid() != owner.uid() {
            std::os::unix::fs::chown(&dest, Some(owner.uid()), Some(owner.gid()))?;
        }
        Ok(())
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

pub mod mount {
    //! Mounts into a running container's mount namespace (Nuka §III.A: a
    //! pooled container gets a function's code and channels without any
    //! runc command). Uses the new mount API so a read-only bind is made
    //! read-only while still detached and never appears writable.

    use super::*;

    // Syscall numbers of the mount API (the same on every architecture,
    // from the unified table of Linux 5.2+).
    const SYS_OPEN_TREE: libc::c_long = 428;
    const SYS_MOVE_MOUNT: libc::c_long = 429;
    const SYS_FSOPEN: libc::c_long = 430;
    const SYS_FSCONFIG: libc::c_long = 431;
    const SYS_FSMOUNT: libc::c_long = 432;
    const SYS_MOUNT_SETATTR: libc::c_long = 442;
    const OPEN_TREE_CLONE: libc::c_uint = 1;
    const OPEN_TREE_CLOEXEC: libc::c_uint = libc::O_CLOEXEC as libc::c_uint;
    const AT_RECURSIVE: libc::c_uint = 0x8000;
    const MOUNT_ATTR_RDONLY: u64 = 0x1;
    const MOUNT_ATTR_NOSUID: u64 = 0x2;
    const MOUNT_ATTR_NODEV: u64 = 0x4;
    const MOUNT_ATTR_NOEXEC: u64 = 0x8;
    const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
    const FSCONFIG_SET_STRING: libc::c_uint = 1;
    const FSCONFIG_CMD_CREATE: libc::c_uint = 6;

    #[repr(C)]
    struct MountAttr {
        attr_set: u64,
        attr_clr: u64,
        propagation: u64,
        userns_fd: u64,
    }

    fn cstr(p: &Path) -> io::Result<CString> {
        CString::new(p.as_os_str().as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
    }

    fn check(rc: libc::c_long, what: &str) -> io::Result<libc::c_long> {
        if rc < 0 {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(e.kind(), format!("{what}: {e}")));
        }
        Ok(rc)
    }

    /// A detached mount, ready to be attached in another namespace.
    pub struct Detached {
        fd: OwnedFd,
        dst: CString,
    }

    impl Detached {
        /// The mount's root as a path this process can reach while the
        /// mount stays detached: `/proc/self/fd/<fd>`. Lets the engine fill
        /// a scratch tmpfs and read it back without ever attaching it on
        /// the host (nothing is left behind if the engine dies).
        pub fn path(&self) -> PathBuf {
            PathBuf::from(format!("/proc/self/fd/{}", self.fd.as_raw_fd()))
        }
    }

    /// A detached recursive bind of `src` to be attached at `dst`, already
    /// nosuid+nodev, and read-only or (unless `exec`) noexec.
    pub fn bind(src: &Path, dst: &Path, read_only: bool, exec: bool) -> io::Result<Detached> {
        let c = cstr(src)?;
        // SAFETY: open_tree reads the NUL-terminated path and returns a new fd
        // (or -1); no memory is written.
        let fd = unsafe {
            libc::syscall(SYS_OPEN_TREE, libc::AT_FDCWD, c.as_ptr(), OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE)
        };
        let fd = check(fd, &format!("open_tree {}", src.display()))?;
        // SAFETY: open_tree succeeded; the fd is ours alone.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
        let attr = MountAttr {
            attr_set: MOUNT_ATTR_NOSUID
                | MOUNT_ATTR_NODEV
                | if read_only {
                    MOUNT_ATTR_RDONLY
                } else if exec {
                    0
                } else {
                    MOUNT_ATTR_NOEXEC
                },
            attr_clr: 0,
            propagation: 0,
            userns_fd: 0,
        };
        let empty = c"";
        // SAFETY: mount_setattr reads `attr` (a live, correctly sized
        // struct) and the empty path; it writes no memory of ours.
        let rc = unsafe {
            libc::syscall(
                SYS_MOUNT_SETATTR,
                fd.as_raw_fd(),
                empty.as_ptr(),
                libc::AT_EMPTY_PATH as libc::c_uint | AT_RECURSIVE,
                &attr as *const MountAttr,
                std::mem::size_of::<MountAttr>(),
            )
        };
        check(rc, "mount_setattr")?;
        Ok(Detached { fd, dst: cstr(dst)? })
    }

    /// A new tmpfs (nosuid, nodev, mode 1777) to be attached at `dst`.
    pub fn tmpfs(dst: &Path, size_bytes: u64) -> io::Result<Detached> {
        // SAFETY: fsopen reads a NUL-terminated name, returns a new fd.
        let fs = check(
            unsafe {
                libc::syscall(SYS_FSOPEN, c"tmpfs".as_ptr(), 1u32 /* FSOPEN_CLOEXEC */)
            },
            "fsopen tmpfs",
        )?;
        // SAFETY: fsopen succeeded; the fd is ours alone.
        let fs = unsafe { OwnedFd::from_raw_fd(fs as RawFd) };
        let size = CString::new(size_bytes.to_string()).expect("digits have no NUL");
        for (k, v) in [(c"size", size.as_c_str()), (c"mode", c"1777")] {
            // SAFETY: fsconfig reads the two NUL-terminated strings.
            let rc =
                unsafe { libc::syscall(SYS_FSCONFIG, fs.as_raw_fd(), FSCONFIG_SET_STRING, k.as_ptr(), v.as_ptr(), 0) };
            check(rc, "fsconfig")?;
        }
        // SAFETY: no pointers are passed.
        let rc = unsafe {
            libc::syscall(
                SYS_FSCONFIG,
                fs.as_raw_fd(),
                FSCONFIG_CMD_CREATE,
                std::ptr::null::<u8>(),
                std::ptr::null::<u8>(),
                0,
            )
        };
        check(rc, "fsconfig create")?;
        let attrs = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
        // SAFETY: no pointers are passed; returns a new fd.
        let m = check(
            unsafe {
                libc::syscall(SYS_FSMOUNT, fs.as_raw_fd(), 1u32 /* FSMOUNT_CLOEXEC */, attrs)
            },
            "fsmount",
        )?;
        // SAFETY: fsmount succeeded; the fd is ours alone.
        let fd = unsafe { OwnedFd::from_raw_fd(m as RawFd) };
        Ok(Detached { fd, dst: cstr(dst)? })
    }

    /// In the mount namespace of `pid`: lazily unmounts every path of
    /// `unmount` (missing ones are ignored), then attaches `attach` in
    /// order. Runs in a forked child, because setns(CLONE_NEWNS) refuses a
    /// multi-threaded caller and must not change the engine's namespace.
    pub fn apply(pid: u32, unmount: &[PathBuf], attach: &[Detached]) -> io::Result<()> {
        let ns = File::open(format!("/proc/{pid}/ns/mnt"))?;
        let unmount: Vec<CString> = unmount.iter().map(|p| cstr(p)).collect::<io::Result<_>>()?;
        let (mut r, w) = pipe()?;
        // SAFETY: between fork and _exit the child only makes raw syscalls
        // (setns, umount2, move_mount, write, _exit) on memory allocated
        // before the fork; it never allocates, locks or unwinds, so the
        // other threads' state it inherits is never touched.
        let child = unsafe { libc::fork() };
        if child < 0 {
            return Err(io::Error::last_os_error());
        }
        if child == 0 {
            // SAFETY: see above; every pointer refers to live pre-fork data.
            unsafe {
                let fail = |step: u8| -> ! {
                    let err = *libc::__errno_location();
                    let msg = [step, err as u8];
                    libc::write(w.as_raw_fd(), msg.as_ptr().cast(), 2);
                    libc::_exit(1)
                };
                if libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNS) != 0 {
                    fail(0);
                }
                for p in &unmount {
                    if libc::umount2(p.as_ptr(), libc::MNT_DETACH) != 0 {
                        let err = *libc::__errno_location();
                        if err != libc::EINVAL && err != libc::ENOENT {
                            fail(1);
                        }
                    }
                }
                for (i, d) in attach.iter().enumerate() {
                    let rc = libc::syscall(
                        SYS_MOVE_MOUNT,
                        d.fd.as_raw_fd(),
                        c"".as_ptr(),
                        libc::AT_FDCWD,
                        d.dst.as_ptr(),
                        MOVE_MOUNT_F_EMPTY_PATH,
                    );
                    if rc != 0 {
                        fail(2 + i.min(250) as u8);
                    }
                }
                libc::_exit(0)
            }
        }
        drop(w);
        let mut status = 0;
        // SAFETY: waits for our own child; `status` is a valid int.
        let rc = unsafe { libc::waitpid(child, &mut status, 0) };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut msg = [0u8; 2];
        if r.read_exact(&mut msg).is_ok() {
            let err = io::Error::from_raw_os_error(msg[1] as i32);
            let what = match msg[0] {
                0 => "setns into the container".to_string(),
                1 => "unmounting".to_string(),
                i => format!("attaching {}", attach[(i - 2) as usize].dst.to_string_lossy()),
            };
            return Err(io::Error::new(err.kind(), format!("{what}: {err}")));
        }
        if !(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0) {
            return Err(io::Error::other(format!("mount helper ended with status {status}")));
        }
        Ok(())
    }
}

/// Sends `sig` to `pid` (which must be a single process, pid > 0).
pub fn signal(pid: u32, sig: i32) -> io::Result<()> {
    if pid == 0 || pid > i32::MAX as u32 {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    }
    // SAFETY: kill has no memory effects; pid > 0 targets one process.
    let rc = unsafe { libc::kill(pid as i32, sig) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The effective user id (containers need root to be made).
pub fn euid() -> u32 {
    // SAFETY: geteuid cannot fail and touches no memory.
    unsafe { libc::geteuid() }
}

/// Blocks SIGTERM and SIGINT in the calling thread and every thread it
/// starts afterwards, so that [`wait_termination`] can take them
/// synchronously. Call first thing in `main`. (Children started with
/// `std::process::Command` get a cleared mask.)
pub fn block_termination_signals() {
    // SAFETY: the sigset is initialised by sigemptyset before use, and
    // pthread_sigmask only reads it.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
}

/// Waits for SIGTERM or SIGINT (blocked by [`block_termination_signals`]).
pub fn wait_termination() -> i32 {
    // SAFETY: as above; sigwait writes the signal number into `sig`.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        let mut sig = 0;
        while libc::sigwait(&set, &mut sig) != 0 {}
        sig
    }
}

/// Raises this process's open-file limit to its hard limit (a gateway with
/// thousands of connections needs more than the usual soft 1024) and
/// returns the limit now in force.
pub fn raise_nofile_limit() -> io::Result<u64> {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes only into `lim`, a valid rlimit.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(io::Error::last_os_error());
    }
    if lim.rlim_cur < lim.rlim_max {
        let want = libc::rlimit { rlim_cur: lim.rlim_max, rlim_max: lim.rlim_max };
        // SAFETY: setrlimit only reads `want`, a valid rlimit.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &want) } == 0 {
            lim.rlim_cur = lim.rlim_max;
        }
    }
    Ok(lim.rlim_cur)
}
