"""Reload children as operating-system processes: each in its own session, waited for with a timeout, its whole
process group swept when it ends, and every live one ended at once when the tool is interrupted. A child is
either spawned (a new interpreter) or forked by the zygote (zygote.py; zygote_client.py talks to it). While it is
waited for, its resident memory is read at every poll and the child killed past its limit (limits.py)."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from .limits import resident_bytes

POLL_SECONDS = 0.05  # the longest pause between two looks at a child: its exit, its memory


@dataclass
class Exit:
    code: int | None = None
    timed_out: bool = False
    interrupted: bool = False
    over_limit: bool = False  # killed by the watcher: its resident memory passed its limit
    usage: Any = None  # resource usage of the child alone (os.wait4), when known


def _sweep_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _exited(proc: subprocess.Popen) -> bool:
    if hasattr(os, "waitid"):  # WNOWAIT: the child stays a zombie, so its group id cannot be reused yet
        return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    return proc.poll() is not None  # macOS: reaped at once; the sweep then races pid reuse by microseconds


class ChildProcesses:
    """The live reload children of one run; `stop_all` ends them, whichever thread waits for them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._live: set[int] = set()
        self.stopping = threading.Event()
        self.fork_refused = ""  # why the zygote could not be used, when it could not

    def adopt(self, pid: int) -> bool:
        """Count a child the zygote forked as live (stop_all sweeps its group); False once the run is stopping."""
        with self._lock:
            if self.stopping.is_set():
                return False
            self._live.add(pid)
        return True

    def spawn(self, command: list[str], **popen_options) -> subprocess.Popen | None:
        """A child in its own session (Ctrl-C in the terminal reaches the tool, which ends the child); None
        once the run is stopping."""
        with self._lock:
            if self.stopping.is_set():
                return None
            popen_options.setdefault("stdin", subprocess.DEVNULL)
            proc = subprocess.Popen(command, start_new_session=True, **popen_options)
            self._live.add(proc.pid)
        return proc

    def wait(self, proc, timeout: float, memory_limit: int | None = None) -> Exit:
        """Wait until the child exits, the timeout passes, its memory passes `memory_limit` (bytes) or the run
        stops; then sweep its group and reap it."""
        if hasattr(proc, "ended"):  # a ForkedChild (zygote_client.py)
            return self._wait_forked(proc, timeout, memory_limit)
        deadline, pause, result = time.monotonic() + timeout, 0.01, Exit()
        while not _exited(proc):  # not reaped yet: its pid cannot be another process's when its memory is read
            if self.stopping.is_set():
                result.interrupted = True
                break
            if time.monotonic() >= deadline:
                result.timed_out = True
                break
            if _over(proc.pid, memory_limit):
                result.over_limit = True
                break
            time.sleep(pause)
            pause = min(pause * 2, POLL_SECONDS)
        with self._lock:
            _sweep_group(proc.pid)  # a timeout's victim, or whatever the child left running
            self._live.discard(proc.pid)
        if proc.returncode is None:
            _, status, result.usage = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)
        result.code = proc.returncode
        return result

    def _wait_forked(self, proc, timeout: float, memory_limit: int | None = None) -> Exit:
        """The same for a child of the zygote, which reaps it: the zygote sweeps its group before it reaps (no pid
        reuse race) and reports the exit status and peak memory. A pid read after the child ended may be
        another process's: only the zygote's kill, which knows its own children, acts on what is read."""
        deadline, result = time.monotonic() + timeout, Exit()
        while proc.ended(wait=0.02) is None:  # wakes as soon as the zygote reports
            if self.stopping.is_set():
                result.interrupted = True
                break
            if time.monotonic() >= deadline:
                result.timed_out = True
                break
            if _over(proc.pid, memory_limit):
                result.over_limit = True
                break
        if proc.ended() is None:
            proc.kill()
        elif result.over_limit:
            result.over_limit = False  # it had ended on its own: the memory read may be another process's
        end = proc.ended(grace=10.0)
        with self._lock:
            self._live.discard(proc.pid)
        if end is not None:
            result.code = end.get("exit")
            if isinstance(end.get("maxrss_kib"), int):
                result.usage = SimpleNamespace(ru_maxrss=end["maxrss_kib"])
        proc.returncode = result.code
        return result

    def stop_all(self) -> None:
        with self._lock:
            self.stopping.set()
            for pid in self._live:
                _sweep_group(pid)


def _over(pid: int, memory_limit: int | None) -> bool:
    if not memory_limit:
        return False
    used = resident_bytes(pid)
    return used is not None and used > memory_limit


@contextlib.contextmanager
def sigterm_interrupts():
    """While reloads run, SIGTERM interrupts like Ctrl-C, so the children are ended, not orphaned."""
    def interrupt(_signum, _frame):
        raise KeyboardInterrupt

    installed = False
    if threading.current_thread() is threading.main_thread() \
            and signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
        signal.signal(signal.SIGTERM, interrupt)
        installed = True
    try:
        yield
    finally:
        if installed:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)

