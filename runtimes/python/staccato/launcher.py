"""The Python launcher: ``python3 -m staccato.launcher``.

Started by the engine once per function, in the function's code directory
(docs/protocol.md §1, "Launchers and workers"). It imports the handler, opens
channel 0, says LauncherHello, and then opens every worker channel the engine
asks for inside this same process: one event loop multiplexes all channels.
"""
import asyncio
import importlib
import inspect
import logging
import os
import sys
import time
import traceback

from .channel import LauncherChannel, WorkerChannel, open_fifos
from .wire import LAUNCHER_HELLO, WORKER_HELLO, pack

log = logging.getLogger("staccato.runtime")

DEFAULT_HANDLER = "handler:handle"
DEFAULT_PAYLOAD_MAX = 6 << 20


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
    """All channels of one launcher process."""

    def __init__(self, loop, function, ipc_dir, handler, payload_max):
        self.loop = loop
        self.function = function
        self.ipc_dir = ipc_dir
        self.shm_dir = os.path.join(ipc_dir, "shm")
        self.handler = handler
        self.handler_is_async = inspect.iscoroutinefunction(handler)
        self.payload_max = payload_max
        self.pid = os.getpid()
        self.workers = {}       # worker_id -> WorkerChannel
        self._stopped = loop.create_future()

    async def run(self, rfd, wfd):
        """Serves channel 0 (already open as rfd/wfd) until the engine goes."""
        launcher = LauncherChannel(self, 0, rfd, wfd)
        launcher.send(pack(LAUNCHER_HELLO, 0, 0, 0, 0, 0, 0, 0, 0,
                           time.monotonic_ns(), self.pid, b""))
        launcher.start()
        reason = await self._stopped
        log.info("%s: launcher exiting (%s)", self.function, reason)
        launcher.close(reason)
        await self._shutdown_workers(reason)

    def stop(self, reason):
        if not self._stopped.done():
            self._stopped.set_result(reason)

    def create_worker(self, worker_id):
        # Worker ids are below 2^31 so internal call ids keep bit 63 clear.
        if not 0 < worker_id < 1 << 31 or worker_id in self.workers:
            log.error("%s: CreateWorker for invalid or open worker id %d", self.function, worker_id)
            return
        try:
            rfd, wfd = open_fifos(self.ipc_dir, worker_id)
        except OSError as e:
            # Nothing to answer on: the engine notices the missing WorkerHello.
            log.error("%s: cannot open worker channel %d: %s", self.function, worker_id, e)
            return
        channel = WorkerChannel(self, worker_id, rfd, wfd)
        self.workers[worker_id] = channel
        channel.send(pack(WORKER_HELLO, 0, 0, 0, 0, worker_id, 0, 0, 0,
                          time.monotonic_ns(), self.pid, b""))
        channel.start()

    def channel_closed(self, channel):
        self.workers.pop(channel.worker_id, None)

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


def main():
    function = os.environ.get("STACCATO_FUNCTION", "")
    ipc_dir = os.environ.get("STACCATO_IPC_DIR")
    spec = os.environ.get("STACCATO_HANDLER") or DEFAULT_HANDLER
    setup_logging()
    try:
        if not ipc_dir:
            raise StartupError("STACCATO_IPC_DIR is not set")
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
        runtime = Runtime(loop, function, ipc_dir, handler, payload_max)
        loop.run_until_complete(runtime.run(rfd, wfd))
    finally:
        loop.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
