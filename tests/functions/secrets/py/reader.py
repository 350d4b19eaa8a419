import json
import os


async def handle(ctx, data: bytes) -> bytes:
    """Reads the secrets and paths it is asked for; reports what it got."""
    req = json.loads(data or b"{}")
    base = os.environ.get("STACCATO_SECRETS_DIR", "/var/secrets")
    out = {"dir": base, "listing": sorted(os.listdir(base)) if os.path.isdir(base) else None}
    for name in req.get("read", []):
        try:
            with open(os.path.join(base, name)) as f:
                out[name] = f.read()
        except OSError as e:
            out[name] = f"ERR {e.errno}"
    for path in req.get("paths", []):
        try:
            with open(path) as f:
                out[path] = f.read()
        except OSError as e:
            out[path] = f"ERR {e.errno}"
    if req.get("write"):
        try:
            with open(os.path.join(base, "db-password"), "w") as f:
                f.write("changed")
            out["write"] = "ok"
        except OSError as e:
            out["write"] = f"ERR {e.errno}"
    return json.dumps(out).encode()
