"""`--format jsonl`: JSON lines. One audit's report on one line; a batch, one row per archive and line (its report
inside, as `--format json` writes it), in the order the audits ended: the command line writes each line as its
archive ends, so a pipe reads them while the batch runs."""
from __future__ import annotations

import json

from . import Report
from .json_format import finite


def line(value) -> str:
    return json.dumps(finite(value), allow_nan=False, default=str, separators=(",", ":")) + "\n"


def render(report: Report, options: dict) -> str:
    return line(report.to_json())


def render_batch(batch, options: dict) -> str:
    return "".join(line(row.to_json()) for row in batch.rows)
