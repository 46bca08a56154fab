"""Follow the frame and block structure of a zstd stream without decompressing it.

Why: the zstd library stops without an error when its input ends inside a frame, so a truncated archive would
read as a shorter valid one. Walking the frame headers and block headers (RFC 8878 §3.1) as the bytes pass
tells exactly whether the stream ended on a frame boundary, and rejects a file that is not zstd at all.

Skippable frames (magic 0x184D2A50-0x184D2A5F, RFC 8878 §3.1.2) are valid zstd that `zstd -d` and `tar --zstd`
pass over unread: the seal writes none, so both readers here count those that hold bytes (`Skipped`) for the
audit to refuse. Counted, never listed: a stream of millions of tiny ones costs no memory.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import zstandard

ZSTD_MAGIC = 0xFD2FB528
SKIPPABLE_MASK, SKIPPABLE_MAGIC = 0xFFFFFFF0, 0x184D2A50
MAX_BLOCK = 128 << 10


@dataclass
class Skipped:
    """The skippable frames of a stream that hold bytes: how many, how many bytes, where the first one starts."""

    frames: int = 0
    bytes: int = 0
    first: int | None = None

    def add(self, offset: int, size: int) -> None:
        self.frames += 1
        self.bytes += size
        if self.first is None:
            self.first = offset


class FrameError(Exception):
    """The bytes are not a well-formed zstd stream; `kind` is "not-zstd", "truncated" or "corrupt"."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


class FrameScanner:
    """Feed compressed bytes in order, then call finish(). Raises FrameError."""

    def __init__(self) -> None:
        self.frames = 0
        self.offset = 0  # bytes fed so far
        self._pending = b""  # an incomplete header being assembled
        self._need = 4  # header bytes wanted in the current state
        self._skip = 0  # body bytes to pass over
        self._state = "magic"
        self._checksum = False
        self.skippable = Skipped()

    def feed(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            if self._skip:
                step = min(self._skip, len(view))
                self._skip -= step
                view = view[step:]
                self.offset += step
                if not self._skip and self._state == "after-skip":
                    self._end_frame()
                continue
            take = min(self._need - len(self._pending), len(view))
            self._pending += bytes(view[:take])
            view = view[take:]
            self.offset += take
            if len(self._pending) == self._need:
                header, self._pending = self._pending, b""
                self._advance(header)

    def _advance(self, header: bytes) -> None:
        state = self._state
        if state == "magic":
            magic = int.from_bytes(header, "little")
            if magic == ZSTD_MAGIC:
                self._state, self._need = "descriptor", 1
            elif magic & SKIPPABLE_MASK == SKIPPABLE_MAGIC:
                self._state, self._need = "skippable-size", 4
            elif self.frames == 0 and self.offset == 4:
                raise FrameError("not-zstd", "not a zstd stream (no zstd magic number at the start)")
            else:
                raise FrameError("corrupt", f"data that is not a zstd frame at offset {self.offset - 4}")
        elif state == "skippable-size":
            self._skip = int.from_bytes(header, "little")
            self._state, self._need = "after-skip", 4
            if not self._skip:
                self._end_frame()
            else:
                self.skippable.add(self.offset - 8, self._skip)
        elif state == "descriptor":
            descriptor = header[0]
            if descriptor & 0x08:
                raise FrameError("corrupt", f"reserved bit set in a zstd frame header at offset {self.offset - 1}")
            single_segment = bool(descriptor & 0x20)
            self._checksum = bool(descriptor & 0x04)
            content_size = (1 if single_segment else 0, 2, 4, 8)[descriptor >> 6]
            rest = (0 if single_segment else 1) + (0, 1, 2, 4)[descriptor & 0x03] + content_size
            self._state, self._need = "frame-header", rest
            if not rest:
                self._state, self._need = "block", 3
        elif state == "frame-header":
            self._state, self._need = "block", 3
        elif state == "block":
            value = int.from_bytes(header, "little")
            last, block_type, size = value & 1, (value >> 1) & 3, value >> 3
            if block_type == 3 or size > MAX_BLOCK:
                raise FrameError("corrupt", f"invalid zstd block header at offset {self.offset - 3}")
            self._skip = 1 if block_type == 1 else size
            if last:
                self._state, self._need = ("checksum", 4) if self._checksum else ("magic", 4)
                if not self._checksum:
                    self._end_frame(reset=False)
        elif state == "checksum":
            self._end_frame()

    def _end_frame(self, reset: bool = True) -> None:
        self.frames += 1
        if reset:
            self._state, self._need = "magic", 4

    @property
    def at_boundary(self) -> bool:
        """True between frames: nothing half-read, nothing left to skip."""
        return self._state == "magic" and not self._pending and not self._skip

    def finish(self) -> None:
        if self.offset == 0:
            raise FrameError("not-zstd", "empty file (not a zstd stream)")
        if self.frames == 0 and self.offset < 4:
            raise FrameError("not-zstd", "not a zstd stream (shorter than a zstd header)")
        if not self.at_boundary:
            raise FrameError("truncated", f"the zstd stream ends inside a frame (after {self.offset} bytes)")


def frame_table(fd: int, *, max_blocks: int = 1_000_000) -> list[tuple[int, int]] | None:
    """The (start, end) of every frame of the file, found by reading frame and block headers only (the block
    bodies are skipped, not read). None when the file holds more than `max_blocks` blocks: walking it would
    cost more than reading it, and the caller reads it in one sequential pass instead. Raises FrameError."""
    size = os.fstat(fd).st_size
    frames: list[tuple[int, int]] = []
    position, blocks = 0, 0

    def read(offset: int, count: int) -> bytes:
        data = os.pread(fd, count, offset)
        if len(data) < count:
            if not frames and offset < 4:
                raise FrameError("not-zstd", "not a zstd stream (shorter than a zstd header)" if size else
                                 "empty file (not a zstd stream)")
            raise FrameError("truncated", f"the zstd stream ends inside a frame (after {size} bytes)")
        return data

    while position < size:
        start = position
        magic = int.from_bytes(read(position, 4), "little")
        if magic & SKIPPABLE_MASK == SKIPPABLE_MAGIC:
            blocks += 1  # a stream of millions of empty frames: read in one pass instead, as for many blocks
            if blocks > max_blocks:
                return None
            position += 8 + int.from_bytes(read(position + 4, 4), "little")
        elif magic != ZSTD_MAGIC:
            if not frames:
                raise FrameError("not-zstd", "not a zstd stream (no zstd magic number at the start)")
            raise FrameError("corrupt", f"data that is not a zstd frame at offset {start}")
        else:
            descriptor = read(position + 4, 1)[0]
            if descriptor & 0x08:
                raise FrameError("corrupt", f"reserved bit set in a zstd frame header at offset {start}")
            single_segment = bool(descriptor & 0x20)
            content_size = (1 if single_segment else 0, 2, 4, 8)[descriptor >> 6]
            position += 5 + (0 if single_segment else 1) + (0, 1, 2, 4)[descriptor & 0x03] + content_size
            while True:
                blocks += 1
                if blocks > max_blocks:
                    return None
                value = int.from_bytes(read(position, 3), "little")
                last, block_type, block_size = value & 1, (value >> 1) & 3, value >> 3
                if block_type == 3 or block_size > MAX_BLOCK:
                    raise FrameError("corrupt", f"invalid zstd block header at offset {position}")
                position += 3 + (1 if block_type == 1 else block_size)
                if last:
                    break
            position += 4 if descriptor & 0x04 else 0
        if position > size:
            raise FrameError("truncated", f"the zstd stream ends inside a frame (after {size} bytes)")
        frames.append((start, position))
    if not frames:
        raise FrameError("not-zstd", "empty file (not a zstd stream)")
    return frames


def skippable_frames(fd: int, frames: list[tuple[int, int]]) -> Skipped:
    """The skippable frames with content among `frames` (frame_table's) of the file."""
    found = Skipped()
    for start, end in frames:
        magic = int.from_bytes(os.pread(fd, 4, start), "little")
        if magic & SKIPPABLE_MASK == SKIPPABLE_MAGIC and end - start > 8:
            found.add(start, end - start - 8)
    return found


def declared_content_size(fd: int) -> int | None:
    """The sum of the content sizes the frames of the file declare, read from their headers; None when a frame
    declares none (a stream compressed from a pipe) or the file is not a well-formed zstd stream. libzstd
    refuses a frame that expands past its declared size, so the sum bounds what decompression can produce."""
    try:
        frames = frame_table(fd)
    except FrameError:
        return None
    if frames is None:
        return None
    total = 0
    for start, _ in frames:
        head = os.pread(fd, 18, start)  # magic, descriptor, window, dictionary id, content size: at most 18
        if int.from_bytes(head[:4], "little") != ZSTD_MAGIC:
            return None
        size = zstandard.frame_content_size(head)
        if size < 0:
            return None
        total += size
    return total
