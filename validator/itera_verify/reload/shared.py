"""Zygotes shared by the runs of many processes: ITERA_RELOAD_ZYGOTES names a private folder, and every run whose
zygote would import the same libraries in the same environment forks its children from one server there.

Why: a run's own zygote imports torch, transformers and peft (5 CPU-s and more) for reloads that take well under a
second each. A CI job or a test suite that runs the command many times pays that import once per run; with the
folder set, once per (environment, libraries) for as long as the folder exists.

How: the server is the zygote itself (zygote.py) listening on `FOLDER/KEY.sock`, KEY the digest of what a zygote
must share with a run to serve it (`key`). For each connection it forks a *session*: a copy of itself, already
imported, that serves that one run exactly as a run's own zygote does and ends with the run's connection. A run
that finds no server of its key takes one that imports more in the same environment, if one is there (`serves`:
its facts are in `KEY.json`); else it starts one of its own key, detached (it outlives that run), under a lock so
that two runs start one server. A server ends when its folder is removed, when its socket is replaced, or after
IDLE_SECONDS with no session.

Trust: the folder must be the user's own and closed to others (the command refuses it otherwise); the server
serves only its own user (the socket peer's uid) holding the token it wrote in the folder (`KEY.token`, 0600);
the variable is never handed to a reload child (runtime/environment.py), and a confined child could neither read
the folder (Landlock) nor open a socket (seccomp).
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

from ..runtime.environment import TOOL_FOLDER
from ..runtime.sockets import reachable
from .preloads import Preloads
from .zygote import LISTEN

IDLE_SECONDS = 600.0  # a server with no session for this long ends (its imports hold ~0.5 GiB)
START_SECONDS = 30.0  # a server binds its socket before its imports: far longer means it could not start
TOKEN_BYTES = 32


class UnsafeFolder(ValueError):
    """ITERA_RELOAD_ZYGOTES names a folder others could write into, or no folder."""


def check_folder(folder: str) -> Path:
    """The folder, if it is a real folder of this user's that no one else may write to or list."""
    path = Path(folder)
    try:
        info = os.lstat(path)
    except OSError as exc:
        raise UnsafeFolder(f"ITERA_RELOAD_ZYGOTES={folder}: {exc.strerror or exc}") from None
    if not stat.S_ISDIR(info.st_mode):
        raise UnsafeFolder(f"ITERA_RELOAD_ZYGOTES={folder}: not a folder (a link is not taken)")
    if info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise UnsafeFolder(f"ITERA_RELOAD_ZYGOTES={folder}: must be yours and closed to others (chmod 700)")
    return path


def facts(env: dict, preloads: Preloads) -> dict:
    """What a server shares with the runs it serves: this interpreter and this copy of the tool, the zygote's
    environment (its libraries read it at import), what it imports and keeps out, in order, and the priority its
    children inherit (a server a niced run started, the resume proof's, must not serve a run at full priority).
    Not the architectures whose modelling modules it imported besides: a child imports one it lacks itself."""
    from ..version import __version__

    return {"python": sys.executable, "tool": TOOL_FOLDER, "version": __version__,
            "env": [list(item) for item in sorted(env.items())], "imports": list(preloads.imports),
            "without": list(preloads.without), "nice": os.getpriority(os.PRIO_PROCESS, 0)}


def key(env: dict, preloads: Preloads) -> str:
    """The name of the server started for a run: the digest of its facts."""
    return _name(facts(env, preloads))


def _name(server: dict) -> str:
    return hashlib.sha256(json.dumps(server, sort_keys=True).encode()).hexdigest()[:32]


def serves(server: dict, run: dict) -> bool:
    """A server of these facts serves this run: every fact the same but the imports, and the server's cover the
    run's (Preloads.covers, as for a warm zygote). A run of safetensors alone is served by the server a run of
    the example package started; the libraries kept out stay the same."""
    return {k: v for k, v in server.items() if k != "imports"} == {k: v for k, v in run.items() if k != "imports"} \
        and Preloads(tuple(server.get("imports") or ())).covers(Preloads(tuple(run["imports"])))


def facts_of(sock_path: Path) -> Path:
    """The facts a server's starter writes beside its socket, `KEY.json`, for runs of another key to read."""
    return sock_path.with_suffix(".json")


def token_of(sock_path: Path) -> Path:
    """The token a server writes beside its socket, `KEY.token` (0600), and a run sends in its hello."""
    return sock_path.with_suffix(".token")


def _dial(path: Path) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with reachable(path) as name:
            sock.connect(name)
    except OSError:
        sock.close()
        return None
    return sock


def connect(folder: str, env: dict, preloads: Preloads, flags: list[str], room: int) -> socket.socket | None:
    """A connection to the server of this key in `folder`, started first where there is none, the token sent;
    None where none could be reached (the run then starts its own zygote)."""
    base = check_folder(folder)
    wanted = facts(env, preloads)
    name = _name(wanted)
    sock_path = base / f"{name}.sock"
    sock = _dial(sock_path)
    if sock is None:
        sock, sock_path = _covering(base, wanted, sock_path)
    if sock is None:
        with open(base / f"{name}.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one starter per key; the others find its server
            sock = _dial(sock_path)
            if sock is None:
                with contextlib.suppress(FileNotFoundError):
                    sock_path.unlink()  # a server that is gone
                if _start(sock_path, base / name, env, flags, room):
                    _write_facts(facts_of(sock_path), wanted)
                    sock = _dial(sock_path)
    if sock is None:
        return None
    try:
        token = token_of(sock_path).read_bytes()
        sock.sendall(json.dumps({"op": "hello", "token": token.hex()}).encode() + b"\n")
    except OSError:
        sock.close()
        return None
    return sock


def _covering(base: Path, wanted: dict, own: Path) -> tuple[socket.socket | None, Path]:
    """A live server of another key that serves this run (`serves`), and its socket's path; else (None, own)."""
    for written in sorted(base.glob("*.json")):
        try:
            server = json.loads(written.read_text())
        except (OSError, ValueError):
            continue  # being written, or not a server's
        if isinstance(server, dict) and serves(server, wanted):
            sock_path = written.with_suffix(".sock")
            sock = _dial(sock_path)
            if sock is not None:
                return sock, sock_path
    return None, own


def _write_facts(path: Path, server: dict) -> None:
    """Whole or not at all: a reader never sees half of it."""
    partial = path.with_suffix(".json.partial")
    partial.write_text(json.dumps(server, sort_keys=True))
    os.replace(partial, path)


def _start(sock_path: Path, work: Path, env: dict, flags: list[str], room: int) -> bool:
    """The server, detached: its own session; its first process binds the socket, forks the server and ends, so
    the server's parent is the init process. True when the socket is bound (the first process ended well)."""
    work.mkdir(mode=0o700, exist_ok=True)
    from .confine import scratch_variables

    env = {**env, **scratch_variables(str(work), env.get("HF_HUB_CACHE")), "TMPDIR": str(work)}
    with open(work / "zygote.log", "ab") as log:
        first = subprocess.run([sys.executable, "-m", "itera_verify.reload.zygote", LISTEN + str(sock_path),
                                "." * room, *flags], env=env, cwd=str(work), stdin=subprocess.DEVNULL, stdout=log,
                               stderr=subprocess.STDOUT, start_new_session=True, check=False, timeout=START_SECONDS)
    return first.returncode == 0
