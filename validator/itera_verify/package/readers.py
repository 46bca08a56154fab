"""Streaming readers for the line-oriented files: metrics (JSONL/CSV), frozen eval ids, predictions.

They return facts (records, line errors, series, id coverage) and never findings: the structure rules turn
the facts into IV103/IV104, the identity and stop rules into IV303/IV404/IV405. Each file is read once per
package (memoised in ctx.documents' caches). Predictions are never held in memory: one pass, with state bounded
by the number of eval ids, so a 2-million-line file costs what its id list costs. The lines themselves (JSONL
parsed or validated, CSV rows, line errors) come from linerecords.py.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from . import READER_SCANS
from .linerecords import LineErrors, csv_rows, non_blank_lines, parsed_lines, validate_jsonl

SAMPLE = 5  # how many ids a message shows


@dataclass
class MetricsScan(LineErrors):
    """What a metrics file says: per metric name, (step, value, line) in file order."""

    path: str = ""
    format: str = "jsonl"  # "jsonl" | "csv"
    records: int = 0
    series: dict[str, list[tuple[int, float, int]]] = field(default_factory=dict)
    header_only: bool = False  # CSV: the header and no record
    blank_only: bool = False  # nothing but blank lines (or 0 bytes)

    def last(self, name: str) -> tuple[int, float, int] | None:
        """The value at the highest step (the later line wins a tie), or None when the metric has no value."""
        points = self.series.get(name)
        if not points:
            return None
        return max(points, key=lambda p: (p[0], p[2]))

    def nonfinite(self, name: str) -> list[tuple[int, float, int]]:
        return [p for p in self.series.get(name, ()) if not math.isfinite(p[1])]


@dataclass
class GenericScan(LineErrors):
    """A JSONL or CSV file that is not a metrics or predictions file: does it parse, does it hold a record."""

    path: str = ""
    records: int = 0
    header_only: bool = False
    blank_only: bool = False


@dataclass
class EvalIds(LineErrors):
    """The frozen eval ids in file order (blank lines ignored), with the ids listed more than once."""

    path: str = ""
    ids: list[str] = field(default_factory=list)
    duplicate_count: int = 0  # extra occurrences
    duplicates: list[str] = field(default_factory=list)  # the first few ids listed twice

    @property
    def unique_count(self) -> int:
        return len(self.ids) - self.duplicate_count


@dataclass
class PredictionsScan(LineErrors):
    """How a predictions file covers the frozen eval ids. Samples are (id, line) of the first few."""

    path: str = ""
    eval_ids_path: str | None = None
    eval_id_count: int = 0
    records: int = 0
    blank_only: bool = False
    missing_count: int = 0
    missing: list[str] = field(default_factory=list)
    duplicate_count: int = 0  # records repeating an id already predicted
    duplicates: list[tuple[str, int]] = field(default_factory=list)
    unexpected_count: int = 0  # records whose id is not a frozen eval id
    unexpected: list[tuple[str, int]] = field(default_factory=list)
    without_id_count: int = 0  # object records with no string `id`
    without_id_lines: list[int] = field(default_factory=list)
    without_prediction_count: int = 0

    @property
    def covers_exactly(self) -> bool:
        return not (self.missing_count or self.duplicate_count or self.unexpected_count or self.without_id_count)

    @property
    def first_problem_line(self) -> int | None:
        lines = [s[1] for s in self.duplicates[:1] + self.unexpected[:1]] + self.without_id_lines[:1]
        return min(lines) if lines else None


# ---------------------------------------------------------------------------------------------- memo

def _memo(ctx) -> dict:
    """A per-package cache: checks of several families read the same files, each is read once."""
    return ctx.documents.cache(READER_SCANS)


def _once(ctx, key: tuple, read):
    """Read the file `key[1]` once per package, whichever check asks first; None when it is not a file."""
    cache = _memo(ctx)
    if key not in cache:
        cache[key] = read() if ctx.inventory.is_file(key[1]) else None
    return cache[key]


def _suffix(rel: str) -> str:
    name = rel.rsplit("/", 1)[-1]
    return name.rsplit(".", 1)[-1].lower() if "." in name else ""


STEP_LIMIT = 2 ** 63  # no trainer counts further; a bigger "step" is garbage, not a measurement


def _is_number(value: Any) -> bool:
    """An int or a float (NaN/Infinity included) that converts to a float: 10**400 does not."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        float(value)
    except OverflowError:
        return False
    return True


# ---------------------------------------------------------------------------------------------- metrics

def scan_metrics(ctx, rel: str) -> MetricsScan | None:
    """Read a metrics file (`.jsonl`, or `.csv` with the header step,name,value); None when it is not a file."""
    return _once(ctx, ("metrics", rel), lambda: _scan_metrics(ctx, rel))


def _scan_metrics(ctx, rel: str) -> MetricsScan:
    scan = MetricsScan(path=rel, format="csv" if _suffix(rel) == "csv" else "jsonl")
    if scan.format == "csv":
        _metrics_csv(ctx, rel, scan)
    else:
        _metrics_jsonl(ctx, rel, scan)
    return scan


def _add_point(scan: MetricsScan, step: int, name: str, value: float, line: int) -> None:
    scan.records += 1
    scan.series.setdefault(name, []).append((step, float(value), line))


def _metrics_jsonl(ctx, rel: str, scan: MetricsScan) -> None:
    seen_line = False
    for number, record, error in parsed_lines(ctx, rel):
        seen_line = True
        if error:
            scan.add_error(number, *error)
            continue
        problem = _metric_record_problem(record)
        if problem:
            scan.add_error(number, None, problem)
            continue
        _add_point(scan, record["step"], record["name"], record["value"], number)
    scan.blank_only = not seen_line


def _metric_record_problem(record: Any) -> str | None:
    if not isinstance(record, dict):
        return 'a metrics record is an object {"step": int, "name": str, "value": number}'
    step = record.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or abs(step) >= STEP_LIMIT:
        return f"step must be an integer under 2^63 (found {_shown(step)})"
    if not isinstance(record.get("name"), str) or not record["name"].strip():
        return f"name must be a non-empty string (found {_shown(record.get('name'))})"
    if not _is_number(record.get("value")):
        return f"value must be a number, NaN or Infinity (found {_shown(record.get('value'))})"
    return None


def _shown(value: Any) -> str:
    """A short rendering of an offending value (a huge number or a deep object stays one line)."""
    try:
        text = json.dumps(value)
    except (ValueError, TypeError, RecursionError):
        text = type(value).__name__
    return text if len(text) <= 40 else text[:37] + "..."


CSV_HEADER = ("step", "name", "value")


def _metrics_csv(ctx, rel: str, scan: MetricsScan) -> None:
    rows = csv_rows(ctx, rel, scan)
    first = next(rows, None)
    if first is None:
        scan.blank_only = scan.error_count == 0
        return
    number, header = first
    if sorted(h.lower() for h in header) != sorted(CSV_HEADER):
        scan.add_error(number, 1, f"the CSV header must be step,name,value (found {','.join(header)})")
        return  # without the header, columns cannot be told apart; reading on would invent values
    column = {h.lower(): i for i, h in enumerate(header)}
    data_rows = 0
    for number, row in rows:
        data_rows += 1
        if len(row) != 3:
            scan.add_error(number, None, f"expected 3 fields (step,name,value), found {len(row)}")
            continue
        step, name, value = (row[column[c]] for c in CSV_HEADER)
        try:
            step_int = int(step)
        except ValueError:
            step_int = STEP_LIMIT
        if abs(step_int) >= STEP_LIMIT:
            scan.add_error(number, None, f"step must be an integer under 2^63 (found {step[:40]!r})")
            continue
        if not name:
            scan.add_error(number, None, "name is empty")
            continue
        try:
            value_float = float(value)  # accepts NaN, Infinity, -Infinity, inf
        except ValueError:
            scan.add_error(number, None, f"value must be a number, NaN or Infinity (found {value[:40]!r})")
            continue
        _add_point(scan, step_int, name, value_float, number)
    scan.header_only = data_rows == 0


# ---------------------------------------------------------------------------------------------- other files

def scan_generic(ctx, rel: str) -> GenericScan | None:
    """Any other JSONL (one JSON value per line) or CSV (rows as wide as the header) file."""
    return _once(ctx, ("generic", rel), lambda: _scan_generic(ctx, rel))


def _scan_generic(ctx, rel: str) -> GenericScan:
    scan = GenericScan(path=rel)
    if _suffix(rel) == "csv":
        width = None
        for number, row in csv_rows(ctx, rel, scan):
            if width is None:
                width = len(row)
            elif len(row) != width:
                scan.add_error(number, None, f"expected {width} fields like the header, found {len(row)}")
            else:
                scan.records += 1
        scan.blank_only = width is None and scan.error_count == 0
        scan.header_only = width is not None and scan.records == 0 and scan.error_count == 0
        return scan
    scan.records, seen_line = validate_jsonl(ctx, rel, scan)
    scan.blank_only = not seen_line
    return scan


# ---------------------------------------------------------------------------------------------- eval ids

def read_eval_ids(ctx, rel: str) -> EvalIds | None:
    """The frozen eval ids, one per line, surrounding spaces ignored; None when `rel` is not a file."""
    return _once(ctx, ("eval_ids", rel), lambda: _read_eval_ids(ctx, rel))


def _read_eval_ids(ctx, rel: str) -> EvalIds:
    result = EvalIds(path=rel)
    seen: set[str] = set()
    for number, raw in non_blank_lines(ctx, rel):
        try:
            eval_id = raw.decode("utf-8").strip()
        except UnicodeDecodeError as exc:
            result.add_error(number, exc.start + 1, f"not UTF-8 text (byte {exc.start + 1})")
            continue
        if eval_id in seen:
            result.duplicate_count += 1
            if len(result.duplicates) < SAMPLE and eval_id not in result.duplicates:
                result.duplicates.append(eval_id)
        seen.add(eval_id)
        result.ids.append(eval_id)
    return result


# ---------------------------------------------------------------------------------------------- predictions

def scan_predictions(ctx, rel: str, eval_ids: EvalIds | None) -> PredictionsScan | None:
    """One streaming pass over a predictions file, against the frozen eval ids (coverage is not judged when
    `eval_ids` is None). None when `rel` is not a file."""
    key = ("predictions", rel, eval_ids.path if eval_ids is not None else None)
    return _once(ctx, key, lambda: _scan_predictions(ctx, rel, eval_ids))


def _sample(samples: list, item, count: int) -> None:
    if count <= SAMPLE:
        samples.append(item)


def _scan_predictions(ctx, rel: str, eval_ids: EvalIds | None) -> PredictionsScan:
    scan = PredictionsScan(path=rel, eval_ids_path=eval_ids.path if eval_ids else None)
    # id -> already predicted? One entry per eval id: the only state that grows.
    predicted: dict[str, bool] = dict.fromkeys(eval_ids.ids, False) if eval_ids is not None else {}
    scan.eval_id_count = len(predicted)
    judge = eval_ids is not None
    seen_line = False
    for number, record, error in parsed_lines(ctx, rel):
        seen_line = True
        if error:
            scan.add_error(number, *error)
            continue
        if not isinstance(record, dict):
            scan.add_error(number, None, 'a predictions record is an object {"id": str, "prediction": ...}')
            continue
        scan.records += 1
        if "prediction" not in record:
            scan.without_prediction_count += 1
        pred_id = record.get("id")
        if not isinstance(pred_id, str):
            scan.without_id_count += 1
            _sample(scan.without_id_lines, number, scan.without_id_count)
            continue
        if not judge:
            continue
        state = predicted.get(pred_id)
        if state is None:
            scan.unexpected_count += 1
            if len(scan.unexpected) < SAMPLE and all(pred_id != s[0] for s in scan.unexpected):
                scan.unexpected.append((pred_id, number))
        elif state:
            scan.duplicate_count += 1
            if len(scan.duplicates) < SAMPLE and all(pred_id != s[0] for s in scan.duplicates):
                scan.duplicates.append((pred_id, number))
        else:
            predicted[pred_id] = True
    scan.blank_only = not seen_line
    if judge:
        for eval_id, done in predicted.items():
            if not done:
                scan.missing_count += 1
                _sample(scan.missing, eval_id, scan.missing_count)
    return scan
