"""Reload children as operating-system processes: each in its own session, waited for with a timeout, its whole
process group swept when it ends, and every live one ended at once when the tool is interrupted. A child is
either spawned (a new interpreter) or forked by the zygote (zygote.py; ZygoteClient below talks to it)."""
from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any


@dataclass
class Exit:
    code: int | None = None
    timed_out: bool = False
    interrupted: bool = False
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

    def wait(self, proc, timeout: float) -> Exit:
        """Wait until the child exits, the timeout passes or the run stops; then sweep its group and reap it."""
        if isinstance(proc, ForkedChild):
            return self._wait_forked(proc, timeout)
        deadline, pause, result = time.monotonic() + timeout, 0.01, Exit()
        while not _exited(proc):
            if self.stopping.is_set():
                result.interrupted = True
                break
            if time.monotonic() >= deadline:
                result.timed_out = True
                break
            time.sleep(pause)
            pause = min(pause * 2, 0.2)
        with self._lock:
            _sweep_group(proc.pid)  # a timeout's victim, or whatever the child left running
            self._live.discard(proc.pid)
        if proc.returncode is None:
            _, status, result.usage = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)
        result.code = proc.returncode
        return result

    def _wait_forked(self, proc: "ForkedChild", timeout: float) -> Exit:
        """The same for a child of the zygote, which reaps it: the zygote sweeps its group before it reaps (no pid
        reuse race) and reports the exit status and peak memory."""
        deadline, pause, result = time.monotonic() + timeout, 0.01, Exit()
        while proc.ended() is None:
            if self.stopping.is_set():
                result.interrupted = True
                break
            if time.monotonic() >= deadline:
                result.timed_out = True
                break
            time.sleep(pause)
            pause = min(pause * 2, 0.2)
        if proc.ended() is None:
            proc.kill()
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


class ForkedChild:
    """A reload child forked by the zygote: its pid, and its end as the zygote reports it."""

    def __init__(self, client: "ZygoteClient", job_id: int, pid: int):
        self.client, self.job_id, self.pid, self.returncode = client, job_id, pid, None
        self.stdin = None

    def ended(self, grace: float = 0.0) -> dict | None:
        """The zygote's report of this child's exit, waiting up to `grace` seconds; a dead zygote takes its
        children with it (PR_SET_PDEATHSIG): that is an end without a status."""
        deadline = time.monotonic() + grace
        while True:
            end = self.client.message(self.job_id, "exit")
            if end is not None:
                return end
            if self.client.dead:
                return {"exit": None}
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.01)

    def kill(self) -> None:
        self.client.send({"op": "kill", "id": self.job_id})


class ZygoteClient:
    """The runner's end of the zygote: start it, fork children through it, read what it reports.

    Any thread may call it; one lock guards the socket and the messages read so far."""

    def __init__(self, children: ChildProcesses, env: dict, cwd: str, log, room: int):
        ours, theirs = socket.socketpair()
        self.sock, self.dead, self.next_id = ours, False, 0
        self._lock, self._buffer, self._messages = threading.Lock(), b"", {}
        try:
            self.proc = children.spawn([sys.executable, "-m", "itera_verify.reload.zygote", str(theirs.fileno()),
                                        "." * room], pass_fds=(theirs.fileno(),), env=env, cwd=cwd,
                                       stdout=log, stderr=subprocess.STDOUT)
        finally:
            theirs.close()
        self.children = children
        if self.proc is None:
            self.dead = True

    def _pump(self, wait: float) -> None:
        if self.dead:
            return
        ready, _, _ = select.select([self.sock], [], [], wait)
        if not ready:
            return
        try:
            data = self.sock.recv(1 << 16)
        except OSError:
            data = b""
        if not data:
            self.dead = True
            return
        self._buffer += data
        while b"\n" in self._buffer:
            line, self._buffer = self._buffer.split(b"\n", 1)
            message = json.loads(line)
            kind = next(k for k in ("ready", "exit", "pid", "error") if k in message)
            self._messages[(message.get("id"), kind)] = message

    def message(self, job_id, kind: str, wait: float = 0.0) -> dict | None:
        with self._lock:
            self._pump(wait)
            return self._messages.get((job_id, kind))

    def send(self, message: dict) -> None:
        with self._lock:
            try:
                self.sock.sendall(json.dumps(message).encode() + b"\n")
            except OSError:
                self.dead = True

    def ready(self, timeout: float) -> dict | None:
        """The zygote's report once its imports are done; None if it died or took longer than `timeout`."""
        deadline = time.monotonic() + timeout
        while not self.dead and time.monotonic() < deadline:
            if self.children.stopping.is_set():
                return None
            found = self.message(None, "ready", wait=0.2)
            if found is not None:
                return found
        return None

    def fork(self, request: dict) -> ForkedChild | str:
        """A child running `request` (see zygote.py), or why none could start."""
        with self._lock:
            self.next_id += 1
            job_id = self.next_id
        self.send(dict(request, op="fork", id=job_id))
        while True:
            started = self.message(job_id, "pid", wait=0.05)
            if started is not None:
                child = ForkedChild(self, job_id, started["pid"])
                if not self.children.adopt(child.pid):
                    child.kill()
                return child
            failed = self.message(job_id, "error")
            if failed is not None:
                return failed["error"]
            if self.dead:
                return "the zygote is gone"
            if self.children.stopping.is_set():
                return "interrupted"

    def close(self) -> None:
        """End the zygote: end of file on its socket ends it and any child it still has."""
        with self._lock:
            self.dead = True
            with contextlib.suppress(OSError):
                self.sock.close()
        if self.proc is not None:
            self.children.wait(self.proc, 5.0)
