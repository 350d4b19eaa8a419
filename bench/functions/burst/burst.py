"""Waits for the milliseconds the payload says, without holding the
process (bench/burst.py): a Python function's workers share one event
loop, so a blocking sleep would serialize them whatever τ allows."""
import asyncio


async def handle(ctx, payload):
    await asyncio.sleep(int(payload or b"200") / 1000)
    return b"ok"
