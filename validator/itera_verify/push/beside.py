"""The files a push reads and writes beside the archive (`.sha256`, `.sig`, the journal, the receipt): bounded.

They may have been changed between two runs, by accident or not: a read never follows a link, never waits on a
fifo, never takes more than its limit; a write goes to a fresh temporary name (never through a link planted under
it), is synced, then renamed over the final name (a link there is replaced, never written through).
"""
from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

READ_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


class NotSmallFile(OSError):
    """Not a regular file of at most the limit (a link, a fifo, a folder, a huge file)."""


def read_beside(path: Path, limit: int) -> bytes | None:
    """The bytes of `path`, a regular file of at most `limit` bytes; None when there is none; NotSmallFile (an
    OSError) when it is something else, or larger; OSError when it cannot be read."""
    try:
        fd = os.open(path, READ_FLAGS)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EMLINK):  # O_NOFOLLOW met a link (EMLINK on FreeBSD)
            raise NotSmallFile(exc.errno, "a link, not a file", str(path)) from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotSmallFile(0, "not a regular file", str(path))
        if info.st_size > limit:
            raise NotSmallFile(0, f"larger than {limit} bytes", str(path))
        data = b""
        while len(data) <= limit and (piece := os.read(fd, limit + 1 - len(data))):
            data += piece
        if len(data) > limit:  # grown since fstat
            raise NotSmallFile(0, f"larger than {limit} bytes", str(path))
        return data
    finally:
        os.close(fd)


def write_beside(path: Path, data: bytes) -> None:
    """`data` under `path`, whole or not at all (OSError)."""
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    partial.unlink(missing_ok=True)
    try:
        fd = os.open(partial, WRITE_FLAGS, 0o644)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
