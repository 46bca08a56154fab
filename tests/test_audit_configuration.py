"""Whose configuration an audit applies: the reviewer's (their --config, --select, --ignore, or the
itera-verify.toml found from their current folder), with the sender's, as its record shows it, beside it. A
failure that only the reviewer's stricter levels explain is reported as such, never as a contradicted record
(IV701); the sender's record alone never explains one."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from itera_verify import verify
from itera_verify.flows.audit import audit
from itera_verify.rules import Selection
from tests.helpers import run_cli
from itera_verify import settle

CAMPAIGN = "reviews-lora-2026-11"


def seal(built, folder: Path, selection: Selection | None = None, plant=None) -> Path:
    shutil.copytree(built["package"], folder / "pkg", symlinks=True)
    if plant:
        plant(folder / "pkg")
    report = verify(folder / "pkg", settle(reload=False, output=folder / f"{CAMPAIGN}.tar.zst", selection=selection))
    assert report.sealed, [f.to_json() for f in report.findings]
    return folder / f"{CAMPAIGN}.tar.zst"


def plant_scratch_path(pkg: Path) -> None:
    """A temporary path, and a configuration inside the package that would silence it if an audit read it."""
    (pkg / "analysis" / "notes.json").write_text(json.dumps({"scratch": "/tmp/run-7/ckpt"}))
    (pkg / "itera-verify.toml").write_text('ignore = ["IV201"]\n')


@pytest.fixture(scope="module")
def sealed_ignoring_iv201(built, tmp_path_factory) -> Path:
    """The sender ignored IV201 and sealed a package holding a temporary path."""
    return seal(built, tmp_path_factory.mktemp("ignoring"), Selection(ignore=("IV201",)), plant_scratch_path)


def test_a_sender_ignoring_an_error_rule_is_not_believed_to_explain_its_failure(sealed_ignoring_iv201):
    """IV201 is an error by the tool's own levels: the sender's record saying it did not run it is the sender's
    word alone, so the recorded pass is contradicted (issue 23), and the record's claim is shown, not believed."""
    report = audit(sealed_ignoring_iv201)
    codes = {f.code for f in report.findings}
    assert "IV201" in codes and report.verdict == "fail"
    comparison = report.audit["comparison"]
    assert comparison["recorded_verdict"] == "pass"
    assert comparison["explained_by_configuration"] == []
    assert comparison["not_believed"] == [{"code": "IV201", "sender": "not run"}]
    assert {"code": "IV201", "sender": "not run", "reviewer": "error"} in comparison["configuration_differences"]
    [contradicted] = [f for f in report.findings if f.code == "IV701"]
    assert contradicted.path.endswith("SEAL/verification.json") and "IV201" in contradicted.message


@pytest.fixture(scope="module")
def sealed_with_iv202(built, tmp_path_factory) -> Path:
    """The sender sealed at the default levels a package holding an absolute path: IV202, a warning."""
    return seal(built, tmp_path_factory.mktemp("iv202"), plant=lambda pkg: (pkg / "analysis" / "notes.json")
                .write_text(json.dumps({"data": "/home/alice/data/reviews.jsonl"})))


def test_the_reviewer_raising_a_warning_rule_is_explained_not_tampering(sealed_with_iv202, tmp_path):
    (tmp_path / "itera-verify.toml").write_text('levels = { IV202 = "error" }\n')
    result = run_cli("audit", str(sealed_with_iv202), "--format", "json", cwd=tmp_path)
    report = json.loads(result.stdout)
    codes = {f["code"] for f in report["findings"]}
    assert "IV202" in codes and result.returncode == 1
    assert "IV701" not in codes  # the content is what was sealed: the record is not contradicted
    comparison = report["audit"]["comparison"]
    assert comparison["explained_by_configuration"] == ["IV202"] and comparison["not_believed"] == []
    assert {"code": "IV202", "sender": "warning", "reviewer": "error"} in comparison["configuration_differences"]
    assert report["configuration"]["applied"] == str(tmp_path / "itera-verify.toml")
    assert report["configuration"]["not_applied"] == []


def test_the_reviewers_config_file_applies_to_the_recheck(sealed_ignoring_iv201, tmp_path):
    (tmp_path / "itera-verify.toml").write_text('ignore = ["IV201"]\n')
    result = run_cli("audit", str(sealed_ignoring_iv201), "--format", "json", cwd=tmp_path)
    report = json.loads(result.stdout)
    assert result.returncode == 0, result.stdout[-2000:]
    assert report["verdict"] == "pass"
    assert not [f for f in report["findings"] if f["code"] == "IV201"]


def test_audit_select_and_ignore_options_apply_to_the_recheck(sealed_ignoring_iv201, tmp_path):
    result = run_cli("audit", str(sealed_ignoring_iv201), "--ignore", "IV201", "--format", "json", cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-2000:]
    result = run_cli("audit", str(sealed_ignoring_iv201), "--select", "IV3", "--format", "json", cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-2000:]
    rules = json.loads(result.stdout)["rules"]
    assert rules and all(code.startswith("IV3") for code in rules), sorted(rules)


def test_a_config_inside_the_archive_is_never_read(sealed_ignoring_iv201, tmp_path):
    """The sender's package carries an itera-verify.toml ignoring IV201: the reviewer's audit never reads it."""
    result = run_cli("audit", str(sealed_ignoring_iv201), "--format", "json", cwd=tmp_path)
    assert result.returncode == 1
    assert any(f["code"] == "IV201" for f in json.loads(result.stdout)["findings"])


def test_archive_findings_stay_errors_whatever_the_reviewer_configures(sealed_ignoring_iv201, tmp_path):
    tampered = tmp_path / "a.tar.zst"
    tampered.write_bytes(sealed_ignoring_iv201.read_bytes())
    (tmp_path / f"{tampered.name}.sha256").write_text("0" * 64 + f"  {tampered.name}\n")
    (tmp_path / "itera-verify.toml").write_text('levels = { IV701 = "warning" }\n')
    result = run_cli("audit", str(tampered), "--format", "json", cwd=tmp_path)
    found = [f for f in json.loads(result.stdout)["findings"] if f["code"] == "IV701"]
    assert found and {f["severity"] for f in found} == {"error"}
    assert result.returncode == 1


def test_text_output_shows_the_senders_record_beside_the_recheck(sealed_ignoring_iv201, sealed_with_iv202,
                                                                  tmp_path):
    result = run_cli("audit", str(sealed_ignoring_iv201), cwd=tmp_path)
    assert "Sender's record" in result.stdout and "configuration: none" in result.stdout
    assert "IV201: failing now; the sender's record says not run, not taken as the reason" in result.stdout
    (tmp_path / "itera-verify.toml").write_text('levels = { IV202 = "error" }\n')
    result = run_cli("audit", str(sealed_with_iv202), cwd=tmp_path)
    assert f"configuration {tmp_path / 'itera-verify.toml'}" in result.stdout
    assert "IV202: failing now at the reviewer's level, below error by the tool's default" in result.stdout
