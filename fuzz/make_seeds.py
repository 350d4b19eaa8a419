"""Writes the fuzzers' seed inputs into fuzz/seeds/<target>/ (run it again
after a format changes; `make fuzz` copies them into a scratch corpus).

Seeds are valid inputs and near misses, so each fuzzer starts inside the
format instead of spending its time on the magic bytes."""
import gzip
import hashlib
import io
import json
import struct
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SEEDS = Path(__file__).resolve().parent / "seeds"


def put(target, name, data):
    d = SEEDS / target
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(data if isinstance(data, bytes) else data.encode())


def channel_message():
    vectors = json.loads((ROOT / "testvectors" / "message_v1.json").read_text())["tests"]
    for t in vectors:
        put("channel_message", f"v{t['tcId']:02d}", bytes.fromhex(t["msg"]))


def frame(kind, body=b"", call_id=0, a=0, b=0, c=0, error_kind=0):
    return struct.pack("<IHHQIIII", len(body), kind, error_kind, call_id, a, b, c, 0) + body


def link_frames():
    # Kinds as in crates/wire/src/frame.rs: read them from the source so
    # the seeds follow the format.
    src = (ROOT / "crates" / "wire" / "src" / "frame.rs").read_text()
    kinds = {}
    for line in src[src.index("pub enum FrameKind"):].splitlines()[1:]:
        line = line.strip().rstrip(",")
        if line.startswith("}"):
            break
        if "=" in line and not line.startswith("//"):
            name, code = (s.strip() for s in line.split("="))
            kinds[name] = int(code)
    hello = b"STCO" + struct.pack("<H", 3) + bytes([1, 0]) + bytes(32)
    put("link_frames", "hello", frame(kinds["Hello"], hello, c=1))
    put("link_frames", "hello_auth", frame(kinds["Hello"], hello) + frame(kinds["Auth"], bytes(32)))
    put("link_frames", "call", frame(kinds["Call"], b"echohello", call_id=7, a=100, b=4))
    put("link_frames", "calls", frame(kinds["Call"], b"ab", b=1) + frame(kinds["Call"], b"", b=9))
    put("link_frames", "control", frame(kinds["Control"], b'{"op":"list"}'))
    return kinds


def control_request():
    kinds = link_frames()
    spec = {"name": "f", "runtime": "python", "source": "sha256:" + hashlib.sha256(b"x").hexdigest()}
    reg = json.dumps({"op": "register", "spec": spec}).encode()
    put("control_request", "register", frame(kinds["Control"], reg + b"x", a=len(reg)))
    put("control_request", "ops", b"".join(frame(kinds["Control"], json.dumps(r).encode()) for r in (
        {"op": "status"}, {"op": "names"}, {"op": "unregister", "name": "f"}, {"op": "trace", "function": "f", "limit": 5})))
    put("control_request", "bad_len", frame(kinds["Control"], b'{"op":"status"}', a=99))
    answers = [{"ok": {"registered": {"name": "f", "notes": ""}}},
               {"refused": {"kind": "not_found", "message": "no function named \"f\""}}]
    put("control_request", "answers", b"".join(frame(kinds["ControlReply"], json.dumps(a).encode()) for a in answers))


def manifest():
    for p in ROOT.glob("examples/**/staccato.yml"):
        put("manifest", p.parent.name, p.read_text())
    put("manifest", "full", """version: 1
functions:
  hello:
    runtime: python
    handler: handler:handle
    source: .
    min_workers: 1
    max_workers: 8
    timeout: 250ms
    env: { GREETING: hi }
    memory: 128Mi
    pids: 64
    worker_mode: fork
    cpu_shares: 512
  c-fn:
    runtime: c
    handler: fn.c
    timeout: 2m
""")
    put("manifest", "anchors", "functions:\n  a: &x {runtime: go}\n  b: *x\n")


def http_inputs():
    spec = {"name": "hello", "runtime": "python", "handler": "h:handle",
            "source": "sha256:" + hashlib.sha256(b"x").hexdigest(), "memory_bytes": 134217728}
    put("http_inputs", "deploy_one", b"\xff" + json.dumps(spec).encode())
    put("http_inputs", "deploy_many", b"\xff" + json.dumps({"functions": [spec, dict(spec, name="b")]}).encode())
    put("http_inputs", "trace", b"\xfffunction=f&limit=5")
    put("http_inputs", "host_origin", b"\x00127.0.0.1:8080\x00http://127.0.0.1:8080\x00cross-site")
    put("http_inputs", "v6_host", b"\x00[::1]:80\x00http://[::1]:80\x00same-origin")
    put("http_inputs", "auth_type_len", b"\x03Bearer abc\x00application/json; charset=utf-8\x00123")
    put("http_inputs", "timeout", b"\x06250\x00localhost\x00http://evil.example")


def tgz(entries):
    """A .tar.gz of `entries`, the same bytes on every run (gzip's header
    would otherwise carry the time it was written)."""
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as z, tarfile.open(fileobj=z, mode="w") as t:
        for name, kind, data in entries:
            info = tarfile.TarInfo(name)
            info.type = kind
            if kind == tarfile.REGTYPE:
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
            else:
                if kind in (tarfile.SYMTYPE, tarfile.LNKTYPE):
                    info.linkname = data.decode()
                t.addfile(info)
    return buf.getvalue()


def source_archive():
    F, D, S, L = tarfile.REGTYPE, tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE
    put("source_archive", "plain", tgz([("handler.py", F, b"def handle(ctx, d):\n    return d\n"),
                                         ("lib", D, b""), ("lib/x.py", F, b"X = 1\n")]))
    put("source_archive", "dotdot", tgz([("../escape", F, b"x")]))
    put("source_archive", "absolute", tgz([("/etc/escape", F, b"x")]))
    put("source_archive", "symlink", tgz([("s", S, b"/etc"), ("s/shadow", F, b"x")]))
    put("source_archive", "hardlink", tgz([("h", L, b"/etc/shadow")]))
    put("source_archive", "deep", tgz([("/".join("d" * 12) + "/f", F, b"x")]))


def front_request():
    # The first byte's low bit is the fuzzer's "listening on loopback".
    call = "POST /function/echo HTTP/1.1\r\nHost: localhost:8080\r\nContent-Length: 5\r\n\r\nhello"
    put("front_request", "call", "\x01" + call)
    put("front_request", "get", "\x00GET /function/a-b/?q=1 HTTP/1.1\r\nx-staccato-timeout-ms: 250\r\n\r\n")
    put("front_request", "pipelined", "\x01" + call + call)
    put("front_request", "chunked", "\x01POST /function/echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
    put("front_request", "two-lengths", "\x01POST /function/echo HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab")
    put("front_request", "rebinding", "\x01POST /function/echo HTTP/1.1\r\nHost: evil.example\r\n\r\n")
    put("front_request", "partial", "\x01POST /function/echo HTTP/1.1\r\nContent-Le")


if __name__ == "__main__":
    for f in (channel_message, link_frames, control_request, manifest, http_inputs, source_archive, front_request):
        f()
    print("seeds in", SEEDS)
