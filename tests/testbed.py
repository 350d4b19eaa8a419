"""A Staccato cluster on test hosts for the cross-host tests: `staccato
testbed up` makes the hosts (network namespaces joined by a bridge) and
starts gateways and engines in them; this module calls them from the
testbed's client host and tears everything down, even when a test fails.

Requests go out from threads that entered the client host's network
namespace (setns on that thread alone): the rest of the test process, and
this machine's own network, never see the testbed's addresses.
"""
import contextlib
import ctypes
import http.client
import json
import os
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from harness import BIN, REPO, Resp, clean_env

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def enter_netns(path):
    """Moves the calling thread into the network namespace bound at `path`."""
    fd = os.open(path, os.O_RDONLY)
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns {path}: {os.strerror(err)}")
    finally:
        os.close(fd)


class Bed:
    """One testbed: `info` is its testbed.json."""

    def __init__(self, root, prefix, **layout):
        self.root = root
        self.prefix = prefix
        self.dir = root / "bed"
        self.layout = layout
        self.info = None
        self._client = None

    # ---- lifetime

    def up(self):
        argv = [str(BIN), "testbed", "up", "--prefix", self.prefix, "--dir", str(self.dir), "--json"]
        for key in ("gateways", "engines", "spare"):
            if key in self.layout:
                argv += [f"--{key}", str(self.layout[key])]
        argv += [f"--engine-arg={a}" for a in self.layout.get("engine_args", ())]
        p = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=clean_env(), cwd=REPO)
        assert p.returncode == 0, f"testbed up failed:\n{p.stderr}"
        self.info = json.loads(p.stdout)
        self._client = self.pool(1)

    def down(self):
        if self._client:
            self._client.shutdown()
        p = subprocess.run([str(BIN), "testbed", "down", "--prefix", self.prefix, "--dir", str(self.dir)],
                           capture_output=True, text=True, timeout=60, env=clean_env())
        assert p.returncode == 0, p.stderr
        left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert f"stb-{self.prefix}-" not in left, left

    def reload(self):
        with open(self.dir / "testbed.json") as f:
            self.info = json.load(f)

    def log_tails(self, lines=25):
        out = []
        for m in self.info["members"] if self.info else []:
            if m.get("log") and os.path.exists(m["log"]):
                with open(m["log"], errors="replace") as f:
                    tail = f.read().splitlines()[-lines:]
                out.append(f"--- {m['name']} ({m['log']})\n" + "\n".join(tail))
        return "\n".join(out)

    # ---- members

    def member(self, name):
        return next(m for m in self.info["members"] if m["name"] == name)

    def engines(self):
        return [m["name"] for m in self.info["members"] if m["role"] == "engine" and m["pid"]]

    def gateway_addr(self, g):
        gws = [m for m in self.info["members"] if m["role"] == "gateway"]
        host, port = gws[g]["addr"].rsplit(":", 1)
        return host, int(port)

    def verb(self, *args, timeout=90):
        """`staccato testbed VERB ...` on this bed."""
        p = subprocess.run([str(BIN), "testbed", args[0], "--prefix", self.prefix, "--dir", str(self.dir), *args[1:]],
                           capture_output=True, text=True, timeout=timeout, env=clean_env())
        assert p.returncode == 0, f"testbed {' '.join(args)}:\n{p.stderr}"
        self.reload()
        return p

    # ---- calling from the client host

    def pool(self, n):
        """`n` threads inside the client host."""
        path = f"/run/netns/{self.member('client')['netns']}"
        return ThreadPoolExecutor(n, initializer=enter_netns, initargs=(path,))

    def on_client(self, fn, *args):
        return self._client.submit(fn, *args).result()

    def request(self, g, method, path, body=None, headers=None, timeout=10.0):
        """One request to gateway `g` from the client host."""
        return self.on_client(lambda: Conn(self, g, timeout).request(method, path, body, headers))

    def get(self, g, path):
        r = self.request(g, "GET", path, headers=self.auth())
        assert r.status == 200, r
        return r.json()

    def invoke(self, g, name, data=b"", timeout=10.0):
        return self.request(g, "POST", f"/function/{name}", body=data, timeout=timeout)

    def auth(self):
        return {"Authorization": f"Bearer {self.info['token']}"}

    def table(self, g=0):
        return {e["id"]: e for e in self.get(g, "/system/engines")}

    def ready(self, g=0):
        return sorted(i for i, e in self.table(g).items() if e["state"] == "ready")

    def cli(self, *args, g=0, timeout=120):
        """The staccato command line, run in the client host against gateway `g`."""
        host, port = self.gateway_addr(g)
        env = clean_env(STACCATO_GATEWAY=f"http://{host}:{port}", STACCATO_TOKEN=self.info["token"])
        return subprocess.run(["nsenter", f"--net=/run/netns/{self.member('client')['netns']}", "--", str(BIN),
                               *map(str, args)], capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO)


class Conn:
    """A keep-alive connection to a gateway, made from a client-host thread."""

    def __init__(self, bed, g, timeout=10.0):
        host, port = bed.gateway_addr(g)
        self.c = http.client.HTTPConnection(host, port, timeout=timeout)

    def request(self, method, path, body=None, headers=None):
        self.c.request(method, path, body=body, headers=headers or {})
        r = self.c.getresponse()
        data = r.read()
        return Resp(r.status, {k.lower(): v for k, v in r.getheaders()}, data)

    def close(self):
        self.c.close()


class Load:
    """Calls of `name` from `conns` keep-alive connections of the client
    host, spread over the gateways given, until stopped. Each call's input
    is unique and the function echoes it, so an answer meant for another
    call (a call answered twice, or out of order) is caught. Every call
    ends one way: ok, an HTTP error (by kind), or unanswered (the
    connection failed or timed out)."""

    def __init__(self, bed, name, conns=8, gateways=(0,), timeout=10.0, expect=lambda body: body):
        self.bed, self.name, self.timeout, self.expect = bed, name, timeout, expect
        self.gateways = gateways
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.sent = 0
        self.ok = 0
        self.errors = {}
        self.unanswered = []
        self.mismatched = []
        self.by_engine = {}
        self.error_times = []  # monotonic time each error answer came
        self.messages = {}  # (status, kind) -> the first message
        self.ex = bed.pool(conns)
        self.futures = [self.ex.submit(self._run, i) for i in range(conns)]

    def _run(self, i):
        g = self.gateways[i % len(self.gateways)]
        conn = None
        n = 0
        while not self.stop.is_set():
            body = f"{self.bed.prefix}-{i}-{n}".encode()
            n += 1
            with self.lock:
                self.sent += 1
            try:
                if conn is None:
                    conn = Conn(self.bed, g, self.timeout)
                r = conn.request("POST", f"/function/{self.name}", body)
            except (OSError, http.client.HTTPException) as e:
                with self.lock:
                    self.unanswered.append(repr(e))
                if conn:
                    conn.close()
                conn = None
                time.sleep(0.05)  # not a tight loop against a gateway that is gone
                continue
            with self.lock:
                if r.status == 200:
                    if r.body != self.expect(body):
                        self.mismatched.append((body, r.body))
                    else:
                        self.ok += 1
                        e = r.headers.get("x-staccato-engine")
                        self.by_engine[e] = self.by_engine.get(e, 0) + 1
                else:
                    err = r.json()["error"]
                    kind = err["kind"]
                    self.errors[(r.status, kind)] = self.errors.get((r.status, kind), 0) + 1
                    self.messages.setdefault((r.status, kind), err["message"])
                    self.error_times.append(time.monotonic())
            if r.headers.get("connection", "").lower() == "close":
                conn.close()
                conn = None
        if conn:
            conn.close()

    def finish(self):
        self.stop.set()
        for f in self.futures:
            f.result()
        self.ex.shutdown()
        return self

    # As a context manager, a test that fails mid-load still stops it
    # (its threads would otherwise keep pytest from exiting).
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if not self.stop.is_set():
            self.stop.set()
            self.ex.shutdown(wait=True)

    def counts(self):
        return {"sent": self.sent, "ok": self.ok, "errors": dict(self.errors),
                "unanswered": len(self.unanswered), "mismatched": len(self.mismatched), "by_engine": self.by_engine}


@contextlib.contextmanager
def cluster_bed(root, prefix, **layout):
    bed = Bed(root, prefix, **layout)
    try:
        bed.up()
        yield bed
    except BaseException:
        print(bed.log_tails())
        raise
    finally:
        bed.down()
