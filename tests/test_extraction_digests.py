"""The audit's extraction hashes every member while writing it (archive/extract.py): a large piece is hashed on a
helper thread beside its write. The digests and the files written must be exactly the member's bytes whichever
way the archive is read (one frame: the sequential reader; many: the frame-parallel one), and a write that fails
mid-member must leave the next member's digest right."""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

from itera_verify.archive import ArchiveWriter
from itera_verify.archive import extract as extract_module
from itera_verify.archive.extract import HASH_BESIDE_MIN, safe_extract
from tests.redteam4_forms import Member, write_archive

ROOT = Path(__file__).resolve().parents[1]
# Sizes around the hand-off: below it, at it, several 2 MiB pieces with a ragged end.
SIZES = {"small.bin": 1000, "edge.bin": HASH_BESIDE_MIN, "large.bin": 9 * (1 << 20) + 12_345, "tail.bin": 300_000}


def contents() -> dict[str, bytes]:
    return {name: os.urandom(size) for name, size in SIZES.items()}


def extract(archive: Path, root: Path):
    root.mkdir()
    with open(archive, "rb") as source:
        return safe_extract(source, str(root), max_expanded=1 << 30)


def assert_extracted(result, root: Path, files: dict[str, bytes]) -> None:
    assert result.error is None and not result.refused
    assert result.files == {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}
    for name, data in files.items():
        assert (root / "top" / name).read_bytes() == data, name


def test_one_frame_archive_members_are_hashed_and_written_whole(tmp_path):
    files = contents()
    archive = write_archive(tmp_path / "one.tar.zst", "top", [Member("", "directory")] +
                            [Member(name, "file", data) for name, data in files.items()], sums=False)
    assert_extracted(extract(archive, tmp_path / "x"), tmp_path / "x", files)


def write_framed(path: Path, files: dict[str, bytes]) -> int:
    """The seal's own writer: 8 MiB frames, read back by the frame-parallel reader. Returns the frame count."""
    with open(path, "wb") as out:
        writer = ArchiveWriter(out, threads=2)
        writer.add_directory("top")
        for name, data in files.items():
            writer.add_bytes(f"top/{name}", data)
        writer.close()
    return len(writer.frames)


def test_many_frame_archive_members_are_hashed_and_written_whole(tmp_path, monkeypatch):
    files = contents()
    assert write_framed(tmp_path / "many.tar.zst", files) > 1
    beside = []  # the pieces hashed on the helper thread: the large members' (at least 256 KiB each)
    real = extract_module._HashBeside._beside
    monkeypatch.setattr(extract_module._HashBeside, "_beside",
                        lambda self, digest, piece, fd: beside.append(len(piece)) or real(self, digest, piece, fd))
    assert_extracted(extract(tmp_path / "many.tar.zst", tmp_path / "x"), tmp_path / "x", files)
    assert beside and min(beside) >= HASH_BESIDE_MIN and sum(beside) >= SIZES["large.bin"] + SIZES["tail.bin"]


CHILD = """
import hashlib, json, resource, signal, sys, time, types
from itera_verify.archive import extract
from itera_verify.archive.extract import HASH_BESIDE_MIN, safe_extract


class SlowDigest:  # a helper that hashes slower than the write: a digest read before its piece is in shows
    def __init__(self, *data):
        self.real = hashlib.sha256(*data)

    def update(self, data):
        if len(data) >= HASH_BESIDE_MIN:
            time.sleep(0.05)
        self.real.update(data)

    def hexdigest(self):
        return self.real.hexdigest()


extract.hashlib = types.SimpleNamespace(sha256=SlowDigest)
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead of killing us
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
with open(sys.argv[1], "rb") as source:
    result = safe_extract(source, sys.argv[2], max_expanded=1 << 30)
print(json.dumps({"files": result.files, "refused": result.refused, "error": str(result.error or "")}))
"""


def test_a_write_failing_mid_member_refuses_it_and_the_next_member_is_still_hashed_right(tmp_path):
    """Files of at most 1 MiB may be written (RLIMIT_FSIZE): large.bin fails on its first piece past it, after
    pieces hashed beside their writes; tail.bin, after it, must get its own digest, not a stale one (the helper
    hashes slower than the writes here, so a digest read before its last piece is in would differ)."""
    files = contents()
    write_framed(tmp_path / "many.tar.zst", files)
    (tmp_path / "x").mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "validator"), str(ROOT)])}
    done = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / "many.tar.zst"), str(tmp_path / "x")],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    import json

    result = json.loads(done.stdout)
    assert not result["error"]
    assert [(name, "cannot be extracted safely" in why and "too large" in why.lower())
            for name, why in result["refused"]] == [("top/large.bin", True)]
    assert result["files"] == {name: hashlib.sha256(data).hexdigest()
                               for name, data in files.items() if name != "large.bin"}
    assert (tmp_path / "x" / "top" / "tail.bin").read_bytes() == files["tail.bin"]


def test_where_no_thread_can_be_started_the_extracting_thread_hashes_alone(tmp_path, monkeypatch):
    """A process at its thread limit ("can't start new thread"): the pieces are hashed where they are written,
    one after the other, and the extraction is the same."""
    import threading
    import types

    class NoThread(threading.Thread):
        def start(self):
            raise RuntimeError("can't start new thread")

    monkeypatch.setattr(extract_module, "threading", types.SimpleNamespace(Thread=NoThread))
    files = contents()
    write_framed(tmp_path / "many.tar.zst", files)
    assert_extracted(extract(tmp_path / "many.tar.zst", tmp_path / "x"), tmp_path / "x", files)
