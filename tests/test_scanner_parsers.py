"""The scanner reads what the loaders read (issue 14): torch's own zip reader, numpy's header parser, pickles
under any name, behind junk or compressed. Each form is a live payload (a throwaway child that loads it the way
a reviewer's tool would creates its marker file); the scanner refuses each, and no marker appears here."""
from __future__ import annotations

import bz2
import gzip
import io
import json
import lzma
import pickle
import random
import struct
import subprocess
import sys
import time
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
import zstandard
from itera_verify.package.pickles import is_pickle_or_torch_zip, scan_file

from tests import zip_forms
from tests.helpers import run_cli, static_findings, context


def _s(text: str) -> bytes:
    return b"S" + repr(text).encode() + b"\n"


def payload(marker: Path, protocol: int = 2) -> bytes:
    """builtins.open(marker, 'w'): a pickle whose only effect is the marker file."""
    body = b"cbuiltins\nopen\n(" + _s(str(marker)) + _s("w") + b"tR."
    return (b"\x80" + bytes([protocol]) if protocol >= 2 else b"") + body


def _npy(descr_text: str, marker: Path, version=(1, 0), shape: str = "(1,)") -> bytes:
    """An .npy object array written by hand with `descr_text` spelled as the issue found it."""
    header = "{" + descr_text + ", 'fortran_order': False, 'shape': " + shape + ", }"
    header = header.encode("latin1")
    width = 2 if version == (1, 0) else 4
    pad = 64 - (8 + width + len(header) + 1) % 64
    header += b" " * pad + b"\n"
    return (b"\x93NUMPY" + bytes(version) + len(header).to_bytes(width, "little") + header
            + pickle.dumps([0], protocol=3)[:0] + payload(marker, 3))


def _npz(npy: bytes) -> bytes:
    out = io.BytesIO()
    with zipfile_writer(out) as archive:
        archive.writestr("a.npy", npy)
    return out.getvalue()


def zipfile_writer(out):
    import zipfile

    return zipfile.ZipFile(out, "w", zipfile.ZIP_STORED)


def _torch_zip_with_member(name: str, data: bytes) -> bytes:
    import zipfile

    out = io.BytesIO(zip_forms.torch_bytes())
    with zipfile.ZipFile(out, "a") as archive:
        archive.writestr(name, data)
    return out.getvalue()


# name -> (file name, builder(marker) -> bytes, how a reviewer's tool loads it, global that must be named or None)
FORMS = {
    "two_central_directories": ("extra.pt", lambda m: zip_forms.two_directories(
        zip_forms.torch_bytes(), zip_forms.with_data_pkl(zip_forms.torch_bytes(), payload(m))), "torch", None),
    "duplicate_data_pkl": ("dup.pt", lambda m: zip_forms.duplicate_name(zip_forms.torch_bytes(), payload(m)),
                           "torch", None),
    "torch_member_not_named_pkl": ("member.pt", lambda m: _torch_zip_with_member("archive/extra/hook", payload(m)),
                                   "zip-member", "builtins.open"),
    "npy_descr_list_of_fields": ("fields.npy", lambda m: _npy("'descr': [('a', '|O')]", m), "numpy", "builtins.open"),
    "npy_descr_double_quotes": ("quoted.npy", lambda m: _npy('"descr": "|O"', m), "numpy", "builtins.open"),
    "npy_descr_spaced_colon": ("spaced.npy", lambda m: _npy("'descr' : '|O'", m), "numpy", "builtins.open"),
    "npy_python2_header": ("py2.npy", lambda m: _npy("'descr': '|O'", m, shape="(1L,)"), "numpy", "builtins.open"),
    "npy_version_3": ("v3.npy", lambda m: _npy("'descr': '|O'", m, (3, 0)), "numpy", "builtins.open"),
    "npz_object_member": ("arrays.npz", lambda m: _npz(_npy("'descr' : [('a','|O')]", m)), "npz", "builtins.open"),
    "npy_as_torch_storage_name": ("storage.npz", lambda m: _npz_named("archive/data/0", _npy("'descr':'|O'", m)),
                                  "npz", "builtins.open"),
    # np.load takes a file starting with an empty archive's end record for an .npz; zipfile then finds the real
    # archive behind it, every offset shifted.
    "npz_behind_an_end_record": ("shifted.npz", lambda m: zip_forms.prepended(
        _npz(_npy("'descr': '|O'", m)), b"PK\x05\x06" + bytes(18)), "npz", None),
    "protocol0_named_safetensors": ("model.safetensors", lambda m: payload(m, 0), "pickle", "builtins.open"),
    "protocol0_brace_quote_at_8": ("weights", lambda m: _s("abcdef{\"") + b"0" + payload(m, 0), "pickle",
                                   "builtins.open"),
    "stream_after_one_junk_byte": ("after.pkl", lambda m: pickle.dumps(1, protocol=2) + b"\xff" + payload(m),
                                   "skip-junk", "builtins.open"),
    "protocol0_after_junk": ("after0.pkl", lambda m: b"N." + b"\xff" + payload(m, 0), "skip-junk", "builtins.open"),
    "pkl_gz": ("state.pkl.gz", lambda m: gzip.compress(payload(m)), "gzip", "builtins.open"),
    "pkl_bz2": ("state.pkl.bz2", lambda m: bz2.compress(payload(m)), "bz2", "builtins.open"),
    "pkl_xz": ("state.pkl.xz", lambda m: lzma.compress(payload(m)), "xz", "builtins.open"),
    "pkl_zst_no_extension": ("state", lambda m: zstandard.ZstdCompressor().compress(payload(m)), "zstd",
                             "builtins.open"),
    "joblib_zlib": ("model.joblib", lambda m: zlib.compress(payload(m)), "zlib", "builtins.open"),
}


def _npz_named(name: str, data: bytes) -> bytes:
    out = io.BytesIO()
    with zipfile_writer(out) as archive:
        archive.writestr(name, data)
    return out.getvalue()


LIVE_LOADER = r"""
import bz2, gzip, io, lzma, pickle, sys, zipfile, zlib
path, how = sys.argv[1], sys.argv[2]
data = open(path, "rb").read()
if how == "torch":
    import torch
    torch.load(path, weights_only=False)
elif how == "zip-member":
    z = zipfile.ZipFile(path)
    pickle.loads(z.read("archive/extra/hook"))
elif how in ("numpy", "npz"):
    import numpy as np
    loaded = np.load(path, allow_pickle=True)
    if how == "npz":
        [loaded[k] for k in loaded.files]
elif how == "pickle":
    pickle.loads(data)
elif how == "skip-junk":
    fh = io.BytesIO(data)
    pickle.load(fh)
    fh.read(1)
    pickle.load(fh)
else:
    import zstandard
    opener = {"gzip": gzip.decompress, "bz2": bz2.decompress, "xz": lzma.decompress, "zlib": zlib.decompress,
              "zstd": lambda d: zstandard.ZstdDecompressor().stream_reader(io.BytesIO(d)).read()}[how]
    pickle.loads(opener(data))
"""


@pytest.mark.parametrize("name", FORMS)
def test_form_is_a_live_payload(name, tmp_path):
    """In a throwaway child, the reviewer's loader really runs each form: the corpus is not dead code."""
    file_name, build, how, _ = FORMS[name]
    marker = tmp_path / "live.marker"
    path = tmp_path / file_name
    path.write_bytes(build(marker))
    subprocess.run([sys.executable, "-c", LIVE_LOADER, str(path), how], capture_output=True, timeout=120, check=False)
    assert marker.exists(), f"{name}: the form does not run when loaded, so it proves nothing"


@pytest.mark.parametrize("name", FORMS)
def test_form_is_refused_by_the_scanner(name, tmp_path):
    file_name, build, _, global_name = FORMS[name]
    marker = tmp_path / "marker"
    path = tmp_path / file_name
    path.write_bytes(build(marker))
    assert is_pickle_or_torch_zip(path)
    result = scan_file(path)
    assert result.is_pickle and not result.loadable
    if global_name:
        assert global_name in result.unsafe, result
    else:
        assert result.error and "ambiguous zip" in result.error
    assert not marker.exists()


# ---- the differential against torch's own reader -------------------------------------------------------

def test_two_central_directories_zipfile_and_torch_read_different_pickles(tmp_path):
    """The issue's file: zipfile (what the old scanner read) sees the benign data.pkl, torch's reader the
    payload. The old scan was clean; now the file is refused."""
    import zipfile

    marker = tmp_path / "marker"
    path = tmp_path / "extra.pt"
    path.write_bytes(zip_forms.two_directories(zip_forms.torch_bytes(),
                                               zip_forms.with_data_pkl(zip_forms.torch_bytes(), payload(marker))))
    seen_by_zipfile = zipfile.ZipFile(path).read("archive/data.pkl")
    seen_by_torch = torch._C.PyTorchFileReader(str(path)).get_record("data.pkl")
    assert seen_by_zipfile != seen_by_torch and seen_by_torch == payload(marker)
    assert b"builtins" not in seen_by_zipfile  # the old scanner, reading through zipfile, saw a clean pickle
    result = scan_file(path)
    assert result.error and "zip64 locator" in result.error and not result.loadable
    assert not marker.exists()


@pytest.mark.parametrize("form", ["prepended", "appended", "local_name_differs", "gap_between_members"])
def test_ambiguous_layouts_are_refused(form, tmp_path):
    data = zip_forms.torch_bytes()
    build = getattr(zip_forms, form)
    path = tmp_path / "model.pt"
    path.write_bytes(build(data, b"PK\x05\x06" + bytes(18)) if form == "appended" else build(data))
    result = scan_file(path)
    assert result.is_pickle and result.error and "ambiguous zip" in result.error and not result.loadable


@pytest.fixture(scope="module")
def real_torch_files(tmp_path_factory) -> Path:
    """Real torch.save files of every shape the tool meets, in the zip and the legacy format."""
    folder = tmp_path_factory.mktemp("real-torch")
    dtypes = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int8, torch.uint8, torch.int16,
              torch.int32, torch.int64, torch.bool, torch.complex64, torch.complex128]
    many = {f"layer.{i}.{d}": torch.ones(3, i + 1, dtype=d) for i, d in enumerate(dtypes * 30)}
    nested = {"model": {"a": torch.randn(4, 4), "views": [torch.arange(10)[2:5], torch.arange(10)[::2]]},
              "optimizer": {"state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.randn(4)}},
                            "param_groups": [{"lr": 1e-3, "params": [0]}]},
              "rng": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate(),
              "empty": torch.empty(0), "scalar": torch.tensor(1)}
    large = {"w": torch.randn(4096, 1024)}  # 16 MiB: raw storage bytes the scanner must not misread
    for name, value in {"many": many, "nested": nested, "large": large}.items():
        torch.save(value, folder / f"{name}.pt")
        torch.save(value, folder / f"{name}-legacy.bin", _use_new_zipfile_serialization=False)
    torch.save(torch.nn.Linear(3, 2).state_dict(), folder / "protocol4.pt", pickle_protocol=4)
    torch.save(torch.nn.Linear(3, 2).state_dict(), folder / "protocol4-legacy.pt", pickle_protocol=4,
               _use_new_zipfile_serialization=False)
    outer = io.BytesIO()
    torch.save({"inner": zip_forms.torch_bytes()}, outer)  # bytes of a torch file inside a torch file
    (folder / "bytes-inside.pt").write_bytes(outer.getvalue())
    np.save(folder / "plain.npy", np.arange(10))
    np.savez(folder / "plain.npz", a=np.arange(3), b=np.ones((2, 2)))
    np.savez_compressed(folder / "compressed.npz", a=np.arange(3))
    return folder


REAL = ["many.pt", "many-legacy.bin", "nested.pt", "nested-legacy.bin", "large.pt", "large-legacy.bin",
        "protocol4.pt", "protocol4-legacy.pt", "bytes-inside.pt"]


@pytest.mark.parametrize("name", REAL)
def test_real_torch_files_are_accepted(real_torch_files, name):
    path = real_torch_files / name
    result = scan_file(path)
    assert result.is_pickle and result.error is None and result.unsafe == [] and result.loadable, result
    from itera_verify.reload.common import numpy_rng_globals

    if name.startswith("protocol4"):
        return  # torch's weights_only unpickler has no FRAME opcode: it reads protocol 2 only
    with torch.serialization.safe_globals(numpy_rng_globals()):
        torch.load(path, weights_only=True)  # and torch reads them: the differential's other side


@pytest.mark.parametrize("name", ["plain.npy", "plain.npz", "compressed.npz"])
def test_numpy_files_without_objects_are_not_pickles(real_torch_files, name):
    result = scan_file(real_torch_files / name)
    assert not result.is_pickle and result.error is None and result.unsafe == []


def test_every_pickle_of_the_real_package_is_accepted(built):
    from itera_verify.package.pickles import scan_package

    results = scan_package(context(built["package"]))
    assert results and all(r.error is None and r.unsafe == [] for r in results.values()), results
    assert {rel for rel, r in results.items() if r.is_pickle} >= {
        "checkpoints/control/checkpoint-4/optimizer.pt", "checkpoints/control/checkpoint-4/training_args.bin"}


def test_legacy_file_with_a_stream_appended_after_its_storages_is_refused(real_torch_files, tmp_path):
    marker = tmp_path / "marker"
    path = tmp_path / "legacy.bin"
    path.write_bytes((real_torch_files / "nested-legacy.bin").read_bytes() + b"\x00" + payload(marker))
    result = scan_file(path)
    assert "builtins.open" in result.unsafe and result.error and not result.loadable
    assert not marker.exists()


def test_long_junk_after_a_pickle_is_refused_even_unsearched(tmp_path):
    path = tmp_path / "state.pkl"
    path.write_bytes(pickle.dumps({"a": 1}, protocol=2) + b"\xff" + bytes(200))
    result = scan_file(path)
    assert result.is_pickle and result.error and "after the pickle" in result.error and not result.loadable


def test_text_that_begins_like_a_tiny_pickle_is_not_one(tmp_path):
    for name, text in {"notes.txt": "N.B. the run was cut short\n", "metrics.csv": "0.5,0.25\n0.1,0.2\n"}.items():
        (tmp_path / name).write_text(text)
        result = scan_file(tmp_path / name)
        assert not result.is_pickle and result.error is None, (name, result)


# ---- safetensors stays safetensors ---------------------------------------------------------------------

def _safetensors_with_header_length(length: int) -> bytes:
    tensor = np.zeros(4, dtype=np.float32).tobytes()
    header = {"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, len(tensor)]}, "__metadata__": {"p": ""}}
    raw = json.dumps(header).encode()
    header["__metadata__"]["p"] = "x" * (length - len(raw))
    raw = json.dumps(header).encode()
    assert len(raw) == length
    return struct.pack("<Q", length) + raw + tensor


@pytest.mark.parametrize("length", [0x0280, 0x0380, 0x4E00 + 0x28])  # \x80\x02 magic; 'N' then '(' opcodes
def test_real_safetensors_whose_length_looks_like_a_pickle_is_not_one(tmp_path, length):
    from safetensors.numpy import load_file

    path = tmp_path / "model.safetensors"
    path.write_bytes(_safetensors_with_header_length(length))
    assert load_file(path)["w"].shape == (4,)
    # No exemption (it is read as a pickle from byte 0 like any file), yet its bytes are no pickle and no error.
    result = scan_file(path)
    assert not result.is_pickle and result.error is None, result


def test_safetensors_in_the_package_and_payload_named_safetensors(package_dir, tmp_path):
    marker = tmp_path / "marker"
    (package_dir / "analysis/probe.safetensors").write_bytes(_safetensors_with_header_length(0x0380))
    (package_dir / "analysis/fake.safetensors").write_bytes(payload(marker, 0))
    findings = [f for f in static_findings(package_dir) if f.code == "IV506"]
    assert [(f.path, "builtins.open" in f.message) for f in findings] == [("analysis/fake.safetensors", True)]
    assert not marker.exists()


# ---- through the rule and the whole command line -------------------------------------------------------

def test_unscannable_pickle_is_IV506_naming_the_file(package_dir, tmp_path):
    marker = tmp_path / "marker"
    (package_dir / "analysis/extra.pt").write_bytes(zip_forms.two_directories(
        zip_forms.torch_bytes(), zip_forms.with_data_pkl(zip_forms.torch_bytes(), payload(marker))))
    findings = [f for f in static_findings(package_dir) if f.code == "IV506"]
    assert [f.path for f in findings] == ["analysis/extra.pt"]
    assert "cannot be scanned" in findings[0].message and "ambiguous zip" in findings[0].message
    assert findings[0].severity.value == "error"
    assert not marker.exists()


@pytest.fixture(scope="module")
def planted_cli_run(built, tmp_path_factory):
    import shutil

    base = tmp_path_factory.mktemp("parsers")
    package, markers = base / "pkg", base / "markers"
    shutil.copytree(built["package"], package, symlinks=True)
    markers.mkdir()
    planted = {}
    for name, (file_name, build, _, _) in FORMS.items():
        rel = f"analysis/{name}/{file_name}"
        (package / rel).parent.mkdir(parents=True)
        (package / rel).write_bytes(build(markers / f"{name}.marker"))
        planted[name] = rel
    # The file where a reload reads it: the real optimizer.pt for zipfile, the payload for torch.
    optimizer = package / "checkpoints/control/checkpoint-4/optimizer.pt"
    optimizer.write_bytes(zip_forms.two_directories(optimizer.read_bytes(), zip_forms.with_data_pkl(
        zip_forms.torch_bytes(), payload(markers / "optimizer.marker"))))
    planted["referenced_optimizer"] = "checkpoints/control/checkpoint-4/optimizer.pt"
    result = run_cli(package, "--no-seal", "--hf-cache", built["hf_cache"], "--format", "json", "--device", "cpu",
                     "--timeout", "300")
    return result, planted, markers


@pytest.mark.parametrize("name", FORMS)
def test_form_is_IV506_through_the_command_line_and_never_runs(name, planted_cli_run):
    result, planted, markers = planted_cli_run
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert not list(markers.iterdir()), "a payload ran"
    assert result.returncode == 1, result.stderr[-2000:]
    findings = [f for f in json.loads(result.stdout)["findings"] if f["code"] == "IV506"]
    assert [f["path"] for f in findings if f["path"] == planted[name]] == [planted[name]]
    assert {f["path"] for f in findings} == set(planted.values())  # nothing else of the package


def test_ambiguous_optimizer_of_a_checkpoint_is_never_loaded(planted_cli_run):
    result, planted, markers = planted_cli_run
    assert not (markers / "optimizer.marker").exists()
    report = json.loads(result.stdout)
    rel = planted["referenced_optimizer"]
    (finding,) = [f for f in report["findings"] if f["code"] == "IV506" and f["path"] == rel]
    assert "ambiguous zip" in finding["message"] and finding["run"] == "control"
    assert rel in json.dumps([f for f in report["findings"] if f["code"] == "IV504"])  # the resume is refused


def test_compressed_text_is_not_a_pickle_and_a_compressed_plain_pickle_is_clean(tmp_path):
    (tmp_path / "metrics.csv.gz").write_bytes(gzip.compress(b"0.5,0.25\n" * 1000))
    assert not scan_file(tmp_path / "metrics.csv.gz").is_pickle
    (tmp_path / "state.pkl.gz").write_bytes(gzip.compress(pickle.dumps({"step": 3, "loss": [0.5]}, protocol=4)))
    result = scan_file(tmp_path / "state.pkl.gz")
    assert result.is_pickle and result.error is None and result.unsafe == []


def test_legacy_file_with_junk_after_its_storages_is_refused(real_torch_files, tmp_path):
    path = tmp_path / "legacy.bin"
    path.write_bytes((real_torch_files / "many-legacy.bin").read_bytes() + b"\xff" * 7)
    result = scan_file(path)
    assert result.error and "storage records" in result.error and not result.loadable


def test_clean_package_has_no_IV506(package_dir):
    assert not [f for f in static_findings(package_dir) if f.code == "IV506"]


def _wait_absent(marker: Path, seconds: float = 1.0) -> bool:
    time.sleep(seconds)
    return not marker.exists()


def test_python2_npy_header_is_parsed_as_numpy_parses_it(tmp_path):
    """numpy filters a Python 2 header ('shape': (1L,)) before literal_eval for versions 1.0 and 2.0."""
    marker = tmp_path / "marker"
    path = tmp_path / "old.npy"
    path.write_bytes(_npy("'descr': '|O'", marker, shape="(1L,)"))
    assert "builtins.open" in scan_file(path).unsafe
    assert not marker.exists()


@pytest.mark.parametrize("name", ["state.pkl.zst", "state.zst"])
def test_payload_before_damage_in_compressed_data_is_named_and_refused(tmp_path, name):
    """pickle.load on a decompressor runs what it read before the data broke: those names count."""
    marker = tmp_path / "marker"
    noise = random.Random(0).randbytes(1 << 20)  # incompressible: the damage lands well after the payload
    data = b"\x80\x02cbuiltins\nopen\n(" + _s(str(marker)) + _s("w") + b"tRB" + struct.pack("<L", len(noise))
    compressed = bytearray(zstandard.ZstdCompressor(level=1).compress(data + noise + b"0N."))
    compressed[-1000:] = b"\xff" * 1000
    (tmp_path / name).write_bytes(bytes(compressed))
    result = scan_file(tmp_path / name)
    assert "builtins.open" in result.unsafe and result.error and not result.loadable
    assert not marker.exists()


def test_member_names_that_differ_only_in_case_are_refused(tmp_path):
    """torch's reader looks records up ignoring case: a DATA.PKL twin could be the data.pkl it loads."""
    import zipfile

    marker = tmp_path / "marker"
    path = tmp_path / "model.pt"
    path.write_bytes(zip_forms.case_twin(zip_forms.torch_bytes(), payload(marker)))
    assert len({n.lower() for n in zipfile.ZipFile(path).namelist()}) < len(zipfile.ZipFile(path).namelist())
    result = scan_file(path)
    assert result.error and "ignoring case" in result.error and not result.loadable
    assert not marker.exists()


def _mutations(data: bytes, count: int, seed: int):
    """Damage aimed at the zip records (signatures and the fields after them), a few bytes at a time."""
    rng = random.Random(seed)
    signatures = (b"PK\x03\x04", b"PK\x01\x02", b"PK\x05\x06", b"PK\x06\x06", b"PK\x06\x07", b"PK\x07\x08")
    records = [i for i in range(len(data)) if data.startswith(signatures, i)]
    for _ in range(count):
        damaged = bytearray(data)
        for _ in range(rng.randint(1, 3)):
            at = rng.choice(records) + rng.randrange(46) if rng.random() < 0.8 else rng.randrange(len(data))
            if at < len(damaged):
                damaged[at] = rng.choice([0, 0xFF, damaged[at] ^ (1 << rng.randrange(8)), rng.randrange(256)])
        yield bytes(damaged)


@pytest.mark.parametrize("layout", ["torch.save", "zipfile-appended"])
def test_every_zip_the_scanner_accepts_reads_the_same_in_zipfile_and_torch(layout, tmp_path):
    """The differential: for damaged real archives, whenever the strict reader accepts the layout, torch's own
    reader (torch._C.PyTorchFileReader, miniz) returns exactly the records zipfile returns."""
    from itera_verify.package.pickles.zips import AmbiguousZip, open_checked

    data = zip_forms.torch_bytes({"a": torch.ones(3), "b": torch.zeros(2, dtype=torch.int8)})
    if layout == "zipfile-appended":
        data = _torch_zip_with_member("archive/extra/notes", b"plain bytes")
    accepted, path = 0, tmp_path / "damaged.pt"
    for damaged in _mutations(data, 600, seed=14):
        try:
            with open_checked(io.BytesIO(damaged), len(damaged)) as archive:
                by_zipfile = {name: archive.read(name) for name in archive.namelist()}
        except (AmbiguousZip, zipfile.BadZipFile, OSError, ValueError, NotImplementedError):
            continue  # refused, or zipfile itself cannot read it: never scanned as clean
        accepted += 1
        path.write_bytes(damaged)
        reader = torch._C.PyTorchFileReader(str(path))
        by_torch = {f"archive/{name}": reader.get_record(name) for name in reader.get_all_records()}
        assert by_torch == by_zipfile
    assert accepted > 50  # the strict reader still reads most archives whose damage no reader notices
