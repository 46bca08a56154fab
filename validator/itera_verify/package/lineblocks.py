"""Reading a file in blocks of whole lines, with a bound on the line not yet finished.

A block ends where a line ends, so a search or a parse over it never cuts a line in two. The unfinished line
at the end of a read waits for the next read; without a bound, a file with no newline (a 2 GB predictions file
on one line, a hostile file in an audited archive) would be held whole, and copied again on every read.
"""
from __future__ import annotations

from typing import BinaryIO, Iterator


def line_blocks(fh: BinaryIO, size: int, bound: int) -> Iterator[tuple[bytes, bool]]:
    """(data, whole) pieces that, put end to end, are the file; memory stays about `size` + `bound`.

    whole: data ends after a newline, or at the end of the file. Not whole: data is `bound` or more bytes of
    one line that goes on (it holds no newline); the line continues in the next pieces, up to the first
    newline of the next whole piece. A whole piece always follows, empty when the file ends right after the
    part. A caller that cannot work on part of a line gives way at the first one."""
    pending: list[bytes] = []  # the unfinished line, kept in reads and joined once: not copied on every read
    held = 0
    in_part = False  # part of the current line went out as a piece: a whole piece must close that line
    while True:
        chunk = fh.read(size)
        if not chunk:
            if held or in_part:
                yield b"".join(pending), True
            return
        cut = chunk.rfind(b"\n") + 1
        if cut:
            yield b"".join((*pending, memoryview(chunk)[:cut])), True  # one copy, whatever pending holds
            pending, held, in_part = [chunk[cut:]], len(chunk) - cut, False
        else:
            pending.append(chunk)
            held += len(chunk)
        if held >= bound:
            yield b"".join(pending), False
            pending, held, in_part = [], 0, True
