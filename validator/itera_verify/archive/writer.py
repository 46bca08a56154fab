"""Streaming tar.zst writer: POSIX tar headers written by hand, file data hashed on the bytes compressed.

Why not `tarfile`: its stream mode copies and slices buffers (seconds per GiB). Here a header is 512 bytes
built directly (ustar when the name fits, `tarfile`'s PAX encoding otherwise: long or non-ASCII names, sizes
of 8 GiB and more), data goes straight from the read buffer into the hash and the zstd compressor.

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
import queue
import stat
import tarfile
import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Iterable, Iterator

import zstandard

from .writeback import start_writeback

BLOCK = 512
END_OF_ARCHIVE = bytes(2 * BLOCK)
USTAR_MAX_SIZE = 0o77777777777  # 11 octal digits: anything larger needs a PAX size record
CHUNK = 4 << 20
FAST_MIN_SIZE = 8 << 20  # smaller files are not worth a frame of their own
SAMPLE = 1 << 20
FAST_TOLERANCE = 1.01  # use the fast profile when it is within 1 % of the requested level on a sample
FAST_LEVEL = 1
FRAME_SPAN = 8 << 20  # input bytes per frame: frames compress, and decompress when read back, in parallel

REGULAR, DIRECTORY, SYMLINK, HARDLINK = b"0", b"5", b"2", b"1"
_TARFILE_TYPES = {REGULAR: tarfile.REGTYPE, DIRECTORY: tarfile.DIRTYPE, SYMLINK: tarfile.SYMTYPE,
                  HARDLINK: tarfile.LNKTYPE}


class SizeChanged(Exception):
    """A file delivered more or fewer bytes than its header announced (it changed while being read)."""

    def __init__(self, name: str, expected: int, actual: int):
        super().__init__(f"{name}: {expected} bytes expected, {'more' if actual > expected else actual} read")
        self.name, self.expected, self.actual = name, expected, actual


def _octal(value: int, width: int) -> bytes:
    return b"%0*o\0" % (width - 1, value)


def _ustar_header(name: bytes, kind: bytes, size: int, mode: int, mtime: int, linkname: bytes) -> bytes:
    """A ustar header identical to what tarfile writes for the same member, at a tenth of the cost."""
    header = b"".join([
        name.ljust(100, b"\0"), _octal(mode, 8), _octal(0, 8), _octal(0, 8), _octal(size, 12),
        _octal(mtime, 12), b"        ", kind, linkname.ljust(100, b"\0"), b"ustar\x0000",
        bytes(64 + 16 + 155 + 12),  # uname, gname (ownership normalised), devmajor, devminor, prefix, padding
    ])
    checksum = b"%06o\0 " % sum(header)
    return header[:148] + checksum + header[156:]


def tar_header(name: str, kind: bytes, *, size: int = 0, mode: int = 0o644, mtime: int = 0,
               linkname: str = "") -> bytes:
    """The header block(s) of one member: ustar when it fits, a PAX extended header before it otherwise."""
    raw_name = name.encode("utf-8", "surrogateescape")
    raw_link = linkname.encode("utf-8", "surrogateescape")
    if (len(raw_name) <= 100 and len(raw_link) <= 100 and raw_name.isascii() and raw_link.isascii()
            and 0 <= size <= USTAR_MAX_SIZE and 0 <= mtime <= USTAR_MAX_SIZE):
        return _ustar_header(raw_name, kind, size, mode, mtime, raw_link)
    info = tarfile.TarInfo(name)
    info.type, info.size, info.mode, info.mtime, info.linkname = _TARFILE_TYPES[kind], size, mode, mtime, linkname
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


def padding(size: int) -> bytes:
    return bytes(-size % BLOCK)


def worker_count(threads: int) -> int:
    """--threads: 0 means every core this process may use."""
    if threads > 0:
        return threads
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


class _Output:
    """The compressed side, written by a thread of its own: copying into the page cache costs as much as
    hashing, and the compressor should not wait for it. A short write is retried; a failure (a full disk) is
    raised by the next write() or by flush(). At most 2 frames wait in the queue. Writeback of each written
    range starts at once (writeback.py), so the caller's final fsync has little left to wait for."""

    def __init__(self, fileobj):
        self.fileobj = fileobj
        self.bytes = 0
        self._fd: int | None = None
        self._position = 0  # where the thread writes next in the file (self.bytes counts what was queued)
        try:
            self._fd = fileobj.fileno()
            self._position = fileobj.tell()  # tell(), not lseek: a buffered file object may hold bytes back
        except (AttributeError, OSError, ValueError):  # not a real file: no writeback to start
            self._fd = None
        if getattr(fileobj, "direct", False):  # O_DIRECT (direct.py): the bytes go to the device as written
            self._fd = None
        self._pending: queue.Queue = queue.Queue(maxsize=2)
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="archive-write", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (data := self._pending.get()) is not None:
            if self._failure is None:
                try:
                    self._write_all(data)
                except BaseException as exc:  # noqa: BLE001 - raised in the waiting thread
                    self._failure = exc
            self._pending.task_done()
        self._pending.task_done()

    def _write_all(self, data) -> None:
        view = memoryview(data)
        while view:
            written = self.fileobj.write(view)
            if written is None or written <= 0:
                raise OSError("the archive file accepted no bytes")
            view = view[written:]
        if self._fd is not None:
            start_writeback(self._fd, self._position, len(data))
        self._position += len(data)

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise self._failure

    def write(self, data) -> int:
        self._raise_failure()
        self._pending.put(bytes(data) if not isinstance(data, bytes) else data)
        self.bytes += len(data)
        return len(data)

    def flush(self) -> None:
        """Wait until everything queued is written; raise what went wrong."""
        self._pending.join()
        self._raise_failure()
        flush = getattr(self.fileobj, "flush", None)
        if flush:
            flush()

    def close(self) -> None:
        """Stop the thread (after what is queued); safe to call after a failure."""
        if self._thread.is_alive():
            self._pending.put(None)
            self._thread.join()


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
    buffers: `workers + 2` frames in flight, whatever the archive's size."""

    def __init__(self, fileobj, *, level: int = 3, threads: int = 0):
        self.output = _Output(fileobj)
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

    # ---- members -------------------------------------------------------------------------------------
    def add_directory(self, name: str, *, mode: int = 0o755, mtime: int = 0) -> None:
        self._write(tar_header(name.rstrip("/") + "/", DIRECTORY, mode=mode, mtime=mtime))

    def add_symlink(self, name: str, target: str, *, mtime: int = 0) -> None:
        self._write(tar_header(name, SYMLINK, mode=0o777, mtime=mtime, linkname=target))

    def add_bytes(self, name: str, data: bytes, *, mode: int = 0o644, mtime: int = 0) -> str:
        return self.add_file(name, len(data), [data], mode=mode, mtime=mtime)

    def add_file(self, name: str, size: int, chunks: Iterable, *, mode: int = 0o644, mtime: int = 0,
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
        header = tar_header(name, REGULAR, size=size, mode=mode, mtime=mtime)
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


# ---- reading local files on a background thread ---------------------------------------------------------
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
