"""-o: a trailing slash or an existing folder is a folder (the last component created when missing), a name ending
in .tar.zst is the archive's file, anything else is exit 2 before any work. A user's `-o ../sealed/` once wrote a
file named `sealed` (zstd data, no .tar.zst) and a verdict saying "sealed sealed"."""
from __future__ import annotations

import os

from tests.helpers import run_cli

CAMPAIGN = "reviews-lora-2026-11"
ARCHIVE = f"{CAMPAIGN}.tar.zst"


def sealed(package_dir, output: str, cwd):
    result = run_cli(package_dir, "--no-reload", "-q", "-o", output, cwd=cwd)
    assert result.returncode == 0, result.stdout[-1500:] + result.stderr[-1500:]
    return result


def refused(package_dir, output: str, cwd) -> str:
    result = run_cli(package_dir, "--no-reload", "-o", output, cwd=cwd)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stdout[-1500:] + result.stderr
    # Refused before any work: the only line on stderr is the error, no progress of a check.
    assert len(lines) == 1 and lines[0].startswith("itera-verify: error: "), result.stderr
    return lines[0]


def test_a_missing_folder_with_a_trailing_slash_is_created_and_holds_the_archive(package_dir, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    result = sealed(package_dir, "../sealed/", work)
    assert sorted(os.listdir(tmp_path / "sealed")) == [ARCHIVE, f"{ARCHIVE}.sha256"]
    assert not (tmp_path / "sealed").is_file()
    assert result.stdout.splitlines()[-1].endswith(f"sealed {ARCHIVE}"), result.stdout


def test_an_existing_folder_without_a_slash_holds_the_archive(package_dir, tmp_path):
    (tmp_path / "out").mkdir()
    sealed(package_dir, "out", tmp_path)
    assert (tmp_path / "out" / ARCHIVE).is_file()


def test_a_tar_zst_name_is_the_archive_file(package_dir, tmp_path):
    sealed(package_dir, "review.tar.zst", tmp_path)
    assert (tmp_path / "review.tar.zst").is_file() and (tmp_path / "review.tar.zst.sha256").is_file()


def test_a_folder_whose_parent_is_missing_is_exit_2_and_nothing_is_created(package_dir, tmp_path):
    line = refused(package_dir, "no/such/sealed/", tmp_path)
    assert "no such folder no/such" in line and "only the last folder" in line
    assert not (tmp_path / "no").exists()


def test_a_name_without_slash_or_tar_zst_is_exit_2_naming_both_spellings(package_dir, tmp_path):
    line = refused(package_dir, "sealed", tmp_path)
    assert "'sealed/'" in line and "'sealed.tar.zst'" in line
    assert os.listdir(tmp_path) == ["pkg"], "nothing is written for a refused -o"


def test_a_file_named_as_a_folder_is_exit_2(package_dir, tmp_path):
    (tmp_path / "notes").write_text("x")
    assert "exists and is not a folder" in refused(package_dir, "notes/", tmp_path)


def test_a_new_folder_inside_the_package_is_refused_and_not_created(package_dir, tmp_path):
    assert "inside the package" in refused(package_dir, str(package_dir / "sealed") + "/", tmp_path)
    assert not (package_dir / "sealed").exists()


def test_no_seal_ignores_the_output(package_dir, tmp_path):
    result = run_cli(package_dir, "--no-reload", "--no-seal", "-o", "sealed", cwd=tmp_path)
    assert result.returncode == 0 and not (tmp_path / "sealed").exists(), result.stderr
