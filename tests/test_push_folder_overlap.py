"""`itera-verify OUTDIR --push FOLDER` copies while it seals (push/local.FolderFollower, issue 27 item 1): the copy
is begun before the seal has published the archive, takes its name only once it reads back from the folder as
the SHA-256 the seal verified, and gets its sidecars and receipt; a refused package leaves nothing in the folder,
and a run killed mid-copy leaves a partial copy that the next run removes before it delivers a verified one."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from fixtures.edit import edit_manifest
from tests.helpers import run_cli
from tests.push_stores import bulky

MiB = 1 << 20
# zstd level 19 on one thread: the seal of 24 MiB of noise takes seconds, so "while it seals" is observable
SLOW_SEAL = ("--level", "19", "--threads", "1")


def partials(folder) -> list:
    return [p for p in folder.iterdir() if p.name.endswith(".partial")]


def start(package_dir, out, share):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "NO_COLOR": "1"}
    return subprocess.Popen([sys.executable, "-m", "itera_verify", str(package_dir), "--no-reload", "-o", str(out),
                             "--push", str(share), *SLOW_SEAL, "--format", "json"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)


def wait_for_copy_during_seal(child, out, share, seconds: float = 120) -> bool:
    """True once the folder holds a partial copy with bytes in it while the archive is still the seal's
    partial file (not yet published)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and child.poll() is None:
        copies = [p for p in partials(share) if p.stat().st_size > 0]
        if copies and partials(out) and not list(out.glob("*.tar.zst")):
            return True
        time.sleep(0.01)
    return False


def test_the_copy_to_a_folder_begins_during_the_seal_and_is_verified_with_a_receipt(package_dir, tmp_path):
    out, share = tmp_path / "out", tmp_path / "share"
    out.mkdir()
    share.mkdir()
    child = start(bulky(package_dir), out, share)
    overlapped = wait_for_copy_during_seal(child, out, share)
    stdout, stderr = child.communicate(timeout=600)
    assert child.returncode == 0, stdout[-3000:] + stderr
    assert overlapped, "no partial copy in the folder while the archive was being sealed"
    report = json.loads(stdout)
    pushed = report["archive"]["push"]
    archive = next(out.glob("*.tar.zst"))
    assert pushed["overlapped_with_seal"] is True and pushed["verified_by"] == "read back and hashed (sha256)"
    assert pushed["sha256"] == report["archive"]["sha256"] and pushed["bytes"] == archive.stat().st_size
    assert pushed["destination"] == str(share.resolve())
    assert (share / archive.name).read_bytes() == archive.read_bytes()
    for sidecar in (".sha256", ".receipt.json"):
        assert (share / (archive.name + sidecar)).read_bytes() == archive.with_name(archive.name + sidecar).read_bytes()
    receipt = json.loads((share / (archive.name + ".receipt.json")).read_text())
    assert receipt["sha256"] == pushed["sha256"] and receipt["crc64nvme"]  # from the seal's own read-back
    assert sorted(p.name for p in share.iterdir()) == sorted(
        [archive.name, archive.name + ".sha256", archive.name + ".receipt.json"])  # no partial left


def test_a_package_that_fails_its_checks_leaves_nothing_in_the_folder(package_dir, tmp_path):
    edit_manifest(bulky(package_dir), lambda m: m["runs"][0].__setitem__("role", "baseline"))  # IV105
    out, share = tmp_path / "out", tmp_path / "share"
    out.mkdir()
    share.mkdir()
    result = run_cli(package_dir, "--no-reload", "-o", out, "--push", share, *SLOW_SEAL)
    assert result.returncode == 1 and "IV105" in result.stdout, result.stdout[-3000:] + result.stderr
    assert list(out.iterdir()) == [] and list(share.iterdir()) == []  # no archive, no copy, no partial
    assert "while sealing: done" not in result.stderr  # the copy begun beside the seal is never said done
    assert "while sealing: stopped, nothing sealed: the partial copy is removed" in result.stderr


def test_a_run_killed_mid_copy_is_delivered_verified_by_the_next_run(package_dir, tmp_path):
    out, share = tmp_path / "out", tmp_path / "share"
    out.mkdir()
    share.mkdir()
    child = start(bulky(package_dir), out, share)
    assert wait_for_copy_during_seal(child, out, share), child.communicate(timeout=600)
    os.killpg(child.pid, signal.SIGKILL)  # the rental ends mid-copy: no handler runs
    child.communicate(timeout=60)
    stale = partials(share)
    assert stale and not [p for p in share.iterdir() if not p.name.endswith(".partial")]  # no archive, no receipt
    result = run_cli(package_dir, "--no-reload", "-o", out, "--push", share, "--format", "json")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr
    pushed = json.loads(result.stdout)["archive"]["push"]
    archive = next(out.glob("*.tar.zst"))
    assert pushed["overlapped_with_seal"] is True
    assert (share / archive.name).read_bytes() == archive.read_bytes()
    assert sorted(p.name for p in share.iterdir()) == sorted(
        [archive.name, archive.name + ".sha256", archive.name + ".receipt.json"])  # the stale copy removed
    assert not partials(out)


def test_the_archive_s_own_folder_as_destination_is_one_line_exit_2(package_dir, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    result = run_cli(package_dir, "--no-reload", "-q", "-o", out, "--push", out)
    assert result.returncode == 2, result.stdout[-3000:] + result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines == [f"itera-verify: error: {out}: is the archive's own folder (give another destination)"], lines
    archive = next(out.glob("*.tar.zst"))  # the seal is kept: the archive is the work
    assert not archive.with_name(archive.name + ".receipt.json").exists() and not partials(out)
