"""One bounded JSON reader for records a sender wrote: a size limit and a nesting-depth limit, checked before
any value is built.

Python's decoder and every consumer after it (the JSON renderer, `finite()`, schema validation) recurse once
per level: a record of `[` × 100,000, or one nested 950 levels (which parses, then fails wherever it is
copied), would end in a RecursionError traceback. The depth is measured on the text without recursion, so a
document too deep or too large is a `JSONLimitError` (a ValueError) with a sentence saying which limit.
"""
from __future__ import annotations

import re
from itertools import accumulate
from typing import Any

from . import loads_json

MAX_DEPTH = 128  # a report nests about 6 levels; far below the ~1,000 frames Python allows
MAX_BYTES = 64 << 20  # the tool's own verification.json of 20,000 findings is about 8 MiB

# A JSON string (escapes included) or one bracket: the strings are skipped, the brackets counted.
_STRINGS = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_NOT_BRACKETS = re.compile(r"[^\[\]{}]+")
_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


class JSONLimitError(ValueError):
    """A document past the reader's size or depth limit: never parsed."""


def nesting_depth(text: str) -> int:
    """How deep the arrays and objects of `text` nest (0 for a scalar), brackets inside strings excluded."""
    brackets = _NOT_BRACKETS.sub("", _STRINGS.sub("", text))
    return max(accumulate(map(_STEP.__getitem__, brackets)), default=0)


def read_json(data: bytes | str, *, max_depth: int = MAX_DEPTH, max_bytes: int = MAX_BYTES) -> Any:
    """The value of a JSON document (UTF-8 bytes or text), as json.loads reads it; JSONLimitError when it is
    larger than `max_bytes` or nests deeper than `max_depth`, ValueError (JSONDecodeError, UnicodeDecodeError)
    when it is not JSON."""
    if len(data) > max_bytes:
        raise JSONLimitError(f"larger than {max_bytes:,} bytes")
    text = data.decode("utf-8") if isinstance(data, bytes) else data
    depth = nesting_depth(text)
    if depth > max_depth:
        raise JSONLimitError(f"nested {depth:,} levels deep (at most {max_depth})")
    return loads_json(text)


__all__ = ["JSONLimitError", "MAX_BYTES", "MAX_DEPTH", "nesting_depth", "read_json"]
