"""The ways the application runs, each started and stopped by this module:
Staccato with its default settings, Staccato with every internal call sent
over HTTP through the gateway, Staccato with managed concurrency off, and
the same handlers as RPC servers calling each other directly."""

import contextlib
import http.client
import json
import os
import secrets
import signal
import subprocess
import time
from pathlib import Path
from urllib.parse import urlsplit

from . import data
from . import stores as st

HERE = Path(__file__).resolve().parent.parent  # examples/socialnet
REPO = HERE.parent.parent
STACCATO = REPO / "target" / "release" / "staccato"
GO_DIR = HERE / "go"
PY_DIR = HERE / "python"

# The Go services and the RPC variant's frontend (all six API functions in
# one server, as DeathStarBench's nginx serves every API).
GO_SERVICES = ["sn-compose-post", "sn-url-shorten", "sn-user-mention", "sn-user", "sn-unique-id",
               "sn-post-storage", "sn-user-timeline", "sn-home-timeline", "sn-social-graph"]
PY_SERVICES = {"sn-text": "text:handle", "sn-media": "media:handle"}
APIS = ["sn-post-compose", "sn-home-timeline-read", "sn-user-timeline-read", "sn-user-follow",
        "sn-user-register", "sn-user-login"]
ALL_FUNCTIONS = GO_SERVICES + list(PY_SERVICES) + APIS

VARIANTS = ["staccato", "staccato-via-gateway", "staccato-fixed", "rpc", "staccato-nospin", "staccato-nopause"]
# What `snctl.py bench` runs unless told otherwise.
DEFAULT_VARIANTS = VARIANTS[:5]
DESCRIPTIONS = {
    "staccato": "Staccato, default settings",
    "staccato-via-gateway": "Staccato, every internal call over HTTP through the gateway",
    "staccato-fixed": "Staccato, managed concurrency off (tau = max_workers)",
    "rpc": "RPC servers (one process per service, HTTP/1.1 keep-alive pools)",
    # Not one of the issue's variants: it isolates what the defaults' spinning
    # and pausing cost on 2 vCPUs (BENCHMARKS.md, "SocialNetwork").
    "staccato-nospin": "Staccato, no spinning, no pausing (--worker-spin-us 0 --engine-spin-us 0 --no-pause)",
    "staccato-nopause": "Staccato, no pausing (--no-pause)",
    "staccato-3hosts": "Staccato, a gateway and 3 engine hosts",
    "rpc-3hosts": "RPC servers spread over 3 hosts",
}

# Each variant's flags to `staccato up` beyond the defaults.
STACCATO_FLAGS = {
    "staccato": [],
    "staccato-via-gateway": ["--internal-calls-via", "{url}"],
    "staccato-fixed": ["--concurrency", "fixed"],
    "staccato-nospin": ["--worker-spin-us", "0", "--engine-spin-us", "0", "--no-pause"],
    "staccato-nopause": ["--no-pause"],
}


def http_get(port, path, timeout=2.0):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request("GET", path)
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def get_json(base, path, token=None):
    """GET base+path (with a bearer token), its JSON answer; anything but
    200 is an error."""
    u = urlsplit(base)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
    try:
        c.request("GET", path, headers={"Authorization": f"Bearer {token}"} if token else {})
        r = c.getresponse()
        body = r.read()
    finally:
        c.close()
    if r.status != 200:
        raise RuntimeError(f"GET {base}{path}: HTTP {r.status}: {body[:300]!r}")
    return json.loads(body)


def wait_http(port, path, proc, log, what, timeout=60.0, ok=(200,)):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited ({proc.returncode}):\n"
                               f"{Path(log).read_text(errors='replace')[-3000:]}")
        with contextlib.suppress(OSError, http.client.HTTPException):
            if http_get(port, path)[0] in ok:
                return
        time.sleep(0.1)
    raise RuntimeError(f"{what} did not answer {path} on port {port} within {timeout:.0f} s")


def stop(proc, timeout=20):
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def _uid_of(proc_dir):
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in (proc_dir / "status").read_text().splitlines():
            if line.startswith("Uid:"):
                return int(line.split()[1])
    return None


def store_ports(s):
    return f"{s.redis_port},{s.memcached_port},{s.pg_port}"


def manifest_for(s):
    """examples/socialnet/staccato.yml with absolute sources and the stores'
    ports (the file names the default ones)."""
    text = (HERE / "staccato.yml").read_text()
    for d in ("go", "python"):
        text = text.replace(f"    source: {d}\n", f"    source: {HERE / d}\n")
    for var, default, port in (("SN_REDIS_PORT", st.REDIS_PORT, s.redis_port),
                               ("SN_MEMCACHED_PORT", st.MEMCACHED_PORT, s.memcached_port),
                               ("SN_PG_PORT", st.PG_PORT, s.pg_port)):
        text = text.replace(f'{var}: "{default}"', f'{var}: "{port}"')
    if s.host != "127.0.0.1":
        # Stores on another server (a testbed host): reached by address.
        text = text.replace('SN_PG_PORT: "', f'SN_STORE_HOST: "{s.host}", SN_PG_PORT: "')
    return text


class StaccatoVariant:
    """One `staccato up`, with the application deployed."""

    def __init__(self, name, workdir, port, stores, extra=(), isolation=None, state=None):
        self.name, self.port, self.stores = name, port, stores
        self.workdir = Path(workdir) / name
        # A state directory another variant deployed to serves its functions
        # again at start, without a deploy (`start(deploy=False)`).
        self.state = Path(state) if state else self.workdir / "state"
        self.token = secrets.token_hex(16)
        self.extra = list(extra)
        self.isolation = isolation
        self.proc = None
        self.env = {}  # more environment for `staccato up` (e.g. STACCATO_RUNTIMES)

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    def argv(self):
        a = [str(STACCATO), "up", "--listen", f"127.0.0.1:{self.port}", "--state-dir", str(self.state),
             "--token", self.token, "--host-ports", store_ports(self.stores)]
        a += [f.format(url=self.url) for f in STACCATO_FLAGS[self.name]]
        if self.isolation:
            a += ["--isolation", self.isolation]
        return a + self.extra

    def start(self, progress=print, deploy=True):
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log = self.workdir / "staccato.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("STACCATO_")}
        env.update(self.env)
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(self.argv(), stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        wait_http(self.port, "/healthz", self.proc, self.log, f"staccato up ({self.name})")
        if not deploy:
            self.wait_ready()
            progress(f"  {self.name}: staccato up on {self.url}, serving the functions its state holds")
            return
        progress(f"  {self.name}: staccato up on {self.url}; deploying (Go functions compile on first deploy)")
        t0 = time.monotonic()
        manifest = self.workdir / "staccato.yml"
        manifest.write_text(manifest_for(self.stores))
        r = subprocess.run([str(STACCATO), "--gateway", self.url, "--token", self.token, "deploy", str(manifest)],
                           capture_output=True, text=True, env=env)
        if r.returncode != 0:
            raise RuntimeError(f"deploy to {self.name} failed:\n{r.stdout}{r.stderr}")
        progress(f"  {self.name}: {len(ALL_FUNCTIONS)} functions deployed in {time.monotonic() - t0:.1f} s")

    def stop(self):
        stop(self.proc)

    def api(self):
        return data.Api(self.url)

    def functions(self):
        return get_json(self.url, "/system/functions", self.token)

    def wait_ready(self, timeout=120.0):
        """Until every function of the application runs (a restart restores
        them one by one)."""
        deadline = time.monotonic() + timeout
        while True:
            ready = {f["name"] for f in self.functions() if (f.get("status") or {}).get("launcher") == "ready"}
            missing = sorted(set(ALL_FUNCTIONS) - ready)
            if not missing:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name}: functions not ready after {timeout:.0f} s: {missing}")
            time.sleep(0.2)

    def kill_function(self, name):
        """SIGKILLs every process of a function's container (its launcher
        and workers): what a crash or the OOM killer does. Returns the pids."""
        f = next(f for f in self.functions() if f["name"] == name)
        uid = ((f.get("status") or {}).get("container") or {}).get("uid")
        if uid is None:
            raise RuntimeError(f"{name} runs in no container here; kill_function needs container isolation")
        pids = [int(d.name) for d in Path("/proc").iterdir() if d.name.isdigit() and _uid_of(d) == uid]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return pids

    def calls_total(self):
        """Calls every function has taken since it was deployed (external
        and internal), from the gateway's status."""
        st = {f["name"]: f.get("status") or {} for f in self.functions()}
        return {name: s.get("completed", 0) + s.get("failed", 0) for name, s in st.items()}


class RpcVariant:
    """The same handlers as long-running RPC servers: cmd/rpcserver for the
    Go services and the frontend, python/rpcserver.py for sn-text and
    sn-media, each on a port of its own, peers found from peers.json."""

    name = "rpc"

    def __init__(self, workdir, base_port, stores, port_fn=None):
        self.workdir = Path(workdir) / "rpc"
        # Server i listens on base_port + i, or on port_fn() (tests: free ports).
        self.port_fn = port_fn or (lambda i: base_port + i)
        self.stores = stores
        self.procs = {}
        self.ports = {}

    @property
    def url(self):
        return f"http://127.0.0.1:{self.ports['frontend']}"

    def build(self, progress=print):
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.binary = self.workdir / "rpcserver"
        progress("  rpc: building cmd/rpcserver")
        env = dict(os.environ, PATH=os.environ.get("PATH", "") + ":/usr/local/go/bin", GOFLAGS="-mod=mod")
        r = subprocess.run(["go", "build", "-o", str(self.binary), "./cmd/rpcserver"], cwd=GO_DIR,
                           capture_output=True, text=True, env=env)
        if r.returncode != 0:
            raise RuntimeError(f"building rpcserver failed:\n{r.stdout}{r.stderr}")

    def start(self, progress=print):
        self.build(progress)
        servers = {"frontend": APIS, **{s: [s] for s in GO_SERVICES}, **{s: [s] for s in PY_SERVICES}}
        peers = {}
        for i, (server, names) in enumerate(servers.items()):
            self.ports[server] = self.port_fn(i)
            for n in names:
                peers[n] = f"http://127.0.0.1:{self.ports[server]}"
        peers_file = self.workdir / "peers.json"
        peers_file.write_text(json.dumps(peers, indent=1))
        env = dict(os.environ, SN_REDIS_PORT=str(self.stores.redis_port),
                   SN_MEMCACHED_PORT=str(self.stores.memcached_port), SN_PG_PORT=str(self.stores.pg_port))
        env.pop("STACCATO_HOST_IP", None)
        for server, names in servers.items():
            port = self.ports[server]
            if server in PY_SERVICES:
                argv = ["python3", str(PY_DIR / "rpcserver.py"), "--listen", f"127.0.0.1:{port}",
                        "--serve", f"{server}={PY_SERVICES[server]}", "--peers", str(peers_file)]
            else:
                argv = [str(self.binary), "-listen", f"127.0.0.1:{port}", "-serve", ",".join(names),
                        "-peers", str(peers_file)]
            log = self.workdir / f"{server}.log"
            with open(log, "ab") as out:
                self.procs[server] = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                                      stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        for server, p in self.procs.items():
            wait_http(self.ports[server], "/healthz", p, self.workdir / f"{server}.log", f"rpc server {server}")
        progress(f"  rpc: {len(self.procs)} servers up, frontend on {self.url}")

    def stop(self):
        for p in self.procs.values():
            stop(p)

    def api(self):
        return data.Api(self.url)

    def pids(self):
        return [p.pid for p in self.procs.values()]

    def calls_total(self):
        """Requests each server has served (external and internal)."""
        out = {}
        for server, port in self.ports.items():
            _, body = http_get(port, "/stats")
            out[server] = json.loads(body)["served"]
        return out

    def server_of(self, name):
        return "frontend" if name in APIS else name


def make(name, workdir, port, stores, isolation=None, state=None):
    if name == "rpc":
        return RpcVariant(workdir, port, stores)
    if name not in VARIANTS:
        raise ValueError(f"unknown variant {name!r}; variants: {', '.join(VARIANTS)}")
    return StaccatoVariant(name, workdir, port, stores, isolation=isolation, state=state)


__all__ = ["make", "VARIANTS", "StaccatoVariant", "RpcVariant", "st"]
