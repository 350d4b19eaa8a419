//! One pooled runc container: made once with `runc run -d`, then given to
//! functions and taken back without any further runc command (each costs
//! 5–36 ms; see docs/notes/issue4-runc-spike.md). Taking it means mounting
//! the function's files into its mount namespace, writing its cgroup limits
//! and sending its init a command; the freezer pauses and resumes it.

use crate::bundle::{self, LOG, SLOT};
use crate::cgroup;
use crate::{Error, Limits, Mount, Network, Result, Settings, Start, BUILD_UIDS, UID_RANGE_LEN};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{chown, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The nice value of the processes of a container waiting in the pool, and
/// of the pool's own thread (so of the runc commands it runs, and of what
/// they start): making containers, resetting them and the warm
/// interpreter's imports (~100 ms of CPU each) run in the CPU time that the
/// engine and functions leave. On a 2-vCPU host at the default nice they
/// held an engine I/O thread off its vCPU for up to 9 ms while a function
/// started. A container given to a function is set back to 0.
pub const POOL_NICE: i32 = 19;

/// Whether pooled containers wait at `POOL_NICE` (the pool found it can
/// set them back to 0); otherwise nothing is reniced.
pub(crate) static BACKGROUND: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

pub struct Container {
    pub id: String,
    pub index: u32,
    /// The user the function runs as (one per container, never root).
    pub uid: u32,
    dir: PathBuf,
    /// The container's init, as the host sees it.
    pub init_pid: u32,
    ctl: File,
    status: Mutex<StatusReader>,
    pub net: Option<netns::Net>,
    /// What /proc/<init>/mountinfo held right after creation.
    template: Vec<String>,
    assigned: Mutex<Assigned>,
    /// The warm Python launcher waiting in here (pid inside), if any, and
    /// the FIFO it waits on.
    warm: Mutex<Option<u32>>,
    warm_fifo: File,
    /// Its control group (v1 or v2, whichever the host has).
    group: cgroup::Group,
    /// The engine's CPU group (cgroup v1), and whether the processes are
    /// in their own group instead.
    shared_cpu: Option<PathBuf>,
    cpu_own: Mutex<bool>,
}

#[derive(Default)]
struct Assigned {
    /// Mount destinations added at assignment, removed on return.
    mounts: Vec<PathBuf>,
    /// Mountpoints made in the root skeleton for them.
    mountpoints: Vec<PathBuf>,
    oom_kills_at_start: u64,
    frozen: bool,
}

struct StatusReader {
    fifo: File,
    buf: Vec<u8>,
}

impl StatusReader {
    /// The next complete line, waiting at most `wait`.
    fn line(&mut self, wait: Duration) -> Option<String> {
        let deadline = Instant::now() + wait;
        loop {
            if let Some(i) = self.buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=i).collect();
                return Some(String::from_utf8_lossy(&line[..i]).into_owned());
            }
            let mut chunk = [0u8; 512];
            match self.fifo.read(&mut chunk) {
                Ok(n) if n > 0 => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return None;
                    }
                    // Woken by the line itself: on the start path (waiting
                    // for STARTED) at once, and no polling meanwhile (the
                    // pool's thread once burnt a vCPU waiting here).
                    if !sys::pipe::wait_readable(self.fifo.as_raw_fd(), left).unwrap_or(false) {
                        return None;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // End of file cannot happen (we hold a write end), and
                // another error would not go away: waiting would spin.
                _ => return None,
            }
        }
    }
}

fn runc(settings: &Settings) -> Command {
    let mut cmd = Command::new(&settings.runc);
    cmd.arg("--root").arg(settings.dir.join("runc"));
    cmd.stdin(Stdio::null()).stdout(Stdio::null());
    cmd
}

fn write_file(path: &Path, value: &str) -> Result<()> {
    fs::write(path, value).map_err(Error::io(format!("writing {value:?} to {}", path.display())))
}

/// Mount points, file systems and options, without the kernel's mount ids
/// (a fresh /tmp gets a new one but must otherwise match).
fn mount_table(pid: u32) -> io::Result<Vec<String>> {
    let text = fs::read_to_string(format!("/proc/{pid}/mountinfo"))?;
    let mut rows: Vec<String> = text
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            let sep = f.iter().position(|x| *x == "-").unwrap_or(f.len());
            let fstype = f.get(sep + 1).copied().unwrap_or("");
            format!("{} {} {}", f.get(4).copied().unwrap_or(""), f.get(5).copied().unwrap_or(""), fstype)
        })
        .collect();
    rows.sort();
    Ok(rows)
}

impl Container {
    /// Makes a container with its init waiting for a command. Takes about
    /// 30–40 ms (runc), plus the network namespace when isolated.
    /// `warm`: also start the warm Python launcher (worth it only for a
    /// container that will wait in the pool).
    pub fn create(settings: &Settings, nets: Option<&netns::Networks>, index: u32, warm: bool) -> Result<Container> {
        if index >= UID_RANGE_LEN - BUILD_UIDS {
            return Err(Error::Config(format!("container index {index} is beyond this engine's range of users")));
        }
        let id = format!("{}-{index}", settings.prefix);
        let dir = settings.dir.join(&id);
        let _ = runc(settings).args(["delete", "-f", &id]).stderr(Stdio::null()).status();
        let _ = fs::remove_dir_all(&dir);
        let uid = settings.uid_base + index;
        let made = (|| -> io::Result<()> {
            fs::create_dir_all(dir.join("slot"))?;
            bundle::make_rootfs(&dir.join("rootfs"), settings)?;
            for fifo in ["ctl", "status", "warm"] {
                let p = dir.join("slot").join(fifo);
                sys::pipe::mkfifo(&p)?;
                chown(&p, Some(uid), Some(uid))?;
            }
            Ok(())
        })();
        made.map_err(Error::io(format!("preparing {}", dir.display())))?;
        let open = |name: &str, nonblock: bool| {
            let mut o = OpenOptions::new();
            o.read(true).write(true);
            if nonblock {
                o.custom_flags(libc::O_NONBLOCK);
            }
            o.open(dir.join("slot").join(name)).map_err(Error::io(format!("opening slot {name}")))
        };
        // Opened read-write so init's opens never block and init sees
        // end-of-file on ctl only when the engine is gone.
        let ctl = open("ctl", false)?;
        let status = open("status", true)?;
        let warm_fifo = open("warm", false)?;
        let net = match (settings.network, nets) {
            (Network::Isolated, Some(n)) => Some(create_net(n, &settings.prefix, index)?),
            _ => None,
        };
        let fail = |e: Error, net: &Option<netns::Net>| {
            if let (Some(n), Some(nets)) = (net, nets) {
                let _ = nets.destroy(n);
            }
            let _ = fs::remove_dir_all(&dir);
            Err(e)
        };
        let config =
            bundle::config(settings, &id, &dir, uid, net.as_ref().map(|n| n.path.as_path()), &settings.neutral);
        if let Err(e) = fs::write(dir.join("config.json"), config.to_string()) {
            return fail(Error::Io { what: "writing config.json".into(), error: e }, &net);
        }
        let err_path = dir.join("runc.err");
        let err_file = match File::create(&err_path) {
            Ok(f) => f,
            Err(e) => return fail(Error::Io { what: format!("creating {}", err_path.display()), error: e }, &net),
        };
        // runc's stdio must be files: a pipe would be inherited by init and
        // never reach end-of-file.
        let st = runc(settings)
            .args(["run", "-d", "--pid-file"])
            .arg(dir.join("init.pid"))
            .arg("-b")
            .arg(&dir)
            .arg(&id)
            .stderr(err_file)
            .status();
        match st {
            Ok(s) if s.success() => {}
            Ok(_) => {
                let why = fs::read_to_string(&err_path).unwrap_or_default();
                return fail(Error::Runc { id: id.clone(), stderr: why.trim().to_string() }, &net);
            }
            Err(e) => return fail(Error::Io { what: format!("running {}", settings.runc.display()), error: e }, &net),
        }
        let init_pid = fs::read_to_string(dir.join("init.pid")).ok().and_then(|s| s.trim().parse().ok()).unwrap_or(0);
        let mut reader = StatusReader { fifo: status, buf: Vec::new() };
        let c = |reader, template| Container {
            id: id.clone(),
            index,
            uid,
            dir: dir.clone(),
            init_pid,
            ctl: ctl.try_clone().expect("dup of an open fifo"),
            status: Mutex::new(reader),
            net: net.clone(),
            template,
            assigned: Mutex::new(Assigned::default()),
            warm: Mutex::new(None),
            warm_fifo: warm_fifo.try_clone().expect("dup of an open fifo"),
            group: cgroup::Group::new(&id),
            shared_cpu: crate::shared_cpu_group(&settings.prefix),
            cpu_own: Mutex::new(false),
        };
        match reader.line(Duration::from_secs(10)) {
            Some(l) if l == "READY" && init_pid != 0 => {}
            other => {
                let c = c(reader, Vec::new());
                c.destroy(settings, nets);
                return Err(Error::Slot(format!("container {id} did not report ready (got {other:?})")));
            }
        }
        // Before anything else runs in it: children inherit the group.
        if let Some(shared) = crate::shared_cpu_group(&settings.prefix).filter(|g| g.is_dir()) {
            if let Err(e) = fs::write(shared.join("cgroup.procs"), init_pid.to_string()) {
                let c = c(reader, Vec::new());
                c.destroy(settings, nets);
                return Err(Error::Io { what: format!("moving {id} into the engine's CPU group"), error: e });
            }
        }
        let template = mount_table(init_pid).unwrap_or_default();
        let c = c(reader, template);
        if let Err(e) = if warm { c.warm_up(settings) } else { Ok(()) } {
            c.destroy(settings, nets);
            return Err(e);
        }
        Ok(c)
    }

    /// Starts the warm Python launcher, if the settings ask for one, and
    /// waits until it has done its imports.
    fn warm_up(&self, settings: &Settings) -> Result<()> {
        let Some(crate::Command { argv, env }) = &settings.warm_python else { return Ok(()) };
        let mut env = env.clone();
        env.push(("STACCATO_WARM_FIFO".into(), format!("{SLOT}/warm")));
        env.push(("STACCATO_WARM_STATUS".into(), format!("{SLOT}/status")));
        let pid = self.command("/", argv, &env)?;
        match self.status.lock().unwrap_or_else(|p| p.into_inner()).line(Duration::from_secs(20)) {
            Some(l) if l.starts_with("WARM ") => {
                *self.warm.lock().unwrap_or_else(|p| p.into_inner()) = Some(pid);
                Ok(())
            }
            other => Err(Error::Slot(format!("warm Python launcher in {} did not come up: {other:?}", self.id))),
        }
    }

    /// Has init start `argv`; returns its pid inside the container.
    fn command(&self, cwd: &str, argv: &[String], env: &[(String, String)]) -> Result<u32> {
        let mut body = Vec::new();
        let mut push = |s: &str| {
            body.extend_from_slice(s.as_bytes());
            body.push(0);
        };
        push(cwd);
        push(LOG);
        push(&argv.len().to_string());
        for arg in argv {
            push(arg);
        }
        for (k, v) in env {
            push(&format!("{k}={v}"));
        }
        if body.len() > 65536 {
            return Err(Error::Config("launcher command longer than 64 KiB".into()));
        }
        let mut msg = (body.len() as u32).to_le_bytes().to_vec();
        msg.extend_from_slice(&body);
        (&self.ctl).write_all(&msg).map_err(Error::io(format!("sending the command to {}", self.id)))?;
        let mut status = self.status.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            let line = status.line(Duration::from_secs(5));
            // News of an earlier process (a killed warm launcher) may come first.
            if line.as_deref().is_some_and(|l| l.starts_with("EXIT ")) {
                continue;
            }
            return match line.as_deref().and_then(|l| l.strip_prefix("STARTED ")) {
                Some(pid) => pid.trim().parse().map_err(|_| Error::Slot(format!("bad status line {line:?}"))),
                None => Err(Error::Slot(format!("container {} did not start {:?}: {line:?}", self.id, argv.first()))),
            };
        }
    }

    /// Gives the container to a function: mounts, limits, then its launcher.
    /// Returns the launcher's pid inside the container.
    pub fn start(&self, s: &Start) -> Result<u32> {
        // A frozen init would take the command and never start it.
        self.thaw_whatever_the_flag_says()?;
        let rootfs = self.dir.join("rootfs");
        let mut attach = Vec::new();
        let mut a = self.assigned.lock().unwrap_or_else(|p| p.into_inner());
        let mut all: Vec<Mount> = s.mounts.clone();
        all.push(Mount { src: s.log.clone(), dst: LOG.into(), read_only: false, exec: false });
        chown(&s.log, Some(self.uid), Some(self.uid)).map_err(Error::io(format!("chown {}", s.log.display())))?;
        for m in &all {
            let rel = m.dst.strip_prefix("/").unwrap_or(&m.dst);
            let point = rootfs.join(rel);
            if !point.exists() {
                let made = if m.src.is_dir() {
                    fs::create_dir_all(&point)
                } else {
                    point.parent().map_or(Ok(()), fs::create_dir_all).and_then(|_| fs::write(&point, b""))
                };
                made.map_err(Error::io(format!("making mountpoint {}", point.display())))?;
                a.mountpoints.push(point);
            }
            attach.push(
                sys::mount::bind(&m.src, &m.dst, m.read_only, m.exec)
                    .map_err(Error::io(m.src.display().to_string()))?,
            );
            a.mounts.push(m.dst.clone());
        }
        sys::mount::apply(self.init_pid, &[], &attach).map_err(Error::io(format!("mounting into {}", self.id)))?;
        self.set_limits(&s.limits)?;
        a.oom_kills_at_start = self.oom_kills();
        drop(a);
        // Out of the background: the function's processes (init's children,
        // the warm interpreter) run at the engine's priority, or not at all.
        self.set_nice(0)?;
        let warm = self.warm.lock().unwrap_or_else(|p| p.into_inner()).take();
        match warm {
            Some(pid) if s.python => {
                // The warm interpreter becomes the launcher.
                let env: serde_json::Map<String, serde_json::Value> =
                    s.env.iter().map(|(k, v)| (k.clone(), serde_json::Value::from(v.as_str()))).collect();
                let body = serde_json::json!({ "env": env, "cwd": s.cwd }).to_string();
                let mut msg = (body.len() as u32).to_le_bytes().to_vec();
                msg.extend_from_slice(body.as_bytes());
                (&self.warm_fifo).write_all(&msg).map_err(Error::io(format!("assigning {}", self.id)))?;
                Ok(pid)
            }
            Some(_) => {
                // Not for this runtime: out of the way first.
                if !self.kill_all() {
                    return Err(Error::Dirty(format!("the warm launcher in {} would not die", self.id)));
                }
                let _ = self.poll_status();
                self.command(&s.cwd, &s.argv, &s.env)
            }
            None => self.command(&s.cwd, &s.argv, &s.env),
        }
    }

    /// Whether a warm Python launcher waits in here.
    pub fn is_warm(&self) -> bool {
        self.warm.lock().unwrap_or_else(|p| p.into_inner()).is_some()
    }

    /// Status lines init wrote since the last call ("EXIT <pid> <status>").
    pub fn poll_status(&self) -> Vec<String> {
        let mut r = self.status.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = Vec::new();
        while let Some(l) = r.line(Duration::ZERO) {
            out.push(l);
        }
        out
    }

    fn set_limits(&self, l: &Limits) -> Result<()> {
        let g = &self.group;
        let fail = |what: &str| {
            let what = format!("setting {what} of {}", self.id);
            move |error| Error::Io { what, error }
        };
        g.set_memory(l.memory_bytes).map_err(fail("the memory limit"))?;
        g.set_pids(l.pids).map_err(fail("the process limit"))?;
        g.set_cpu(l.cpu_shares).map_err(fail("the CPU weight"))?;
        // cgroup v1: moving a process between cgroups waits for an RCU
        // grace period (~10 ms on this idle guest), so only when the group
        // changes: a container starts in the shared group and most stay
        // there.
        if let Some(shared) = &self.shared_cpu {
            let mut cpu_own = self.cpu_own.lock().unwrap_or_else(|p| p.into_inner());
            if *cpu_own != l.cpu_shares.is_some() {
                let group = if l.cpu_shares.is_some() { g.v1_cpu_dir() } else { shared.clone() };
                for p in self.pids().into_iter().filter(|_| group.is_dir()) {
                    write_file(&group.join("cgroup.procs"), &p.to_string())?;
                }
                *cpu_own = l.cpu_shares.is_some();
            }
        }
        Ok(())
    }

    /// How many processes the kernel's OOM killer has killed in here.
    pub fn oom_kills(&self) -> u64 {
        self.group.oom_kills()
    }

    /// Whether the OOM killer struck since the function got the container.
    pub fn oom_since_start(&self) -> bool {
        let base = self.assigned.lock().unwrap_or_else(|p| p.into_inner()).oom_kills_at_start;
        self.oom_kills() > base
    }

    /// Host pids of every process in the container.
    pub fn pids(&self) -> Vec<u32> {
        self.group.procs()
    }

    /// The host pid of the process that is `ns_pid` inside the container.
    pub fn host_pid(&self, ns_pid: u32) -> Option<u32> {
        self.pids().into_iter().find(|p| {
            fs::read_to_string(format!("/proc/{p}/status")).ok().is_some_and(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("NSpid:"))
                    .and_then(|v| v.split_whitespace().last().and_then(|x| x.parse::<u32>().ok()))
                    == Some(ns_pid)
            })
        })
    }

    /// SIGKILLs the process known as `ns_pid` inside the container.
    pub fn kill(&self, ns_pid: u32) -> io::Result<()> {
        match self.host_pid(ns_pid) {
            Some(p) if p != self.init_pid => sys::process::kill(p),
            _ => Err(io::Error::from(io::ErrorKind::NotFound)),
        }
    }

    /// Kills everything but init. True once only init is left.
    pub fn kill_all(&self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(2);
        loop {
            let rest: Vec<u32> = self.pids().into_iter().filter(|p| *p != self.init_pid).collect();
            if rest.is_empty() {
                return true;
            }
            if Instant::now() > deadline {
                return false;
            }
            // A frozen process cannot die.
            self.thaw();
            for p in rest {
                let _ = sys::process::kill(p);
            }
            std::thread::sleep(Duration::from_micros(100));
        }
    }

    /// Pauses every process of the container (the v1 freezer or v2's
    /// cgroup.freeze; ~0.1 ms, against 5–8 ms for `runc pause`).
    pub fn freeze(&self) -> Result<()> {
        // The flag and the file change together: a thaw that ran between
        // them would see no flag and leave the container frozen.
        let mut a = self.assigned.lock().unwrap_or_else(|p| p.into_inner());
        self.group.freeze().map_err(|error| Error::Io { what: format!("freezing {}", self.id), error })?;
        a.frozen = true;
        Ok(())
    }

    /// Thaws even if the flag says it is not frozen (a freeze that raced
    /// with a give-back, or one from outside).
    fn thaw_whatever_the_flag_says(&self) -> Result<()> {
        let mut a = self.assigned.lock().unwrap_or_else(|p| p.into_inner());
        self.group.thaw().map_err(|error| Error::Io { what: format!("thawing {}", self.id), error })?;
        a.frozen = false;
        Ok(())
    }

    pub fn thaw(&self) {
        let mut a = self.assigned.lock().unwrap_or_else(|p| p.into_inner());
        if a.frozen {
            let _ = self.group.thaw();
            a.frozen = false;
        }
    }

    /// Makes a returned container as good as new (Nuka's checker): no
    /// process but init, no mount but the template's, a fresh /tmp, neutral
    /// limits, an untouched network. Err means: destroy it instead.
    pub fn reset(&self, settings: &Settings, nets: Option<&netns::Networks>, warm: bool) -> Result<()> {
        // A container that went back frozen with only init left would pass
        // every other check here, and its frozen init would never start
        // the next function.
        self.thaw_whatever_the_flag_says()?;
        if !self.kill_all() {
            return Err(Error::Dirty("processes survived SIGKILL".into()));
        }
        let _ = self.poll_status();
        let mut a = self.assigned.lock().unwrap_or_else(|p| p.into_inner());
        let mut unmount = std::mem::take(&mut a.mounts);
        unmount.push(settings.tmp_dir.clone());
        let tmp = sys::mount::tmpfs(&settings.tmp_dir, settings.tmp_bytes).map_err(Error::io("making a fresh /tmp"))?;
        sys::mount::apply(self.init_pid, &unmount, &[tmp]).map_err(Error::io("unmounting"))?;
        for p in std::mem::take(&mut a.mountpoints).iter().rev() {
            let _ = fs::remove_dir(p).or_else(|_| fs::remove_file(p));
        }
        drop(a);
        let now = mount_table(self.init_pid).map_err(Error::io("reading mounts"))?;
        if now != self.template {
            return Err(Error::Dirty(format!("mounts differ from the template: {:?}", diff(&self.template, &now))));
        }
        if let (Some(n), Some(nets)) = (&self.net, nets) {
            nets.check(n)?;
        }
        self.set_limits(&settings.neutral)?;
        *self.warm.lock().unwrap_or_else(|p| p.into_inner()) = None;
        // Back in the pool: in the background again, the warm interpreter
        // started below included.
        self.set_nice(POOL_NICE)?;
        if warm {
            self.warm_up(settings)?;
        }
        Ok(())
    }

    /// Sets the nice value of every thread of every process in the
    /// container (a nice value is per thread), when the pool works in the
    /// background (`BACKGROUND`). On cgroup v1 containers share the
    /// engine's CPU group and this orders them against it; on v2 each is a
    /// CPU group of its own and it orders only its own threads.
    fn set_nice(&self, nice: i32) -> Result<()> {
        if !BACKGROUND.load(std::sync::atomic::Ordering::Relaxed) {
            return Ok(());
        }
        for pid in self.group.procs() {
            // A process gone meanwhile (a warm interpreter being replaced)
            // is no error.
            sys::cpu::set_nice_all_threads(pid, nice)
                .map_err(|error| Error::Io { what: format!("setting the nice value of {pid} to {nice}"), error })?;
        }
        Ok(())
    }

    /// Puts everything in the container in the background (`POOL_NICE`),
    /// as when it waits in the pool: for a function being retired, whose
    /// processes' last work (their exit, the kernel freeing a large heap)
    /// must not take a vCPU from the calls and starts that go on.
    pub fn to_background(&self) -> Result<()> {
        self.set_nice(POOL_NICE)
    }

    /// Removes the container for good.
    pub fn destroy(&self, settings: &Settings, nets: Option<&netns::Networks>) {
        // A frozen process cannot even die.
        let _ = self.group.thaw();
        let _ = runc(settings).args(["delete", "-f", &self.id]).stderr(Stdio::null()).status();
        self.group.remove();
        if let (Some(n), Some(nets)) = (&self.net, nets) {
            let _ = nets.destroy(n);
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// A network namespace for container `index`: at this engine's offset in
/// the shared address block, or further on if another engine (or one that
/// crashed) holds that /30.
fn create_net(nets: &netns::Networks, prefix: &str, index: u32) -> Result<netns::Net, netns::Error> {
    let mut first_err = None;
    for k in 0..64 {
        let i = (crate::net_base(prefix) + index + k * 256) % netns::NETS_MAX;
        match nets.create(i) {
            Ok(n) => return Ok(n),
            // Taken by another engine, or left by one that crashed.
            Err(e @ (netns::Error::Exists(_) | netns::Error::Routed { .. })) => {
                first_err.get_or_insert(e);
            }
            Err(e) => return Err(e),
        }
    }
    Err(first_err.expect("64 attempts, each failed"))
}

fn diff(a: &[String], b: &[String]) -> Vec<String> {
    let mut d: Vec<String> = b.iter().filter(|x| !a.contains(x)).map(|x| format!("+{x}")).collect();
    d.extend(a.iter().filter(|x| !b.contains(x)).map(|x| format!("-{x}")));
    d
}
