"""The runner's side of the zygote (zygote.py): start it once per run, fork reload children through it, read
what it reports. A ForkedChild stands for one such child where the runner would hold a Popen."""
from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from types import SimpleNamespace

from ..runtime.launcher import TIMED_OUT, Exit, Launcher, wait_until
from .confine import scratch_variables
from .preloads import BASE, Preloads, imports_for
from .zygote import IMPORT, WITHOUT

ZYGOTE_START_SECONDS = 300.0  # importing the libraries; far longer means a broken environment: spawn instead
# A fork is answered in milliseconds (the zygote reads requests between reaps); one not answered in this long
# means a zygote that is stopped or stuck: it is given up, and the run's children are spawned from then on.
FORK_ANSWER_SECONDS = 60.0


def _log_tail(log: Path, lines: int = 3) -> str:
    try:
        kept = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    return " | ".join(kept[-lines:])


class ForkedChild:
    """A reload child forked by the zygote: its pid, and its end as the zygote reports it. The launcher's Child
    protocol (runtime/launcher.py): the zygote reaps it, sweeping its group before it reaps (no pid reuse race),
    and reports the exit status and peak memory."""

    FIRST_PAUSE = PAUSE = 0.02  # a wait on the socket: wakes as soon as the zygote reports

    def __init__(self, client: ZygoteClient, job_id: int, pid: int):
        self.client, self.job_id, self.pid, self.returncode = client, job_id, pid, None
        self.stdin = None

    def ended(self, grace: float = 0.0, wait: float = 0.0) -> dict | None:
        """The zygote's report of this child's exit, waiting up to `grace` seconds (or `wait` on the socket
        once); a dead zygote takes its children with it (PR_SET_PDEATHSIG): that is an end without a status."""
        found: list[dict] = []

        def reported(pause: float) -> bool:
            end = self.client.message(self.job_id, "exit", wait=pause)
            if end is None and self.client.dead:
                end = {"exit": None}
            if end is not None:
                found.append(end)
            return end is not None

        if not reported(wait) and grace > 0:
            wait_until(reported, timeout=grace, pause=0.01)
        return found[0] if found else None

    def exited(self, wait: float) -> bool:
        return self.ended(wait=wait) is not None

    def settle(self, result: Exit, launcher: Launcher) -> None:
        # A pid read after the child ended may be another process's: only the zygote's kill, which knows its own
        # children, acts on what is read.
        if self.ended() is None:
            self.kill()
        elif result.over_limit:
            result.over_limit = False  # it had ended on its own: the memory read may be another process's
        end = self.ended(grace=10.0)
        launcher.discard(self.pid)
        if end is not None:
            result.code = end.get("exit")
            if isinstance(end.get("maxrss_kib"), int):
                result.usage = SimpleNamespace(ru_maxrss=end["maxrss_kib"])
        self.returncode = result.code

    def kill(self) -> None:
        self.client.send({"op": "kill", "id": self.job_id})


def title_room() -> int:
    """Room in a zygote's command line for a child's title: `-m itera_verify.reload.child JOB RESULT` (zygote.py)."""
    return 2 * len(tempfile.gettempdir()) + 256


def flags(preloads: Preloads) -> list[str]:
    """The zygote's command line after ROOM: what it imports, keeps out, and the architectures (zygote.py)."""
    return [IMPORT + ",".join(preloads.imports), WITHOUT + ",".join(preloads.without), *preloads.model_types]


class ZygoteClient:
    """The runner's end of the zygote: start it, fork children through it, read what it reports.

    Any thread may call it; one lock guards the socket and the messages read so far."""

    def __init__(self, children: Launcher, env: dict, cwd: str, log, room: int, preloads: Preloads, *,
                 connected: socket.socket | None = None):
        """The zygote spawned for this run, or (`connected`) a session of a shared server (shared.py): then `proc`
        is None, and the session ends when this end closes."""
        self.dead, self.next_id, self.children, self.shared = False, 0, children, connected is not None
        self._lock, self._buffer, self._messages = threading.Lock(), b"", {}
        if connected is not None:
            self.sock, self.proc = connected, None
            return
        ours, theirs = socket.socketpair()
        self.sock = ours
        try:
            self.proc = children.spawn([sys.executable, "-m", "itera_verify.reload.zygote", str(theirs.fileno()),
                                        "." * room, *flags(preloads)], pass_fds=(theirs.fileno(),),
                                       env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT)
        finally:
            theirs.close()
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
        """The zygote's report once its imports are done; None if it died, took longer than `timeout` or the run
        is stopping."""
        found = wait_until(lambda wait: self.dead or self.message(None, "ready", wait=wait) is not None,
                           timeout=timeout, stop=self.children.stop)
        return self.message(None, "ready") if found is True else None

    def fork(self, request: dict) -> ForkedChild | str:
        """A child running `request` (see zygote.py), or why none could start."""
        if self.dead:
            return "the zygote is gone"
        with self._lock:
            self.next_id += 1
            job_id = self.next_id
        self.send(dict(request, op="fork", id=job_id))
        answered = wait_until(lambda wait: self.message(job_id, "pid", wait=wait) is not None
                              or self.message(job_id, "error") is not None or self.dead,
                              timeout=FORK_ANSWER_SECONDS, stop=self.children.stop, pause=0.05)
        started = self.message(job_id, "pid")
        if started is None and answered == TIMED_OUT:
            self.dead = True  # never asked again: the next children are spawned, and no run keeps it warm
            return f"the zygote did not answer a fork in {FORK_ANSWER_SECONDS:.0f} s"
        if started is not None:
            child = ForkedChild(self, job_id, started["pid"])
            if not self.children.adopt(child.pid):
                child.kill()
            return child
        failed = self.message(job_id, "error")
        if failed is not None:
            return failed["error"]
        return "the zygote is gone" if answered is True else "interrupted"

    def close(self, grace: float = 5.0) -> None:
        """End the zygote: end of file on its socket ends it and any child it still has (one still importing
        reads nothing: grace 0 kills it at once)."""
        with self._lock:
            self.dead = True
            with contextlib.suppress(OSError):
                self.sock.close()
        if self.proc is not None and self.proc.returncode is None:
            self.children.wait(self.proc, grace)


class Zygote:
    """The zygote of one run (or of several, kept warm: warm.py) and its folder; `client` is None when children must
    be spawned (and `why` says so). `preloads` (preloads.py) says what it imports; without it, `light` and
    `model_types` do: torch alone, or the modelling libraries too. `folder`: where its own folder is made."""

    def __init__(self, children: Launcher, env: dict, model_types=(), light: bool = False, *,
                 preloads: Preloads | None = None, folder: str | None = None, shared: str | None = None):
        if preloads is None:
            preloads = Preloads(BASE if light else imports_for(["peft"]), (), tuple(model_types))
        self.preloads, self.env = preloads, env
        self.warm_key: tuple | None = None  # set when it is kept warm across runs (warm.py)
        # Its own folder (log, caches), made only where it starts its own: a session of a shared server has none
        # to leave behind when the run is killed.
        self.work: Path | None = None
        self._folder = folder
        self.light = preloads.light
        self.client, self.why, self.seconds = None, "", None
        self.children = children
        connected = shared_zygote(shared, env, preloads, title_room()) if shared else None
        if connected is not None:
            self._starting = ZygoteClient(children, env, "", None, title_room(), preloads, connected=connected)
            return
        self._start_own(env, preloads)

    def _start_own(self, env: dict, preloads: Preloads) -> None:
        # Its caches in its own folder (huggingface_hub reads HF_HOME once, at import: the children keep it).
        if self.work is None:
            self.work = Path(tempfile.mkdtemp(prefix="itera-zygote-", dir=self._folder))
        env = {**env, **scratch_variables(self.work, env.get("HF_HUB_CACHE")), "TMPDIR": str(self.work)}
        with open(self.work / "zygote.log", "wb") as log_handle:
            self._starting = ZygoteClient(self.children, env, str(self.work), log_handle, title_room(), preloads)

    def wait_ready(self) -> None:
        """Wait for its imports; then `client` is set, or `why` says why it cannot be forked from."""
        client, self._starting = self._starting, None
        if client is None:
            return
        children = self.children
        try:
            ready = client.ready(ZYGOTE_START_SECONDS)
        except BaseException:  # Ctrl-C while it imports: it goes, and its folder with it
            client.close(grace=0)
            self._remove_work()
            raise
        if ready is None and client.shared and not children.stop.is_set():
            client.close()  # the shared server did not answer: this run imports its own
            self._start_own(self.env, self.preloads)
            return self.wait_ready()
        if ready is None:
            self.why = "the zygote did not start" + (f": {_log_tail(self.work / 'zygote.log')}" if
                                                    self.work and not children.stop.is_set() else "")
        elif ready.get("threads") != 1:
            self.why = f"the zygote has {ready.get('threads')} threads after its imports: fork is not safe"
        elif ready.get("cuda_initialised"):
            self.why = "the zygote initialised CUDA: fork is not safe"
        else:
            self.client, self.seconds = client, ready.get("seconds")
        if self.client is None:
            client.close()

    def close(self) -> None:
        """Safe to repeat; a zygote still importing is killed, not waited for."""
        if self._starting is not None:
            self._starting.close(grace=0)
            self._starting = None
        if self.client is not None:
            self.client.close()
        self._remove_work()

    def _remove_work(self) -> None:
        if self.work is not None:
            shutil.rmtree(self.work, ignore_errors=True)


def shared_zygote(folder: str, env: dict, preloads: Preloads, room: int) -> socket.socket | None:
    """A session of the shared server of this run's key (shared.py), else None: the run starts its own. A folder
    that is not private is the user's mistake, said at once (exit 2), not a slower run."""
    from .shared import UnsafeFolder, connect

    try:
        return connect(folder, env, preloads, flags(preloads), room)
    except UnsafeFolder as exc:
        from ..model import UsageError

        raise UsageError(str(exc)) from None
    except (OSError, subprocess.SubprocessError):  # no server could start or answer: the run imports its own
        return None


def can_fork(isolation: str) -> bool:
    # macOS: fork after the Objective-C runtime started is not safe (and CUDA is absent there).
    return isolation != "spawn" and hasattr(os, "fork") and sys.platform != "darwin"
