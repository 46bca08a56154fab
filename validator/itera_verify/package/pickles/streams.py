"""A raw pickle file: consecutive streams, torch's legacy layout, and whatever follows the last stream.

`pickle.load` called repeatedly, and torch's legacy loader, read stream after stream; a reviewer's tool may
seek past junk. So after the last complete stream the rest of the file must be accounted for: torch's legacy
storage records (a size, then raw bytes, for each key of the storage-key list), or nothing. Anything else is
searched for streams (bounded) and, in a file that is a pickle, refused: it cannot be scanned whole.
"""
from __future__ import annotations

import io
import re

from .opcodes import IMPORTABLE, Reader, Stream, scan_stream

LEGACY_MAGIC = 0x1950A86A20F9469CFC6C  # torch.serialization.MAGIC_NUMBER, the first legacy stream
LEGACY_STREAMS = 5  # magic, protocol version, sys_info, the object, the storage keys; then the storages
# A legacy record gives its element count; the element size comes from the storage type of its key.
_ELEMENT_SIZES = {f"torch.{name}Storage": size for name, size in {
    "BFloat16": 2, "Bool": 1, "Byte": 1, "Char": 1, "ComplexDouble": 16, "ComplexFloat": 8, "Double": 8,
    "Float": 4, "Half": 2, "Int": 4, "Long": 8, "QInt32": 4, "QInt8": 1, "QUInt2x4": 1, "QUInt4x2": 1,
    "QUInt8": 1, "Short": 2}.items()}
MAX_TRAILING_SEARCH = 64 << 20  # junk longer than this is refused without searching it
MAX_CANDIDATES = 512
MAX_CANDIDATE_BYTES = 256 << 10  # each later stream is read this far at most: the search stays bounded
JUNK_SKIP = 16  # streams that start within this many bytes after the junk are tried one by one
_STREAM_STARTS = re.compile(rb"\x80[\x00-\x05]|[ci][A-Za-z_][\w.]*\n[\w.]+\n")  # PROTO, GLOBAL / INST


def scan_raw(fh, base: int, size: int, found: set[str], certain: bool = False,
             named: bool = False) -> tuple[bool, str | None]:
    """Scan the streams of `size` bytes at `base` of a seekable file: (is a pickle, why it cannot be scanned).

    `certain`: the caller knows this is a pickle (a pickle extension, a .pkl member), so any failure is an
    error; otherwise a file that breaks at once is not a pickle (an image named .pt, a text file), unless it
    began with the PROTO magic or imported something before it broke. `named`: a pickle extension, so junk
    after a complete stream is an error even without the PROTO magic. The unpickler runs opcodes as it reads
    them, so names a broken stream imported before it broke count, when they could be imported at all."""
    fh.seek(base)
    magic = fh.read(2)
    has_magic = len(magic) == 2 and magic[0] == 0x80 and 2 <= magic[1] <= 5
    intent = certain or has_magic
    streams: list[tuple[Stream, int, set[str]]] = []  # (what it held, where it ends, the names it imports)
    offset = 0
    while offset < size:
        fh.seek(base + offset)
        reader, names = Reader(fh, size - offset), set()
        try:
            info = scan_stream(reader, names)
        except ValueError as exc:
            broken = {n for n in names if IMPORTABLE.fullmatch(n)}
            if not streams:
                found |= broken
                is_pickle = intent or bool(broken)
                return is_pickle, (str(exc) if is_pickle else None)
            return _after_streams(fh, base, size, offset, streams, broken, found, intent or named, str(exc))
        streams.append((info, offset + reader.pos, names))
        offset += reader.pos
    if not streams:
        return intent, ("no data" if intent else None)
    for _, _, names in streams:
        found |= names
    return True, None


def _after_streams(fh, base, size, start, streams, broken, found, intent, why) -> tuple[bool, str | None]:
    """Bytes from `start` do not parse as a further stream: legacy storages, or junk that hides streams."""
    if _legacy_storages_fit(fh, base, size, streams):
        for _, _, names in streams[:LEGACY_STREAMS]:  # later "streams" were storage bytes, never unpickled
            found |= names
        return True, None
    for _, _, names in streams:
        found |= names
    hidden = broken | _search(fh, base, size, start)
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


def _search(fh, base: int, size: int, start: int) -> set[str]:
    """Names imported by streams that start later in the junk: right after it, or at a PROTO, GLOBAL or INST."""
    if size - start > MAX_TRAILING_SEARCH:
        return set()
    fh.seek(base + start)
    data = fh.read(size - start)
    offsets = set(range(1, min(JUNK_SKIP, len(data))))
    for match in _STREAM_STARTS.finditer(data):
        offsets.add(match.start())
        if len(offsets) >= MAX_CANDIDATES:
            break
    names: set[str] = set()
    view = io.BytesIO(data)
    for offset in sorted(offsets):
        view.seek(offset)
        seen: set[str] = set()
        try:
            scan_stream(Reader(view, min(len(data) - offset, MAX_CANDIDATE_BYTES)), seen)
        except ValueError:
            seen = {n for n in seen if IMPORTABLE.fullmatch(n)}
        names |= seen
    return names
