"""Fork-based workers: the launcher as a per-function zygote.

With ``STACCATO_WORKER_MODE=fork`` the launcher, which has already imported
the handler, forks one process per CreateWorker (SOCK, and Nuka §III.C:
expanding by fork skips the runtime's initialization). A worker then has a
GIL, a pid and a fate of its own: the engine can kill a timed-out worker
without taking its siblings down, and CPU-bound handlers use every core.

This module is the process side: fork safely, prepare the child, reap and
kill children. What a child runs is the caller's ``child_main``. Everything
here runs on the launcher's main thread (the event loop's thread).
"""
import asyncio
import gc
import logging
import os
import signal
import sys
import threading
import time
import traceback

log = logging.getLogger("staccato.runtime")

_PR_SET_PDEATHSIG = 1       # <linux/prctl.h>
_REAP_AFTER_KILL_S = 2.0    # a SIGKILLed process dies at once unless stuck in the kernel
_REAP_POLL_S = 1.0          # reaping period without pidfds (Linux < 5.3)


def _load_prctl():
    """libc's prctl and ctypes.get_errno, resolved once in the zygote (ctypes
    is not free to import, and a child should get to work at once); None
    when there is no such call (not Linux)."""
    try:
        import ctypes
        return ctypes.CDLL(None, use_errno=True).prctl, ctypes.get_errno
    except (ImportError, OSError, AttributeError):
        return None


def _os_thread_count():
    """Threads of this process as the kernel sees them, or None if unknown.
    Unlike threading.active_count() it includes threads started by C
    libraries (a BLAS pool, for one)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return None


class _Child:
    __slots__ = ("worker_id", "pidfd")

    def __init__(self, worker_id, pidfd):
        self.worker_id = worker_id
        self.pidfd = pidfd      # readable once the child exits; None without pidfds


class Zygote:
    """The forked workers of one launcher.

    Children are reaped as they exit through a pidfd each, watched by the
    event loop: uvloop refuses a SIGCHLD handler (libuv owns that signal),
    and a pidfd also leaves alone the children an inline worker's handler
    may start and wait for. Without pidfds (Linux < 5.3) a timer polls.
    """

    def __init__(self, loop, function):
        self.loop = loop
        self.function = function
        self.pid = os.getpid()
        self.children = {}      # pid -> _Child, until reaped
        self._prctl = _load_prctl()
        self._warned_native_threads = False
        self._poll_timer = None
        self._stopping = False  # children die because we kill them: no news

    def has_worker(self, worker_id):
        return any(c.worker_id == worker_id for c in self.children.values())

    def inherited_fds(self):
        """Our fds that a new child must close (its siblings' pidfds)."""
        return [c.pidfd for c in self.children.values() if c.pidfd is not None]

    # -- forking ---------------------------------------------------------

    def fork_is_safe(self):
        """fork() copies only the calling thread: a lock another thread holds
        (logging's, the import lock, malloc's) stays locked forever in the
        child. So no fork while the process has other Python threads."""
        if threading.current_thread() is not threading.main_thread():
            # The loop runs on the main thread (main()); anything else is a
            # caller's mistake, and inline still works.
            log.warning("%s: not on the main thread: this worker runs inline", self.function)
            return False
        threads = threading.enumerate()
        if len(threads) > 1:
            names = ", ".join(sorted(t.name for t in threads if t is not threading.current_thread()))
            log.warning("%s: the launcher runs other threads (%s): forking is unsafe, so this "
                        "worker runs inline in the launcher (STACCATO_WORKER_MODE=fork needs "
                        "a handler module that starts no threads at import)", self.function, names)
            return False
        native = _os_thread_count()
        if native is not None and native > 1 and not self._warned_native_threads:
            # Usually a C library's pool (OpenBLAS, for one), which guards
            # fork itself with pthread_atfork: warn once, but fork.
            self._warned_native_threads = True
            log.warning("%s: the launcher has %d threads not started by Python; forking "
                        "workers anyway (a C library that is not fork-safe may hang them)",
                        self.function, native - 1)
        return True

    def spawn(self, worker_id, inherited_fds, child_main):
        """Forks worker ``worker_id``; the child closes ``inherited_fds`` and
        exits with ``child_main()``'s return value. Returns the child's pid,
        or None if fork failed (the engine notices the missing WorkerHello)."""
        # Buffered output would be written twice, once by each process.
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (AttributeError, ValueError, OSError):
                pass
        # Move every object to the permanent generation: the child's garbage
        # collector then never writes to the zygote's objects, so their pages
        # stay shared instead of being copied by the first collection.
        gc.freeze()
        try:
            pid = os.fork()
        except OSError as e:
            log.error("%s: cannot fork worker %d: %s", self.function, worker_id, e)
            return None
        if pid == 0:
            self._become_child([*inherited_fds, *self.inherited_fds()], child_main)  # never returns
        self._watch(pid, worker_id)
        return pid

    def _become_child(self, inherited_fds, child_main):
        """Runs in the child, still inside the zygote's event loop callback:
        it must never return there (the zygote's loop is not ours to run),
        so it always ends with os._exit."""
        code = 1
        try:
            self._tie_to_launcher()
            self._reset_signals()
            # Channel 0 above all: if the child kept it, the engine would not
            # see end of file on it when the launcher dies.
            for fd in inherited_fds:
                try:
                    os.close(fd)
                except OSError:
                    pass
            code = child_main()
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        except BaseException:
            try:
                sys.stderr.write(f"staccato worker (pid {os.getpid()}): "
                                 + traceback.format_exc())
            except BaseException:
                pass
        finally:
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except BaseException:
                    pass
            os._exit(code)

    def _tie_to_launcher(self):
        """A worker must not outlive its launcher, even one killed with
        SIGKILL (which cannot kill its children first): the kernel sends the
        worker SIGKILL when the launcher dies. The C host does the same
        (runtimes/c/src/host.c)."""
        if self._prctl is not None:
            prctl, get_errno = self._prctl
            if prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
                log.warning("%s: prctl(PR_SET_PDEATHSIG) failed (errno %d)", self.function,
                            get_errno())
        # The launcher may have died before prctl took effect.
        if os.getppid() != self.pid:
            os._exit(1)

    @staticmethod
    def _reset_signals():
        """Drops what the zygote's event loop set up for itself."""
        # The wakeup fd is the zygote loop's self-pipe, shared after fork: a
        # signal in the child would wake the launcher. (Python 3.12 resets
        # it at fork by itself.)
        signal.set_wakeup_fd(-1)
        # SIGTERM ends a worker at once, whatever the launcher inherited.
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        # The zygote's loop is running in this thread as far as asyncio's
        # bookkeeping goes; the child starts a loop of its own. (asyncio
        # compares the pid as well; Python 3.12 resets this at fork.)
        asyncio.events._set_running_loop(None)

    # -- reaping ---------------------------------------------------------

    def _watch(self, pid, worker_id):
        try:
            pidfd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            pidfd = None
        self.children[pid] = _Child(worker_id, pidfd)
        if pidfd is not None:
            self.loop.add_reader(pidfd, self._reap_one, pid)
        elif self._poll_timer is None:
            self._poll_timer = self.loop.call_later(_REAP_POLL_S, self._poll)

    def _poll(self):
        self._poll_timer = None
        self.reap()
        if self.children:
            self._poll_timer = self.loop.call_later(_REAP_POLL_S, self._poll)

    def reap(self):
        """Collects every exited child."""
        for pid in list(self.children):
            self._reap_one(pid)

    def _reap_one(self, pid):
        # Only our own pids, never waitpid(-1): an inline worker's handler
        # may be waiting for a subprocess of its own.
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            done, status = pid, 0
        if done == pid:
            self._reaped(pid, status)

    def _reaped(self, pid, status):
        child = self.children.pop(pid)
        worker_id = child.worker_id
        if child.pidfd is not None:
            self.loop.remove_reader(child.pidfd)
            os.close(child.pidfd)
        if self._stopping:
            return
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            try:
                name = signal.Signals(sig).name
            except ValueError:
                name = str(sig)
            log.info("%s: worker %d (pid %d) killed by %s", self.function, worker_id, pid, name)
        elif os.WIFEXITED(status) and os.WEXITSTATUS(status) != 0:
            log.warning("%s: worker %d (pid %d) exited with status %d", self.function,
                        worker_id, pid, os.WEXITSTATUS(status))

    def stop(self):
        """Kills and reaps every child; the launcher is exiting. The wait is
        bounded so a child stuck in the kernel cannot keep the launcher."""
        self._stopping = True
        for pid in self.children:
            try:
                # No pid reuse race: an exited child stays a zombie, its pid
                # taken, until we reap it.
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + _REAP_AFTER_KILL_S
        while self.children and time.monotonic() < deadline:
            self.reap()
            if self.children:
                # Blocking is fine here: the launcher has nothing else to do.
                time.sleep(0.001)
        if self.children:
            log.error("%s: worker processes %s did not die after SIGKILL", self.function,
                      sorted(self.children))
        if self._poll_timer is not None:
            self._poll_timer.cancel()
