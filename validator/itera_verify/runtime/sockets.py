"""Unix socket paths: a socket's address holds at most 108 bytes with its NUL (sun_path), and a deep TMPDIR or
test folder passes that. One place knows the limit and the two ways around it."""
from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

SOCKET_PATH_BYTES = 100  # sun_path holds 108 bytes; kept under it with room for a name's growth
SHORT_FOLDER = "/tmp"  # where a socket goes when the temporary folder is too deep for one
_MKDTEMP_RANDOM = 8  # characters tempfile.mkdtemp puts after a prefix


def fits(path: str | os.PathLike) -> bool:
    return len(os.fsencode(os.fspath(path))) < SOCKET_PATH_BYTES


def socket_folder(prefix: str, names: int, base: str | None = None) -> str:
    """A new private folder (0700) for sockets that another program binds (ssh-agent closes every descriptor it
    inherits, Ray names its own), their paths inside it at most `names` bytes long: under `base` (default: the
    temporary folder) where they fit a socket address there, else under /tmp. The caller removes it."""
    base = base or tempfile.gettempdir()
    deepest = os.path.join(base, prefix + "x" * _MKDTEMP_RANDOM, "x" * names)
    return tempfile.mkdtemp(prefix=prefix, dir=base if fits(deepest) else SHORT_FOLDER)


@contextlib.contextmanager
def reachable(path: Path):
    """A name of the socket at `path` that fits a socket address, for this process's own bind or connect: the
    path itself, or, for a deeper folder, the path through the folder's descriptor (/proc/self/fd/N/NAME)."""
    if fits(path):
        yield str(path)
        return
    folder = os.open(path.parent, os.O_PATH | os.O_DIRECTORY)
    try:
        yield f"/proc/self/fd/{folder}/{path.name}"
    finally:
        os.close(folder)
