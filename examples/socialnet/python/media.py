"""sn-media: pairs a post's media ids with their types (DeathStarBench's
MediaService). Python, like sn-text: no store, a few lines."""

import json

MEDIA_MAX = 16
MEDIA_TYPES = {"png", "jpg", "gif", "mp4"}


def handle(ctx, data: bytes) -> bytes:
    req = json.loads(data)
    if set(req) - {"op", "media_ids", "media_types"} or req.get("op") != "compose_media":
        raise ValueError("sn-media takes {\"op\": \"compose_media\", \"media_ids\", \"media_types\"}")
    ids, types = req.get("media_ids") or [], req.get("media_types") or []
    if len(ids) != len(types) or len(ids) > MEDIA_MAX:
        raise ValueError(f"media_ids and media_types must pair up, at most {MEDIA_MAX}")
    out = []
    for i, t in zip(ids, types):
        if not isinstance(i, int) or isinstance(i, bool) or t not in MEDIA_TYPES:
            raise ValueError(f"bad media {i!r} of type {t!r} (types: {sorted(MEDIA_TYPES)})")
        out.append({"media_id": i, "media_type": t})
    return json.dumps(out).encode()
