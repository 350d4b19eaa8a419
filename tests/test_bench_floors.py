"""The floors `staccato bench micro` sets Staccato's figures against: the
peer processes it starts (`staccato bench floor KIND`) answer what they are
sent, and the relays really pass it through a worker process of their own."""

import http.client
import os
import subprocess

from harness import BIN


def _peer(kind):
    return subprocess.Popen([str(BIN), "bench", "floor", kind], stdin=subprocess.PIPE, stdout=subprocess.PIPE)


def _children(pid):
    """The command lines of `pid`'s child processes."""
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        kids = f.read().split()
    out = []
    for k in kids:
        with open(f"/proc/{k}/cmdline", "rb") as f:
            out.append(f.read().split(b"\0"))
    return out


def test_echo_and_relay_return_each_1kb_message_and_end_at_end_of_file():
    for kind in ("echo", "relay"):
        p = _peer(kind)
        try:
            for _ in range(3):
                m = os.urandom(1024)
                p.stdin.write(m)
                p.stdin.flush()
                assert p.stdout.read(1024) == m, kind
            kids = _children(p.pid)
            if kind == "relay":
                assert len(kids) == 1 and kids[0][-3:-1] == [b"floor", b"echo"], kids
            else:
                assert kids == []
            p.stdin.close()
            assert p.wait(timeout=10) == 0, kind
        finally:
            p.kill()
            p.wait()


def test_http_floors_answer_every_request_on_one_kept_alive_connection():
    for kind in ("http", "http-relay"):
        p = _peer(kind)
        try:
            port = int(p.stdout.readline())
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            for body in (b"", b"hi", b"x" * 5000):
                c.request("POST", "/function/anything", body=body)
                r = c.getresponse()
                assert (r.status, r.read()) == (200, b""), kind
            assert len(_children(p.pid)) == (1 if kind == "http-relay" else 0), kind
            c.close()
            # Another connection after the first closed is served too.
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            c.request("GET", "/")
            assert c.getresponse().status == 200
            c.close()
        finally:
            p.kill()
            p.wait()
