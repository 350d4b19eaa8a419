"""Sleeps for the seconds its input says (default 0.3), then answers; with
RECORD_TO set, first appends "slow:<input>" to that file (a test can tell
which calls ran)."""
import os
import time


def handle(ctx, data):
    if os.environ.get("RECORD_TO"):
        fd = os.open(os.environ["RECORD_TO"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, b"slow:" + data + b"\n")
        finally:
            os.close(fd)
    time.sleep(float(data or b"0.3"))
    return b"slept"
