"""The command line's guards, through the real CLI: a report file never lands inside the package, a path the
system cannot name is one line and exit 2, and `itera-verify verify OUTDIR` checks a folder named like a
subcommand."""
from __future__ import annotations

import json
import os
import shutil

import pytest

from tests.helpers import run_cli
from tests.test_cli import tree_state

CAMPAIGN = "reviews-lora-2026-11"


def one_line_error(result) -> str:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stdout[-1500:] + result.stderr[-1500:]
    assert "Traceback" not in result.stderr and lines and lines[-1].startswith("itera-verify: error: "), \
        result.stderr
    return lines[-1]


# ---- --report inside the package ------------------------------------------------------------------------------
def test_report_onto_a_package_file_is_refused_before_any_work(package_dir, tmp_path):
    dest = tmp_path / "dest"
    dest.mkdir()
    before = tree_state(package_dir)
    result = run_cli(package_dir, "--no-reload", "-o", dest, "--report", package_dir / "stops.json")
    assert "would write into the package" in one_line_error(result)
    assert tree_state(package_dir) == before, "the report overwrote a package file"
    assert list(dest.iterdir()) == [], "the package was sealed although the run was refused"


def test_report_format_and_path_in_a_new_folder_inside_the_package_is_refused(package_dir):
    before = tree_state(package_dir)
    result = run_cli(package_dir, "--no-reload", "--no-seal", "--report", f"json={package_dir}/reports/r.json")
    one_line_error(result)
    assert tree_state(package_dir) == before and not (package_dir / "reports").exists()


def test_report_through_a_link_to_a_package_file_is_refused(package_dir, tmp_path):
    link = tmp_path / "report.json"
    link.symlink_to(package_dir / "stops.json")
    before = tree_state(package_dir)
    one_line_error(run_cli(package_dir, "--no-reload", "--no-seal", "--report", link))
    assert tree_state(package_dir) == before


def test_report_under_a_linked_parent_folder_is_refused(package_dir, tmp_path):
    alias = tmp_path / "alias"
    alias.symlink_to(package_dir, target_is_directory=True)
    before = tree_state(package_dir)
    one_line_error(run_cli(package_dir, "--no-reload", "--no-seal", "--report", f"html={alias}/analysis/r.html"))
    assert tree_state(package_dir) == before


def test_report_on_a_hard_link_to_a_package_file_replaces_the_link_not_the_package_file(package_dir, tmp_path):
    outside = tmp_path / "stops-copy.json"
    os.link(package_dir / "stops.json", outside)
    before = tree_state(package_dir)
    result = run_cli(package_dir, "--no-reload", "--no-seal", "--format", "json", "--report", outside)
    assert result.returncode == 0, result.stdout[-1500:] + result.stderr[-1500:]
    assert json.loads(outside.read_text())["tool"] == "itera-verify"
    assert tree_state(package_dir) == before, "the report was written into the package through a hard link"


def test_report_outside_the_package_is_written(package_dir, tmp_path):
    out = tmp_path / "deeper" / "r.html"
    result = run_cli(package_dir, "--no-reload", "--no-seal", "--report", out)
    assert result.returncode == 0 and out.read_text().lstrip().lower().startswith("<!doctype html")
    assert not [p for p in out.parent.iterdir() if p.name != "r.html"], "a partial report file was left behind"


def test_report_to_dev_stdout_through_a_pipe_still_works(package_dir):
    result = run_cli(package_dir, "--no-reload", "--no-seal", "--format", "text", "--report", "json=/dev/stdout")
    assert result.returncode == 0, result.stderr[-1500:]
    assert '"tool": "itera-verify"' in result.stdout


def test_audit_report_onto_the_archive_is_refused_and_the_archive_stays(package_dir, tmp_path):
    dest = tmp_path / "dest"
    dest.mkdir()
    assert run_cli(package_dir, "--no-reload", "-o", dest).returncode == 0
    archive = dest / f"{CAMPAIGN}.tar.zst"
    data = archive.read_bytes()
    one_line_error(run_cli("audit", archive, "--report", f"json={archive}"))
    assert archive.read_bytes() == data


# ---- paths longer than PATH_MAX --------------------------------------------------------------------------------
def nested_chain(base, total_bytes: int = 4200) -> str:
    """Folders of 200-byte names under `base`, made relative to directory fds (no path is ever that long for
    the system call), until the whole path exceeds `total_bytes`; returns the full path."""
    name = "d" * 200
    path = os.fspath(base)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        while len(os.fsencode(path)) <= total_bytes:
            os.mkdir(name, dir_fd=fd)
            inner = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = inner
            path = f"{path}/{name}"
        with open(os.open("notes.txt", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd), "w") as fh:
            fh.write("deep\n")
    finally:
        os.close(fd)
    return path


def test_a_folder_chain_beyond_path_max_inside_the_package_is_one_line_exit_2(package_dir):
    nested_chain(package_dir / "analysis")
    line = one_line_error(run_cli(package_dir, "--no-reload", "--no-seal"))
    assert "path too long" in line and len(line) < 400


def test_a_package_path_beyond_path_max_is_one_line_exit_2(tmp_path):
    holder = tmp_path / "holder"
    holder.mkdir()
    deep = nested_chain(holder)
    line = one_line_error(run_cli(deep, "--no-reload", "--no-seal"))
    assert "path too long" in line and len(line) < 400


def test_init_into_a_path_beyond_path_max_is_one_line_exit_2(tmp_path):
    holder = tmp_path / "holder"
    holder.mkdir()
    line = one_line_error(run_cli("init", nested_chain(holder) + "/new"))
    assert "too long" in line.lower() and len(line) < 400


# ---- `verify` names the check unambiguously ---------------------------------------------------------------------
@pytest.mark.parametrize("name", ["rules", "audit", "init"])
def test_verify_checks_a_folder_named_like_a_subcommand(package_dir, tmp_path, name):
    work = tmp_path / "work"
    work.mkdir()
    shutil.copytree(package_dir, work / name, symlinks=True)
    result = run_cli("verify", name, "--no-reload", "--no-seal", cwd=work)
    assert result.returncode == 0, result.stdout[-1500:] + result.stderr[-1500:]
    assert result.stdout.strip().splitlines()[-1].startswith("PASS")


def test_bare_rules_still_lists_the_rules_and_points_at_verify_for_a_folder_so_named(package_dir, tmp_path):
    shutil.copytree(package_dir, tmp_path / "rules", symlinks=True)
    result = run_cli("rules", cwd=tmp_path)
    assert result.returncode == 0 and "IV101" in result.stdout
    assert "itera-verify verify rules" in result.stderr


def test_bare_form_still_checks_a_folder(package_dir):
    result = run_cli(package_dir, "--no-reload", "--no-seal")
    assert result.returncode == 0 and result.stdout.strip().splitlines()[-1].startswith("PASS")
