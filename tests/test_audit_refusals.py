"""What the audit refuses besides the tar profile (issue 14): SEAL/ members the seal never writes (IV702, a
pickle there scanned and named), and an ARCHIVE argument that is not a regular file (a fifo, /dev/zero:
one line, exit 2, never a hang)."""
from __future__ import annotations

import os
import pickle
import subprocess
import tarfile
from pathlib import Path

import pytest

from itera_verify.flows.audit import audit
from tests.helpers import run_cli
from tests.tar_forms import gnu_extract, payload_pickle
from tests.test_audit import entries_of, member, write_archive

# Every audit here makes its private folder in the test's own temporary folder (conftest.private_tmp).
pytestmark = pytest.mark.usefixtures("private_tmp")

CAMPAIGN = "reviews-lora-2026-11"


def with_seal_member(sealed: Path, out: Path, *extra, replace: dict[str, bytes] | None = None) -> Path:
    """The sealed entries plus `extra` under SEAL/ (or with a SEAL/ file's bytes replaced), SHA256SUMS
    re-computed so that it lists them: only the rule on SEAL/ itself can refuse them."""
    entries = [(info, (replace or {}).get(info.name, data)) for info, data in entries_of(sealed)]
    return write_archive(out, entries + list(extra), resum=True)


def findings(report) -> list[tuple[str, str]]:
    return [(f.code, f.path) for f in report.findings if f.code.startswith("IV7")]


def test_a_pickle_the_seal_never_wrote_under_SEAL_is_IV702_scanned_and_never_run(sealed, tmp_path):
    marker = tmp_path / "payload-ran"
    name = f"{CAMPAIGN}/SEAL/zz.pt"
    archive = with_seal_member(sealed, tmp_path / "a.tar.zst", member(name, data=payload_pickle(marker)))
    report = audit(archive)
    assert report.verdict == "fail"
    refused = [f for f in report.findings if f.code == "IV702" and f.path == name]
    assert len(refused) == 2, refused  # never the seal's, and a pickle naming io.open
    assert any("pickle" in f.message and "io.open" in f.message for f in refused)
    gnu = tmp_path / "gnu"
    assert gnu_extract(archive, gnu) == 0
    import torch

    with pytest.raises(pickle.UnpicklingError):
        torch.load(gnu / CAMPAIGN / "SEAL" / "zz.pt", weights_only=True)
    assert not marker.exists()


def test_a_text_file_or_folder_the_seal_never_wrote_under_SEAL_is_IV702(sealed, tmp_path):
    folder = tarfile.TarInfo(f"{CAMPAIGN}/SEAL/more")
    folder.type, folder.mode = tarfile.DIRTYPE, 0o755
    archive = with_seal_member(sealed, tmp_path / "a.tar.zst", member(f"{CAMPAIGN}/SEAL/notes.txt", data=b"trust me"),
                               (folder, None))
    report = audit(archive)
    assert report.verdict == "fail"
    assert ("IV702", f"{CAMPAIGN}/SEAL/notes.txt") in findings(report)
    assert ("IV702", f"{CAMPAIGN}/SEAL/more/") in findings(report)


def test_the_seals_report_html_replaced_by_a_pickle_is_IV702(sealed, tmp_path):
    marker = tmp_path / "payload-ran"
    name = f"{CAMPAIGN}/SEAL/report.html"
    archive = with_seal_member(sealed, tmp_path / "a.tar.zst", replace={name: payload_pickle(marker)})
    report = audit(archive)
    assert report.verdict == "fail"
    assert ("IV702", name) in findings(report)
    assert not marker.exists()


@pytest.mark.parametrize("record", [b"not json", b"[1, 2]", None])
def test_a_verification_record_that_is_no_report_is_IV702(sealed, tmp_path, record):
    name = f"{CAMPAIGN}/SEAL/verification.json"
    marker = tmp_path / "payload-ran"
    archive = with_seal_member(sealed, tmp_path / "a.tar.zst",
                               replace={name: record if record is not None else payload_pickle(marker)})
    report = audit(archive)
    assert report.verdict == "fail" and ("IV702", name) in findings(report)
    assert not marker.exists()


def test_the_control_archive_has_no_SEAL_finding(sealed):
    report = audit(sealed)
    assert report.verdict == "pass" and findings(report) == []


def _one_line_exit_2(target, tmp_path) -> str:
    try:
        result = run_cli("audit", target, timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail(f"`itera-verify audit {target}` did not return")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


def test_audit_of_a_fifo_ends_in_one_line_and_exit_2(tmp_path):
    fifo = tmp_path / "archive.tar.zst"
    os.mkfifo(fifo)
    assert "fifo" in _one_line_exit_2(fifo, tmp_path)
    link = tmp_path / "link.tar.zst"
    link.symlink_to(fifo)
    assert "fifo" in _one_line_exit_2(link, tmp_path)


def test_audit_of_dev_zero_ends_in_one_line_and_exit_2(tmp_path):
    assert "character device" in _one_line_exit_2("/dev/zero", tmp_path)
