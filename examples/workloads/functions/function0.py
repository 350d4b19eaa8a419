import json

# A fixed document; serialising it a few times is ~1 ms of CPU on a typical core.
_DOC = {
    "items": [
        {"id": i, "name": f"item-{i}", "price": i * 1.25, "tags": ["a", "b", "c"], "ok": i % 2 == 0}
        for i in range(200)
    ]
}
_ROUNDS = 6


def handle(ctx, data: bytes) -> bytes:
    """FaaSProfiler's json_dumps-like function: serialise a document."""
    out = b""
    for _ in range(_ROUNDS):
        out = json.dumps(_DOC).encode()
    return json.dumps({"bytes": len(out), "input_bytes": len(data)}).encode()
