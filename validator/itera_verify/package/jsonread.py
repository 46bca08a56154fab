"""One bounded JSON reader for records a sender wrote: a size limit and a nesting-depth limit, checked before
any value is built.

Python's decoder and every consumer after it (the JSON renderer, `finite()`, schema validation) recurse once
per level: a record of `[` × 100,000, or one nested 950 levels (which parses, then fails wherever it is
copied), would end in a RecursionError traceback. The depth is measured on the text without recursion, so a
document too deep or too large is a `JSONLimitError` (a ValueError) with a sentence saying which limit.

The same holds for memory: `[[],[],...]` costs about 80 bytes of Python objects per 3 bytes of text, so a few
KB of zstd in an archive become gigabytes in json.loads. `count_values` counts what json.loads would build
(the structural bytes `[{,:` outside strings) without building anything, so a document the rules read is
parsed only within MAX_VALUES; `validate` checks a document nobody reads the values of with simdjson, which
builds no Python object at all.
"""
from __future__ import annotations

import os
import re
from itertools import accumulate
from typing import Any, Callable

from . import loads_json
from .files import open_binary

MAX_DEPTH = 128  # a report nests about 6 levels; far below the ~1,000 frames Python allows
MAX_BYTES = 64 << 20  # the tool's own verification.json of 20,000 findings is about 8 MiB

# A JSON string (escapes included) or one bracket: the strings are skipped, the brackets counted.
_STRINGS = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_NOT_BRACKETS = re.compile(r"[^\[\]{}]+")
_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


# The same strings on bytes, possessive and ending at the end of the data when unterminated: a failed match
# never restarts at every later quote (linear on `"\\"\\"…`).
_BYTE_STRINGS = re.compile(rb'"[^"\\]*+(?:\\.[^"\\]*+)*+(?:"|\\?\Z)', re.S)
MAX_VALUES = 4_000_000  # values of one document built as Python objects (a 250k-entry tokenizer holds ~1.5 M)
MAX_VALIDATED_BYTES = 64 << 20  # simdjson's own buffers cost up to ~10 bytes per byte of a dense document


def count_values(data: bytes, exact_above: int = 0) -> int:
    """About how many values json.loads would build from `data`: its `[`, `{`, `,` and `:` (one per container,
    element and key), counted without recursion and without building any value. Those inside strings count
    too, unless the count passes `exact_above`: then they are removed first (a regex pass that costs more than
    parsing a small document)."""
    count = _structural(data)
    if count > exact_above and b'"' in data:
        count = _structural(_BYTE_STRINGS.sub(b"", data))
    return count


def _structural(data: bytes) -> int:
    return data.count(b"[") + data.count(b"{") + data.count(b",") + data.count(b":")


def too_many_values(count: int) -> str:
    return f"holds more than {MAX_VALUES:,} values ({count:,}): too large to check"


def _simdjson() -> Callable[[bytes], None] | None:
    try:
        import simdjson
    except ImportError:  # pragma: no cover - a platform without a pysimdjson wheel
        return None

    def parse(path: str) -> None:
        parser = simdjson.Parser()  # its own buffers, freed with it: a large document's do not stay
        parser.load(path)  # read straight into simdjson's padded buffer: no copy of the file in Python
    return parse


_SIMDJSON = _simdjson()


def validate(path: str, size: int) -> str | None:
    """None when simdjson reads the file at `path` (`size` bytes) as JSON (strict RFC 8259: json.loads then
    reads it too), else why not, or "unchecked" without simdjson or past MAX_VALIDATED_BYTES. A refusal is not
    yet an error: json.loads also takes NaN, big integers, lone surrogates (and simdjson a byte-order mark
    json.loads refuses); the caller decides those with json.loads when the document is small enough."""
    if _SIMDJSON is None or size > MAX_VALIDATED_BYTES:
        return "unchecked"
    try:
        with open(path, "rb") as fh:
            if fh.read(3) == b"\xef\xbb\xbf":
                return "a UTF-8 byte-order mark"
        _SIMDJSON(path)
    except OSError:
        return "unchecked"  # the caller's own reading reports it
    except (ValueError, RuntimeError) as exc:  # simdjson's errors: "CODE: what went wrong"
        return str(exc).split(":", 1)[-1].split(".")[0].strip() or str(exc)
    return None


class JSONLimitError(ValueError):
    """A document past the reader's size or depth limit: never parsed."""


def nesting_depth(text: str) -> int:
    """How deep the arrays and objects of `text` nest (0 for a scalar), brackets inside strings excluded."""
    brackets = _NOT_BRACKETS.sub("", _STRINGS.sub("", text))
    return max(accumulate(map(_STEP.__getitem__, brackets)), default=0)


def read_json(data: bytes | str, *, max_depth: int = MAX_DEPTH, max_bytes: int = MAX_BYTES,
              max_values: int = MAX_VALUES) -> Any:
    """The value of a JSON document (UTF-8 bytes or text), as json.loads reads it; JSONLimitError when it is
    larger than `max_bytes`, would build more than `max_values` values or nests deeper than `max_depth`,
    ValueError (JSONDecodeError, UnicodeDecodeError) when it is not JSON."""
    if len(data) > max_bytes:
        raise JSONLimitError(f"larger than {max_bytes:,} bytes")
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    values = count_values(raw, exact_above=max_values)
    if values > max_values:
        raise JSONLimitError(too_many_values(values))
    text = data.decode("utf-8") if isinstance(data, bytes) else data
    depth = nesting_depth(text)
    if depth > max_depth:
        raise JSONLimitError(f"nested {depth:,} levels deep (at most {max_depth})")
    return loads_json(text)


def read_json_file(path, *, max_depth: int = MAX_DEPTH, max_bytes: int = MAX_BYTES,
                   max_values: int = MAX_VALUES) -> Any:
    """read_json of a file a package holds (a config.json, an index, trainer_state.json), its size checked on the
    open file before a byte is read: the one way the tool reads a JSON file it did not write. OSError when it
    cannot be read (FileNotFoundError when it is missing), JSONLimitError or another ValueError when it is not a
    JSON document within the limits."""
    with open_binary(path) as fh:
        size = os.fstat(fh.fileno()).st_size
        if size > max_bytes:
            raise JSONLimitError(f"larger than {max_bytes:,} bytes")
        data = fh.read(max_bytes + 1)
    return read_json(data, max_depth=max_depth, max_bytes=max_bytes, max_values=max_values)


__all__ = ["JSONLimitError", "MAX_BYTES", "MAX_DEPTH", "MAX_VALIDATED_BYTES", "MAX_VALUES", "count_values",
           "nesting_depth", "read_json", "read_json_file", "too_many_values", "validate"]
