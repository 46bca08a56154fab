"""One archive's audit in a batch: what each worker runs (a forked child, batch_local.py; a Ray task,
batch_ray.py) and the row it returns. The batch workflow (batch.py) schedules them and never runs one itself."""
from __future__ import annotations

import hashlib
import json
import os
import time

from ..model import UsageError
from ..options import RunOptions
from ..report.batch import FAIL, AuditRow
from ..report.json_format import finite
from .batch_results import ResultStore
from .batch_sources import Entry

PROGRESS_KEY = "batch"


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


__all__ = ["PROGRESS_KEY", "archive_sha256", "audit_entry", "failed_row", "prepare"]
