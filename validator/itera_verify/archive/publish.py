"""Giving a finished archive its final name safely: read it back, write its checksum file, publish atomically.

Nothing here knows about packages: it compares an archive with the list of members its writer produced.
"""
from __future__ import annotations

import errno
import hashlib
import os
import secrets
from pathlib import Path
from typing import Callable

from .direct import open_direct
from .errors import ArchiveError
from .reader import ArchiveReader

PARTIAL = ".partial"


class ReadBackMismatch(ArchiveError):
    """The bytes on disk do not read back as the members that were written."""


def partial_path(destination: Path, suffix: str = "") -> Path:
    """`.<name>.<pid>.<random><suffix>.partial` beside the destination: hidden, ours, never the final name."""
    return destination.parent / f".{destination.name}.{os.getpid()}.{secrets.token_hex(4)}{suffix}{PARTIAL}"


def remove_stale_partials(destination: Path) -> None:
    """Partial files left by a seal that was killed (kill -9, power loss): their process is gone."""
    for leftover in destination.parent.glob(f".{destination.name}.*{PARTIAL}"):
        pid = leftover.name[len(destination.name) + 2:].split(".")[0]
        if pid.isdigit() and int(pid) != os.getpid():
            try:
                os.kill(int(pid), 0)
            except ProcessLookupError:
                leftover.unlink(missing_ok=True)
            except OSError:
                continue


def read_back(path: Path, expected: list[tuple], frames: list[tuple[int, int]] | None = None,
              on_bytes: Callable[[int], None] = lambda n: None, tap=None, follow=None) -> tuple[str, int]:
    """Read the archive at `path` back and compare it, member by member, with `expected`: (name, kind, size,
    sha256 for a file or link target otherwise), in order. `frames`: where the writer ended each zstd frame (they
    then decompress in parallel). `tap`: given every byte of the file as it is hashed (ArchiveReader). `follow`
    (follow.FollowedFrames): the archive is still being written, and `expected` grows with it (follow.Growing):
    each frame is read back once it is in the file. Returns (sha256 of the file, its size). Raises ArchiveError,
    or follow.Stopped when the writing is abandoned."""
    # Past the page cache when the frames are read in parallel (aligned reads): the bytes on the device are
    # what is verified (direct.py). The sequential path, for a single frame, reads plainly.
    flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
    fd = open_direct(path, flags)[0] if follow is not None or (frames and len(frames) > 1) else os.open(path, flags)
    if follow is not None:
        frames = follow.frames
    with os.fdopen(fd, "rb", buffering=0) as source, \
            ArchiveReader(source, frames=frames, tap=tap, follow=follow) as reader:
        members = iter(expected)
        for member in reader:
            want = next(members, None)
            if member.not_canonical:  # the audit would refuse it: the writer and canonical.py disagree
                raise ReadBackMismatch(f"{member.name} reads back with {member.not_canonical}")
            if member.kind == "file":
                digest = hashlib.sha256()
                for piece in reader.data(member):
                    digest.update(piece)
                    on_bytes(len(piece))
                got = (member.name, member.kind, member.size, digest.hexdigest())
            else:
                got = (member.name, member.kind, member.size, member.linkname)
            if got != want:
                raise ReadBackMismatch(f"{member.name} reads back as {got[1:3]}, written as "
                                       f"{want[1:3] if want else 'nothing'}")
        if (missing := next(members, None)) is not None:
            raise ReadBackMismatch(f"{missing[0]} was written but does not read back")
        archive_sha256, archive_bytes = reader.archive_sha256, reader.archive_bytes
    if frames and archive_bytes != frames[-1][1]:
        raise ReadBackMismatch(f"{archive_bytes} bytes on disk, {frames[-1][1]} written")
    return archive_sha256, archive_bytes


def write_checksum_file(path: Path, sha256: str, archive_name: str) -> None:
    """`<hex>  <archive name>`: `sha256sum -c` run in the archive's folder checks it."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o644)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(f"{sha256}  {archive_name}\n")
        fh.flush()
        os.fsync(fh.fileno())


# What os.link answers where the file system or share has no hard links (or no more for this file).
NO_HARD_LINKS = (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK)


def publish(partial: Path, destination: Path, overwrite: bool) -> None:
    """Give the verified file its name atomically. Without `overwrite`, a file that appeared under that name
    meanwhile is kept and FileExistsError raised: a hard link never replaces an existing name."""
    if overwrite:
        os.replace(partial, destination)
        return
    try:
        os.link(partial, destination)
    except FileExistsError:
        raise
    except OSError as exc:
        if exc.errno not in NO_HARD_LINKS:
            raise
        # No hard links here: check, then rename (a tiny race, the best available).
        if destination.exists():
            raise FileExistsError(destination) from None
        os.replace(partial, destination)
        return
    partial.unlink()


def fsync_folder(folder: Path) -> None:
    """Make the renames durable (best effort: some file systems refuse to sync a folder)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
