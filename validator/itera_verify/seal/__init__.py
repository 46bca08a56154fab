"""Seal a checked package: one streaming pass into `<campaign_id>.tar.zst`, verified before it gets its name.

Layout (docs/format.md, The sealed archive): `<campaign_id>/` holds the package as it is, then `SEAL/SHA256SUMS`
and the extra members the workflow hands over (`SEAL/verification.json`, `SEAL/report.html`). Choices made here:

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
- The archive is written to `.<name>.<pid>.<random>.partial` beside the destination, read back and verified
  member by member against what was hashed, synced, then linked to its final name (never clobbering an archive
  that appeared meanwhile unless --overwrite). Where the file system allows, the writing and the read-back both go
  past the page cache (O_DIRECT, archive/direct.py): the read-back then checks the bytes the device holds, not a
  cached copy. It follows the writing (archive/follow.py): each frame is read back once it is in the file, so
  the read-back's decompression and hashing run beside the compression, not after it. Any exception, Ctrl-C or
  SIGTERM removes the partial file; after a kill -9 it stays under its partial name and the next seal in that
  folder removes it.
- A follower (push/follow.py, for `--push`) may read the partial archive while it is written: the writer
  tells it how many bytes are final (archive/output.WrittenBytes), the read-back gives it every byte of the
  file as it hashes them (its CRC64NVME, no second read), it hears when the archive is published, and a seal
  that does not publish abandons it (its upload is aborted).
"""
from __future__ import annotations

import os
import threading
import time
from functools import partial
from pathlib import Path

from ..archive import ArchiveError, ArchiveWriter, worker_count
from ..archive.canonical import TOP_FOLDER
from ..archive.direct import DirectWriter
from ..archive.follow import FollowedFrames, Growing, Stopped
from ..archive.output import WrittenBytes
from ..archive.publish import (fsync_folder, partial_path, publish, read_back, remove_stale_partials,
                              write_checksum_file)
from ..runtime.launcher import Terminated, join_thread, termination_unwinds
from ..model import UsageError
from ..package import RunContext, inside_package
from ..runtime.progress import NULL_PROGRESS, Progress
from .changes import Changed, refuse_changed, unchanged_since_discovery
from .members import write_package_members, write_seal_members
from .plan import RECORD, SealRefused, check_extra_members, plan_members
from .sign import Signers, signed_members, write_signature_file
from ..format.names import ARCHIVE_SIG_SUFFIX

# What the workflows and the tests import from here; the plan, the change checks and the members are submodules.
__all__ = ["SealRefused", "Sealing", "Terminated", "plan_members", "seal_package", "termination_unwinds"]


# ---- safety around the destination ------------------------------------------------------------------------
def _check_destination(ctx: RunContext, destination: Path, overwrite: bool) -> None:
    folder = destination.parent
    if not folder.is_dir():
        raise UsageError(f"{folder}: no such folder for the archive")
    if inside_package(ctx.inventory.root, folder):  # the guard --report uses too
        raise UsageError(f"{destination}: the archive cannot be written inside the package folder")
    if destination.is_dir():
        raise UsageError(f"{destination}: is a folder")
    if destination.exists() and not overwrite:
        raise UsageError(f"{destination}: already exists (use --overwrite to replace it)")


def _open_output(path: Path):
    """The partial archive file, written past the page cache where the file system allows (archive/direct.py);
    tests replace this to inject a full disk."""
    return DirectWriter.create(path)


# ---- the seal ---------------------------------------------------------------------------------------------
class Sealing:
    """One seal of `package` into `destination` (docs/format.md, The sealed archive), in two steps so that the
    checks can run beside it: start() streams the package members into the partial archive on a thread;
    finish(members) adds SEAL/, reads the archive back, and publishes it; cancel() drops it (the partial file is
    removed).

    Checking a destination or a plan that cannot work raises here, before anything is written: UsageError
    (exit 2) or SealRefused (findings).

    `follower`: an object with begin(partial, written, name, bound, estimate), tap(bytes), sealed(path, sha256, size)
    and abandon() (push/follow.SealFollower): it reads the archive as it is written (module docstring)."""

    def __init__(self, ctx: RunContext, campaign_id: str, destination: Path, *, overwrite: bool = False,
                 level: int = 3, threads: int = 0, progress: Progress = NULL_PROGRESS, follower=None):
        destination = Path(destination)
        if not TOP_FOLDER.fullmatch(campaign_id):  # the only top folders the audit accepts
            raise UsageError(f"{campaign_id!r} cannot name the archive's top folder (use letters, digits, '.', "
                             "'_' and '-', not starting with a dot)")
        _check_destination(ctx, destination, overwrite)
        self.package, self.campaign_id, self.destination = ctx, campaign_id, destination
        self.overwrite, self.level, self.threads, self.progress = overwrite, level, threads, progress
        self.plan = plan_members(ctx)
        self.partial = partial_path(destination)
        self.sums_partial = partial_path(destination, ".sha256")
        self.sig_partial = partial_path(destination, ARCHIVE_SIG_SUFFIX)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._output = self._writer = None
        self._result: tuple | None = None
        self._failure: BaseException | None = None
        self._done = False
        self.follower = follower
        self.written = WrittenBytes()  # what the read-back (and a push following the seal) may read
        self.expected = Growing()  # the members written so far, for the read-back
        self._verifying: threading.Thread | None = None
        self._verified: tuple | BaseException | None = None
        self._verify_lock = threading.Lock()
        self._verified_bytes, self._verify_shown = 0, False

    def start(self) -> "Sealing":
        remove_stale_partials(self.destination)
        self.started = time.monotonic()
        self.progress.start("seal", f"sealing {self.destination.name}", total=sum(e.size for e in self.plan),
                            unit="B")
        try:
            self._output = _open_output(self.partial)
            self._writer = ArchiveWriter(self._output, level=self.level, threads=self.threads, written=self.written)
            self._thread = threading.Thread(target=self._write_package, name="seal", daemon=True)
            self._thread.start()
            # The follower second (it reads the file from its first byte whenever it begins): what it still
            # has to set up then overlaps the seal's first frames.
            if self.follower is not None:  # a bound on the archive's size (headers, padding, SEAL/): its part size
                tar = sum(entry.size + 1536 for entry in self.plan)
                writer = self._writer  # the final size, guessed from the ratio so far (the deadline's prediction)
                self.follower.begin(self.partial, self.written, self.destination.name,
                                    tar + tar // 64 + (64 << 20),
                                    lambda: writer.output.bytes * tar // max(writer.tar_bytes, 1))
            # The read-back last: it follows the writer from the file's first frame (archive/follow.py).
            self._verifying = threading.Thread(target=self._read_back, name="seal-verify", daemon=True)
            self._verifying.start()
        except OSError as exc:
            self.cancel()
            raise UsageError(f"{self.destination}: cannot write the archive ({exc.strerror or exc})") from exc
        except BaseException:  # Ctrl-C or SIGTERM right after the partial file appeared
            self.cancel()
            raise
        return self

    def _write_package(self) -> None:
        try:
            self._result = write_package_members(self.package, self.campaign_id, self.plan, self._writer,
                                                 self.progress, self._stop, self.expected)
        except BaseException as exc:  # noqa: BLE001 - handed to finish(), never lost in the thread
            self._failure = exc

    def _read_back(self) -> None:
        try:
            self._verified = _read_back(self.partial, self.expected,
                                        FollowedFrames(self._writer.frames, self.written, self._stop),
                                        self._count_verified,
                                        self.follower.tap if self.follower is not None else None)
        except BaseException as exc:  # noqa: BLE001 - handed to finish(), never lost in the thread
            self._verified = exc

    def _count_verified(self, count: int) -> None:
        with self._verify_lock:
            self._verified_bytes += count
            if self._verify_shown:
                self.progress.advance("seal-verify", count)

    def _show_read_back(self) -> None:
        """The read-back's progress, from where it is: it began with the writing."""
        total = sum(member[2] for member in self.expected)
        with self._verify_lock:
            self.progress.start("seal-verify", "verifying the archive", total=total, unit="B")
            self.progress.advance("seal-verify", self._verified_bytes)
            self._verify_shown = True

    def _read_back_result(self) -> tuple[str, int]:
        """(sha256, bytes) of the archive as read back from the device, once the read-back is done."""
        try:
            join_thread(self._verifying)  # bounded waits: a Ctrl-C or SIGTERM runs its handler meanwhile
        except BaseException:
            self.progress.abandon("seal-verify", "stopped, nothing sealed")
            raise
        verified = self._verified
        if isinstance(verified, ArchiveError):
            self.progress.abandon("seal-verify", "FAILED, nothing sealed")
            raise UsageError(f"read-back verification of the archive failed: {verified}; nothing was sealed") \
                from verified
        if isinstance(verified, BaseException) or verified is None:
            self.progress.abandon("seal-verify", "stopped, nothing sealed")
            raise verified if isinstance(verified, BaseException) else Stopped()
        self.progress.finish("seal-verify")
        return verified

    def finish(self, members: dict[str, bytes], signers: "Signers | None" = None) -> dict:
        """Add SEAL/ (`members`: SEAL/<name> -> bytes), verify, publish. Returns the report's `archive` object.
        With an SSH key in `signers` (seal/sign.py), SEAL/ also holds the signed statement and `<archive>.sig` is
        written beside the archive before the archive gets its name; with an OMS key, SEAL/model.sig
        (seal/oms.py). Raises SealRefused (IV704 ...) or UsageError (disk full, unreadable file, an agent that
        refuses); the partial files are gone then."""
        check_extra_members(members)
        signer = signers.ssh if signers is not None else None
        oms_signer = signers.oms if signers is not None else None
        sign = oms = None
        if signer is not None:
            sign = partial(signed_members, signer, self.campaign_id, record=members.get(RECORD))
        if oms_signer is not None:
            oms = partial(oms_signer.members, self.campaign_id, links=list(self.package.inventory.links),
                          statement=signer is not None)
        signature_file = self.destination.with_name(self.destination.name + ARCHIVE_SIG_SUFFIX)
        try:
            with termination_unwinds():
                join_thread(self._thread)  # bounded waits: a Ctrl-C or SIGTERM runs its handler meanwhile
                if self._failure is not None:
                    raise self._failure
                digests, expected = self._result
                unchanged_since_discovery(self.package, digests)
                write_seal_members(self._writer, self.campaign_id, digests, expected, members, sign, oms)
                expected.close()
                self._output.flush()
                os.fsync(self._output.fileno())
                self.written.finish(self._writer.output.bytes)
                self.progress.finish("seal")
                sealed_at = time.monotonic()
                self._show_read_back()
                archive_sha256, archive_bytes = self._read_back_result()
                published_at = time.monotonic()
                write_checksum_file(self.sums_partial, archive_sha256, self.destination.name)
                signature = None
                if signer is not None:  # named first: the archive never has its name without its signature
                    write_signature_file(self.sig_partial, signer.sign("sha256", bytes.fromhex(archive_sha256)))
                    publish(self.sig_partial, signature_file, self.overwrite)
                    signature = {"path": str(signature_file), **signer.describe()}
                elif self.overwrite:  # an earlier archive's signature would not verify this one
                    signature_file.unlink(missing_ok=True)
                try:
                    publish(self.partial, self.destination, self.overwrite)
                except BaseException:
                    if signature is not None:
                        signature_file.unlink(missing_ok=True)
                    raise
                checksum_file = self.destination.with_name(self.destination.name + ".sha256")
                os.replace(self.sums_partial, checksum_file)
                fsync_folder(self.destination.parent)
                self._done = True
                if self.follower is not None:
                    self.follower.sealed(self.destination, archive_sha256, archive_bytes)
        except Changed as changed:
            raise refuse_changed(self.package, changed) from None
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
            **({"signature": signature} if signature is not None else {}),
            **({"model_signing": oms_signer.describe(self.campaign_id)} if oms_signer is not None else {}),
        }

    def cancel(self) -> None:
        """Stop the pass and remove the partial files; safe to call at any point, more than once."""
        self._stop.set()
        if not self._done:  # first: an interrupted run must not leave it even if the threads take a moment
            for leftover in (self.partial, self.sums_partial, self.sig_partial):
                leftover.unlink(missing_ok=True)
            self.written.fail()
            self.expected.fail()
            if self.follower is not None:
                self.follower.abandon()  # its upload is aborted: nothing was sealed
        for thread in (self._thread, self._verifying):
            if thread is not None and thread.ident is not None and thread is not threading.current_thread():
                thread.join()  # (ident is None: interrupted before the thread ever started)
        if self._writer is not None:
            self._writer.abandon()
        if self._output is not None:
            self._output.close()
        # After a publish, finish() ended the task already; otherwise nothing was sealed: never say "done".
        self.progress.abandon("seal", "stopped, nothing sealed")


def seal_package(ctx: RunContext, campaign_id: str, members: dict[str, bytes], destination: Path, *,
                 overwrite: bool = False, level: int = 3, threads: int = 0,
                 progress: Progress = NULL_PROGRESS, signer: "Signers | None" = None) -> dict:
    """Seal `package` into `destination` in one go (docs/format.md, The sealed archive).
    Returns the report's `archive` object. Raises SealRefused (findings) or UsageError (exit 2: destination
    exists, disk full, unreadable file)."""
    check_extra_members(members)  # before anything is written
    sealing = Sealing(ctx, campaign_id, destination, overwrite=overwrite, level=level, threads=threads,
                      progress=progress)
    with termination_unwinds():
        try:
            sealing.start()
            return sealing.finish(members, signer)
        finally:
            sealing.cancel()  # a no-op once published


def _read_back(partial: Path, expected: Growing, follow: FollowedFrames, on_bytes, tap=None) -> tuple[str, int]:
    """The archive read back from the device as it is written, member by member against `expected` (its
    SHA-256 and size); raises ArchiveError on any difference, Stopped when the seal is abandoned."""
    return read_back(partial, expected, on_bytes=on_bytes, tap=tap, follow=follow)
