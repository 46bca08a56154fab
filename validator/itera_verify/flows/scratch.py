"""Where an audit extracts: one private folder per audit, held with a lock while it runs, and what killed audits
left behind removed.

An audit makes `itera-audit-XXXXXXXX/` (0700) in the scratch location (scratch_folder: memory or the temporary
folder) holding `lock`, `tree/` (the extraction) and `seal/` (the SEAL/ files written aside). `lock` is an flock
held for the audit's whole life; it is taken under another name and renamed to `lock` once held, so a folder whose
`lock` is free belongs to no running audit. An audit that ends removes its folder; one killed by SIGKILL, the OOM
killer or a power cut cannot, and in /dev/shm its extraction would hold memory until a reboot. So each audit first
removes every `itera-audit-*` folder there that this user owns and whose `lock` it can take. A folder without
`lock` (an older version's) or another user's is left alone.
"""
from __future__ import annotations

import fcntl
import os
import shutil
import stat
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from ..archive.zstdframes import declared_content_size
from ..runtime.environment import Environment

PREFIX = "itera-audit-"
LOCK = "lock"
MEMORY_SCRATCH = Path("/dev/shm")
SYSTEM_TEMP = ("/tmp", "/var/tmp", "/usr/tmp")
_OPEN = os.O_RDWR | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


@contextmanager
def extraction_folders(folder: str | None) -> Iterator[tuple[str, str]]:
    """(tree, seal side): two empty private folders under one locked audit folder in `folder` (None: the
    temporary folder), removed on leaving; stale audit folders there are removed first."""
    remove_stale(folder or tempfile.gettempdir())
    top = tempfile.mkdtemp(prefix=PREFIX, dir=folder)  # mode 0700: private
    lock = None
    try:
        lock = _hold_lock(top)
        tree, seal_side = os.path.join(top, "tree"), os.path.join(top, "seal")
        os.mkdir(tree, 0o700)
        os.mkdir(seal_side, 0o700)
        yield tree, seal_side
    finally:
        shutil.rmtree(top, ignore_errors=True)
        if lock is not None:
            os.close(lock)


def _hold_lock(top: str) -> int:
    partial = os.path.join(top, f".{LOCK}.partial")
    fd = os.open(partial, _OPEN | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a new file: nobody else can hold it
        os.rename(partial, os.path.join(top, LOCK))
    except BaseException:
        os.close(fd)
        raise
    return fd


def remove_stale(folder: str) -> list[str]:
    """Remove the audit folders in `folder` that this user owns and no running audit holds; their paths."""
    removed = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        if not entry.name.startswith(PREFIX):
            continue
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
            continue
        try:
            fd = os.open(os.path.join(entry.path, LOCK), _OPEN)
        except OSError:
            continue  # no lock: an older version's folder, not ours to judge
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue  # held: a running audit
        try:
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(entry.path)
        finally:
            os.close(fd)
    return removed


def scratch_folder(archive: Path, fd: int | None, environment: Environment) -> str | None:
    """Where the private extraction folder goes; None: the temporary folder the user or system chose.

    Memory (/dev/shm) when nobody chose a temporary folder (no TMPDIR, TEMP or TMP; Python's default), every
    zstd frame declares its content size, and twice their sum fits both the tmpfs and the available memory.
    The extraction lives a minute and is deleted: on a disk, creating thousands of files and writing gigabytes
    only to remove them costs more than the audit's own work (GNU tar -x of the 2 GiB benchmark archive takes
    9.4 s on ext4 with discard; the whole audit reads and re-checks it in about 5 s in memory)."""
    if environment.temp_folder_chosen or tempfile.gettempdir() not in SYSTEM_TEMP:
        return None
    if not MEMORY_SCRATCH.is_dir() or not os.access(MEMORY_SCRATCH, os.W_OK | os.X_OK):
        return None
    try:
        if fd is None:
            with open(archive, "rb", buffering=0) as source:
                declared = declared_content_size(source.fileno())
        else:
            declared = declared_content_size(fd)
        room = os.statvfs(MEMORY_SCRATCH)
    except OSError:
        return None
    if declared is None or room.f_bavail * room.f_frsize < 2 * declared or available_memory() < 2 * declared:
        return None
    return str(MEMORY_SCRATCH)


def available_memory() -> int:
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


__all__ = ["extraction_folders", "remove_stale", "scratch_folder"]
