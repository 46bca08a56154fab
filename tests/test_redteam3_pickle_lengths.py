"""Issue 23, third red team, bypass A: arguments longer than the walk keeps, and padding after a break.

CPython reads a text line of any length and a counted argument of any declared length the file holds, then
runs what follows. The walk streams past such arguments (paid from the package's scan budget) instead of
stopping there and calling the file "not a pickle". No test here unpickles a payload: each form is shown to be
a real pickle by an Unpickler whose find_class records the name and raises (test_pickle_red_team._Recorder);
the payloads would only create a marker file, and every test asserts it never appears.
"""
from __future__ import annotations

import io
import os
import struct
import time
from pathlib import Path

import pytest

from itera_verify.package.pickles import opcodes, scan_file
from itera_verify.package.pickles.budget import Budget
from tests.helpers import static_findings
from tests.test_pickle_red_team import requested_by_cpython

OPEN = "builtins.open"


def _open_marker(marker: Path) -> bytes:
    """builtins.open(marker, 'w') by STACK_GLOBAL, without PROTO: it would only create the marker file."""
    return (b"\x8c\x08builtins\x8c\x04open\x93(V" + str(marker).encode() + b"\nVw\ntR.")


def long_line(marker: Path, length: int = 66 << 20) -> bytes:
    """The red team's form: UNICODE of `length` bytes (past the walk's old 64 MiB limit), POP, the payload."""
    return b"V" + b"A" * length + b"\n0" + _open_marker(marker)


def long_binary(marker: Path, length: int) -> bytes:
    """BINBYTES8 of `length` bytes, POP, the payload (the counted form of the same gap)."""
    return b"\x8e" + struct.pack("<Q", length) + b"\0" * length + b"0" + _open_marker(marker)


def test_long_line_is_a_real_pickle(tmp_path):
    data = long_line(tmp_path / "marker")
    assert requested_by_cpython(data)[:1] == [OPEN]
    assert requested_by_cpython(long_binary(tmp_path / "marker", 3 << 20))[:1] == [OPEN]
    assert not (tmp_path / "marker").exists()


@pytest.mark.parametrize("rel", ["analysis/embeddings.npy", "checkpoints/lora-r16/extra_state.pt"])
def test_long_line_is_IV506_and_never_runs(rel, package_dir, tmp_path):
    """The red team's own files (66 MiB line, real MAX_LINE path), in the example package: IV506 naming the
    payload's import, within a few seconds."""
    marker = tmp_path / "marker"
    (package_dir / rel).parent.mkdir(parents=True, exist_ok=True)
    (package_dir / rel).write_bytes(long_line(marker))
    started = time.monotonic()
    findings = [f for f in static_findings(package_dir) if f.code == "IV506" and f.path == rel]
    assert not marker.exists(), "the payload ran during the static checks"
    assert findings and OPEN in findings[0].message, findings
    assert time.monotonic() - started < 30


def test_long_binary_argument_is_streamed_and_the_payload_found(tmp_path):
    """A counted argument longer than the walk keeps (MAX_ARGUMENT, the real constant) is skipped by reading,
    never buffered, and its bytes are paid from the budget."""
    marker = tmp_path / "marker"
    path = tmp_path / "big.bin"
    path.write_bytes(long_binary(marker, opcodes.MAX_ARGUMENT + 4096))
    budget = Budget(1 << 40)
    result = scan_file(path, budget)
    assert result.is_pickle and OPEN in result.unsafe, result
    assert budget.limit - budget.left >= opcodes.MAX_ARGUMENT
    assert not marker.exists()


def test_argument_past_a_gibibyte_is_streamed(tmp_path):
    """BINBYTES8 of 1 GiB + 1 (the old 1 GiB limit, a sparse file): read through, the payload after it found;
    a budget smaller than the argument makes it IV506 "cannot be scanned", never "not a pickle"."""
    marker = tmp_path / "marker"
    length = (1 << 30) + 1
    path = tmp_path / "huge.pkl"
    with open(path, "wb") as fh:
        fh.write(b"\x8e" + struct.pack("<Q", length))
        fh.seek(length, os.SEEK_CUR)  # a hole: no disk, zeros when read
        fh.write(b"0" + _open_marker(marker))
    result = scan_file(path, Budget(1 << 40))
    assert result.is_pickle and OPEN in result.unsafe, result
    small = scan_file(path, Budget(64 << 20))
    assert small.is_pickle and small.error and "budget" in small.error and not small.loadable
    assert not marker.exists()


def test_search_after_a_break_is_not_defeated_by_padding(tmp_path):
    """A first stream that breaks at once (no PROTO, nothing imported), then valid padding longer than the old
    windows (1 MiB searched, 256 KiB per stream: a 2 MiB BINBYTES and 20,000 NONE+POP), then an import: the
    search walks the padding and finds it."""
    marker = tmp_path / "marker"
    padding = b"B" + struct.pack("<I", 2 << 20) + b"\0" * (2 << 20) + b"0" + b"N0" * 20_000
    data = b"N\xff" + b"." + padding + b"cposix\nsystem\n(S'touch " + str(marker).encode() + b"'\ntR."
    path = tmp_path / "notes.txt"
    path.write_bytes(data)
    result = scan_file(path, Budget(1 << 40))
    assert result.is_pickle and "posix.system" in result.unsafe and not result.loadable, result
    assert requested_by_cpython(data[3:])[:1] == ["posix.system"]  # what follows the break is a real pickle
    assert not marker.exists()


def test_long_line_budget_spent_is_IV506_never_not_a_pickle(tmp_path):
    path = tmp_path / "embeddings.npy"
    path.write_bytes(long_line(tmp_path / "marker", 8 << 20))
    result = scan_file(path, Budget(2 << 20))
    assert result.is_pickle and result.error and "budget" in result.error and not result.loadable


def test_walk_never_buffers_a_long_argument(tmp_path):
    """Reading a 66 MiB line costs far less memory than the line (no whole-argument buffer)."""
    import tracemalloc

    data = long_line(tmp_path / "marker")
    found: set[str] = set()
    tracemalloc.start()
    try:
        opcodes.scan_stream(opcodes.Reader(io.BytesIO(data), len(data), Budget(1 << 40)), found)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert OPEN in found and peak < 16 << 20, peak
