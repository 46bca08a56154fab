"""Whether a file is still the one discovery saw: checked as each file is opened for the seal, and again for
every file once the pass (and the checks beside it) are done. A difference is IV704: nothing is sealed."""
from __future__ import annotations

import os
import stat

from ..package import RunContext
from .plan import SealRefused


class Changed(Exception):
    """`rel` is no longer the file discovery saw; `reason` says how (IV704)."""

    def __init__(self, rel: str, reason: str):
        super().__init__(reason)
        self.rel, self.reason = rel, reason


def same_file(recorded, now: os.stat_result) -> bool:
    """Size, modification time and inode as discovery recorded them; and the inode change time when discovery
    records it (`ctime_ns`): a rewrite that restores size and mtime (utime) still moves the ctime."""
    ctime = getattr(recorded, "ctime_ns", None)
    return ((now.st_size, now.st_mtime_ns, now.st_ino) == (recorded.size, recorded.mtime_ns, recorded.inode)
            and (ctime is None or now.st_ctime_ns == ctime))


def what_changed(recorded, now: os.stat_result) -> str:
    if now.st_ino != recorded.inode:
        return "it was replaced by another file after the check"
    if now.st_size != recorded.size:
        return f"its size changed after the check ({recorded.size} -> {now.st_size} bytes)"
    return "it was modified after the check"


def _still_same(ctx: RunContext, rel: str) -> str | None:
    """Why a file is no longer the one discovery saw, or None."""
    recorded = ctx.inventory.files[rel]
    try:
        now = os.stat(ctx.inventory.os_path(rel), follow_symlinks=False)
    except FileNotFoundError:
        return "it vanished after the check"
    except OSError:
        return None
    if not stat.S_ISREG(now.st_mode) or not same_file(recorded, now):
        return what_changed(recorded, now)
    return None


def unchanged_since_discovery(ctx: RunContext, digests: dict[str, str]) -> None:
    """After the pass (and the checks, which may have run beside it): every file still has the size, times and
    inode discovery recorded, so what the checks read is what was sealed; and a digest a check computed equals
    the sealed one. Raises Changed for the first that differs."""
    for rel in sorted(ctx.inventory.files):
        checked = ctx.documents.digests.get(rel)
        if checked is not None and rel in digests and checked != digests[rel]:
            raise Changed(rel, "its content differs from what the checks read")
        if (reason := _still_same(ctx, rel)) is not None:
            raise Changed(rel, reason.replace("after the check", "while it was sealed"))


def refuse_changed(ctx: RunContext, changed: Changed) -> SealRefused:
    """IV704 for the file that changed, plus any other file whose stat data no longer matches."""
    problems = [("changed", changed.rel, changed.reason)]
    for rel in sorted(ctx.inventory.files):
        if rel != changed.rel and (reason := _still_same(ctx, rel)) is not None:
            problems.append(("changed", rel, reason))
    return SealRefused("files changed between the check and the seal", problems)
