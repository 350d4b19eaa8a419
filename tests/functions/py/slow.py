import asyncio
import json
import os
import time

_running = 0
_running_max = 0


async def handle(ctx, data):
    """Sleeps for the given milliseconds; reports how many ran at once here."""
    global _running, _running_max
    _running += 1
    _running_max = max(_running_max, _running)
    try:
        await asyncio.sleep(int(data or b"100") / 1000)
        return json.dumps({"pid": os.getpid(), "running_max": _running_max, "t": time.time()}).encode()
    finally:
        _running -= 1
