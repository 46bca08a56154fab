"""The manifest lock: two processes of one campaign (a training script, an evaluation job, a notebook) update
manifest.json, stops.json and reload.json one at a time, each reading the other's last write.

The lock is `fcntl.flock` on the package folder itself, not on a lock file: nothing is left inside the package
for the seal to archive, or beside it in a folder the user may not own. flock locks belong to an open file
description, so two threads of one process holding their own lock exclude each other too. The lock is
advisory and released by the kernel when its process dies (a SIGKILL never leaves the campaign locked)."""
from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def package_lock(root: Path) -> Iterator[None]:
    fd = os.open(root, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the last descriptor releases the lock
