"""DEST as a folder (a mounted disk or network share): a temporary name, fsync, read back, rename.

The copy is hashed as it is written and read back from the destination after fsync (its cached pages dropped
first where the system allows, so the read goes to the share), and it takes its name only when both digests
equal the archive's. A kill leaves only `.<name>.<pid>.<random>.partial`, which the next push there removes.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

from ..archive.publish import fsync_folder, partial_path, remove_stale_partials
from ..runtime.progress import NULL_PROGRESS, Progress
from .store import PushError, PushUnverified

CHUNK = 8 << 20


def copy_verified(source: Path, folder: Path, expected_sha256: str | None = None,
                  progress: Progress = NULL_PROGRESS) -> tuple[str, int, int | None]:
    """Copy `source` into `folder` under its name, verified. Returns (sha256, bytes, crc64nvme)."""
    try:  # the receipt's CRC64NVME, when awscrt is installed (a folder destination needs nothing else)
        from awscrt.checksums import crc64nvme
    except ImportError:
        crc64nvme = None

    destination = folder / source.name
    if destination.resolve() == source.resolve():
        raise PushError(f"{folder}: is the archive's own folder (give another destination)")
    remove_stale_partials(destination)
    partial = partial_path(destination)
    written, crc, total = hashlib.sha256(), 0, 0
    try:
        try:
            with open(source, "rb") as reader, open(partial, "xb") as writer:
                progress.start("push", f"copying {source.name}", total=source.stat().st_size, unit="B")
                while chunk := reader.read(CHUNK):
                    writer.write(chunk)
                    written.update(chunk)
                    crc = crc64nvme(chunk, crc) if crc64nvme else None
                    total += len(chunk)
                    progress.advance("push", len(chunk))
                writer.flush()
                os.fsync(writer.fileno())
        except OSError as exc:
            raise PushError(f"{folder}: cannot write the copy ({exc.strerror or exc})") from None
        finally:
            progress.finish("push")
        if expected_sha256 is not None and written.hexdigest() != expected_sha256:
            raise PushUnverified(f"{source.name}: its bytes (sha256 {written.hexdigest()}) are not those its "
                                 f".sha256 names ({expected_sha256})")
        back = _read_back(partial)
        if back != written.hexdigest():
            raise PushUnverified(f"{destination}: the copy reads back as sha256 {back}, written as "
                                 f"{written.hexdigest()}")
        os.replace(partial, destination)
        fsync_folder(folder)
    finally:
        partial.unlink(missing_ok=True)
    return written.hexdigest(), total, crc


def _read_back(path: Path) -> str:
    digest = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        if hasattr(os, "posix_fadvise"):  # the cached pages are what was written: read what the device holds
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        with os.fdopen(os.dup(fd), "rb") as reader:
            while chunk := reader.read(CHUNK):
                digest.update(chunk)
    finally:
        os.close(fd)
    return digest.hexdigest()


def write_small(folder: Path, name: str, data: bytes) -> None:
    """A sidecar (checksum, signature, receipt) written the same way, verified by reading it back."""
    destination = folder / name
    partial = partial_path(destination)
    try:
        with open(partial, "xb") as writer:
            writer.write(data)
            writer.flush()
            os.fsync(writer.fileno())
        if partial.read_bytes() != data:
            raise PushUnverified(f"{destination}: reads back changed")
        os.replace(partial, destination)
        fsync_folder(folder)
    except OSError as exc:
        raise PushError(f"{folder}: cannot write {name} ({exc.strerror or exc})") from None
    finally:
        partial.unlink(missing_ok=True)
