#!/usr/bin/env python3
"""A launcher's first workers, without the engine (issue 14): starts a
Python or Node.js launcher as a plain process on hand-made channels, waits
for its LauncherHello, then asks for three workers one after the other and
times each from CreateWorker sent to WorkerHello read. Isolates what the
runtime itself costs from the engine's and the container's share.

    python3 bench/launcher_start.py node|python [--starts 7] [--gap-ms 0] [--node-arg=--expose-gc]

Prints one line per launcher start (the three workers, µs), then the
medians. `--node-arg=--expose-gc` is how the engine starts Node.js
launchers (the launcher collects the young generation before its hello)."""
import argparse
import os
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "runtimes" / "python"))
from staccato import wire  # noqa: E402


def channel(d, w):
    """Makes channel w's FIFOs and opens the engine's ends (as the engine does)."""
    e2w, w2e = wire.channel_file_names(w)
    os.mkfifo(f"{d}/{e2w}", 0o600)
    os.mkfifo(f"{d}/{w2e}", 0o600)
    return os.open(f"{d}/{e2w}", os.O_RDWR | os.O_NONBLOCK), os.open(f"{d}/{w2e}", os.O_RDONLY | os.O_NONBLOCK)


def recv(rx, timeout=10):
    buf = b""
    end = time.monotonic() + timeout
    while len(buf) < wire.MESSAGE_LEN:
        if not select.select([rx], [], [], max(0, end - time.monotonic()))[0]:
            raise TimeoutError("no message from the launcher")
        buf += os.read(rx, wire.MESSAGE_LEN - len(buf))
    return buf


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runtime", choices=["node", "python"])
    ap.add_argument("--starts", type=int, default=7)
    ap.add_argument("--gap-ms", type=float, default=0, help="wait after the hello and between workers")
    ap.add_argument("--node-arg", action="append", default=[])
    ap.add_argument("--launcher", help="another Node.js launcher file to start (an A/B of a change to it)")
    a = ap.parse_args()
    rows = []
    for _ in range(a.starts):
        d = tempfile.mkdtemp(dir="/dev/shm", prefix="staccato-ls-")
        os.mkdir(f"{d}/shm")
        tx0, rx0 = channel(d, 0)
        env = dict(os.environ, STACCATO_FUNCTION="ls", STACCATO_IPC_DIR=d)
        if a.runtime == "node":
            env["STACCATO_HANDLER"] = "bench.mjs:nop"
            argv = ["node", *a.node_arg, a.launcher or str(ROOT / "runtimes" / "node" / "launcher.mjs")]
            cwd = ROOT / "bench" / "functions" / "node"
        else:
            env["STACCATO_HANDLER"] = "bench_py:nop"
            env["PYTHONPATH"] = str(ROOT / "runtimes" / "python")
            argv = [sys.executable, "-m", "staccato.launcher"]
            cwd = ROOT / "bench" / "functions" / "python"
        started = time.monotonic_ns()
        p = subprocess.Popen(argv, cwd=cwd, env=env)
        try:
            recv(rx0)
            row = [(time.monotonic_ns() - started) // 1000]
            for w in (1, 2, 3):
                time.sleep(a.gap_ms / 1000)
                _, rx = channel(d, w)
                t0 = time.monotonic_ns()
                os.write(tx0, wire.pack(wire.CREATE_WORKER, 0, 0, 0, 0, w, 0, 0, 0, t0, 0, b""))
                recv(rx)
                row.append((time.monotonic_ns() - t0) // 1000)
            rows.append(row)
            print("hello, then workers ready, in µs:", row, flush=True)
        finally:
            p.kill()
            p.wait()
            shutil.rmtree(d, ignore_errors=True)
    print("median µs, launcher hello (from spawn) / 1st / 2nd / 3rd worker:",
          " / ".join(str(statistics.median(r[i] for r in rows)) for i in range(4)))


if __name__ == "__main__":
    main()
