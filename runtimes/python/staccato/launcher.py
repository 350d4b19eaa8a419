"""The Python launcher: ``python3 -m staccato.launcher``.

Started by the engine once per function, in the function's code directory
(docs/protocol.md §1, "Launchers and workers"). It imports the handler, opens
channel 0, says LauncherHello, and then starts every worker the engine asks
for, in one of two ways (``STACCATO_WORKER_MODE``):

* ``inline`` (the default): the worker's channel is opened inside this same
  process; one event loop multiplexes all channels.
* ``fork``: this process is a zygote that forks one process per worker
  (zygote.py); each child serves its one channel on an event loop of its own.
"""
import asyncio
import functools
import importlib
import inspect
import logging
import os
import sys
import time
import traceback

from .channel import LauncherChannel, WorkerChannel, open_fifos
from .wire import LAUNCHER_HELLO, WORKER_HELLO, pack
from .zygote import Zygote

log = logging.getLogger("staccato.runtime")

DEFAULT_HANDLER = "handler:handle"
DEFAULT_PAYLOAD_MAX = 6 << 20
WORKER_MODES = ("inline", "fork")
_CANCEL_WAIT_S = 1.0


class StartupError(Exception):
    """The launcher cannot start; the message says why."""


def load_handler(spec):
    """Imports ``module:function`` and returns the callable."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise StartupError(f"STACCATO_HANDLER must be 'module:function', got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except Exception:
        raise StartupError(f"cannot import handler module {module_name!r}:\n"
                           + traceback.format_exc().rstrip()) from None
    handler = module
    for part in attr.split("."):
        handler = getattr(handler, part, None)
        if handler is None:
            raise StartupError(f"handler module {module_name!r} has no attribute {attr!r}")
    if not callable(handler):
        raise StartupError(f"handler {spec!r} is not callable")
    return handler


def new_event_loop():
    """uvloop when installed (faster), else the standard asyncio loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class Runtime:
    """All channels of one process: a launcher (channel 0 and its inline
    workers), or a forked worker (its one channel)."""

    def __init__(self, loop, function, ipc_dir, handler, payload_max, worker_mode="inline"):
        self.loop = loop
        self.function = function
        self.ipc_dir = ipc_dir
        self.shm_dir = os.path.join(ipc_dir, "shm")
        self.handler = handler
        self.handler_is_async = inspect.iscoroutinefunction(handler)
        self.payload_max = payload_max
        self.pid = os.getpid()
        self.workers = {}       # worker_id -> WorkerChannel served in this process
        self.zygote = Zygote(loop, function) if worker_mode == "fork" else None
        self._launcher = None   # channel 0, in a launcher
        self._exit_with_worker = False  # a forked worker: exit when its channel closes
        self._stopped = loop.create_future()

    async def run(self, rfd, wfd):
        """Serves channel 0 (already open as rfd/wfd) until the engine goes."""
        launcher = self._launcher = LauncherChannel(self, 0, rfd, wfd)
        launcher.send(pack(LAUNCHER_HELLO, 0, 0, 0, 0, 0, 0, 0, 0,
                           time.monotonic_ns(), self.pid, b""))
        launcher.start()
        reason = await self._stopped
        log.info("%s: launcher exiting (%s)", self.function, reason)
        launcher.close(reason)
        await self._shutdown_workers(reason)
        if self.zygote is not None:
            self.zygote.stop()

    async def serve_worker(self, worker_id):
        """A forked worker's life: serves channel ``worker_id`` until it
        closes (StopWorker, or the engine is gone); returns the exit status."""
        self._exit_with_worker = True
        channel = self._open_worker(worker_id)
        if channel is None:
            return 1
        await self._stopped
        # Let running handlers see the cancellation (finally blocks), but do
        # not wait forever for one that ignores it: nobody can get its result.
        tasks = channel.cancel_tasks()
        if tasks:
            await asyncio.wait(tasks, timeout=_CANCEL_WAIT_S)
        return 0

    def stop(self, reason):
        if not self._stopped.done():
            self._stopped.set_result(reason)

    def create_worker(self, worker_id):
        # Worker ids are below 2^31 so internal call ids keep bit 63 clear.
        if (not 0 < worker_id < 1 << 31 or worker_id in self.workers
                or self.zygote is not None and self.zygote.has_worker(worker_id)):
            log.error("%s: CreateWorker for invalid or open worker id %d", self.function, worker_id)
            return
        if self.zygote is not None and self.zygote.fork_is_safe():
            self.zygote.spawn(worker_id, self._channel_fds(),
                              functools.partial(self._forked_worker_main, worker_id))
            return
        self._open_worker(worker_id)

    def _open_worker(self, worker_id):
        """Opens channel ``worker_id`` in this process and says WorkerHello;
        returns the channel, or None if it cannot be opened."""
        try:
            rfd, wfd = open_fifos(self.ipc_dir, worker_id)
        except OSError as e:
            # Nothing to answer on: the engine notices the missing WorkerHello.
            log.error("%s: cannot open worker channel %d: %s", self.function, worker_id, e)
            return None
        channel = WorkerChannel(self, worker_id, rfd, wfd)
        self.workers[worker_id] = channel
        channel.send(pack(WORKER_HELLO, 0, 0, 0, 0, worker_id, 0, 0, 0,
                          time.monotonic_ns(), self.pid, b""))
        channel.start()
        return channel

    def _channel_fds(self):
        """The fds of every channel open in this process (a child closes them)."""
        fds = []
        for channel in (self._launcher, *self.workers.values()):
            if channel is not None and not channel.closed:
                fds += (channel.rfd, channel.wfd)
        return fds

    def _forked_worker_main(self, worker_id):
        """Runs in a freshly forked child, on the zygote's stack. The zygote's
        loop must never run here again (its epoll set and self-pipe are
        shared with the launcher), so the child gets a new loop and a
        Runtime of its own; zygote.py exits the process when this returns."""
        loop = new_event_loop()
        asyncio.set_event_loop(loop)
        runtime = Runtime(loop, self.function, self.ipc_dir, self.handler, self.payload_max)
        return loop.run_until_complete(runtime.serve_worker(worker_id))

    def channel_closed(self, channel, reason):
        self.workers.pop(channel.worker_id, None)
        if self._exit_with_worker and not self.workers:
            self.stop(f"worker {channel.worker_id}: {reason}")

    async def _shutdown_workers(self, reason):
        tasks = []
        for channel in list(self.workers.values()):
            channel.close(reason)
            tasks += channel.cancel_tasks()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)


def setup_logging():
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root = logging.getLogger("staccato")
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    root.propagate = False


def worker_mode_from_env():
    mode = os.environ.get("STACCATO_WORKER_MODE") or "inline"
    if mode not in WORKER_MODES:
        raise StartupError(f"STACCATO_WORKER_MODE must be one of {', '.join(WORKER_MODES)}, got {mode!r}")
    if mode == "fork" and not hasattr(os, "fork"):
        raise StartupError("STACCATO_WORKER_MODE=fork: this platform has no fork()")
    return mode


def main():
    function = os.environ.get("STACCATO_FUNCTION", "")
    ipc_dir = os.environ.get("STACCATO_IPC_DIR")
    spec = os.environ.get("STACCATO_HANDLER") or DEFAULT_HANDLER
    setup_logging()
    try:
        if not ipc_dir:
            raise StartupError("STACCATO_IPC_DIR is not set")
        worker_mode = worker_mode_from_env()
        try:
            payload_max = int(os.environ.get("STACCATO_PAYLOAD_MAX") or DEFAULT_PAYLOAD_MAX)
        except ValueError:
            raise StartupError("STACCATO_PAYLOAD_MAX is not an integer") from None
        # The code directory comes first, so the function's modules win.
        cwd = os.getcwd()
        if sys.path[:1] != [cwd]:
            sys.path.insert(0, cwd)
        # Import before touching channel 0, so a broken function fails at
        # startup rather than on its first call.
        handler = load_handler(spec)
    except StartupError as e:
        print(f"staccato launcher ({function or '?'}): {e}", file=sys.stderr)
        return 1

    try:
        rfd, wfd = open_fifos(ipc_dir, 0)
    except OSError as e:
        print(f"staccato launcher ({function or '?'}): cannot open channel 0: {e}", file=sys.stderr)
        return 1
    loop = new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        runtime = Runtime(loop, function, ipc_dir, handler, payload_max, worker_mode)
        loop.run_until_complete(runtime.run(rfd, wfd))
    finally:
        loop.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
