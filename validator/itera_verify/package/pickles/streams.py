"""A raw pickle file: consecutive streams, torch's legacy layout, and whatever follows the last stream.

`pickle.load` called repeatedly, and torch's legacy loader, read stream after stream; a reviewer's tool may
seek past junk. So after the last complete stream the rest of the file must be accounted for: torch's legacy
storage records (a size, then raw bytes, for each key of the storage-key list), or nothing. Anything else is
searched for streams (bounded) and, in a file that is a pickle, refused: it cannot be scanned whole.

A first stream that breaks is not yet "not a pickle": the bytes after the break are searched for the imports a
looser reader would reach (GLOBAL / INST lines, PROTO-started streams, STACK_GLOBAL of two short strings), and
one that names a module that exists makes the file a pickle that cannot be scanned. Padding cannot hide one: a
stream tried near the break is walked to its end (valid opcodes of any length, paid from the budget), not
through a fixed window.
"""
from __future__ import annotations

import importlib.util
import io
import re
import sys

from .budget import Budget
from .opcodes import IMPORTABLE, Reader, Stream, scan_stream

LEGACY_MAGIC = 0x1950A86A20F9469CFC6C  # torch.serialization.MAGIC_NUMBER, the first legacy stream
LEGACY_STREAMS = 5  # magic, protocol version, sys_info, the object, the storage keys; then the storages
# A legacy record gives its element count; the element size comes from the storage type of its key.
_ELEMENT_SIZES = {f"torch.{name}Storage": size for name, size in {
    "BFloat16": 2, "Bool": 1, "Byte": 1, "Char": 1, "ComplexDouble": 16, "ComplexFloat": 8, "Double": 8,
    "Float": 4, "Half": 2, "Int": 4, "Long": 8, "QInt32": 4, "QInt8": 1, "QUInt2x4": 1, "QUInt4x2": 1,
    "QUInt8": 1, "Short": 2}.items()}
MAX_TRAILING_SEARCH = 64 << 20  # junk is searched this far
SEARCH_AFTER_BREAK = 1 << 20  # after a first stream that breaks, this far
MAX_CANDIDATES = 512
MAX_CANDIDATE_BYTES = 256 << 10  # a stream found by its start pattern is read this far at most
JUNK_SKIP = 16  # streams that start within this many bytes after the junk are tried one by one, each to its end
# PROTO, GLOBAL / INST, STACK_GLOBAL of two SHORT_BINUNICODE names (each maybe memoised): where a stream imports.
_STREAM_STARTS = re.compile(rb"\x80[\x00-\x05]|[ci][A-Za-z_][\w.]*\n[\w.]+\n"
                            rb"|\x8c[\x01-\x7f][A-Za-z_][\w.]*\x94?\x8c[\x01-\x7f][A-Za-z_]\w*\x94?\x93")


def scan_raw(fh, base: int, size: int, found: set[str], certain: bool = False, named: bool = False,
             budget: Budget | None = None, other_format: bool = False,
             alongside: bool = False) -> tuple[bool, str | None]:
    """Scan the streams of `size` bytes at `base` of a seekable file: (is a pickle, why it cannot be scanned).

    `certain`: the caller knows this is a pickle (a pickle extension, a .pkl member), so any failure is an
    error; otherwise a file that breaks at once is not a pickle (an image named .pt, a text file), unless it
    began with the PROTO magic or imported something before it broke, or the bytes after the break import
    something. `named`: a pickle extension, so junk after a complete stream is an error even without the PROTO
    magic. `other_format`: the bytes are also another valid file (safetensors), so PROTO-like first bytes prove
    nothing. `alongside`: a container's byte-0 reading, beside the container's own: what it imports counts,
    nothing else. The unpickler runs opcodes as it reads them, so names a broken stream imported before it broke
    count, when they could be imported at all."""
    budget = budget if budget is not None else Budget()
    fh.seek(base)
    magic = fh.read(2)
    has_magic = len(magic) == 2 and magic[0] == 0x80 and 2 <= magic[1] <= 5 and not other_format
    intent = certain or has_magic
    streams: list[tuple[Stream, int, set[str]]] = []  # (what it held, where it ends, the names it imports)
    offset = 0
    while offset < size:
        fh.seek(base + offset)
        reader, names = Reader(fh, size - offset, budget), set()
        try:
            info = scan_stream(reader, names)
        except ValueError as exc:
            broken = {n for n in names if IMPORTABLE.fullmatch(n)}
            if alongside:
                for _, _, complete in streams:
                    found |= complete
                found |= broken
                return bool(streams or broken), None
            if not streams:
                found |= broken
                if not (intent or broken):
                    return _after_break(fh, base, size, offset + reader.pos, found, budget, str(exc))
                return True, str(exc)
            return _after_streams(fh, base, size, offset, streams, broken, found, intent or named, str(exc),
                                  budget)
        streams.append((info, offset + reader.pos, names))
        offset += reader.pos
    if not streams:
        return intent, ("no data" if intent else None)
    for _, _, names in streams:
        found |= names
    return True, None


def _after_break(fh, base, size, at, found, budget, why) -> tuple[bool, str | None]:
    """A first stream that breaks at `at`: a pickle after all when a later stream or line imports a module."""
    hidden = {n for n in _search(fh, base, size, at, budget, SEARCH_AFTER_BREAK) if _module_exists(n)}
    if not hidden:
        return False, None
    found |= hidden
    return True, f"the data breaks at offset {at} ({why}), yet names {', '.join(sorted(hidden))} after that"


def _module_exists(name: str) -> bool:
    """Could find_class import the top module of `name` here (a standard module, or one installed)?"""
    top = name.split(".", 1)[0]
    if top in sys.stdlib_module_names or top in sys.builtin_module_names:
        return True
    try:
        return importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):
        return False


def _after_streams(fh, base, size, start, streams, broken, found, intent, why,
                   budget: Budget) -> tuple[bool, str | None]:
    """Bytes from `start` do not parse as a further stream: legacy storages, or junk that hides streams."""
    if _legacy_storages_fit(fh, base, size, streams):
        for _, _, names in streams[:LEGACY_STREAMS]:  # later "streams" were storage bytes, never unpickled
            found |= names
        return True, None
    for _, _, names in streams:
        found |= names
    hidden = broken | _search(fh, base, size, start, budget)
    found |= hidden
    if not (intent or hidden):
        return False, None  # text that happens to begin like a tiny pickle ("N." ...): nothing imported
    return True, (f"{size - start} bytes from offset {start}, after the pickle, are neither a pickle stream nor "
                  f"torch's storage records ({why})")


def _legacy_storages_fit(fh, base: int, size: int, streams) -> bool:
    """torch.save(..., _use_new_zipfile_serialization=False): after the storage-key list, one record per key,
    in the list's order: an 8-byte little-endian element count, then count × the element size of the type
    the object's persistent id gave that key; the last record ends the file."""
    if len(streams) < LEGACY_STREAMS:
        return False
    first, obj, keys = streams[0][0], streams[LEGACY_STREAMS - 2][0], streams[LEGACY_STREAMS - 1]
    if first.first_int != LEGACY_MAGIC or first.values != 1:
        return False
    pos = keys[1]
    for key in keys[0].strings:
        element_size = _ELEMENT_SIZES.get(obj.storage_types.get(key, ""))
        if element_size is None or pos + 8 > size:
            return False
        fh.seek(base + pos)
        pos += 8 + int.from_bytes(fh.read(8), "little") * element_size
    return pos == size


def _search(fh, base: int, size: int, start: int, budget: Budget, window: int = MAX_TRAILING_SEARCH) -> set[str]:
    """Names imported by streams that start later, within `window` bytes from `start`: right there, or at a
    PROTO, GLOBAL or INST."""
    length = min(size - start, window)
    budget.spend(length)
    fh.seek(base + start)
    data = fh.read(length)
    offsets = set(range(1, min(JUNK_SKIP, len(data))))
    for match in _STREAM_STARTS.finditer(data):
        offsets.add(match.start())
        if len(offsets) >= MAX_CANDIDATES:
            break
    names: set[str] = set()
    view = io.BytesIO(data)
    for offset in sorted(offsets):
        # Right after the break: read from the file to the stream's end, so no length of valid padding hides an
        # import; at a start pattern: within the window (many of them must not make the search quadratic).
        if offset < JUNK_SKIP:
            fh.seek(base + start + offset)
            reader = Reader(fh, size - start - offset, budget)
        else:
            view.seek(offset)
            reader = Reader(view, min(len(data) - offset, MAX_CANDIDATE_BYTES), budget)
        seen: set[str] = set()
        try:
            scan_stream(reader, seen)
        except ValueError:
            seen = {n for n in seen if IMPORTABLE.fullmatch(n)}
        names |= seen
    return names
