#!/usr/bin/env python3
"""Writes the shared vectors every runtime's tests read:

* testvectors/message_v1.json: messages (docs/protocol.md §1), encoded and
  decoded byte for byte;
* testvectors/contract_v1.json: the rest of the cross-language contract as
  tables: error kinds (code, name, HTTP status), payload and channel file
  names, and the STACCATO_* environment variables.

Run it only when the protocol changes; every runtime's tests read the output.
The encoder here is independent of all runtimes on purpose: it packs by offset
with struct, straight from the table in docs/protocol.md.
"""
import json
import struct
from pathlib import Path

MESSAGE_LEN, HEADER_LEN, INLINE_MAX = 1024, 64, 960
KINDS = {"LauncherHello": 1, "WorkerHello": 2, "CreateWorker": 3, "StopWorker": 4,
         "Dispatch": 5, "Completion": 6, "Failure": 7, "Invoke": 8}
SHM = 1
CPU = 2  # CPU_TIME

# docs/protocol.md §1 "Error kinds": (name, HTTP status at the gateway); the
# code is the position, from 1.
ERROR_KINDS = [
    ("not_found", 404), ("payload_too_large", 413), ("function_error", 500), ("worker_crashed", 502),
    ("timeout", 504), ("engine_unavailable", 503), ("bad_request", 400), ("internal", 500),
    ("out_of_memory", 502), ("output_too_large", 502), ("call_cycle", 409), ("call_depth_exceeded", 508),
    ("function_removed", 410), ("overloaded", 503),
]

# docs/protocol.md §1 "Launchers and workers": what the engine sets for
# every launcher. Runtimes read no other STACCATO_* variable but their own
# knobs, listed per runtime (each documented in that runtime's README).
LAUNCHER_ENV = ["STACCATO_FUNCTION", "STACCATO_IPC_DIR", "STACCATO_HANDLER", "STACCATO_PAYLOAD_MAX",
                "STACCATO_SPIN_US", "STACCATO_WORKER_MODE", "STACCATO_HOST_IP",
                "STACCATO_SECRETS_DIR"]
RUNTIME_ENV = {
    "python": ["STACCATO_WARM_FIFO", "STACCATO_WARM_STATUS"],
    "go": ["STACCATO_GOMAXPROCS", "STACCATO_GO_IO"],
    "node": [], "c": [], "cpp": [],
    # The engine's own: the warm Python launcher's FIFOs, and what a
    # sandboxed Go build starts its caches from and whether it leaves them.
    "engine": ["STACCATO_WARM_FIFO", "STACCATO_WARM_STATUS", "STACCATO_GO_START", "STACCATO_GO_PUBLISH"],
}


def pack(kind, flags=0, payload_len=None, call_id=0, parent_call_id=0, worker_id=0,
         name_len=0, error_kind=0, deadline_us=0, send_ts_ns=0, aux=0, payload=b"",
         reserved=b"\0" * 12, total_len=MESSAGE_LEN):
    if payload_len is None:
        payload_len = len(payload)
    head = struct.pack("<HHIQQIHHQQI", kind, flags, payload_len, call_id, parent_call_id,
                       worker_id, name_len, error_kind, deadline_us, send_ts_ns, aux) + reserved
    assert len(head) == HEADER_LEN
    body = payload + b"\0" * (INLINE_MAX - len(payload))
    raw = (head + body)[:total_len] if total_len <= MESSAGE_LEN else head + body + b"\0" * (total_len - MESSAGE_LEN)
    return raw


def valid(comment, kind_name, payload=b"", **f):
    kind = KINDS[kind_name]
    raw = pack(kind, payload=payload, **f)
    fields = {
        "kind": kind_name,
        "flags": f.get("flags", 0),
        "payload_len": f.get("payload_len", len(payload)),
        "call_id": str(f.get("call_id", 0)),
        "parent_call_id": str(f.get("parent_call_id", 0)),
        "worker_id": f.get("worker_id", 0),
        "name_len": f.get("name_len", 0),
        "error_kind": f.get("error_kind", 0),
        "deadline_us": str(f.get("deadline_us", 0)),
        "send_ts_ns": str(f.get("send_ts_ns", 0)),
        "aux": f.get("aux", 0),
        "inline": payload.hex(),
    }
    return {"comment": comment, "result": "valid", "msg": raw.hex(), "fields": fields}


def invalid(comment, raw):
    return {"comment": comment, "result": "invalid", "msg": raw.hex()}


def cases():
    gw = (1 << 63) | 42
    internal = (7 << 32) | 1
    yield valid("launcher hello", "LauncherHello", aux=4242)
    yield valid("worker hello", "WorkerHello", worker_id=7, aux=4243)
    yield valid("create worker", "CreateWorker", worker_id=9)
    yield valid("stop worker", "StopWorker", worker_id=9)
    yield valid("dispatch, empty input", "Dispatch", call_id=gw, worker_id=7)
    yield valid("dispatch, small input, deadline", "Dispatch", payload=b"hello", call_id=gw,
                worker_id=7, deadline_us=1_790_000_000_000_000, send_ts_ns=123456789)
    yield valid("dispatch, exactly 960 inline bytes", "Dispatch", payload=bytes(range(256)) * 3 + bytes(192),
                call_id=gw, worker_id=3)
    yield valid("dispatch, 961 bytes in shm", "Dispatch", flags=SHM, payload_len=961, call_id=gw, worker_id=3)
    yield valid("dispatch, 6 MiB in shm", "Dispatch", flags=SHM, payload_len=6 << 20, call_id=gw, worker_id=3)
    yield valid("dispatch with parent (nested internal call)", "Dispatch", payload=b"x", call_id=internal,
                parent_call_id=gw, worker_id=8)
    yield valid("completion, output", "Completion", payload=b"world", call_id=gw, worker_id=7)
    yield valid("completion, empty output", "Completion", call_id=internal, worker_id=7)
    yield valid("completion, 1 MiB in shm", "Completion", flags=SHM, payload_len=1 << 20, call_id=internal, worker_id=7)
    yield valid("failure, function error", "Failure", payload=b"ValueError: bad", call_id=gw,
                worker_id=7, error_kind=3)
    yield valid("failure, not found, to caller", "Failure", payload=b"no function 'nope'", call_id=internal,
                worker_id=7, error_kind=1)
    yield valid("failure, message in shm", "Failure", flags=SHM, payload_len=5000, call_id=gw, worker_id=7, error_kind=3)
    yield valid("failure, out of memory", "Failure", payload=b"", call_id=gw, worker_id=7, error_kind=9)
    yield valid("failure, function removed (highest kind)", "Failure", payload=b"", call_id=gw, worker_id=7, error_kind=13)
    yield valid("invoke, name + input inline", "Invoke", payload=b"echo" + b"ping", name_len=4,
                call_id=internal, parent_call_id=gw, worker_id=7, deadline_us=1_790_000_000_000_000)
    yield valid("invoke, name only (empty input)", "Invoke", payload=b"nop", name_len=3, call_id=internal,
                parent_call_id=gw, worker_id=7)
    yield valid("invoke, 64-byte name", "Invoke", payload=b"f" * 64 + b"in", name_len=64, call_id=internal,
                parent_call_id=gw, worker_id=7)
    yield valid("invoke, input in shm, name inline", "Invoke", flags=SHM, payload=b"echo", payload_len=1 << 20,
                name_len=4, call_id=internal, parent_call_id=gw, worker_id=7)
    yield valid("max field values", "Dispatch", call_id=(1 << 64) - 1, parent_call_id=(1 << 64) - 1,
                worker_id=(1 << 31) - 1, deadline_us=(1 << 64) - 1, send_ts_ns=(1 << 64) - 1)
    # The engine asks for a call's CPU time; the reply carries it in aux (µs).
    yield valid("dispatch asking for cpu time", "Dispatch", flags=CPU, payload=b"in", call_id=gw, worker_id=7)
    yield valid("dispatch asking for cpu time, input in shm", "Dispatch", flags=CPU | SHM, payload_len=5000,
                call_id=gw, worker_id=7)
    yield valid("completion with its cpu time", "Completion", flags=CPU, payload=b"out", call_id=gw, worker_id=7,
                aux=1234)
    yield valid("failure with its cpu time, message in shm", "Failure", flags=CPU | SHM, payload_len=5000,
                call_id=gw, worker_id=7, error_kind=3, aux=0)
    # A traced Dispatch: trace id, span id, flags, then the tracestate.
    ctx = bytes.fromhex("4bf92f3577b34da6a3ce929d0e0e4736" "00f067aa0ba902b7" "01")
    yield valid("dispatch, trace context + input inline", "Dispatch", payload=ctx + b"in", name_len=25,
                call_id=gw, worker_id=7)
    yield valid("dispatch, trace context and state inline, input in shm", "Dispatch", flags=SHM,
                payload=ctx + b"rojo=1", payload_len=5000, name_len=31, call_id=gw, worker_id=7)
    yield valid("dispatch, trace context and a 512-byte state, empty input", "Dispatch",
                payload=ctx + b"k=" + b"v" * 510, name_len=537, call_id=internal, parent_call_id=gw, worker_id=7)

    ok = pack(KINDS["Dispatch"], payload=b"abc", call_id=gw, worker_id=1)
    yield invalid("empty buffer", b"")
    yield invalid("header only (64 bytes)", ok[:64])
    yield invalid("1023 bytes", ok[:1023])
    yield invalid("1025 bytes", ok + b"\0")
    yield invalid("kind 0", pack(0))
    yield invalid("kind 9 (unknown)", pack(9))
    yield invalid("kind 0xffff", pack(0xFFFF))
    yield invalid("unknown flag bit 2", pack(KINDS["Dispatch"], flags=4))
    yield invalid("cpu time flag on an invoke", pack(KINDS["Invoke"], flags=CPU, payload=b"ab", name_len=2))
    yield invalid("cpu time flag on a worker hello", pack(KINDS["WorkerHello"], flags=CPU))
    yield invalid("unknown flag bit 15", pack(KINDS["Dispatch"], flags=0x8000))
    yield invalid("reserved byte 52 set", pack(KINDS["Dispatch"], reserved=b"\1" + b"\0" * 11))
    yield invalid("reserved byte 63 set", pack(KINDS["Dispatch"], reserved=b"\0" * 11 + b"\x80"))
    yield invalid("inline payload_len 961", pack(KINDS["Dispatch"], payload_len=961))
    yield invalid("inline payload_len 0xffffffff", pack(KINDS["Completion"], payload_len=0xFFFFFFFF))
    yield invalid("invoke with name_len 0", pack(KINDS["Invoke"], payload=b"abc", name_len=0))
    yield invalid("invoke with name_len 65", pack(KINDS["Invoke"], payload=b"f" * 70, name_len=65))
    yield invalid("invoke name_len beyond inline payload", pack(KINDS["Invoke"], payload=b"ab", name_len=3))
    yield invalid("name_len on a dispatch", pack(KINDS["Dispatch"], payload=b"abc", name_len=3))
    yield invalid("dispatch name_len 24, short of a trace context", pack(KINDS["Dispatch"], payload=b"x" * 30,
                                                                          name_len=24))
    yield invalid("dispatch name_len 538, past the longest state", pack(KINDS["Dispatch"], payload=b"x" * 600,
                                                                         name_len=538))
    yield invalid("dispatch trace context beyond inline payload", pack(KINDS["Dispatch"], payload=b"x" * 25,
                                                                        name_len=26))
    yield invalid("trace context on a completion", pack(KINDS["Completion"], payload=b"x" * 30, name_len=25))
    yield invalid("failure with error_kind 0", pack(KINDS["Failure"], payload=b"x"))
    yield invalid(f"failure with unknown error_kind {len(ERROR_KINDS) + 1}",
                  pack(KINDS["Failure"], error_kind=len(ERROR_KINDS) + 1))
    yield invalid("error_kind on a completion", pack(KINDS["Completion"], error_kind=3))
    yield invalid("shm flag on a worker hello", pack(KINDS["WorkerHello"], flags=SHM, payload_len=2000))
    yield invalid("shm flag on create worker", pack(KINDS["CreateWorker"], flags=SHM))


def main():
    tests = []
    for i, case in enumerate(cases(), start=1):
        tests.append({"tcId": i, **case})
    doc = {
        "schema": "staccato_message_v1",
        "protocol": "docs/protocol.md section 1",
        "numberOfTests": len(tests),
        "notes": {
            "u64": "64-bit fields are decimal strings (JSON numbers lose precision past 2^53)",
            "inline": "hex of the used inline bytes (payload_len bytes, or name_len bytes for an Invoke or a Dispatch "
                      "in shm, or none)",
            "valid": "decode(msg) gives fields; encode(fields) gives msg byte for byte",
            "invalid": "decode(msg) is rejected",
        },
        "tests": tests,
    }
    out = Path(__file__).resolve().parent.parent / "testvectors" / "message_v1.json"
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {out} ({len(tests)} cases)")


def contract():
    shm_cases = [(0x8000000000000001, "Dispatch"), (0x0000000700000001, "Invoke"), (0x00000007ffffffff, "Completion"),
                 (0xffffffffffffffff, "Failure"), (0x0123456789abcdef, "Dispatch")]
    suffix = {"Dispatch": "i", "Invoke": "i", "Completion": "o", "Failure": "o"}
    return {
        "schema": "staccato_contract_v1",
        "protocol": "docs/protocol.md",
        "notes": {
            "u64": "call ids are decimal strings (JSON numbers lose precision past 2^53)",
            "payload_files": "relative to the function's IPC directory",
            "channel_files": "relative to the function's IPC directory; id is the decimal worker id, 0 the launcher",
            "env": "launcher: set by the engine for every launcher; runtime: the only other STACCATO_* names each "
                   "runtime (or the engine) may use",
        },
        "error_kinds": [{"code": i, "name": n, "http_status": s} for i, (n, s) in enumerate(ERROR_KINDS, start=1)],
        "payload_files": [
            {"call_id": str(c), "kind": k, "path": f"shm/{c:016x}.{suffix[k]}"} for c, k in shm_cases
        ],
        "channel_files": [{"id": i, "e2w": f"{i}.e2w", "w2e": f"{i}.w2e"} for i in (0, 1, 42, 2**31 - 1)],
        "env": {"launcher": LAUNCHER_ENV, "runtime": RUNTIME_ENV},
    }


def write_contract():
    out = Path(__file__).resolve().parent.parent / "testvectors" / "contract_v1.json"
    out.write_text(json.dumps(contract(), indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
    write_contract()
