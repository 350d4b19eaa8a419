import asyncio
import json
import os
import time

from staccato import wire


async def handle(ctx, data: bytes) -> bytes:
    """A hostile function: leaves a link to a host path where its output
    file goes, then says its output is in that file, hoping the engine (as
    root) reads the link's target and answers with it."""
    req = json.loads(data)
    name = wire.shm_file_name(ctx.call_id, wire.COMPLETION)
    os.symlink(req["target"], os.path.join(os.environ["STACCATO_IPC_DIR"], "shm", name))
    ch = ctx._channel
    ch.send(wire.pack(wire.COMPLETION, wire.PAYLOAD_IN_SHM, req["len"], ctx.call_id, ctx.parent_call_id,
                      ch.worker_id, 0, 0, 0, time.monotonic_ns(), 0, b""))
    await asyncio.sleep(0.2)
    return b"the runtime's own answer"
