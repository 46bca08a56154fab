"""The archive format layer alone: tar headers, the streaming writer and reader, SHA256SUMS, zstd framing."""
from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
import tarfile

import pytest
import zstandard

from itera_verify.archive import (ArchiveReader, ArchiveWriter, Corrupt, NotZstd, SumsError, TooLarge, Truncated,
                                  format_sums, parse_sums, tar_header)
from itera_verify.archive.profile import OutsideProfile, octal
from itera_verify.archive.reader import parse_pax
from itera_verify.archive.tarheader import DIRECTORY, REGULAR, SYMLINK
from itera_verify.archive.zstdframes import FrameError, FrameScanner

MTIME = 1_700_000_000


def write_archive(members, *, level=3) -> bytes:
    """members: (name, kind, payload) with kind file|dir|symlink; payload bytes, or a link target."""
    out = io.BytesIO()
    writer = ArchiveWriter(out, level=level, threads=2)
    for name, kind, payload in members:
        if kind == "dir":
            writer.add_directory(name, mtime=MTIME)
        elif kind == "symlink":
            writer.add_symlink(name, payload, mtime=MTIME)
        else:
            writer.add_bytes(name, payload, mtime=MTIME)
    writer.close()
    return out.getvalue()


def read_archive(data: bytes, **options) -> list[tuple]:
    out = []
    with ArchiveReader(io.BytesIO(data), **options) as reader:
        for member in reader:
            digest = hashlib.sha256(b"".join(bytes(p) for p in reader.data(member))).hexdigest()
            out.append((member.name, member.kind, member.size, member.linkname, digest))
    return out


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


LONG_NAME = "top/" + "deep-folder/" * 12 + "weights-shard-00001-of-00042.safetensors"
ODD_NAME = "top/répertoire/ünïcode €.json"


def test_round_trip_keeps_names_kinds_sizes_and_bytes():
    big = os.urandom(3 << 20) + bytes(5 << 20)  # spans several read buffers
    members = [("top", "dir", b""), ("top/a.txt", "file", b"hello\n"), ("top/empty", "file", b""),
               ("top/big.bin", "file", big), (LONG_NAME, "file", b"long"), (ODD_NAME, "file", b"{}"),
               ("top/latest", "symlink", "a.txt")]
    got = read_archive(write_archive(members))
    assert got == [
        ("top/", "directory", 0, "", sha(b"")), ("top/a.txt", "file", 6, "", sha(b"hello\n")),
        ("top/empty", "file", 0, "", sha(b"")), ("top/big.bin", "file", len(big), "", sha(big)),
        (LONG_NAME, "file", 4, "", sha(b"long")), (ODD_NAME, "file", 2, "", sha(b"{}")),
        ("top/latest", "symlink", 0, "a.txt", sha(b"")),
    ]


def test_python_tarfile_reads_what_the_writer_wrote_including_pax_names():
    data = zstandard.ZstdDecompressor().decompress(
        write_archive([("top", "dir", b""), (LONG_NAME, "file", b"long"), (ODD_NAME, "file", b"{}")]),
        max_output_size=1 << 20)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        infos = tar.getmembers()
        assert [i.name for i in infos] == ["top", LONG_NAME, ODD_NAME]
        assert all(i.uid == 0 and i.gid == 0 and i.uname == "" and i.gname == "" for i in infos)
        assert tar.extractfile(LONG_NAME).read() == b"long"


@pytest.mark.parametrize("name, kind, size, mode, link", [
    ("top/params/control.json", REGULAR, 1234, 0o644, ""),
    ("top/run.sh", REGULAR, 0, 0o755, ""),
    ("top/latest", SYMLINK, 0, 0o777, "checkpoint-400"),
    ("x" * 100, REGULAR, 7, 0o644, ""),
])
def test_ustar_fast_path_is_byte_identical_to_tarfile(name, kind, size, mode, link):
    info = tarfile.TarInfo(name)
    info.type, info.size, info.mode, info.mtime, info.linkname = kind, size, mode, MTIME, link
    info.uname = info.gname = ""
    expected = info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
    assert tar_header(name, kind, size=size, mode=mode, mtime=MTIME, linkname=link) == expected


@pytest.mark.parametrize("name, kind, size, mtime, link", [
    ("top/" + "d" * 120 + "/", DIRECTORY, 0, MTIME, ""),
    ("top/é/ünï.txt", REGULAR, 3, MTIME, ""),
    ("top/bad\udcff.bin", REGULAR, 3, -1, ""),
    ("top/" + "x" * 95 + "/y" * 4, REGULAR, 9 << 30, 8 ** 11, ""),
    ("top/link", SYMLINK, 0, MTIME, "a" + "/." * 70),
    ("top/é-link", SYMLINK, 0, -86_400, "bad\udcff"),
])
def test_pax_headers_built_here_are_byte_identical_to_tarfile(name, kind, size, mtime, link):
    """The PAX encoding is built by tarheader.py, not by tarfile (the audit compares every header with it, so it
    must not change with the Python version), and is the one tarfile writes on this Python."""
    info = tarfile.TarInfo(name)
    mode = {DIRECTORY: 0o755, SYMLINK: 0o777}.get(kind, 0o644)
    info.type, info.size, info.mode, info.mtime, info.linkname = kind, size, mode, mtime, link
    info.uname = info.gname = ""
    expected = info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
    assert tar_header(name, kind, size=size, mode=mode, mtime=mtime, linkname=link) == expected


def test_a_file_of_8_gib_or_more_gets_a_pax_size_record():
    size = 9 << 30
    header = tar_header("top/huge.safetensors", REGULAR, size=size, mtime=MTIME)
    assert len(header) == 3 * 512  # PAX header block, its records, the ustar header
    assert b"size=%d\n" % size in header[512:1024]
    assert parse_pax(header[512:1024].rstrip(b"\0"))["size"] == str(size)
    info = tarfile.TarInfo.frombuf(header[1024:], "utf-8", "surrogateescape")
    assert info.name == "top/huge.safetensors"
    # The reader honours the PAX size: it reports 9 GiB, then finds the data missing.
    compressed = zstandard.ZstdCompressor().compress(header)
    reader = ArchiveReader(io.BytesIO(compressed))
    member = next(iter(reader))
    assert (member.name, member.size) == ("top/huge.safetensors", size)
    with pytest.raises(Truncated):
        list(reader.data(member))
    reader.close()


def test_base256_numbers_are_outside_the_profile():
    """The writer stores 8 GiB and more as a PAX size record, never in GNU base-256 (archive/profile.py)."""
    assert octal(b"%011o\0" % (8 ** 11 - 1), "size", 0, "top/a") == 8 ** 11 - 1
    for field in (b"\x80" + (9 << 30).to_bytes(11, "big"), b"\xff" * 12, b"\x000000000012", b" 0000000012\0",
                  b"+0000000012\0", b"0_000000012\0"):
        with pytest.raises(OutsideProfile):
            octal(field, "size", 0, "top/a")


def test_gnu_long_names_are_refused_as_outside_the_profile():
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT) as tar:
        info = tarfile.TarInfo(LONG_NAME)
        info.size = 3
        tar.addfile(info, io.BytesIO(b"abc"))
    with pytest.raises(OutsideProfile, match="GNU long name"):
        read_archive(zstandard.ZstdCompressor().compress(buffer.getvalue()))


def test_gnu_tar_lists_the_archive(tmp_path):
    archive = tmp_path / "a.tar.zst"
    archive.write_bytes(write_archive([("top", "dir", b""), (LONG_NAME, "file", b"long"), (ODD_NAME, "file", b"{}")]))
    listing = subprocess.run(["tar", "--zstd", "-tf", str(archive)], capture_output=True, text=True, check=True)
    assert listing.stdout.splitlines() == ["top/", LONG_NAME, ODD_NAME]


def test_high_entropy_large_file_goes_into_fast_frames_with_the_same_ratio():
    import numpy as np

    weights = (np.random.default_rng(0).standard_normal(6 << 20, dtype=np.float32) * 0.02)
    bf16 = (weights.view(np.uint32) >> 16).astype(np.uint16).tobytes()  # 12 MiB of bf16-like values
    out = io.BytesIO()
    writer = ArchiveWriter(out, level=3, threads=2)
    writer.add_bytes("top/model.safetensors", bf16)
    writer.add_bytes("top/metrics.jsonl", b'{"step": 1, "name": "loss", "value": 0.5}\n' * 20000)
    writer.close()
    assert writer.fast_files == 1
    level3 = len(zstandard.ZstdCompressor(level=3).compress(bf16))
    assert len(out.getvalue()) < level3 * 1.01 + 50_000
    assert read_archive(out.getvalue())[0][4] == sha(bf16)


# ---- hostile or damaged streams --------------------------------------------------------------------------
def test_a_file_that_is_not_zstd_is_NotZstd():
    for data in (b"", b"PK\x03\x04 a zip file", b"\x1f\x8b gzip", b"abc"):
        with pytest.raises(NotZstd):
            read_archive(data)


def test_a_stream_cut_anywhere_is_Truncated():
    data = write_archive([("top", "dir", b""), ("top/a.bin", "file", os.urandom(300_000)),
                          ("top/b.txt", "file", b"text " * 50_000)])
    for cut in (5, 20, len(data) // 3, len(data) // 2, len(data) - 1):
        with pytest.raises(Truncated):
            read_archive(data[:cut])


def test_a_tar_stream_without_its_end_blocks_is_Truncated():
    info = tarfile.TarInfo("top/a")
    info.size = 1
    tar = info.tobuf(tarfile.PAX_FORMAT) + b"x".ljust(512, b"\0")  # no end-of-archive blocks
    with pytest.raises(Truncated):
        read_archive(zstandard.ZstdCompressor().compress(tar))


def test_a_flipped_byte_is_Corrupt_or_Truncated_never_a_library_error():
    data = bytearray(write_archive([("top", "dir", b""), ("top/a.txt", "file", b"the same line\n" * 40_000)]))
    data[len(data) // 2] ^= 0x55
    with pytest.raises((Corrupt, Truncated)):
        read_archive(bytes(data))


def test_a_bad_header_checksum_is_Corrupt():
    header = bytearray(tar_header("top/a", REGULAR, size=0))
    header[0] = ord("b")  # renamed without fixing the checksum
    with pytest.raises(Corrupt, match="checksum"):
        read_archive(zstandard.ZstdCompressor().compress(bytes(header) + bytes(1024)))


@pytest.mark.parametrize("signed", [False, True])
def test_header_checksums_summed_as_unsigned_or_as_signed_bytes_are_both_read(signed):
    """Old tars summed the header as signed bytes; that sum differs once a byte is above 127 (a Latin-1 name)."""
    from itera_verify.archive.tarheader import _ustar_header

    header = bytearray(_ustar_header(b"top/caf\xe9.txt", REGULAR, 3, 0o644, MTIME, b""))
    header[148:156] = b" " * 8
    total = sum(b - 256 if signed and b > 127 else b for b in header)
    header[148:156] = b"%06o\0 " % total
    tar = bytes(header) + b"abc" + bytes(509) + bytes(1024)
    assert read_archive(zstandard.ZstdCompressor().compress(tar)) == [
        ("top/caf\udce9.txt", "file", 3, "", sha(b"abc"))]
    header[148:156] = b"%06o\0 " % (total + 1)
    with pytest.raises(Corrupt, match="checksum"):
        read_archive(zstandard.ZstdCompressor().compress(bytes(header) + b"abc" + bytes(509) + bytes(1024)))


def test_data_hidden_after_the_end_of_archive_is_Corrupt():
    tar = tar_header("top/a", REGULAR, size=0) + bytes(1024) + b"hidden member"
    with pytest.raises(Corrupt, match="after the end-of-archive"):
        read_archive(zstandard.ZstdCompressor().compress(tar))


def test_expansion_past_the_limit_stops_with_TooLarge_early():
    zeros = zstandard.ZstdCompressor(level=3)
    out = io.BytesIO()
    with zeros.stream_writer(out, closefd=False) as stream:
        stream.write(tar_header("top/bomb", REGULAR, size=1 << 30))
        block = bytes(8 << 20)
        for _ in range(128):
            stream.write(block)
        stream.write(bytes(1024))
    assert len(out.getvalue()) < 200_000  # 1 GiB in a few dozen KiB
    reader = ArchiveReader(io.BytesIO(out.getvalue()), max_expanded=16 << 20)
    with pytest.raises(TooLarge):
        for member in reader:
            for _ in reader.data(member):
                pass
    assert reader.expanded_bytes <= (16 << 20) + (4 << 20)
    reader.close()


def test_frame_scanner_accepts_skippable_frames_and_rejects_reserved_blocks():
    scanner = FrameScanner()
    skippable = (0x184D2A50).to_bytes(4, "little") + (3).to_bytes(4, "little") + b"abc"
    scanner.feed(skippable + zstandard.ZstdCompressor().compress(b"x" * 1000))
    scanner.finish()
    assert scanner.frames == 2
    broken = FrameScanner()
    with pytest.raises(FrameError):
        broken.feed((0xFD2FB528).to_bytes(4, "little") + bytes([0x20, 10]) + (0b111).to_bytes(3, "little"))


# ---- SHA256SUMS -------------------------------------------------------------------------------------------
def test_sums_round_trip_with_names_sha256sum_escapes():
    digests = {"a.txt": "a" * 64, "back\\slash": "b" * 64, "new\nline": "c" * 64, "car\rriage": "d" * 64,
               "é.json": "e" * 64, "bad-\udcff-byte": "f" * 64}
    text = format_sums(digests)
    assert b"\\" + b"b" * 64 + b"  back\\\\slash\n" in text
    assert parse_sums(text) == digests


def test_malformed_sums_lines_are_errors_with_line_numbers():
    with pytest.raises(SumsError) as error:
        parse_sums(b"a" * 64 + b"  ok.txt\nnot a checksum line\n")
    assert error.value.line == 2
    with pytest.raises(SumsError):
        parse_sums(b"a" * 64 + b"  twice\n" + b"b" * 64 + b"  twice\n")


def test_coreutils_sha256sum_checks_what_format_sums_wrote(tmp_path):
    names = ["plain.txt", "with space.txt", "new\nline.txt", "back\\slash.txt", "é.json"]
    for index, name in enumerate(names):
        (tmp_path / name).write_bytes(b"content %d" % index)
    digests = {name: sha((tmp_path / name).read_bytes()) for name in names}
    (tmp_path / "SUMS").write_bytes(format_sums(digests))
    check = subprocess.run(["sha256sum", "-c", "SUMS"], cwd=tmp_path, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    produced = subprocess.run(["sha256sum", "--", *names], cwd=tmp_path, capture_output=True, check=True).stdout
    assert parse_sums(produced) == digests


# ---- several frames, decompressed in parallel ------------------------------------------------------------
@pytest.fixture
def small_frames(monkeypatch):
    """Frames of 64 KiB instead of 32 MiB, so a small archive has many."""
    from itera_verify.archive import writer

    monkeypatch.setattr(writer, "FRAME_SPAN", 64 << 10)


def write_file(path, members) -> list[tuple[int, int]]:
    with open(path, "wb") as out:
        writer = ArchiveWriter(out, level=3, threads=2)
        for name, payload in members:  # in 16 KiB pieces: a frame ends between pieces
            pieces = [payload[i: i + (16 << 10)] for i in range(0, len(payload), 16 << 10)]
            writer.add_file(name, len(payload), pieces, mtime=MTIME)
        writer.close()
    return writer.frames


def read_file(path, **options) -> list[tuple]:
    out = []
    with open(path, "rb", buffering=0) as source, ArchiveReader(source, **options) as reader:
        for member in reader:
            out.append((member.name, hashlib.sha256(b"".join(bytes(p) for p in reader.data(member))).hexdigest()))
        out.append(("archive", reader.archive_sha256))
    return out


MEMBERS = [("top/a.bin", os.urandom(700_000)), ("top/b.txt", b"line of text\n" * 100_000), ("top/c", b"")]


def test_frames_recorded_by_the_writer_or_found_by_scanning_read_in_parallel(tmp_path, small_frames):
    frames = write_file(tmp_path / "a.tar.zst", MEMBERS)
    assert len(frames) > 10 and frames[0][0] == 0 and frames[-1][1] == (tmp_path / "a.tar.zst").stat().st_size
    expected = [(name, sha(data)) for name, data in MEMBERS] + [("archive", sha((tmp_path / "a.tar.zst").read_bytes()))]
    assert read_file(tmp_path / "a.tar.zst", frames=frames) == expected
    assert read_file(tmp_path / "a.tar.zst", frames="scan") == expected
    assert read_file(tmp_path / "a.tar.zst") == expected


def test_scanning_a_damaged_multi_frame_file_reports_it(tmp_path, small_frames):
    frames = write_file(tmp_path / "a.tar.zst", MEMBERS)
    data = (tmp_path / "a.tar.zst").read_bytes()
    (tmp_path / "cut.tar.zst").write_bytes(data[: frames[5][1] + 10])
    with pytest.raises(Truncated):
        read_file(tmp_path / "cut.tar.zst", frames="scan")
    (tmp_path / "short.tar.zst").write_bytes(data[: frames[5][1]])  # cut on a frame boundary: the tar ends early
    with pytest.raises(Truncated):
        read_file(tmp_path / "short.tar.zst", frames="scan")
    flipped = bytearray(data)
    flipped[frames[3][1] - 2] ^= 0x01  # a frame checksum
    (tmp_path / "flip.tar.zst").write_bytes(bytes(flipped))
    with pytest.raises(Corrupt):
        read_file(tmp_path / "flip.tar.zst", frames="scan")
    (tmp_path / "junk.tar.zst").write_bytes(data + b"junk")
    with pytest.raises((Corrupt, NotZstd)):
        read_file(tmp_path / "junk.tar.zst", frames="scan")


def test_parallel_reading_stops_a_bomb_too(tmp_path, small_frames):
    frames = write_file(tmp_path / "a.tar.zst", [("top/zeros", bytes(16 << 20))])
    with pytest.raises(TooLarge):
        read_file(tmp_path / "a.tar.zst", frames=frames, max_expanded=8 << 20)


# ---- writeback started while writing ---------------------------------------------------------------------
def test_writeback_is_requested_for_every_written_range_in_order(tmp_path, small_frames, monkeypatch):
    """The final fsync finds little left: each range is handed to the kernel as it is written, contiguous from
    where the file object stood (here after a 100-byte prefix) to the end of the archive."""
    from itera_verify.archive import output, writeback

    requested = []

    def recording(fd, offset, length):
        requested.append((offset, length))
        return writeback.start_writeback(fd, offset, length)

    monkeypatch.setattr(output, "start_writeback", recording)
    path = tmp_path / "a.bin"
    with open(path, "wb") as out:
        out.write(b"p" * 100)
        archive = ArchiveWriter(out, level=3, threads=2)
        archive.add_file("top/a.bin", 700_000, [os.urandom(700_000)], mtime=MTIME)
        archive.close()
    assert len(requested) > 5 and requested[0][0] == 100
    assert all(a + n == b for (a, n), (b, _) in zip(requested, requested[1:]))
    assert requested[-1][0] + requested[-1][1] == path.stat().st_size


def test_start_writeback_accepts_a_regular_file_and_refuses_a_pipe(tmp_path):
    from itera_verify.archive.writeback import start_writeback

    path = tmp_path / "f"
    path.write_bytes(b"x" * 10_000)
    with open(path, "rb+") as fh:
        assert start_writeback(fh.fileno(), 0, 10_000) is (os.uname().sysname == "Linux")
    read_end, write_end = os.pipe()
    try:
        assert start_writeback(write_end, 0, 10) is False
    finally:
        os.close(read_end)
        os.close(write_end)


def test_reading_without_hashing_the_archive_leaves_its_digest_to_the_caller(tmp_path, small_frames):
    """A caller that hashes the archive itself: the reader then reads the same members, hashing none."""
    path = tmp_path / "a.tar.zst"
    write_file(path, MEMBERS)
    for frames in ("scan", None):  # parallel frames, and the sequential pass
        with open(path, "rb", buffering=0) as source, ArchiveReader(source, frames=frames, hash_archive=False) as reader:
            names = [m.name for m in reader]
            assert names == [name for name, _ in MEMBERS] and reader.archive_sha256 == ""


def test_importing_the_archive_layer_starts_no_process():
    """ctypes.util.find_library runs `ldconfig -p`: a library import must not start a process (the fuzz watch
    records every one a check starts, and an import can happen inside a check)."""
    code = ("import sys; started = []\n"
            "sys.addaudithook(lambda event, args: started.append(event) if event in "
            "('subprocess.Popen', 'os.posix_spawn', 'os.fork', 'os.exec') else None)\n"
            "import itera_verify.archive, itera_verify.archive.writeback as w\n"
            "print(started, w._SYNC_FILE_RANGE is not None)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out[0] == "[]", out
    assert out[1] == str(sys.platform.startswith("linux"))  # and sync_file_range is still found on Linux
