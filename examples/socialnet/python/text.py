"""sn-text: finds the users a post mentions and the URLs it holds, asks
sn-user-mention and sn-url-shorten about them at once, and returns the text
with every URL replaced by its short form (DeathStarBench's TextService).

Python because this is the application's text processing, where regular
expressions say it best; it runs unchanged as a Staccato function and in
rpcserver.py.
"""

import asyncio
import json
import re

# The patterns DeathStarBench's TextService uses.
MENTION = re.compile(r"@[a-zA-Z0-9_-]+")
URL = re.compile(r"https?://[a-zA-Z0-9_!~*'().&=+$%/?#:;@,-]+")

TEXT_MAX = 4096


async def handle(ctx, data: bytes) -> bytes:
    req = json.loads(data)
    if set(req) - {"op", "text"} or req.get("op") != "compose_text":
        raise ValueError("sn-text takes {\"op\": \"compose_text\", \"text\": ...}")
    text = req.get("text")
    if not isinstance(text, str) or len(text.encode()) > TEXT_MAX:
        raise ValueError(f"text must be a string of at most {TEXT_MAX} bytes")
    urls = URL.findall(text)
    names = [m[1:] for m in MENTION.findall(text)]
    shortened, mentions = await asyncio.gather(
        ctx.call("sn-url-shorten", json.dumps({"op": "compose_urls", "urls": urls}).encode()),
        ctx.call("sn-user-mention",
                 json.dumps({"op": "compose_user_mentions", "usernames": names}).encode()),
    )
    shortened = json.loads(shortened)
    # Each occurrence gets the short form made for it, in order.
    short_iter = iter(u["shortened_url"] for u in shortened)
    new_text = URL.sub(lambda _m: next(short_iter), text)
    return json.dumps({
        "text": new_text,
        "user_mentions": json.loads(mentions),
        "urls": shortened,
    }).encode()
