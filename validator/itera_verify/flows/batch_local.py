"""`--engine local` (the default): each archive audited in a child forked from this process, `batch_jobs` at once.

This process has imported the tool and its libraries once; a fork starts each audit in milliseconds with all of
it (a shell loop pays an interpreter and the imports per archive). A child hands back its row as JSON bytes
(runtime/launcher.Forked raw: no pickle crosses back from a process that read hostile input), read here as it
arrives, bounded in bytes, and parsed by the bounded JSON reader. What one archive does cannot stop the others:
- a child that raises, dies (a signal, the kernel's OOM killer) or writes no row is one failed row;
- a child past its time (`audit_seconds`: 10 minutes, plus a second per 4 MiB of archive, plus 20 reloads' worth
  of --timeout under --reload) or its memory (`audit_memory`: the machine's memory shared by the jobs and this
  process, at least 2 GiB resident) is killed, with everything it started, and is one failed row saying which.
"""
from __future__ import annotations

import os
import select
import time
from collections import deque
from dataclasses import dataclass, field
from functools import partial

from ..options import RunOptions
from ..package.jsonread import read_json
from ..push.listing import RESULT_MAX
from ..report.batch import AuditRow
from ..runtime.launcher import ChildFailed, ChildLost, Forked, kill_tree, resident_bytes, termination_unwinds
from ..runtime.progress import Progress
from .batch_entry import PROGRESS_KEY, audit_entry, failed_row
from .batch_results import ResultStore
from .batch_sources import Entry

AUDIT_BASE_SECONDS = 600.0
AUDIT_BYTES_PER_SECOND = 4 << 20
UNKNOWN_SIZE_SECONDS = 6 * 3600.0  # an s3:// key of a list: its size is not known before its audit starts
RELOADS_ALLOWED = 20  # --reload: this many reloads' --timeout on top
MIN_AUDIT_MEMORY = 2 << 30
ROW_MAX = RESULT_MAX + (1 << 20)
POLL_SECONDS = 0.2


def audit_seconds(entry: Entry, options: RunOptions) -> float:
    extra = options.timeout * RELOADS_ALLOWED if options.reload else 0.0
    size = UNKNOWN_SIZE_SECONDS if entry.size is None else entry.size / AUDIT_BYTES_PER_SECOND
    return AUDIT_BASE_SECONDS + size + extra


def audit_memory(jobs: int) -> int:
    """Resident bytes one audit process may hold (its reload children have their own limit)."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return MIN_AUDIT_MEMORY
    return max(MIN_AUDIT_MEMORY, total // (jobs + 1))


@dataclass
class _Running:
    entry: Entry
    child: Forked
    started: float
    deadline: float
    received: bytearray = field(default_factory=bytearray)


def run_local(entries: list[Entry], options: RunOptions, store: ResultStore | None, ended, progress: Progress) -> None:
    """Audit `entries`, `options.batch_jobs` at once; `ended(row, slowest)` as each ends."""
    pending = deque(entries)
    running: dict[int, _Running] = {}
    memory = audit_memory(options.batch_jobs)
    with termination_unwinds():  # Ctrl-C or SIGTERM: every audit in flight is ended below
        try:
            while pending or running:
                while pending and len(running) < options.batch_jobs:
                    entry = pending.popleft()
                    now = time.monotonic()
                    try:
                        child = Forked(partial(audit_entry, entry, options, store), raw=True)
                    except OSError as exc:  # no process now (a limit): this archive fails, the batch goes on
                        ended(failed_row(entry, f"its audit process could not start ({exc.strerror or exc})", 0.0),
                              _slowest(running))
                        continue
                    running[child.fileno()] = _Running(entry, child, now, now + audit_seconds(entry, options))
                    progress.began(PROGRESS_KEY, entry.key)
                ready, _, _ = select.select(list(running), [], [], POLL_SECONDS)
                for fd in ready:
                    job = running[fd]
                    chunk = os.read(fd, 1 << 20)
                    job.received += chunk
                    if len(job.received) > ROW_MAX:
                        _stop(running.pop(fd), f"its report is larger than {ROW_MAX:,} bytes", ended, running)
                    elif not chunk:
                        del running[fd]
                        ended(_row(job, job.child.ended()), _slowest(running))
                now = time.monotonic()
                for fd, job in list(running.items()):
                    if now > job.deadline:
                        _stop(running.pop(fd), f"stopped after {now - job.started:.0f} s, its limit for an archive "
                              "of this size", ended, running)
                    elif (resident_bytes(job.child.pid) or 0) > memory:
                        _stop(running.pop(fd), f"stopped: its memory passed {memory:,} bytes", ended, running)
        finally:
            for job in running.values():
                _end(job.child)


def _end(child: Forked) -> None:
    """The child and everything it started (a reload child, a zygote) are killed and reaped."""
    if child.pid is not None:
        kill_tree(child.pid)
    child.cancel()


def _stop(job: _Running, why: str, ended, running: dict) -> None:
    _end(job.child)
    ended(failed_row(job.entry, f"the audit was {why}" if why.startswith("stopped") else
                     f"the audit failed: {why}", time.monotonic() - job.started), _slowest(running))


def _row(job: _Running, status: int | None) -> AuditRow:
    seconds = time.monotonic() - job.started
    try:
        data = job.child.outcome(bytes(job.received), status)
        row = AuditRow.from_json(read_json(data, max_bytes=ROW_MAX))
    except ChildLost:
        return failed_row(job.entry, f"the audit process ended without a result ({_status_words(status)})", seconds)
    except ChildFailed as exc:
        return failed_row(job.entry, f"the audit failed: {str(exc)[:300]}", seconds)
    except ValueError as exc:  # not a row: what a child that went wrong wrote
        return failed_row(job.entry, f"the audit process wrote no valid row ({str(exc)[:200]})", seconds)
    if (row.archive, row.key) != (job.entry.source, job.entry.key):
        return failed_row(job.entry, "the audit process wrote the row of another archive", seconds)
    return row


def _status_words(status: int | None) -> str:
    if status is None:
        return "status unknown"
    if os.WIFSIGNALED(status):
        import signal

        number = os.WTERMSIG(status)
        name = signal.Signals(number).name if number in signal.Signals.__members__.values() else str(number)
        return f"killed by {name}" + (" (out of memory?)" if number == signal.SIGKILL else "")
    return f"exit status {os.waitstatus_to_exitcode(status)}"


def _slowest(running: dict) -> tuple[str, float] | None:
    if not running:
        return None
    job = min(running.values(), key=lambda job: job.started)
    return job.entry.key, time.monotonic() - job.started


__all__ = ["audit_memory", "audit_seconds", "run_local"]
