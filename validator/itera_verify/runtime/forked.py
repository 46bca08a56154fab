"""Run a function in a forked child process and take back its pickled result.

Why: the checks are pure Python; a thread would wait for the interpreter lock, a second process does not. A
forked child starts in milliseconds with the parent's parsed state (no re-import, nothing to pickle on the way
in); only the result crosses a pipe. Where fork is missing (Windows), `can_fork()` is false and callers run
the work in-process.
"""
from __future__ import annotations

import os
import pickle
import select
import signal
import threading
import traceback
import warnings
from typing import Any, Callable


# How often a main thread that waits (for a child, a thread, futures) wakes: a Ctrl-C or SIGTERM the kernel hands
# to another thread runs its Python handler only when the main thread wakes.
SIGNAL_POLL_SECONDS = 0.2


class ChildLost(Exception):
    """The child ended without handing back a result (killed, out of memory)."""


INTERRUPTS = {signal.SIGINT, signal.SIGTERM}
_MASKABLE = hasattr(signal, "pthread_sigmask")


def can_fork() -> bool:
    return hasattr(os, "fork")


# The tool's own worker threads, by the names they are started with (the seal's pass, the archive's readers,
# writers and compressors, the push's follower, parts and sidecars, its ranged read-back). A child forked while
# one of them runs inherits whatever lock it held at that instant (an allocator's, a compressor's, a file
# object's) and may wait on it forever.
TOOL_THREADS = ("seal", "archive-", "push-", "range-read")


class ForkAfterThreads(OSError):
    """A fork was asked for while the tool's own threads run. An OSError, so every caller's "no fork now" path
    runs the work in this process instead; the order (fork first, then start threads) is checked here, by code,
    not left to the order of lines in a workflow."""


def tool_threads_running() -> list[str]:
    return sorted(t.name for t in threading.enumerate() if t.is_alive() and t.name.startswith(TOOL_THREADS))


class Forked:
    """Starts `function()` in a forked child at once; result() waits for it and returns its value, or raises
    what it raised (ChildLost when it died silently). cancel() kills it; both are safe to call more than once.
    Refused (ForkAfterThreads) while the tool's own threads run."""

    def __init__(self, function: Callable[[], Any]):
        running = tool_threads_running()
        if running:
            raise ForkAfterThreads(f"fork refused: the tool's threads {', '.join(running)} are running (fork "
                                   "before starting them)")
        read_fd, write_fd = os.pipe()
        # Ctrl-C and SIGTERM wait until both sides are past the fork: one landing in the child while the
        # interpreter runs its after-fork hooks (random reseeds itself there) printed a traceback as "Exception
        # ignored" and could not be caught. Held back, it arrives in `_child`, which hands it to the parent.
        held = signal.pthread_sigmask(signal.SIG_BLOCK, INTERRUPTS) if _MASKABLE else None
        with warnings.catch_warnings():
            # Python 3.12+ warns when a process with threads forks. The child runs only `function` and leaves
            # through os._exit: it takes no lock another thread may have held (no logging, no shared files).
            warnings.simplefilter("ignore", DeprecationWarning)
            try:
                pid = os.fork()
            except OSError:  # the caller decides what to do instead; the pipe goes with the attempt
                _restore(held)
                os.close(read_fd)
                os.close(write_fd)
                raise
        if pid == 0:  # pragma: no cover - runs in the child, measured by the tests through its result
            os.close(read_fd)
            _child(function, write_fd, held)  # it lets the signals through inside its own try
        _restore(held)
        os.close(write_fd)
        self.pid: int | None = pid
        self._pipe = os.fdopen(read_fd, "rb")

    def result(self) -> Any:
        try:
            # Bounded waits: a Ctrl-C or SIGTERM the kernel hands to another thread runs its handler only when
            # this (main) thread wakes.
            while not select.select([self._pipe], [], [], SIGNAL_POLL_SECONDS)[0]:
                pass
            data = self._pipe.read()  # until the child closes its end: it has finished or died
        except BaseException:  # interrupted (Ctrl-C, SIGTERM): the child goes too, not waited for
            self.cancel()
            raise
        self._pipe.close()
        status = self._reap()
        if not data:
            raise ChildLost(f"the child process ended without a result (status {status})")
        outcome, value = pickle.loads(data)
        if outcome == "raised":
            raise value
        return value

    def cancel(self) -> None:
        if self.pid is not None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self._pipe.close()
        self._reap()

    def _reap(self) -> int | None:
        pid, self.pid = self.pid, None
        if pid is None:
            return None
        _, status = os.waitpid(pid, 0)
        return status


def _restore(held) -> None:
    if held is not None:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def _child(function: Callable[[], Any], write_fd: int, held=None) -> None:  # pragma: no cover - child process
    try:
        try:
            _restore(held)  # a Ctrl-C held back since the fork is raised here, and handed to the parent
            outcome = ("ok", function())
        except BaseException as exc:  # noqa: BLE001 - handed to the parent, which raises it there
            outcome = ("raised", exc)
        try:
            data = pickle.dumps(outcome, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:  # noqa: BLE001 - what does not pickle still reaches the parent, as text
            text = ("".join(traceback.format_exception(outcome[1])) if outcome[0] == "raised"
                    else f"the result cannot be pickled: {exc}")
            data = pickle.dumps(("raised", RuntimeError(text)))
        with os.fdopen(write_fd, "wb") as pipe:
            pipe.write(data)
    finally:
        os._exit(0)  # never the parent's atexit handlers, finally blocks or buffered output
