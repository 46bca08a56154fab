"""The header block(s) of a tar member, built directly: ustar when the member fits, a PAX extended header before
it otherwise (long or non-ASCII names, sizes of 8 GiB and more, times outside 0..8**11-1). The bytes are those
Python's `tarfile` writes with PAX_FORMAT (3.11.4 and later) for the same member, but built here: the audit
compares every header it reads with this function's output (canonical.py), so it must not change with the
Python version that sealed or audits the archive. Ownership is normalised (uid/gid 0, no names).
"""
from __future__ import annotations

BLOCK = 512
END_OF_ARCHIVE = bytes(2 * BLOCK)
USTAR_MAX = 8 ** 11  # 11 octal digits: a size or time outside 0..USTAR_MAX-1 needs a PAX record
USTAR_MAX_SIZE = USTAR_MAX - 1
PAX_NAME = b"././@PaxHeader"  # tarfile's (and star's) name for an extended header

REGULAR, DIRECTORY, SYMLINK, HARDLINK, PAX = b"0", b"5", b"2", b"1", b"x"


def _octal(value: int, width: int) -> bytes:
    return b"%0*o\0" % (width - 1, value)


def _ustar_header(name: bytes, kind: bytes, size: int, mode: int, mtime: int, linkname: bytes) -> bytes:
    """A ustar header: name and link name NUL-padded, uid/gid 0, no user or group names, no device numbers."""
    header = b"".join([
        name[:100].ljust(100, b"\0"), _octal(mode & 0o7777, 8), _octal(0, 8), _octal(0, 8), _octal(size, 12),
        _octal(mtime, 12), b"        ", kind, linkname[:100].ljust(100, b"\0"), b"ustar\x0000",
        bytes(64 + 16 + 155 + 12),  # uname, gname (ownership normalised), devmajor, devminor, prefix, padding
    ])
    checksum = b"%06o\0 " % sum(header)
    return header[:148] + checksum + header[156:]


def _record(key: bytes, value: bytes) -> bytes:
    """`<length> <key>=<value>\\n`, the length counting its own digits."""
    body = len(key) + len(value) + 3
    length = previous = 0
    while True:
        length = body + len(str(previous))
        if length == previous:
            return b"%d %s=%s\n" % (length, key, value)
        previous = length


def _needs_pax(text: str, limit: int = 100) -> bool:
    return not text.isascii() or len(text) > limit


def pax_records(name: str, size: int, mtime: int, linkname: str) -> list[tuple[bytes, bytes]]:
    """The PAX records of a member, in tarfile's order: hdrcharset=BINARY first when a value is not valid UTF-8
    (a name os.listdir decoded with surrogate escapes), then path, linkpath, size, mtime."""
    wanted = []
    if _needs_pax(name):
        wanted.append(("path", name))
    if _needs_pax(linkname):
        wanted.append(("linkpath", linkname))
    if not 0 <= size < USTAR_MAX:
        wanted.append(("size", str(size)))
    if not 0 <= mtime < USTAR_MAX:
        wanted.append(("mtime", str(mtime)))
    try:
        for _, value in wanted:
            value.encode("utf-8")
        binary = False
    except UnicodeEncodeError:
        binary = True
    records = [(b"hdrcharset", b"BINARY")] if binary else []
    return records + [(key.encode(), value.encode("utf-8", "surrogateescape")) for key, value in wanted]


def tar_header(name: str, kind: bytes, *, size: int = 0, mode: int = 0o644, mtime: int = 0,
               linkname: str = "") -> bytes:
    """The header block(s) of one member: ustar when it fits, a PAX extended header before it otherwise."""
    records = pax_records(name, size, mtime, linkname)
    if not records:
        return _ustar_header(name.encode("ascii"), kind, size, mode, mtime, linkname.encode("ascii"))
    data = b"".join(_record(key, value) for key, value in records)
    extended = _ustar_header(PAX_NAME, PAX, len(data), 0, 0, b"") + data + padding(len(data))
    # In the ustar block after it: the names as ASCII with `?` for the rest, cut at 100 bytes; a size or
    # time that needs a record is 0 there.
    return extended + _ustar_header(name.encode("ascii", "replace"), kind, size if 0 <= size < USTAR_MAX else 0,
                                    mode, mtime if 0 <= mtime < USTAR_MAX else 0,
                                    linkname.encode("ascii", "replace"))


def padding(size: int) -> bytes:
    return bytes(-size % BLOCK)
