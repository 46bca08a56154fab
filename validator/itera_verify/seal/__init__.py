"""Seal a checked package: one streaming pass into `<campaign_id>.tar.zst`, verified before it gets its name.

Layout (SPEC §3): `<campaign_id>/` holds the package as it is, then `SEAL/SHA256SUMS` and the extra members
the workflow hands over (`SEAL/verification.json`, `SEAL/report.html`). Choices made here:

- Members are sorted by name (byte order); `SEAL/` comes last because its SHA256SUMS is the product of the pass.
- Ownership is normalised (uid/gid 0, no user or group names); modes become 0755 (folders, executables) or
  0644; modification times are kept (whole seconds): they are evidence of when artifacts were produced.
- A symbolic link that stays inside the package is stored as a link (an absolute or roundabout target is
  rewritten relative, so it still works where the archive is extracted); SHA256SUMS lists regular files only,
  including `SEAL/verification.json` and `SEAL/report.html`. A link that leaves the package or is broken, and a
  fifo, socket or device, cannot be sealed (SealRefused: IV703, made by rules/archive.py like every finding of
  the seal).
- Each file is read once; its SHA-256 is computed on the bytes given to the compressor. A file that vanished,
  changed size, modification time or inode (or inode change time, when discovery records it) since discovery,
  or whose digest differs from one a check computed, is IV704 and nothing is sealed. A file that exists but
  cannot be read is unreadable input: UsageError (exit 2).
- The archive is written to `.<name>.<pid>.<random>.partial` beside the destination, synced, read back and
  verified member by member against what was hashed, then linked to its final name (never clobbering an archive
  that appeared meanwhile unless --overwrite). Where the file system allows, the writing and the read-back both go
  past the page cache (O_DIRECT, archive/direct.py): the read-back then checks the bytes the device holds, not a
  cached copy. Any exception, Ctrl-C or SIGTERM removes the partial file; after a kill -9 it stays under its
  partial name and the next seal in that folder removes it.
"""
from __future__ import annotations

import errno
import hashlib
import os
import posixpath
import signal
import stat
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ..archive import ArchiveError, ArchiveWriter, FileFeeder, SizeChanged, format_sums, worker_count
from ..archive.direct import DirectWriter
from ..archive.publish import (fsync_folder, partial_path, publish, read_back, remove_stale_partials,
                              write_checksum_file)
from ..runtime.forked import SIGNAL_POLL_SECONDS
from ..model import UsageError
from ..package import Package, inside_package
from ..runtime.progress import NULL_PROGRESS, Progress

SEAL_DIR = "SEAL"
SUMS = "SEAL/SHA256SUMS"


class SealRefused(Exception):
    """Nothing was sealed because of the package's content. `problems`: (kind, package path, detail) facts;
    the workflow hands them to rules/archive.py, which makes the findings (IV703, IV704, IV706)."""

    def __init__(self, message: str, problems: list[tuple[str, str, str]]):
        super().__init__(message)
        self.problems = problems


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP during a seal: unwinds like Ctrl-C, so the partial archive is removed."""


class _Changed(Exception):
    def __init__(self, rel: str, reason: str):
        super().__init__(reason)
        self.rel, self.reason = rel, reason


@dataclass
class _Entry:
    rel: str  # package-relative ("" for the package folder itself)
    kind: str  # directory | file | symlink
    mode: int = 0o644
    mtime: int = 0
    size: int = 0
    target: str = ""
    sha256: str = ""  # set when the file has been read


# ---- the plan: what goes into the archive, in order -------------------------------------------------------
def _sort_key(rel: str) -> bytes:
    return rel.encode("utf-8", "surrogateescape")


def _link_target(package: Package, rel: str) -> str:
    """The target to store: as written when it stays inside lexically, else rewritten relative."""
    link = package.links[rel]
    parent = posixpath.dirname(rel)
    if not posixpath.isabs(link.target):
        joined = posixpath.normpath(posixpath.join(parent, link.target))
        if joined != ".." and not joined.startswith("../"):
            return link.target
    inside = os.path.relpath(link.resolved, os.path.realpath(package.root)).replace(os.sep, "/")
    return posixpath.relpath(inside, parent or ".")


def plan_members(package: Package) -> list[_Entry]:
    """Every package member in archive order. Raises SealRefused for what cannot be sealed safely."""
    refused = []
    if any(p == SEAL_DIR or p.startswith(SEAL_DIR + "/") for p in
           (*package.files, *package.dirs, *package.links, *package.specials)):
        refused.append(("seal-folder", SEAL_DIR, ""))
    refused += [("special", rel, kind) for rel, kind in package.specials.items()]
    for rel, link in package.links.items():
        if link.broken or not link.inside:
            refused.append(("broken-link" if link.broken else "leaving-link", rel, link.target))
    if refused:
        raise SealRefused("the package holds entries that cannot be sealed", refused)
    entries = [_Entry("", "directory", 0o755, _mtime(package.root))]
    entries += [_Entry(rel, "directory", 0o755, _mtime(package.abspath(rel))) for rel in package.dirs]
    entries += [_Entry(rel, "file", 0o644, f.mtime_ns // 1_000_000_000, f.size) for rel, f in package.files.items()]
    entries += [_Entry(rel, "symlink", 0o777, _mtime(package.abspath(rel)), target=_link_target(package, rel))
                for rel in package.links]
    return sorted(entries, key=lambda e: _sort_key(e.rel))


def _mtime(path: Path) -> int:
    try:
        return int(os.lstat(path).st_mtime)
    except OSError:
        return 0


# ---- safety around the destination ------------------------------------------------------------------------
def _check_destination(package: Package, destination: Path, overwrite: bool) -> None:
    folder = destination.parent
    if not folder.is_dir():
        raise UsageError(f"{folder}: no such folder for the archive")
    if inside_package(package.root, folder):  # the guard --report uses too
        raise UsageError(f"{destination}: the archive cannot be written inside the package folder")
    if destination.is_dir():
        raise UsageError(f"{destination}: is a folder")
    if destination.exists() and not overwrite:
        raise UsageError(f"{destination}: already exists (use --overwrite to replace it)")


def _open_output(path: Path):
    """The partial archive file, written past the page cache where the file system allows (archive/direct.py);
    tests replace this to inject a full disk."""
    return DirectWriter.create(path)


@contextmanager
def termination_unwinds():
    """SIGTERM/SIGHUP raise Terminated in the main thread, so `finally` blocks remove partial files (the seal)
    and private folders (the audit)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise Terminated(f"signal {signum}")

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


# ---- the streaming pass -----------------------------------------------------------------------------------
def _open_file(package: Package, entry: _Entry, feed, progress: Progress, stop: threading.Event):
    """The first piece of one file from the reader thread, after checking the open file is the one discovery
    saw (size, modification time, inode); sets the member's mode. Returns the file's pieces."""
    recorded = package.files[entry.rel]
    piece = next(feed)
    if piece.error is not None:
        if isinstance(piece.error, FileNotFoundError) or piece.error.errno in (errno.ELOOP, errno.ENOTDIR):
            raise _Changed(entry.rel, "it vanished or was replaced after the check")
        raise UsageError(f"{entry.rel}: cannot read ({piece.error.strerror or piece.error})")
    opened = piece.opened
    if not _same_file(recorded, opened):
        raise _Changed(entry.rel, _what_changed(recorded, opened))
    entry.mode = 0o755 if opened.st_mode & 0o111 else 0o644
    return _pieces(entry, piece, feed, progress, stop)


def _pieces(entry: _Entry, piece, feed, progress: Progress, stop: threading.Event):
    while True:
        if stop.is_set():
            raise _Cancelled()  # a large file is not read to its end once the seal is abandoned
        if len(piece.data):
            progress.advance("seal", len(piece.data))
            yield piece.data
        if piece.last:
            entry.sha256 = piece.sha256 or ""
            return
        piece = next(feed)
        if piece.error is not None:
            raise UsageError(f"{entry.rel}: cannot read ({piece.error.strerror or piece.error})")


def _same_file(recorded, now: os.stat_result) -> bool:
    """Size, modification time and inode as discovery recorded them; and the inode change time when discovery
    records it (`ctime_ns`): a rewrite that restores size and mtime (utime) still moves the ctime."""
    ctime = getattr(recorded, "ctime_ns", None)
    return ((now.st_size, now.st_mtime_ns, now.st_ino) == (recorded.size, recorded.mtime_ns, recorded.inode)
            and (ctime is None or now.st_ctime_ns == ctime))


def _what_changed(recorded, now: os.stat_result) -> str:
    if now.st_ino != recorded.inode:
        return "it was replaced by another file after the check"
    if now.st_size != recorded.size:
        return f"its size changed after the check ({recorded.size} -> {now.st_size} bytes)"
    return "it was modified after the check"


def _still_same(package: Package, rel: str) -> str | None:
    """Why a file is no longer the one discovery saw, or None."""
    recorded = package.files[rel]
    try:
        now = os.stat(package.os_path(rel), follow_symlinks=False)
    except FileNotFoundError:
        return "it vanished after the check"
    except OSError:
        return None
    if not stat.S_ISREG(now.st_mode) or not _same_file(recorded, now):
        return _what_changed(recorded, now)
    return None


class _Cancelled(Exception):
    """The seal was abandoned (the checks found an error, or the run was interrupted)."""


def _write_package_members(package: Package, campaign_id: str, plan: list[_Entry], writer, progress: Progress,
                           stop: threading.Event) -> tuple[dict[str, str], list[tuple]]:
    """Every package member, in order; returns the digests by path and the member list for the read-back."""
    files = [e for e in plan if e.kind == "file"]
    feeder = FileFeeder([(package.os_path(e.rel), e.size) for e in files])
    feed = iter(feeder)
    digests: dict[str, str] = {}
    expected: list[tuple] = []
    try:
        for entry in plan:
            if stop.is_set():
                raise _Cancelled()
            name = f"{campaign_id}/{entry.rel}" if entry.rel else campaign_id
            if entry.kind == "directory":
                writer.add_directory(name, mode=entry.mode, mtime=entry.mtime)
                expected.append((name + "/", "directory", 0, ""))
            elif entry.kind == "symlink":
                writer.add_symlink(name, entry.target, mtime=entry.mtime)
                expected.append((name, "symlink", 0, entry.target))
            else:
                try:
                    pieces = _open_file(package, entry, feed, progress, stop)
                    writer.add_file(name, entry.size, pieces, mode=entry.mode, mtime=entry.mtime, hash_data=False)
                except SizeChanged as exc:
                    raise _Changed(entry.rel, f"its size changed while it was sealed ({exc})") from None
                digests[entry.rel] = entry.sha256
                expected.append((name, "file", entry.size, entry.sha256))
    finally:
        feeder.close()
    return digests, expected


def _write_seal_members(writer, campaign_id: str, digests: dict[str, str], expected: list[tuple],
                        extra: dict[str, bytes]) -> None:
    """SEAL/ last: SHA256SUMS is the product of the pass, then the workflow's own members; then the end."""
    now = int(time.time())
    writer.add_directory(f"{campaign_id}/{SEAL_DIR}", mtime=now)
    expected.append((f"{campaign_id}/{SEAL_DIR}/", "directory", 0, ""))
    for member, data in extra.items():
        digests[member] = hashlib.sha256(data).hexdigest()
    sums = format_sums(digests)
    for member, data in sorted({SUMS: sums, **extra}.items(), key=lambda kv: _sort_key(kv[0])):
        digest = writer.add_bytes(f"{campaign_id}/{member}", data, mtime=now)
        expected.append((f"{campaign_id}/{member}", "file", len(data), digest))
    writer.close()


def _unchanged_since_discovery(package: Package, digests: dict[str, str]) -> None:
    """After the pass (and the checks, which may have run beside it): every file still has the size, times and
    inode discovery recorded, so what the checks read is what was sealed; and a digest a check computed equals
    the sealed one. Raises _Changed for the first that differs."""
    for rel in sorted(package.files):
        checked = package.digests.get(rel)
        if checked is not None and rel in digests and checked != digests[rel]:
            raise _Changed(rel, "its content differs from what the checks read")
        if (reason := _still_same(package, rel)) is not None:
            raise _Changed(rel, reason.replace("after the check", "while it was sealed"))


def _refuse_changed(package: Package, changed: _Changed) -> SealRefused:
    """IV704 for the file that changed, plus any other file whose stat data no longer matches."""
    problems = [("changed", changed.rel, changed.reason)]
    for rel in sorted(package.files):
        if rel != changed.rel and (reason := _still_same(package, rel)) is not None:
            problems.append(("changed", rel, reason))
    return SealRefused("files changed between the check and the seal", problems)


# ---- the seal ---------------------------------------------------------------------------------------------
class Sealing:
    """One seal of `package` into `destination` (SPEC §3), in two steps so that the checks can run beside it:
    start() streams the package members into the partial archive on a thread; finish(members) adds SEAL/,
    reads the archive back, and publishes it; cancel() drops it (the partial file is removed).

    Checking a destination or a plan that cannot work raises here, before anything is written: UsageError
    (exit 2) or SealRefused (findings)."""

    def __init__(self, package: Package, campaign_id: str, destination: Path, *, overwrite: bool = False,
                 level: int = 3, threads: int = 0, progress: Progress = NULL_PROGRESS):
        destination = Path(destination)
        if not campaign_id or campaign_id in (".", "..") or any(c in campaign_id for c in "/\\\0"):
            raise UsageError(f"{campaign_id!r} cannot name the archive's top folder")
        _check_destination(package, destination, overwrite)
        self.package, self.campaign_id, self.destination = package, campaign_id, destination
        self.overwrite, self.level, self.threads, self.progress = overwrite, level, threads, progress
        self.plan = plan_members(package)
        self.partial = partial_path(destination)
        self.sums_partial = partial_path(destination, ".sha256")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._output = self._writer = None
        self._result: tuple | None = None
        self._failure: BaseException | None = None
        self._done = False

    def start(self) -> "Sealing":
        remove_stale_partials(self.destination)
        self.started = time.monotonic()
        self.progress.start("seal", f"sealing {self.destination.name}", total=sum(e.size for e in self.plan),
                            unit="B")
        try:
            self._output = _open_output(self.partial)
            self._writer = ArchiveWriter(self._output, level=self.level, threads=self.threads)
            self._thread = threading.Thread(target=self._write_package, name="seal", daemon=True)
            self._thread.start()
        except OSError as exc:
            self.cancel()
            raise UsageError(f"{self.destination}: cannot write the archive ({exc.strerror or exc})") from exc
        except BaseException:  # Ctrl-C or SIGTERM right after the partial file appeared
            self.cancel()
            raise
        return self

    def _write_package(self) -> None:
        try:
            self._result = _write_package_members(self.package, self.campaign_id, self.plan, self._writer,
                                                  self.progress, self._stop)
        except BaseException as exc:  # noqa: BLE001 - handed to finish(), never lost in the thread
            self._failure = exc

    def finish(self, members: dict[str, bytes]) -> dict:
        """Add SEAL/ (`members`: SEAL/<name> -> bytes), verify, publish. Returns the report's `archive` object.
        Raises SealRefused (IV704 ...) or UsageError (disk full, unreadable file); the partial file is gone then."""
        _check_extra_members(members)
        try:
            with termination_unwinds():
                # Bounded waits: a Ctrl-C or SIGTERM the kernel hands to another thread runs its handler only
                # when this (main) thread wakes.
                while self._thread.is_alive():
                    self._thread.join(SIGNAL_POLL_SECONDS)
                if self._failure is not None:
                    raise self._failure
                digests, expected = self._result
                _unchanged_since_discovery(self.package, digests)
                _write_seal_members(self._writer, self.campaign_id, digests, expected, members)
                self._output.flush()
                os.fsync(self._output.fileno())
                self.progress.finish("seal")
                sealed_at = time.monotonic()
                archive_sha256, archive_bytes = _read_back(self.partial, expected, self._writer.frames,
                                                           self.progress)
                published_at = time.monotonic()
                write_checksum_file(self.sums_partial, archive_sha256, self.destination.name)
                publish(self.partial, self.destination, self.overwrite)
                checksum_file = self.destination.with_name(self.destination.name + ".sha256")
                os.replace(self.sums_partial, checksum_file)
                fsync_folder(self.destination.parent)
                self._done = True
        except _Changed as changed:
            raise _refuse_changed(self.package, changed) from None
        except FileExistsError:
            raise UsageError(f"{self.destination}: already exists (use --overwrite to replace it)") from None
        except OSError as exc:
            raise UsageError(f"{self.destination}: cannot write the archive ({exc.strerror or exc})") from exc
        finally:
            if not self._done:
                self.cancel()
        writer = self._writer
        return {
            "path": str(self.destination), "sha256": archive_sha256, "bytes": archive_bytes,
            "sha256_file": str(checksum_file),
            "members": len(expected), "files": len(digests), "uncompressed_bytes": writer.tar_bytes,
            "level": self.level, "threads": worker_count(self.threads), "fast_files": writer.fast_files,
            "frames": len(writer.frames),
            "seconds": round(time.monotonic() - self.started, 3), "write_seconds": round(sealed_at - self.started, 3),
            "verify_seconds": round(published_at - sealed_at, 3),
        }

    def cancel(self) -> None:
        """Stop the pass and remove the partial files; safe to call at any point, more than once."""
        self._stop.set()
        if not self._done:  # first: an interrupted run must not leave it even if the threads take a moment
            for leftover in (self.partial, self.sums_partial):
                leftover.unlink(missing_ok=True)
        thread = self._thread
        if thread is not None and thread.ident is not None and thread is not threading.current_thread():
            thread.join()  # (ident is None: interrupted before the thread ever started)
        if self._writer is not None:
            self._writer.abandon()
        if self._output is not None:
            self._output.close()
        self.progress.finish("seal")


def seal_package(package: Package, campaign_id: str, members: dict[str, bytes], destination: Path, *,
                 overwrite: bool = False, level: int = 3, threads: int = 0,
                 progress: Progress = NULL_PROGRESS) -> dict:
    """Seal `package` into `destination` in one go (SPEC §3). Returns the report's `archive` object.
    Raises SealRefused (findings) or UsageError (exit 2: destination exists, disk full, unreadable file)."""
    _check_extra_members(members)  # before anything is written
    sealing = Sealing(package, campaign_id, destination, overwrite=overwrite, level=level, threads=threads,
                      progress=progress)
    with termination_unwinds():
        try:
            sealing.start()
            return sealing.finish(members)
        finally:
            sealing.cancel()  # a no-op once published


def _check_extra_members(members: dict[str, bytes]) -> None:
    if any(not name.startswith(SEAL_DIR + "/") or name == SUMS for name in members):
        raise ValueError("extra members must be SEAL/<name> and not SEAL/SHA256SUMS")


def _read_back(partial: Path, expected: list[tuple], frames, progress: Progress) -> tuple[str, int]:
    progress.start("seal-verify", "verifying the archive", total=sum(e[2] for e in expected), unit="B")
    try:
        return read_back(partial, expected, frames, on_bytes=lambda n: progress.advance("seal-verify", n))
    except ArchiveError as exc:
        raise UsageError(f"read-back verification of the archive failed: {exc}; nothing was sealed") from exc
    finally:
        progress.finish("seal-verify")
