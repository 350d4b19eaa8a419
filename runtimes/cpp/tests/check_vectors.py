#!/usr/bin/env python3
"""Checks a conformance vector program against the vector file the way the
conformance driver does (conformance/README.md, section 1): every valid case
decodes to exactly the listed fields and re-encodes byte for byte, every
invalid case is rejected.  Usage: check_vectors.py PROGRAM VECTORS."""
import json
import subprocess
import sys


def main():
    program, vectors = sys.argv[1], sys.argv[2]
    doc = json.load(open(vectors, encoding="utf-8"))
    proc = subprocess.run([program, vectors], capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        print(f"{program} exited {proc.returncode}: {proc.stderr}")
        return 1
    got = {}
    for line in proc.stdout.splitlines():
        obj = json.loads(line)
        got[obj["tcId"]] = obj
    failed = 0
    for tc in doc["tests"]:
        out = got.get(tc["tcId"])
        if tc["result"] == "valid":
            ok = (out is not None and out.get("decoded") is True and out.get("fields") == tc["fields"]
                  and out.get("reencoded") == tc["msg"].lower())
        else:
            ok = out is not None and out.get("decoded") is False and bool(out.get("error"))
        if not ok:
            failed += 1
            print(f"FAIL tcId {tc['tcId']} ({tc.get('comment')}): {out}")
    if len(got) != len(doc["tests"]):
        failed += 1
        print(f"FAIL: {len(got)} cases printed, {len(doc['tests'])} in the file")
    print(f"vectors: {len(doc['tests']) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
