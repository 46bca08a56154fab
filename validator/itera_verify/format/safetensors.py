"""The safetensors header, read as the safetensors library reads it: one reader for every part of the tool.

A file is an 8-byte little-endian header length N, N bytes of JSON (an object of tensor entries
{"dtype", "shape", "data_offsets"} and an optional "__metadata__" object of strings), then the tensor data.
Callers read the two pieces (`HEAD_BYTES`, then `length` bytes) and hand them here: this module does no I/O.
Everything safetensors itself refuses (offsets past the data, 2.0 or true where an integer goes, a header nested
like `[` × 200,000) is None here, never an exception: the reload's own load reports the damaged file (IV504).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from itertools import accumulate

HEAD_BYTES = 8
MAX_HEADER = 100_000_000  # safetensors' own limit on the header's size
MAX_DEPTH = 8  # a header is an object of objects of lists: anything deeper is not safetensors


@dataclass(frozen=True)
class Entry:
    """One tensor: its dtype string, shape, and byte range in the file (absolute offsets)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


@dataclass(frozen=True)
class Header:
    entries: dict[str, Entry]
    metadata: dict[str, str] | None
    data_start: int


def header_length(head: bytes, file_size: int) -> int | None:
    """The JSON header's length from the first 8 bytes, when it fits the file and safetensors' limit."""
    if len(head) < HEAD_BYTES:
        return None
    length = int.from_bytes(head[:HEAD_BYTES], "little")
    return length if 2 <= length <= min(MAX_HEADER, file_size - HEAD_BYTES) else None


_STRINGS = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}


def _shallow(raw: bytes, limit: int = MAX_DEPTH) -> bool:
    """No bracket nests deeper than `limit` (strings skipped): checked before json.loads recurses."""
    brackets = _STRINGS.sub(b"", raw).translate(None, _NOT_BRACKETS)
    return max(accumulate(_STEP[b] for b in brackets), default=0) <= limit


def _integers(value) -> tuple[int, ...] | None:
    """A JSON list of integers as safetensors reads it: 2.0, 1e999 (infinity), true or "3" is no integer."""
    if not isinstance(value, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in value):
        return None
    return tuple(value)


def parse(head: bytes, raw_header: bytes, file_size: int) -> Header | None:
    """The header of a file of `file_size` bytes whose first 8 bytes are `head` and whose JSON header is
    `raw_header`; None when safetensors would refuse the file."""
    length = header_length(head, file_size)
    if length is None or len(raw_header) != length or not _shallow(raw_header):
        return None
    try:
        value = json.loads(raw_header)
    except (ValueError, RecursionError):
        return None
    if not isinstance(value, dict):
        return None
    data_start = HEAD_BYTES + length
    data_size = file_size - data_start
    entries: dict[str, Entry] = {}
    metadata = None
    for name, info in value.items():
        if name == "__metadata__":
            if info is None:  # the library reads a null metadata as none
                continue
            if not isinstance(info, dict) or not all(isinstance(v, str) for v in info.values()):
                return None
            metadata = info
            continue
        offsets = _integers(info.get("data_offsets")) if isinstance(info, dict) else None
        shape = _integers(info.get("shape")) if isinstance(info, dict) else None
        if offsets is None or shape is None or len(offsets) != 2 or not isinstance(info.get("dtype"), str) \
                or any(d < 0 for d in shape):
            return None
        begin, end = offsets
        if not 0 <= begin <= end <= data_size:
            return None
        entries[name] = Entry(name, info["dtype"], shape, data_start + begin, data_start + end)
    return Header(entries, metadata, data_start)


__all__ = ["Entry", "HEAD_BYTES", "Header", "MAX_HEADER", "header_length", "parse"]
