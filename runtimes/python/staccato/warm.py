"""A warm Python launcher for the engine's isolation pool:
``python3 -m staccato.warm``.

The engine starts this in a pooled container before any function is known
(Nuka §III.A: keep what is expensive ready). It pays for the interpreter and
the runtime's imports (asyncio, uvloop, the staccato package) up front, then
waits on ``STACCATO_WARM_FIFO`` for an assignment: one message, a 4-byte
little-endian length and a JSON object ``{"env": {...}, "cwd": "/code"}``.
By then the engine has mounted the function's code, channels and
dependencies into the container. It takes the function's environment,
points stdout and stderr at the function's log, and becomes its launcher,
so a pooled Python function starts in a few milliseconds instead of the
~50 ms an interpreter and these imports cost.
"""
import json
import os
import struct
import sys

# What the launcher would import anyway, imported before the wait.
import asyncio  # noqa: F401
import importlib  # noqa: F401
import logging  # noqa: F401

from . import launcher

try:
    import uvloop  # noqa: F401
except ImportError:
    pass

LOG = "/staccato/log"


def read_exact(fd, n):
    buf = b""
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            raise EOFError("the engine went away before assigning a function")
        buf += chunk
    return buf


def main():
    fifo = os.environ.get("STACCATO_WARM_FIFO")
    status = os.environ.get("STACCATO_WARM_STATUS")
    if not fifo or not status:
        print("staccato.warm: STACCATO_WARM_FIFO and STACCATO_WARM_STATUS must be set", file=sys.stderr)
        return 2
    # Non-blocking opens: the engine holds both FIFOs before it starts us,
    # so no peer means it died meanwhile, and we must exit rather than wait
    # in open() forever (ENXIO below, or end-of-file on the first read).
    try:
        fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        st = os.open(status, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as e:
        print(f"staccato.warm: the engine is gone ({e})", file=sys.stderr)
        return 0
    os.set_blocking(fd, True)
    os.write(st, f"WARM {os.getpid()}\n".encode())
    os.close(st)
    try:
        (n,) = struct.unpack("<I", read_exact(fd, 4))
        msg = json.loads(read_exact(fd, n))
    except EOFError:
        return 0
    os.close(fd)
    os.environ.clear()
    os.environ.update(msg["env"])
    os.chdir(msg["cwd"])
    # PYTHONPATH was read at interpreter start; the function's dependencies
    # come after the runtime, as a fresh interpreter would order them.
    for p in reversed([p for p in msg["env"].get("PYTHONPATH", "").split(":") if p and p not in sys.path]):
        sys.path.insert(1, p)
    # The log is a FIFO the engine reads: never wait for a reader in open().
    out = os.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK)
    os.set_blocking(out, True)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    return launcher.main()


if __name__ == "__main__":
    sys.exit(main())
