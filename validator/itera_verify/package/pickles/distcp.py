"""`.distcp` files of torch.distributed.checkpoint: one `torch.save` archive per stored item, back to back.

torch's FileSystemWriter appends each item's archive at the stream's current offset and records (offset,
length) in `.metadata`; its reader hands torch.load a view of that slice, so every archive's offsets are
relative to its own start. Read as one zip, the file is ambiguous (zipfile would see only the last archive).
Here the file is split into its archives without trusting `.metadata`: each begins where the previous one
ended, with a local header, and ends with an end record that makes the slice one strict archive (zips.py);
every archive is scanned, and a byte that belongs to none refuses the file.
"""
from __future__ import annotations

import io

from .zips import EOCD, LOCAL, AmbiguousZip, read_layout

DISTCP_SUFFIX = ".distcp"
_CHUNK = 1 << 20
_EOCD_SIZE = 22


class Window(io.RawIOBase):
    """A read-only, seekable view of `length` bytes of `fh` from `start`, as torch's _ReaderView gives."""

    def __init__(self, fh, start: int, length: int):
        super().__init__()
        self.fh, self.start, self.length, self.position = fh, start, length, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.length}[whence]
        self.position = max(0, base + offset)
        return self.position

    def readinto(self, buffer) -> int:
        wanted = min(len(buffer), max(0, self.length - self.position))
        if not wanted:
            return 0
        self.fh.seek(self.start + self.position)
        data = self.fh.read(wanted)
        buffer[:len(data)] = data
        self.position += len(data)
        return len(data)


def _end_records_after(fh, start: int, size: int):
    """Offsets of every end-of-central-directory signature after `start`, in file order."""
    offset = start
    while offset < size:
        fh.seek(offset)
        chunk = fh.read(_CHUNK + len(EOCD) - 1)
        at = chunk.find(EOCD)
        while at >= 0:
            if at < _CHUNK:
                yield offset + at
            at = chunk.find(EOCD, at + 1)
        offset += _CHUNK


def split_archives(fh, size: int) -> list[tuple[int, int]]:
    """(offset, length) of each archive, covering the file exactly; AmbiguousZip when it cannot be split so."""
    archives, start = [], 0
    while start < size:
        fh.seek(start)
        if fh.read(4) != LOCAL:
            raise AmbiguousZip(f"offset {start} does not begin a torch.save archive (no local header)")
        for record in _end_records_after(fh, start, size):
            fh.seek(record + _EOCD_SIZE - 2)
            comment = int.from_bytes(fh.read(2), "little")
            end = record + _EOCD_SIZE + comment
            if end > size:
                continue
            try:
                read_layout(Window(fh, start, end - start), end - start)
            except AmbiguousZip:
                continue  # the signature lay inside a tensor's bytes, or closes no strict archive
            archives.append((start, end - start))
            start = end
            break
        else:
            raise AmbiguousZip(f"the bytes from offset {start} are not one complete torch.save archive")
    return archives


def scan_distcp(fh, size: int, name: str, found: set[str], scan_container) -> tuple[bool, str | None]:
    """(holds a pickle, why it cannot be scanned), every embedded archive scanned in turn."""
    any_pickle = False
    for index, (start, length) in enumerate(split_archives(fh, size)):
        is_pickle, error = scan_container(Window(fh, start, length), length, f"{name}[{index}]", found)
        any_pickle = any_pickle or is_pickle
        if error:
            return True, f"archive {index} at offset {start}: {error}"
    return any_pickle, None
