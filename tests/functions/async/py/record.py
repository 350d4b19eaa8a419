"""Appends its input, one line, to the file RECORD_TO names: a test counts
how often each call ran (O_APPEND writes this short are not interleaved).
Takes RECORD_DELAY_MS (default 0) first, for a test that must stop the
server while calls still run."""
import os
import time

_DELAY_S = int(os.environ.get("RECORD_DELAY_MS", "0")) / 1000


def handle(ctx, data):
    if _DELAY_S:
        time.sleep(_DELAY_S)
    fd = os.open(os.environ["RECORD_TO"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data + b"\n")
    finally:
        os.close(fd)
    return b"done:" + data
