"""Shared harness for tests that drive the real `staccato` binary: a server
started on a free loopback port, HTTP helpers, polling helpers.

Used by tests/test_integration.py and conformance/test_conformance.py.
"""
import contextlib
import http.client
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import cgroups


REPO = Path(__file__).resolve().parent.parent
BIN = REPO / "target" / "release" / "staccato"
FUNCS = REPO / "tests" / "functions"
PAYLOAD_MAX = 6 << 20  # the default --payload-max

HEX16 = re.compile(r"[0-9a-f]{16}")
TIMING = re.compile(r"queue_us=(\d+),exec_us=(\d+),cold_us=(\d+)")

if not BIN.is_file():
    # Fail, never skip: a suite that silently skips would pass CI untested.
    raise RuntimeError(f"{BIN} is not built: run `make build` (or `cargo build --release`) first")


# ---------------------------------------------------------------- helpers


def free_port():
    """A free port below the kernel's ephemeral range: a port the kernel
    picked for us could be picked again for a socket the server binds to
    port 0 (the build proxy) before the server takes it."""
    low = 32768
    with contextlib.suppress(OSError, ValueError):
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for _ in range(200):
        port = random.randrange(1024 if low <= 10000 else 10000, low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise AssertionError("no free port below the ephemeral range")


def stop_process(proc, sig=signal.SIGTERM):
    """Sends `sig`, waits up to 10 s for the process to end, then kills it."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def clean_env(**extra):
    """The environment for staccato processes: none of the user's STACCATO_*."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("STACCATO_")}
    env.update(extra)
    return env


class Resp:
    def __init__(self, status, headers, body):
        self.status = status
        self.headers = headers
        self.body = body

    def json(self):
        return json.loads(self.body)

    def __repr__(self):
        return f"<Resp {self.status} {self.body[:300]!r}>"


def request(port, method, path, body=None, headers=None, timeout=10.0):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        data = r.read()
        return Resp(r.status, {k.lower(): v for k, v in r.getheaders()}, data)
    finally:
        conn.close()


class Server:
    """One `staccato up` process with its own state and IPC directories."""

    def __init__(self, workdir, *, state_dir=None, token=None, port=None, argv=None, extra=()):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.state_dir = Path(state_dir or self.workdir / "state")
        self.ipc_dir = Path(f"/dev/shm/staccato-test-{self.port}")
        self.token = token
        self.log_path = self.workdir / f"staccato-{self.port}.log"
        self.proc = None
        self.argv = argv  # instead of `staccato up ...`
        self.extra = list(extra)  # more `staccato up` options

    @property
    def gateway(self):
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout=20.0):
        args = [str(BIN), "up", "--listen", f"127.0.0.1:{self.port}", "--state-dir", str(self.state_dir),
                "--ipc-dir", str(self.ipc_dir)]
        if self.token:
            args += ["--token", self.token]
        args += self.extra
        if self.argv:
            args = self.argv
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env=clean_env(), cwd=REPO)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"staccato up exited with {self.proc.returncode}:\n{self.log_tail()}")
            healthy = False
            with contextlib.suppress(OSError):
                healthy = request(self.port, "GET", "/healthz", timeout=1).status == 200
            if healthy:
                token_file = self.state_dir / "token"
                if self.token is None and token_file.is_file():
                    # `up` on loopback made a management token of its own.
                    self.token = token_file.read_text().strip()
                return self
            time.sleep(0.05)
        raise AssertionError(f"staccato up not healthy within {timeout}s:\n{self.log_tail()}")

    def stop(self, sig=signal.SIGTERM):
        if self.proc:
            stop_process(self.proc, sig)
            self._log.close()
        self.proc = None

    def cleanup(self):
        self.stop()
        shutil.rmtree(self.ipc_dir, ignore_errors=True)

    def log_tail(self, lines=60):
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    # -- calls

    def auth(self):
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def invoke(self, name, data=b"", headers=None, timeout=10.0):
        return request(self.port, "POST", f"/function/{name}", body=data, headers=headers, timeout=timeout)

    def get(self, path, timeout=10.0, headers=None):
        return request(self.port, "GET", path, headers={**self.auth(), **(headers or {})}, timeout=timeout)

    def function(self, name):
        r = self.get(f"/system/functions/{name}")
        assert r.status == 200, r
        return r.json()

    def container(self, name):
        """The id of the function's container, or None (process isolation)."""
        st = self.function(name)["status"]
        return (st.get("container") or {}).get("id")

    def wait_pool(self, n, timeout=60):
        """Waits until the function pool has made its first n containers
        (each with its init running): on a slow machine (the cgroup v2
        VM's emulated CPUs) a deploy can otherwise come before the pool and
        make a container of its own."""
        pid = str(self.proc.pid)
        prefixes = [p.name[:-len(".lock")] for p in Path("/run/staccato/engines").glob("s*.lock")
                    if p.read_text().strip() == pid]
        assert prefixes, "no pool claim for this server"
        ok = wait_for(lambda: all(cgroups.procs(f"{prefixes[0]}-{i}") for i in range(n)), timeout=timeout)
        assert ok, f"the pool did not make {n} containers in {timeout} s"

    def sched(self, name):
        st = self.function(name)["status"]
        assert st, f"engine has no status for {name}"
        return st["scheduler"]

    def cli(self, *args, token=None, timeout=60, extra_env=None):
        env = clean_env(STACCATO_GATEWAY=self.gateway, **(extra_env or {}))
        token = token or self.token
        if token:
            env["STACCATO_TOKEN"] = token
        return subprocess.run([str(BIN), *map(str, args)], capture_output=True, text=True, timeout=timeout, env=env,
                              cwd=REPO)

    def deploy(self, path, token=None):
        p = self.cli("deploy", path, token=token)
        assert p.returncode == 0, f"deploy failed:\n{p.stdout}\n{p.stderr}\n{self.log_tail()}"
        return p


@contextlib.contextmanager
def own_server(workdir, **kw):
    """A private server; its log tail is printed if the block fails."""
    srv = Server(workdir, **kw)
    try:
        srv.start()
        yield srv
    except BaseException:
        print(f"--- tail of {srv.log_path}\n{srv.log_tail()}")
        raise
    finally:
        srv.cleanup()


def send_too_large(port, path, chunked, limit=PAYLOAD_MAX):
    """A POST with one byte more than the gateway takes: declared up front
    (Content-Length), or found out while reading (chunked). The gateway may
    answer before the body is all sent."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.putrequest("POST", path)
        conn.putheader(*(("Transfer-Encoding", "chunked") if chunked else ("Content-Length", str(limit + 1))))
        conn.endheaders()
        block, sent = b"\xab" * 65536, 0
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            while sent < limit + 1:
                n = min(len(block), limit + 1 - sent)
                conn.send(b"%x\r\n%s\r\n" % (n, block[:n]) if chunked else block[:n])
                sent += n
            if chunked:
                conn.send(b"0\r\n\r\n")
        r = conn.getresponse()
        return Resp(r.status, {k.lower(): v for k, v in r.getheaders()}, r.read())
    finally:
        conn.close()


def check_error(r, status, kind, *, in_message=None, call_id=True):
    """An error response: the status, and a body with kind, message, call id."""
    assert r.status == status, r
    assert r.headers.get("content-type", "").startswith("application/json"), r.headers
    err = r.json()["error"]
    assert set(err) >= {"kind", "message", "call_id"}, err
    assert err["kind"] == kind, err
    assert isinstance(err["message"], str) and err["message"], err
    if call_id:
        assert isinstance(err["call_id"], str) and HEX16.fullmatch(err["call_id"]), err
        assert r.headers.get("x-call-id") == err["call_id"], (r.headers, err)
    else:
        assert err["call_id"] is None or HEX16.fullmatch(err["call_id"]), err
    if in_message is not None:
        assert in_message in err["message"], err
    return err


def timing(r):
    m = TIMING.fullmatch(r.headers.get("x-staccato-timing", ""))
    assert m, r.headers
    return {"queue_us": int(m[1]), "exec_us": int(m[2]), "cold_us": int(m[3])}


def ok_body(r):
    assert r.status == 200, r
    return r.body


def wait_for(pred, timeout, interval=0.1):
    """Polls pred() until it returns something true or the time is up; returns its last value."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v or time.monotonic() >= deadline:
            return v
        time.sleep(interval)


def traces(srv, function, limit=200):
    """Recent call traces, newest first; `function=None` means all functions."""
    query = f"limit={limit}" + (f"&function={function}" if function else "")
    r = srv.get(f"/system/trace?{query}")
    assert r.status == 200, r
    return r.json()


def shm_files(srv):
    """Payload files left in any function's shm directory."""
    return sorted(str(p) for p in srv.ipc_dir.glob("*/shm/*"))


def manifest_names(path):
    """Function names of a manifest (two-space indented keys under functions:)."""
    names, inside = [], False
    for line in Path(path).read_text().splitlines():
        if re.match(r"^functions:\s*$", line):
            inside = True
        elif inside and re.match(r"^\S", line):
            inside = False
        elif inside:
            m = re.match(r"^  ([a-z][a-z0-9_-]*):\s*$", line)
            if m:
                names.append(m[1])
    return names


def alive_pid(pid, container=None):
    """The process exists and is not a zombie. A pid a function reported
    from inside a container is its PID namespace's number: pass the
    container id (from the function's status) to look it up there."""
    if container is not None:
        pid = host_pid(container, pid)
        if pid is None:
            return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def container_pids(container):
    """Host pids of every process in a function container."""
    return cgroups.procs(container)


def host_pid(container, ns_pid):
    for p in container_pids(container):
        try:
            status = Path(f"/proc/{p}/status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("NSpid:") and int(line.split()[-1]) == ns_pid:
                return p
    return None


def max_overlap(intervals):
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals], key=lambda x: (x[0], x[1]))
    cur = best = 0
    for _, d in events:
        cur += d
        best = max(best, cur)
    return best
