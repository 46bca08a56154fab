"""Streaming tar.zst reader for hostile input: nothing in the archive is trusted.

Three stages run side by side: a thread reads the compressed file (hashing it and following the zstd frame
structure, so a stream cut inside a frame is caught: the zstd library itself stops silently there), a thread
decompresses into a small pool of buffers (counting the expanded bytes against a limit, so a decompression
bomb costs a bounded amount of work and memory), and the caller parses tar headers and receives member data
as views into those buffers. When the frame boundaries are known (the seal's own archive) or found by walking
the frame headers (a regular file), frames are decompressed in parallel instead (parallel.py). Headers are
parsed here, in the one profile the seal writes and GNU tar reads the same way (profile.py: ustar and PAX
records; no GNU long names, global headers or sparse members); sizes are never trusted beyond what the stream
delivers.
Every problem is an ArchiveError, never a bare library exception.
"""
from __future__ import annotations

import hashlib
import io
import os
import queue
import stat
import threading
from dataclasses import dataclass
from typing import Iterator

import zstandard

from . import canonical, profile
from .errors import ArchiveError, Corrupt, NotZstd, TooLarge, Truncated  # noqa: F401 (ArchiveError re-exported)
from .parallel import FrameParallelExpanded
from .profile import OutsideProfile, parse_pax  # noqa: F401 (parse_pax re-exported)
from .zstdframes import FrameError, FrameScanner, Skipped, frame_table, skippable_frames

BLOCK = 512
RAW_CHUNK = 1 << 20
CHUNK = 2 << 20
MAX_META = 1 << 20  # a PAX record set larger than this is not a real archive


@dataclass
class Member:
    name: str
    kind: str  # file | directory | symlink | hardlink | fifo | char-device | block-device (profile.MEMBER_KINDS)
    size: int
    mode: int
    mtime: int
    linkname: str = ""
    typeflag: bytes = b"0"
    offset: int = 0  # position of the header in the expanded stream
    not_canonical: str | None = None  # why its header is not the one the seal writes for it (canonical.py)


# ---- stage 1: the compressed bytes ---------------------------------------------------------------------
class _CompressedSource:
    """A thread reads the file, hashes it and scans its frames; the decompressor pulls from a bounded queue."""

    def __init__(self, fileobj, stop: threading.Event, hash_archive: bool = True, tap=None):
        self.fileobj = fileobj
        self.sha256 = hashlib.sha256() if hash_archive else None
        self.tap = tap
        self.bytes = 0
        self.scanner = FrameScanner()
        self._queue: queue.Queue = queue.Queue(maxsize=8)
        self._stop = stop
        self._thread = threading.Thread(target=self._run, name="archive-read", daemon=True)
        self._thread.start()

    def _put(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        try:
            held = b""  # nothing reaches the decompressor before the scanner saw a whole magic number
            while chunk := self.fileobj.read(RAW_CHUNK):
                if self.sha256 is not None:
                    self.sha256.update(chunk)
                if self.tap is not None:
                    self.tap(chunk)
                self.bytes += len(chunk)
                self.scanner.feed(chunk)
                if self.bytes < 4:
                    held += chunk
                    continue
                if not self._put(held + chunk if held else chunk):
                    return
                held = b""
            self.scanner.finish()
            self._put(b"")
        except FrameError as exc:
            self._put({"not-zstd": NotZstd, "truncated": Truncated}.get(exc.kind, Corrupt)(str(exc)))
        except BaseException as exc:  # noqa: BLE001 - handed to the thread that waits on it, which raises it there
            self._put(exc)

    def read(self, size: int = -1) -> bytes:
        item = self._queue.get()
        if isinstance(item, BaseException):
            self._queue.put(item)  # later reads see the same failure
            raise item
        if not item:
            self._queue.put(item)
        return item


# ---- stage 2: decompression ----------------------------------------------------------------------------
class _Expanded:
    """Decompressed bytes, in pooled buffers filled by a thread; raises TooLarge past `limit` bytes."""

    def __init__(self, fileobj, limit: int | None, depth: int = 4, hash_archive: bool = True, tap=None):
        self.limit = limit
        self.total = 0
        self._stop = threading.Event()
        self.source = _CompressedSource(fileobj, self._stop, hash_archive, tap)
        self._free: queue.Queue = queue.Queue()
        for _ in range(depth):
            self._free.put(bytearray(CHUNK))
        self._ready: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="archive-decompress", daemon=True)
        self._thread.start()
        self._buffer: bytearray | None = None
        self._view = memoryview(b"")

    def _run(self) -> None:
        try:
            reader = zstandard.ZstdDecompressor().stream_reader(self.source, read_size=RAW_CHUNK,
                                                                read_across_frames=True)
            while not self._stop.is_set():
                buffer = self._free.get()
                if buffer is None:
                    return
                count = reader.readinto(buffer)
                if count == 0:
                    self.source.read()  # re-raises a truncation the scanner found at the end
                    self._ready.put(None)
                    return
                self.total += count
                if self.limit is not None and self.total > self.limit:
                    raise TooLarge(f"expands beyond {self.limit} bytes")
                self._ready.put((buffer, count))
        except zstandard.ZstdError as exc:
            self._ready.put(Corrupt(f"zstd: {exc}"))
        except BaseException as exc:  # noqa: BLE001 - handed to the thread that waits on it, which raises it there
            self._ready.put(exc)

    @property
    def archive_sha256(self) -> str:
        return self.source.sha256.hexdigest() if self.source.sha256 is not None else ""

    @property
    def archive_bytes(self) -> int:
        return self.source.bytes

    def next_view(self) -> memoryview | None:
        """The next decompressed piece, or None at the end; the previous piece's buffer is recycled."""
        if self._buffer is not None:
            self._free.put(self._buffer)
            self._buffer = None
        item = self._ready.get()
        if item is None:
            self._ready.put(None)
            return None
        if isinstance(item, BaseException):
            self._ready.put(item)
            raise item
        self._buffer, count = item
        return memoryview(self._buffer)[:count]

    def close(self) -> None:
        self._stop.set()
        self._free.put(None)
        while True:  # unblock the decompressor if it waits on the source
            try:
                self.source._queue.get_nowait()
            except queue.Empty:
                break
        try:
            self.source._queue.put_nowait(b"")
        except queue.Full:
            pass


def _scan(fileobj) -> list[tuple[int, int]] | None:
    try:
        fd = fileobj.fileno()
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
    except (AttributeError, OSError, io.UnsupportedOperation):
        return None
    try:
        return frame_table(fd)
    except FrameError as exc:
        raise {"not-zstd": NotZstd, "truncated": Truncated}.get(exc.kind, Corrupt)(str(exc)) from None


# ---- stage 3: tar (what is accepted: profile.py) ------------------------------------------------------------
def _text(field: bytes) -> str:
    return field.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")


class ArchiveReader:
    """Iterate the members of a tar.zst stream; read a member's data with `data(member)` before moving on.

    `frames`: the (start, end) byte ranges of the file's zstd frames when the caller knows them (the seal
    reading back what it wrote), or "scan" to find them by walking the frame and block headers of a regular
    file (the audit): several frames are then decompressed on several threads. Without, or for a single
    frame, one sequential pass. `hash_archive=False`: the caller hashes the file itself (archive_sha256 is "").
    `tap`: also called with every byte of the file, in order, on the thread that hashes it (the seal's
    CRC64NVME for a push that overlaps it: no second read). `follow` (follow.FollowedFrames): the file is still
    being written by the seal, whose frames it reads as they reach the file.
    Only the seal's own tar profile is read (profile.py): anything else raises OutsideProfile.
    Raises ArchiveError (from the constructor for a malformed frame structure)."""

    def __init__(self, fileobj, *, max_expanded: int | None = None,
                 frames: list[tuple[int, int]] | str | None = None, hash_archive: bool = True, tap=None,
                 follow=None):
        scanned = frames == "scan"
        if scanned:
            frames = _scan(fileobj)
        self._skippable: Skipped | None = None
        if follow is not None:  # the file is still being written (follow.py): its frames, as the writer ends them
            self._skippable = Skipped()
            self._expanded = FrameParallelExpanded(fileobj.fileno(), follow.frames, limit=max_expanded,
                                                   hash_archive=hash_archive, tap=tap, follow=follow)
        elif frames and len(frames) > 1:
            # Frames the caller knows are its writer's own (no skippable frame; an O_DIRECT descriptor, which
            # refuses small reads): only a scanned table is looked into.
            self._skippable = skippable_frames(fileobj.fileno(), frames) if scanned else Skipped()
            self._expanded = FrameParallelExpanded(fileobj.fileno(), frames, limit=max_expanded,
                                                   hash_archive=hash_archive, tap=tap)
        else:
            self._expanded = _Expanded(fileobj, max_expanded, hash_archive=hash_archive, tap=tap)
        self._view = memoryview(b"")
        self._position = 0  # offset in the expanded stream
        self._unread = 0  # bytes of the current member's data and padding still to skip
        self._data_left = 0
        self.members = 0

    # ---- low level -------------------------------------------------------------------------------------
    def _fill(self) -> bool:
        if self._view:
            return True
        view = self._expanded.next_view()
        if view is None:
            return False
        self._view = view
        return True

    def _read_exact(self, size: int, what: str) -> bytes:
        parts, needed = [], size
        while needed:
            if not self._fill():
                raise Truncated(f"the archive ends inside {what} (offset {self._position})")
            piece = self._view[:needed]
            parts.append(bytes(piece))
            self._view = self._view[len(piece):]
            needed -= len(piece)
            self._position += len(piece)
        return b"".join(parts)

    def _skip(self, size: int, what: str) -> None:
        while size:
            if not self._fill():
                raise Truncated(f"the archive ends inside {what} (offset {self._position})")
            step = min(size, len(self._view))
            self._view = self._view[step:]
            size -= step
            self._position += step

    # ---- members ---------------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Member]:
        records: dict[str, str] | None = None  # the PAX records of the header just read, for the next member
        extended = b""  # that extended header as read (block, records, padding): compared with the seal's
        while True:
            if self._unread:
                self._skip(self._unread, "a member's data")
                self._unread = self._data_left = 0
            offset = self._position
            header = self._read_exact(BLOCK, "a tar header")
            if header == bytes(BLOCK):
                if records is not None:
                    raise OutsideProfile("an extended header followed by the end of the archive",
                                         records.get("path", ""), offset)
                self._finish()
                return
            try:
                typeflag, size = profile.check_block(header, offset)
            except OutsideProfile as exc:
                if exc.member.startswith("././@"):  # an extended header or long name: name the member it is for
                    exc.member = (records or {}).get("path") or self._next_name(header)
                raise
            if typeflag == profile.PAX:
                if records is not None:  # GNU tar and other readers keep different ones of the two
                    raise OutsideProfile("two extended headers in a row",
                                         records.get("path") or self._next_name(header), offset)
                records, extended = self._pax(size, offset)
                extended = header + extended
                continue
            member = self._member(header, typeflag, size, records or {}, offset)
            member.not_canonical = canonical.difference(extended + header, member.name, typeflag, member.size,
                                                        member.mode, member.mtime, member.linkname)
            records, extended = None, b""
            self._data_left = member.size if member.kind == "file" else 0
            self._unread = self._data_left + (-self._data_left % BLOCK)
            self.members += 1
            yield member

    def _pax(self, size: int, offset: int) -> tuple[dict[str, str], bytes]:
        """The records of an extended header, and its data as read (padding included)."""
        if size > MAX_META:
            raise Corrupt(f"a {size}-byte tar extended header (more than {MAX_META})")
        data = self._read_exact(size + (-size % BLOCK), "an extended header")
        try:
            return profile.parse_pax(data[:size], offset), data
        except OutsideProfile as exc:
            if not exc.member:
                exc.member = self._next_name()
            raise

    def _next_name(self, header: bytes | None = None) -> str:
        """The name field of the next header (after `header`'s data when given): the member a refused extended
        header or long name was for. Best effort, only to name it in the finding."""
        try:
            if header is not None:
                size = int(header[124:136].rstrip(b"\0 ") or b"0", 8)
                if size > MAX_META:
                    return _text(header[0:100])
                self._skip(size + (-size % BLOCK), "an extended header")
            return _text(self._read_exact(BLOCK, "a tar header")[0:100])
        except (ArchiveError, ValueError):
            return _text(header[0:100]) if header is not None else ""

    @staticmethod
    def _member(header: bytes, typeflag: bytes, size: int, records: dict[str, str], offset: int) -> Member:
        header_name = _text(header[0:100])
        name = records.get("path") or profile.text(header[0:100], "name", offset, header_name)
        linkname = records.get("linkpath") or profile.text(header[157:257], "link name", offset, name)
        if "size" in records:
            size = int(records["size"])
        kind = profile.MEMBER_KINDS[typeflag]
        profile.check_member(kind, name, size, linkname, records, offset)
        mode = int(header[100:108].rstrip(b"\0 "), 8) & 0o7777
        mtime = int(records["mtime"]) if "mtime" in records else int(header[136:148].rstrip(b"\0 "), 8)
        return Member(name, kind, size, mode, mtime, linkname, typeflag, offset)

    def data(self, member: Member) -> Iterator[memoryview]:
        """The member's bytes as views, each valid until the next one is requested."""
        while self._data_left:
            if not self._fill():
                raise Truncated(f"the archive ends inside {member.name} (offset {self._position})")
            piece = self._view[: self._data_left]
            self._view = self._view[len(piece):]
            self._data_left -= len(piece)
            self._unread -= len(piece)
            self._position += len(piece)
            yield piece

    def _finish(self) -> None:
        """After the end-of-archive block only zeros may follow (record padding); read them to the end, so a
        stream truncated or corrupted past the end marker is still caught."""
        while self._fill():
            if self._view.tobytes().strip(b"\0"):
                raise Corrupt(f"data after the end-of-archive marker (offset {self._position})")
            self._position += len(self._view)
            self._view = memoryview(b"")

    # ---- facts -----------------------------------------------------------------------------------------
    @property
    def archive_sha256(self) -> str:
        return self._expanded.archive_sha256

    @property
    def archive_bytes(self) -> int:
        return self._expanded.archive_bytes

    @property
    def expanded_bytes(self) -> int:
        return self._expanded.total

    @property
    def skippable(self) -> Skipped:
        """The skippable zstd frames that hold bytes (zstdframes.py): zstd and tar pass over them unread, the seal
        writes none. Complete once the members were read to the end."""
        if self._skippable is not None:
            return self._skippable
        return self._expanded.source.scanner.skippable

    def close(self) -> None:
        self._expanded.close()

    def __enter__(self) -> "ArchiveReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
