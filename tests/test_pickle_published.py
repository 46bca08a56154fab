"""The containers behind the published bypasses (issue 35), read against the readers they fool: a 7z archive
(nullifAI) is never judged harmless, whatever its name or wrapping; a zip record whose CRC does not match is one
torch loads and zipfile refuses, so the scan refuses it. The payload forms themselves are in
tests/test_pickle_bypasses.py (static checks, command line, live proof)."""
from __future__ import annotations

import gzip
import io
import pickle
import shutil
import struct
import subprocess
import zipfile

import pytest
import torch
from itera_verify.package.pickles import scan_file

from tests import zip_forms

BENIGN = pickle.dumps({"step": 3, "loss": [0.5, 0.25]}, protocol=2)


def test_the_7z_fixture_is_a_real_archive_7zip_reads(tmp_path):
    seven = shutil.which("7zz") or shutil.which("7z")
    if seven is None:
        pytest.skip("no 7-Zip command on this machine (the fixture was checked with 7zz 26.02)")
    for compress in (True, False):
        path = tmp_path / f"model-{compress}.7z"
        path.write_bytes(zip_forms.seven_zip("archive/data.pkl", BENIGN, compress=compress))
        out = tmp_path / f"out-{compress}"
        subprocess.run([seven, "x", f"-o{out}", str(path)], check=True, capture_output=True)
        assert (out / "archive/data.pkl").read_bytes() == BENIGN == zip_forms.unseven_zip(path.read_bytes())


@pytest.mark.parametrize("name, compress", [("model.bin", True), ("model.pt", False), ("corpus.7z", True),
                                            ("notes", True)])
def test_a_7z_archive_cannot_be_scanned_whatever_it_holds_or_is_named(tmp_path, name, compress):
    """Even a benign pickle, even stored uncompressed, even under a name that is no pickle's: never "clean"."""
    path = tmp_path / name
    path.write_bytes(zip_forms.seven_zip("archive/data.pkl", BENIGN, compress=compress))
    result = scan_file(path)
    assert result.is_pickle and not result.loadable and "7z archive" in result.error, result


def test_a_7z_of_text_is_refused_too(tmp_path):
    path = tmp_path / "eval.7z"
    path.write_bytes(zip_forms.seven_zip("eval_ids.txt", b"q1\nq2\n"))
    assert "7z archive" in (scan_file(path).error or "")


@pytest.mark.parametrize("wrap", ["gzip", "zip-member"])
def test_a_7z_inside_another_container_is_refused(tmp_path, wrap):
    inner = zip_forms.seven_zip("archive/data.pkl", BENIGN)
    path = tmp_path / "state.bin"
    if wrap == "gzip":
        path.write_bytes(gzip.compress(inner))
    else:
        out = io.BytesIO(zip_forms.torch_bytes())
        with zipfile.ZipFile(out, "a") as archive:
            archive.writestr("archive/extra/blob", inner)
        path.write_bytes(out.getvalue())
    result = scan_file(path)
    assert not result.loadable and "7z archive" in (result.error or ""), result


def _bad_crc(data: bytes) -> bytes:
    out = bytearray(data)
    for sig, crc_at, nlen_at, name_at in ((b"PK\x03\x04", 14, 26, 30), (b"PK\x01\x02", 16, 28, 46)):
        pos = out.find(sig)
        while pos >= 0:
            nlen = struct.unpack_from("<H", out, pos + nlen_at)[0]
            if bytes(out[pos + name_at:pos + name_at + nlen]).endswith(b"/data.pkl"):
                struct.pack_into("<L", out, pos + crc_at, struct.unpack_from("<L", out, pos + crc_at)[0] ^ 1)
            pos = out.find(sig, pos + 4)
    return bytes(out)


def test_a_crc_mismatch_torch_loads_and_zipfile_refuses_is_refused(tmp_path):
    """The differential: torch's reader returns the record without checking its CRC, zipfile raises on it. A
    scanner that skips what zipfile cannot read would pass what torch loads."""
    path = tmp_path / "optimizer.pt"
    saved = zip_forms.torch_bytes({"w": torch.ones(3)})
    # Rewritten by zipfile (no data descriptors): the CRC lives in the local header and the central entry only.
    plain = zip_forms.with_data_pkl(saved, zipfile.ZipFile(io.BytesIO(saved)).read("archive/data.pkl"))
    path.write_bytes(_bad_crc(plain))
    assert torch.equal(torch.load(path, weights_only=True)["w"], torch.ones(3))  # torch: loads, no complaint
    with pytest.raises(zipfile.BadZipFile, match="CRC"):
        zipfile.ZipFile(path).read("archive/data.pkl")
    result = scan_file(path)
    assert result.is_pickle and not result.loadable and "Bad CRC-32" in result.error, result


def test_the_same_archive_with_its_crc_intact_is_clean(tmp_path):
    path = tmp_path / "optimizer.pt"
    saved = zip_forms.torch_bytes({"w": torch.ones(3)})
    path.write_bytes(zip_forms.with_data_pkl(saved, zipfile.ZipFile(io.BytesIO(saved)).read("archive/data.pkl")))
    assert scan_file(path).loadable and torch.equal(torch.load(path, weights_only=True)["w"], torch.ones(3))
