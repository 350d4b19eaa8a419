"""gRPC ingress (issue 15): `--grpc-listen` takes unary gRPC calls (HTTP/2
without TLS) and sends `/{package.Service}/{Method}` to the function whose
manifest names it. Driven by a real gRPC client (grpcio), and by raw
HTTP/2 frames (h2) for what no well-behaved client sends: a message
prefix cut short, a length that lies, a compressed message."""
import socket
import time

import grpc
import h2.config
import h2.connection
import h2.events
import pytest

from harness import FUNCS, check_error, free_port, ok_body, own_server, request

GRPC_FUNCS = FUNCS / "grpc"


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    root = tmp_path_factory.mktemp("grpc")
    gport = free_port()
    with own_server(root, extra=["--grpc-listen", f"127.0.0.1:{gport}"]) as s:
        s.deploy(GRPC_FUNCS)
        s.grpc_port = gport
        s.channel = grpc.insecure_channel(f"127.0.0.1:{gport}")
        yield s
        s.channel.close()


def unary(srv, method, data, **kw):
    return srv.channel.unary_unary(method)(data, **kw)


def rpc_error(srv, method, data, **kw):
    with pytest.raises(grpc.RpcError) as e:
        unary(srv, method, data, **kw)
    return e.value


def test_a_method_runs_its_function(srv):
    assert unary(srv, "/helloworld.Greeter/SayHello", b"grpc", timeout=10) == b"hello grpc"
    assert unary(srv, "/helloworld.Greeter/SayHelloAgain", b"", timeout=10) == b"hello "
    # The same function over HTTP/1.1.
    assert ok_body(srv.invoke("greeter", b"http")) == b"hello http"
    # Many at once on one connection (HTTP/2 streams).
    futures = [srv.channel.unary_unary("/helloworld.Greeter/SayHello").future(str(i).encode(), timeout=20)
               for i in range(50)]
    assert [f.result() for f in futures] == [b"hello %d" % i for i in range(50)]


def test_errors_are_grpc_statuses(srv):
    e = rpc_error(srv, "/helloworld.Greeter/Nope", b"x", timeout=10)
    assert e.code() == grpc.StatusCode.UNIMPLEMENTED and "helloworld.Greeter/Nope" in e.details(), e
    e = rpc_error(srv, "/not.a/method/at/all", b"x", timeout=10)
    assert e.code() == grpc.StatusCode.UNIMPLEMENTED, e
    e = rpc_error(srv, "/test.Fail/Now", b"bob", timeout=10)
    assert e.code() == grpc.StatusCode.UNKNOWN and "no greeting for bob" in e.details(), e
    assert e.details().startswith("function_error"), e.details()
    # grpc-timeout becomes the call's deadline: the engine ends the call.
    t = time.monotonic()
    e = rpc_error(srv, "/test.Nap/Long", b"5", timeout=0.5)
    assert e.code() == grpc.StatusCode.DEADLINE_EXCEEDED and time.monotonic() - t < 3, e
    big = b"x" * ((6 << 20) + 1)
    e = rpc_error(srv, "/helloworld.Greeter/SayHello", big, timeout=20)
    assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e


def test_invoke_keys_travel_as_metadata(srv):
    e = rpc_error(srv, "/test.Keyed/Hello", b"k", timeout=10)
    assert e.code() == grpc.StatusCode.UNAUTHENTICATED, e
    p = srv.cli("key", "create", "keyed")
    assert p.returncode == 0, p.stderr
    key = p.stdout.strip().split()[-1]
    md = (("authorization", f"Bearer {key}"),)
    assert unary(srv, "/test.Keyed/Hello", b"k", timeout=10, metadata=md) == b"hello k"
    e = rpc_error(srv, "/test.Keyed/Hello", b"k", timeout=10, metadata=(("authorization", "Bearer stk_" + "0" * 64),))
    assert e.code() == grpc.StatusCode.UNAUTHENTICATED, e


def test_a_method_is_served_by_one_function(srv, tmp_path):
    (tmp_path / "hello.py").write_text("def greet(ctx, data):\n    return data\n")
    (tmp_path / "staccato.yml").write_text(
        "functions:\n  thief:\n    runtime: python\n    handler: hello:greet\n    grpc: helloworld.Greeter/SayHello\n")
    p = srv.cli("deploy", tmp_path)
    assert p.returncode != 0 and "served by function greeter" in p.stderr, p.stderr
    assert unary(srv, "/helloworld.Greeter/SayHello", b"still", timeout=10) == b"hello still"


def test_a_redeploy_keeps_its_methods_and_a_removal_frees_them(srv, tmp_path):
    (tmp_path / "hello.py").write_text("def greet(ctx, data):\n    return b'moved ' + data\n")
    manifest = "functions:\n  {name}:\n    runtime: python\n    handler: hello:greet\n    grpc: test.Move/It\n"
    (tmp_path / "staccato.yml").write_text(manifest.format(name="mover"))
    srv.deploy(tmp_path)
    srv.deploy(tmp_path)  # its own method: no conflict
    assert unary(srv, "/test.Move/It", b"1", timeout=10) == b"moved 1"
    assert srv.cli("rm", "mover").returncode == 0
    assert rpc_error(srv, "/test.Move/It", b"x", timeout=10).code() == grpc.StatusCode.UNIMPLEMENTED
    (tmp_path / "staccato.yml").write_text(manifest.format(name="mover2"))
    srv.deploy(tmp_path)
    assert unary(srv, "/test.Move/It", b"2", timeout=10) == b"moved 2"


class RawH2:
    """One HTTP/2 connection, frames written by hand (h2)."""

    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.conn.initiate_connection()
        self.sock.sendall(self.conn.data_to_send())

    def call(self, path, body, extra=()):
        """(headers, data, trailers_only): the response's headers and
        trailers together, its data, and whether it ended with its headers
        (a gRPC error is sent so, "trailers-only")."""
        sid = self.conn.get_next_available_stream_id()
        self.conn.send_headers(sid, [(":method", "POST"), (":scheme", "http"), (":path", path),
                                     (":authority", "localhost"), ("content-type", "application/grpc"),
                                     ("te", "trailers"), *extra])
        self.conn.send_data(sid, body, end_stream=True)
        self.sock.sendall(self.conn.data_to_send())
        headers, data, ended, only = {}, b"", False, False
        while not ended:
            chunk = self.sock.recv(65536)
            assert chunk, "the gateway closed the connection"
            for ev in self.conn.receive_data(chunk):
                if isinstance(ev, h2.events.ResponseReceived) and ev.stream_id == sid:
                    headers.update({k.decode(): v.decode() for k, v in ev.headers})
                    only = ev.stream_ended is not None
                elif isinstance(ev, h2.events.TrailersReceived) and ev.stream_id == sid:
                    headers.update({k.decode(): v.decode() for k, v in ev.headers})
                elif isinstance(ev, h2.events.DataReceived) and ev.stream_id == sid:
                    data += ev.data
                    self.conn.acknowledge_received_data(ev.flow_controlled_length, sid)
                elif isinstance(ev, h2.events.StreamEnded) and ev.stream_id == sid:
                    ended = True
                elif isinstance(ev, h2.events.StreamReset) and ev.stream_id == sid:
                    raise AssertionError(f"stream reset: {ev}")
            self.sock.sendall(self.conn.data_to_send())
        return headers, data, only

    def close(self):
        self.sock.close()


def test_malformed_frames_get_a_grpc_error_and_the_gateway_goes_on(srv):
    raw = RawH2(srv.grpc_port)
    try:
        for body, extra, status, words in [
            (b"\x00\x00\x00", [], "13", "5-byte prefix"),              # a DATA frame shorter than the prefix
            (b"\x00\x00\x00\x00\x64short", [], "13", "says 100 bytes"),  # a length that lies
            (b"\x01\x00\x00\x00\x01z", [], "13", "compressed"),          # compressed, no encoding named
            (b"\x01\x00\x00\x00\x01z", [("grpc-encoding", "gzip")], "12", "not supported"),
            (b"\x07\x00\x00\x00\x01z", [], "13", "flag"),
            (b"\x00\x00\x00\x00\x01a\x00\x00\x00\x00\x01b", [], "3", "one request message"),
        ]:
            headers, data, only = raw.call("/helloworld.Greeter/SayHello", body, extra)
            assert headers.get("grpc-status") == status, (body, headers)
            assert words in headers.get("grpc-message", ""), (body, headers)
            assert headers[":status"] == "200" and data == b"" and only, (headers, only)
        # grpc-timeout in its wire form, and a malformed one.
        t = time.monotonic()
        headers, _, _ = raw.call("/test.Nap/Long", b"\x00\x00\x00\x00\x015", [("grpc-timeout", "200m")])
        assert headers.get("grpc-status") == "4" and time.monotonic() - t < 3, headers
        headers, _, _ = raw.call("/test.Nap/Long", b"\x00\x00\x00\x00\x00", [("grpc-timeout", "soon")])
        assert headers.get("grpc-status") == "3", headers
        # The same connection still serves a good call: the message, then
        # the status in trailers.
        headers, data, only = raw.call("/helloworld.Greeter/SayHello", b"\x00\x00\x00\x00\x02ok")
        assert headers.get("grpc-status") == "0" and data == b"\x00\x00\x00\x00\x08hello ok", (headers, data)
        assert not only
    finally:
        raw.close()
    # Not gRPC at all: HTTP/1.1 on the gRPC port is closed, and the gateway
    # serves on.
    with socket.create_connection(("127.0.0.1", srv.grpc_port), timeout=5) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        s.settimeout(5)
        closed = False
        try:
            closed = s.recv(100) == b"" or s.recv(100) == b""
        except ConnectionResetError:
            closed = True
        assert closed, "the gateway kept an HTTP/1.1 connection on its gRPC port open"
    assert unary(srv, "/helloworld.Greeter/SayHello", b"after", timeout=10) == b"hello after"
    assert request(srv.port, "GET", "/healthz").status == 200
    check_error(srv.invoke("nope", b""), 404, "not_found")


def test_idle_grpc_connections_are_closed(tmp_path):
    """A connection that says nothing, or opens no stream, holds its place
    among the gateway's connections no longer than --idle-timeout-s."""
    gport = free_port()
    with own_server(tmp_path, extra=["--grpc-listen", f"127.0.0.1:{gport}", "--idle-timeout-s", "2"]):
        silent = socket.create_connection(("127.0.0.1", gport), timeout=15)
        quiet = RawH2(gport)
        quiet.sock.settimeout(15)
        t = time.monotonic()
        assert silent.recv(100) == b"" or silent.recv(100) == b""
        # The HTTP/2 one is told to go (GOAWAY), then closed.
        while quiet.sock.recv(65536):
            pass
        assert time.monotonic() - t < 12
        silent.close()
        quiet.close()
