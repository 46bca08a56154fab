"""The seal's rate on this machine, measured now (docs/record.md, Campaign time: before the
checks, the seal is estimated from a rate measured there and then).

A rented machine's disk and cores are not the benchmark's: the estimate that says whether the seal fits before
the rental ends times the seal's own work on this package, here. The real archive writer (archive/writer.py:
the tar framing, SHA-256 on the bytes compressed, zstd frames at the seal's level and per-file profile, on its
threads) writes the first SAMPLE_BYTES of the package's largest files, read from the disk, into a sink that
keeps nothing. The largest files are the seal's time (weights, optimizer states); the first bytes of a file
compress as the rest does. The checks run beside the real seal and share the cores: MARGIN (report/summary.py)
is there for that."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Iterable

from ..archive.writer import FRAME_SPAN, ArchiveWriter, worker_count

SAMPLE_BYTES = 32 * 2**20  # 4 frames: a quarter of a second on a slow machine, enough for a steady rate


@dataclass(frozen=True)
class Measured:
    bytes_per_second: float
    sample_bytes: int
    seconds: float
    level: int
    workers: int

    def words(self) -> str:
        """How the rate was measured, for the estimate's text."""
        return (f"measured here: the seal's writer (SHA-256, zstd level {self.level}, {self.workers} "
                f"thread{'s' if self.workers != 1 else ''}) took {self.seconds:.2f} s over the first "
                f"{self.sample_bytes / 2**20:.1f} MiB of the package's largest files")


class _Sink:
    """A file object that keeps nothing (no fileno: the writer starts no writeback on it)."""

    def write(self, data) -> int:
        return len(data)

    def flush(self) -> None:
        pass


def measure(files: Iterable[tuple[str, int]], *, level: int = 3, threads: int = 0,
            sample: int = SAMPLE_BYTES) -> Measured | None:
    """Time the seal's writer over the first `sample` bytes of `files` ((path, size) pairs), largest first.
    None when nothing could be read (an empty package, unreadable files): the caller keeps its prior."""
    chosen, left = [], sample
    for path, size in sorted(files, key=lambda item: -item[1]):
        if left <= 0 or size <= 0:
            break
        chosen.append((path, min(size, left)))
        left -= min(size, left)
    if not chosen:
        return None
    writer = ArchiveWriter(_Sink(), level=level, threads=threads)
    began, total = time.perf_counter(), 0
    try:
        for index, (path, size) in enumerate(chosen):
            data = _first_bytes(path, size)
            if len(data) != size:  # the file shrank or could not be read: time what was read
                size = len(data)
            if size:
                writer.add_file(f"sample/{index}", size, (data[i:i + FRAME_SPAN] for i in range(0, size, FRAME_SPAN)))
                total += size
        writer.close()
    except BaseException:
        writer.abandon()
        raise
    seconds = time.perf_counter() - began
    if total <= 0 or seconds <= 0:
        return None
    return Measured(total / seconds, total, seconds, level, worker_count(threads))


def measure_package(ctx, *, level: int = 3, threads: int = 0) -> Measured | None:
    """The seal's rate on this package's files, at the seal's level and threads (the workflow calls it once, when a
    rental's end is known, and hands it to the report's rental estimate)."""
    files = [(ctx.inventory.os_path(rel), entry.size) for rel, entry in ctx.inventory.files.items()]
    return measure(files, level=level, threads=threads)


def _first_bytes(path: str, size: int) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return b""
    try:
        chunks, left = [], size
        while left > 0:
            chunk = os.read(fd, min(left, FRAME_SPAN))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    except OSError:
        return b"".join(chunks)
    finally:
        os.close(fd)
