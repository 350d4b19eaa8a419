//! A Staccato cluster on test hosts (`netns::testbed`): gateways and
//! engines each in a "server" of their own, joined by a bridge, with a
//! client host to call from. `staccato testbed` (the demo and the Python
//! cluster tests) and `staccato bench cluster` both make theirs here.
//!
//! Hosts, in order: one per gateway (`gw0`, `gw1`, ...; `gw0` also runs
//! etcd when there are several gateways), one per engine (`engine0`, ...),
//! spare hosts that start with nothing (`engineN`..., for an engine that
//! joins late: [`Bed::start_engine`]), and `client`. With `colocated`, host
//! `gw0` also runs an engine, `local`, reached over that host's loopback.
//!
//! Each engine is labelled `host=<its name>` and `first<k>=y` for every k
//! beyond its index, so `placement: {labels: {first2: y}}` places a
//! function on engine0 and engine1 exactly.
//!
//! The whole description is written to `<dir>/testbed.json`, which the
//! other `staccato testbed` verbs read. Every process of a bed lives in
//! one of its hosts' namespaces, so [`down`] finds them all even after a
//! crash: it stops them (SIGTERM, so engines remove their containers, then
//! SIGKILL) and removes the hosts.

use anyhow::{anyhow, bail, Context, Result};
use client::Requester;
use netns::testbed::Testbed;
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

pub const GATEWAY_PORT: u16 = 8080;
pub const ENGINE_PORT: u16 = 7000;
pub const ETCD_PORT: u16 = 2379;

/// What to make.
#[derive(Clone, Debug)]
pub struct Layout {
    pub prefix: String,
    pub dir: PathBuf,
    pub gateways: u32,
    pub engines: u32,
    /// Hosts kept for engines started later.
    pub spare: u32,
    /// An engine in gateway gw0's host too.
    pub colocated: bool,
    /// More `staccato engine` arguments, for every engine.
    pub engine_args: Vec<String>,
    /// More `staccato gateway` arguments, for every gateway.
    pub gateway_args: Vec<String>,
}

/// One member of the bed: a gateway, an engine, or the client host.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Member {
    pub name: String,
    /// `gateway`, `engine` or `client`.
    pub role: String,
    pub host: u32,
    /// Its host's network namespace, bound under /run/netns.
    pub netns: String,
    /// Where it listens (the client: its host's address, port 0).
    pub addr: SocketAddr,
    /// Its process, while it runs.
    pub pid: Option<u32>,
    pub log: Option<PathBuf>,
}

/// A bed that exists: what `up` made, read back from `testbed.json`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Bed {
    pub prefix: String,
    pub dir: PathBuf,
    pub token: String,
    pub engine_token: String,
    /// `etcd://...` when the gateways share a store.
    pub store: Option<String>,
    pub members: Vec<Member>,
    pub engine_args: Vec<String>,
    #[serde(skip)]
    bin: PathBuf,
}

impl Bed {
    /// Makes the hosts and starts etcd (with several gateways), the
    /// gateways and the engines, and returns once every gateway lists every
    /// started engine ready. Anything a failure leaves is torn down.
    pub fn up(l: &Layout, progress: &dyn Fn(&str)) -> Result<Bed> {
        if l.gateways == 0 {
            bail!("a testbed needs a gateway");
        }
        if let Ok(t) = Testbed::existing(&l.prefix) {
            bail!(
                "a testbed {:?} exists already ({} hosts): `staccato testbed down --prefix {}` removes it",
                l.prefix,
                t.hosts().len(),
                l.prefix
            );
        }
        let hosts = l.gateways + l.engines + l.spare + 1;
        progress(&format!("making {hosts} hosts (network namespaces stb-{}-*)", l.prefix));
        let testbed = Testbed::create(&l.prefix, hosts).context("making the test hosts")?;
        // From here on the hosts outlive this value: `down` removes them.
        let bed = Bed::start(l, &testbed, progress);
        std::mem::forget(testbed);
        match bed {
            Ok(b) => Ok(b),
            Err(e) => {
                if let Err(d) = down(&l.prefix, Some(&l.dir)) {
                    eprintln!("tearing the testbed down after a failure: {d:#}");
                }
                Err(e)
            }
        }
    }

    fn start(l: &Layout, testbed: &Testbed, progress: &dyn Fn(&str)) -> Result<Bed> {
        let dir = private_dir(&l.dir)?;
        let member = |name: String, role: &str, host: u32, port: u16| Member {
            name,
            role: role.into(),
            host,
            netns: testbed.host(host).netns.clone(),
            addr: SocketAddr::new(testbed.host(host).addr.into(), port),
            pid: None,
            log: None,
        };
        let mut members = Vec::new();
        for g in 0..l.gateways {
            members.push(member(format!("gw{g}"), "gateway", g, GATEWAY_PORT));
        }
        if l.colocated {
            members.push(member("local".into(), "engine", 0, ENGINE_PORT));
        }
        for e in 0..l.engines + l.spare {
            members.push(member(format!("engine{e}"), "engine", l.gateways + e, ENGINE_PORT));
        }
        members.push(member("client".into(), "client", hosts_of(l) - 1, 0));
        let store =
            (l.gateways > 1).then(|| format!("etcd://{}:{ETCD_PORT}/staccato-{}", testbed.host(0).addr, l.prefix));
        let mut bed = Bed {
            prefix: l.prefix.clone(),
            dir,
            token: random_token("bed")?,
            engine_token: random_token("bed-engine")?,
            store,
            members,
            engine_args: l.engine_args.clone(),
            bin: std::env::current_exe()?,
        };
        bed.save()?;
        if bed.store.is_some() {
            progress("starting etcd in host gw0");
            bed.start_etcd(testbed)?;
        }
        for g in 0..l.gateways as usize {
            progress(&format!("starting gateway gw{g} on {}", bed.members[g].addr));
            bed.start_gateway(g, &l.gateway_args)?;
        }
        for g in 0..l.gateways as usize {
            let url = bed.url(g);
            let name = format!("gw{g}");
            bed.wait(Duration::from_secs(20), &format!("gateway {url} to answer"), &[&name], |b| {
                Ok(b.gateway_get(g, "/system/engines").is_ok())
            })?;
        }
        let spares: Vec<String> = (l.engines..l.engines + l.spare).map(|e| format!("engine{e}")).collect();
        let engines: Vec<String> = bed.engines().map(|m| m.name.clone()).filter(|n| !spares.contains(n)).collect();
        for name in &engines {
            progress(&format!("starting engine {name}"));
            bed.start_engine(name)?;
        }
        let names: Vec<&str> = engines.iter().map(String::as_str).collect();
        bed.wait_ready(&names, Duration::from_secs(60))?;
        progress("every gateway lists every engine ready");
        Ok(bed)
    }

    /// Reads the bed `up` described in `dir`.
    pub fn load(dir: &Path) -> Result<Bed> {
        let path = dir.join("testbed.json");
        let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        check_private(dir)?;
        let mut bed: Bed = serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        // Its namespaces are the only paths it names that are used as such.
        let lead = format!("stb-{}-", bed.prefix);
        let ours =
            |n: &str| n.strip_prefix(&lead).is_some_and(|i| !i.is_empty() && i.bytes().all(|b| b.is_ascii_digit()));
        if !netns::valid_prefix(&bed.prefix) || !bed.members.iter().all(|m| ours(&m.netns)) {
            bail!("{}: a member's namespace is not one of testbed {:?}'s", path.display(), bed.prefix);
        }
        bed.bin = std::env::current_exe()?;
        Ok(bed)
    }

    fn save(&self) -> Result<()> {
        let path = self.dir.join("testbed.json");
        let tmp = self.dir.join("testbed.json.tmp");
        std::fs::write(&tmp, serde_json::to_vec_pretty(self)?)?;
        std::fs::rename(&tmp, &path).with_context(|| format!("writing {}", path.display()))
    }

    pub fn member(&self, name: &str) -> Result<&Member> {
        self.members.iter().find(|m| m.name == name).ok_or_else(|| {
            let names: Vec<&str> = self.members.iter().map(|m| m.name.as_str()).collect();
            anyhow!("no member {name:?} in testbed {} (members: {})", self.prefix, names.join(", "))
        })
    }

    pub fn gateways(&self) -> impl Iterator<Item = &Member> {
        self.members.iter().filter(|m| m.role == "gateway")
    }

    pub fn engines(&self) -> impl Iterator<Item = &Member> {
        self.members.iter().filter(|m| m.role == "engine")
    }

    pub fn client(&self) -> &Member {
        self.members.iter().find(|m| m.role == "client").expect("every bed has a client host")
    }

    /// Gateway `g`'s URL.
    pub fn url(&self, g: usize) -> String {
        format!("http://{}", self.gateways().nth(g).expect("gateway index").addr)
    }

    /// `/run/netns/<netns>` of a member's host.
    pub fn netns_path(&self, name: &str) -> Result<PathBuf> {
        Ok(Path::new("/run/netns").join(&self.member(name)?.netns))
    }

    fn command(&self, host_netns: &str, program: &Path) -> std::process::Command {
        let mut cmd = std::process::Command::new("nsenter");
        cmd.arg(format!("--net=/run/netns/{host_netns}")).arg("--").arg(program);
        // Its own process group: a Ctrl-C meant for `testbed up` or a test
        // runner does not reach the bed's servers (`down` stops them).
        cmd.process_group(0).stdin(Stdio::null());
        cmd
    }

    fn spawn(&mut self, name: &str, program: &Path, args: &[String]) -> Result<u32> {
        let i = self.members.iter().position(|m| m.name == name).ok_or_else(|| anyhow!("no member {name}"))?;
        let log_path = self.dir.join(format!("{name}.log"));
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&log_path)?;
        let child = self
            .command(&self.members[i].netns, program)
            .args(args)
            .env("STACCATO_TOKEN", &self.token)
            .env("STACCATO_ENGINE_TOKEN", &self.engine_token)
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {name} ({})", program.display()))?;
        let pid = child.id();
        // Not waited for here: `down` (or the caller's kill) ends it, and
        // the child is reaped by whoever outlives it.
        drop(child);
        self.members[i].pid = Some(pid);
        self.members[i].log = Some(log_path);
        self.save()?;
        Ok(pid)
    }

    fn start_etcd(&mut self, testbed: &Testbed) -> Result<()> {
        let etcd =
            which("etcd").ok_or_else(|| anyhow!("etcd is not installed (scripts/setup.sh installs etcd-server)"))?;
        let addr = testbed.host(0).addr;
        let data = self.dir.join("etcd");
        let _ = std::fs::remove_dir_all(&data);
        let client = format!("http://{addr}:{ETCD_PORT}");
        let peer = format!("http://127.0.0.1:{}", ETCD_PORT + 1);
        let args: Vec<String> = [
            "--name",
            "staccato",
            "--data-dir",
            &data.to_string_lossy(),
            "--listen-client-urls",
            &client,
            "--advertise-client-urls",
            &client,
            "--listen-peer-urls",
            &peer,
            "--initial-advertise-peer-urls",
            &peer,
            "--initial-cluster",
            &format!("staccato={peer}"),
        ]
        .map(String::from)
        .into();
        let host_netns = testbed.host(0).netns.clone();
        self.members.push(Member {
            name: "etcd".into(),
            role: "etcd".into(),
            host: 0,
            netns: host_netns.clone(),
            addr: SocketAddr::new(addr.into(), ETCD_PORT),
            pid: None,
            log: None,
        });
        self.spawn("etcd", &etcd, &args)?;
        self.wait(Duration::from_secs(20), "etcd to be healthy", &["etcd"], |b| {
            let client = client.clone();
            in_netns(&b.netns_path("client")?, move || {
                let mut etcd = client::Gateway::new(&client, None, Some(Duration::from_secs(1)))?;
                Ok(etcd.request("GET", "/health", b"").is_ok_and(|r| r.status == 200))
            })
        })
    }

    fn start_gateway(&mut self, g: usize, extra: &[String]) -> Result<()> {
        let m = self.gateways().nth(g).expect("gateway index").clone();
        let mut args: Vec<String> = vec![
            "gateway".into(),
            "--listen".into(),
            m.addr.to_string(),
            "--state-dir".into(),
            self.dir.join(&m.name).join("state").to_string_lossy().into(),
        ];
        if let Some(store) = &self.store {
            args.extend(["--store".into(), store.clone()]);
        }
        args.extend(extra.iter().cloned());
        let bin = self.bin.clone();
        self.spawn(&m.name, &bin, &args)?;
        Ok(())
    }

    /// Starts (or starts again) engine `name` in its host, joined to every
    /// gateway, with the state it had before. Returns its pid.
    pub fn start_engine(&mut self, name: &str) -> Result<u32> {
        let m = self.member(name)?.clone();
        if m.role != "engine" {
            bail!("{name} is a {}, not an engine", m.role);
        }
        if let Some(pid) = m.pid.filter(|&p| alive(p)) {
            bail!("engine {name} is running already (pid {pid})");
        }
        let index: Option<u32> = name.strip_prefix("engine").and_then(|i| i.parse().ok());
        let total = self.engines().count() as u32;
        let mut args: Vec<String> = vec![
            "engine".into(),
            "--engine-listen".into(),
            m.addr.to_string(),
            "--engine-id".into(),
            name.into(),
            "--state-dir".into(),
            self.dir.join(name).join("state").to_string_lossy().into(),
            "--ipc-dir".into(),
            format!("/dev/shm/staccato-bed-{}-{name}", self.prefix),
            "--label".into(),
            format!("host={name}"),
        ];
        if let Some(i) = index {
            for k in i + 1..=total {
                args.extend(["--label".into(), format!("first{k}=y")]);
            }
        }
        for g in 0..self.gateways().count() {
            args.extend(["--join".into(), self.url(g)]);
        }
        args.extend(self.engine_args.iter().cloned());
        let bin = self.bin.clone();
        self.spawn(name, &bin, &args)
    }

    /// Sends `sig` to a member's process, once it is sure that pid is
    /// still a process in the member's host (a pid is reused once its
    /// process is gone).
    pub fn signal(&mut self, name: &str, sig: i32) -> Result<()> {
        let m = self.member(name)?;
        let pid = m.pid.ok_or_else(|| anyhow!("{name} was never started"))?;
        if !alive(pid) || !in_host(pid, &m.netns) {
            bail!("{name} is not running (pid {pid} is gone or is no process of host {})", m.netns);
        }
        sys::process::signal(pid, sig).with_context(|| format!("signalling {name} (pid {pid})"))?;
        Ok(())
    }

    /// GET `path` from gateway `g`, from the client host.
    pub fn gateway_get(&self, g: usize, path: &str) -> Result<serde_json::Value> {
        let (url, token, path) = (self.url(g), self.token.clone(), path.to_string());
        in_netns(&self.netns_path("client")?, move || {
            let mut gw = client::Gateway::new(&url, Some(token), Some(Duration::from_secs(3)))?;
            let r = gw.request("GET", &path, b"")?;
            client::check(&r)
        })
    }

    /// Waits until every gateway that runs lists each of `engines` ready.
    pub fn wait_ready(&self, engines: &[&str], timeout: Duration) -> Result<()> {
        let what = format!("engines {} to be ready on every gateway", engines.join(", "));
        let running: Vec<usize> =
            self.gateways().enumerate().filter(|(_, m)| m.pid.is_some_and(alive)).map(|(g, _)| g).collect();
        self.wait(timeout, &what, engines, |b| {
            for &g in &running {
                let rows = b.gateway_get(g, "/system/engines")?;
                let ready: Vec<&str> = rows
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|r| r["state"] == "ready")
                    .filter_map(|r| r["id"].as_str())
                    .collect();
                if !engines.iter().all(|e| ready.contains(e)) {
                    return Ok(false);
                }
            }
            Ok(true)
        })
    }

    /// Polls `done` until it holds; fails at once if one of `watch` (names)
    /// exits meanwhile.
    fn wait(
        &self,
        timeout: Duration,
        what: &str,
        watch: &[&str],
        mut done: impl FnMut(&Bed) -> Result<bool>,
    ) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let mut last = None;
        loop {
            match done(self) {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                Err(e) => last = Some(e),
            }
            for m in self.members.iter().filter(|m| watch.contains(&m.name.as_str())) {
                if let Some(pid) = m.pid.filter(|&p| !alive(p)) {
                    bail!("{} (pid {pid}) exited while waiting for {what}; see {}", m.name, self.log_hint(m));
                }
            }
            if Instant::now() > deadline {
                let cause = last.map_or(String::new(), |e| format!(" (last: {e:#})"));
                bail!("timed out after {timeout:?} waiting for {what}{cause}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn log_hint(&self, m: &Member) -> String {
        m.log.as_ref().map_or_else(|| "its log".into(), |l| l.display().to_string())
    }
}

/// Stops every process in the bed `prefix` (SIGTERM, then SIGKILL after
/// 15 s), removes its hosts and its engines' IPC directories.
pub fn down(prefix: &str, dir: Option<&Path>) -> Result<()> {
    let testbed = match Testbed::existing(prefix) {
        Ok(t) => t,
        Err(netns::Error::NoTestbed { .. }) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    let pids = || -> Result<Vec<u32>> {
        let mut all = testbed.pids(None)?;
        for h in testbed.hosts() {
            all.extend(testbed.pids(Some(h.index))?);
        }
        Ok(all)
    };
    for pid in pids()? {
        let _ = sys::process::signal(pid, libc::SIGTERM);
    }
    let deadline = Instant::now() + Duration::from_secs(15);
    while Instant::now() < deadline && !pids()?.is_empty() {
        std::thread::sleep(Duration::from_millis(50));
    }
    for pid in pids()? {
        let _ = sys::process::signal(pid, libc::SIGKILL);
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline && !pids()?.is_empty() {
        std::thread::sleep(Duration::from_millis(20));
    }
    // An engine that had to be killed leaves its containers, which live in
    // network namespaces of their own: remove them through runc.
    for root in dir.into_iter().flat_map(container_roots) {
        remove_containers(&root);
    }
    if let Ok(dir) = std::fs::read_dir("/dev/shm") {
        let lead = format!("staccato-bed-{prefix}-");
        for e in dir.flatten() {
            if e.file_name().to_string_lossy().starts_with(&lead) {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
    testbed.destroy().context("removing the test hosts")
}

/// The runc state directories of the bed's engines (`<dir>/<engine>/state/containers/runc`).
fn container_roots(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    entries.flatten().map(|e| e.path().join("state/containers/runc")).filter(|p| p.is_dir()).collect()
}

fn remove_containers(root: &Path) {
    let Some(runc) = which("runc") else { return };
    let Ok(out) = std::process::Command::new(&runc).arg("--root").arg(root).args(["list", "-q"]).output() else {
        return;
    };
    for id in String::from_utf8_lossy(&out.stdout).split_whitespace() {
        let _ = std::process::Command::new(&runc)
            .arg("--root")
            .arg(root)
            .args(["delete", "--force", id])
            .stderr(Stdio::null())
            .status();
    }
}

/// Runs `f` on a thread inside the network namespace at `path`.
pub fn in_netns<T: Send + 'static>(path: &Path, f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    let path = path.to_path_buf();
    std::thread::spawn(move || {
        sys::netns::enter_net(&path).with_context(|| format!("entering {}", path.display()))?;
        f()
    })
    .join()
    .map_err(|_| anyhow!("a thread in a test host panicked"))?
}

/// Whether process `pid` is in the network namespace bound at
/// /run/netns/`netns` (the same namespace file: device and inode).
fn in_host(pid: u32, netns: &str) -> bool {
    use std::os::unix::fs::MetadataExt;
    let ns = |p: PathBuf| std::fs::metadata(p).map(|m| (m.dev(), m.ino()));
    match (ns(format!("/proc/{pid}/ns/net").into()), ns(Path::new("/run/netns").join(netns))) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

/// Creates `dir` (only root may enter it) and refuses one that exists but
/// belongs to another user or is open to others: the bed runs as root
/// what it finds there (testbed.json) and appends to its logs.
fn private_dir(dir: &Path) -> Result<PathBuf> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    match std::fs::DirBuilder::new().recursive(false).mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e).with_context(|| format!("creating {}", dir.display())),
    }
    check_private(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    Ok(dir.canonicalize()?)
}

/// Refuses a bed directory that is not this user's own directory, or that
/// others may write to.
fn check_private(dir: &Path) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::symlink_metadata(dir).with_context(|| format!("reading {}", dir.display()))?;
    if !meta.is_dir() || meta.uid() != sys::process::euid() || meta.mode() & 0o022 != 0 {
        bail!("{} is not a directory of this user's that only it may write: choose another --dir", dir.display());
    }
    Ok(())
}

fn hosts_of(l: &Layout) -> u32 {
    l.gateways + l.engines + l.spare + 1
}

fn alive(pid: u32) -> bool {
    // A zombie (exited, not reaped) counts as gone.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|s| s.rsplit_once(')').is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z')))
}

fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/bin", "/usr/sbin", "/bin", "/sbin"].map(PathBuf::from))
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

fn random_token(lead: &str) -> Result<String> {
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom").and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes))?;
    Ok(format!("{lead}-{}", bytes.iter().map(|b| format!("{b:02x}")).collect::<String>()))
}
