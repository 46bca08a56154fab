"""The header block(s) of a tar member, built directly: ustar when the member fits, `tarfile`'s PAX encoding
otherwise (long or non-ASCII names, sizes of 8 GiB and more). The ustar header is byte for byte the one tarfile
writes for the same member, at a tenth of the cost; ownership is normalised (uid/gid 0, no names).
"""
from __future__ import annotations

import tarfile

BLOCK = 512
END_OF_ARCHIVE = bytes(2 * BLOCK)
USTAR_MAX_SIZE = 0o77777777777  # 11 octal digits: anything larger needs a PAX size record

REGULAR, DIRECTORY, SYMLINK, HARDLINK = b"0", b"5", b"2", b"1"
_TARFILE_TYPES = {REGULAR: tarfile.REGTYPE, DIRECTORY: tarfile.DIRTYPE, SYMLINK: tarfile.SYMTYPE,
                  HARDLINK: tarfile.LNKTYPE}


def _octal(value: int, width: int) -> bytes:
    return b"%0*o\0" % (width - 1, value)


def _ustar_header(name: bytes, kind: bytes, size: int, mode: int, mtime: int, linkname: bytes) -> bytes:
    """A ustar header identical to what tarfile writes for the same member, at a tenth of the cost."""
    header = b"".join([
        name.ljust(100, b"\0"), _octal(mode, 8), _octal(0, 8), _octal(0, 8), _octal(size, 12),
        _octal(mtime, 12), b"        ", kind, linkname.ljust(100, b"\0"), b"ustar\x0000",
        bytes(64 + 16 + 155 + 12),  # uname, gname (ownership normalised), devmajor, devminor, prefix, padding
    ])
    checksum = b"%06o\0 " % sum(header)
    return header[:148] + checksum + header[156:]


def tar_header(name: str, kind: bytes, *, size: int = 0, mode: int = 0o644, mtime: int = 0,
               linkname: str = "") -> bytes:
    """The header block(s) of one member: ustar when it fits, a PAX extended header before it otherwise."""
    raw_name = name.encode("utf-8", "surrogateescape")
    raw_link = linkname.encode("utf-8", "surrogateescape")
    if (len(raw_name) <= 100 and len(raw_link) <= 100 and raw_name.isascii() and raw_link.isascii()
            and 0 <= size <= USTAR_MAX_SIZE and 0 <= mtime <= USTAR_MAX_SIZE):
        return _ustar_header(raw_name, kind, size, mode, mtime, raw_link)
    info = tarfile.TarInfo(name)
    info.type, info.size, info.mode, info.mtime, info.linkname = _TARFILE_TYPES[kind], size, mode, mtime, linkname
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


def padding(size: int) -> bytes:
    return bytes(-size % BLOCK)
