"""A private `staccato up` for the bench scripts: a free loopback port, a
state directory of its own, the environment that points the command
line at it, and a stop that always runs.

    with up.private(binary, up_args, log=f, prefix=["taskset", "-c", "0"]) as env:
        subprocess.run([binary, "deploy", ...], env=env)
"""
import contextlib
import os
import socket
import subprocess
import tempfile
import time
from pathlib import Path


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def private(binary, up_args=(), log=subprocess.DEVNULL, prefix=(), extra_env=None):
    """Starts `binary up` and yields an environment for the command line
    (STACCATO_GATEWAY, STACCATO_TOKEN; no other STACCATO_ variable of the
    caller's), once it wrote its token and listens. Stops it on the way out."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("STACCATO_")}
    env.update(extra_env or {})
    with tempfile.TemporaryDirectory() as state:
        proc = subprocess.Popen([*prefix, binary, "up", "--listen", f"127.0.0.1:{port}", "--state-dir", state,
                                 *up_args], stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            token = Path(state) / "token"
            for _ in range(300):
                if token.exists():
                    break
                time.sleep(0.1)
            else:
                raise RuntimeError("staccato up wrote no token in 30 s")
            env["STACCATO_GATEWAY"] = f"http://127.0.0.1:{port}"
            env["STACCATO_TOKEN"] = token.read_text().strip()
            for _ in range(300):
                try:
                    with socket.create_connection(("127.0.0.1", port), timeout=1):
                        break
                except OSError:
                    time.sleep(0.1)
            else:
                raise RuntimeError(f"staccato up did not listen on {port} in 30 s")
            yield env
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
