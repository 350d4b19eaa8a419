"""How long a new Python worker takes to start, per way of starting it.

    python3 runtimes/python/bench_spawn.py [--reps 30] [--handler heavy|light]

Plays the engine (tests/fake_engine.py: real launchers, real FIFOs) and
measures, from the moment it asks for a worker:

* ``hello``: until the worker's WorkerHello arrives;
* ``first result``: until the Completion of a first call sent right after
  the hello (a forked worker's first call pays for copy-on-write faults).

Variants, interleaved round-robin within each repetition (the machine's
noise hits all of them alike):

* ``inline``: CreateWorker to a running inline launcher (a channel);
* ``fork``: CreateWorker to a running fork-mode launcher (a process);
* ``cold``: a new launcher process, from its start (the engine's cold
  start), to LauncherHello (``launcher hello``) and to the first worker's
  hello after an immediate CreateWorker.

Standard library only. Times are milliseconds; p50/p90 by nearest rank.
"""
import argparse
import math
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "tests"))

from fake_engine import LAUNCHER_PYTHON, Engine  # noqa: E402 (needs the path above)
from staccato import wire  # noqa: E402
from staccato.wire import Message  # noqa: E402

# A module that costs something to import, as real handlers do: stdlib
# packages a web-ish function would pull in, and a ~5 MB table built at import.
HEAVY = textwrap.dedent('''
    import asyncio, decimal, email.message, email.parser, email.policy, http.client
    import json, logging.handlers, urllib.request, xml.etree.ElementTree

    TABLE = {f"key{i}": (i, decimal.Decimal(i) / 7) for i in range(40_000)}

    def handle(ctx, data):
        return data
''')
LIGHT = "def handle(ctx, data):\n    return data\n"

_GATEWAY = 1 << 63


def percentile(values, p):
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def ms(ns):
    return ns / 1e6


class Running:
    """A launcher that stays up; each sample starts and stops one worker."""

    def __init__(self, root, source, mode):
        self.engine = Engine(root / mode, source=source, worker_mode=mode)
        self.engine.hello()
        self.call_id = 0

    def sample(self):
        eng = self.engine
        chan = eng.new_channel()
        t0 = time.perf_counter_ns()
        eng.chan0.send(Message(wire.CREATE_WORKER, worker_id=chan.worker_id))
        hello = chan.recv()
        t_hello = time.perf_counter_ns()
        assert hello.kind == wire.WORKER_HELLO, hello
        self.call_id += 1
        result = eng.call(chan, b"x", _GATEWAY | self.call_id)
        t_result = time.perf_counter_ns()
        assert result.kind == wire.COMPLETION, result
        # Stop it so the next sample starts from the same state.
        chan.send(Message(wire.STOP_WORKER, worker_id=chan.worker_id))
        chan.expect_eof()
        chan.close()
        del eng.workers[chan.worker_id]
        for suffix in (".e2w", ".w2e"):
            os.unlink(os.path.join(eng.ipc, f"{chan.worker_id}{suffix}"))
        return {"hello": t_hello - t0, "first result": t_result - t0}

    def close(self):
        self.engine.close()


class Cold:
    """A new launcher per sample (inline mode, today's default)."""

    def __init__(self, root, source):
        self.root = root
        self.source = source
        self.n = 0

    def sample(self):
        self.n += 1
        eng = Engine(self.root / f"cold{self.n}", source=self.source)
        try:
            t0 = eng.started_ns
            eng.hello()
            t_launcher = time.perf_counter_ns()
            chan = eng.new_channel()  # FIFOs made before asking, as the engine does
            eng.chan0.send(Message(wire.CREATE_WORKER, worker_id=chan.worker_id))
            hello = chan.recv()
            t_hello = time.perf_counter_ns()
            assert hello.kind == wire.WORKER_HELLO, hello
            result = eng.call(chan, b"x", _GATEWAY | 1)
            t_result = time.perf_counter_ns()
            assert result.kind == wire.COMPLETION, result
        finally:
            eng.close()
        return {"launcher hello": t_launcher - t0, "hello": t_hello - t0,
                "first result": t_result - t0}

    def close(self):
        pass


def import_time_ms(root, source):
    """The handler module's import alone, in a fresh interpreter (median of 5)."""
    code = root / "import-probe"
    code.mkdir()
    (code / "handler.py").write_text(source)
    probe = ("import time; t = time.perf_counter(); import handler; "
             "print((time.perf_counter() - t) * 1e3)")
    runs = [float(subprocess.run([LAUNCHER_PYTHON, "-c", probe], cwd=code, check=True,
                                 capture_output=True, text=True).stdout) for _ in range(5)]
    return sorted(runs)[2]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=30, help="samples per variant (default 30)")
    parser.add_argument("--handler", choices=("heavy", "light"), default="heavy")
    args = parser.parse_args()
    source = HEAVY if args.handler == "heavy" else LIGHT

    with tempfile.TemporaryDirectory(prefix="staccato-bench-spawn-") as tmp:
        root = Path(tmp)
        variants = {"inline": Running(root, source, "inline"),
                    "fork": Running(root, source, "fork"),
                    "cold": Cold(root, source)}
        samples = {name: [] for name in variants}
        try:
            names = list(variants)
            for rep in range(args.reps):
                # Rotate the order so no variant always runs right after another.
                k = rep % len(names)
                for name in names[k:] + names[:k]:
                    samples[name].append(variants[name].sample())
        finally:
            for v in variants.values():
                v.close()
        import_ms = import_time_ms(root, source)

    print(f"worker start, {args.reps} samples per variant, {args.handler} handler "
          f"(import alone: {import_ms:.1f} ms), Python {sys.version.split()[0]}, "
          f"{os.cpu_count()} CPUs")
    print(f"{'variant':<8} {'metric':<15} {'p50 ms':>8} {'p90 ms':>8}")
    p50 = {}
    for name, rows in samples.items():
        for metric in ("launcher hello", "hello", "first result"):
            if metric not in rows[0]:
                continue
            values = [r[metric] for r in rows]
            p50[name, metric] = percentile(values, 50)
            print(f"{name:<8} {metric:<15} {ms(p50[name, metric]):8.3f} "
                  f"{ms(percentile(values, 90)):8.3f}")
    cold = p50["cold", "hello"]
    print(f"p50 hello, cold / fork: {cold / p50['fork', 'hello']:.0f}x; "
          f"fork / inline: {p50['fork', 'hello'] / p50['inline', 'hello']:.1f}x")


if __name__ == "__main__":
    main()
