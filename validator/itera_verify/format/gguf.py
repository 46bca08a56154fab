"""The GGUF header (llama.cpp's layout), walked with limits before any library reads it: one reader of the format.

A file is `GGUF`, a version, a tensor count and a key-value count, then the key-values (a length-prefixed key, a
value type, the value: a scalar, a length-prefixed string, or an array: element type, count, elements), then one
entry per tensor (name, dimension count, dimensions, type, offset), then the tensor data at an aligned offset.

`gguf.GGUFReader` builds a numpy view for every string and every array element (~1.4 KB and ~26 µs each, measured
with gguf 0.19): a 32 MB file of 4,000,000 empty strings drives a reload to its memory limit in 50 s. So the
header is walked here first, every count and length checked against the file and against limits before anything
is built, and the first problem names its key (or tensor). The caller supplies `read_at(offset, n)`: this module
does no I/O of its own.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Callable

MAGIC = b"GGUF"
VERSIONS = (2, 3)  # what gguf.GGUFReader reads (version 1's 32-bit lengths: neither it nor llama.cpp today)
MAX_KEY_VALUES = 1 << 14  # real files hold 20-60
MAX_TENSORS = 1 << 16  # llama.cpp's largest models (experts merged per layer) hold a few thousand
MAX_ARRAY = 1 << 20  # elements of one array: the largest tokenizers hold ~262,144 tokens, ~300,000 merges
MAX_ELEMENTS = 1 << 22  # elements of all arrays together
MAX_NAME = 1 << 10  # bytes of a key or a tensor name (llama.cpp's tensor names: under 64)
MAX_DIMS = 4  # GGML_MAX_DIMS: llama.cpp refuses a tensor of more dimensions
READER_BYTES_PER_ELEMENT = 1400  # what gguf.GGUFReader holds per array element (measured, gguf 0.19)
WINDOW = 1 << 20  # bytes read at a time

# Value types: id -> (name, size of a scalar; 0 for a string, None for an array).
TYPES = {0: ("UINT8", 1), 1: ("INT8", 1), 2: ("UINT16", 2), 3: ("INT16", 2), 4: ("UINT32", 4), 5: ("INT32", 4),
         6: ("FLOAT32", 4), 7: ("BOOL", 1), 8: ("STRING", 0), 9: ("ARRAY", None), 10: ("UINT64", 8),
         11: ("INT64", 8), 12: ("FLOAT64", 8)}
STRING, ARRAY, UINT32 = 8, 9, 4
ALIGNMENT_KEY, DEFAULT_ALIGNMENT = "general.alignment", 32


class HeaderProblem(ValueError):
    """The header is not one the walk admits; `key` names the key-value or tensor where it was found."""

    def __init__(self, message: str, key: str | None = None):
        super().__init__(f"{key}: {message}" if key else message)
        self.key = key


@dataclass(frozen=True)
class Header:
    version: int
    byte_order: str  # "<" or ">" (gguf writes either; the reader follows the version field)
    tensor_count: int
    kv_count: int
    elements: int  # array elements in all key-values: what gguf.GGUFReader builds one view for
    largest_array: str | None  # the key of the longest array
    tensors_end: int  # where the tensor table ends
    data_start: int  # the aligned start of the tensor data

    @property
    def reader_bytes(self) -> int:
        """About what gguf.GGUFReader holds in memory for this header's fields and tensor table."""
        return (self.elements + self.kv_count + 3 * self.tensor_count) * READER_BYTES_PER_ELEMENT


class _Cursor:
    """Sequential reads over `read_at`, WINDOW bytes at a time; nothing past `size` exists."""

    def __init__(self, read_at: Callable[[int, int], bytes], size: int, order: str):
        self.read_at, self.size, self.order = read_at, size, order
        self.pos, self.window, self.window_at = 0, b"", 0

    def take(self, n: int, what: str, key: str | None) -> bytes:
        if n > self.size - self.pos:
            raise HeaderProblem(f"{what} of {n:,} bytes at offset {self.pos:,} runs past the end of the file "
                                f"({self.size:,} bytes)", key)
        start = self.pos - self.window_at
        if start + n > len(self.window):
            if n > WINDOW:  # a long string: checked against the file, skipped, never read
                self.pos += n
                return b""
            self.window_at, self.window = self.pos, self.read_at(self.pos, min(WINDOW, self.size - self.pos))
            if len(self.window) < n:
                raise HeaderProblem(f"the file ends at offset {self.pos + len(self.window):,} inside {what}", key)
            start = 0
        self.pos += n
        return self.window[start:start + n]

    def number(self, fmt: str, what: str, key: str | None) -> int:
        return struct.unpack(self.order + fmt, self.take(struct.calcsize(fmt), what, key))[0]


def walk(read_at: Callable[[int, int], bytes], size: int) -> Header:
    """Walk the header of a `size`-byte GGUF file; HeaderProblem at the first count, length or type out of bounds.
    Memory: one WINDOW and the keys seen (at most MAX_KEY_VALUES × MAX_NAME bytes); time: linear in the header."""
    head = read_at(0, 24)
    if len(head) < 24 or head[:4] != MAGIC:
        raise HeaderProblem(f"not a GGUF file (it does not begin with {MAGIC!r} and a 24-byte header)")
    order = ">" if struct.unpack("<I", head[4:8])[0] & 0xFFFF == 0 else "<"  # the reader's own test
    version, tensor_count, kv_count = struct.unpack(order + "IQQ", head[4:24])
    if version not in VERSIONS:
        raise HeaderProblem(f"GGUF version {version} (the gguf package reads versions 2 and 3)")
    # The least a key-value takes (an empty key, a type, a 1-byte value) and the least a tensor entry takes.
    for count, limit, least, what in ((kv_count, MAX_KEY_VALUES, 13, "key-values"),
                                      (tensor_count, MAX_TENSORS, 25, "tensors")):
        if count > limit or count * least > size - 24:
            raise HeaderProblem(f"the header declares {count:,} {what}: more than the walk admits ({limit:,}) or "
                                f"than {size:,} bytes can hold", f"GGUF.{'kv' if least == 13 else 'tensor'}_count")
    cursor = _Cursor(read_at, size, order)
    cursor.pos = 24
    keys: set[str] = set()
    elements, largest, longest, alignment = 0, None, -1, DEFAULT_ALIGNMENT
    for index in range(kv_count):
        key = _name(cursor, f"key-value {index}", None)
        if key in keys:
            raise HeaderProblem("the key appears twice (gguf's reader refuses the file)", key)
        keys.add(key)
        kind = cursor.number("I", "a value type", key)
        if kind not in TYPES:
            raise HeaderProblem(f"unknown value type {kind}", key)
        if kind == ARRAY:
            count = _array(cursor, key, elements)
            elements += count
            if count > longest:
                largest, longest = key, count
        elif key == ALIGNMENT_KEY:
            if kind != UINT32:
                raise HeaderProblem(f"a {TYPES[kind][0]} value where gguf's reader wants a UINT32", key)
            alignment = cursor.number("I", "a value", key)
        else:
            _value(cursor, kind, key)
    for index in range(tensor_count):
        name = _name(cursor, f"tensor {index}", None)
        dims = cursor.number("I", "a dimension count", name)
        if dims > MAX_DIMS:
            raise HeaderProblem(f"{dims:,} dimensions (llama.cpp reads at most {MAX_DIMS})", name)
        cursor.take(8 * dims + 4, "the dimensions and type", name)
        offset = cursor.number("Q", "a data offset", name)
        if offset >= size:
            raise HeaderProblem(f"its data offset {offset:,} lies past the end of the file ({size:,} bytes)", name)
    if alignment == 0 or alignment & (alignment - 1):
        raise HeaderProblem(f"alignment {alignment} is not a power of two", ALIGNMENT_KEY)
    start = -(-cursor.pos // alignment) * alignment
    return Header(version, order, tensor_count, kv_count, elements, largest, cursor.pos, start)


def _name(cursor: _Cursor, where: str, key: str | None) -> str:
    length = cursor.number("Q", f"the name of {where}", key)
    if length > MAX_NAME:
        raise HeaderProblem(f"the name of {where} is {length:,} bytes long (at most {MAX_NAME:,} are read)", key)
    raw = cursor.take(length, f"the name of {where}", key)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise HeaderProblem(f"the name of {where} is not UTF-8: {raw[:80]!r}", key) from None


def _value(cursor: _Cursor, kind: int, key: str) -> None:
    name, width = TYPES[kind]
    if kind == STRING:
        cursor.take(cursor.number("Q", "a string length", key), "a string", key)
    else:
        cursor.take(width, f"a {name} value", key)


def _array(cursor: _Cursor, key: str, elements: int) -> int:
    kind = cursor.number("I", "an array's element type", key)
    if kind not in TYPES:
        raise HeaderProblem(f"an array of unknown element type {kind}", key)
    if kind == ARRAY:
        raise HeaderProblem("an array of arrays (llama.cpp reads none; gguf's reader recurses into them)", key)
    count = cursor.number("Q", "an array length", key)
    if count > MAX_ARRAY or elements + count > MAX_ELEMENTS:
        raise HeaderProblem(f"an array of {count:,} elements (the walk admits {MAX_ARRAY:,} in one array, "
                            f"{MAX_ELEMENTS:,} in all; real tokenizers hold about 300,000)", key)
    name, width = TYPES[kind]
    if kind != STRING:
        cursor.take(count * width, f"an array of {count:,} {name} values", key)
        return count
    _strings(cursor, count, key)
    return count


def _strings(cursor: _Cursor, count: int, key: str) -> None:
    """`count` length-prefixed strings: those whole inside the window are stepped over in place (a tokenizer's
    300,000 in a fraction of a second), the others through the cursor (a refill, a long string, the file's end)."""
    unpack = struct.Struct(cursor.order + "Q").unpack_from
    left = count
    while left:
        window, at = cursor.window, cursor.pos - cursor.window_at
        end = len(window)
        while left and at + 8 <= end:
            length = unpack(window, at)[0]
            if length > end - at - 8:
                break
            at += 8 + length
            left -= 1
        cursor.pos = cursor.window_at + at
        if left:
            cursor.take(cursor.number("Q", "a string length", key), "a string", key)
            left -= 1


__all__ = ["Header", "HeaderProblem", "MAX_ARRAY", "MAX_DIMS", "MAX_ELEMENTS", "MAX_KEY_VALUES", "MAX_NAME",
           "MAX_TENSORS", "walk"]
