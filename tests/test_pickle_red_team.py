"""Issue 23, second red team: readers that skipped what a consumer runs, and scans without a bound.

Each form is planted in a copy of the example package and must be IV506 with its payload never run. None of
these tests unpickles a payload: each form is shown to be a real pickle by `pickletools.genops` or by an
Unpickler whose find_class records the name and raises before anything is built or called.
"""
from __future__ import annotations

import io
import json
import pickle
import pickletools
import shlex
import struct
import tarfile
from pathlib import Path

import pytest

from tests.helpers import static_findings, context


def _touch(marker: Path) -> bytes:
    return f"touch {shlex.quote(str(marker))}".encode()


def _payload(marker: Path) -> bytes:
    """posix.system('touch <marker>') in protocol 0, without the leading PROTO."""
    return b"cposix\nsystem\n(S'" + _touch(marker) + b"'\ntR."


class _Recorder(pickle.Unpickler):
    """Records the first global the C unpickler would import, and raises there: nothing is ever built."""

    def __init__(self, data: bytes):
        super().__init__(io.BytesIO(data), encoding="latin1")
        self.requested: list[str] = []

    def find_class(self, module, name):
        self.requested.append(f"{module}.{name}")
        raise pickle.UnpicklingError("recorded, never imported")

    def persistent_load(self, pid):
        return pid


def requested_by_cpython(data: bytes) -> list[str]:
    recorder = _Recorder(data)
    try:
        recorder.load()
    except Exception:  # noqa: BLE001 - the recorder raises at the first import; any other error ends it too
        pass
    return recorder.requested


# ---- the forms ---------------------------------------------------------------------------------------------

SAFETENSORS_HEADER = 0x00470480  # its 8-byte little-endian length reads 80 04 47 00: PROTO 4, BINFLOAT


def safetensors_polyglot(marker: Path) -> bytes:
    """A valid safetensors file that is also a pickle: PROTO 4 and BINFLOAT eat the length and `{"x`; the tensor's
    name is a chain of SHORT_BINBYTES + POP that skips the rest of the header; the tensor's bytes are the payload."""
    payload = _payload(marker)
    tail = json.dumps({"dtype": "U8", "shape": [len(payload)], "data_offsets": [0, len(payload)]},
                      separators=(",", ":")).encode()
    tail = b'":' + tail + b"}"
    left = SAFETENSORS_HEADER - 3 - 2 - len(tail)  # `{"x` before the chain; C + length before the tail
    units = []
    while left:
        n = min(126, left - 3) if left - 3 <= 126 or left - 129 >= 35 else 64
        if n in (34, 92):  # `"` and `\` cannot stand raw in a JSON string
            n -= 1
        units.append(b"C" + bytes([n]) + b"a" * n + b"0")
        left -= n + 3
    assert all(32 <= u[1] <= 126 for u in units)
    header = b'{"x' + b"".join(units) + b"C" + bytes([len(tail)]) + tail
    assert len(header) == SAFETENSORS_HEADER and 32 <= len(tail) <= 126
    return struct.pack("<Q", SAFETENSORS_HEADER) + header + payload


def int_base0(marker: Path) -> bytes:
    """INT `0x1`: C reads it with base 0; pickletools (base 10) gave up at byte 0 and never saw posix.system."""
    return b"I0x1\n0" + _payload(marker)


def int_forms(marker: Path) -> bytes:
    """More of C's INT/LONG forms: octal, a NUL ending the number, underscores, signs, spaces, an L suffix."""
    return b"I010\n0I7\x00junk\n0I -0x_F \n0L+0b1_0L\n0I00\n0" + _payload(marker)


def legacy_tar(marker: Path) -> bytes:
    """torch's legacy tar format, tried first by torch.load: its `storages` member is a pickle."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in (("sys_info", b"\x80\x02}q\x00."), ("storages", b"\x80\x02" + _payload(marker)),
                           ("tensors", b"\x80\x02K\x00."), ("pickle", b"\x80\x02}q\x00.")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def build_on_class(marker: Path) -> bytes:
    """BUILD with slot state on the allowlisted class itself: re-points every later pathlib path of the loader."""
    return (b"\x80\x02cpathlib\nPurePosixPath\nN}X\x05\x00\x00\x00_evilX" + struct.pack("<I", len(_touch(marker)))
            + _touch(marker) + b"s\x86b.")


# name -> (file in the package, builder, what IV506 must name)
FORMS = {
    "safetensors_polyglot_pkl": ("extra/weights.pkl", safetensors_polyglot, "posix.system"),
    "safetensors_polyglot_npy": ("extra/array.npy", safetensors_polyglot, "posix.system"),
    "safetensors_polyglot_pt": ("extra/model.pt", safetensors_polyglot, "posix.system"),
    "safetensors_polyglot_safetensors": ("extra/model.safetensors", safetensors_polyglot, "posix.system"),
    "int_base0_pkl": ("extra/int.pkl", int_base0, "posix.system"),
    "int_base0_txt": ("extra/int.txt", int_base0, "posix.system"),
    "int_c_forms": ("extra/forms.pkl", int_forms, "posix.system"),
    "legacy_torch_tar": ("extra/legacy.pt", legacy_tar, "posix.system"),
    "build_on_allowlisted_class": ("extra/paths.pkl", build_on_class, "<BUILD setting state on pathlib.PurePosixPath>"),
}


@pytest.mark.parametrize("name", sorted(FORMS))
def test_form_is_a_real_pickle(name, tmp_path):
    """Without running it: the C unpickler's first import is the payload's (find_class records and raises)."""
    _, build, expected = FORMS[name]
    data = build(tmp_path / "marker")
    if name == "legacy_torch_tar":
        data = tarfile.open(fileobj=io.BytesIO(data)).extractfile("storages").read()
    wanted = "pathlib.PurePosixPath" if name == "build_on_allowlisted_class" else expected
    assert requested_by_cpython(data)[:1] == [wanted]
    assert not (tmp_path / "marker").exists()


def test_polyglot_is_valid_safetensors(tmp_path):
    from safetensors.numpy import load_file

    path = tmp_path / "model.safetensors"
    path.write_bytes(safetensors_polyglot(tmp_path / "marker"))
    (tensor,) = load_file(path).values()
    assert tensor.tobytes() == _payload(tmp_path / "marker")
    ops = [op.name for op, _, _ in pickletools.genops(io.BytesIO(path.read_bytes()))]
    assert ops[:3] == ["PROTO", "BINFLOAT", "SHORT_BINBYTES"] and "GLOBAL" in ops and ops[-1] == "STOP"


@pytest.mark.parametrize("name", sorted(FORMS))
def test_form_is_IV506_and_never_runs(name, package_dir, tmp_path):
    rel, build, expected = FORMS[name]
    marker = tmp_path / "marker"
    (package_dir / rel).parent.mkdir(parents=True, exist_ok=True)
    (package_dir / rel).write_bytes(build(marker))
    findings = [f for f in static_findings(package_dir) if f.code == "IV506" and f.path == rel]
    assert not marker.exists(), "the payload ran during the static checks"
    assert findings and expected in findings[0].message, findings


def test_dcp_metadata_unpickler_refuses_build_on_a_class(tmp_path):
    import pathlib

    from itera_verify.reload.records import read_metadata

    data = build_on_class(tmp_path / "marker")
    with pytest.raises(pickle.UnpicklingError, match="setting state on 'PurePosixPath'"):
        read_metadata(data)
    assert not hasattr(pathlib.PurePosixPath, "_evil")
    assert read_metadata(pickle.dumps(pathlib.PurePosixPath("/a/b"), protocol=2)) == pathlib.PurePosixPath("/a/b")


# ---- bounded work ------------------------------------------------------------------------------------------

def opcode_bomb(opcodes: int) -> bytes:
    """A few hundred zstd bytes that decompress into `opcodes` NONE+POP pairs, then the payload."""
    import zstandard

    return zstandard.ZstdCompressor(level=19).compress(b"\x80\x04" + b"N0" * (opcodes // 2) + b"N.")


@pytest.mark.slow
def test_scan_budget_stops_an_opcode_bomb_as_IV506(package_dir):
    """One budget for the whole package: two bombs that together pass it are both refused, never walked whole."""
    from itera_verify.package.pickles import scan_package
    from itera_verify.package.pickles.budget import OPCODE_UNITS

    bomb = opcode_bomb(2_000_000)
    assert len(bomb) < 1000
    for rel in ("extra/a.pkl.zst", "extra/b.pkl.zst"):
        (package_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        (package_dir / rel).write_bytes(bomb)
    package = context(package_dir, scan_budget=3_000_000 * OPCODE_UNITS)  # the pair needs 4 M opcodes and more
    results = scan_package(package)
    assert [r.error for r in (results["extra/a.pkl.zst"], results["extra/b.pkl.zst"])].count(None) <= 1
    assert "budget" in results["extra/b.pkl.zst"].error and not results["extra/b.pkl.zst"].loadable


def test_default_budget_holds_the_example_package(package_dir):
    """The clean package's scan stays far inside its default budget (no IV506 from the budget)."""
    assert not [f for f in static_findings(package_dir) if f.code == "IV506"]
