"""The zygote: `python -m itera_verify.reload.zygote FD ROOM [--import=M,...] [--without=M,...] [MODEL_TYPE...]`, one
preloaded parent that forks every reload child. It imports what the run's loaders need and keeps out what none of
them does (preloads.py).

Why: a fresh interpreter spends 5-18 s importing torch, transformers and peft; the reloads themselves take well
under a second for most artifacts. The zygote pays that once per run, then forks one new process per job. Each
forked child is as fresh as a spawned one where it matters: its own session (process group), its own memory (a
patched module, a tensor, an RNG state die with it), its own timeout and kill (the runner's), and it dies with
the zygote (PR_SET_PDEATHSIG). The zygote never opens an artifact, never initialises CUDA (the NVML check keeps
`torch.cuda.is_available()` from touching the driver) and forks only while it has a single thread: fork copies
one thread, so a lock another thread held would stay held in the child for ever.

Protocol, one JSON object per line over the socket FD:
  runner -> zygote  {"op": "fork", "id", "entry": "module:function", "argv", "work", "log", "env", "title"},
                    {"op": "kill", "id"} (a timeout)
  zygote -> runner  {"ready": true, "threads", "cuda_initialised", "seconds"} once, after the imports;
                    {"id", "pid"} when a child started, {"id", "error"} when it could not;
                    {"id", "exit", "maxrss_kib"} once the child ended (its group swept, then reaped).
End of file on the socket (the tool exited, or is stopping) ends every child and the zygote.

`python -m itera_verify.reload.zygote listen=PATH ROOM ...` is a zygote shared by many runs (shared.py): it forks
a session per connection, each the zygote of one run (after the run's hello: {"op": "hello", "token"}).
"""
from __future__ import annotations

import contextlib
import ctypes
import hmac
import importlib
import json
import os
import re
import secrets
import select
import signal
import socket
import struct
import sys
import tempfile
import time
from typing import NoReturn

from ..runtime.ending import end_child
from ..runtime.launcher import die_with_parent
from .preloads import BASE, imports_for, keep_out

# The command line's flags: what to import (preloads.py decides, per run), what to keep out.
IMPORT, WITHOUT = "--import=", "--without="
MODEL_TYPE = re.compile(r"[a-z][a-z0-9_]{0,63}")
REAP_POLL_SECONDS = 0.02
# A shared server's session (shared.py): the run's hello, a line with its token, within this long and this size.
HELLO_SECONDS, HELLO_BYTES = 10.0, 4096
LISTEN = "listen="  # instead of FD: a shared server (shared.py) listening on the socket at this path


def thread_count() -> int:
    """Native threads of this process (numpy's BLAS pool is one; Python's threading module sees none of them)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        import threading

        return threading.active_count()


def preload(model_types: list[str], light: bool = False, *, imports=None, without=()) -> dict:
    """Import what the children will use: `imports` (preloads.py; by default torch alone when `light`, else the
    modelling libraries too), never the libraries in `without`. `model_types`: transformers' names of the
    package's architectures (config.json `model_type`, read by the runner, never here), whose modelling modules
    transformers would otherwise import lazily in every child."""
    started = time.monotonic()
    keep_out(without)
    from .loaders import MODULES, loader_module

    for name in imports if imports is not None else (BASE if light else imports_for(["peft"])):
        try:
            importlib.import_module(name)
        except ImportError:
            pass  # a loader's optional library: its child names the extra that installs it
    for model_type in model_types:
        if MODEL_TYPE.fullmatch(model_type):
            try:
                importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
            except ImportError:
                pass  # not a model transformers knows: the child's from_pretrained says so
    if "transformers" in sys.modules:
        warm_caches(model_types)
    for loader in MODULES:  # helpers' loaders import their libraries lazily; the module itself is cheap
        try:
            loader_module(loader)
        except ImportError:
            pass  # a loader's optional library: its child reports the failure
    import torch

    from .confine import python_folders

    python_folders()  # what every child will allow itself to read, found once here (confine.py)
    return {"ready": True, "threads": thread_count(),
            "cuda_initialised": bool(torch.cuda.is_initialized()) or cuda_driver_loaded(),
            "seconds": round(time.monotonic() - started, 3)}


def warm_caches(model_types: list[str]) -> None:
    """Build once the tables every child's first from_pretrained builds alike: transformers' checkpoint
    conversion mapping (a thousand regular expressions, 0.3 s a child). A transformers without it: nothing."""
    try:
        from transformers import conversion_mapping

        conversion_mapping.get_checkpoint_conversion_mapping(model_types[0] if model_types else "llama")
    except Exception:  # noqa: BLE001 - an internal table of one transformers version: its absence costs time only
        pass


def cuda_driver_loaded() -> bool:
    """The CUDA driver library mapped into this process: something initialised it (cuInit), and a forked child
    could not use the GPU. torch's own flag misses a library that called the driver directly."""
    try:
        with open("/proc/self/maps", "rb") as handle:
            return b"/libcuda.so" in handle.read()
    except OSError:
        return False


def set_title(words: list[str]) -> None:
    """Rewrite this process's command line (/proc/PID/cmdline, ps) in place, as setproctitle does, so that a
    forked child shows the job it runs: `python -m itera_verify.reload.child JOB RESULT`. The zygote was started
    with ROOM spare bytes for this. Best effort: Linux only, silently skipped elsewhere."""
    try:
        with open("/proc/self/stat", "rb") as handle:
            fields = handle.read().rsplit(b")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end: fields 48 and 49 of stat(5)
        with open("/proc/self/cmdline", "rb") as handle:
            program = handle.read().split(b"\0", 1)[0]
    except (OSError, IndexError, ValueError):
        return
    text = b"\0".join([program, *(w.encode() for w in words)]) + b"\0"
    if end <= start or len(text) > end - start:
        return
    ctypes.memmove(start, text.ljust(end - start, b"\0"), end - start)


def follow_hub_cache() -> None:
    """huggingface_hub read HF_HUB_CACHE once, when the zygote imported it (the zygote's own empty cache): a
    forked child reads the hub cache its job names, as a spawned child does at its import. The loaders' readers
    of the default (huggingface_hub's downloads and lookups, transformers' cached_file) read the attribute when
    called; huggingface_hub's cache manager copies it at import, and the zygote never imports it."""
    constants = sys.modules.get("huggingface_hub.constants")
    if constants is not None and os.environ.get("HF_HUB_CACHE"):
        constants.HF_HUB_CACHE = os.environ["HF_HUB_CACHE"]


def _run_child(request: dict, parent: int) -> NoReturn:  # pragma: no cover - runs in the forked child
    end_child(lambda: _child(request, parent))


def _child(request: dict, parent: int) -> object:  # pragma: no cover - runs in the forked child
    os.setsid()  # its own session and process group: the runner's kill sweeps exactly it
    die_with_parent(parent)
    for number in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD, signal.SIGPIPE):
        signal.signal(number, signal.SIG_DFL)
    os.environ.update(request.get("env") or {})
    follow_hub_cache()
    work = request["work"]
    os.chdir(work)
    tempfile.tempdir = work  # third-party scratch files go to the reload's own folder
    log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.close(null)
    set_title(list(request.get("title") or ()))
    module, _, function = request["entry"].partition(":")
    return getattr(importlib.import_module(module), function)(list(request.get("argv") or ()))


class Zygote:
    def __init__(self, sock: socket.socket):
        self.sock, self.buffer, self.children = sock, b"", {}  # children: pid -> job id
        self.pid = os.getpid()

    def send(self, message: dict) -> None:
        try:
            self.sock.sendall(json.dumps(message).encode() + b"\n")
        except OSError:
            pass  # the runner is gone: the next read sees end of file

    def fork(self, request: dict) -> None:
        threads = thread_count()
        if threads != 1:
            self.send({"id": request.get("id"), "error": f"the zygote has {threads} threads: fork is not safe"})
            return
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            pid = os.fork()
        except OSError as exc:
            self.send({"id": request.get("id"), "error": f"fork failed: {exc}"})
            return
        if pid == 0:
            self.sock.close()
            _run_child(request, self.pid)
        self.children[pid] = request.get("id")
        self.send({"id": request.get("id"), "pid": pid})

    def reap(self) -> None:
        while self.children:
            try:
                # WNOWAIT: the child stays a zombie while its group is swept, so its group id cannot be reused.
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return
            if info is None:
                return
            pid = info.si_pid
            try:
                os.killpg(pid, signal.SIGKILL)  # whatever the child left running in its group
            except (ProcessLookupError, PermissionError):
                pass
            _, status, usage = os.wait4(pid, 0)
            job = self.children.pop(pid, None)
            self.send({"id": job, "exit": os.waitstatus_to_exitcode(status), "maxrss_kib": usage.ru_maxrss})

    def kill(self, job) -> None:
        """A timeout: end the child's whole group. Only the zygote reaps, so the pid cannot have been reused."""
        for pid, running in self.children.items():
            if running == job:
                try:
                    os.killpg(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    try:
                        os.kill(pid, signal.SIGKILL)  # forked a moment ago: not yet its own group leader
                    except ProcessLookupError:
                        pass

    def stop(self) -> None:
        for pid in list(self.children):
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for pid in list(self.children):
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass

    def serve(self) -> None:
        while True:
            ready, _, _ = select.select([self.sock], [], [], REAP_POLL_SECONDS if self.children else 1.0)
            if ready:
                data = self.sock.recv(1 << 16)
                if not data:
                    return
                self.buffer += data
                while b"\n" in self.buffer:
                    line, self.buffer = self.buffer.split(b"\n", 1)
                    request = json.loads(line)
                    if request.get("op") == "fork":
                        self.fork(request)
                    elif request.get("op") == "kill":
                        self.kill(request.get("id"))
                    elif request.get("op") == "quit":
                        return
            self.reap()


def _same_user(conn: socket.socket) -> bool:
    """The peer of a shared server's connection runs as this process's user (SO_PEERCRED: pid, uid, gid)."""
    try:
        _, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    except OSError:
        return False
    return uid == os.getuid()


def _session(conn: socket.socket, token: bytes, ready: dict) -> None:  # pragma: no cover - a forked session
    """One run's zygote, forked by the shared server already imported: the run's hello (its token) first, then the
    protocol above, ending with the run's connection."""
    conn.settimeout(HELLO_SECONDS)
    received = b""
    try:
        while b"\n" not in received and len(received) < HELLO_BYTES:
            data = conn.recv(HELLO_BYTES)
            if not data:
                os._exit(0)
            received += data
        line, _, rest = received.partition(b"\n")
        hello = json.loads(line)
        given = bytes.fromhex(hello["token"]) if hello.get("op") == "hello" else b""
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        os._exit(0)
    if not hmac.compare_digest(given, token):
        os._exit(0)
    conn.settimeout(None)
    zygote = Zygote(conn)
    zygote.buffer = rest
    zygote.send(ready)
    try:
        zygote.serve()
    finally:
        zygote.stop()
        os._exit(0)


def _ours(path: str, inode: int) -> bool:
    try:
        return os.lstat(path).st_ino == inode
    except OSError:
        return False


def serve_shared(path: str, imports_and_types: list[str]) -> None:
    """A zygote shared by many runs (shared.py): listen on `path`, then (detached: the starter's wait ends) import,
    then fork a session per connection of this user's, and end when the folder or the socket is gone, or after
    IDLE_SECONDS without a session."""
    from pathlib import Path

    from ..runtime.sockets import reachable
    from .shared import IDLE_SECONDS, TOKEN_BYTES, token_of

    token = secrets.token_bytes(TOKEN_BYTES)
    token_path = str(token_of(Path(path)))
    handle = os.open(token_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(handle, "wb") as out:
        out.write(token)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    previous = os.umask(0o177)
    try:
        with reachable(Path(path)) as name:
            listener.bind(name)
    finally:
        os.umask(previous)
    listener.listen(64)
    inode = os.lstat(path).st_ino
    if os.fork() != 0:
        os._exit(0)  # the starter waited for this one: the server now has no parent to wait for it
    ready = _preload_from_flags(imports_and_types)
    server, sessions, idle_since = os.getpid(), set(), time.monotonic()
    try:
        while _ours(path, inode):
            readable, _, _ = select.select([listener], [], [], 1.0)
            if readable:
                conn, _ = listener.accept()
                threads = thread_count()
                if _same_user(conn):
                    pid = os.fork()
                    if pid == 0:
                        listener.close()
                        die_with_parent(server)
                        _session(conn, token, dict(ready, threads=threads))
                    sessions.add(pid)
                conn.close()
            while sessions:
                try:
                    pid, _ = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    sessions.clear()
                    break
                if pid == 0:
                    break
                sessions.discard(pid)
            if sessions:
                idle_since = time.monotonic()
            elif time.monotonic() - idle_since > IDLE_SECONDS:
                break
    finally:
        if _ours(path, inode):
            for stale in (path, token_path):
                with contextlib.suppress(OSError):
                    os.unlink(stale)


def _preload_from_flags(arguments: list[str]) -> dict:
    flags = [a for a in arguments if a.startswith((IMPORT, WITHOUT))]
    listed = {flag.split("=", 1)[0] + "=": [n for n in flag.split("=", 1)[1].split(",") if n] for flag in flags}
    return preload([a for a in arguments if a not in flags], imports=listed.get(IMPORT),
                   without=listed.get(WITHOUT, ()))


def main(argv: list[str]) -> int:
    # The runner ends the zygote through the socket or by killing its group; Ctrl-C reaches the tool only.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if argv[1].startswith(LISTEN):
        try:
            serve_shared(argv[1][len(LISTEN):], argv[3:])
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(0)
    sock = socket.socket(fileno=int(argv[1]))
    zygote = Zygote(sock)
    try:
        zygote.send(_preload_from_flags(argv[3:]))
        zygote.serve()
    finally:
        zygote.stop()
        sys.stdout.flush()
        sys.stderr.flush()
    # No interpreter shutdown: tearing down torch and transformers takes a second or more, and the run waits
    # for this process to end; it holds nothing to save.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
