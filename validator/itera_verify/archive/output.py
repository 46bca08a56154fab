"""The compressed side of an archive being written: ArchiveOutput copies the frames into the file on a thread,
and WrittenBytes tells a reader of the growing file (a push that overlaps the seal) how many of its bytes are
final."""
from __future__ import annotations

import queue
import threading
import time

from .writeback import start_writeback


class WrittenBytes:
    """How many bytes at the start of the file being written are in the file and will not change (written by
    the output thread), and, once the writer is done and synced, the file's final size; or that the writing
    was abandoned. A follower waits on it instead of polling the file's size, which a file written past the
    page cache (direct.py) exceeds by its padding for a moment."""

    def __init__(self):
        self._condition = threading.Condition()
        self.available = 0
        self.final: int | None = None
        self.failed = False

    def advance(self, available: int) -> None:
        with self._condition:
            if available > self.available:
                self.available = available
                self._condition.notify_all()

    def finish(self, size: int) -> None:
        with self._condition:
            self.available = self.final = size
            self._condition.notify_all()

    def fail(self) -> None:
        with self._condition:
            self.failed = True
            self._condition.notify_all()

    def wait_for(self, count: int, timeout: float | None = None) -> tuple[int, int | None, bool]:
        """Wait until `count` bytes are available, the final size is known or the writing failed (or `timeout`
        seconds passed); returns (available, final or None, failed)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._condition:
            while self.available < count and self.final is None and not self.failed:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                self._condition.wait(left)
            return self.available, self.final, self.failed


class ArchiveOutput:
    """The compressed side, written by a thread of its own: copying into the page cache costs as much as
    hashing, and the compressor should not wait for it. A short write is retried; a failure (a full disk) is
    raised by the next write() or by flush(). At most 2 frames wait in the queue. Writeback of each written
    range starts at once (writeback.py), so the caller's final fsync has little left to wait for. `written`
    (WrittenBytes) is advanced after each write by the bytes the file holds (a DirectWriter's `in_file`: its
    staged tail is not in the file yet)."""

    def __init__(self, fileobj, written: WrittenBytes | None = None):
        self.fileobj = fileobj
        self.written = written
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
        if self.written is not None:
            self.written.advance(getattr(self.fileobj, "in_file", self._position))

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

