"""Allocates (and touches) the number of MiB it is given."""
import os


def handle(ctx, payload):
    mib = int(payload or b"1")
    block = bytearray(mib << 20)  # zero-filled: every page is touched
    return f"allocated {len(block) >> 20} MiB in pid {os.getpid()}".encode()
