"""torch's weights_only unpickler is the second lock; below 2.10 it has a published hole (CVE-2026-24747, memory
corruption through SETITEM; below 2.6 also CVE-2025-32434). `audit --reload` of an archive refuses to run on such
a torch (exit 2, one line, before any work); `verify` warns. The installed torch here is 2.13: the version is read
once at the entry point into the Environment, so these tests hand in real old version strings, never a fake torch.
"""
from __future__ import annotations

import importlib.metadata
from dataclasses import replace

import pytest

from itera_verify import audit, verify
from itera_verify.flows.config import Config
from itera_verify.model import UsageError
from itera_verify.runtime.environment import Environment
from itera_verify.runtime.progress import Progress
from itera_verify.runtime.torchsafety import advisory
from itera_verify import settle


def _reviewer_on(version: str) -> Config:
    return Config(environment=replace(Environment.read(), torch_version=version))


@pytest.mark.parametrize("version, cves", [
    ("2.9.1+cu128", ["CVE-2026-24747"]),
    ("2.5.1", ["CVE-2025-32434", "CVE-2026-24747"]),
    ("2.10.0a0+git1234abc", ["CVE-2026-24747"]),  # a nightly before the release: not counted as fixed
    ("2.10.0.dev20251201", ["CVE-2026-24747"]),
    ("not-a-version", ["CVE-2025-32434", "CVE-2026-24747"]),
])
def test_a_torch_below_2_10_is_named_with_its_cves(version, cves):
    line = advisory(version)
    assert line and f"torch {version}" in line and "\n" not in line
    assert [cve for cve in ("CVE-2025-32434", "CVE-2026-24747") if cve in line] == cves


@pytest.mark.parametrize("version", ["2.10.0", "2.10.1+cpu", "2.13.0+cpu", "3.0.0", None])
def test_a_fixed_torch_or_none_has_no_advisory(version):
    assert advisory(version) is None


def test_the_installed_torch_is_read_once_from_its_metadata_and_is_fixed():
    environment = Environment.read()
    assert environment.torch_version == importlib.metadata.version("torch")
    assert environment.torch_advisory is None


def test_audit_reload_on_torch_2_9_is_refused_before_the_archive_is_opened(tmp_path):
    """The archive does not even exist: the refusal comes first, so nothing of it was read or extracted."""
    with pytest.raises(UsageError) as refused:
        audit(tmp_path / "absent.tar.zst", settle(_reviewer_on("2.9.1"), reviewer=True, reload=True))
    message = str(refused.value)
    assert message.startswith("audit --reload: torch 2.9.1 is open to CVE-2026-24747")
    assert "\n" not in message and "torch>=2.10" in message


@pytest.mark.slow
def test_audit_reload_of_a_real_archive_on_torch_2_9_is_refused_and_audit_alone_runs(sealed):
    with pytest.raises(UsageError, match="CVE-2026-24747"):
        audit(sealed, settle(_reviewer_on("2.9.1"), reviewer=True, reload=True))
    report = audit(sealed, settle(_reviewer_on("2.9.1"), reviewer=True, reload=False))  # nothing unpickled: no reason to refuse
    assert report.verdict == "pass" and report.configuration["torch"]["version"] == "2.9.1"


class _Lines(Progress):
    def __init__(self):
        self.lines: list[str] = []

    def log(self, message: str) -> None:
        self.lines.append(message)


def _tiny(tmp_path):
    from tests.handmade import write_tiny_package

    root = tmp_path / "tiny"
    write_tiny_package(root)
    return root


@pytest.mark.slow
def test_verify_on_torch_2_9_warns_in_the_log_and_the_report_and_fails_nothing(tmp_path):
    old, current = _Lines(), _Lines()
    warned = verify(_tiny(tmp_path), settle(_reviewer_on("2.9.1"), seal=False), progress=old)
    plain = verify(_tiny(tmp_path / "b"), settle(Config(environment=Environment.read()), seal=False), progress=current)
    assert [line for line in old.lines if "CVE-2026-24747" in line] == [f"WARNING: {advisory('2.9.1')}"]
    assert not [line for line in current.lines if "CVE" in line]
    assert warned.configuration["torch"] == {"version": "2.9.1", "advisory": advisory("2.9.1")}
    assert plain.configuration["torch"]["advisory"] is None
    assert warned.verdict == plain.verdict and [f.code for f in warned.findings] == [f.code for f in plain.findings]
    from itera_verify.report import renderer

    assert "CVE-2026-24747" in renderer("text")(warned, {}) and "CVE" not in renderer("text")(plain, {})
