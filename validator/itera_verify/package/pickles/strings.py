"""The string values a pickle holds, read from its opcodes (never unpickled): what the path rules report."""
from __future__ import annotations

import io
import pickletools
import re
import zipfile
import zlib

from .containers import ZIP_MAGIC
from .zips import open_checked

_STRING_OPS = {"UNICODE", "BINUNICODE", "SHORT_BINUNICODE", "BINUNICODE8", "STRING", "BINSTRING",
               "SHORT_BINSTRING"}
_STORAGE = re.compile(r"[^/]+/(\.data/|data/)\d+")
MAX_MEMBER = 64 << 20


def pickled_strings(data: bytes) -> list[str] | None:
    """Every string of every stream (of every non-storage member of a zip-format torch file), in order; None
    when the bytes are no pickle (then only a byte search can find a path)."""
    if not data.startswith(ZIP_MAGIC):
        return _stream_strings(data)
    try:
        archive = open_checked(io.BytesIO(data), len(data))
    except (ValueError, zipfile.BadZipFile):
        return None
    strings: list[str] | None = None
    with archive:
        for info in archive.infolist():
            if info.is_dir() or _STORAGE.fullmatch(info.filename) or info.file_size > MAX_MEMBER:
                continue
            try:
                data = archive.read(info)
            except (zipfile.BadZipFile, OSError, EOFError, ValueError, NotImplementedError, zlib.error):
                continue  # a record zipfile cannot read (a CRC torch never checks): IV506 refuses the file
            found = _stream_strings(data)
            if found is not None:
                strings = (strings or []) + found
    return strings


def _stream_strings(data: bytes) -> list[str] | None:
    view, strings, complete = io.BytesIO(data), [], False
    while view.tell() < len(data):
        try:
            for opcode, arg, _ in pickletools.genops(view):
                if opcode.name in _STRING_OPS:
                    strings.append(arg if isinstance(arg, str) else arg.decode("latin-1"))
        except (ValueError, EOFError):
            break  # junk or raw storage bytes: the strings read so far stand
        complete = True
    return strings if complete or strings else None
