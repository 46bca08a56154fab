"""Opening package files for reading without ever waiting.

Discovery records regular files; between discovery and a read, a file can be swapped for a fifo (by accident or
not). open() on a fifo waits for a writer, forever. O_NONBLOCK makes such an open return at once and the fifo
read as empty (the seal then refuses the changed entry, IV704); on a regular file it changes nothing.
"""
from __future__ import annotations

import os
from typing import BinaryIO

from ..format import safetensors

READ_FLAGS = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0)


def open_binary(path: str | os.PathLike) -> BinaryIO:
    """open(path, "rb") that never blocks on a fifo."""
    fd = os.open(path, READ_FLAGS)
    try:
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_safetensors_header(path: str | os.PathLike, *, unreadable_is_none: bool = True) -> "safetensors.Header | None":
    """The header of a safetensors file (format/safetensors.py reads it; this reads its two pieces), or None when
    safetensors would refuse the file. A file that cannot be read is None too, or its OSError with
    `unreadable_is_none=False` (a check that must say the input is unreadable)."""
    try:
        with open_binary(path) as fh:
            size = os.fstat(fh.fileno()).st_size
            head = fh.read(safetensors.HEAD_BYTES)
            length = safetensors.header_length(head, size)
            return None if length is None else safetensors.parse(head, fh.read(length), size)
    except OSError:
        if unreadable_is_none:
            return None
        raise
