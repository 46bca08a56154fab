"""Decompress independent zstd frames on several threads, delivering the bytes in order.

zstd decompresses one frame on one core. An archive this tool writes is a sequence of frames of at most a few
dozen MiB, and the writer knows where each starts: reading it back, frame k+1 decompresses while frame k is
being hashed, which on two cores roughly halves the read-back. Memory stays bounded: at most `workers + 1`
frames are in flight and each hands over at most `depth` pieces before its consumer catches up.
"""
from __future__ import annotations

import os
import queue
import threading

import zstandard

from .digest import FileDigest
from .errors import Corrupt, TooLarge

PIECE = 2 << 20
READ = 1 << 20
_END = object()


class _Range:
    """A read()-able view of bytes [start, end) of a file descriptor, through pread (no shared offset)."""

    def __init__(self, fd: int, start: int, end: int):
        self.fd, self.position, self.end = fd, start, end

    def read(self, size: int = -1) -> bytes:
        size = min(READ if size < 0 else size, self.end - self.position)
        data = os.pread(self.fd, size, self.position) if size > 0 else b""
        self.position += len(data)
        return data


class FrameParallelExpanded:
    """The expanded stream of frames [(start, end), ...] of `fd`; same interface as the sequential reader's
    stage: next_view(), close(), total, archive_sha256, archive_bytes."""

    def __init__(self, fd: int, frames: list[tuple[int, int]], *, limit: int | None, workers: int = 2,
                 depth: int = 3, hash_archive: bool = True):
        self.fd, self.frames, self.limit = fd, frames, limit
        self.total = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._in_flight = threading.Semaphore(workers + 1)
        self._outputs = [queue.Queue(maxsize=depth) for _ in frames]
        self._next_frame = 0
        self._current = 0  # the frame the consumer reads
        self._threads = [threading.Thread(target=self._work, name=f"archive-frames-{n}", daemon=True)
                         for n in range(workers)]
        for thread in self._threads:
            thread.start()
        # The archive's own SHA-256, over the bytes on disk, read once in order beside the frame workers.
        self._digest = FileDigest(fd, stop=self._stop) if hash_archive else None

    @property
    def archive_sha256(self) -> str:
        """The SHA-256 of the whole file (waits for the hashing thread); "" when not asked for."""
        return self._digest.result()[0] if self._digest is not None else ""

    @property
    def archive_bytes(self) -> int:
        return self._digest.bytes if self._digest is not None else 0

    def _put(self, index: int, item) -> bool:
        while not self._stop.is_set():
            try:
                self._outputs[index].put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _take_frame(self) -> int | None:
        while not self._in_flight.acquire(timeout=0.1):
            if self._stop.is_set():
                return None
        with self._lock:
            index = self._next_frame
            self._next_frame += 1
        if index >= len(self.frames) or self._stop.is_set():
            self._in_flight.release()
            return None
        return index

    def _work(self) -> None:
        decompressor = zstandard.ZstdDecompressor()
        while (index := self._take_frame()) is not None:
            start, end = self.frames[index]
            source = _Range(self.fd, start, end)
            try:
                reader = decompressor.stream_reader(source, read_size=READ, read_across_frames=False)
                while piece := reader.read(PIECE):
                    with self._lock:
                        self.total += len(piece)
                        over = self.limit is not None and self.total > self.limit
                    if over:
                        raise TooLarge(f"expands beyond {self.limit} bytes")
                    if not self._put(index, piece):
                        return
                if source.position != end:
                    raise Corrupt(f"frame {index} ends before its recorded end")
                self._put(index, _END)
            except zstandard.ZstdError as exc:
                self._put(index, Corrupt(f"zstd: {exc}"))
            except BaseException as exc:
                self._put(index, exc)

    def next_view(self) -> memoryview | None:
        while self._current < len(self.frames):
            item = self._outputs[self._current].get()
            if item is _END:
                self._current += 1
                self._in_flight.release()
                continue
            if isinstance(item, BaseException):
                self._outputs[self._current].put(item)
                raise item
            return memoryview(item)
        return None

    def close(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=5)
        if self._digest is not None:
            self._digest.join(timeout=5)
