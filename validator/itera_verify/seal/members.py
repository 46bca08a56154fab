"""The members of the streaming pass, in plan order: the package's files as the feeder thread reads them, each
checked against discovery as it is opened, then SEAL/ (SHA256SUMS and the workflow's own members)."""
from __future__ import annotations

import errno
import hashlib
import threading
import time
from typing import Callable

from ..archive import FileFeeder, SizeChanged, format_sums
from ..archive.canonical import FILE_MODES, file_mode, member_listing
from ..format.names import OMS_SIGNATURE
from ..model import UsageError
from ..package import RunContext
from ..runtime.progress import Progress
from .changes import Changed, same_file, what_changed
from .plan import SEAL_DIR, SUMS, MemberEntry, archive_order


class _Cancelled(Exception):
    """The seal was abandoned (the checks found an error, or the run was interrupted)."""


def _open_file(ctx: RunContext, entry: MemberEntry, feed, progress: Progress, stop: threading.Event):
    """The first piece of one file from the reader thread, after checking the open file is the one discovery
    saw (size, modification time, inode); sets the member's mode. Returns the file's pieces."""
    recorded = ctx.inventory.files[entry.rel]
    piece = next(feed)
    if piece.error is not None:
        if isinstance(piece.error, FileNotFoundError) or piece.error.errno in (errno.ELOOP, errno.ENOTDIR):
            raise Changed(entry.rel, "it vanished or was replaced after the check")
        raise UsageError(f"{entry.rel}: cannot read ({piece.error.strerror or piece.error})")
    opened = piece.opened
    if not same_file(recorded, opened):
        raise Changed(entry.rel, what_changed(recorded, opened))
    entry.mode = file_mode(opened.st_mode)
    return _pieces(entry, piece, feed, progress, stop)


def _pieces(entry: MemberEntry, piece, feed, progress: Progress, stop: threading.Event):
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


def write_package_members(ctx: RunContext, campaign_id: str, plan: list[MemberEntry], writer, progress: Progress,
                          stop: threading.Event, expected=None) -> tuple[dict[str, str], list[tuple]]:
    """Every package member, in order; returns the digests by path and the member list for the read-back
    (`expected`, appended to as each member is written: a read-back may follow it, archive/follow.py)."""
    files = [e for e in plan if e.kind == "file"]
    feeder = FileFeeder([(ctx.inventory.os_path(e.rel), e.size) for e in files])
    feed = iter(feeder)
    digests: dict[str, str] = {}
    expected = [] if expected is None else expected
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
                    pieces = _open_file(ctx, entry, feed, progress, stop)
                    writer.add_file(name, entry.size, pieces, mode=entry.mode, mtime=entry.mtime, hash_data=False)
                except SizeChanged as exc:
                    raise Changed(entry.rel, f"its size changed while it was sealed ({exc})") from None
                digests[entry.rel] = entry.sha256
                expected.append((name, "file", entry.size, entry.sha256))
    finally:
        feeder.close()
    return digests, expected


def write_seal_members(writer, campaign_id: str, digests: dict[str, str], expected: list[tuple],
                       extra: dict[str, bytes], sign: Callable[..., dict[str, bytes]] | None = None,
                       oms: Callable[[dict[str, str]], dict[str, bytes]] | None = None) -> None:
    """SEAL/ last: SHA256SUMS is the product of the pass, then the workflow's own members; with `oms`, the OMS
    signature over every other file but the statement pair, from their digests (seal/oms.py); with `sign`, the
    signed statement, which binds SHA256SUMS, the report, model.sig and the listing of every member's header
    (format/statement.py: neither statement member is in SHA256SUMS or the listing); then the end."""
    now = int(time.time())
    writer.add_directory(f"{campaign_id}/{SEAL_DIR}", mtime=now)
    expected.append((f"{campaign_id}/{SEAL_DIR}/", "directory", 0, ""))
    for member, data in extra.items():
        digests[member] = hashlib.sha256(data).hexdigest()
    sums = format_sums(digests)
    seal = {SUMS: sums, **extra}
    if oms is not None:  # before the statement, which binds it
        seal.update(oms({**digests, SUMS: hashlib.sha256(sums).hexdigest()}))
    if sign is not None:
        # The headers add_bytes will write for the SEAL/ files below (mode and time as there), in archive order.
        planned = [(f"{campaign_id}/{member}", "file", len(data), FILE_MODES[0], now, "")
                   for member, data in sorted(seal.items(), key=lambda kv: archive_order(kv[0]))]
        seal.update(sign(sums, model_signature=seal.get(OMS_SIGNATURE),
                         members=member_listing([*writer.headers, *planned])))
    for member, data in sorted(seal.items(), key=lambda kv: archive_order(kv[0])):
        digest = writer.add_bytes(f"{campaign_id}/{member}", data, mode=FILE_MODES[0], mtime=now)
        expected.append((f"{campaign_id}/{member}", "file", len(data), digest))
    writer.close()
