"""Line-oriented records: non-blank lines of a package file, JSONL lines parsed in batches or only validated
(simdjson), CSV rows; each problem kept as a LineError with its line and column.

No knowledge of what the records mean: readers.py turns them into metrics, eval ids and predictions facts.
"""
from __future__ import annotations

import csv
import itertools
import json
from dataclasses import dataclass, field
from typing import Any, Iterator

from ..model import UsageError
from .files import open_binary
from .lineblocks import line_blocks

MAX_KEPT_ERRORS = 1000  # a garbage file must not cost one object per line; `error_count` keeps the total


@dataclass(frozen=True)
class LineError:
    line: int
    column: int | None
    message: str


@dataclass
class LineErrors:
    errors: list[LineError] = field(default_factory=list)
    error_count: int = 0

    def add_error(self, line: int, column: int | None, message: str) -> None:
        self.error_count += 1
        if len(self.errors) < MAX_KEPT_ERRORS:
            self.errors.append(LineError(line, column, message))


# ---------------------------------------------------------------------------------------------- lines

BOM = b"\xef\xbb\xbf"


def non_blank_lines(ctx, rel: str) -> Iterator[tuple[int, bytes]]:
    """Non-blank lines; the first one without a UTF-8 byte-order mark (editors on Windows add one)."""
    return _non_blank(ctx.documents.iter_lines(rel))


def _non_blank(numbered: Iterator[tuple[int, bytes]]) -> Iterator[tuple[int, bytes]]:
    for number, raw in numbered:
        if number == 1 and raw.startswith(BOM):
            raw = raw[3:]
        if raw.strip():
            yield number, raw


# ---------------------------------------------------------------------------------------------- JSONL, parsed

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


def parsed_lines(ctx, rel: str) -> Iterator[tuple[int, Any, tuple[int | None, str] | None]]:
    """(line number, value, None) or (line number, None, (column, message)) for every non-blank JSONL line."""
    return _parse_numbered(non_blank_lines(ctx, rel))


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


# ---------------------------------------------------------------------------------------------- CSV

def csv_rows(ctx, rel: str, scan: LineErrors) -> Iterator[tuple[int, list[str]]]:
    for number, raw in non_blank_lines(ctx, rel):
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


def validated_lines(ctx, rel: str) -> Iterator[tuple[int, int, tuple[int | None, str] | None]]:
    """(first line, records, None) for a run of valid lines, (line, 0, (column, message)) for an invalid one:
    parsed_lines without the values, for files whose values nobody needs (any other JSONL).

    Whole blocks of complete lines are validated at once as one array ("[l1,l2,...]"). simdjson is strict
    (RFC 8259): what it accepts, json.loads accepts too. A block it refuses (a blank line, NaN, a big integer, a
    real error) is parsed line by line by json.loads, which alone decides and places every error; so the
    outcome is exactly that of the line-by-line path, only faster on the common, clean case."""
    parser = _validator()
    if parser is None:
        yield from _counted(parsed_lines(ctx, rel))
        return
    consumed = 0  # lines before the current block
    try:
        with open_binary(ctx.inventory.abspath(rel)) as fh:
            for complete, whole in line_blocks(fh, VALIDATE_BLOCK, LONG_LINE):
                if not whole:  # a line of LONG_LINE bytes or more: the line-by-line path takes the rest
                    rest = _non_blank(itertools.islice(ctx.documents.iter_lines(rel), consumed, None))
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


_NEWLINE_TO_COMMA = bytes.maketrans(b"\n", b",")


def _block_is_valid(parser, complete: bytes, count: int, *, first: bool) -> bool:
    """The block as one array, "[l1,l2,...]", built in two copies (the block, then its newlines turned into
    commas), not the four that slicing, replace and concatenation cost: this is most of a large JSONL's check."""
    array = bytearray(b"[")
    array += memoryview(complete)[3 if first and complete.startswith(BOM) else 0:]
    if array.endswith(b"\n"):
        array[-1] = 0x5D  # "]" over the last newline
    else:
        array.append(0x5D)
    try:
        return len(parser.parse(array.translate(_NEWLINE_TO_COMMA))) == count
    except Exception:  # noqa: BLE001 - any refusal, whatever its kind, sends the block to json.loads
        return False

