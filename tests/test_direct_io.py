"""Writing past the page cache (archive/direct.py) and reading frames back in parallel from an O_DIRECT
descriptor (archive/parallel.py): exact bytes whatever the sizes, the plain fallback when the file system
refuses O_DIRECT, errors that must not be swallowed, a digest of every byte of the file, bounded memory, and a
seal whose output `tar` and `sha256sum` accept."""
from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

from itera_verify.archive import ArchiveError, ArchiveReader, Corrupt, Truncated
from itera_verify.archive import direct, parallel
from itera_verify.archive.direct import ALIGN, DirectWriter, open_direct
from itera_verify.archive.follow import FollowedFrames, Stopped
from itera_verify.archive.output import WrittenBytes
from itera_verify.archive.parallel import FrameParallelExpanded
from itera_verify.archive.publish import ReadBackMismatch, read_back
from tests.test_archive_format import MEMBERS, read_file, sha, small_frames, write_file  # noqa: F401 (fixture)
from tests.helpers import context


# ---- helpers ---------------------------------------------------------------------------------------------
@pytest.fixture
def direct_ok(tmp_path):
    """Skip where tmp_path's file system refuses O_DIRECT (tmpfs on old kernels, some FUSE or network file
    systems): there the tests that need it would prove nothing."""
    if not direct.O_DIRECT:
        pytest.skip("no O_DIRECT on this platform")
    probe = tmp_path / ".o_direct_probe"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | direct.O_DIRECT, 0o644)
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            pytest.skip(f"{tmp_path} refuses O_DIRECT")
        raise
    os.close(fd)
    probe.unlink()


class _PatchedOs:
    """What one module under test (direct, parallel) sees as `os`, with some calls replaced: the fakes stay
    local to that module (patching the real os module would reach every thread of the test run)."""

    def __init__(self, **fakes):
        self.__dict__.update(fakes)

    def __getattr__(self, name):
        return getattr(os, name)


def has_o_direct(fd: int) -> bool:
    return bool(fcntl.fcntl(fd, fcntl.F_GETFL) & direct.O_DIRECT)


def write_through(path: Path, pieces, *, staging: int) -> DirectWriter:
    """Write `pieces` with a DirectWriter, flush, close; returns the (closed) writer."""
    writer = DirectWriter.create(path, staging=staging)
    written = 0
    for piece in pieces:
        assert writer.write(piece) == len(piece)
        written += len(piece)
        assert writer.tell() == written
    writer.flush()
    writer.close()
    return writer


def within(seconds: float, function, *args, **kwargs):
    """Run function(*args, **kwargs) on a thread; fail the test if it has not returned in `seconds` (a hang)."""
    outcome: dict = {}

    def run():
        try:
            outcome["value"] = function(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        pytest.fail(f"{function.__name__} did not return within {seconds} s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def read_direct(path: Path, frames) -> tuple[list[tuple], str, int]:
    """Members (name, sha256) and the archive's digest and size, read through an O_DIRECT descriptor."""
    fd, is_direct = open_direct(path, os.O_RDONLY)
    assert is_direct and has_o_direct(fd)
    out = []
    with os.fdopen(fd, "rb", buffering=0) as source, ArchiveReader(source, frames=frames) as reader:
        assert isinstance(reader._expanded, FrameParallelExpanded)  # the parallel path, the one that reads aligned
        for member in reader:
            out.append((member.name, hashlib.sha256(b"".join(bytes(p) for p in reader.data(member))).hexdigest()))
        return out, reader.archive_sha256, reader.archive_bytes


def record_reads(monkeypatch) -> list[tuple[int, int]]:
    """(offset, length) of every read the parallel reader makes: with O_DIRECT each must be aligned (a file
    system may refuse an unaligned one with EINVAL even at the end of the file, ext4 just returns 0)."""
    reads = []

    def preadv(fd, buffers, offset):
        reads.append((offset, sum(len(b) for b in buffers)))
        return os.preadv(fd, buffers, offset)

    monkeypatch.setattr(parallel, "os", _PatchedOs(preadv=preadv))
    return reads


def expanded_all(fd: int, frames, **options) -> tuple[int, str, int]:
    """Drain a FrameParallelExpanded: (expanded bytes, archive sha256, archive bytes)."""
    stage = FrameParallelExpanded(fd, frames, limit=None, **options)
    try:
        total = 0
        while (view := stage.next_view()) is not None:
            total += len(view)
        return total, stage.archive_sha256, stage.archive_bytes
    finally:
        stage.close()


# ---- DirectWriter: exact bytes -------------------------------------------------------------------------
SIZES = [0, 1, ALIGN - 1, ALIGN, ALIGN + 1, 2 * ALIGN - 1, 2 * ALIGN, 2 * ALIGN + 1, 5 * ALIGN + 7,
         (3 << 20) + 123]


@pytest.mark.parametrize("staging", [2 * ALIGN, 64 << 10])
@pytest.mark.parametrize("size", SIZES)
def test_one_write_of_any_size_lands_exactly(tmp_path, size, staging):
    data = os.urandom(size)  # random: a misplaced or repeated block shows
    path = tmp_path / "out.bin"
    write_through(path, [data], staging=staging)
    assert path.stat().st_size == size  # the padding for the device was truncated away
    assert path.read_bytes() == data


@pytest.mark.parametrize("staging", [2 * ALIGN, 64 << 10])
def test_many_small_writes_of_odd_sizes_land_in_order(tmp_path, staging):
    odd = [1, 3, 511, 4095, 4097, 7, 12_345, 1, 65_537, 999]
    pieces = [os.urandom(odd[i % len(odd)]) for i in range(300)]  # about 3 MiB, crossing the staging often
    path = tmp_path / "out.bin"
    write_through(path, pieces, staging=staging)
    assert path.read_bytes() == b"".join(pieces)


def test_views_of_other_item_sizes_are_written_as_their_bytes(tmp_path):
    import array

    words = array.array("I", range(10_000))  # 4-byte items: write() counts and copies bytes, not items
    path = tmp_path / "out.bin"
    writer = DirectWriter.create(path, staging=2 * ALIGN)
    assert writer.write(memoryview(words)) == len(words) * words.itemsize
    writer.flush()
    writer.close()
    assert path.read_bytes() == words.tobytes()


def test_writing_goes_on_after_a_flush_and_the_file_is_exact_after_each(tmp_path):
    path = tmp_path / "out.bin"
    writer = DirectWriter.create(path, staging=4 * ALIGN)
    parts, expected = [os.urandom(n) for n in (100, 5000, 3 * ALIGN + 1, 10 * ALIGN + 17, 1)], b""
    for part in parts:
        writer.write(part)
        expected += part
        writer.flush()
        assert writer.tell() == len(expected)
        assert path.stat().st_size == len(expected) and path.read_bytes() == expected
    writer.flush()  # nothing new: the file stays as it is
    writer.close()
    writer.close()  # twice is harmless
    assert path.read_bytes() == expected


def test_close_without_flush_drops_only_the_staged_tail(tmp_path):
    """close() ends a failed write too (the caller removes the file): it writes nothing more."""
    path = tmp_path / "out.bin"
    data = os.urandom(5 * ALIGN + 5)
    writer = DirectWriter.create(path, staging=2 * ALIGN)
    writer.write(data)
    writer.close()
    assert path.read_bytes() == data[: 4 * ALIGN]  # the two full staging buffers, not the tail


def test_create_refuses_an_existing_file(tmp_path):
    path = tmp_path / "out.bin"
    path.write_bytes(b"keep")
    with pytest.raises(FileExistsError):
        DirectWriter.create(path)
    assert path.read_bytes() == b"keep"


def test_a_descriptor_at_an_unaligned_offset_is_written_plainly(tmp_path, direct_ok):
    """O_DIRECT needs aligned offsets: a writer starting after 100 bytes drops it at once, before any write
    (the EINVAL fallback would hide the mistake in the content, so the flag itself is checked)."""
    path = tmp_path / "out.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    prefix = b"p" * 100
    os.write(fd, prefix)
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | direct.O_DIRECT)
    writer = DirectWriter(fd, True, staging=2 * ALIGN)
    assert writer.direct is False and not has_o_direct(fd)
    data = os.urandom(3 * ALIGN + 3)
    writer.write(data)
    assert writer.tell() == 100 + len(data)
    writer.flush()
    writer.close()
    assert path.read_bytes() == prefix + data


# ---- O_DIRECT, and the plain fallback ----------------------------------------------------------------------
def test_the_writer_goes_past_the_page_cache_where_the_file_system_allows(tmp_path, direct_ok):
    path = tmp_path / "out.bin"
    writer = DirectWriter.create(path, staging=64 << 10)
    assert writer.direct is True and has_o_direct(writer.fileno())
    data = os.urandom((1 << 20) + 333)
    writer.write(data)
    writer.flush()
    assert writer.direct is True  # aligned writes: nothing was refused on the way
    writer.close()
    assert path.read_bytes() == data


def _refusing_direct(refused: list):
    """A pwrite that refuses (EINVAL) while the descriptor has O_DIRECT, as some file systems do, and writes
    plainly otherwise."""
    def pwrite(fd, data, offset):
        if has_o_direct(fd):
            refused.append(len(data))
            raise OSError(errno.EINVAL, "Invalid argument")
        return os.pwrite(fd, data, offset)
    return pwrite


@pytest.mark.parametrize("size", [2 * ALIGN + 11, (1 << 20) + 1, 8 * ALIGN])
def test_a_write_refused_with_EINVAL_goes_on_plainly_with_the_same_bytes(tmp_path, direct_ok, monkeypatch, size):
    refused = []
    monkeypatch.setattr(direct, "os", _PatchedOs(pwrite=_refusing_direct(refused)))
    path = tmp_path / "out.bin"
    data = os.urandom(size)
    writer = DirectWriter.create(path, staging=2 * ALIGN)
    assert writer.direct is True
    writer.write(data)  # at least one full staging buffer: the refusal comes at a write, not at flush()
    assert writer.direct is False and not has_o_direct(writer.fileno())
    writer.flush()
    writer.close()
    assert refused == [2 * ALIGN]  # refused once, then never tried directly again
    assert path.stat().st_size == size and path.read_bytes() == data


def test_a_refusal_at_the_padded_tail_leaves_no_padding(tmp_path, direct_ok, monkeypatch):
    """The first device write is flush()'s padded tail: written plainly after the refusal, the file must
    still end at the last byte given, not at the padding."""
    refused = []
    monkeypatch.setattr(direct, "os", _PatchedOs(pwrite=_refusing_direct(refused)))
    path = tmp_path / "out.bin"
    data = os.urandom(5000)
    writer = DirectWriter.create(path, staging=64 << 10)
    writer.write(data)
    assert refused == []  # staged only
    writer.flush()
    assert refused == [2 * ALIGN] and writer.direct is False
    more = os.urandom(ALIGN + 1)  # and writing goes on plainly
    writer.write(more)
    writer.flush()
    writer.close()
    assert path.stat().st_size == len(data) + len(more) and path.read_bytes() == data + more


def test_a_file_system_refusing_O_DIRECT_at_open_gets_plain_writes(tmp_path, monkeypatch):
    if not direct.O_DIRECT:
        pytest.skip("no O_DIRECT on this platform")
    tried = []

    def refusing_open(path, flags, mode=0o777):
        if flags & direct.O_DIRECT:
            tried.append(path)
            raise OSError(errno.EINVAL, "Invalid argument")
        return os.open(path, flags, mode)

    monkeypatch.setattr(direct, "os", _PatchedOs(open=refusing_open))
    fd, is_direct = open_direct(tmp_path / "probe", os.O_WRONLY | os.O_CREAT)
    assert is_direct is False and not has_o_direct(fd) and len(tried) == 1
    os.close(fd)
    path = tmp_path / "out.bin"
    data = os.urandom(3 * ALIGN + 77)
    writer = write_through(path, [data[:10], data[10:]], staging=2 * ALIGN)
    assert writer.direct is False and len(tried) == 2
    assert path.read_bytes() == data


def test_an_open_error_other_than_EINVAL_is_not_taken_for_a_refusal(tmp_path, monkeypatch):
    if not direct.O_DIRECT:
        pytest.skip("no O_DIRECT on this platform")

    def denying_open(path, flags, mode=0o777):
        if flags & direct.O_DIRECT:
            raise OSError(errno.EACCES, "Permission denied")
        return os.open(path, flags, mode)

    monkeypatch.setattr(direct, "os", _PatchedOs(open=denying_open))
    with pytest.raises(PermissionError):
        open_direct(tmp_path / "out.bin", os.O_WRONLY | os.O_CREAT)
    monkeypatch.undo()
    with pytest.raises(FileNotFoundError):  # and a real error from the real call comes through as it is
        open_direct(tmp_path / "missing" / "out.bin", os.O_WRONLY | os.O_CREAT)


def _full_disk(calls: list):
    def pwrite(fd, data, offset):
        calls.append(len(data))
        raise OSError(errno.ENOSPC, "No space left on device")
    return pwrite


def test_a_full_disk_at_write_is_raised_and_close_still_works(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(direct, "os", _PatchedOs(pwrite=_full_disk(calls)))
    writer = DirectWriter.create(tmp_path / "out.bin", staging=2 * ALIGN)
    fd = writer.fileno()
    with pytest.raises(OSError) as raised:
        writer.write(os.urandom(3 * ALIGN))
    assert raised.value.errno == errno.ENOSPC and calls == [2 * ALIGN]  # not retried, not turned into plain I/O
    writer.close()
    with pytest.raises(OSError) as closed:  # the descriptor was released
        os.fstat(fd)
    assert closed.value.errno == errno.EBADF


def test_a_full_disk_at_flush_is_raised_and_close_still_works(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(direct, "os", _PatchedOs(pwrite=_full_disk(calls)))
    writer = DirectWriter.create(tmp_path / "out.bin", staging=64 << 10)
    was_direct = writer.direct
    writer.write(b"x" * 5000)
    with pytest.raises(OSError) as raised:
        writer.flush()
    assert raised.value.errno == errno.ENOSPC and len(calls) == 1
    assert writer.direct is was_direct  # ENOSPC is not a refusal of O_DIRECT
    writer.close()
    writer.close()


# ---- reading frames in parallel from an O_DIRECT descriptor -------------------------------------------------
def test_an_O_DIRECT_descriptor_reads_the_same_members_and_digest(tmp_path, direct_ok, small_frames, monkeypatch):
    path = tmp_path / "a.tar.zst"
    frames = write_file(path, MEMBERS)
    assert len(frames) > 10
    data = path.read_bytes()
    assert len(data) % ALIGN  # an unaligned end: the last aligned read comes back short
    reads = record_reads(monkeypatch)
    members, archive_sha256, archive_bytes = within(20, read_direct, path, frames)
    assert reads and all(offset % ALIGN == 0 and length % ALIGN == 0 for offset, length in reads), reads
    assert members == [(name, sha(payload)) for name, payload in MEMBERS]
    assert archive_sha256 == sha(data) and archive_bytes == len(data)
    assert read_file(path, frames=frames) == members + [("archive", archive_sha256)]  # the plain read agrees


def test_a_direct_read_refused_with_EINVAL_goes_on_plainly(tmp_path, direct_ok, small_frames, monkeypatch):
    """A file system may take O_DIRECT at open and refuse the reads (a logical block larger than ALIGN): the
    read-back then reads plainly instead of failing the seal."""
    path = tmp_path / "a.tar.zst"
    frames = write_file(path, MEMBERS)
    refused = []

    def preadv(fd, buffers, offset):
        if has_o_direct(fd):
            refused.append(offset)
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        return os.preadv(fd, buffers, offset)

    monkeypatch.setattr(parallel, "os", _PatchedOs(preadv=preadv))
    members, archive_sha256, archive_bytes = within(20, read_direct, path, frames)
    assert refused == [0]  # refused once, then read plainly to the end
    assert members == [(name, sha(payload)) for name, payload in MEMBERS]
    assert archive_sha256 == sha(path.read_bytes()) and archive_bytes == path.stat().st_size


def test_the_archive_digest_covers_bytes_between_and_after_the_frames(tmp_path, direct_ok, small_frames,
                                                                     monkeypatch):
    clean = tmp_path / "a.tar.zst"
    frames = write_file(clean, MEMBERS)
    data = clean.read_bytes()
    gap, tail = b"G" * 1001, b"junk after the last frame"  # odd lengths: the frames after the gap are unaligned
    cut = frames[3][1]
    shifted = frames[:4] + [(start + len(gap), end + len(gap)) for start, end in frames[4:]]
    path = tmp_path / "gaps.tar.zst"
    path.write_bytes(data[:cut] + gap + data[cut:] + tail)
    whole = path.read_bytes()
    reads = record_reads(monkeypatch)
    members, archive_sha256, archive_bytes = within(20, read_direct, path, shifted)
    assert all(offset % ALIGN == 0 and length % ALIGN == 0 for offset, length in reads)  # frames start unaligned
    assert members == [(name, sha(payload)) for name, payload in MEMBERS]  # the gap is not decompressed
    assert archive_sha256 == sha(whole) and archive_bytes == len(whole)
    with open(path, "rb", buffering=0) as plain:  # a plain descriptor, the stage alone
        total, digest, size = within(20, expanded_all, plain.fileno(), shifted)
    assert (digest, size) == (sha(whole), len(whole)) and total > sum(len(p) for _, p in MEMBERS)


def test_read_back_refuses_a_file_with_bytes_after_its_last_frame(tmp_path, small_frames):
    path = tmp_path / "a.tar.zst"
    frames = write_file(path, MEMBERS)
    expected = [(name, "file", len(payload), sha(payload)) for name, payload in MEMBERS]
    assert read_back(path, expected, frames) == (sha(path.read_bytes()), path.stat().st_size)
    with open(path, "ab") as out:
        out.write(b"\0" * 100)  # zeros: a reader that stopped at the end of the tar would not notice them
    with pytest.raises(ReadBackMismatch, match="bytes on disk"):
        within(20, read_back, path, expected, frames)


@pytest.mark.parametrize("reader", ["plain", "direct"])
def test_a_file_cut_inside_a_frame_is_an_error_not_a_hang(tmp_path, small_frames, reader, request):
    if reader == "direct":
        request.getfixturevalue("direct_ok")
    path = tmp_path / "a.tar.zst"
    frames = write_file(path, MEMBERS)
    start, end = frames[5]
    os.truncate(path, (start + end) // 2)

    def read():
        if reader == "direct":
            return read_direct(path, frames)
        return read_file(path, frames=frames)

    with pytest.raises((Corrupt, Truncated)) as raised:
        within(10, read)
    assert isinstance(raised.value, ArchiveError)


class _AbandonedAsAWorkerStarts(FollowedFrames):
    """A seal's writing abandoned at the worst moment for its read-back: after the consumer has seen that frame 0
    is in the file, before a frame's worker asks for it (a worker leaves without a word then, as it must)."""

    def __init__(self, frames, written, *stops, consumer_saw: threading.Event):
        super().__init__(frames, written, *stops)
        self.consumer_saw = consumer_saw

    def also_stopped_by(self, stop):
        return _AbandonedAsAWorkerStarts(self.frames, self.written, *self.stops, stop,
                                         consumer_saw=self.consumer_saw)

    def frame(self, index):
        name = threading.current_thread().name
        if name.startswith("archive-frames-"):
            assert self.consumer_saw.wait(10)
            self.stops[0].set()  # the seal's cancel(), exactly now
        found = super().frame(index)
        if name != "archive-read":
            self.consumer_saw.set()
        return found


def test_a_read_back_whose_writing_is_abandoned_stops_instead_of_waiting_for_a_worker(tmp_path, small_frames):
    """The hang of a cancelled seal (its read-back waited forever for frame 0 from a worker that had left; the
    cancel joined the read-back): every wait of the consumer ends when the writing is abandoned."""
    path = tmp_path / "a.tar.zst"
    frames = write_file(path, MEMBERS)
    written = WrittenBytes()
    written.finish(path.stat().st_size)
    follow = _AbandonedAsAWorkerStarts(frames, written, threading.Event(), consumer_saw=threading.Event())
    with open(path, "rb", buffering=0) as source:
        stage = FrameParallelExpanded(source.fileno(), frames, limit=None, follow=follow)
        try:
            with pytest.raises(Stopped):
                within(10, stage.next_view)
        finally:
            within(10, stage.close)


def test_a_frame_cut_short_is_Corrupt_at_the_frame_stage(tmp_path, small_frames):
    """Below the tar layer: the stage itself reports a frame that ends before its recorded end (zstd alone
    just stops at the end of its input), whatever the tar reader above would make of the missing bytes."""
    path = tmp_path / "a.tar.zst"
    frames = write_file(path, MEMBERS)
    start, end = frames[5]
    os.truncate(path, (start + end) // 2)
    with open(path, "rb", buffering=0) as source, pytest.raises(Corrupt):
        within(10, expanded_all, source.fileno(), frames)


def test_read_back_reads_a_multi_frame_archive_past_the_page_cache(tmp_path, direct_ok, small_frames, monkeypatch):
    """What is verified is what the device holds: the parallel read-back gets an O_DIRECT descriptor; a single
    frame (the sequential reader, unaligned reads) a plain one."""
    from itera_verify.archive import publish

    seen = []
    real_reader = publish.ArchiveReader

    def recording_reader(source, **options):
        seen.append(has_o_direct(source.fileno()))
        return real_reader(source, **options)

    monkeypatch.setattr(publish, "ArchiveReader", recording_reader)
    path = tmp_path / "a.tar.zst"
    frames = write_file(path, MEMBERS)
    expected = [(name, "file", len(payload), sha(payload)) for name, payload in MEMBERS]
    assert within(20, read_back, path, expected, frames) == (sha(path.read_bytes()), path.stat().st_size)
    assert within(20, read_back, path, expected, None)[0] == sha(path.read_bytes())
    assert seen == [True, False]


def test_segments_are_reused_however_large_the_archive(tmp_path, small_frames, monkeypatch):
    """The file is read in SEGMENT-sized aligned buffers from a fixed pool (2 * workers + 2): reading an
    archive of hundreds of frames allocates no more buffers than a small one."""
    created, reads = [], []
    real_buffer, real_read = parallel.aligned_buffer, parallel._read_full

    def counting_buffer(size):
        created.append(size)
        return real_buffer(size)

    def counting_read(*args):
        reads.append(args[2])
        return real_read(*args)

    monkeypatch.setattr(parallel, "aligned_buffer", counting_buffer)
    monkeypatch.setattr(parallel, "_read_full", counting_read)
    for size in (1 << 20, 32 << 20):
        path = tmp_path / f"{size}.tar.zst"
        payload = os.urandom(size)  # incompressible: the archive is as large as the payload
        frames = write_file(path, [("top/weights.bin", payload)])
        for workers in (2, 3):
            created.clear()
            reads.clear()
            with open(path, "rb", buffering=0) as source:
                total, digest, archive_bytes = within(30, expanded_all, source.fileno(), frames, workers=workers)
            assert digest == sha(path.read_bytes()) and archive_bytes == path.stat().st_size
            assert total > size
            assert len(created) == 2 * workers + 2 and set(created) == {parallel.SEGMENT}
            assert len(reads) >= len(frames) > len(created)  # many more reads than buffers: they were reused
    assert archive_bytes > 32 << 20


# ---- the seal, end to end -------------------------------------------------------------------------------
def test_a_seal_written_directly_extracts_and_its_checksums_pass(tmp_path, small_frames, monkeypatch):
    if subprocess.run(["tar", "--zstd", "--version"], capture_output=True).returncode != 0:
        pytest.skip("this tar has no --zstd")
    if shutil.which("sha256sum") is None:
        pytest.skip("no sha256sum")
    from itera_verify import seal as seal_module
    from itera_verify.seal import seal_package

    opened = []
    real_open_output = seal_module._open_output

    def recording_open_output(path):
        writer = real_open_output(path)
        opened.append(writer)
        return writer

    monkeypatch.setattr(seal_module, "_open_output", recording_open_output)
    package_dir = tmp_path / "package"
    (package_dir / "weights").mkdir(parents=True)
    (package_dir / "manifest.json").write_bytes(b'{"name": "x"}\n')
    (package_dir / "notes.txt").write_bytes(b"some notes\n" * 333)
    (package_dir / "weights" / "model.bin").write_bytes(os.urandom(3 << 20) + bytes(1 << 20) + b"end")
    (package_dir / "weights" / "empty").write_bytes(b"")
    out = tmp_path / "out"
    out.mkdir()
    destination = out / "x.tar.zst"
    campaign = "direct-io-campaign"
    result = seal_package(context(package_dir), campaign,
                          {"SEAL/verification.json": b'{"verdict": "pass"}\n'},
                          destination, threads=2)
    assert result["frames"] > 10  # several frames: the read-back took the parallel, aligned path
    assert len(opened) == 1 and isinstance(opened[0], DirectWriter)
    probe_fd, probe_direct = open_direct(tmp_path / "probe", os.O_WRONLY | os.O_CREAT)
    os.close(probe_fd)
    assert opened[0].direct is probe_direct  # direct wherever the file system takes it, all the way through
    data = destination.read_bytes()
    assert result["bytes"] == len(data) and result["sha256"] == sha(data)
    assert sorted(p.name for p in out.iterdir()) == ["x.tar.zst", "x.tar.zst.sha256"]  # no partial file left

    extracted = tmp_path / "extracted"
    extracted.mkdir()
    subprocess.run(["tar", "--zstd", "-xf", str(destination), "-C", str(extracted)], check=True,
                   capture_output=True)
    top = extracted / campaign
    assert (top / "weights" / "model.bin").read_bytes() == (package_dir / "weights" / "model.bin").read_bytes()
    sums = subprocess.run(["sha256sum", "-c", "SEAL/SHA256SUMS"], cwd=top, capture_output=True, text=True)
    assert sums.returncode == 0, sums.stdout + sums.stderr
    assert "weights/model.bin: OK" in sums.stdout and "SEAL/verification.json: OK" in sums.stdout
    own = subprocess.run(["sha256sum", "-c", "x.tar.zst.sha256"], cwd=out, capture_output=True, text=True)
    assert own.returncode == 0 and own.stdout.strip() == "x.tar.zst: OK", own.stdout + own.stderr
