"""Appends its input, one line, to the file RECORD_TO names: a test counts
how often each call ran (O_APPEND writes this short are not interleaved)."""
import os


def handle(ctx, data):
    fd = os.open(os.environ["RECORD_TO"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data + b"\n")
    finally:
        os.close(fd)
    return b"done:" + data
