"""The floors `staccato bench micro` sets Staccato's figures against: the
peer processes it starts (`staccato bench floor KIND`) answer what they are
sent, really pass it through a worker process of their own when they are
relays, and go away when the benchmark closes their stdin."""

import http.client
import os
import select
import signal
import subprocess
import time

import pytest

from harness import BIN


def _peer(kind):
    return subprocess.Popen([str(BIN), "bench", "floor", kind], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            bufsize=0)


def _read(f, n, timeout=10):
    """Up to n bytes from the pipe f: fewer only at its end; fails after
    `timeout` seconds without them."""
    out, deadline = b"", time.monotonic() + timeout
    while len(out) < n:
        left = deadline - time.monotonic()
        assert left > 0, f"{len(out)} of {n} bytes after {timeout} s"
        if select.select([f], [], [], left)[0]:
            chunk = os.read(f.fileno(), n - len(out))
            if not chunk:
                break
            out += chunk
    return out


def _port(p):
    """The port an HTTP peer printed on its first line."""
    line = b""
    while not line.endswith(b"\n"):
        b = _read(p.stdout, 1)
        assert b, f"no port line, only {line!r}"
        line += b
    return int(line)


def _children(pid):
    """The (pid, command line) of each child process of `pid`."""
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        kids = [int(k) for k in f.read().split()]
    out = []
    for k in kids:
        with open(f"/proc/{k}/cmdline", "rb") as f:
            out.append((k, f.read().split(b"\0")[:-1]))
    return out


def _worker(pid):
    kids = _children(pid)
    assert len(kids) == 1 and kids[0][1][-2:] == [b"floor", b"echo"], kids
    return kids[0][0]


def _gone(pid, timeout=10):
    """Whether process `pid` ended (or is a zombie) within `timeout` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.02)
    return False


@pytest.fixture
def peers():
    started = []
    yield lambda kind: started.append(_peer(kind)) or started[-1]
    for p in started:
        p.kill()
        p.wait()


def test_echo_and_relay_return_each_1kb_message_and_end_with_their_stdin(peers):
    for kind in ("echo", "relay"):
        p = peers(kind)
        for _ in range(3):
            m = os.urandom(1024)
            p.stdin.write(m)
            assert _read(p.stdout, 1024) == m, kind
        worker = _worker(p.pid) if kind == "relay" else None
        if kind == "echo":
            assert _children(p.pid) == []
        p.stdin.close()
        assert p.wait(timeout=10) == 0, kind
        if worker:
            assert _gone(worker), "the relay's worker outlived it"


def test_a_relay_whose_worker_dies_fails_instead_of_answering(peers):
    p = peers("relay")
    p.stdin.write(b"a" * 1024)
    assert _read(p.stdout, 1024) == b"a" * 1024
    os.kill(_worker(p.pid), signal.SIGKILL)
    try:
        p.stdin.write(b"b" * 1024)
    except BrokenPipeError:
        pass
    assert _read(p.stdout, 1024) == b""
    assert p.wait(timeout=10) != 0


def test_http_floors_answer_every_request_on_a_kept_alive_connection(peers):
    for kind in ("http", "http-relay"):
        p = peers(kind)
        port = _port(p)
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        for body in (b"", b"hi", b"x" * 5000):
            c.request("POST", "/function/anything", body=body)
            r = c.getresponse()
            assert (r.status, r.read()) == (200, b""), kind
        c.close()
        # Another connection after the first closed is served too.
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        c.request("GET", "/")
        assert c.getresponse().read() == b""
        if kind == "http":
            assert _children(p.pid) == []
        else:
            # It answers only when its worker does.
            os.kill(_worker(p.pid), signal.SIGKILL)
            with pytest.raises((http.client.HTTPException, OSError)):
                c.request("GET", "/")
                c.getresponse()
        c.close()
        p.stdin.close()
        assert p.wait(timeout=10) == 0, f"{kind} did not end with its stdin"
