"""Readings of the manifest that several rule families and the summary share, tolerant of any malformed shape.

Every helper returns None (or an empty collection) for what it cannot read: the structure and schema rules
report malformed documents; the families built on these helpers only judge what they can read.
"""
from __future__ import annotations

import math
from datetime import datetime, timezone
from typing import Any, Iterator

from ..format.money import MAX_USD
from ..format.values import is_number, listed
from . import readers
from .template import is_placeholder

# What a sane number in the manifest is. Beyond these a value is a typo or a probe, and arithmetic on it proves
# nothing: the structure rules report it (IV105, with the sane range), and the budget rules compute only on
# values within them (NaN compares false everywhere, so it must never reach a comparison that could pass).
MAX_HOURS = 100_000  # window, reserved, observed and deviation hours (about 11 years)
MAX_DAYS = 3650  # a lot's length
MAX_GPUS = 100_000  # GPUs in one lot
MAX_THRESHOLD = 1e15  # a stop rule's metric threshold, either sign
# (path in the manifest, "*" for any array index) -> (largest magnitude, the sane value in words)
NUMBER_FIELDS: dict[tuple[str, ...], tuple[float, str]] = {
    ("plan", "window_hours"): (MAX_HOURS, f"hours between 0 and {MAX_HOURS:,}"),
    ("plan", "reserved_hours"): (MAX_HOURS, f"hours between 0 and {MAX_HOURS:,}"),
    ("plan", "lots", "*", "days"): (MAX_DAYS, f"days between 0 and {MAX_DAYS:,}"),
    ("plan", "lots", "*", "gpus"): (MAX_GPUS, f"a whole number of GPUs between 1 and {MAX_GPUS:,}"),
    ("plan", "lots", "*", "price_usd"): (MAX_USD, f"an amount in USD between 0 and {MAX_USD:,}"),
    ("plan", "rental_total_usd"): (MAX_USD, f"an amount in USD between 0 and {MAX_USD:,}"),
    ("plan", "other_expenses", "*", "usd"): (MAX_USD, f"an amount in USD between 0 and {MAX_USD:,}"),
    ("stop_rules", "rules", "*", "threshold"): (MAX_THRESHOLD, "a metric value between -1e15 and 1e15"),
    ("timeline", "observed_hours"): (MAX_HOURS, f"hours between 0 and {MAX_HOURS:,}"),
    ("timeline", "deviations", "*", "hours"): (MAX_HOURS, f"signed hours between -{MAX_HOURS:,} and {MAX_HOURS:,}"),
    ("decision", "cost_per_accepted_usd"): (MAX_USD, f"an amount in USD between 0 and {MAX_USD:,}"),
}


def numbers_out_of_range(manifest: Any) -> Iterator[tuple[tuple, Any, str | None]]:
    """(path, value, the sane value in words or None) for every number of the manifest that is not finite
    (NaN, Infinity: JSON has neither), and every number of a known field beyond its bound."""
    stack: list[tuple[tuple, Any]] = [((), manifest)]
    while stack:  # no recursion: a hostile manifest may nest deeper than Python's stack
        path, value = stack.pop()
        if isinstance(value, dict):
            stack.extend(((*path, key), item) for key, item in reversed(list(value.items())))
        elif isinstance(value, list):
            stack.extend(((*path, index), item) for index, item in reversed(list(enumerate(value))))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            field = NUMBER_FIELDS.get(tuple("*" if isinstance(p, int) else p for p in path))
            if not _finite(value) or (field is not None and abs(value) > field[0]):
                yield path, value, field[1] if field else None


def _finite(value: int | float) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an integer too large for a float is finite, and caught by the bounds
        return True




def filled_text(value: Any) -> str | None:
    """A string that says something: not blank, not a template placeholder."""
    if isinstance(value, str) and value.strip() and not is_placeholder(value):
        return value.strip()
    return None


def shown(value: Any, fallback: str = "?") -> str:
    """A manifest value inside a message: strings and numbers as written, anything else as `fallback` (never
    the repr of an arbitrary, possibly huge or deeply nested, object)."""
    if isinstance(value, str):
        return value if len(value) <= 80 else value[:77] + "..."
    return f"{value:g}" if is_number(value) else fallback


def parse_time(value: Any) -> datetime | None:
    """An RFC 3339 timestamp as an aware datetime (a naive one is read as UTC); None when unreadable."""
    if not isinstance(value, str) or not value.strip():
        return None
    text = value.strip()
    if text[-1:] in ("Z", "z"):
        text = text[:-1] + "+00:00"
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def section(manifest: dict, key: str) -> dict:
    value = manifest.get(key)
    return value if isinstance(value, dict) else {}




def indexed_runs(ctx) -> Iterator[tuple[int, dict, str | None]]:
    """(index in manifest.runs, run, its id or None) for every run entry that is an object."""
    for index, run in enumerate(listed(ctx.documents.manifest, "runs")):
        if isinstance(run, dict):
            yield index, run, run.get("id") if isinstance(run.get("id"), str) else None


def runs_by_id(ctx) -> dict[str, dict]:
    """The first run of each id (IV301 reports the others)."""
    runs: dict[str, dict] = {}
    for _, run, run_id in indexed_runs(ctx):
        if run_id is not None:
            runs.setdefault(run_id, run)
    return runs


def accepted_entries(ctx) -> list[tuple[int, str]]:
    """(index in decision.accepted, run id) for every string entry, duplicates included."""
    accepted = listed(section(ctx.documents.manifest, "decision"), "accepted")
    return [(index, name) for index, name in enumerate(accepted) if isinstance(name, str)]


def accepted_declared(ctx) -> list[str]:
    """The distinct runs `decision.accepted` names, in order."""
    return list(dict.fromkeys(name for _, name in accepted_entries(ctx)))


def stop_records(ctx) -> list[tuple[int, dict]]:
    return [(index, record) for index, record in enumerate(listed(ctx.documents.stops, "stops"))
            if isinstance(record, dict)]


def stopped_by_record(ctx) -> dict[str, tuple[int, dict]]:
    """run id -> its first stop record."""
    records: dict[str, tuple[int, dict]] = {}
    for index, record in stop_records(ctx):
        if isinstance(record.get("run"), str):
            records.setdefault(record["run"], (index, record))
    return records


def first_run_start(ctx) -> tuple[datetime, str | None, int] | None:
    """(earliest readable started_at, its run id, its index), or None when no run has a readable start."""
    starts = [(moment, run_id, index) for index, run, run_id in indexed_runs(ctx)
              if (moment := parse_time(run.get("started_at"))) is not None]
    return min(starts, key=lambda s: s[0]) if starts else None










def fmt_hours(hours: float) -> str:
    return f"{hours:g} h"


def fmt_ids(ids, count: int) -> str:
    text = ", ".join(ids)
    return text + (", …" if count > len(ids) else "")


def metrics_of(ctx, run: dict) -> "readers.MetricsScan | None":
    """A run's parsed metrics file (read once per package), or None when it names none."""
    ref = run.get("metrics")
    rel = ctx.inventory.normalise_ref(ref) if isinstance(ref, str) else None
    return readers.scan_metrics(ctx, rel) if rel else None


def run_params(ctx, run_id: str | None) -> dict | None:
    """The parsed params file of the run with this id, when it is a JSON object."""
    for run in ctx.documents.runs():
        if run.get("id") == run_id and isinstance(run.get("params"), str):
            rel = ctx.inventory.normalise_ref(run["params"])
            params = ctx.documents.json_value(rel) if rel else None
            return params if isinstance(params, dict) else None
    return None


def fp16_run(ctx, run_id: str | None) -> bool:
    """Mixed precision per the run's params file: `"fp16": true` or `"mixed_precision": "fp16"` (docs/format.md); the
    static resume checks and the reload read it alike."""
    params = run_params(ctx, run_id)
    return bool(params) and (params.get("fp16") is True or params.get("mixed_precision") == "fp16")


def recorded_world_size(ctx, run_id: str | None) -> int | None:
    """The number of processes a run's params record (`world_size`), when they record one (multi-GPU:
    docs/format.md)."""
    params = run_params(ctx, run_id)
    size = params.get("world_size") if params else None
    return size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else None
