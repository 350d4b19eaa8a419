"""Discovery by DNS (issue 11): `staccato engine --join-every
http://NAME:PORT` joins every gateway NAME resolves to, looked up again
every second, as an engine on Kubernetes joins the gateways behind their
headless Service (one A record per ready gateway pod).

The name is resolved by the C library like any other, from a hosts file
bind-mounted over /etc/hosts in the engine's own mount namespace (`unshare
--mount`), with one line per gateway: rewriting that file is the Service
gaining and losing pods. Gateways listen on 127.0.0.2 and 127.0.0.3, the
same port on each, as pods behind one Service do.
"""
import http.client
import json
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from harness import BIN, REPO, clean_env, free_port, stop_process, wait_for
from test_cluster import ENGINE_TOKEN, TOKEN

NAME = "gateways.staccato.test"


def listed(addr, port):
    """Engine ids the gateway at addr:port lists, or None if it does not answer."""
    c = http.client.HTTPConnection(addr, port, timeout=3)
    try:
        c.request("GET", "/system/engines", headers={"Authorization": f"Bearer {TOKEN}"})
        r = c.getresponse()
        return [e["id"] for e in json.loads(r.read())] if r.status == 200 else None
    except OSError:
        return None
    finally:
        c.close()


@pytest.fixture
def gateways(tmp_path):
    port = free_port()
    procs = []
    for ip in ("127.0.0.2", "127.0.0.3"):
        argv = [str(BIN), "gateway", "--listen", f"{ip}:{port}", "--token", TOKEN, "--engine-token", ENGINE_TOKEN,
                "--state-dir", str(tmp_path / f"gw-{ip}")]
        log = open(tmp_path / f"gw-{ip}.log", "ab")
        procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=clean_env(), cwd=REPO))
    try:
        assert wait_for(lambda: listed("127.0.0.2", port) == [] and listed("127.0.0.3", port) == [], timeout=15)
        yield port
    finally:
        for p in procs:
            stop_process(p)


def test_an_engine_joins_every_gateway_its_name_resolves_to(tmp_path, gateways):
    port = gateways
    hosts = tmp_path / "hosts"
    hosts.write_text(f"127.0.0.1 localhost\n127.0.0.2 {NAME}\n")
    eport = free_port()
    ipc = Path(f"/dev/shm/staccato-test-discovery-{eport}")
    engine = [str(BIN), "engine", "--engine-listen", f"127.0.0.1:{eport}", "--engine-id", "e1",
              "--state-dir", str(tmp_path / "engine"), "--ipc-dir", str(ipc), "--isolation", "process",
              "--engine-token", ENGINE_TOKEN, "--token", TOKEN, "--join-every", f"http://{NAME}:{port}"]
    # Its own mount namespace (private propagation, unshare's default), so
    # the bind mounts are seen by this engine only. Its resolver asks a
    # name server on loopback (there is none): a name the hosts file lacks
    # fails here, never leaves the machine.
    resolv = tmp_path / "resolv.conf"
    resolv.write_text("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")
    script = 'mount --bind "$1" /etc/hosts && mount --bind "$2" /etc/resolv.conf && shift 2 && exec "$@"'
    log_path = tmp_path / "engine.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(["unshare", "--mount", "sh", "-c", script, "sh", str(hosts), str(resolv), *engine],
                                stdout=log, stderr=subprocess.STDOUT, env=clean_env(), cwd=REPO)
    try:
        # One gateway behind the name: the engine joins it, not the other.
        assert wait_for(lambda: listed("127.0.0.2", port) == ["e1"], timeout=15), log_path.read_text()
        assert listed("127.0.0.3", port) == []
        # The Service gains a pod: the engine joins it too.
        hosts.write_text(f"127.0.0.1 localhost\n127.0.0.2 {NAME}\n127.0.0.3 {NAME}\n")
        assert wait_for(lambda: listed("127.0.0.3", port) == ["e1"], timeout=5), log_path.read_text()
        # It loses the first: the engine stops renewing there, and that
        # gateway drops it when its lease (3 s) runs out.
        hosts.write_text(f"127.0.0.1 localhost\n127.0.0.3 {NAME}\n")
        assert wait_for(lambda: listed("127.0.0.2", port) == [], timeout=8), log_path.read_text()
        assert listed("127.0.0.3", port) == ["e1"]
        assert "is no longer behind" in log_path.read_text()
        # A name that stops resolving keeps the gateways joined.
        hosts.write_text("127.0.0.1 localhost\n")
        time.sleep(4)
        assert listed("127.0.0.3", port) == ["e1"], log_path.read_text()
        # Stopping, it leaves the gateway it joined at once.
        hosts.write_text(f"127.0.0.1 localhost\n127.0.0.3 {NAME}\n")
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        # Well within the 3 s lease: this is the leave, not the expiry.
        assert wait_for(lambda: listed("127.0.0.3", port) == [], timeout=1.0), log_path.read_text()
        assert time.monotonic() - t0 < 1.2
    finally:
        stop_process(proc)
        shutil.rmtree(ipc, ignore_errors=True)


def test_a_bad_join_every_url_is_refused(tmp_path):
    for url in ("gateways:80", "http://gateways", "http://gateways:0", "http://gateways:80/x", "http://:80",
                "http://gate:way:80", "http://user@gateways:80", "http://gateways%0a:80"):
        p = subprocess.run([str(BIN), "engine", "--engine-listen", "127.0.0.1:0", "--state-dir", str(tmp_path / "s"),
                            "--join-every", url, "--token", TOKEN],
                           capture_output=True, text=True, timeout=20, env=clean_env())
        assert p.returncode != 0 and "--join-every" in p.stderr and "http://HOST:PORT" in p.stderr, (url, p.stderr)
