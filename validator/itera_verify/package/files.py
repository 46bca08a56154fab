"""Opening package files for reading without ever waiting.

Discovery records regular files; between discovery and a read, a file can be swapped for a fifo (by accident or
not). open() on a fifo waits for a writer, forever. O_NONBLOCK makes such an open return at once and the fifo
read as empty (the seal then refuses the changed entry, IV704); on a regular file it changes nothing.
"""
from __future__ import annotations

import os
from typing import BinaryIO

READ_FLAGS = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0)


def open_binary(path: str | os.PathLike) -> BinaryIO:
    """open(path, "rb") that never blocks on a fifo."""
    fd = os.open(path, READ_FLAGS)
    try:
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
