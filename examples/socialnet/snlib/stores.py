"""The application's stores, real servers from Debian's packages on
loopback: Redis (timelines, the social graph's cache), memcached (users,
posts) and PostgreSQL (the document store: JSONB documents where
DeathStarBench keeps MongoDB collections). Data lives under one directory;
`down` stops them and leaves it.
"""

import contextlib
import ctypes
import json
import os
import pwd
import queue
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

REDIS_PORT = 16379
MEMCACHED_PORT = 21211
PG_PORT = 15432
PG_USER = "socialnet"
PG_DB = "socialnet"

SCHEMA = """
CREATE TABLE users (user_id bigint PRIMARY KEY, username text UNIQUE NOT NULL, doc jsonb NOT NULL);
CREATE TABLE posts (post_id bigint PRIMARY KEY, doc jsonb NOT NULL);
CREATE TABLE urls (short_url text PRIMARY KEY, expanded_url text NOT NULL);
CREATE TABLE user_timeline (user_id bigint NOT NULL, post_id bigint NOT NULL, ts bigint NOT NULL,
                            PRIMARY KEY (user_id, post_id));
CREATE TABLE social_graph (follower_id bigint NOT NULL, followee_id bigint NOT NULL, ts bigint NOT NULL,
                           PRIMARY KEY (follower_id, followee_id));
CREATE INDEX social_graph_followee ON social_graph (followee_id);
"""

# Where function containers connect from (netns: 10.200.0.0/16, DNATed to
# 127.0.0.1) and test hosts (testbed: 10.210.0.0/24).
PG_CLIENT_NETS = ["127.0.0.1/32", "10.200.0.0/16", "10.210.0.0/24"]


class StoreError(Exception):
    pass


def _pg_bin(name):
    for d in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (d / name).exists():
            return str(d / name)
    found = shutil.which(name)
    if found:
        return found
    raise StoreError(f"PostgreSQL's {name} was not found: install Debian's postgresql (make setup does)")


def _need(cmd):
    path = shutil.which(cmd)
    if not path:
        raise StoreError(f"{cmd} was not found: install Debian's {cmd} package (make setup does)")
    return path


CLONE_NEWNET = 0x40000000


def in_netns(netns, fn, *args):
    """fn(*args) on a thread that entered the network namespace bound at
    `netns` (None: here), so only its sockets live there; its result or
    exception comes back."""
    if netns is None:
        return fn(*args)
    out = queue.Queue(1)

    def run():
        try:
            fd = os.open(netns, os.O_RDONLY)
            try:
                if ctypes.CDLL(None, use_errno=True).setns(fd, CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), f"setns {netns}")
            finally:
                os.close(fd)
            out.put((True, fn(*args)))
        except BaseException as e:  # handed to the caller
            out.put((False, e))

    threading.Thread(target=run, daemon=True).start()
    ok, v = out.get()
    if not ok:
        raise v
    return v


def wait_port(port, what, timeout=20.0, proc=None, log=None, host="127.0.0.1", netns=None):
    deadline = time.monotonic() + timeout

    def probe():
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
            return True
        return False

    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            tail = Path(log).read_text(errors="replace")[-2000:] if log else ""
            raise StoreError(f"{what} exited with status {proc.returncode}:\n{tail}")
        if in_netns(netns, probe):
            return
        time.sleep(0.05)
    raise StoreError(f"{what} did not listen on {host}:{port} within {timeout:.0f} s")


def port_free(port, host="127.0.0.1"):
    with socket.socket() as s:
        try:
            s.bind((host, port))
            return True
        except OSError:
            return False


class Stores:
    """The three servers, started and stopped together: on this machine's
    loopback, or on a test host's address (`host` in network namespace
    `netns`, a testbed's: examples/socialnet/snlib/cluster.py)."""

    def __init__(self, root, redis_port=REDIS_PORT, memcached_port=MEMCACHED_PORT, pg_port=PG_PORT,
                 host="127.0.0.1", netns=None):
        self.root = Path(root).resolve()
        self.redis_port, self.memcached_port, self.pg_port = redis_port, memcached_port, pg_port
        self.host, self.netns = host, netns
        self.pg_data = self.root / "postgres"
        self.state = self.root / "stores.json"

    def _ns(self, argv):
        """argv run in the stores' network namespace."""
        return ["nsenter", f"--net={self.netns}", "--", *argv] if self.netns else list(argv)

    # ---- lifecycle

    def up(self, progress=print):
        self.root.mkdir(parents=True, exist_ok=True)
        for port, what in ((self.redis_port, "Redis"), (self.memcached_port, "memcached"), (self.pg_port, "PostgreSQL")):
            if not in_netns(self.netns, port_free, port, self.host):
                raise StoreError(f"port {port} for {what} is taken (stores already up? `snctl.py stores down`)")
        pids = {}
        try:
            progress(f"  redis-server on {self.host}:{self.redis_port}")
            pids["redis"] = self._start(
                "redis", [_need("redis-server"), "--port", str(self.redis_port), "--bind", self.host,
                          "--protected-mode", "no", "--save", "", "--appendonly", "no",
                          "--dir", str(self.root), "--maxclients", "10000", "--daemonize", "no"],
                self.redis_port)
            progress(f"  memcached on {self.host}:{self.memcached_port}")
            user = ["-u", "nobody"] if os.geteuid() == 0 else []
            pids["memcached"] = self._start(
                "memcached", [_need("memcached"), "-p", str(self.memcached_port), "-l", self.host, "-U", "0",
                              "-m", "512", "-c", "8192", "-t", "2", *user],
                self.memcached_port)
            progress(f"  PostgreSQL on {self.host}:{self.pg_port} (data in {self.pg_data})")
            self._postgres_up()
        except BaseException:
            self._kill(pids)
            self._postgres_down()
            raise
        self.state.write_text(json.dumps({"pids": pids, "ports": [self.redis_port, self.memcached_port,
                                                                  self.pg_port]}))

    def _start(self, name, argv, port):
        log = self.root / f"{name}.log"
        with open(log, "wb") as out:
            # nsenter execs the server after setns: the pid is the server's.
            p = subprocess.Popen(self._ns(argv), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 start_new_session=True)
        wait_port(port, name, proc=p, log=log, host=self.host, netns=self.netns)
        return p.pid

    def _pg_run(self, argv, **kw):
        """Runs a PostgreSQL tool as the postgres user when we are root
        (the server refuses to run as root)."""
        if os.geteuid() == 0:
            argv = ["runuser", "-u", "postgres", "--", *argv]
        return subprocess.run(self._ns(argv), capture_output=True, text=True, **kw)

    def _postgres_up(self):
        if os.geteuid() == 0:
            try:
                pw = pwd.getpwnam("postgres")
            except KeyError:
                raise StoreError("no postgres user: install Debian's postgresql package") from None
            # The server runs as postgres: it must reach its data directory.
            probe = self._pg_run(["test", "-x", str(self.root)])
            if probe.returncode != 0:
                raise StoreError(f"user postgres cannot reach {self.root}: use a directory outside root's "
                                 "home (e.g. under /tmp or /var/tmp)")
        if not (self.pg_data / "PG_VERSION").exists():
            self.pg_data.mkdir(parents=True, exist_ok=True)
            if os.geteuid() == 0:
                os.chown(self.pg_data, pw.pw_uid, pw.pw_gid)
            r = self._pg_run([_pg_bin("initdb"), "-D", str(self.pg_data), "-U", PG_USER, "--auth=trust",
                              "--encoding=UTF8", "--locale=C"])
            if r.returncode != 0:
                raise StoreError(f"initdb failed:\n{r.stdout}{r.stderr}")
            hba = "".join(f"host all all {net} trust\n" for net in PG_CLIENT_NETS)
            (self.pg_data / "pg_hba.conf").write_text("local all all trust\n" + hba)
            # A benchmark's store, tuned like DeathStarBench's MongoDB
            # defaults: commits are acknowledged before they reach the disk
            # (written within ~200 ms), as MongoDB's journal does.
            with open(self.pg_data / "postgresql.conf", "a") as f:
                f.write(f"\nlisten_addresses = '{self.host}'\nport = {self.pg_port}\nmax_connections = 500\n"
                        f"unix_socket_directories = '{self.pg_data}'\nsynchronous_commit = off\n"
                        "shared_buffers = 256MB\nfsync = on\nlogging_collector = off\n")
            fresh = True
        else:
            fresh = False
        r = self._pg_run([_pg_bin("pg_ctl"), "-D", str(self.pg_data), "-l", str(self.pg_data / "server.log"),
                          "-w", "-t", "30", "start"])
        if r.returncode != 0:
            log = (self.pg_data / "server.log").read_text(errors="replace")[-2000:]
            raise StoreError(f"PostgreSQL did not start:\n{r.stdout}{r.stderr}\n{log}")
        wait_port(self.pg_port, "PostgreSQL", host=self.host, netns=self.netns)
        if fresh:
            self.psql(f"CREATE DATABASE {PG_DB}", db="postgres")
            self.psql(SCHEMA)

    def psql(self, sql, db=PG_DB):
        r = subprocess.run(self._ns([_pg_bin("psql"), "-h", self.host, "-p", str(self.pg_port), "-U", PG_USER, "-d", db,
                                     "-v", "ON_ERROR_STOP=1", "-qAt", "-c", sql]), capture_output=True, text=True)
        if r.returncode != 0:
            raise StoreError(f"psql: {r.stderr.strip()}")
        return r.stdout

    def down(self):
        if self.state.exists():
            self._kill(json.loads(self.state.read_text()).get("pids", {}))
            self.state.unlink()
        self._postgres_down()

    def _postgres_down(self):
        if (self.pg_data / "postmaster.pid").exists():
            self._pg_run([_pg_bin("pg_ctl"), "-D", str(self.pg_data), "-m", "fast", "-w", "-t", "30", "stop"])

    @staticmethod
    def _kill(pids):
        for pid in pids.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        for pid in pids.values():
            while time.monotonic() < deadline and _alive(pid):
                time.sleep(0.05)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    # ---- data

    def flush(self):
        """Empties every store (the schema stays)."""
        self.redis("FLUSHALL")
        in_netns(self.netns, self._flush_memcached)
        self.psql("TRUNCATE users, posts, urls, user_timeline, social_graph")

    def _flush_memcached(self):
        with socket.create_connection((self.host, self.memcached_port), timeout=5) as s:
            s.sendall(b"flush_all\r\n")
            if not s.recv(64).startswith(b"OK"):
                raise StoreError("memcached did not flush")

    def redis(self, *args):
        """One Redis command; its reply (bulk and integer replies decoded)."""
        return in_netns(self.netns, self._redis, args)

    def _redis(self, args):
        out = f"*{len(args)}\r\n".encode()
        for a in args:
            b = str(a).encode()
            out += b"$%d\r\n%s\r\n" % (len(b), b)
        with socket.create_connection((self.host, self.redis_port), timeout=5) as s:
            s.sendall(out)
            f = s.makefile("rb")
            return _resp(f)

    def cpu_seconds(self):
        """CPU time (user + system) of every store process now running."""
        total = 0.0
        tick = os.sysconf("SC_CLK_TCK")
        for pid in store_pids(self):
            with contextlib.suppress(OSError, ValueError, IndexError):
                f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                total += (int(f[11]) + int(f[12])) / tick
        return total


def store_pids(stores):
    """The pids of the store servers: Redis, memcached, and the postmaster
    with all its backends."""
    pids = []
    if stores.state.exists():
        pids += list(json.loads(stores.state.read_text()).get("pids", {}).values())
    pm = stores.pg_data / "postmaster.pid"
    with contextlib.suppress(OSError, ValueError):
        master = int(pm.read_text().split()[0])
        pids.append(master)
        for d in Path("/proc").iterdir():
            if d.name.isdigit():
                with contextlib.suppress(OSError, ValueError, IndexError):
                    if int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == master:
                        pids.append(int(d.name))
    return pids


def _alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def _resp(f):
    line = f.readline()
    t, rest = line[:1], line[1:].strip()
    if t == b"+":
        return rest.decode()
    if t == b"-":
        raise StoreError(f"redis: {rest.decode()}")
    if t == b":":
        return int(rest)
    if t == b"$":
        n = int(rest)
        if n < 0:
            return None
        data = f.read(n + 2)[:-2]
        return data.decode()
    if t == b"*":
        n = int(rest)
        return None if n < 0 else [_resp(f) for _ in range(n)]
    raise StoreError(f"redis: unexpected reply {line!r}")
