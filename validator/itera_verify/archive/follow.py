"""Reading an archive back while it is written: the frames and members its writer has finished so far.

The seal's read-back proves that the bytes on the device decode to the members it hashed. It need not wait for
the last byte: a frame written past the page cache (direct.py) is on the device, and reading it there
(O_DIRECT) reads what the device holds, now as after the final sync. So the read-back follows the writer:
frame k is read, decompressed and hashed while frame k+n is compressed. The two SHA-256 passes over every
member (as read, and as read back) then run side by side on two cores instead of one after the other.
"""
from __future__ import annotations

import threading
from typing import Iterator

from .direct import round_up
from .output import WrittenBytes


class Stopped(Exception):
    """The writing was abandoned: the reader following it leaves."""


class Growing:
    """A list one thread appends to and another reads in order as it grows: iterating waits for the next item
    until close() (then ends) or fail() (then raises Stopped). len() and indexing see what is there now."""

    def __init__(self):
        self._items: list = []
        self._condition = threading.Condition()
        self._closed = self._failed = False

    def append(self, item) -> None:
        with self._condition:
            self._items.append(item)
            self._condition.notify_all()

    def close(self) -> None:
        with self._condition:
            self._closed = True
            self._condition.notify_all()

    def fail(self) -> None:
        with self._condition:
            self._failed = True
            self._condition.notify_all()

    def __len__(self) -> int:
        return len(self._items)

    def __getitem__(self, index):
        return self._items[index]

    def __iter__(self) -> Iterator:
        index = 0
        while True:
            with self._condition:
                while index >= len(self._items) and not self._closed and not self._failed:
                    self._condition.wait()
                if self._failed:
                    raise Stopped()
                if index >= len(self._items):
                    return
                item = self._items[index]
            yield item
            index += 1


class FollowedFrames:
    """The frames of an archive being written: `frames` is the writer's own list of (start, end), appended as
    each frame is handed to the output; `written` says how many bytes of the file are final (output.py). Any
    thread may wait on it; any of `stops` (Events: the writer's, the reader's own) ends every wait with Stopped."""

    PAUSE = 0.1  # how often a wait looks at `stops`

    def __init__(self, frames: list[tuple[int, int]], written: WrittenBytes, *stops: threading.Event):
        self.frames, self.written, self.stops = frames, written, stops

    def also_stopped_by(self, stop: threading.Event) -> "FollowedFrames":
        return FollowedFrames(self.frames, self.written, *self.stops, stop)

    def frame(self, index: int) -> tuple[int, int] | None:
        """The index-th frame once it is in the file (its aligned end written, or the file finished); None
        when the file is finished with fewer frames. Raises Stopped when the writing was abandoned."""
        seen = 0
        while index >= len(self.frames):
            available, final = self._wait(seen + 1)
            if final is not None and index >= len(self.frames):
                return None
            seen = available
        start, end = self.frames[index]
        self.until(end)
        return start, end

    def stopped(self) -> bool:
        """The writing was abandoned (one of `stops` set, or the writer failed): every wait here raises Stopped."""
        return any(stop.is_set() for stop in self.stops) or self.written.failed

    def until(self, end: int | None) -> int | None:
        """Wait until the file holds every aligned block up to `end` (None: until the file is finished); the
        final size once known, else None."""
        want = round_up(end) if end is not None else None
        while True:
            available, final = self._wait(want if want is not None else 1 << 62)
            if final is not None or (want is not None and available >= want):
                return final

    def _wait(self, count: int) -> tuple[int, int | None]:
        while True:
            if self.stopped():
                raise Stopped()
            available, final, failed = self.written.wait_for(count, timeout=self.PAUSE)
            if failed:
                raise Stopped()
            if available >= count or final is not None:
                return available, final
