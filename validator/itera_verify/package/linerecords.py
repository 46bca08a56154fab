"""Line-oriented records: non-blank lines of a package file, JSONL lines parsed in batches or only validated
(simdjson), CSV rows; each problem kept as a LineError with its line and column.

No knowledge of what the records mean: readers.py turns them into metrics, eval ids and predictions facts.
"""
from __future__ import annotations

import csv
import io
import json
import os
import secrets
from dataclasses import dataclass, field
from typing import Any, Iterator

from ..archive.writer import worker_count
from ..model import UsageError
from ..runtime.launcher import ChildFailed, ChildLost, Forked, ForkAfterThreads, can_fork, die_with_parent
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


def _non_blank(numbered, bom: bool = True) -> Iterator[tuple[int, bytes]]:
    """`bom`: line 1 is the file's first line (not the first of a helper's half)."""
    for number, raw in numbered:
        if bom and number == 1 and raw.startswith(BOM):
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
    or whose lines are not one value each (_one_value_a_line: a line holding two values, or a value spread over
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
    if isinstance(values, list) and len(values) == len(batch) and \
            _one_value_a_line(_OPEN + _MEMBER.join(raw for _, raw in batch) + b"}", len(batch)):
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


def validate_jsonl(ctx, rel: str, errors: LineErrors) -> tuple[int, bool]:
    """parsed_lines without the values, for files whose values nobody needs (any other JSONL): the number of
    records and whether any line holds more than blanks; each invalid line goes to `errors`.

    Whole blocks of complete lines are validated at once, as the members of one object ('{"K":l1,"K":l2,...}',
    _one_value_a_line). simdjson is strict (RFC 8259): what it accepts, json.loads accepts too. A block it
    refuses (a blank line, NaN, a big integer, a real error) is parsed line by line by json.loads, which alone
    decides and places every error; so the outcome is exactly that of the line-by-line path, only faster on
    the common, clean case.

    A file of SPLIT_BYTES or more is validated by two processes where a second core is there: a forked helper
    takes the lines after the first newline past the middle, this process the lines before; the helper's line
    numbers are counted from its first line and moved past this process's. Same outcome, in about half the time
    (the check of one large JSONL otherwise runs alone on one core while the other waits)."""
    parser = _validator()
    if parser is None:
        tally = _Tally()
        for number, _, error in parsed_lines(ctx, rel):
            tally.add(number, 0 if error else 1, error, errors)
        return tally.records, tally.seen
    try:
        with open_binary(ctx.inventory.abspath(rel)) as fh:
            fd = fh.fileno()
            cut = _halfway(fd, ctx.inventory.files[rel].size)
            helper = _helper(parser, fd, cut) if cut else None
            try:
                head = _validate_range(parser, fd, 0, cut if helper else None, errors, bom=True)
                if helper is None:
                    return head.records, head.seen
                tail = _helper_result(helper)
                if tail is None:  # the helper could not finish, or gave way to a long line: its half is done here
                    tail = _Tally.kept(lambda into: _validate_range(parser, fd, cut, None, into, bom=False))
            finally:
                if helper is not None:
                    helper.cancel()
    except OSError as exc:
        raise UsageError(f"{rel}: cannot read ({exc.strerror})") from exc
    for line, column, message in tail["errors"]:
        errors.add_error(head.lines + line, column, message)
    errors.error_count += tail["error_count"] - len(tail["errors"])
    return head.records + tail["records"], head.seen or tail["seen"]


SPLIT_BYTES = 64 << 20  # from here a helper pays: its fork costs milliseconds, 64 MiB about 0.17 s of checking


@dataclass
class _Tally:
    records: int = 0
    seen: bool = False  # a line holding more than blanks
    lines: int = 0  # every line of the range, blank ones too

    def add(self, number: int, records: int, error, errors: LineErrors) -> None:
        self.seen = True
        self.records += records
        if error:
            errors.add_error(number, *error)

    @staticmethod
    def kept(validate) -> dict:
        """`validate(errors)`'s tally and errors as plain values (what the helper hands back)."""
        errors = LineErrors()
        tally = validate(errors)
        return {"records": tally.records, "seen": tally.seen, "lines": tally.lines, "error_count": errors.error_count,
                "errors": [[e.line, e.column, e.message] for e in errors.errors]}


class _Range(io.RawIOBase):
    """Bytes `start` to `end` (None: the end of the file) of an open file, read with pread: two processes
    sharing the descriptor never move each other's offset."""

    def __init__(self, fd: int, start: int, end: int | None):
        super().__init__()
        self.fd, self.position, self.end = fd, start, end

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        size = len(buffer) if self.end is None else min(len(buffer), self.end - self.position)
        if size <= 0:
            return 0
        if _PREADV:
            done = os.preadv(self.fd, [memoryview(buffer)[:size]], self.position)
        else:  # pragma: no cover - a platform without preadv
            data = os.pread(self.fd, size, self.position)
            done = len(data)
            buffer[:done] = data
        self.position += done
        return done


_PREADV = hasattr(os, "preadv")


class _LongLine(Exception):
    """The helper met a line of LONG_LINE bytes or more: parsing it whole belongs where the memory is watched."""


def _validate_range(parser, fd: int, start: int, end: int | None, errors: LineErrors, *, bom: bool,
                    long_lines: bool = True) -> _Tally:
    """The lines from `start` (a line's first byte) to `end` (after a newline, or None), numbered from 1.
    `long_lines` False (the helper): _LongLine at a line of LONG_LINE bytes or more instead of parsing it."""
    tally = _Tally()
    offset = start
    reader = io.BufferedReader(_Range(fd, start, end))
    for complete, whole in line_blocks(reader, VALIDATE_BLOCK, LONG_LINE):
        if not whole and not long_lines:
            raise _LongLine
        if not whole:  # a line of LONG_LINE bytes or more: the line-by-line path takes the rest
            rest = enumerate((line.rstrip(b"\r\n") for line in io.BufferedReader(_Range(fd, offset, end))),
                             tally.lines + 1)
            counted = _Counted(rest)
            for number, _, error in _parse_numbered(_non_blank(counted, bom)):
                tally.add(number, 0 if error else 1, error, errors)
            tally.lines = max(tally.lines, counted.last)
            return tally
        count = complete.count(b"\n") + (not complete.endswith(b"\n"))
        if _block_is_valid(parser, complete, count, first=bom and tally.lines == 0):
            tally.seen, tally.records = True, tally.records + count
        else:
            numbered = enumerate((line.rstrip(b"\r") for line in complete.split(b"\n")[:count]), tally.lines + 1)
            for number, _, error in _parse_numbered(_non_blank(numbered, bom)):
                tally.add(number, 0 if error else 1, error, errors)
        tally.lines += count
        offset += len(complete)
    return tally


class _Counted:
    """Numbered lines passed through, the last number kept (blank lines are numbered too, then dropped)."""

    def __init__(self, numbered):
        self.numbered, self.last = numbered, 0

    def __iter__(self):
        for number, raw in self.numbered:
            self.last = number
            yield number, raw


def _halfway(fd: int, size: int) -> int | None:
    """Where a helper's half of a large file starts: after the first newline past the middle; None when the file
    is too small, no second core or fork is there, or no newline comes within LONG_LINE of the middle."""
    if size < SPLIT_BYTES or worker_count(0) < 2 or not can_fork():
        return None
    position = size // 2
    while position < min(size, size // 2 + LONG_LINE):
        piece = os.pread(fd, 1 << 20, position)
        if not piece:
            return None
        found = piece.find(b"\n")
        if found >= 0:
            cut = position + found + 1
            return cut if cut < size else None
        position += len(piece)
    return None


def _helper(parser, fd: int, cut: int) -> Forked | None:
    """The forked helper validating from `cut` to the end; None where this process must not fork now (the
    tool's own threads run: a seal beside the checks). It dies with this process, and gives way to a line of
    LONG_LINE bytes or more: json.loads of such a line takes many times its size, which belongs in this process,
    whose memory the caller watches (an audit's limit), not in a helper nobody watches."""
    parent = os.getpid()

    def tail() -> bytes:
        die_with_parent(parent)
        try:
            kept = _Tally.kept(lambda into: _validate_range(parser, fd, cut, None, into, bom=False, long_lines=False))
        except _LongLine:
            return b"null"
        return json.dumps(kept).encode()

    try:
        return Forked(tail, raw=True)  # its answer is JSON, never a pickle: it read the package's bytes
    except (ForkAfterThreads, OSError):
        return None


def _helper_result(helper: Forked) -> dict | None:
    """The helper's tally; None when it gave way, died, failed, or its answer was cut short."""
    try:
        answer = json.loads(helper.result())
    except (ChildLost, ChildFailed, ValueError):
        return None
    return answer if isinstance(answer, dict) else None


def _block_is_valid(parser, complete: bytes, count: int, *, first: bool) -> bool:
    """The block's lines as the members of one object (_one_value_a_line), built in two copies (the newlines
    turned into separators, then the object around them): this is most of a large JSONL's check."""
    start = 3 if first and complete.startswith(BOM) else 0
    members = complete.replace(b"\n", _MEMBER)
    end = len(members) - (len(_MEMBER) if complete.endswith(b"\n") else 0)
    return _one_value_a_line(b"".join((_OPEN, memoryview(members)[start:end], b"}")), count, parser)


# A key no line of a file written before this run can hold: every top-level member bearing it came from a
# separator put between two lines, never from a line.
_KEY = secrets.token_hex(8)  # 64 bits: no file can guess it; short, so the joined lines grow little
_OPEN, _MEMBER = b'{"' + _KEY.encode() + b'":', b',"' + _KEY.encode() + b'":'


def _one_value_a_line(members: bytes, count: int, parser=None) -> bool:
    """Lines joined as '{"K":l1,"K":l2,...}' parse (simdjson) into `count` members, each under the key K: then
    every separator stands between two values at the top (a line cannot make a member of key K, and `count` of
    them are there), so every line is one value of its own. Counting values alone is not enough: "[1", "2]",
    "3, 4" join into [[1, 2], 3, 4], three values, while no line parses alone. Where simdjson refuses for
    another reason (NaN, a big integer), or is missing, the caller parses line by line."""
    parser = parser or _validator()
    if parser is None:  # pragma: no cover - a platform without a pysimdjson wheel
        return False
    try:
        document = parser.parse(members)
        return len(document) == count and all(key == _KEY for key in document.keys())
    except Exception:  # noqa: BLE001 - any refusal sends the lines to json.loads one by one
        return False

