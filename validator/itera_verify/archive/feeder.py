"""Reading the files to archive on a background thread: each one read and hashed into a small pool of buffers,
which the archive writer then compresses as they are (ArchiveWriter.add_file(..., hash_data=False))."""
from __future__ import annotations

import hashlib
import os
import queue
import stat
import threading
from dataclasses import dataclass
from typing import Iterator

from .writer import SAMPLE

CHUNK = 4 << 20


@dataclass
class FileChunk:
    """A piece of one source file, with `opened`: the os.stat_result of the open file; the last piece carries
    the SHA-256 of all of them."""

    index: int
    data: memoryview
    opened: os.stat_result | None
    last: bool
    error: OSError | None = None
    sha256: str | None = None


# O_NONBLOCK: a fifo swapped in since discovery must not block the seal (it is not read; its stat refuses it).
_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0)


class FileFeeder:
    """Reads and hashes files in order on a thread, into a small pool of buffers, so reading and hashing run
    beside compression (on two cores, a thread per stage keeps both busy). The digest is of the very buffer the
    consumer then compresses: a buffer is refilled only after the consumer has moved past it. Small files share
    one buffer (one queue hand-off for many files). Reads stop one byte past the expected size: a file still
    growing is detected without reading it forever."""

    def __init__(self, files: list[tuple[str, int]], *, chunk: int = CHUNK, depth: int = 4):
        self.files = files
        self._free: queue.Queue = queue.Queue()
        for _ in range(depth):
            self._free.put(bytearray(chunk))
        self._ready: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="seal-reader", daemon=True)
        self._thread.start()

    def _take_buffer(self) -> bytearray | None:
        while not self._stop.is_set():
            try:
                return self._free.get(timeout=0.1)
            except queue.Empty:
                continue
        return None

    def _run(self) -> None:
        try:
            self._buffer, self._used, self._batch = self._take_buffer(), 0, []
            for index, (path, expected) in enumerate(self.files):
                if self._buffer is None or self._stop.is_set():
                    return
                self._read_file(index, path, expected)
            self._ready.put(("chunks", self._buffer, self._batch))
            self._ready.put(("done", None))
        except BaseException as exc:  # noqa: BLE001 - delivered to the consumer, never lost in a thread
            self._ready.put(("crash", exc))

    def _room_for(self, remaining: int) -> bool:
        """Whether the current buffer takes the next piece; if not, hand it over and take a fresh one. A piece
        is worth it when at least 1 MiB (what the writer samples to choose a level) or the whole rest fits:
        many small files share one buffer, a large one starts a fresh buffer."""
        free = len(self._buffer) - self._used
        if free and len(self._batch) < 256 and not (self._batch and free < min(remaining, SAMPLE)):
            return True
        self._ready.put(("chunks", self._buffer, self._batch))
        self._buffer, self._used, self._batch = self._take_buffer(), 0, []
        return self._buffer is not None

    def _read_file(self, index: int, path: str, expected: int) -> None:
        try:
            fd = os.open(path, _OPEN_FLAGS)
        except OSError as exc:
            self._batch.append(FileChunk(index, memoryview(b""), None, True, exc))
            return
        try:  # plain os calls: a file object would add a stat and an object per file (20,000 small files)
            opened = os.fstat(fd)
            if not stat.S_ISREG(opened.st_mode):  # not read at all; the consumer sees the stat and refuses it
                self._batch.append(FileChunk(index, memoryview(b""), opened, True))
                return
            if expected >= CHUNK:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
            remaining = expected + 1  # one byte more than expected: a growing file shows without reading it all
            digest = hashlib.sha256()
            while self._room_for(remaining):
                view = memoryview(self._buffer)[self._used: self._used + remaining]
                count, at_end = 0, False
                while count < len(view):  # fill this piece; a small file is then one piece, end included
                    try:
                        got = os.readv(fd, [view[count:]])
                    except OSError as exc:
                        self._batch.append(FileChunk(index, memoryview(b""), opened, True, exc))
                        return
                    if got == 0:
                        at_end = True
                        break
                    count += got
                remaining -= count
                last = at_end or remaining == 0
                digest.update(view[:count])
                self._batch.append(FileChunk(index, view[:count], opened, last,
                                             sha256=digest.hexdigest() if last else None))
                self._used += count
                if last:
                    return
        finally:
            os.close(fd)

    def __iter__(self) -> Iterator[FileChunk]:
        """Every chunk in order; a chunk's buffer is reused once the next batch is taken."""
        previous = None
        while True:
            kind, *payload = self._ready.get()
            if previous is not None:
                self._free.put(previous)
                previous = None
            if kind == "done":
                return
            if kind == "crash":
                raise payload[0]
            buffer, batch = payload
            previous = buffer
            yield from batch

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
