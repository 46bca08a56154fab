"""The one launcher of the tool's child processes, and the one way the tool waits and stops.

Every child the tool starts goes through here, behind one protocol: a *fork* (`Forked`: the checks beside the
seal, a function run in a copy of this process, its pickled result back through a pipe), a *spawn* (a new
interpreter, `Launcher.spawn`: the zygote itself, and reload children with --isolation spawn) or a child of
the *fork server* (the reload zygote, reload/zygote_client.ForkedChild: it forks, reaps and reports for us).
Whatever started it, `Launcher.wait(child, timeout, memory_limit)` waits for it the same way and says how it
ended in one `Exit` (exit code, timed out, interrupted, over its memory limit, resource usage).

One of each:
- the wait loop (`wait_until`): bounded waits, so that a Ctrl-C or SIGTERM the kernel hands to another thread
  runs its handler when the main thread wakes, checking the stop event, a deadline and the caller's own limit;
- the stop event (`Launcher.stop`): set once the run is stopping; every waiter and every new start checks it;
- the termination handler (`termination_unwinds`): SIGTERM and SIGHUP unwind like Ctrl-C (`Terminated`), so
  `finally` blocks end children, remove partial archives and private folders (the reloads and the seal alike);
- the fork-order check (`refuse_fork_after_threads`): a fork while the tool's own threads run is refused, by
  code, not by the order of lines in a workflow.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import pickle
import select
import signal
import subprocess
import threading
import time
import traceback
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from .environment import Environment

# How often a main thread that waits (for a child, a thread, futures) wakes: a Ctrl-C or SIGTERM the kernel hands
# to another thread runs its Python handler only when the main thread wakes.
SIGNAL_POLL_SECONDS = 0.2
CHILD_POLL_SECONDS = 0.05  # the longest pause between two looks at a reload child: its exit, its memory

INTERRUPTS = {signal.SIGINT, signal.SIGTERM}
TERMINATIONS = (signal.SIGTERM, signal.SIGHUP)
_MASKABLE = hasattr(signal, "pthread_sigmask")

# What wait_until returns when it did not see the wait end.
STOPPED, TIMED_OUT = "stopped", "timed out"


# ---- the termination handler ------------------------------------------------------------------------------
class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP: unwinds like Ctrl-C, so children are ended and partial files removed."""


@contextmanager
def termination_unwinds():
    """SIGTERM/SIGHUP raise Terminated in the main thread while this block runs (the reloads, the seal, the
    audit's extraction); elsewhere, and off the main thread, it changes nothing, and a signal ignored when the
    block begins (nohup) stays ignored. Nested blocks restore what they found."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, _frame):
        raise Terminated(f"signal {signum}")

    # A signal the user ignores stays ignored: under nohup a hangup must not end the seal.
    previous = {sig: signal.signal(sig, handler) for sig in TERMINATIONS
                if signal.getsignal(sig) is not signal.SIG_IGN}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


# ---- the wait loop ----------------------------------------------------------------------------------------
def wait_until(ready: Callable[[float], bool], *, timeout: float | None = None,
               stop: threading.Event | None = None, pause: float = SIGNAL_POLL_SECONDS,
               first_pause: float | None = None, limit: Callable[[], Any] | None = None) -> Any:
    """Call `ready(pause)` (it may block up to `pause` seconds) until it says True: then True. Between calls:
    STOPPED once `stop` is set, TIMED_OUT once `timeout` seconds passed, or what `limit()` returns when truthy
    (the caller's own bound, e.g. a child's memory). `first_pause`: start there and double up to `pause`."""
    deadline = None if timeout is None else time.monotonic() + timeout
    wait = pause if first_pause is None else first_pause
    while not ready(wait):
        if stop is not None and stop.is_set():
            return STOPPED
        if deadline is not None and time.monotonic() >= deadline:
            return TIMED_OUT
        if limit is not None:
            why = limit()
            if why:
                return why
        wait = min(wait * 2, pause)
    return True


def join_thread(thread: threading.Thread, stop: threading.Event | None = None) -> bool:
    """Wait for `thread` in bounded waits (a signal's handler runs meanwhile); False if `stop` was set first."""
    return wait_until(lambda wait: (thread.join(wait), not thread.is_alive())[1], stop=stop) is True


# ---- fork order -------------------------------------------------------------------------------------------
# The tool's own worker threads, by the names they are started with (the seal's pass, the archive's readers,
# writers and compressors, the push's follower, parts and sidecars, its ranged read-back). A child forked while
# one of them runs inherits whatever lock it held at that instant (an allocator's, a compressor's, a file
# object's) and may wait on it forever.
TOOL_THREADS = ("seal", "archive-", "push-", "range-read")


class ForkAfterThreads(OSError):
    """A fork was asked for while the tool's own threads run. An OSError, so every caller's "no fork now" path
    runs the work in this process instead; the order (fork first, then start threads) is checked here, by code,
    not left to the order of lines in a workflow."""


def can_fork() -> bool:
    return hasattr(os, "fork")


def tool_threads_running() -> list[str]:
    return sorted(t.name for t in threading.enumerate() if t.is_alive() and t.name.startswith(TOOL_THREADS))


def refuse_fork_after_threads() -> None:
    """Raise ForkAfterThreads while any of the tool's own threads runs: every fork of this process asks first."""
    running = tool_threads_running()
    if running:
        raise ForkAfterThreads(f"fork refused: the tool's threads {', '.join(running)} are running (fork "
                               "before starting them)")


# ---- a function in a forked child -------------------------------------------------------------------------
class ChildLost(Exception):
    """The child ended without handing back a result (killed, out of memory)."""


class ChildFailed(Exception):
    """A raw child's function raised: the exception's type and message, as text."""


RAW_OK, RAW_ERROR, RAW_ERROR_MAX = b"\x00", b"\x01", 4096


class Forked:
    """Starts `function()` in a forked child at once; result() waits for it and returns its value, or raises
    what it raised (ChildLost when it died silently). cancel() kills it; both are safe to call more than once.
    Refused (ForkAfterThreads) while the tool's own threads run.

    `raw`: `function` returns bytes, sent back as they are, and an exception as its text (ChildFailed): no
    pickle crosses back from a child that read hostile input (an archive of a batch, flows/batch_local.py).

    Why a fork: the checks are pure Python; a thread would wait for the interpreter lock, a second process does
    not. A forked child starts in milliseconds with the parent's parsed state (no re-import, nothing to pickle
    on the way in); only the result crosses a pipe. Where fork is missing (Windows), `can_fork()` is false and
    callers run the work in-process."""

    def __init__(self, function: Callable[[], Any], *, raw: bool = False):
        refuse_fork_after_threads()
        self.raw = raw
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
            global _result_fd
            if _result_fd is not None:
                # Forked from a Forked child: its parent's pipe is not this child's to hold open (the end of
                # file the top process waits for would come only when this child ends too).
                with contextlib.suppress(OSError):
                    os.close(_result_fd)
            _result_fd = write_fd
            _child(function, write_fd, held, raw)  # it lets the signals through inside its own try
        _restore(held)
        os.close(write_fd)
        self.pid: int | None = pid
        self._pipe = os.fdopen(read_fd, "rb")

    def result(self) -> Any:
        try:
            wait_until(lambda wait: bool(select.select([self._pipe], [], [], wait)[0]))
            data = self._pipe.read()  # until the child closes its end: it has finished or died
        except BaseException:  # interrupted (Ctrl-C, SIGTERM): the child goes too, not waited for
            self.cancel()
            raise
        self._pipe.close()
        status = self._reap()
        return self.outcome(data, status)

    def outcome(self, data: bytes, status: int | None) -> Any:
        """What the child handed back in `data` (all it wrote), once it ended with `status`."""
        if not data:
            raise ChildLost(f"the child process ended without a result (status {status})")
        if self.raw:  # no pickle from a child that read hostile input: its bytes, or its error in words
            if data[:1] == RAW_OK:
                return data[1:]
            raise ChildFailed(data[1:RAW_ERROR_MAX].decode("utf-8", "replace"))
        outcome, value = pickle.loads(data)
        if outcome == "raised":
            raise value
        return value

    def fileno(self) -> int:
        """The pipe the result arrives on, for a parent that waits on many children (select)."""
        return self._pipe.fileno()

    def ended(self) -> int | None:
        """After its pipe reached its end: reap the child; its wait status (None when reaped already)."""
        self._pipe.close()
        return self._reap()

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


PR_SET_PDEATHSIG = 1  # prctl(2), Linux


def die_with_parent(parent: int) -> None:
    """In a forked child: SIGKILL when the thread that forked it ends (Linux), and an end at once when the parent is
    gone already (it died before the prctl took effect). Only for a child whose forking thread waits for it."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the parent's own cancel() is all there is
        pass
    if os.getppid() != parent:
        os._exit(1)


_result_fd: int | None = None  # in a Forked child: the write end of its own result pipe


def _child(function: Callable[[], Any], write_fd: int, held=None, raw: bool = False) -> None:  # pragma: no cover
    try:
        try:
            _restore(held)  # a Ctrl-C held back since the fork is raised here, and handed to the parent
            outcome = ("ok", function())
        except BaseException as exc:  # noqa: BLE001 - handed to the parent, which raises it there
            outcome = ("raised", exc)
        if raw:
            data = (RAW_OK + bytes(outcome[1]) if outcome[0] == "ok" else
                    RAW_ERROR + f"{type(outcome[1]).__name__}: {outcome[1]}".encode("utf-8", "replace"))
            with os.fdopen(write_fd, "wb") as pipe:
                pipe.write(data)
            return
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


# ---- memory facts of a process ----------------------------------------------------------------------------
def status_bytes(field: str, pid: int | str = "self") -> int | None:
    """A memory field of /proc/PID/status (VmRSS, VmHWM, VmData) in bytes; None off Linux or once it is gone."""
    key = field.encode() + b":"
    try:
        with open(f"/proc/{pid}/status", "rb") as handle:
            for line in handle:
                if line.startswith(key):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def resident_bytes(pid: int) -> int | None:
    """The process's resident memory now."""
    return status_bytes("VmRSS", pid)


def _over(pid: int, memory_limit: int | None) -> bool:
    if not memory_limit:
        return False
    used = resident_bytes(pid)
    return used is not None and used > memory_limit


# ---- spawned and fork-served children ---------------------------------------------------------------------
@dataclass
class Exit:
    code: int | None = None
    timed_out: bool = False
    interrupted: bool = False
    over_limit: bool = False  # killed by the watcher: its resident memory passed its limit
    usage: Any = None  # resource usage of the child alone (os.wait4), when known


class Child(Protocol):
    """What the launcher waits for: a spawned child (a Popen, adapted below) or a child of the fork server
    (reload/zygote_client.ForkedChild)."""

    pid: int
    returncode: int | None
    FIRST_PAUSE: float
    PAUSE: float

    def exited(self, wait: float) -> bool:
        """True once it ended (never reaped here); may block up to `wait` seconds."""

    def settle(self, result: Exit, launcher: "Launcher") -> None:
        """End it if it still runs, sweep its process group, reap it; fill result.code and result.usage."""


def _sweep_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def kill_tree(pid: int) -> None:
    """SIGKILL a process and everything below it, the children it started in their own sessions included (a
    proof's reload child: killing the proof alone would orphan it, and a hung reload would keep its memory).
    Each process is frozen (SIGSTOP) before its children are listed, so nothing starts another one unseen."""
    tree, frontier = [], [pid]
    while frontier:
        for member in frontier:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(member, signal.SIGSTOP)
        tree += frontier
        below = _children_by_parent()
        frontier = [child for member in frontier for child in below.get(member, ()) if child not in tree]
    for member in tree:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(member, signal.SIGKILL)
        if member != pid:
            _sweep_group(member)  # a child that leads its own group: what it forked there goes too


def _children_by_parent() -> dict[int, list[int]]:
    """Every live process's children, from /proc (Linux); empty elsewhere (the process alone is killed)."""
    children: dict[int, list[int]] = {}
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as fh:
                    stat = fh.read()
            except OSError:  # gone meanwhile
                continue
            fields = stat[stat.rindex(b")") + 2:].split()  # after the name, which may hold spaces
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    return children


class _Spawned:
    """A Popen behind the Child protocol: exited without reaping (WNOWAIT: the child stays a zombie, so its
    pid and group id cannot be reused while its memory is read and its group swept)."""

    FIRST_PAUSE, PAUSE = 0.01, CHILD_POLL_SECONDS

    def __init__(self, proc: subprocess.Popen):
        self.proc, self.pid = proc, proc.pid

    @property
    def returncode(self):
        return self.proc.returncode

    def exited(self, wait: float) -> bool:
        if hasattr(os, "waitid"):
            done = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
        else:  # macOS: reaped at once; the sweep then races pid reuse by microseconds
            done = self.proc.poll() is not None
        if not done:
            time.sleep(wait)
        return done

    def settle(self, result: Exit, launcher: "Launcher") -> None:
        with launcher._lock:
            _sweep_group(self.pid)  # a timeout's victim, or whatever the child left running
            launcher._live.discard(self.pid)
        if self.proc.returncode is None:
            _, status, result.usage = os.wait4(self.pid, 0)
            self.proc.returncode = os.waitstatus_to_exitcode(status)
        result.code = self.proc.returncode


class Launcher:
    """The live children of one run, its stop event and its environment (read once at the entry point: the
    children start with it); `stop_all` ends them, whichever thread waits for them. `fork_refused`: why the fork
    server could not be used, when it could not."""

    def __init__(self, environment: Environment, stop: threading.Event | None = None) -> None:
        self._lock = threading.Lock()
        self._live: set[int] = set()
        self.stop = stop if stop is not None else threading.Event()
        self.environment = environment
        self.fork_refused = ""

    def adopt(self, pid: int) -> bool:
        """Count a child the fork server forked as live (stop_all sweeps its group); False once stopping."""
        with self._lock:
            if self.stop.is_set():
                return False
            self._live.add(pid)
        return True

    def discard(self, pid: int) -> None:
        with self._lock:
            self._live.discard(pid)

    def spawn(self, command: list[str], **popen_options) -> subprocess.Popen | None:
        """A new interpreter (or any program) in its own session (Ctrl-C in the terminal reaches the tool, which
        ends the child); None once the run is stopping."""
        with self._lock:
            if self.stop.is_set():
                return None
            popen_options.setdefault("stdin", subprocess.DEVNULL)
            proc = subprocess.Popen(command, start_new_session=True, **popen_options)
            self._live.add(proc.pid)
        return proc

    def wait(self, child, timeout: float, memory_limit: int | None = None) -> Exit:
        """Wait until the child exits, the timeout passes, its memory passes `memory_limit` (bytes) or the run
        stops; then end it, sweep its group and reap it."""
        handle: Child = _Spawned(child) if isinstance(child, subprocess.Popen) else child
        result = Exit()
        why = wait_until(handle.exited, timeout=timeout, stop=self.stop, pause=handle.PAUSE,
                         first_pause=handle.FIRST_PAUSE,
                         limit=lambda: "over limit" if _over(handle.pid, memory_limit) else None)
        result.interrupted, result.timed_out, result.over_limit = (why == STOPPED, why == TIMED_OUT,
                                                                  why == "over limit")
        handle.settle(result, self)
        return result

    def stop_all(self) -> None:
        with self._lock:
            self.stop.set()
            for pid in self._live:
                _sweep_group(pid)
