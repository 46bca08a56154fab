"""DEST as a folder (a mounted disk or network share): a temporary name, fsync, read back, rename.

The copy is hashed as it is written and read back from the destination after fsync (its cached pages dropped
first where the system allows, so the read goes to the share), and it takes its name only when both digests
equal the archive's. A kill leaves only `.<name>.<pid>.<random>.partial`, which the next push there removes.

`itera-verify OUTDIR --push FOLDER` copies while the seal writes (FolderFollower, the folder's counterpart of
push/follow.SealFollower): each range is copied once the seal's writer says its bytes are final
(archive/output.WrittenBytes), so the end of the rental pays for the last range, the fsync and the read-back of
the copy, not for a whole second pass. The copy takes its name only after the seal published the archive and the
copy, read back from the destination, hashes to the SHA-256 the seal's own read-back computed; a seal that does
not publish abandons it (the partial copy is removed). A kill -9 leaves the partial copy, which the next push
there removes before it copies the archive again, verified, with its receipt.
"""
from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

from ..archive.publish import fsync_folder, partial_path, remove_stale_partials
from ..archive.writeback import start_writeback
from ..runtime.progress import NULL_PROGRESS, Progress
from .follow import WAIT_SECONDS, Follower, _Abandoned, _now
from .multipart import PartBuffers
from .occupied import refuse_folder_if_occupied, take_name
from .store import DestinationRefused, PushError, PushUnverified

CHUNK = 8 << 20


def copy_verified(source: Path, folder: Path, expected_sha256: str | None = None,
                  progress: Progress = NULL_PROGRESS, overwrite: bool = False) -> tuple[str, int, int | None]:
    """Copy `source` into `folder` under its name, verified; another archive there under that name is refused
    unless `overwrite` (occupied.py). Returns (sha256, bytes, crc64nvme)."""
    try:  # the receipt's CRC64NVME, when awscrt is installed (a folder destination needs nothing else)
        from awscrt.checksums import crc64nvme
    except ImportError:
        crc64nvme = None

    destination = folder / source.name
    if destination.resolve() == source.resolve():
        raise DestinationRefused(f"{folder}: is the archive's own folder (give another destination)")
    if expected_sha256 is not None:  # before the copy: a name taken by other bytes is refused at once
        refuse_folder_if_occupied(destination, expected_sha256, overwrite)
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
        take_name(partial, destination, written.hexdigest(), overwrite)
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


class FolderFollower(Follower):
    """Follows one seal's archive into a folder (`OUTDIR --push FOLDER`). It stays idle, too, when the folder is
    the archive's own: the caller pushes after the seal instead."""

    ABANDONED = "the partial copy is removed"

    def __init__(self, dest, *, progress: Progress = NULL_PROGRESS, deadline: float | None = None, warn=None,
                 overwrite: bool = False, **_s3_options):
        from .store import folder_destination

        super().__init__(progress, deadline, warn)
        self.overwrite = overwrite
        self.folder = folder_destination(dest)
        self._source = self._target = None  # file descriptors: the partial archive, the partial copy
        self._copied = 0
        self._crc, self._crc64nvme = 0, None

    # ---- the seal's side ---------------------------------------------------------------------------------
    def begin(self, partial: Path, written, name: str, bound: int, estimate=None) -> None:
        self.destination = self.folder / name
        if self.destination.resolve() == Path(partial).with_name(name).resolve():
            return  # the archive's own folder: idle, and the push after the seal says why (copy_verified)
        try:  # the receipt's CRC64NVME, from the seal's read-back (tap), when awscrt is installed
            from awscrt.checksums import crc64nvme
            self._crc64nvme = crc64nvme
        except ImportError:
            pass
        self.written, self.started, self.uploaded_at = written, time.monotonic(), _now()
        remove_stale_partials(self.destination)
        self.partial = partial_path(self.destination)
        self._source = os.open(partial, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))  # kept open past the rename
        try:
            self._target = os.open(self.partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0),
                                   0o644)
        except OSError:  # idle: the push after the seal tries the folder again and says why
            self._close()
            return
        self._follow()

    def tap(self, data) -> None:
        if self._crc64nvme is not None:
            self._crc = self._crc64nvme(data, self._crc)

    def sealed(self, path: Path, sha256: str, size: int) -> None:
        if self.state == "following":
            self._sealed = (Path(path), sha256, size)
            self.state = "sealed"

    # ---- the caller's side -------------------------------------------------------------------------------
    def result(self):
        """After sealed(): the copy is synced, read back from the folder and compared with the SHA-256 the seal
        verified; then it takes its name, and `.sha256`, `.sig` and the receipt follow, as push() does."""
        from . import archive_sidecars, finish_folder

        if self.state != "sealed":
            raise PushError(f"{self.folder}: nothing was sealed, nothing copied")
        try:
            self._finish_following()
            archive, sha256, size = self._sealed
            if self._copied != size:
                raise PushUnverified(f"{self.destination}: {self._copied} bytes copied, the archive has {size}")
            back = _read_back(self.partial)
            if back != sha256:
                raise PushUnverified(f"{self.destination}: the copy reads back as sha256 {back}, the archive is "
                                     f"{sha256}")
            take_name(self.partial, self.destination, sha256, self.overwrite)
            fsync_folder(self.folder)
        except OSError as exc:
            raise PushError(f"{self.folder}: cannot write the copy ({exc.strerror or exc})") from None
        finally:
            self.partial.unlink(missing_ok=True)
        _, sidecars = archive_sidecars(archive)
        return finish_folder(archive, self.folder, sha256, sidecars, size=size,
                             crc=self._crc if self._crc64nvme is not None else None, started=self.started,
                             uploaded_at=self.uploaded_at, overlapped=True)

    # ---- the thread --------------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._copy()
        except _Abandoned:
            pass
        except (PushError, PushUnverified) as exc:
            self._error = exc
        except OSError as exc:
            self._error = PushError(f"{self.folder}: cannot write the copy ({exc.strerror or exc})")

    def _copy(self) -> None:
        offset, buffers = 0, PartBuffers(CHUNK)  # one buffer, written over: no fresh pages for every range
        with self._shown(f"copying {self.destination.name} while sealing"):
            while True:
                available, final, failed = self.written.wait_for(offset + CHUNK, WAIT_SECONDS)
                if failed or self._abandoned.is_set():
                    raise _Abandoned()
                end = min(available, offset + CHUNK) if final is None else min(final, offset + CHUNK)
                if end <= offset and final is None:
                    continue
                if end > offset:
                    data = buffers.read(self._source, offset, end - offset)
                    view = memoryview(data)
                    while view:
                        view = view[os.pwrite(self._target, view, offset + len(data) - len(view)):]
                    buffers.take_back(data=data)
                    start_writeback(self._target, offset, len(data))  # the final fsync then has little to do
                    self.progress.advance("push", len(data))
                    offset = end
                if final is not None and offset >= final:
                    break
            os.fsync(self._target)
            self._copied = offset

    def _release(self) -> None:
        """The descriptors are closed; an abandoned copy's partial file is removed."""
        self._close()
        if self.state == "abandoned":
            self.partial.unlink(missing_ok=True)

    def _close(self) -> None:
        for name in ("_source", "_target"):
            fd = getattr(self, name)
            setattr(self, name, None)
            if fd is not None:
                os.close(fd)

