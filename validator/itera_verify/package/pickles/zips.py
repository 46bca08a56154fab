"""Zip archives read exactly as every reader reads them, or refused.

Python's `zipfile` and torch's reader (miniz, in caffe2's PyTorchFileReader) find the central directory and the
members differently: zipfile accepts bytes before the archive and shifts every offset by them, reads the zip64
end record right before its locator while miniz follows the locator's offset, and keeps the last of two members
with one name. Two readers can thus see two archives in one file. So the layout is checked strictly first: one
end record ending the file, the central directory right before it, local headers that repeat the central
entries, members packed from offset 0 with no gap or overlap, unique names. Only then are members read, with
zipfile, after checking that it sees this same layout.
"""
from __future__ import annotations

import struct
import zipfile
from dataclasses import dataclass

EOCD, EOCD64, LOCATOR = b"PK\x05\x06", b"PK\x06\x06", b"PK\x06\x07"
CENTRAL, LOCAL, DESCRIPTOR = b"PK\x01\x02", b"PK\x03\x04", b"PK\x07\x08"
_EOCD = struct.Struct("<4s4H2LH")
_EOCD64 = struct.Struct("<4sQ2H2L4Q")
_LOCATOR = struct.Struct("<4sLQL")
_CENTRAL = struct.Struct("<4s4B4HL2L5H2L")
_LOCAL = struct.Struct("<4s2B4HL2L2H")
_METHODS = {zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA}
MAX_ENTRIES = 1 << 20
_PLAIN_FLAGS = 0x080E  # deflate options, data descriptor, UTF-8 names: no encryption, patch or masking
_DIRECTORY_ATTRIBUTES = 0x10 | (0o040000 << 16)  # the DOS directory bit, a Unix directory mode
_MAX32, _MAX16 = 0xFFFFFFFF, 0xFFFF


class AmbiguousZip(ValueError):
    """The file is not one unambiguous zip archive: never read, never loaded."""


@dataclass
class Entry:
    name: str
    raw_name: bytes
    flags: int
    method: int
    crc: int
    compressed: int
    size: int
    offset: int


def _read_at(fh, offset: int, n: int) -> bytes:
    fh.seek(offset)
    data = fh.read(n)
    if len(data) != n:
        raise AmbiguousZip(f"{n} bytes at offset {offset} run past the end of the file")
    return data


def _end_records(fh, size: int) -> tuple[int, int, int]:
    """(entries, central directory offset, where the central directory must end)."""
    window = min(size, _EOCD.size + _MAX16)
    tail = _read_at(fh, size - window, window)
    found = tail.rfind(EOCD, 0, window - _EOCD.size + len(EOCD))  # miniz's choice: the last one
    if found < 0:
        raise AmbiguousZip("no end-of-central-directory record")
    at = size - window + found
    (_, disk, cd_disk, entries_here, entries, cd_size, cd_offset, comment) = _EOCD.unpack_from(tail, found)
    if at + _EOCD.size + comment != size:
        raise AmbiguousZip(f"{size - at - _EOCD.size - comment:+d} bytes after the end record and its comment")
    trailer = tail[found + 4:]
    if any(sig in trailer for sig in (EOCD, EOCD64, LOCATOR, CENTRAL)):
        raise AmbiguousZip("a second end record or directory signature after the end record")
    if disk or cd_disk or entries_here != entries:
        raise AmbiguousZip("a multi-disk archive")
    cd_end = at
    if at >= _LOCATOR.size and _read_at(fh, at - _LOCATOR.size, 4) == LOCATOR:
        _, locator_disk, record_at, disks = _LOCATOR.unpack(_read_at(fh, at - _LOCATOR.size, _LOCATOR.size))
        # zipfile reads the zip64 record right before the locator, miniz where the locator points: one place.
        if record_at != at - _LOCATOR.size - _EOCD64.size or locator_disk or disks != 1:
            raise AmbiguousZip("the zip64 locator does not point at the zip64 record right before it")
        (sig, record_size, _, _, disk64, cd_disk64, here64, entries64, cd_size64, cd_offset64) = \
            _EOCD64.unpack(_read_at(fh, record_at, _EOCD64.size))
        if sig != EOCD64 or record_size != _EOCD64.size - 12 or disk64 or cd_disk64 or here64 != entries64:
            raise AmbiguousZip("a zip64 end record that is not the plain one both readers parse alike")
        for short, long in ((entries, entries64), (cd_size, cd_size64), (cd_offset, cd_offset64)):
            if short != long and short not in (_MAX16, _MAX32):
                raise AmbiguousZip("the zip64 end record disagrees with the end record")
        entries, cd_size, cd_offset, cd_end = entries64, cd_size64, cd_offset64, record_at
    elif _MAX32 in (cd_size, cd_offset) or entries == _MAX16:
        raise AmbiguousZip("zip64 sizes without a zip64 end record")
    if cd_offset + cd_size != cd_end:
        # zipfile would shift every offset by the difference (bytes prepended to the archive), miniz would not.
        raise AmbiguousZip(f"the central directory ends at {cd_offset + cd_size}, not right before the end "
                           f"record at {cd_end}")
    if entries > MAX_ENTRIES:
        raise AmbiguousZip(f"{entries} entries")
    return entries, cd_offset, cd_end


def _zip64_extra(extra: bytes, wanted: list[bool]) -> list[int]:
    """The 8-byte values of the zip64 extra field (id 1), in order, for the fields that were 0xFFFFFFFF."""
    pos = 0
    while pos + 4 <= len(extra):
        tag, length = struct.unpack_from("<2H", extra, pos)
        if tag == 1:
            values = [struct.unpack_from("<Q", extra, pos + 4 + 8 * i)[0] for i in range(length // 8)]
            if len(values) < sum(wanted):
                raise AmbiguousZip("a zip64 extra field shorter than the fields it replaces")
            return values
        pos += 4 + length
    if any(wanted):
        raise AmbiguousZip("a 0xFFFFFFFF size or offset without a zip64 extra field")
    return []


def _central(fh, entries: int, cd_offset: int, cd_end: int) -> list[Entry]:
    data = _read_at(fh, cd_offset, cd_end - cd_offset)
    result, pos, names = [], 0, set()
    for _ in range(entries):
        if data[pos:pos + 4] != CENTRAL or pos + _CENTRAL.size > len(data):
            raise AmbiguousZip(f"central directory entry {len(result)} is not where the previous one ends")
        (_, _, _, _, _, flags, method, _, _, crc, compressed, size, nlen, elen, clen, disk, _, attributes, offset) = \
            _CENTRAL.unpack_from(data, pos)
        raw_name = data[pos + _CENTRAL.size:pos + _CENTRAL.size + nlen]
        extra = data[pos + _CENTRAL.size + nlen:pos + _CENTRAL.size + nlen + elen]
        pos += _CENTRAL.size + nlen + elen + clen
        wide = [size == _MAX32, compressed == _MAX32, offset == _MAX32]
        values = iter(_zip64_extra(extra, wide))
        size, compressed, offset = (next(values) if w else v for w, v in zip(wide, (size, compressed, offset)))
        name = raw_name.decode("utf-8" if flags & 0x800 else "cp437")
        if flags & ~_PLAIN_FLAGS or method not in _METHODS or disk:
            raise AmbiguousZip(f"{name}: encrypted, patched, multi-disk or compressed with method {method}")
        if method == zipfile.ZIP_STORED and compressed != size:
            raise AmbiguousZip(f"{name}: stored with a compressed size unlike its size")
        # miniz takes an entry whose attributes say "directory" for one (and extracts nothing); zipfile goes by
        # the trailing "/" alone.
        if (attributes & _DIRECTORY_ATTRIBUTES) and not name.endswith("/") or (name.endswith("/") and size):
            raise AmbiguousZip(f"{name}: a directory by its attributes or its name, not by both")
        # miniz, as torch calls it, looks names up without regard to case: DATA.pkl may stand for data.pkl.
        if name.lower() in names or len(raw_name) != nlen:
            raise AmbiguousZip(f"{name}: two entries with one name (ignoring case), or a name cut short")
        names.add(name.lower())
        result.append(Entry(name, raw_name, flags, method, crc, compressed, size, offset))
    if pos != len(data):
        raise AmbiguousZip(f"{len(data) - pos} bytes in the central directory after its {entries} entries")
    return result


def _descriptor_fits(gap: bytes, entry: Entry) -> bool:
    """A data descriptor (optional signature, CRC, sizes in 4 or 8 bytes) that repeats the central entry."""
    body = gap[4:] if gap[:4] == DESCRIPTOR else gap
    for fmt in ("<3L", "<L2Q"):
        if len(body) == struct.calcsize(fmt) and struct.unpack(fmt, body) == (entry.crc, entry.compressed,
                                                                           entry.size):
            return True
    return False


def read_layout(fh, size: int) -> list[Entry]:
    """The members of the one archive the file holds, in central-directory order; AmbiguousZip otherwise."""
    try:
        return _read_layout(fh, size)
    except (struct.error, UnicodeDecodeError) as exc:  # a field that runs past its record
        raise AmbiguousZip(f"a record cut short or misencoded ({exc})") from exc


def _read_layout(fh, size: int) -> list[Entry]:
    entries, cd_offset, cd_end = _end_records(fh, size)
    members = _central(fh, entries, cd_offset, cd_end)
    expected = 0  # the next local header starts where the previous member (and its descriptor) ended
    ordered = sorted(members, key=lambda e: e.offset)
    for index, entry in enumerate(ordered):
        if entry.offset != expected:
            raise AmbiguousZip(f"{entry.name}: local header at {entry.offset}, expected at {expected} "
                               "(bytes before, between or under the members)")
        (sig, _, _, flags, method, _, _, crc, compressed, usize, nlen, elen) = \
            _LOCAL.unpack(_read_at(fh, entry.offset, _LOCAL.size))
        raw_name = _read_at(fh, entry.offset + _LOCAL.size, nlen)
        if sig != LOCAL or raw_name != entry.raw_name or method != entry.method or flags != entry.flags:
            raise AmbiguousZip(f"{entry.name}: the local header differs from the central directory")
        if flags & 0x8 and (crc, compressed, usize) not in ((0, 0, 0), (entry.crc, entry.compressed, entry.size)):
            raise AmbiguousZip(f"{entry.name}: local sizes or CRC differ from the central directory")
        if not flags & 0x8:
            wide = [usize == _MAX32, compressed == _MAX32]
            values = iter(_zip64_extra(_read_at(fh, entry.offset + _LOCAL.size + nlen, elen), wide))
            usize, compressed = (next(values) if w else v for w, v in zip(wide, (usize, compressed)))
            if (crc, compressed, usize) != (entry.crc, entry.compressed, entry.size):
                raise AmbiguousZip(f"{entry.name}: local sizes or CRC differ from the central directory")
        data_end = entry.offset + _LOCAL.size + nlen + elen + entry.compressed
        following = ordered[index + 1].offset if index + 1 < len(ordered) else cd_offset
        if following < data_end or following - data_end > 24:
            raise AmbiguousZip(f"{entry.name}: its data overlaps what follows, or a gap follows it")
        gap = _read_at(fh, data_end, following - data_end)
        if (flags & 0x8 and not _descriptor_fits(gap, entry)) or (not flags & 0x8 and gap):
            raise AmbiguousZip(f"{entry.name}: bytes after its data that are not its data descriptor")
        expected = following
    if expected != cd_offset:
        raise AmbiguousZip(f"{cd_offset - expected} bytes between the last member and the central directory")
    return members


def open_checked(fh, size: int) -> zipfile.ZipFile:
    """A ZipFile over `fh`, after the strict layout check and a check that zipfile sees that same layout."""
    members = read_layout(fh, size)
    fh.seek(0)
    archive = zipfile.ZipFile(fh)
    seen = [(i.filename, i.header_offset, i.compress_size, i.file_size, i.compress_type) for i in archive.infolist()]
    if seen != [(e.name, e.offset, e.compressed, e.size, e.method) for e in members]:
        archive.close()
        raise AmbiguousZip("Python's zipfile reads another layout than the central directory describes")
    return archive
