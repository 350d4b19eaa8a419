import time


def handle(ctx, data):
    # Blocks the whole event loop: only killing the worker can end this.
    while True:
        time.sleep(1)
