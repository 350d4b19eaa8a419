"""The application over several servers, on a testbed (`staccato testbed`:
test hosts made of network namespaces joined by a bridge): a gateway, three
engine hosts, a host for the stores and a client host.

* Staccato: the gateway on its host and an engine on each engine host; every
  function runs on every engine, external calls are balanced over the
  engines, and an internal call stays on its caller's engine.
* RPC servers: the twelve servers spread over the engine hosts (server i on
  host i mod 3, the frontend on the first), each calling its peers at their
  hosts' addresses.

The stores listen on their own host's address. Functions reach them with
the engines' `--network host`, which on a test host means that host's
namespace: the isolated function network reaches host loopback ports only,
not another server (README "Isolation").

Nothing here touches this machine's own network: processes start in a
host's namespace through nsenter, and this process talks to the testbed
only from threads that entered the client host's namespace.
"""

import json
import os
import secrets
import subprocess
import time
from pathlib import Path

from . import data, stores, variants

HOSTS = 3


class Bed:
    """A testbed for the application; `down` removes it and everything in it."""

    def __init__(self, workdir, prefix=None):
        # A name and directory of its own each time: engines of an earlier
        # bed still removing their containers hold their state's claims.
        self.prefix = prefix or "sn" + secrets.token_hex(2)
        self.dir = Path(workdir) / f"testbed-{self.prefix}"
        self.info = None

    def go_proxy(self, progress=print):
        """A module proxy in a directory holding the Go functions' modules:
        test hosts reach nothing beyond the testbed, so their engines' builds
        take modules from it (GOPROXY=file://..., which engines bind into
        their build sandboxes read-only) instead of proxy.golang.org."""
        cache = self.dir.parent / "go-modcache"
        env = dict(os.environ, GOMODCACHE=str(cache), GOFLAGS="-mod=mod",
                   PATH=os.environ.get("PATH", "") + ":/usr/local/go/bin")
        r = subprocess.run(["go", "mod", "download", "all"], cwd=variants.GO_DIR, capture_output=True, text=True,
                           env=env)
        if r.returncode != 0:
            raise RuntimeError(f"go mod download (for the testbed's module proxy) failed:\n{r.stderr[-2000:]}")
        progress(f"  Go modules for the test hosts' builds in {cache}")
        return f"file://{cache}/cache/download"

    def up(self, progress=print):
        env = {k: v for k, v in os.environ.items() if not k.startswith("STACCATO_")}
        env.update(GOPROXY=self.go_proxy(progress), GOSUMDB="off")
        argv = [str(variants.STACCATO), "testbed", "up", "--prefix", self.prefix, "--dir", str(self.dir),
                "--gateways", "1", "--engines", str(HOSTS), "--spare", "1", "--json",
                "--engine-arg=--network=host"]
        p = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)
        if p.returncode != 0:
            raise RuntimeError(f"staccato testbed up failed:\n{p.stderr[-3000:]}")
        self.info = json.loads(p.stdout)
        progress(f"  testbed {self.prefix}: gateway {self.member('gw0')['addr']}, engines on "
                 f"{', '.join(m['addr'].split(':')[0] for m in self.engines())}, stores on "
                 f"{self.host_addr(self.store_host())}, client {self.host_addr('client')}")

    def down(self, quiet=False):
        env = {k: v for k, v in os.environ.items() if not k.startswith("STACCATO_")}
        p = subprocess.run([str(variants.STACCATO), "testbed", "down", "--prefix", self.prefix, "--dir",
                            str(self.dir)], capture_output=True, text=True, timeout=120, env=env)
        if p.returncode != 0 and not quiet:
            raise RuntimeError(f"staccato testbed down failed:\n{p.stderr[-2000:]}")

    # ---- members

    def member(self, name):
        return next(m for m in self.info["members"] if m["name"] == name)

    def engines(self):
        spare = self.store_host()
        return [m for m in self.info["members"] if m["role"] == "engine" and m["name"] != spare]

    def store_host(self):
        return f"engine{HOSTS}"  # the spare host: no engine runs there

    def netns(self, name):
        return f"/run/netns/{self.member(name)['netns']}"

    def host_addr(self, name):
        return self.member(name)["addr"].rsplit(":", 1)[0]

    @property
    def url(self):
        return f"http://{self.member('gw0')['addr']}"

    @property
    def token(self):
        return self.info["token"]

    def run(self, name, argv, **kw):
        """argv in member `name`'s host, to its end."""
        return subprocess.run(["nsenter", f"--net={self.netns(name)}", "--", *argv], **kw)

    def spawn(self, name, argv, log, env=None):
        with open(log, "ab") as out:
            return subprocess.Popen(["nsenter", f"--net={self.netns(name)}", "--", *argv], stdout=out,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                    start_new_session=True)

    def stores(self, root):
        """The stores on their host's address (started by the caller)."""
        return stores.Stores(root, host=self.host_addr(self.store_host()), netns=self.netns(self.store_host()))


class ClientApi(data.Api):
    """The application's API from the client host: every request on a
    thread of this process that entered its namespace."""

    def __init__(self, base_url, netns, timeout=30.0):
        super().__init__(base_url, timeout)
        self.ns = netns

    def call(self, name, body):
        return stores.in_netns(self.ns, super().call, name, body)


class StaccatoCluster:
    """Staccato over the testbed: the gateway gw0, an engine per host."""

    name = "staccato-3hosts"

    def __init__(self, bed, s, workdir):
        self.bed, self.stores, self.workdir = bed, s, Path(workdir) / self.name
        self.token = bed.token

    @property
    def url(self):
        return self.bed.url

    def start(self, progress=print):
        self.workdir.mkdir(parents=True, exist_ok=True)
        manifest = self.workdir / "staccato.yml"
        manifest.write_text(variants.manifest_for(self.stores))
        t0 = time.monotonic()
        r = self.bed.run("client", [str(variants.STACCATO), "--gateway", self.url, "--token", self.token, "deploy",
                                    str(manifest)], capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"deploy to the testbed failed:\n{r.stdout}{r.stderr}")
        progress(f"  {self.name}: deployed to {len(self.bed.engines())} engines in {time.monotonic() - t0:.1f} s")

    def stop(self):
        pass  # the bed's `down` stops it

    def functions(self):
        api = ClientApi(self.url, self.bed.netns("client"))
        return stores.in_netns(api.ns, variants.get_json, self.url, "/system/functions", self.token)

    def calls_total(self):
        st = {}
        for f in self.functions():
            # Calls on every engine that runs it.
            for e in f.get("by_engine", []):
                s = e["status"]
                st[f["name"]] = st.get(f["name"], 0) + s.get("completed", 0) + s.get("failed", 0)
        return st

    def api(self):
        return ClientApi(self.url, self.bed.netns("client"))


class RpcCluster(variants.RpcVariant):
    """The RPC servers spread over the engine hosts."""

    name = "rpc-3hosts"

    def __init__(self, bed, s, workdir, base_port=19100):
        super().__init__(Path(workdir) / "rpc-3hosts", base_port, s)
        self.workdir = Path(workdir) / "rpc-3hosts"
        self.bed = bed
        self.hosts = {}

    @property
    def url(self):
        return f"http://{self.bed.host_addr(self.hosts['frontend'])}:{self.ports['frontend']}"

    def start(self, progress=print):
        self.build(progress)
        engines = [m["name"] for m in self.bed.engines()]
        servers = {"frontend": variants.APIS, **{s: [s] for s in variants.GO_SERVICES},
                   **{s: [s] for s in variants.PY_SERVICES}}
        peers = {}
        for i, (server, names) in enumerate(servers.items()):
            self.hosts[server] = engines[i % len(engines)]
            self.ports[server] = self.port_fn(i)
            for n in names:
                peers[n] = f"http://{self.bed.host_addr(self.hosts[server])}:{self.ports[server]}"
        peers_file = self.workdir / "peers.json"
        peers_file.write_text(json.dumps(peers, indent=1))
        env = dict(os.environ, SN_STORE_HOST=self.stores.host, SN_REDIS_PORT=str(self.stores.redis_port),
                   SN_MEMCACHED_PORT=str(self.stores.memcached_port), SN_PG_PORT=str(self.stores.pg_port))
        for server, names in servers.items():
            listen = f"{self.bed.host_addr(self.hosts[server])}:{self.ports[server]}"
            if server in variants.PY_SERVICES:
                argv = ["python3", str(variants.PY_DIR / "rpcserver.py"), "--listen", listen, "--serve",
                        f"{server}={variants.PY_SERVICES[server]}", "--peers", str(peers_file)]
            else:
                argv = [str(self.binary), "-listen", listen, "-serve", ",".join(names), "-peers", str(peers_file)]
            self.procs[server] = self.bed.spawn(self.hosts[server], argv, self.workdir / f"{server}.log", env)
        for server, p in self.procs.items():
            addr = self.bed.host_addr(self.hosts[server])
            stores.wait_port(self.ports[server], f"rpc server {server}", proc=p,
                             log=self.workdir / f"{server}.log", host=addr, netns=self.bed.netns("client"))
        progress(f"  {self.name}: {len(self.procs)} servers on {len(engines)} hosts, frontend on {self.url}")

    def calls_total(self):
        out = {}
        for server, port in self.ports.items():
            url = f"http://{self.bed.host_addr(self.hosts[server])}:{port}"
            out[server] = stores.in_netns(self.bed.netns("client"), variants.get_json, url, "/stats", None)["served"]
        return out

    def api(self):
        return ClientApi(self.url, self.bed.netns("client"))
