"""The audit's private extraction folder (flows/scratch.py): held with a lock while the audit runs; what an audit
killed with SIGKILL left behind is removed by the next one, and nothing a running audit holds is."""
from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import run_cli
from tests.redteam4_forms import Member, seal, small_campaign, write_archive


@pytest.fixture(scope="module")
def clean(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("scratch-clean")
    return seal(small_campaign(folder / "machine"), folder / "sealed")


def audit_folders(scratch: Path) -> list[Path]:
    return sorted(scratch.glob("itera-audit-*"))


def killed_audit(tmp_path: Path, scratch: Path) -> Path:
    """The folder an audit left when it was killed with SIGKILL in the middle of its extraction."""
    slow = write_archive(tmp_path / "slow.tar.zst", "slow",  # 256 MiB of zeros to write: a wide window
                         [Member("", "directory"), Member("zeros.bin", "file", bytes(256 << 20))], sums=False)
    env = {**{k: v for k, v in os.environ.items() if k != "GITHUB_ACTIONS"}, "TMPDIR": str(scratch)}
    audit = subprocess.Popen([sys.executable, "-m", "itera_verify", "audit", str(slow), "--format", "json"], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not any((folder / "tree" / "slow").exists() for folder in audit_folders(scratch)):
            assert audit.poll() is None and time.monotonic() < deadline, "the audit ended before it was killed"
            time.sleep(0.001)
        audit.send_signal(signal.SIGKILL)
    finally:
        audit.kill()
        audit.wait(30)
    (left,) = audit_folders(scratch)
    return left


@pytest.mark.slow
def test_an_audit_killed_with_sigkill_leaves_a_folder_the_next_audit_removes(clean, tmp_path):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    left = killed_audit(tmp_path, scratch)
    assert (left / "lock").is_file() and (left / "tree" / "slow").is_dir()  # nothing ran to remove it
    result = run_cli("audit", clean, env={"TMPDIR": str(scratch)}, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:]
    assert audit_folders(scratch) == []


@pytest.mark.slow
def test_a_running_audits_folder_and_one_without_a_lock_are_left_alone(clean, tmp_path):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    running = scratch / "itera-audit-running"
    (running / "tree").mkdir(parents=True)
    holder = os.open(running / "lock", os.O_RDWR | os.O_CREAT, 0o600)  # held here as a running audit holds it
    fcntl.flock(holder, fcntl.LOCK_EX)
    older = scratch / "itera-audit-older"  # an older version's folder, or one being made: no lock to judge by
    (older / "x").mkdir(parents=True)
    try:
        result = run_cli("audit", clean, env={"TMPDIR": str(scratch)}, timeout=300)
        assert result.returncode == 0, result.stdout[-2000:]
        assert audit_folders(scratch) == [older, running]
    finally:
        os.close(holder)
    result = run_cli("audit", clean, env={"TMPDIR": str(scratch)}, timeout=300)
    assert result.returncode == 0 and audit_folders(scratch) == [older]  # its lock is free now: a dead audit's
