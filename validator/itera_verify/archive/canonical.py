"""What the seal writes, known in this one place (docs/format.md, "The archive is canonical").

The seal's writer builds every header with `header()`; the audit's reader rebuilds, for every member it reads,
the header the seal would have written for it and compares the two byte for byte (`difference()`). The seal
writes one top folder (a name of letters, digits, `.`, `_`, `-`, never starting with a dot), first; under it
folders (0755), regular files (0644, or 0755 when executable) and symbolic links (0777), uid/gid 0 and no
user or group names, whole-second times, ustar when the member fits and otherwise the PAX records of
tarheader.py. It never writes a hard link, a device or a fifo: a hard link's target names a path outside the
member, which GNU tar resolves its own way (a target ending in `/` it cannot link at all). Anything else differs
from what the seal writes in some field GNU tar restores (a setuid bit, an owner, a world-writable folder, a
top folder `.local` or `.ssh` in the reviewer's home) and is refused before anything is written for it.
"""
from __future__ import annotations

import hashlib
import json
import re
from typing import Iterable

from ..format.names import ID
from .errors import ArchiveError
from .tarheader import BLOCK, DIRECTORY, REGULAR, SYMLINK, tar_header

TOP_FOLDER = ID  # the manifest's campaign_id pattern: never a dot folder such as .local or .ssh
FILE_MODES = (0o644, 0o755)
DIRECTORY_MODE = 0o755
SYMLINK_MODE = 0o777
MODES = {REGULAR: FILE_MODES, DIRECTORY: (DIRECTORY_MODE,), SYMLINK: (SYMLINK_MODE,)}
_KINDS = {REGULAR: "file", DIRECTORY: "folder", SYMLINK: "symbolic link", b"1": "hard link",
          b"3": "character device", b"4": "block device", b"6": "fifo"}
_SPECIAL_BITS = ((0o4000, "setuid"), (0o2000, "setgid"), (0o1000, "sticky"), (0o002, "world-writable"))
# The ustar fields after the mode (checked first), as they are named in a finding; numbers are shown decoded.
_FIELDS = (("uid", 108, 116, True), ("gid", 116, 124, True), ("owner name", 265, 297, False),
           ("group name", 297, 329, False), ("name field", 0, 100, False), ("link name field", 157, 257, False),
           ("size field", 124, 136, True), ("time field", 136, 148, True), ("mode field", 100, 108, True),
           ("magic", 257, 265, False), ("device major", 329, 337, False), ("device minor", 337, 345, False),
           ("name prefix", 345, 500, False), ("checksum field", 148, 156, False), ("padding", 500, 512, False))
_PAX_KEY = re.compile(rb"[0-9]+ ([^=\n]*)=")


class NotCanonical(ArchiveError):
    """The archive does not start with a top folder the seal writes: nothing is extracted. `member`: its name."""

    kind = "canonical"

    def __init__(self, why: str, member: str):
        super().__init__(why)
        self.why, self.member = why, member


def file_mode(st_mode: int) -> int:
    """The mode the seal writes for a regular file: 0755 when any execute bit is set, else 0644."""
    return 0o755 if st_mode & 0o111 else 0o644


def header(name: str, kind: bytes, *, size: int = 0, mode: int | None = None, mtime: int = 0,
           linkname: str = "") -> bytes:
    """The header block(s) the seal writes for one member. ValueError for a member it never writes."""
    allowed = MODES.get(kind)
    if allowed is None:
        raise ValueError(f"the seal never writes a {_KINDS.get(kind, kind)}")
    mode = allowed[0] if mode is None else mode
    if mode not in allowed or (kind == DIRECTORY) != name.endswith("/") or (kind == SYMLINK) != bool(linkname):
        raise ValueError(f"not a member the seal writes: {name!r} {kind!r} mode {mode:o}")
    return tar_header(name, kind, size=size, mode=mode, mtime=mtime, linkname=linkname)


# One member as its header says it: (name as in the header, a folder's ending in /; kind: file, directory or
# symlink as archive/reader.py names it; size; mode; mtime; link target). Every field GNU tar restores.
HeaderFacts = tuple[str, str, int, int, int, str]


def member_listing(members: Iterable[HeaderFacts]) -> tuple[int, str]:
    """(count, SHA-256) of the listing of `members` in archive order: one line per member, the JSON array
    `[name, kind, size, mode, mtime, link target]` (ASCII, no spaces). Since every header the audit accepts is
    the one `header()` builds from exactly these fields, two archives with one listing have the same headers; a
    signed statement that holds the listing's digest binds every folder, link, mode and time (docs/format.md)."""
    digest, count = hashlib.sha256(), 0
    for name, kind, size, mode, mtime, linkname in members:
        digest.update(json.dumps([name, kind, size, mode, mtime, linkname], ensure_ascii=True,
                                 separators=(",", ":")).encode("ascii") + b"\n")
        count += 1
    return count, digest.hexdigest()


def top_folder_problem(name: str, kind: bytes) -> str | None:
    """Why the archive's first member is not a top folder the seal writes, or None."""
    top = name.split("/", 1)[0]
    if not TOP_FOLDER.fullmatch(top):
        return (f"the archive's top folder {top[:80]!r} is not a name the seal writes (letters, digits, `.`, `_`, "
                "`-`, not starting with a dot: a campaign id)")
    if kind != DIRECTORY or name != top + "/":
        return f"the archive does not start with its top folder {top}/ (the seal writes it first)"
    return None


def difference(raw: bytes, name: str, kind: bytes, size: int, mode: int, mtime: int, linkname: str) -> str | None:
    """Why `raw`, a member's header block(s) as read (its extended header first), is not what the seal writes for
    a member of this name, type, size, time and link, or None when it is exactly that."""
    allowed = MODES.get(kind)
    if allowed is None:
        return f"a {_KINDS.get(kind, repr(kind))}, which the seal never writes"
    if mode not in allowed:
        bits = [label for bit, label in _SPECIAL_BITS if mode & bit]
        return (f"mode {mode:04o}{' (' + ', '.join(bits) + ')' if bits else ''}: the seal writes "
                f"{' or '.join(f'{m:04o}' for m in allowed)} for a {_KINDS[kind]}")
    expected = tar_header(name, kind, size=size, mode=mode, mtime=mtime, linkname=linkname)
    if raw == expected:
        return None
    if raw[:-BLOCK] != expected[:-BLOCK]:
        keys = sorted(k.decode("utf-8", "replace") for k in _PAX_KEY.findall(raw[BLOCK:-BLOCK]))
        wanted = sorted(k.decode() for k in _PAX_KEY.findall(expected[BLOCK:-BLOCK]))
        if keys == wanted:
            return "an extended header not written as the seal writes it"
        return (f"extended header records {', '.join(keys) or 'none'} where the seal writes "
                f"{', '.join(wanted) or 'none'}")
    got, want = raw[-BLOCK:], expected[-BLOCK:]
    for label, start, end, numeric in _FIELDS:
        if got[start:end] != want[start:end]:
            return f"{label} {_shown(got[start:end], numeric)} where the seal writes {_shown(want[start:end], numeric)}"
    return "a header the seal would not write"  # unreachable: every byte belongs to a field above


def _shown(field: bytes, numeric: bool) -> str:
    text = field.rstrip(b"\0 ")
    if numeric and text.isdigit() and not text.strip(b"01234567"):
        return str(int(text, 8))
    if not text:
        return "none"
    return repr(text.decode("utf-8", "replace"))[:60]
