import asyncio
import json


async def handle(ctx, data):
    """Calls echo 8 times concurrently; reports the results in order."""
    n = int(data or b"8")
    outs = await asyncio.gather(*(ctx.call("echo", f"part-{i}".encode()) for i in range(n)))
    return json.dumps([o.decode() for o in outs]).encode()
