"""Leaves things behind in its container: a file in /tmp and a process that
outlives the call ("leave"). A container returned to the pool must lose
both; "check" reports what this container holds."""
import json
import os
import subprocess


def handle(ctx, payload):
    if payload == b"check":
        return json.dumps({
            "leftover": os.path.exists("/tmp/leftover"),
            "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
            "mounts": open("/proc/self/mountinfo").read(),
        }).encode()
    with open("/tmp/leftover", "w") as f:
        f.write("from dirty")
    p = subprocess.Popen(["/bin/sleep", "1000"], start_new_session=True)
    return f"{p.pid}".encode()
