"""Sleeps for the seconds its input says (default 0.3), then answers."""
import time


def handle(ctx, data):
    time.sleep(float(data or b"0.3"))
    return b"slept"
