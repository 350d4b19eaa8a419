"""Forks until the kernel refuses, then reports how far it got and cleans up."""
import os
import signal
import time


def handle(ctx, payload):
    children, error = [], None
    for _ in range(10_000):
        try:
            pid = os.fork()
        except OSError as e:
            error = e.strerror
            break
        if pid == 0:
            time.sleep(60)
            os._exit(0)
        children.append(pid)
    for pid in children:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    return f"{len(children)} children, then: {error}".encode()
