"""What a seal puts into the archive, in order, and what refuses a seal before anything is written.

Members are sorted by name (byte order); the package folder itself comes first. A link that stays inside the
package is stored as a link (an absolute or roundabout target rewritten relative); a link that leaves the
package or is broken, a fifo, socket or device, and a `SEAL/` the package already holds refuse the seal
(SealRefused). The workflow's extra members are SEAL/<name>, never SEAL/SHA256SUMS or the signed statement:
those are the seal's own.
"""
from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass
from pathlib import Path

from ..archive.canonical import DIRECTORY_MODE, FILE_MODES, SYMLINK_MODE
from ..archive.extract import Reserved
from ..package import RunContext

from ..format.names import RECORD, REPORT_PAGE, SEAL_DIR, SUMS  # noqa: F401  (REPORT_PAGE: handed over by flows/verify.py)
from ..format.names import OMS_SIGNATURE, SIGNATURE_MEMBERS, STATEMENT, STATEMENT_SIG
from ..format.sshsig import MAX_SIGNATURE_FILE
from ..format.statement import STATEMENT_MAX
# What the audit keeps out of the extracted tree: SEAL/ holds these members and nothing else; the two records are
# read in memory, up to 64 MiB each, and so are a signed seal's statement and its signatures (an OMS bundle lists
# every file: about 150 bytes each).
SEAL_LAYOUT = Reserved(SEAL_DIR, {SUMS: 64 << 20, RECORD: 64 << 20, STATEMENT: STATEMENT_MAX,
                                  STATEMENT_SIG: MAX_SIGNATURE_FILE, OMS_SIGNATURE: 64 << 20},
                       frozenset({SUMS, RECORD, REPORT_PAGE, *SIGNATURE_MEMBERS}))


class SealRefused(Exception):
    """Nothing was sealed because of the package's content. `problems`: (kind, package path, detail) facts;
    the workflow hands them to rules/archive.py, which makes the findings (IV703, IV704, IV706)."""

    def __init__(self, message: str, problems: list[tuple[str, str, str]]):
        super().__init__(message)
        self.problems = problems


@dataclass
class MemberEntry:
    rel: str  # package-relative ("" for the package folder itself)
    kind: str  # directory | file | symlink
    mode: int = 0o644
    mtime: int = 0
    size: int = 0
    target: str = ""
    sha256: str = ""  # set when the file has been read


def archive_order(rel: str) -> bytes:
    return rel.encode("utf-8", "surrogateescape")


def _link_target(ctx: RunContext, rel: str) -> str:
    """The target to store: as written when it stays inside lexically, else rewritten relative."""
    link = ctx.inventory.links[rel]
    parent = posixpath.dirname(rel)
    if not posixpath.isabs(link.target):
        joined = posixpath.normpath(posixpath.join(parent, link.target))
        if joined != ".." and not joined.startswith("../"):
            return link.target
    inside = os.path.relpath(link.resolved, os.path.realpath(ctx.inventory.root)).replace(os.sep, "/")
    return posixpath.relpath(inside, parent or ".")


def plan_members(ctx: RunContext) -> list[MemberEntry]:
    """Every package member in archive order. Raises SealRefused for what cannot be sealed safely."""
    refused = []
    if any(p == SEAL_DIR or p.startswith(SEAL_DIR + "/") for p in
           (*ctx.inventory.files, *ctx.inventory.dirs, *ctx.inventory.links, *ctx.inventory.specials)):
        refused.append(("seal-folder", SEAL_DIR, ""))
    refused += [("special", rel, kind) for rel, kind in ctx.inventory.specials.items()]
    for rel, link in ctx.inventory.links.items():
        if link.broken or not link.inside:
            refused.append(("broken-link" if link.broken else "leaving-link", rel, link.target))
    if refused:
        raise SealRefused("the package holds entries that cannot be sealed", refused)
    # Modes as canonical.py says the seal writes them; a file's becomes 0755 when it is opened executable.
    entries = [MemberEntry("", "directory", DIRECTORY_MODE, _mtime(ctx.inventory.root))]
    entries += [MemberEntry(rel, "directory", DIRECTORY_MODE, _mtime(ctx.inventory.abspath(rel)))
                for rel in ctx.inventory.dirs]
    entries += [MemberEntry(rel, "file", FILE_MODES[0], f.mtime_ns // 1_000_000_000, f.size)
                for rel, f in ctx.inventory.files.items()]
    entries += [MemberEntry(rel, "symlink", SYMLINK_MODE, _mtime(ctx.inventory.abspath(rel)),
                            target=_link_target(ctx, rel)) for rel in ctx.inventory.links]
    return sorted(entries, key=lambda e: archive_order(e.rel))


def _mtime(path: Path) -> int:
    try:
        return int(os.lstat(path).st_mtime)
    except OSError:
        return 0


def check_extra_members(members: dict[str, bytes]) -> None:
    if any(not name.startswith(SEAL_DIR + "/") or name == SUMS or name in SIGNATURE_MEMBERS for name in members):
        raise ValueError("extra members must be SEAL/<name> and not SEAL/SHA256SUMS or the signed statement")
