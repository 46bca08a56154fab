"""Streaming readers for the line-oriented files: metrics (JSONL/CSV), frozen eval ids, predictions.

They return facts (records, line errors, series, id coverage) and never findings: the structure rules turn
the facts into IV103/IV104, the identity and stop rules into IV303/IV404/IV405. Each file is read once per
package (memoised on the package object). Predictions are never held in memory: one pass, with state bounded
by the number of eval ids, so a 2-million-line file costs what its id list costs.
"""
from __future__ import annotations

import csv
import itertools
import json
import math
from dataclasses import dataclass, field
from typing import Any, Iterator

from ..model import UsageError
from .files import open_binary
from .lineblocks import line_blocks

MAX_KEPT_ERRORS = 1000  # a garbage file must not cost one object per line; `error_count` keeps the total
SAMPLE = 5  # how many ids a message shows


@dataclass(frozen=True)
class LineError:
    line: int
    column: int | None
    message: str


@dataclass
class _Errors:
    errors: list[LineError] = field(default_factory=list)
    error_count: int = 0

    def add_error(self, line: int, column: int | None, message: str) -> None:
        self.error_count += 1
        if len(self.errors) < MAX_KEPT_ERRORS:
            self.errors.append(LineError(line, column, message))


@dataclass
class MetricsScan(_Errors):
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
class GenericScan(_Errors):
    """A JSONL or CSV file that is not a metrics or predictions file: does it parse, does it hold a record."""

    path: str = ""
    records: int = 0
    header_only: bool = False
    blank_only: bool = False


@dataclass
class EvalIds(_Errors):
    """The frozen eval ids in file order (blank lines ignored), with the ids listed more than once."""

    path: str = ""
    ids: list[str] = field(default_factory=list)
    duplicate_count: int = 0  # extra occurrences
    duplicates: list[str] = field(default_factory=list)  # the first few ids listed twice

    @property
    def unique_count(self) -> int:
        return len(self.ids) - self.duplicate_count


@dataclass
class PredictionsScan(_Errors):
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

def _memo(package) -> dict:
    """A per-package cache: checks of several families read the same files, each is read once."""
    cache = getattr(package, "_reader_scans", None)
    if cache is None:
        cache = {}
        package._reader_scans = cache
    return cache


def _once(package, key: tuple, read):
    """Read the file `key[1]` once per package, whichever check asks first; None when it is not a file."""
    cache = _memo(package)
    if key not in cache:
        cache[key] = read() if package.is_file(key[1]) else None
    return cache[key]


BOM = b"\xef\xbb\xbf"


def _lines(package, rel: str) -> Iterator[tuple[int, bytes]]:
    """Non-blank lines; the first one without a UTF-8 byte-order mark (editors on Windows add one)."""
    return _non_blank(package.iter_lines(rel))


def _non_blank(numbered: Iterator[tuple[int, bytes]]) -> Iterator[tuple[int, bytes]]:
    for number, raw in numbered:
        if number == 1 and raw.startswith(BOM):
            raw = raw[3:]
        if raw.strip():
            yield number, raw


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


def _parse_json_line(raw: bytes) -> tuple[Any, tuple[int | None, str] | None]:
    """(value, None) or (None, (column, message)). Python's json reads NaN/Infinity/-Infinity as floats."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return None, (exc.start + 1, f"not UTF-8 text (byte {exc.start + 1})")
    try:
        return json.loads(text), None
    except json.JSONDecodeError as exc:
        return None, (exc.colno, f"invalid JSON: {exc.msg}")
    except ValueError as exc:  # e.g. an integer of more than 4300 digits
        return None, (None, f"invalid JSON: {exc}"[:200])
    except RecursionError:
        return None, (None, "invalid JSON: nesting too deep")


BATCH_LINES = 4096
BATCH_BYTES = 128 << 10  # memory stays bounded by the batch, whatever the file or line size


def _parsed_lines(package, rel: str) -> Iterator[tuple[int, Any, tuple[int | None, str] | None]]:
    """(line number, value, None) or (line number, None, (column, message)) for every non-blank JSONL line."""
    return _parse_numbered(_lines(package, rel))


def _parse_numbered(lines: Iterator[tuple[int, bytes]]) -> Iterator[tuple[int, Any, tuple[int | None, str] | None]]:
    """One json.loads over "[line,line,...]" per batch costs a fraction of one call per line; a batch that fails,
    or whose element count differs from its line count (a line holding two values, or one value spread over
    two lines), is parsed again line by line, so every error keeps its own line and column."""
    batch: list[tuple[int, bytes]] = []
    batch_bytes = 0
    for number, raw in lines:
        batch.append((number, raw))
        batch_bytes += len(raw)
        if len(batch) == BATCH_LINES or batch_bytes >= BATCH_BYTES:
            yield from _parse_batch(batch)
            batch, batch_bytes = [], 0
    if batch:
        yield from _parse_batch(batch)


def _parse_batch(batch: list[tuple[int, bytes]]) -> Iterator[tuple[int, Any, tuple[int | None, str] | None]]:
    try:
        values = json.loads(b"[" + b",".join(raw for _, raw in batch) + b"]")
    except (ValueError, RecursionError):
        values = None
    if isinstance(values, list) and len(values) == len(batch):
        for (number, _), value in zip(batch, values):
            yield number, value, None
        return
    for number, raw in batch:
        value, error = _parse_json_line(raw)
        yield number, value, error


# ---------------------------------------------------------------------------------------------- metrics

def scan_metrics(package, rel: str) -> MetricsScan | None:
    """Read a metrics file (`.jsonl`, or `.csv` with the header step,name,value); None when it is not a file."""
    return _once(package, ("metrics", rel), lambda: _scan_metrics(package, rel))


def _scan_metrics(package, rel: str) -> MetricsScan:
    scan = MetricsScan(path=rel, format="csv" if _suffix(rel) == "csv" else "jsonl")
    if scan.format == "csv":
        _metrics_csv(package, rel, scan)
    else:
        _metrics_jsonl(package, rel, scan)
    return scan


def _add_point(scan: MetricsScan, step: int, name: str, value: float, line: int) -> None:
    scan.records += 1
    scan.series.setdefault(name, []).append((step, float(value), line))


def _metrics_jsonl(package, rel: str, scan: MetricsScan) -> None:
    seen_line = False
    for number, record, error in _parsed_lines(package, rel):
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


def _csv_rows(package, rel: str, scan: _Errors) -> Iterator[tuple[int, list[str]]]:
    for number, raw in _lines(package, rel):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            scan.add_error(number, exc.start + 1, f"not UTF-8 text (byte {exc.start + 1})")
            continue
        try:
            row = next(csv.reader([text]))
        except csv.Error as exc:
            scan.add_error(number, None, f"invalid CSV: {exc}")
            continue
        yield number, [cell.strip() for cell in row]


def _metrics_csv(package, rel: str, scan: MetricsScan) -> None:
    rows = _csv_rows(package, rel, scan)
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

def scan_generic(package, rel: str) -> GenericScan | None:
    """Any other JSONL (one JSON value per line) or CSV (rows as wide as the header) file."""
    return _once(package, ("generic", rel), lambda: _scan_generic(package, rel))


def _scan_generic(package, rel: str) -> GenericScan:
    scan = GenericScan(path=rel)
    if _suffix(rel) == "csv":
        width = None
        for number, row in _csv_rows(package, rel, scan):
            if width is None:
                width = len(row)
            elif len(row) != width:
                scan.add_error(number, None, f"expected {width} fields like the header, found {len(row)}")
            else:
                scan.records += 1
        scan.blank_only = width is None and scan.error_count == 0
        scan.header_only = width is not None and scan.records == 0 and scan.error_count == 0
        return scan
    seen_line = False
    for number, records, error in _validated_lines(package, rel):
        seen_line = True
        if error:
            scan.add_error(number, *error)
        scan.records += records
    scan.blank_only = not seen_line
    return scan


# ---------------------------------------------------------------------------------------------- validation only

VALIDATE_BLOCK = 4 << 20
LONG_LINE = 64 << 20  # past this without a newline, the block path gives way to the line-by-line one


def _validator():
    """simdjson validates without building Python objects, about 15x faster than json.loads on a large JSONL.
    Optional: without it, every line goes through json.loads as before."""
    try:
        import simdjson
    except ImportError:  # pragma: no cover - a platform without a pysimdjson wheel
        return None
    return simdjson.Parser()


def _validated_lines(package, rel: str) -> Iterator[tuple[int, int, tuple[int | None, str] | None]]:
    """(first line, records, None) for a run of valid lines, (line, 0, (column, message)) for an invalid one:
    _parsed_lines without the values, for files whose values nobody needs (any other JSONL).

    Whole blocks of complete lines are validated at once as one array ("[l1,l2,...]"). simdjson is strict
    (RFC 8259): what it accepts, json.loads accepts too. A block it refuses (a blank line, NaN, a big integer, a
    real error) is parsed line by line by json.loads, which alone decides and places every error; so the
    outcome is exactly that of the line-by-line path, only faster on the common, clean case."""
    parser = _validator()
    if parser is None:
        yield from _counted(_parsed_lines(package, rel))
        return
    consumed = 0  # lines before the current block
    try:
        with open_binary(package.abspath(rel)) as fh:
            for complete, whole in line_blocks(fh, VALIDATE_BLOCK, LONG_LINE):
                if not whole:  # a line of LONG_LINE bytes or more: the line-by-line path takes the rest
                    rest = _non_blank(itertools.islice(package.iter_lines(rel), consumed, None))
                    yield from _counted(_parse_numbered(rest))
                    return
                count = complete.count(b"\n") + (not complete.endswith(b"\n"))
                if _block_is_valid(parser, complete, count, first=consumed == 0):
                    yield consumed + 1, count, None
                else:
                    numbered = enumerate((line.rstrip(b"\r") for line in complete.split(b"\n")[:count]),
                                         consumed + 1)
                    yield from _counted(_parse_numbered(_non_blank(numbered)))
                consumed += count
    except OSError as exc:
        raise UsageError(f"{rel}: cannot read ({exc.strerror})") from exc


def _counted(parsed) -> Iterator[tuple[int, int, tuple[int | None, str] | None]]:
    return ((number, 0 if error else 1, error) for number, _, error in parsed)


def _block_is_valid(parser, complete: bytes, count: int, *, first: bool) -> bool:
    body = complete[:-1] if complete.endswith(b"\n") else complete
    if first and body.startswith(BOM):
        body = body[3:]
    try:
        return len(parser.parse(b"[" + body.replace(b"\n", b",") + b"]")) == count
    except Exception:  # noqa: BLE001 - any refusal, whatever its kind, sends the block to json.loads
        return False


# ---------------------------------------------------------------------------------------------- eval ids

def read_eval_ids(package, rel: str) -> EvalIds | None:
    """The frozen eval ids, one per line, surrounding spaces ignored; None when `rel` is not a file."""
    return _once(package, ("eval_ids", rel), lambda: _read_eval_ids(package, rel))


def _read_eval_ids(package, rel: str) -> EvalIds:
    result = EvalIds(path=rel)
    seen: set[str] = set()
    for number, raw in _lines(package, rel):
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

def scan_predictions(package, rel: str, eval_ids: EvalIds | None) -> PredictionsScan | None:
    """One streaming pass over a predictions file, against the frozen eval ids (coverage is not judged when
    `eval_ids` is None). None when `rel` is not a file."""
    key = ("predictions", rel, eval_ids.path if eval_ids is not None else None)
    return _once(package, key, lambda: _scan_predictions(package, rel, eval_ids))


def _sample(samples: list, item, count: int) -> None:
    if count <= SAMPLE:
        samples.append(item)


def _scan_predictions(package, rel: str, eval_ids: EvalIds | None) -> PredictionsScan:
    scan = PredictionsScan(path=rel, eval_ids_path=eval_ids.path if eval_ids else None)
    # id -> already predicted? One entry per eval id: the only state that grows.
    predicted: dict[str, bool] = dict.fromkeys(eval_ids.ids, False) if eval_ids is not None else {}
    scan.eval_id_count = len(predicted)
    judge = eval_ids is not None
    seen_line = False
    for number, record, error in _parsed_lines(package, rel):
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
