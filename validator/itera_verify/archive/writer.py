"""Streaming tar.zst writer: POSIX tar headers written by hand, file data hashed on the bytes compressed.

Why not `tarfile`: its stream mode copies and slices buffers (seconds per GiB). Here a header is 512 bytes
built directly (tarheader.py), data goes straight from the read buffer into the hash and the zstd compressor.

Compression: zstd frames of at most FRAME_SPAN input bytes, each with a content checksum, compressed whole on a
pool of threads (one compressor per thread) and written in order. Why not zstd's own multi-threading: it
drains its workers at every frame end, and frames are what lets the read-back and the audit decompress in
parallel; independent frames keep every core busy on both sides. The level is chosen per large file from a
1 MiB sample: when level 1 compresses the sample within 1 % of the requested level, the file goes into level-1
frames. bf16/fp16 weights are the case this is for (no repeated strings, only the exponent bytes compress:
level 1 gives exactly the ratio of level 3 at about half the CPU); plain JSONL often qualifies too. Small
files and everything level 1 does worse on use the requested level. Concatenated frames are one valid zstd
stream (`zstd -d`, `tar --zstd` read them).
"""
from __future__ import annotations

import hashlib
import os
import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Iterable, Iterator

import zstandard

from .canonical import DIRECTORY_MODE, FILE_MODES, SYMLINK_MODE, HeaderFacts, header as canonical_header
from .output import ArchiveOutput
from .tarheader import DIRECTORY, END_OF_ARCHIVE, REGULAR, SYMLINK, padding

FAST_MIN_SIZE = 8 << 20  # smaller files are not worth a frame of their own
SAMPLE = 1 << 20
FAST_TOLERANCE = 1.01  # use the fast profile when it is within 1 % of the requested level on a sample
FAST_LEVEL = 1
FRAME_SPAN = 8 << 20  # input bytes per frame: frames compress, and decompress when read back, in parallel


class SizeChanged(Exception):
    """A file delivered more or fewer bytes than its header announced (it changed while being read)."""

    def __init__(self, name: str, expected: int, actual: int):
        super().__init__(f"{name}: {expected} bytes expected, {'more' if actual > expected else actual} read")
        self.name, self.expected, self.actual = name, expected, actual


def worker_count(threads: int) -> int:
    """--threads: 0 means every core this process may use."""
    if threads > 0:
        return threads
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


class _FrameCompressor:
    """Whole frames compressed on `workers` threads. A ZstdCompressor is not thread-safe: each thread keeps
    its own, one per profile. compress() releases the GIL, so the threads run side by side."""

    def __init__(self, levels: dict[str, int], workers: int):
        self._levels = levels
        self._local = threading.local()
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="archive-compress")

    def _compress(self, profile: str, data: memoryview) -> bytes:
        compressors = getattr(self._local, "compressors", None)
        if compressors is None:
            compressors = self._local.compressors = {
                name: zstandard.ZstdCompressor(level=level, write_checksum=True)
                for name, level in self._levels.items()}
        return compressors[profile].compress(data)

    def submit(self, profile: str, data: memoryview) -> Future:
        return self._pool.submit(self._compress, profile, data)

    def shutdown(self, *, cancel: bool = False) -> None:
        self._pool.shutdown(wait=True, cancel_futures=cancel)


class ArchiveWriter:
    """Write members in the order given; the caller sorts them. Returns each file's SHA-256.

    The tar stream is copied into frame buffers of FRAME_SPAN bytes; a full buffer (or a change of profile)
    goes to the compressor pool, and compressed frames reach the output in order. Memory is bounded by the
    buffers: `workers + 2` frames in flight, whatever the archive's size. `written` (output.WrittenBytes): told
    how many bytes of the file are final as they are written (a push that overlaps the seal follows it)."""

    def __init__(self, fileobj, *, level: int = 3, threads: int = 0, written=None):
        self.output = ArchiveOutput(fileobj, written)
        self.level = level
        self.workers = worker_count(threads)
        self._compressor = _FrameCompressor({"normal": level, "fast": FAST_LEVEL}, self.workers)
        self._samplers = {"normal": zstandard.ZstdCompressor(level=level),
                          "fast": zstandard.ZstdCompressor(level=FAST_LEVEL)}
        self._profile: str | None = None
        self._buffer: bytearray | None = None
        self._target: memoryview | None = None  # a view of _buffer, the one copy goes through it
        self._filled = 0
        self._free: list[bytearray] = []
        self._allocated = 0
        self._in_flight: deque[tuple[Future, bytearray]] = deque()
        self.tar_bytes = 0
        self.frames: list[tuple[int, int]] = []  # (start, end) of each zstd frame in the file
        self.fast_files = 0
        self.headers: list[HeaderFacts] = []  # every member written, as canonical.member_listing reads it

    # ---- frames --------------------------------------------------------------------------------------
    def _use(self, profile: str) -> None:
        """Switch profile; a switch ends the current frame (a frame has one set of parameters)."""
        if profile != self._profile:
            self._end_frame()
            self._profile = profile

    def _take_buffer(self) -> bytearray:
        if not self._free and self._allocated < self.workers + 2:
            self._allocated += 1
            return bytearray(FRAME_SPAN)
        while not self._free:
            self._emit_oldest()
        return self._free.pop()

    def _end_frame(self) -> None:
        if self._buffer is None:
            return
        buffer, filled = self._buffer, self._filled
        self._buffer, self._filled = None, 0
        if not filled:
            self._free.append(buffer)
            return
        self._in_flight.append((self._compressor.submit(self._profile, memoryview(buffer)[:filled]), buffer))
        while len(self._in_flight) > self.workers:
            self._emit_oldest()

    def _emit_oldest(self) -> None:
        """Hand the oldest frame to the output once compressed; its buffer is free again."""
        future, buffer = self._in_flight.popleft()
        compressed = future.result()
        start = self.output.bytes
        self.output.write(compressed)
        self.frames.append((start, self.output.bytes))
        self._free.append(buffer)

    def _profile_for(self, size: int, first) -> str:
        if self.level <= FAST_LEVEL or size < FAST_MIN_SIZE or first is None or len(first) < SAMPLE:
            return "normal"
        sample = first[-SAMPLE:]
        fast = len(self._samplers["fast"].compress(sample))
        normal = len(self._samplers["normal"].compress(sample))
        return "fast" if fast <= normal * FAST_TOLERANCE else "normal"

    def _write(self, data) -> None:
        if self._profile is None:
            self._profile = "normal"
        view = memoryview(data).cast("B")
        self.tar_bytes += len(view)
        while view:
            if self._buffer is None:
                self._buffer, self._filled = self._take_buffer(), 0
                self._target = memoryview(self._buffer)  # bytearray[a:b] = view would copy the view twice
            step = min(len(self._buffer) - self._filled, len(view))
            self._target[self._filled:self._filled + step] = view[:step]
            self._filled += step
            view = view[step:]
            if self._filled == len(self._buffer):
                self._end_frame()

    # ---- members: every header is canonical.header(), the one the audit expects (ValueError for another mode)
    def add_directory(self, name: str, *, mode: int = DIRECTORY_MODE, mtime: int = 0) -> None:
        name = name.rstrip("/") + "/"
        self._write(canonical_header(name, DIRECTORY, mode=mode, mtime=mtime))
        self.headers.append((name, "directory", 0, mode, mtime, ""))

    def add_symlink(self, name: str, target: str, *, mtime: int = 0) -> None:
        self._write(canonical_header(name, SYMLINK, mtime=mtime, linkname=target))
        self.headers.append((name, "symlink", 0, SYMLINK_MODE, mtime, target))

    def add_bytes(self, name: str, data: bytes, *, mode: int = FILE_MODES[0], mtime: int = 0) -> str:
        return self.add_file(name, len(data), [data], mode=mode, mtime=mtime)

    def add_file(self, name: str, size: int, chunks: Iterable, *, mode: int = FILE_MODES[0], mtime: int = 0,
                 hash_data: bool = True) -> str | None:
        """Header, data, padding; the SHA-256 is computed on exactly the bytes handed to the compressor.
        hash_data=False when the pieces come from a FileFeeder, which hashed these very buffers already."""
        chunks = iter(chunks)
        first = next(chunks, None)
        profile = self._profile_for(size, first)
        if profile == "fast":
            self.fast_files += 1
        if self._profile != profile:
            self._use(profile)
        digest = hashlib.sha256() if hash_data else None
        header = canonical_header(name, REGULAR, size=size, mode=mode, mtime=mtime)
        self.headers.append((name, "file", size, mode, mtime, ""))
        if first is None:
            first = b""
        if len(first) == size and size <= 65536:  # a small file: one compressor call for the whole member
            self._write(b"".join((header, first, padding(size))))
            if next(chunks, None):
                raise SizeChanged(name, size, size + 1)
            return hashlib.sha256(first).hexdigest() if hash_data else None
        self._write(header)
        written = 0
        for chunk in _prepend(first, chunks):
            written += len(chunk)
            if written > size:
                raise SizeChanged(name, size, written)
            if digest is not None:
                digest.update(chunk)
            self._write(chunk)
        if written != size:
            raise SizeChanged(name, size, written)
        self._write(padding(size))
        return digest.hexdigest() if digest is not None else None

    def close(self) -> None:
        """End-of-archive blocks, end the last frame, wait for every byte to reach the file object.
        The caller syncs the file."""
        try:
            self._write(END_OF_ARCHIVE)
            self._end_frame()
            while self._in_flight:
                self._emit_oldest()
            self.output.flush()
        finally:
            self._compressor.shutdown()
            self.output.close()

    def abandon(self) -> None:
        """Stop the compressor threads and the output thread without finishing the archive (after an error)."""
        self._compressor.shutdown(cancel=True)
        self._in_flight.clear()
        self.output.close()


def _prepend(first, rest: Iterator) -> Iterator:
    if len(first):
        yield first
    yield from rest
