"""The manifest lock: two processes of one campaign (a training script, an evaluation job, a notebook) update
manifest.json, stops.json and reload.json one at a time, each reading the other's last write.

The lock is `fcntl.flock` on the package folder itself, not on a lock file: nothing is left inside the package
for the seal to archive, or beside it. flock locks belong to an open file description, so two threads of one
process holding their own lock exclude each other too. The lock is advisory and released by the kernel when
its process dies (a SIGKILL never leaves the campaign locked).

Where a folder cannot be locked (NFS emulates flock with byte-range locks, which need a file open for writing),
the lock falls back to a file beside the package, `.<package name>.itera-lock`, never inside it, and never
opened through a link."""
from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from .files import ROOT_FLAGS, open_at

UNLOCKABLE = {errno.EBADF, errno.EINVAL, errno.ENOLCK, errno.EOPNOTSUPP}


def beside(root: Path) -> Path:
    return root.parent / f".{root.name}.itera-lock"


def _open_beside(root: Path) -> int:
    """The fallback lock file, opened (or created) in the package's parent folder never through a link: a link
    planted under its name would have the recorder create a file wherever it points."""
    parent_fd = os.open(root.parent, ROOT_FLAGS)
    try:
        return open_at(parent_fd, beside(root).name, os.O_RDWR | os.O_CREAT, str(beside(root)))
    finally:
        os.close(parent_fd)


@contextlib.contextmanager
def package_lock(root: Path, folder_lock: bool = True) -> Iterator[None]:
    fd = os.open(root, ROOT_FLAGS)
    try:
        try:
            if not folder_lock:
                raise OSError(errno.ENOLCK, "folder lock not wanted")
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as exc:
            if exc.errno not in UNLOCKABLE:
                raise
            os.close(fd)
            fd = -1  # closed: a refused fallback must not close it twice
            fd = _open_beside(root)
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        if fd >= 0:
            os.close(fd)  # closing the last descriptor releases the lock
