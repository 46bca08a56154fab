"""Decompress independent zstd frames on several threads, delivering the bytes in order.

zstd decompresses one frame on one core. An archive this tool writes is a sequence of frames of at most a few
dozen MiB, and the writer knows where each starts: reading it back, frame k+1 decompresses while frame k is
being hashed, which on two cores roughly halves the read-back.

One thread reads the file, once and in order, in aligned segments (so the descriptor may be O_DIRECT: the
seal reads its archive back from the device, direct.py), and hashes it on the way; each frame's segments go to
the worker decompressing that frame. Memory stays bounded: a fixed pool of segments, at most `workers + 1`
frames in flight, and each hands over at most `depth` pieces before its consumer catches up.
"""
from __future__ import annotations

import errno
import hashlib
import os
import queue
import threading

import zstandard

from .direct import ALIGN, aligned_buffer, clear_direct, is_direct, round_down, round_up
from .errors import Corrupt, TooLarge
from .follow import FollowedFrames, Stopped

PIECE = 2 << 20
READ = 1 << 20
SEGMENT = 4 << 20  # bytes per read of the file
_END = object()


class _Stopped(Stopped):
    """close() was called: a thread leaves quietly."""


class _Segment:
    """One aligned read of the file, shared by the frame's worker and the hashing thread: its buffer goes back
    to the pool when both are done with it."""

    __slots__ = ("buffer", "view", "users", "pool", "lock")

    def __init__(self, buffer, view: memoryview, users: int, pool: queue.Queue, lock: threading.Lock):
        self.buffer, self.view, self.users, self.pool, self.lock = buffer, view, users, pool, lock

    def release(self) -> None:
        with self.lock:
            self.users -= 1
            last = self.users == 0
        if last:
            self.pool.put(self.buffer)


class _FrameSource:
    """A read()-able frame for the zstd reader: views into the segments the file reader delivers, each segment
    handed back to the pool once the decompressor has moved past it (it asks for more only then)."""

    def __init__(self, owner: "FrameParallelExpanded", index: int):
        self.owner, self.index = owner, index
        self.position = 0  # bytes handed to the decompressor
        self.ended = False
        self._view = memoryview(b"")
        self._segment: _Segment | None = None

    def read(self, size: int = -1) -> memoryview:
        while not self._view and not self.ended:
            self._next_segment()
        piece = self._view[:READ if size < 0 else size]
        self._view = self._view[len(piece):]
        self.position += len(piece)
        return piece

    def _next_segment(self) -> None:
        self.release()
        item = self.owner._get(("in", self.index))
        if item is _END:
            self.ended = True
        elif isinstance(item, BaseException):
            raise item
        else:
            self._segment, self._view = item, item.view

    def drain(self) -> int:
        """Take (and free) the rest of the frame; returns how many bytes were left."""
        left = len(self._view)
        self._view = memoryview(b"")
        while not self.ended:
            self._next_segment()
            left += len(self._view)
            self._view = memoryview(b"")
        self.release()
        return left

    def release(self) -> None:
        self._view = memoryview(b"")
        if self._segment is not None:
            self._segment.release()
            self._segment = None


class FrameParallelExpanded:
    """The expanded stream of frames [(start, end), ...] of `fd`; same interface as the sequential reader's
    stage: next_view(), close(), total, archive_sha256, archive_bytes. With `hash_archive`, the file's SHA-256
    covers every byte from 0 to its end, also any between or after the frames. `follow` (follow.py): the file is
    still being written; each frame is read once the writer has put it in the file."""

    def __init__(self, fd: int, frames: list[tuple[int, int]], *, limit: int | None, workers: int = 2,
                 depth: int = 3, hash_archive: bool = True, tap=None, follow: FollowedFrames | None = None):
        self.fd, self.frames, self.limit, self.depth = fd, frames, limit, depth
        self._stop = threading.Event()  # close(): every thread leaves, those waiting on the writer too
        self._follow = follow.also_stopped_by(self._stop) if follow is not None else None
        self._tap = tap if hash_archive else None  # rides the hashing thread: every byte of the file, in order
        self._direct = is_direct(fd)
        self.total = 0
        self._sha256 = hashlib.sha256() if hash_archive else None
        self._hashed = 0
        self._read_error: BaseException | None = None
        self._lock = threading.Lock()
        self._in_flight = threading.Semaphore(workers + 1)
        self._channels: dict[tuple[str, int], queue.Queue] = {}
        self._free: queue.Queue = queue.Queue()
        for _ in range(2 * workers + 2):
            self._free.put(aligned_buffer(SEGMENT))
        self._next_frame = 0
        self._current = 0  # the frame the consumer reads
        self._segment_lock = threading.Lock()
        self._to_hash: queue.Queue = queue.Queue()
        self._reader = threading.Thread(target=self._read_file, name="archive-read", daemon=True)
        self._hasher = threading.Thread(target=self._hash_file, name="archive-digest", daemon=True)
        self._threads = [threading.Thread(target=self._work, name=f"archive-frames-{n}", daemon=True)
                         for n in range(workers)]
        for thread in (self._reader, self._hasher, *self._threads):
            thread.start()

    @property
    def archive_sha256(self) -> str:
        """The SHA-256 of the whole file (waits for the reading thread); "" when not asked for."""
        if self._sha256 is None:
            return ""
        self._reader.join()
        self._hasher.join()
        if self._read_error is not None:
            raise self._read_error
        return self._sha256.hexdigest()

    @property
    def archive_bytes(self) -> int:
        if self._sha256 is None:
            return 0
        self._reader.join()
        self._hasher.join()
        return self._hashed

    # ---- channels: one queue per (direction, frame) while that frame is in flight --------------------------
    def _channel(self, key: tuple[str, int]) -> queue.Queue:
        with self._lock:
            channel = self._channels.get(key)
            if channel is None:
                channel = self._channels[key] = queue.Queue(maxsize=self.depth if key[0] == "out" else 0)
            return channel

    def _put(self, key: tuple[str, int], item) -> None:
        channel = self._channel(key)
        while not self._stop.is_set():
            try:
                channel.put(item, timeout=0.1)
                return
            except queue.Full:
                continue
        raise _Stopped()

    def _get(self, key: tuple[str, int]):
        """The next item of a channel. Every wait ends when the reading stops: close(), or, for a followed file,
        the writing abandoned (its frames' workers leave then without a word, and a consumer waiting for one of
        them would wait forever)."""
        channel = self._channel(key)
        while True:
            try:
                return channel.get(timeout=0.1)
            except queue.Empty:
                if self._stop.is_set() or (self._follow is not None and self._follow.stopped()):
                    raise _Stopped() from None

    def _done_with(self, key: tuple[str, int]) -> None:
        with self._lock:
            self._channels.pop(key, None)

    def _frame(self, index: int) -> tuple[int, int] | None:
        """The index-th frame, or None past the last (a followed file: once the writer has put it there)."""
        if self._follow is not None:
            return self._follow.frame(index)
        return self.frames[index] if index < len(self.frames) else None

    def _frames(self):
        index = 0
        while (frame := self._frame(index)) is not None:
            yield index, frame
            index += 1

    # ---- the file, read once in order ------------------------------------------------------------------
    def _read_file(self) -> None:
        index = None
        try:
            hashed_to = 0
            for index, (start, end) in self._frames():
                if self._sha256 is not None and start != hashed_to:
                    if start < hashed_to:
                        raise Corrupt(f"frame {index} overlaps the one before it")
                    self._read_range(None, hashed_to, start)  # bytes between frames: hashed, not decompressed
                self._read_range(index, start, end)
                hashed_to = end
            index = None
            if self._sha256 is not None:
                if self._follow is not None:
                    self._follow.until(None)  # the writer is done: its file has its final length
                self._read_range(None, hashed_to, None)  # whatever follows the last frame, to the end of the file
        except Stopped:
            return
        except BaseException as exc:  # noqa: BLE001 - the frame being read gets it (its worker raises it), else the digest
            self._read_error = exc
            if index is not None:
                try:
                    self._put(("in", index), exc)
                except _Stopped:
                    pass
        finally:
            self._to_hash.put(None)

    def _hash_file(self) -> None:
        """The archive's SHA-256 on a thread of its own, in file order: reading from the device and hashing
        then overlap (either alone takes about a second for 1.4 GB here)."""
        while (segment := self._to_hash.get()) is not None:
            if not self._stop.is_set():
                self._sha256.update(segment.view)
                if self._tap is not None:
                    self._tap(segment.view)
                self._hashed += len(segment.view)
            segment.release()

    def _take_free(self):
        while True:
            try:
                return self._free.get(timeout=0.1)
            except queue.Empty:
                if self._stop.is_set():
                    raise _Stopped() from None

    def _read_range(self, index: int | None, start: int, end: int | None) -> None:
        """Bytes [start, end) (end None: to the end of the file) in aligned reads; to frame `index`'s worker."""
        offset = round_down(start)
        hashing = self._sha256 is not None
        while end is None or offset < end:
            buffer = self._take_free()
            want = SEGMENT if end is None else min(SEGMENT, round_up(end) - offset)
            try:
                got = _read_full(self.fd, buffer, want, offset, self._direct)
            except OSError as exc:
                if exc.errno != errno.EINVAL or not self._direct:
                    raise
                self._direct = clear_direct(self.fd)  # O_DIRECT refused after all (a block larger than ALIGN)
                got = _read_full(self.fd, buffer, want, offset, False)
            low, high = min(max(start - offset, 0), got), got if end is None else min(end - offset, got)
            users = (index is not None) + hashing
            segment = _Segment(buffer, memoryview(buffer)[low:high], users, self._free, self._segment_lock)
            if hashing:
                self._to_hash.put(segment)
            if index is not None:
                self._put(("in", index), segment)
            if not users:
                self._free.put(buffer)
            if got < want:  # the end of the file (before the frame's recorded end: its worker finds it short)
                break
            offset += want
        if index is not None:
            self._put(("in", index), _END)

    # ---- the workers -----------------------------------------------------------------------------------
    def _take_frame(self) -> int | None:
        while not self._in_flight.acquire(timeout=0.1):
            if self._stop.is_set():
                return None
        with self._lock:
            index = self._next_frame
            self._next_frame += 1
        try:
            there = self._frame(index) is not None
        except Stopped:
            there = False
        if not there or self._stop.is_set():
            self._in_flight.release()
            return None
        return index

    def _work(self) -> None:
        decompressor = zstandard.ZstdDecompressor()
        while (index := self._take_frame()) is not None:
            start, end = self.frames[index]
            source = _FrameSource(self, index)
            try:
                try:
                    reader = decompressor.stream_reader(source, read_size=READ, read_across_frames=False)
                    while piece := reader.read(PIECE):
                        with self._lock:
                            self.total += len(piece)
                            over = self.limit is not None and self.total > self.limit
                        if over:
                            raise TooLarge(f"expands beyond {self.limit} bytes")
                        self._put(("out", index), piece)
                    if source.drain() or source.position != end - start:
                        raise Corrupt(f"frame {index} ends before its recorded end")
                    self._put(("out", index), _END)
                except zstandard.ZstdError as exc:
                    self._put(("out", index), Corrupt(f"zstd: {exc}"))
                except _Stopped:
                    return
                except BaseException as exc:  # noqa: BLE001 - raised in the waiting thread
                    self._put(("out", index), exc)
            except _Stopped:
                return
            finally:
                _drain_quietly(source)  # a frame that failed still frees its segments (the file reader waits)
                self._done_with(("in", index))

    # ---- the consumer ----------------------------------------------------------------------------------
    def next_view(self) -> memoryview | None:
        while self._frame(self._current) is not None:
            key = ("out", self._current)
            item = self._get(key)
            if item is _END:
                self._done_with(key)
                self._current += 1
                self._in_flight.release()
                continue
            if isinstance(item, BaseException):
                self._channel(key).put(item)
                raise item
            return memoryview(item)
        return None

    def close(self) -> None:
        self._stop.set()
        for thread in (self._reader, self._hasher, *self._threads):
            thread.join(timeout=5)


def _drain_quietly(source: _FrameSource) -> None:
    try:
        source.drain()
    except BaseException:  # noqa: BLE001 - stopped, or the read error the frame already reported
        source.release()


def _read_full(fd: int, buffer, want: int, offset: int, direct: bool) -> int:
    """Fill buffer[:want] from `offset`; fewer bytes only at the end of the file."""
    view = memoryview(buffer)[:want]
    got = 0
    while got < want:
        count = os.preadv(fd, [view[got:]], offset + got)
        if count == 0:
            break
        got += count
        if direct and got % ALIGN:  # O_DIRECT reads short only at the end (and refuses an unaligned offset)
            break
    return got
