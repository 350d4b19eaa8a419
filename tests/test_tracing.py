"""OpenTelemetry traces (issue 16), against a real OTLP/HTTP receiver: a
small server that parses each export with the `opentelemetry-proto`
package's own message (`ExportTraceServiceRequest`, unknown fields
refused), after turning OTLP JSON's hex ids into the bytes protobuf's JSON
mapping expects. A chain of internal calls arrives as one trace, nested
as it ran, through both front doors (the engine's and the gateway's)."""
import base64
import http.server
import json
import threading
import time

import pytest

from harness import FUNCS, own_server, wait_for

trace_pb = pytest.importorskip("opentelemetry.proto.collector.trace.v1.trace_service_pb2",
                               reason="opentelemetry-proto is installed by scripts/setup.sh")
json_format = pytest.importorskip("google.protobuf.json_format")

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"


class Receiver(http.server.BaseHTTPRequestHandler):
    spans = []      # (span message, its resource's attributes)
    problems = []

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        try:
            assert self.path == "/v1/traces", self.path
            assert self.headers.get("Content-Type") == "application/json", self.headers.get("Content-Type")
            doc = json.loads(body)
            for rs in doc["resourceSpans"]:
                for ss in rs["scopeSpans"]:
                    for s in ss["spans"]:
                        for k, n in (("traceId", 16), ("spanId", 8), ("parentSpanId", 8)):
                            if k in s:
                                raw = bytes.fromhex(s[k])
                                assert len(raw) == n, (k, s[k])
                                s[k] = base64.b64encode(raw).decode()
            req = json_format.Parse(json.dumps(doc), trace_pb.ExportTraceServiceRequest())
            for rs in req.resource_spans:
                res = {a.key: a.value.string_value for a in rs.resource.attributes}
                for ss in rs.scope_spans:
                    Receiver.spans.extend((s, res) for s in ss.spans)
            self.send_response(200)
        except Exception as e:  # recorded, and the test fails on it
            Receiver.problems.append(repr(e))
            self.send_response(400)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def receiver():
    Receiver.spans, Receiver.problems = [], []
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()


def of_trace(trace_id_hex):
    return [s for s, _ in Receiver.spans if s.trace_id.hex() == trace_id_hex]


def attrs(span):
    out = {}
    for a in span.attributes:
        v = a.value
        out[a.key] = v.string_value if v.HasField("string_value") else v.int_value if v.HasField("int_value") \
            else v.bool_value
    return out


@pytest.mark.parametrize("front_door", ["engine", "gateway"])
def test_a_chain_arrives_as_one_nested_trace(tmp_path, receiver, front_door):
    extra = ["--otlp-endpoint", f"http://127.0.0.1:{receiver.server_port}", "--trace-sample", "0",
             "--front-door", front_door]
    with own_server(tmp_path / "srv", extra=extra) as srv:
        srv.deploy(FUNCS)
        sampled = {"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"}
        r = srv.invoke("chain-a", b"x", headers=sampled)
        assert r.status == 200 and r.body == b"a(b(c(x)))", r
        assert wait_for(lambda: len(of_trace(TRACE_ID)) >= 3, 15), (Receiver.spans, Receiver.problems)
        # Not traced: a parent that was not sampled, and calls without a
        # parent at --trace-sample 0 (several, then one more traced call to
        # know the exporter has sent everything before it).
        unsampled = "0af7651916cd43dd8448eb211c80319c"
        srv.invoke("chain-a", b"y", headers={"traceparent": f"00-{unsampled}-b7ad6b7169203331-00"})
        for _ in range(5):
            assert srv.invoke("chain-a", b"z").status == 200
        # A failed call, traced: its span says so.
        failing = "1" * 32
        assert srv.invoke("fail", b"boom", headers={"traceparent": f"00-{failing}-{PARENT_ID}-01"}).status == 500
        assert wait_for(lambda: of_trace(failing), 15), Receiver.problems
        time.sleep(0.5)
    assert not Receiver.problems, Receiver.problems

    spans = {s.name: s for s in of_trace(TRACE_ID)}
    assert sorted(spans) == ["chain-a", "chain-b", "chain-c"] and len(of_trace(TRACE_ID)) == 3, spans
    a, b, c = spans["chain-a"], spans["chain-b"], spans["chain-c"]
    # Nested as it ran: a is the caller's child, b a's, c b's.
    assert a.parent_span_id.hex() == PARENT_ID
    assert b.parent_span_id == a.span_id and c.parent_span_id == b.span_id
    assert len({a.span_id, b.span_id, c.span_id}) == 3
    assert (a.kind, b.kind, c.kind) == (2, 1, 1), "SERVER for the external call, INTERNAL below it"
    # Timestamps on one clock: each child inside its parent.
    for parent, child in ((a, b), (b, c)):
        assert parent.start_time_unix_nano <= child.start_time_unix_nano, (parent.name, child.name)
        assert child.end_time_unix_nano <= parent.end_time_unix_nano, (parent.name, child.name)
    assert abs(a.start_time_unix_nano / 1e9 - time.time()) < 120
    at = attrs(a)
    assert at["staccato.function"] == "chain-a" and at["staccato.outcome"] == "ok"
    assert at["staccato.exec_us"] >= attrs(b)["staccato.exec_us"] > 0
    assert {"staccato.queue_us", "staccato.cold_start", "staccato.worker", "staccato.call_id"} <= set(at)
    assert a.status.code == 0
    # Nothing else was traced, and the failure is an error span.
    assert of_trace(unsampled) == []
    assert {s.trace_id.hex() for s, _ in Receiver.spans} == {TRACE_ID, failing}, len(Receiver.spans)
    (f,) = of_trace(failing)
    assert f.name == "fail" and f.status.code == 2 and attrs(f)["staccato.outcome"] == "function_error"
    _, resource = Receiver.spans[0]
    assert resource["service.name"] == "staccato" and resource["staccato.engine"]


def test_every_call_is_traced_at_sample_one_and_a_bad_endpoint_is_refused(tmp_path, receiver):
    with own_server(tmp_path / "srv", extra=["--otlp-endpoint", f"http://127.0.0.1:{receiver.server_port}",
                                             "--trace-sample", "1"]) as srv:
        srv.deploy(FUNCS)
        for i in range(20):
            assert srv.invoke("echo", b"%d" % i).status == 200
        assert wait_for(lambda: len({s.trace_id for s, _ in Receiver.spans if s.name == "echo"}) >= 20, 15)
        roots = [s for s, _ in Receiver.spans if s.name == "echo"]
        assert all(len(s.parent_span_id) == 0 for s in roots), "a call without a parent is a trace's root"
        # A malformed traceparent is ignored (a new trace), never an error.
        assert srv.invoke("echo", b"x", headers={"traceparent": "00-zz-yy-01"}).status == 200
    for bad in (["--otlp-endpoint", "https://collector:4318"], ["--trace-sample", "1.5"]):
        p = srv.cli("up", "--state-dir", str(tmp_path / "bad"), *bad)
        assert p.returncode != 0 and ("otlp-endpoint" in p.stderr or "trace-sample" in p.stderr), p.stderr


STATE = "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"


def test_python_go_node_cpp_share_one_trace_and_each_ctx_sees_it(tmp_path, receiver):
    """tr-python → tr-go → tr-node → tr-cpp: four spans nested in one trace
    with the caller's tracestate, and each function's ctx giving the trace
    id and a traceparent naming its own span; an unsampled caller's context
    passed on to every function, recorded nowhere."""
    extra = ["--otlp-endpoint", f"http://127.0.0.1:{receiver.server_port}", "--trace-sample", "0"]
    with own_server(tmp_path / "srv", extra=extra) as srv:
        srv.deploy(FUNCS / "traced")
        sampled = {"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01", "tracestate": STATE}
        r = srv.invoke("tr-python", b"x", headers=sampled)
        assert r.status == 200, r
        seen = json.loads(r.body)
        assert [e["fn"] for e in seen] == ["tr-python", "tr-go", "tr-node", "tr-cpp"], seen
        assert wait_for(lambda: len(of_trace(TRACE_ID)) >= 4, 15), (Receiver.spans, Receiver.problems)
        # Unsampled: passed on unchanged to every function, not recorded.
        quiet, quiet_parent = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
        r = srv.invoke("tr-python", b"y", headers={"traceparent": f"00-{quiet}-{quiet_parent}-00"})
        passed_on = json.loads(r.body)
        # Without a context at --trace-sample 0: none in any runtime.
        untraced = json.loads(srv.invoke("tr-python", b"z").body)
        # One more traced call, so that everything before it has been exported.
        srv.invoke("tr-python", b"w", headers={"traceparent": f"00-{'2' * 32}-{PARENT_ID}-01"})
        assert wait_for(lambda: len(of_trace("2" * 32)) >= 4, 15), Receiver.problems
    assert not Receiver.problems, Receiver.problems

    spans = {s.name: s for s in of_trace(TRACE_ID)}
    assert sorted(spans) == ["tr-cpp", "tr-go", "tr-node", "tr-python"] and len(of_trace(TRACE_ID)) == 4
    chain = [spans[e["fn"]] for e in seen]
    assert chain[0].parent_span_id.hex() == PARENT_ID
    for parent, child in zip(chain, chain[1:]):
        assert child.parent_span_id == parent.span_id, (parent.name, child.name)
        assert parent.start_time_unix_nano <= child.start_time_unix_nano <= child.end_time_unix_nano \
            <= parent.end_time_unix_nano, (parent.name, child.name)
    assert all(s.trace_state == STATE for s in chain), [s.trace_state for s in chain]
    # Each runtime's ctx: the trace, its own span as the parent of what it calls out, the state.
    for e, span in zip(seen, chain):
        assert e["trace_id"] == TRACE_ID, e
        assert e["traceparent"] == f"00-{TRACE_ID}-{span.span_id.hex()}-01", e
        assert e["tracestate"] == STATE, e
    for e in passed_on:
        assert (e["trace_id"], e["traceparent"]) == (quiet, f"00-{quiet}-{quiet_parent}-00"), e
        assert not e["tracestate"], e
    assert of_trace(quiet) == []
    for e in untraced:
        assert not e["trace_id"] and not e["traceparent"] and not e["tracestate"], e


def chain_spans(trace_id):
    spans = {s.name: s for s in of_trace(trace_id)}
    assert sorted(spans) == ["chain-a", "chain-b", "chain-c"] and len(of_trace(trace_id)) == 3, spans
    a, b, c = spans["chain-a"], spans["chain-b"], spans["chain-c"]
    assert a.parent_span_id.hex() == PARENT_ID
    return a, b, c


def test_a_chain_across_servers_stays_one_trace(tmp_path, receiver):
    """chain-a on engine 0 → chain-b on engine 1 → chain-c on engine 0:
    every hop a Forward through the gateway; each engine exports its own
    spans, nested in the one trace, with the caller's tracestate."""
    from test_cluster import cluster, ids
    otlp = ["--otlp-endpoint", f"http://127.0.0.1:{receiver.server_port}", "--trace-sample", "0"]
    manifest = tmp_path / "chain.yml"
    manifest.write_text("functions:\n" + "".join(
        f"  chain-{x}:\n    runtime: python\n    source: {FUNCS / 'py'}\n    handler: chain:handle_{x}\n"
        f"    placement: {{labels: {{host: engine{n}}}}}\n" for x, n in (("a", 0), ("b", 1), ("c", 0))))
    with cluster(tmp_path / "cluster", engines=2, engine_extra=otlp) as gw:
        out = gw.cli("deploy", str(manifest), timeout=120)
        assert out.returncode == 0, out.stdout + out.stderr
        e = ids(gw.engine_procs)
        headers = {"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01", "tracestate": STATE}
        r = gw.invoke("chain-a", b"x", headers=headers)
        assert r.status == 200 and r.body == b"a(b(c(x)))", r
        assert wait_for(lambda: len(of_trace(TRACE_ID)) >= 3, 15), (Receiver.spans, Receiver.problems)
    assert not Receiver.problems, Receiver.problems
    a, b, c = chain_spans(TRACE_ID)
    assert b.parent_span_id == a.span_id and c.parent_span_id == b.span_id
    assert (a.kind, b.kind, c.kind) == (2, 1, 1)
    assert all(s.trace_state == STATE for s in (a, b, c))
    engine_of = {s.name: res["staccato.engine"] for s, res in Receiver.spans}
    assert engine_of["chain-b"] != engine_of["chain-a"] == engine_of["chain-c"], engine_of
    assert {engine_of["chain-a"], engine_of["chain-b"]} == set(e), (engine_of, e)


def test_internal_calls_through_the_gateway_carry_the_trace_as_headers(tmp_path, receiver):
    """--internal-calls-via: each hop leaves as an HTTP call to the gateway
    with traceparent/tracestate, and comes back as a SERVER span whose
    parent is its caller's span."""
    from harness import free_port
    port = free_port()
    extra = ["--otlp-endpoint", f"http://127.0.0.1:{receiver.server_port}", "--trace-sample", "0",
             "--internal-calls-via", f"http://127.0.0.1:{port}"]
    with own_server(tmp_path / "srv", port=port, extra=extra) as srv:
        srv.deploy(FUNCS)
        r = srv.invoke("chain-a", b"x", headers={"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01", "tracestate": STATE})
        assert r.status == 200 and r.body == b"a(b(c(x)))", r
        assert wait_for(lambda: len(of_trace(TRACE_ID)) >= 3, 15), (Receiver.spans, Receiver.problems)
    assert not Receiver.problems, Receiver.problems
    a, b, c = chain_spans(TRACE_ID)
    assert b.parent_span_id == a.span_id and c.parent_span_id == b.span_id
    assert (a.kind, b.kind, c.kind) == (2, 2, 2), "each hop came in from outside"
    assert all(s.trace_state == STATE for s in (a, b, c))


def test_an_async_call_runs_in_its_callers_trace(tmp_path, receiver):
    from harness import request
    extra = ["--otlp-endpoint", f"http://127.0.0.1:{receiver.server_port}", "--trace-sample", "0"]
    with own_server(tmp_path / "srv", extra=extra) as srv:
        srv.deploy(FUNCS)
        headers = {"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01", "tracestate": STATE}
        r = request(srv.port, "POST", "/async-function/chain-a", body=b"x", headers=headers)
        assert r.status == 202, r
        assert wait_for(lambda: len(of_trace(TRACE_ID)) >= 3, 15), (Receiver.spans, Receiver.problems)
        call = srv.get(r.json()["status_url"]).json()
        assert call["state"] == "ok" and call["traceparent"] == headers["traceparent"], call
    a, b, c = chain_spans(TRACE_ID)
    assert b.parent_span_id == a.span_id and c.parent_span_id == b.span_id
    assert a.trace_state == STATE


def test_inputs_at_the_inline_limit_with_a_trace_context(tmp_path, receiver):
    """The context takes inline room: 960 - 25 bytes of input stay inline
    with a bare context, 960 - 537 with a 512-byte tracestate; one more goes
    to a payload file. Every size comes back whole from Python and C."""
    state = "a=" + "x" * 254 + ",b=" + "y" * 253
    assert len(state) == 512
    extra = ["--otlp-endpoint", f"http://127.0.0.1:{receiver.server_port}", "--trace-sample", "0"]
    with own_server(tmp_path / "srv", extra=extra) as srv:
        srv.deploy(FUNCS)
        for fn in ("echo", "echo-c"):
            for headers, sizes in (({"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"}, (0, 1, 935, 936, 960, 5000)),
                                   ({"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01", "tracestate": state},
                                    (0, 423, 424, 960)),
                                   ({"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-00", "tracestate": state},
                                    (423, 424))):
                for n in sizes:
                    data = bytes((i * 7 + n) % 251 for i in range(n))
                    r = srv.invoke(fn, data, headers=headers)
                    want = data if fn == "echo" else b"c:" + data  # echo.c says who answered
                    assert r.status == 200 and r.body == want, (fn, n, headers.get("tracestate", "")[:8], r)
        assert wait_for(lambda: len(of_trace(TRACE_ID)) >= 20, 15), Receiver.problems
    assert {s.trace_state for s in of_trace(TRACE_ID)} == {"", state}
