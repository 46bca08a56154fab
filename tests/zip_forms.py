"""Hand-made zip files that two zip readers read differently (issue 14), built from real torch.save archives.

`two_directories` is the issue's file: Python's zipfile reads a benign torch archive, torch's own reader
(miniz) a second one whose data.pkl is the payload. The others are layouts the strict reader refuses.
"""
from __future__ import annotations

import io
import struct
import zipfile


def torch_bytes(value=None) -> bytes:
    import torch

    buffer = io.BytesIO()
    torch.save({"weight": torch.zeros(2, 2)} if value is None else value, buffer)
    return buffer.getvalue()


def with_data_pkl(archive: bytes, data_pkl: bytes) -> bytes:
    """The same torch archive (rewritten by zipfile, stored) with data.pkl replaced."""
    source, out = zipfile.ZipFile(io.BytesIO(archive)), io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as target:
        for info in source.infolist():
            data = source.read(info)
            target.writestr(info, data_pkl if info.filename.endswith("/data.pkl") else data)
    return out.getvalue()


def _layout(archive: bytes) -> tuple[bytes, bytes]:
    """(the local records, the central directory) of a single-disk archive without comment."""
    end = archive.rfind(b"PK\x05\x06")
    cd_size, cd_offset = struct.unpack_from("<LL", archive, end + 12)
    if cd_offset == 0xFFFFFFFF or cd_size == 0xFFFFFFFF:
        z64 = struct.unpack_from("<Q", archive, end - 20 + 8)[0]
        cd_size, cd_offset = struct.unpack_from("<QQ", archive, z64 + 40)
    return archive[:cd_offset], archive[cd_offset:cd_offset + cd_size]


def _shift_central(central: bytes, shift: int) -> tuple[bytes, int]:
    out, pos, count = bytearray(central), 0, 0
    while pos < len(out):
        assert out[pos:pos + 4] == b"PK\x01\x02"
        nlen, elen, clen = struct.unpack_from("<3H", out, pos + 28)
        (offset,) = struct.unpack_from("<L", out, pos + 42)
        struct.pack_into("<L", out, pos + 42, offset + shift)
        pos += 46 + nlen + elen + clen
        count += 1
    return bytes(out), count


def _zip64_end(entries: int, cd_size: int, cd_offset: int) -> bytes:
    return struct.pack("<4sQ2H2L4Q", b"PK\x06\x06", 44, 45, 45, 0, 0, entries, entries, cd_size, cd_offset)


def two_directories(benign: bytes, malicious: bytes) -> bytes:
    """Both archives' members, then two central directories, each with its zip64 end record. The zip64
    locator points at the malicious one (miniz follows it); zipfile reads the record right before the
    locator, the benign one."""
    bad_locals, bad_central = _layout(malicious)
    good_locals, good_central = _layout(benign)
    good_central, good_count = _shift_central(good_central, len(bad_locals))
    bad_central, bad_count = _shift_central(bad_central, 0)
    out = bytearray(bad_locals + good_locals)
    bad_cd_at = len(out)
    out += bad_central
    bad_end_at = len(out)
    out += _zip64_end(bad_count, len(bad_central), bad_cd_at)
    good_cd_at = len(out)
    out += good_central
    out += _zip64_end(good_count, len(good_central), good_cd_at)
    out += struct.pack("<4sLQL", b"PK\x06\x07", 0, bad_end_at, 1)
    out += struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0)
    return bytes(out)


def prepended(archive: bytes, junk: bytes = b"#!junk\n" * 8) -> bytes:
    """Bytes before the archive: zipfile shifts every offset by them, miniz does not."""
    return junk + archive


def appended(archive: bytes, extra: bytes) -> bytes:
    return archive + extra


def duplicate_name(archive: bytes, data_pkl: bytes) -> bytes:
    """A second member named like data.pkl: zipfile keeps the last, miniz's sorted lookup finds either."""
    out = io.BytesIO(archive)
    with zipfile.ZipFile(out, "a") as target:
        name = next(n for n in target.namelist() if n.endswith("/data.pkl"))
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            target.writestr(name, data_pkl)
    return out.getvalue()


def local_name_differs(archive: bytes) -> bytes:
    """The first local header names another member than its central entry."""
    data = bytearray(archive)
    assert data[:4] == b"PK\x03\x04"
    nlen = struct.unpack_from("<H", data, 26)[0]
    data[30 + nlen - 1] ^= 0x01
    return bytes(data)


def gap_between_members(archive: bytes) -> bytes:
    """Junk between the local records and the central directory (rebuilt around it)."""
    local, central = _layout(archive)
    junk = b"\x80\x02cposix\nsystem\n."
    central, count = _shift_central(central, 0)
    cd_at = len(local) + len(junk)
    return (local + junk + central
            + struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, count, count, len(central), cd_at, 0))


def case_twin(archive: bytes, data_pkl: bytes) -> bytes:
    """archive/DATA.PKL beside archive/data.pkl: two members for zipfile, one name for torch's lookup."""
    out = io.BytesIO(archive)
    with zipfile.ZipFile(out, "a") as target:
        name = next(n for n in target.namelist() if n.endswith("/data.pkl"))
        target.writestr(name[: -len("data.pkl")] + "DATA.PKL", data_pkl)
    return out.getvalue()


# ---- 7z (nullifAI): the archive format no reader of the scanner opens ------------------------------------

def _number_7z(value: int) -> bytes:
    """7z's variable-length number: the leading 1-bits of the first byte count the bytes that follow it."""
    for extra in range(8):
        if value < 1 << (7 * (extra + 1)):
            return (bytes([((0xFF00 >> extra) & 0xFF) | (value >> (8 * extra))])
                    + (value & ((1 << (8 * extra)) - 1)).to_bytes(extra, "little"))
    return b"\xff" + value.to_bytes(8, "little")


def seven_zip(name: str, data: bytes, compress: bool = True) -> bytes:
    """A one-file 7z archive as 7-Zip writes it (7zFormat.txt): signature header, packed stream, plain header;
    LZMA2 (method 21) or copy (method 00). `7zz t` and `7zz x` read it."""
    import lzma
    import zlib

    n = _number_7z
    if compress:
        packed = lzma.compress(data, format=lzma.FORMAT_RAW, filters=[{"id": lzma.FILTER_LZMA2, "dict_size": 1 << 20}])
        coder = b"\x21\x21" + n(1) + bytes([16])  # id size 1 with properties; LZMA2; a 1 MiB dictionary
    else:
        packed, coder = data, b"\x01\x00"
    names = name.encode("utf-16-le") + b"\x00\x00"
    header = (b"\x01\x04"  # Header, MainStreamsInfo
              + b"\x06" + n(0) + n(1) + b"\x09" + n(len(packed)) + b"\x00"  # PackInfo: one stream at 0
              + b"\x07\x0b" + n(1) + b"\x00" + n(1) + coder  # UnpackInfo: one folder of one coder
              + b"\x0c" + n(len(data)) + b"\x0a\x01" + struct.pack("<L", zlib.crc32(data)) + b"\x00"
              + b"\x00"  # end of MainStreamsInfo
              + b"\x05" + n(1) + b"\x11" + n(len(names) + 1) + b"\x00" + names + b"\x00"  # FilesInfo: the name
              + b"\x00")
    start = struct.pack("<QQL", len(packed), len(header), zlib.crc32(header))
    return b"7z\xbc\xaf\x27\x1c\x00\x04" + struct.pack("<L", zlib.crc32(start)) + start + packed + header


def unseven_zip(archive: bytes) -> bytes:
    """The one file of an archive seven_zip wrote (the live proof's reader: the scanner has none)."""
    import lzma

    next_offset, next_size, _ = struct.unpack_from("<QQL", archive, 12)
    packed, header = archive[32:32 + next_offset], archive[32 + next_offset:32 + next_offset + next_size]
    coder = header[header.index(b"\x07\x0b\x01\x00\x01") + 5:][:2]
    if coder == b"\x01\x00":  # copy
        return packed
    assert coder == b"\x21\x21", coder
    return lzma.decompress(packed, format=lzma.FORMAT_RAW,
                           filters=[{"id": lzma.FILTER_LZMA2, "dict_size": 1 << 20}])
