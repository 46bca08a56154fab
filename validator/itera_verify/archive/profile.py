"""The one tar profile the reader accepts: what the seal's writer emits, read exactly as GNU tar 1.34 reads it.

A reviewer extracts the archive with GNU tar (`tar --zstd -xf`, or `zstd -dc | tar -x`). Wherever tar formats
leave room for two readings (GNU long names beside PAX names, global headers, sparse members, two extended
headers in a row, a regular file whose name ends in `/`, numbers GNU tar parses more leniently), a hostile
sender can make the audit see one set of members and GNU tar extract another. So anything the writer never
produces is refused before a member is reported, and the whole stream with it: after such a header nobody
knows where GNU tar thinks the next header starts. See docs/format.md, "The archive profile the audit accepts".

Accepted (every header block): ustar magic `ustar\\0` + version `00`, a header checksum GNU tar accepts,
numeric fields of octal digits then NULs or spaces only (no base-256, no leading NUL or space, no sign), an
empty prefix field, a name and link name NUL-padded after their text. Typeflags: `x` (PAX, before one member
only, with the keys the writer's `tarfile` PAX encoding emits), `0` (regular file: the only type with data),
`5` (directory), `2` (symlink), and `1`, `3`, `4`, `6` (hard link, devices, fifo: data-less, read so that the
extraction refuses them by name). Names: a directory's ends in `/`, no other member's does. Within this profile
canonical.py then accepts only the exact headers the seal writes (modes, owners, times, no hard links).
"""
from __future__ import annotations

import re

from .errors import ArchiveError, Corrupt

BLOCK = 512
MEMBER_KINDS = {b"0": "file", b"5": "directory", b"2": "symlink", b"1": "hardlink", b"3": "char-device",
                b"4": "block-device", b"6": "fifo"}
PAX = b"x"
# What tarfile.TarInfo.tobuf(PAX_FORMAT) emits for the writer's members: long or non-ASCII names and link
# targets, sizes of 8 GiB and more, modification times outside 0..8**11-1, and the charset flag for names that
# are not UTF-8. GNU tar reads each of them the same way (hdrcharset: it warns, then keeps the bytes).
PAX_KEYS = frozenset({"path", "linkpath", "size", "mtime", "hdrcharset"})
_OCTAL = re.compile(rb"[0-7]+[\0 ]*")
_DECIMAL = re.compile(r"0|[1-9][0-9]*")
_MTIME = re.compile(r"-?(0|[1-9][0-9]*)")
USTAR_MAGIC = b"ustar\x0000"
_NUMBERS = (("mode", 100, 108), ("uid", 108, 116), ("gid", 116, 124), ("size", 124, 136), ("mtime", 136, 148),
            ("checksum", 148, 156))
_DEVICE_NUMBERS = (("devmajor", 329, 337), ("devminor", 337, 345))
_WRITER_NUMBERS = re.compile(rb"(?:[0-7]{7}\0){3}(?:[0-7]{11}\0){2}[0-7]{6}\0 ")  # mode uid gid size mtime checksum
_NO_DEVICE_NO_PREFIX = bytes(500 - 329)


class OutsideProfile(ArchiveError):
    """A header the seal never writes and GNU tar may read differently: the whole archive is refused.
    `member`: the name of the member the header belongs to (as far as it can be told), `offset`: where."""

    kind = "profile"

    def __init__(self, why: str, member: str, offset: int):
        super().__init__(f"{why} (offset {offset})")
        self.why, self.member, self.offset = why, member, offset


def octal(field: bytes, what: str, offset: int, member: str) -> int:
    """A numeric field as the writer writes it: octal digits, then NULs or spaces. Everything else (GNU
    base-256, a leading NUL or space that GNU tar skips, a sign, Python's `_` digit separators) is refused."""
    if not _OCTAL.fullmatch(field):
        if field[:1] and field[0] & 0x80:
            raise OutsideProfile(f"a base-256 {what} field (the seal writes a PAX record instead)", member, offset)
        raise OutsideProfile(f"a {what} field that is not plain octal ({bytes(field[:12])!r})", member, offset)
    return int(field.rstrip(b"\0 "), 8)


def checksum_ok(header: bytes, stored: int) -> bool:
    unsigned = sum(header[:148]) + 256 + sum(header[156:])
    if stored == unsigned:
        return True
    # Old tars summed signed bytes; GNU tar accepts either sum (worked out only when needed: a Python loop per
    # header adds up over 20,000 members).
    signed = unsigned - 256 * sum(1 for b in header[:148] + header[156:] if b > 127)
    return stored == signed


def text(field: bytes, what: str, offset: int, member: str) -> str:
    """A NUL-padded text field: its text, then NULs only (GNU tar stops at the first NUL as well; bytes hidden
    behind it are not a real archive)."""
    value, _, rest = field.partition(b"\0")
    if rest.strip(b"\0"):
        raise OutsideProfile(f"bytes after the end of the {what} field's text", member, offset)
    return value.decode("utf-8", "surrogateescape")


def check_block(header: bytes, offset: int) -> tuple[bytes, int]:
    """The checks every header block passes, extended header or member. Returns (typeflag, size field)."""
    name = header[:100].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
    checksum = octal(header[148:156], "header checksum", offset, name)
    if not checksum_ok(header, checksum):
        raise Corrupt(f"bad tar header checksum at offset {offset}")
    typeflag = header[156:157]
    if typeflag != PAX and typeflag not in MEMBER_KINDS:
        what = {b"L": "a GNU long name", b"K": "a GNU long link name", b"g": "a global PAX header",
                b"S": "a GNU sparse member", b"\0": "the old regular-file typeflag NUL",
                b"7": "a contiguous file", b"X": "a Solaris extended header"}.get(typeflag)
        raise OutsideProfile(what or f"typeflag {typeflag!r}, which the seal never writes", name, offset)
    if header[257:265] != USTAR_MAGIC:
        raise OutsideProfile(f"not a POSIX ustar header (magic {bytes(header[257:265])!r})", name, offset)
    if _WRITER_NUMBERS.fullmatch(header, 100, 156):  # the writer's exact form first: one match per header
        size = int(header[124:135], 8)
    else:
        size = [octal(header[start:end], what, offset, name) for what, start, end in _NUMBERS][3]
    if header[329:500] == _NO_DEVICE_NO_PREFIX:
        return typeflag, size
    for what, start, end in _DEVICE_NUMBERS:
        if header[start:end].strip(b"\0"):
            octal(header[start:end], what, offset, name)
    if header[345:500].strip(b"\0"):
        prefix = header[345:500].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
        raise OutsideProfile("a ustar name prefix (the seal writes a PAX path instead)", f"{prefix}/{name}", offset)
    return typeflag, size


def parse_pax(data: bytes, offset: int = 0) -> dict[str, str]:
    """PAX records `<length> <key>=<value>\\n` filling the extended header exactly: a malformed record, an
    unknown or repeated key, a NUL in a value are refused (GNU tar stops at a NUL or a bad record; its GNU.sparse
    keys rename members)."""
    records: dict[str, str] = {}
    raw: dict[str, bytes] = {}
    pos = 0
    while pos < len(data):
        space = data.find(b" ", pos, pos + 21)
        if space < 0 or not data[pos:space].isdigit() or data[pos:pos + 1] == b"0":
            raise Corrupt("malformed PAX record")
        length = int(data[pos:space])
        record = data[space + 1: pos + length]
        if pos + length > len(data) or not record.endswith(b"\n") or b"=" not in record:
            raise Corrupt("malformed PAX record")
        key_bytes, _, value = record[:-1].partition(b"=")
        key = key_bytes.decode("utf-8", "surrogateescape")
        path = records.get("path", "")
        if key not in PAX_KEYS:
            raise OutsideProfile(f"the PAX key {key[:40]!r}, which the seal never writes", path, offset)
        if key in records:
            raise OutsideProfile(f"the PAX key {key!r} twice in one header", path, offset)
        if b"\0" in value:
            raise OutsideProfile(f"a NUL byte in the PAX {key} value (GNU tar stops there)", path, offset)
        raw[key] = value
        records[key] = value.decode("utf-8", "surrogateescape")
        pos += length
    _check_pax_values(records, raw, offset)
    return records


def _check_pax_values(records: dict[str, str], raw: dict[str, bytes], offset: int) -> None:
    path = records.get("path", "")
    for key in ("path", "linkpath"):
        if key in records and not records[key]:
            raise OutsideProfile(f"an empty PAX {key} (GNU tar ignores it and keeps the header's)", path, offset)
    if "size" in records and not _DECIMAL.fullmatch(records["size"]):
        raise OutsideProfile(f"a PAX size that is not a decimal number ({records['size'][:20]!r})", path, offset)
    if "mtime" in records and not (_MTIME.fullmatch(records["mtime"]) and -2 ** 63 <= int(records["mtime"]) < 2 ** 63):
        # GNU tar fails (exit 2) on a time outside its 64-bit range
        raise OutsideProfile(f"a PAX mtime the seal never writes ({records['mtime'][:20]!r})", path, offset)
    if "hdrcharset" in records and records["hdrcharset"] != "BINARY":
        raise OutsideProfile(f"the PAX hdrcharset {records['hdrcharset'][:20]!r}", path, offset)
    if "hdrcharset" not in records:
        for key in ("path", "linkpath"):
            try:
                raw.get(key, b"").decode("utf-8")
            except UnicodeDecodeError:
                raise OutsideProfile(f"a PAX {key} that is not UTF-8 without hdrcharset", path, offset) from None


def check_member(kind: str, name: str, size: int, linkname: str, records: dict[str, str], offset: int) -> None:
    """What a member's type says must agree with its name, size and link."""
    if kind == "directory" and not name.endswith("/"):
        raise OutsideProfile("a directory whose name does not end in /", name, offset)
    if kind != "directory" and name.endswith("/"):
        # GNU tar extracts a regular file named `x/` as a folder and reads its data as headers.
        raise OutsideProfile(f"a {kind} whose name ends in / (GNU tar makes it a directory)", name, offset)
    if kind != "file" and (size or "size" in records):
        raise OutsideProfile(f"a {kind} announcing {size} bytes of data (only regular files carry data)",
                             name, offset)
    if kind in ("symlink", "hardlink"):
        if not linkname:
            raise OutsideProfile(f"a {kind} without a target", name, offset)
    elif linkname or "linkpath" in records:
        raise OutsideProfile(f"a {kind} with a link target", name, offset)
