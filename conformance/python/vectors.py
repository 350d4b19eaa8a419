#!/usr/bin/env python3
"""The Python runtime's vector program for the conformance suite
(conformance/README.md, section 1).

Usage: python3 conformance/python/vectors.py testvectors/message_v1.json

Runs every test case's message through the runtime's real codec
(runtimes/python/staccato/wire.py, the one its workers use) and prints one
JSON object per line:

  {"tcId": 7, "decoded": true, "fields": {...}, "reencoded": "<hex>"}
  {"tcId": 30, "decoded": false, "error": "unknown kind 9"}
"""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "runtimes" / "python"))

from staccato import wire  # noqa: E402  (needs the path above)


def fields(msg):
    # Small integers as numbers, u64 fields as decimal strings, inline as hex:
    # the vector file's conventions.
    return {
        "kind": wire.KIND_NAMES[msg.kind],
        "flags": msg.flags,
        "payload_len": msg.payload_len,
        "call_id": str(msg.call_id),
        "parent_call_id": str(msg.parent_call_id),
        "worker_id": msg.worker_id,
        "name_len": msg.name_len,
        "error_kind": msg.error_kind,
        "deadline_us": str(msg.deadline_us),
        "send_ts_ns": str(msg.send_ts_ns),
        "aux": msg.aux,
        "inline": bytes(msg.inline).hex(),
    }


def run_case(tc):
    out = {"tcId": tc.get("tcId")}
    try:
        raw = bytes.fromhex(tc["msg"])
    except (KeyError, TypeError, ValueError):
        return {**out, "decoded": False, "error": "malformed msg hex in the vector file"}
    try:
        msg = wire.decode(raw)
    except wire.WireError as e:
        return {**out, "decoded": False, "error": str(e)}
    out.update(decoded=True, fields=fields(msg))
    try:
        out["reencoded"] = wire.encode(msg).hex()
    except wire.WireError as e:
        out.update(reencoded=None, error=str(e))
    return out


def main():
    if len(sys.argv) < 2:
        print(f"usage: {sys.argv[0]} message_v1.json", file=sys.stderr)
        return 2
    with open(sys.argv[-1], encoding="utf-8") as f:
        doc = json.load(f)
    for tc in doc["tests"]:
        print(json.dumps(run_case(tc)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
