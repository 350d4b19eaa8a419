"""The engine's own HTTP front door (`staccato up --front-door engine`, the
default): external calls parsed and answered by the engine's I/O threads,
everything else handed with its connection to the gateway.

Who answered is told by the call id: the front door's ids have bit 62 set
(thread field 0x40 + its I/O thread, docs/protocol.md "Call ids"), the
gateway's do not. Every test talks raw HTTP over a socket, so what the
client sends is exactly what the test says.
"""
import json
import os
import re
import socket
import threading
import time

import pytest

from harness import FUNCS, check_error, own_server, request


def by_engine(call_id):
    return (int(call_id, 16) >> 62) & 1 == 1


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    root = tmp_path_factory.mktemp("front")
    fn = root / "fn"
    fn.mkdir()
    for f in ("echo.py", "slow.py", "fail.py"):
        (fn / f).write_text((FUNCS / "py" / f).read_text())
    (fn / "staccato.yml").write_text(
        "functions:\n"
        "  echo:\n    runtime: python\n    handler: echo:handle\n    max_workers: 8\n"
        "  slow:\n    runtime: python\n    handler: slow:handle\n    max_workers: 8\n    timeout: 10s\n"
        "  fail:\n    runtime: python\n    handler: fail:handle\n")
    with own_server(root / "srv", extra=["--idle-timeout-s", "2"]) as s:
        s.deploy(fn)
        yield s


class Conn:
    """A raw HTTP/1.1 client connection that parses what comes back."""

    def __init__(self, port):
        self.s = socket.create_connection(("127.0.0.1", port), timeout=10)
        # Each send leaves at once (from the vCPU it is made on).
        self.s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def send(self, data):
        self.s.sendall(data)

    def response(self):
        while b"\r\n\r\n" not in self.buf:
            chunk = self.s.recv(65536)
            assert chunk, f"connection closed before a response; got {self.buf!r}"
            self.buf += chunk
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {}
        for line in lines[1:]:
            k, v = line.split(":", 1)
            headers[k.strip().lower()] = v.strip()
        n = int(headers.get("content-length", "0"))
        while len(self.buf) < n:
            chunk = self.s.recv(65536)
            assert chunk, "connection closed mid-body"
            self.buf += chunk
        body, self.buf = self.buf[:n], self.buf[n:]
        return status, headers, body

    def closed_within(self, seconds):
        self.s.settimeout(seconds)
        try:
            return self.s.recv(1) == b""
        except ConnectionResetError:
            return True
        except socket.timeout:
            return False

    def close(self):
        self.s.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def call(name, body=b"", extra=""):
    return (f"POST /function/{name} HTTP/1.1\r\nHost: localhost\r\n{extra}Content-Length: {len(body)}\r\n\r\n"
            .encode() + body)


def test_calls_are_answered_by_the_engine_as_the_gateway_answers_them(srv):
    with Conn(srv.port) as c:
        c.send(call("echo", b"hello"))
        status, h, body = c.response()
        assert (status, body) == (200, b"hello")
        assert by_engine(h["x-call-id"]), h
        assert h["content-type"] == "application/octet-stream"
        assert h["x-staccato-timing"].startswith("queue_us=") and h["x-staccato-engine"] and h["date"]
        # A function's error: the gateway's status and JSON body.
        c.send(call("fail", b"x"))
        status, h, body = c.response()
        assert status == 500 and by_engine(h["x-call-id"]), (status, h, body)
        err = json.loads(body)["error"]
        assert err["kind"] == "function_error" and err["call_id"] == h["x-call-id"], err
    # The metrics count them like the gateway's own.
    m = srv.get("/metrics").body.decode()
    assert 'staccato_invocations_total{function="echo",outcome="ok"}' in m, m
    assert 'staccato_invocations_total{function="fail",outcome="function_error"}' in m, m


def test_pipelined_requests_are_answered_in_order(srv):
    with Conn(srv.port) as c:
        # The slow one first: the quick ones wait for it (HTTP/1.1 order).
        c.send(call("slow", b"200") + call("echo", b"one") + call("echo", b"two"))
        s1, h1, b1 = c.response()
        s2, h2, b2 = c.response()
        s3, h3, b3 = c.response()
        assert (s1, s2, s3) == (200, 200, 200)
        assert json.loads(b1)["pid"] > 0 and (b2, b3) == (b"one", b"two")
        assert len({h1["x-call-id"], h2["x-call-id"], h3["x-call-id"]}) == 3


def test_a_request_cut_anywhere_is_still_served(srv):
    with Conn(srv.port) as c:
        req = call("echo", b"x" * 3000)
        for cut in (1, 17, 40, len(req) - 2000, len(req) - 1):
            c.send(req[:cut])
            time.sleep(0.02)
            c.send(req[cut:])
            status, h, body = c.response()
            assert (status, body) == (200, b"x" * 3000), cut


def io_thread(call_id):
    """The engine I/O thread that answered a front-door call (its id's
    thread field is 0x40 + the thread)."""
    return (int(call_id, 16) >> 56) & 0x3F


def front_door_moves(srv):
    m = re.search(r"^staccato_front_door_moves_total (\d+)$", srv.get("/metrics").body.decode(), re.M)
    assert m, "no staccato_front_door_moves_total in /metrics"
    return int(m.group(1))


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two vCPUs")
def test_a_connection_follows_its_client_to_another_vcpu(srv):
    """A client that moves to another vCPU has its connection moved to the
    I/O thread there (its packets are received there, SO_INCOMING_CPU):
    told by the call ids' thread field; calls on it, a request cut across
    the move and pipelined ones, are answered as before."""
    cpus = sorted(os.sched_getaffinity(0))[:2]
    saved = os.sched_getaffinity(0)
    moves = front_door_moves(srv)
    last = []
    try:
        with Conn(srv.port) as c:
            for phase, cpu in enumerate((cpus[0], cpus[1], cpus[0])):
                os.sched_setaffinity(0, {cpu})
                threads = []
                for i in range(4):
                    time.sleep(0.005)
                    body = f"{phase}-{i}".encode()
                    req = call("echo", body)
                    if i == 1:
                        # Cut: the head from the other vCPU, the body from this one.
                        os.sched_setaffinity(0, {cpus[1 - cpus.index(cpu)]})
                        c.send(req[:-len(body)])
                        time.sleep(0.005)
                        os.sched_setaffinity(0, {cpu})
                        time.sleep(0.005)
                        c.send(req[-len(body):])
                    elif i == 3:
                        c.send(req + call("echo", b"pipelined"))
                    else:
                        c.send(req)
                    status, h, got = c.response()
                    assert (status, got) == (200, body), (phase, i, status, got)
                    assert by_engine(h["x-call-id"]), h
                    if i == 3:
                        status2, h2, got2 = c.response()
                        assert (status2, got2) == (200, b"pipelined"), (status2, got2)
                    if i != 1:
                        threads.append(io_thread(h["x-call-id"]))
                assert len(set(threads)) == 1, f"phase {phase} on CPU {cpu}: answered by threads {threads}"
                last.append(threads[0])
    finally:
        os.sched_setaffinity(0, saved)
    assert last[0] != last[1] and last[2] == last[0], f"I/O threads by phase: {last}"
    assert front_door_moves(srv) >= moves + 2


def test_management_on_a_calls_connection_goes_to_the_gateway(srv):
    with Conn(srv.port) as c:
        c.send(call("echo", b"a"))
        status, h, _ = c.response()
        assert status == 200 and by_engine(h["x-call-id"])
        c.send(f"GET /system/functions/echo HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {srv.token}\r\n\r\n"
               .encode())
        status, h, body = c.response()
        assert status == 200 and json.loads(body)["name"] == "echo", body
        # The connection is the gateway's from then on, and still serves calls.
        c.send(call("echo", b"b"))
        status, h, body = c.response()
        assert (status, body) == (200, b"b") and not by_engine(h["x-call-id"]), h


@pytest.mark.parametrize("form,body_expected", [
    # Chunked bodies are the gateway's to decode.
    (b"POST /function/echo HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
     b"abc"),
    # So is Expect: 100-continue (hyper sends the 100 and reads on).
    (b"POST /function/echo HTTP/1.1\r\nHost: localhost\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\nhi",
     b"hi"),
])
def test_other_http_forms_are_served_by_the_gateway(srv, form, body_expected):
    with Conn(srv.port) as c:
        c.send(form)
        status, h, body = c.response()
        if status == 100:
            status, h, body = c.response()
        assert (status, body) == (200, body_expected), (status, h, body)
        assert not by_engine(h["x-call-id"]), h


def test_http_1_0_is_answered_and_closed(srv):
    with Conn(srv.port) as c:
        c.send(b"POST /function/echo HTTP/1.0\r\nHost: localhost\r\nContent-Length: 2\r\n\r\nhi")
        status, h, body = c.response()
        assert (status, body) == (200, b"hi")
        assert c.closed_within(5)


def test_connection_close_is_honoured(srv):
    with Conn(srv.port) as c:
        c.send(call("echo", b"bye", extra="Connection: close\r\n"))
        status, h, body = c.response()
        assert (status, body) == (200, b"bye") and by_engine(h["x-call-id"])
        assert h.get("connection") == "close", h
        assert c.closed_within(5), "the connection stayed open after Connection: close"


def test_hostile_requests_get_the_gateways_answers(srv):
    # A page rebinding its own domain to 127.0.0.1 (DNS rebinding).
    with Conn(srv.port) as c:
        c.send(b"POST /function/echo HTTP/1.1\r\nHost: evil.example\r\nContent-Length: 1\r\n\r\nx")
        status, h, body = c.response()
        assert status == 403 and json.loads(body)["error"]["kind"] == "forbidden", body
    # Over the payload limit, declared up front.
    r = request(srv.port, "POST", "/function/echo", body=b"", headers={"Content-Length": str(7 << 20)}, timeout=10)
    check_error(r, 413, "payload_too_large")
    # Two lengths (request smuggling): hyper refuses it.
    with Conn(srv.port) as c:
        c.send(b"POST /function/echo HTTP/1.1\r\nHost: localhost\r\nContent-Length: 1\r\nContent-Length: 5\r\n\r\nx")
        status, _, _ = c.response()
        assert status == 400, status
    # Garbage instead of a request line.
    with Conn(srv.port) as c:
        c.send(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 64 + b"\r\n\r\n")
        status, _, _ = c.response()
        assert status == 400, status
    # A bad timeout header is the gateway's 400, a good one bounds the call.
    r = request(srv.port, "POST", "/function/echo", body=b"x", headers={"X-Staccato-Timeout-Ms": "soon"})
    check_error(r, 400, "bad_request", call_id=False)
    r = request(srv.port, "POST", "/function/slow", body=b"3000", headers={"X-Staccato-Timeout-Ms": "200"})
    check_error(r, 504, "timeout")
    # Unknown functions: the gateway's 404.
    r = request(srv.port, "POST", "/function/nope", body=b"x")
    check_error(r, 404, "not_found")
    # After all that, calls are served as before.
    assert request(srv.port, "POST", "/function/echo", body=b"ok").body == b"ok"


def test_slow_and_silent_clients_are_closed_at_the_idle_timeout(srv):
    with Conn(srv.port) as c:
        # A head that trickles in, one byte at a time: closed at the
        # timeout (2 s) whatever it sends meanwhile.
        t = time.monotonic()
        req = call("echo", b"x")
        closed = False
        for b in req[:-5]:
            try:
                c.send(bytes([b]))
            except OSError:
                closed = True
                break
            time.sleep(0.1)
            if time.monotonic() - t > 8:
                break
        assert closed or c.closed_within(3), "a trickling request held its connection"
        assert time.monotonic() - t < 8


def test_a_client_that_leaves_mid_call_costs_no_one_else(srv):
    gone = Conn(srv.port)
    gone.send(call("slow", b"500"))
    time.sleep(0.1)
    gone.close()
    # Others are served meanwhile and after.
    assert request(srv.port, "POST", "/function/echo", body=b"still").body == b"still"
    time.sleep(0.6)
    assert request(srv.port, "POST", "/function/echo", body=b"after").body == b"after"
    # A client that half-closes after its request still gets the answer.
    with Conn(srv.port) as c:
        c.send(call("echo", b"half"))
        c.s.shutdown(socket.SHUT_WR)
        status, h, body = c.response()
        assert (status, body) == (200, b"half")
        assert c.closed_within(5)


def test_a_request_and_the_end_of_file_sent_together_are_answered_and_closed_at_once(srv):
    """The engine stops reading a socket at a short read (edge-triggered:
    later bytes report again), but an end of file that came with the
    request reports no more: it must be read then, or the connection would
    wait for the idle timeout (2 s here) instead of closing."""
    for i in range(20):
        with Conn(srv.port) as c:
            c.send(call("echo", f"eof-{i}".encode()))
            c.s.shutdown(socket.SHUT_WR)
            status, h, body = c.response()
            assert (status, body) == (200, f"eof-{i}".encode())
            assert by_engine(h["x-call-id"]), h
            assert c.closed_within(1), f"round {i}: still open a second after the answer"


def test_the_end_of_file_of_a_client_read_while_its_reading_was_paused_is_seen(srv):
    """More pipelined than the engine buffers (6 MiB of payload and a
    head), then the end of file: reading pauses at the limit, the end of
    file is reported meanwhile, and reading on later must still reach it.
    The answers are small (the function fails), so no write of theirs
    re-registers the socket, which would report the end of file again."""
    # A call runs while the next 6 MiB and more arrive: reading pauses at
    # the limit, and what is left over and the end of file wait in the
    # socket meanwhile.
    sizes = [1 << 20] * 7 + [128 << 10]
    with Conn(srv.port) as c:
        def send_all():
            c.send(b"".join(call("fail", bytes([65 + i]) * size) for i, size in enumerate(sizes)))
            c.s.shutdown(socket.SHUT_WR)
        sender = threading.Thread(target=send_all)
        sender.start()
        got = [c.response() for _ in sizes]
        sender.join()
        for i, (status, h, body) in enumerate(got):
            assert status == 500 and json.loads(body)["error"]["kind"] == "function_error", (i, status, body[:200])
            assert by_engine(h["x-call-id"]), h
        assert c.closed_within(1), "still open a second after the last answer"


def test_the_gateway_front_door_is_still_there(tmp_path):
    fn = tmp_path / "fn"
    fn.mkdir()
    (fn / "echo.py").write_text((FUNCS / "py" / "echo.py").read_text())
    (fn / "staccato.yml").write_text("functions:\n  echo:\n    runtime: python\n    handler: echo:handle\n")
    with own_server(tmp_path / "srv", extra=["--front-door", "gateway", "--isolation", "process"]) as s:
        s.deploy(fn)
        r = s.invoke("echo", b"via gateway")
        assert r.body == b"via gateway" and not by_engine(r.headers["x-call-id"]), r.headers


def test_many_connections_at_once(srv):
    conns = [Conn(srv.port) for _ in range(40)]
    try:
        for i, c in enumerate(conns):
            c.send(call("echo", str(i).encode()))
        for i, c in enumerate(conns):
            status, h, body = c.response()
            assert (status, body) == (200, str(i).encode())
    finally:
        for c in conns:
            c.close()


def rss_kb(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_a_client_that_pipelines_and_never_reads_holds_one_answer(srv):
    """Backpressure: the next pipelined call is served only once the last
    answer is written, so a client that sends and never reads cannot make
    the engine hold an answer per request."""
    import threading
    body = b"y" * (1 << 20)
    n = 48
    c = Conn(srv.port)
    before = rss_kb(srv.proc.pid)
    sender = threading.Thread(target=lambda: c.send(call("echo", body) * n), daemon=True)
    sender.start()
    time.sleep(3)  # the engine serves until the client's receive buffer is full
    grown_mb = (rss_kb(srv.proc.pid) - before) / 1024
    # Without backpressure every answer waited in memory: 48 MiB.
    assert grown_mb < 24, f"the engine grew by {grown_mb:.0f} MiB for a client that does not read"
    try:
        for _ in range(n):
            status, _, got = c.response()
            assert (status, len(got)) == (200, len(body))
        sender.join(10)
    finally:
        c.close()


def test_an_answer_reaches_a_client_that_closed_its_side_after_connection_close(srv):
    with Conn(srv.port) as c:
        c.send(call("slow", b"100", extra="Connection: close\r\n"))
        c.s.shutdown(socket.SHUT_WR)
        status, h, body = c.response()
        assert status == 200 and json.loads(body)["pid"] > 0, (status, body)
        assert c.closed_within(5)
    # Pipelined requests, then the end of file: every one is answered.
    with Conn(srv.port) as c:
        c.send(call("echo", b"1") + call("slow", b"50") + call("echo", b"3"))
        c.s.shutdown(socket.SHUT_WR)
        got = [c.response() for _ in range(3)]
        assert [g[0] for g in got] == [200, 200, 200] and got[0][2] == b"1" and got[2][2] == b"3", got
        assert c.closed_within(5)


FOLLOW_WHERE = '''import json, os


def handle(ctx, data):
    return json.dumps(sorted(os.sched_getaffinity(0)))
'''
FOLLOW_FAN = '''import json, os


async def handle(ctx, data):
    for _ in range(int(data)):
        out = await ctx.call("where", b"")
    return json.dumps({"me": sorted(os.sched_getaffinity(0)), "callee": json.loads(out)})
'''


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two vCPUs")
def test_a_python_functions_workers_follow_where_its_calls_come_from(tmp_path):
    """A Python function's one process serves all its workers, read by one
    I/O thread and pinned to its vCPU (packed placement). When nearly all
    its calls come from another vCPU (its clients there, or a caller
    function's channels read there), its workers move there: the process
    reports its new affinity, and a Python caller and its Python callee end
    up on one vCPU. Calls split 80/20 between the vCPUs do not move it."""
    cpus = sorted(os.sched_getaffinity(0))[:2]
    saved = os.sched_getaffinity(0)
    fn = tmp_path / "fn"
    fn.mkdir()
    (fn / "where.py").write_text(FOLLOW_WHERE)
    (fn / "fan.py").write_text(FOLLOW_FAN)
    (fn / "staccato.yml").write_text(
        "functions:\n"
        "  where:\n    runtime: python\n    handler: where:handle\n"
        "  fan:\n    runtime: python\n    handler: fan:handle\n    timeout: 30s\n")

    def calls_from(cpu, name, body, until, seconds=20):
        """Calls from `cpu` until the answer satisfies `until` (moves wait a
        second after the last one); the last answer."""
        os.sched_setaffinity(0, {cpu})
        got, deadline = None, time.monotonic() + seconds
        with Conn(srv.port) as c:
            while time.monotonic() < deadline:
                c.send(call(name, body))
                status, _, got = c.response()
                assert status == 200, got
                if until(json.loads(got)):
                    return json.loads(got)
        raise AssertionError(f"{name} from vCPU {cpu}: after {seconds} s still {got!r}")

    def moves(name):
        return srv.log_path.read_text(errors="replace").count(f"{name}: its calls now come from vCPU")

    with own_server(tmp_path / "srv") as srv:
        srv.deploy(fn)
        try:
            # Clients on one vCPU, then on the other: it follows both times
            # (a move waits a second after the last one); it starts on one
            # of the two, so it moves at least once in the two steps, and
            # always in the second.
            calls_from(cpus[0], "where", b"", lambda a: a == [cpus[0]])
            first = moves("where")
            time.sleep(1.1)
            calls_from(cpus[1], "where", b"", lambda a: a == [cpus[1]])
            assert moves("where") == first + 1, "the second step did not move it"
            time.sleep(1.1)
            # 1,500 calls, one in five from the other vCPU: it stays.
            before = moves("where")
            conns = {cpu: Conn(srv.port) for cpu in cpus}
            try:
                for i in range(1500):
                    cpu = cpus[0] if i % 5 == 0 else cpus[1]
                    os.sched_setaffinity(0, {cpu})
                    conns[cpu].send(call("where"))
                    status, _, got = conns[cpu].response()
                    assert status == 200 and json.loads(got) == [cpus[1]], (i, got)
            finally:
                for c in conns.values():
                    c.close()
            assert moves("where") == before, "split calls moved it"
            # A caller, called from the vCPU it is not on, calling `where`:
            # the caller follows its clients, the callee its caller, and
            # both end up on the caller's clients' vCPU.
            os.sched_setaffinity(0, {cpus[0]})
            fan_cpu = calls_from(cpus[0], "fan", b"1", lambda a: True)["me"][0]
            other = cpus[1] if fan_cpu == cpus[0] else cpus[0]
            fan_moves = moves("fan")
            calls_from(other, "fan", b"20", lambda a: a == {"me": [other], "callee": [other]})
            assert moves("fan") > fan_moves, "the caller did not move"
        finally:
            os.sched_setaffinity(0, saved)
