"""The manifest lock: two processes of one campaign (a training script, an evaluation job, a notebook) update
manifest.json, stops.json and reload.json one at a time, each reading the other's last write.

The lock is `fcntl.flock` on the package folder itself, not on a lock file: nothing is left inside the package
for the seal to archive, or beside it. flock locks belong to an open file description, so two threads of one
process holding their own lock exclude each other too. The lock is advisory and released by the kernel when
its process dies (a SIGKILL never leaves the campaign locked).

Where a folder cannot be locked (NFS emulates flock with byte-range locks, which need a file open for writing),
the lock falls back to a file beside the package, `.<package name>.itera-lock`, never inside it."""
from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

UNLOCKABLE = {errno.EBADF, errno.EINVAL, errno.ENOLCK, errno.EOPNOTSUPP}


def beside(root: Path) -> Path:
    return root.parent / f".{root.name}.itera-lock"


@contextlib.contextmanager
def package_lock(root: Path, folder_lock: bool = True) -> Iterator[None]:
    fd = os.open(root, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        try:
            if not folder_lock:
                raise OSError(errno.ENOLCK, "folder lock not wanted")
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as exc:
            if exc.errno not in UNLOCKABLE:
                raise
            os.close(fd)
            fd = os.open(beside(root), os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the last descriptor releases the lock
