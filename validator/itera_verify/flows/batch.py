"""The batch workflow: `itera-verify audit DIR/ | s3://BUCKET/PREFIX/ | @list.txt`.

Every archive listed (batch_sources.py), or this shard's slice of them, is audited as `audit` audits one: each in
a process of its own (batch_local.py: forked from this one, which imported everything once; or a Ray task,
batch_ray.py), `batch_jobs` at a time. An archive that cannot be read, or whose process dies or runs past its
limits, is one failed row: the batch goes on. With `results`, each archive's report is kept under its SHA-256
(batch_results.py) and a rerun reads back what is there instead of auditing it again.

`on_row(row, batch)` is called as each archive ends, in the order they end (a `--format jsonl` line is written
then); the BatchReport holds every row at the end.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from typing import Callable

from ..model import UsageError
from ..options import RunOptions
from ..report.batch import FAIL, AuditRow, BatchReport
from ..report.json_format import finite
from ..runtime.progress import NULL_PROGRESS, Progress
from .batch_results import ResultStore
from .batch_sources import Entry, list_archives, shard_of
from .config import settle

PROGRESS_KEY = "batch"
RowCallback = Callable[[AuditRow, BatchReport], None]


def audit_batch(target: str, options: RunOptions | None = None, *, progress: Progress | None = None,
                on_row: RowCallback | None = None) -> BatchReport:
    """Audit every archive `target` names (a folder, an s3:// prefix, `@list.txt`). UsageError (exit 2) when the
    batch cannot run: nothing to list, no archive found, an engine missing."""
    options = settle(reviewer=True) if options is None else options
    progress = NULL_PROGRESS if progress is None else progress
    started = time.monotonic()
    if options.engine == "ray":  # a missing Ray is one line before anything is listed
        from .batch_ray import require_ray

        require_ray()
    store = ResultStore(options.results, options) if options.results else None
    listing = list_archives(target, options.endpoint_url)
    if not listing.entries:
        shown = f" ({listing.skipped_count} other entries, e.g. {', '.join(listing.skipped[:3])})" \
            if listing.skipped_count else ""
        raise UsageError(f"{target}: no *.tar.zst archive to audit{shown}")
    entries = shard_of(listing.entries, options.shard)
    batch = BatchReport(target, found=len(listing.entries), selected=len(entries), shard=options.shard,
                        skipped=listing.skipped, skipped_count=listing.skipped_count, engine=options.engine,
                        jobs=options.batch_jobs, results=options.results, strict=options.selection.strict)
    if listing.skipped_count:
        progress.log(f"skipped {listing.skipped_count} {'entry' if listing.skipped_count == 1 else 'entries'}, "
                     "not *.tar.zst archives: "
                     + ", ".join(listing.skipped[:5]) + (", …" if listing.skipped_count > 5 else ""))

    def ended(row: AuditRow, slowest: tuple[str, float] | None) -> None:
        """An archive's row, as its audit ends; `slowest`: the archive in flight the longest, and for how long."""
        if store is not None and not row.reused and row.report is not None:
            store.put(row.report)  # a write that fails stops the batch (exit 2): a rerun would audit it again
        batch.rows.append(row)
        progress.ended(PROGRESS_KEY, row.key, ok=row.verdict != FAIL)
        progress.advance(PROGRESS_KEY)
        progress.log(row_line(row, batch, slowest))
        if on_row is not None:
            on_row(row, batch)

    if entries:
        prepare()
        if options.engine == "ray":
            from .batch_ray import ray_cluster, run_ray

            with ray_cluster(options) as ray:
                _with_progress(progress, entries, lambda: run_ray(ray, entries, options, store, ended, progress))
        else:
            from .batch_local import run_local

            _with_progress(progress, entries, lambda: run_local(entries, options, store, ended, progress))
    if store is not None:
        refused = sum(1 for row in batch.rows if row.not_reused)
        batch.notes.append(f"--results {options.results}: {batch.reused} reused, {batch.audited} audited"
                           + (f" ({refused} stored result{'s' if refused > 1 else ''} not reused: not authentic, or "
                              "not of that archive)" if refused else ""))
        progress.log(batch.notes[-1])
    batch.elapsed_seconds = time.monotonic() - started
    return batch


def _with_progress(progress: Progress, entries: list[Entry], run: Callable[[], None]) -> None:
    progress.start(PROGRESS_KEY, f"auditing {len(entries)} archives", total=len(entries), unit="archives")
    try:
        run()
    finally:
        progress.finish(PROGRESS_KEY)


def prepare() -> None:
    """What every audit needs, imported and built once here, before the children fork: each starts with it
    (the workflow, the rule families, the compiled JSON Schemas) instead of paying for it again."""
    from ..package.schemas import NAMES, validator
    from ..rules import all_rules
    from . import audit  # noqa: F401

    all_rules()
    for name in NAMES:
        validator(name)


def audit_entry(entry: Entry, options: RunOptions, store: ResultStore | None) -> bytes:
    """One archive, in the process of its own that audits it: its row as JSON. A stored result is reused only for
    the SHA-256 of the bytes read here; an archive that cannot be read is a failed row, never an exception."""
    from .audit import audit

    started = time.monotonic()
    row = AuditRow(entry.source, entry.key)
    try:
        if store is not None:
            row.sha256 = archive_sha256(entry, options)
            stored, row.not_reused = store.get(row.sha256)
            if stored is not None:
                row.report, row.reused, row.verdict = stored, True, stored.get("verdict", FAIL)
        if row.report is None:
            report = audit(entry.source, options)
            row.report, row.verdict = finite(report.to_json()), report.verdict
            row.sha256 = (report.archive or {}).get("sha256") or row.sha256
    except UsageError as exc:  # unreadable: no such file, a fifo, a store that refuses it
        row.error = str(exc)
    row.seconds = time.monotonic() - started
    return json.dumps(row.to_json(), allow_nan=False, default=str).encode("utf-8")


def archive_sha256(entry: Entry, options: RunOptions) -> str:
    """The SHA-256 of the archive's bytes, read here (for --results: never what beside it claims)."""
    if entry.source.startswith("s3://"):
        from ..push.remote import open_remote

        return open_remote(entry.source, options.endpoint_url).sha256()
    from .audit import open_archive

    fd = open_archive(entry.source)  # a regular file, or UsageError: a fifo never blocks the batch
    try:
        with os.fdopen(fd, "rb", closefd=False) as handle:
            return hashlib.file_digest(handle, "sha256").hexdigest()
    except OSError as exc:
        raise UsageError(f"{entry.source}: cannot read ({exc.strerror or exc})") from None
    finally:
        os.close(fd)


def failed_row(entry: Entry, why: str, seconds: float) -> AuditRow:
    return AuditRow(entry.source, entry.key, FAIL, seconds, error=why)


def row_line(row: AuditRow, batch: BatchReport, slowest: tuple[str, float] | None) -> str:
    """What the progress says as an archive ends: `[3/10] FAIL a.tar.zst (IV701) 4.2 s; slowest in flight: …`."""
    codes = sorted({f.get("code") for f in (row.report or {}).get("findings", []) if isinstance(f, dict)
                    and f.get("severity") == "error"})
    said = row.error or (", ".join(str(c) for c in codes[:5]) if codes else "")
    reused = " (reused)" if row.reused else f" (stored result not reused: {row.not_reused})" if row.not_reused \
        else ""
    line = f"[{len(batch.rows)}/{batch.selected}] {row.verdict.upper()} {row.key}{reused}" + (
        f": {said}" if said else "") + f", {row.seconds:.1f} s"
    if slowest is not None:
        line += f"; slowest in flight: {slowest[0]}, {slowest[1]:.0f} s"
    return line


__all__ = ["audit_batch", "audit_entry"]
