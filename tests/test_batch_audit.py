"""`itera-verify audit DIR/ | @list.txt`: a reviewer audits a whole delivery in one command. Every *.tar.zst is
audited in its own process; a damaged or unreadable archive is one failed row; foreign files are skipped and said;
`--shard I/N` splits the keys with no coordinator; `--results` makes a rerun audit only what is new."""
from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path

import pytest

from itera_verify import settle
from itera_verify.flows import batch_local
from itera_verify.flows.batch import audit_batch
from itera_verify.flows.batch_sources import list_archives
from itera_verify.model import UsageError
from tests.helpers import run_cli


def delivery(folder: Path, sealed: Path, copies: int = 2) -> Path:
    """A folder as a reviewer receives it: sealed archives (one below a subfolder) with their `.sha256`."""
    folder.mkdir(parents=True, exist_ok=True)
    for index in range(copies):
        target = folder / ("nested" if index % 2 else "") / f"campaign-{index}.tar.zst"
        target.parent.mkdir(exist_ok=True)
        shutil.copy(sealed, target)
        shutil.copy(sealed.with_name(sealed.name + ".sha256"), target.with_name(target.name + ".sha256"))
    return folder


def rows_of(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines() if line.strip()]


def test_a_folder_with_a_damaged_archive_and_foreign_files_is_one_failed_row_each_and_exit_1(sealed, tmp_path):
    folder = delivery(tmp_path / "delivery", sealed)
    (folder / "damaged.tar.zst").write_bytes(os.urandom(4096))  # not zstd at all
    truncated = folder / "truncated.tar.zst"
    truncated.write_bytes(sealed.read_bytes()[: sealed.stat().st_size // 2])
    (folder / "notes.txt").write_text("not an archive\n")
    os.mkfifo(folder / "stuck.tar.zst")  # a fifo named like an archive: said, never waited on
    result = run_cli("audit", folder, "--jobs", "2", "--format", "jsonl", timeout=300)
    assert result.returncode == 1, result.stderr
    rows = {row["key"]: row for row in rows_of(result.stdout)}
    assert set(rows) == {"campaign-0.tar.zst", "nested/campaign-1.tar.zst", "damaged.tar.zst", "truncated.tar.zst",
                         "stuck.tar.zst"}
    assert rows["campaign-0.tar.zst"]["verdict"] == "pass" and rows["nested/campaign-1.tar.zst"]["verdict"] == "pass"
    assert {f["code"] for f in rows["damaged.tar.zst"]["report"]["findings"]} == {"IV701"}
    assert "IV702" in {f["code"] for f in rows["truncated.tar.zst"]["report"]["findings"]}
    assert rows["stuck.tar.zst"]["report"] is None and "is a fifo" in rows["stuck.tar.zst"]["error"]
    assert "skipped 3 entries, not *.tar.zst archives" in result.stderr  # notes.txt and the two .sha256
    assert "notes.txt" in result.stderr and "FAIL: 5 archives: 2 pass, 3 fail (1 not audited)" in result.stderr


def test_a_folder_of_clean_archives_passes_with_the_summary_table(sealed, tmp_path):
    folder = delivery(tmp_path / "clean", sealed)
    page = tmp_path / "batch.html"
    result = run_cli("audit", folder, "--jobs", "2", "--report", f"html={page}", timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    html = page.read_text()
    assert "default-src 'none'" in html and html.count("<tr><td>") == 2 and "24.32 USD" in html
    header = next(line for line in result.stdout.splitlines() if line.startswith("archive"))
    for column in ("campaign", "verdict", "signer", "runs accepted", "cost per accepted run", "codes", "seconds"):
        assert column in header
    row = next(line for line in result.stdout.splitlines() if line.startswith("campaign-0.tar.zst"))
    assert "reviews-lora-2026-11" in row and "PASS" in row and "not signed" in row and "24.32 USD" in row
    assert result.stdout.rstrip().endswith("PASS: 2 archives: 2 pass, 0 fail; 2 entries skipped (not *.tar.zst)")
    assert "slowest in flight" in result.stderr or "[2/2]" in result.stderr


def test_a_folder_with_no_archive_is_exit_2_in_one_line(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "readme.md").write_text("x")
    result = run_cli("audit", tmp_path / "empty")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.strip().count("\n") == 0 and "no *.tar.zst archive to audit" in result.stderr


def test_the_shards_of_a_batch_cover_every_key_exactly_once(sealed, tmp_path):
    folder = delivery(tmp_path / "shards", sealed, copies=5)
    keys = [entry.key for entry in list_archives(str(folder)).entries]
    seen = []
    for index in range(3):
        result = run_cli("audit", folder, "--shard", f"{index}/3", "--format", "json", "-q", timeout=300)
        assert result.returncode == 0, result.stderr
        seen += [row["key"] for row in json.loads(result.stdout)]
    assert sorted(seen) == sorted(keys) and len(seen) == 5


@pytest.mark.parametrize("shard", ["3/3", "-1/2", "1", "a/b", "2/0"])
def test_a_shard_out_of_range_is_exit_2(tmp_path, shard):
    (tmp_path / "d").mkdir()
    result = run_cli("audit", tmp_path / "d", "--shard", shard)
    assert result.returncode == 2 and "I/N with 0 <= I < N" in result.stderr


def test_a_rerun_with_results_reuses_what_is_there_and_audits_only_the_rest(sealed, tmp_path):
    folder = delivery(tmp_path / "resume", sealed, copies=1)
    results = tmp_path / "results"
    first = run_cli("audit", folder, "--results", results, "--format", "json", "-q", timeout=300)
    assert first.returncode == 0 and [r["reused"] for r in json.loads(first.stdout)] == [False]
    (folder / "late.tar.zst").write_bytes(os.urandom(512))  # arrived after the first run
    again = run_cli("audit", folder, "--results", results, "--format", "json", timeout=300)
    rows = {row["key"]: row for row in json.loads(again.stdout)}
    assert rows["campaign-0.tar.zst"]["reused"] is True and rows["late.tar.zst"]["reused"] is False
    assert again.returncode == 1 and "1 reused, 1 audited" in again.stderr
    # Other options (another rule selection) are other results: nothing reused.
    other = run_cli("audit", folder, "--results", results, "--ignore", "IV1", "--format", "json", "-q", timeout=300)
    assert not any(row["reused"] for row in json.loads(other.stdout))


def test_a_stored_result_that_is_not_one_or_names_another_archive_is_audited_again(sealed, tmp_path):
    """The store holds the reviewer's own earlier output, read as input all the same: a result that no longer
    follows the report schema, or the genuine result of another archive copied under this archive's name, is not
    a result for it: the archive is audited again, and its verdict is its own."""
    folder = tmp_path / "edited"
    folder.mkdir()
    (folder / "damaged.tar.zst").write_bytes(os.urandom(2048))
    results = tmp_path / "results"
    assert run_cli("audit", folder, "--results", results, "-q").returncode == 1
    stored = next(results.iterdir())
    envelope = json.loads(stored.read_text())
    envelope["report"]["verdict"] = "maybe"  # outside the schema
    stored.write_text(json.dumps(envelope))
    result = run_cli("audit", folder, "--results", results, "--format", "json", "-q")
    row = json.loads(result.stdout)[0]
    assert result.returncode == 1 and row["reused"] is False and row["verdict"] == "fail"
    # A clean archive's genuine result, under the damaged archive's name, names another SHA-256.
    clean = tmp_path / "clean"
    delivery(clean, sealed, copies=1)
    assert run_cli("audit", clean, "--results", tmp_path / "r2", "-q").returncode == 0
    shutil.copy(next((tmp_path / "r2").iterdir()), stored)
    result = run_cli("audit", folder, "--results", results, "--format", "json", "-q")
    assert result.returncode == 1 and json.loads(result.stdout)[0]["reused"] is False
    # Without the copy, the damaged archive's own result is reused, still failing.
    result = run_cli("audit", folder, "--results", results, "--format", "json", "-q")
    assert result.returncode == 1 and json.loads(result.stdout)[0]["reused"] is True


def test_a_list_names_archives_and_what_is_no_archive_is_skipped(sealed, tmp_path):
    folder = delivery(tmp_path / "listed", sealed, copies=2)
    listing = tmp_path / "list.txt"
    listing.write_text(f"# delivered today\n{folder / 'campaign-0.tar.zst'}\n\n{folder / 'notes.txt'}\n"
                       f"{tmp_path / 'missing.tar.zst'}\n{folder / 'campaign-0.tar.zst'}\n")
    result = run_cli("audit", f"@{listing}", "--format", "jsonl", timeout=300)
    rows = rows_of(result.stdout)
    assert result.returncode == 1 and len(rows) == 2  # the archive listed twice is audited once
    missing = next(row for row in rows if row["key"].endswith("missing.tar.zst"))
    assert "no such file" in missing["error"] and "skipped 1 entry, not *.tar.zst archives" in result.stderr


def test_an_audit_killed_by_a_signal_is_one_failed_row_and_the_batch_goes_on(sealed, tmp_path, monkeypatch):
    """A process that dies (the OOM killer, a crash in a library) is a row, never a stopped batch."""
    folder = delivery(tmp_path / "crash", sealed, copies=2)
    shutil.copy(sealed, folder / "crash.tar.zst")
    real = batch_local.audit_entry

    def dies_on_crash(entry, options, store):
        if entry.key == "crash.tar.zst":
            os.kill(os.getpid(), signal.SIGKILL)
        return real(entry, options, store)

    monkeypatch.setattr(batch_local, "audit_entry", dies_on_crash)
    batch = audit_batch(str(folder), settle(reviewer=True, batch_jobs=2))
    rows = {row.key: row for row in batch.rows}
    assert "killed by SIGKILL" in rows["crash.tar.zst"].error and rows["crash.tar.zst"].verdict == "fail"
    assert rows["campaign-0.tar.zst"].verdict == "pass" and rows["nested/campaign-1.tar.zst"].verdict == "pass"
    assert batch.verdict == "fail"


def test_an_audit_past_its_memory_is_stopped_with_what_it_started(sealed, tmp_path, monkeypatch):
    folder = delivery(tmp_path / "memory", sealed, copies=1)
    monkeypatch.setattr(batch_local, "audit_memory", lambda jobs: 1)  # every audit is over it at once
    audit_entry = batch_local.audit_entry

    def lingers(*args, **kwargs):  # an audit quicker than one poll would end before its memory is read
        time.sleep(30)
        return audit_entry(*args, **kwargs)

    monkeypatch.setattr(batch_local, "audit_entry", lingers)
    before = _children()  # what the test session keeps running (a warm reload zygote, a store) is not the batch's
    batch = audit_batch(str(folder), settle(reviewer=True))
    assert len(batch.rows) == 1 and "its memory passed 1 bytes" in batch.rows[0].error
    assert _children() <= before


def _children() -> set[str]:
    return {p.name for p in Path("/proc").iterdir() if p.name.isdigit() and _parent(p) == os.getpid()}


def _parent(proc: Path) -> int | None:
    try:
        stat = (proc / "stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2:].split()[1])


def test_the_api_refuses_a_batch_with_no_archive(tmp_path):
    with pytest.raises(UsageError, match="no \\*.tar.zst archive"):
        audit_batch(str(tmp_path), settle(reviewer=True))


def test_a_single_archive_with_shard_or_results_is_exit_2(sealed, tmp_path):
    result = run_cli("audit", sealed, "--shard", "0/2")
    assert result.returncode == 2 and "not one archive" in result.stderr
