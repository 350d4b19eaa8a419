"""gRPC test functions: the request message's bytes in, the response's out."""
import time


def greet(ctx, data):
    return b"hello " + data


def fail(ctx, data):
    raise ValueError("no greeting for " + data.decode(errors="replace"))


def nap(ctx, data):
    time.sleep(float(data or b"2"))
    return b"rested"
