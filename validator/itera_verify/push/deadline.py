"""The end of the rental (docs/integration.md, leaving the machine): will the upload finish before it? The first
parts answer.

The throughput the store gave the first PROBE_PARTS parts (bytes acknowledged over the seconds since the first
was sent, parallel parts included) predicts when the rest will be through. When that is after the deadline the
push says so at once, once, with the numbers, and goes on: the copy may still be useful, and the user decides.
"""
from __future__ import annotations

import time
from typing import Callable

PROBE_PARTS = 2
MB = 1_000_000


def _when(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


class DeadlineWatch:
    """`deadline`: seconds since the epoch, or None (nothing is watched). `warn`: hears one line."""

    def __init__(self, deadline: float | None, warn: Callable[[str], None], probe_parts: int = PROBE_PARTS):
        self.deadline, self.warn, self.probe_parts = deadline, warn, probe_parts
        self._started: float | None = None
        self._parts = 0
        self._facts: dict | None = None

    def begin(self) -> None:
        """The first part is about to be sent. A deadline already past is said now."""
        if self.deadline is None or self._started is not None:
            return
        self._started = time.monotonic()
        left = self.deadline - time.time()
        if left <= 0:
            self._facts = {"deadline": _when(self.deadline), "late": True, "seconds_left": round(left, 1)}
            self.warn(f"the rental ended {-left:.0f} s ago ({_when(self.deadline)}): this push may be cut off "
                      "at any moment (run it again to resume)")

    def part_done(self, sent: int, remaining: int, estimated: bool = False) -> None:
        """A part was acknowledged: `sent` bytes so far in this run, `remaining` still to send (an estimate while
        the seal is still writing the archive, `estimated`)."""
        if self.deadline is None or self._started is None or self._facts is not None:
            return
        self._parts += 1
        if self._parts < self.probe_parts:
            return
        elapsed = max(time.monotonic() - self._started, 1e-3)
        rate = sent / elapsed
        needed = remaining / rate if rate > 0 else float("inf")
        left = self.deadline - time.time()
        late = needed > left
        self._facts = {"deadline": _when(self.deadline), "late": late, "measured_parts": self._parts,
                       "bytes_per_second": round(rate), "bytes_left": remaining, "remaining_estimated": estimated,
                       "seconds_needed": round(needed, 1), "seconds_left": round(left, 1)}
        if late:
            about = "about " if estimated else ""
            self.warn(f"the push will not finish before the rental ends: {about}{remaining / MB:.1f} MB left at "
                      f"{rate / MB:.2f} MB/s (measured on the first {self._parts} parts) needs {needed:.0f} s, "
                      f"the rental ends in {left:.0f} s ({_when(self.deadline)})")

    def facts(self) -> dict | None:
        """What was predicted (for the result's JSON), or None when nothing was."""
        return self._facts
