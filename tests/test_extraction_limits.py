"""What one archive may cost the audit's extraction (archive/extract.py): members, links, and names that a
case-insensitive disk would merge. Each archive is written with the seal's own headers (tests/redteam4_forms.py)
and extracted for real."""
from __future__ import annotations

import os
import unicodedata
from pathlib import Path

import pytest

from itera_verify.archive.extract import MAX_LINKS, MEMBER_BYTES, MIN_MEMBERS, member_limit, safe_extract
from tests.redteam4_forms import Member, write_archive


def extract(archive: Path, root: Path, max_expanded: int = 1 << 30):
    root.mkdir()
    with open(archive, "rb") as source:
        return safe_extract(source, str(root), max_expanded=max_expanded)


def empty_files(path: Path, count: int) -> Path:
    listed = [Member("", "directory"), Member("d", "directory")] + [Member(f"d/{i:06d}", "file") for i in range(count)]
    return write_archive(path, "top", listed, sums=False)


def test_the_member_limit_is_one_per_32_kib_of_the_expanded_size_and_at_least_4096():
    assert member_limit(1 << 30) == 32_768 and member_limit(1 << 20) == MIN_MEMBERS == 4096
    assert member_limit(5000 * MEMBER_BYTES) == 5000 and member_limit(None) is None


@pytest.mark.parametrize("count, refused", [(4998, False), (4999, True)])
def test_an_archive_one_member_past_its_limit_is_refused_there(tmp_path, count, refused):
    """With room for 5,000 members (the top folder and `d` among them), the 5,001st stops the stream."""
    result = extract(empty_files(tmp_path / "a.tar.zst", count), tmp_path / "x", max_expanded=5000 * MEMBER_BYTES)
    assert (result.error is not None and result.error.kind == "too-many") is refused
    assert result.members == count + 2 and ("more than 5000 members" in str(result.error) if refused else True)


@pytest.mark.slow
def test_an_archive_of_20000_files_is_within_the_smallest_default_limit(tmp_path):
    result = extract(empty_files(tmp_path / "a.tar.zst", 20_000), tmp_path / "x")
    assert result.error is None and len(result.files) == 20_000 and not result.refused


@pytest.mark.slow
def test_links_past_the_cap_are_refused_and_not_extracted(tmp_path):
    listed = [Member("", "directory"), Member("f", "file", b"x")]
    listed += [Member(f"l{i:05d}", "symlink", link="f") for i in range(MAX_LINKS + 2)]
    result = extract(write_archive(tmp_path / "a.tar.zst", "top", listed, sums=False), tmp_path / "x")
    assert [name for name, _ in result.refused] == [f"top/l{i:05d}" for i in (MAX_LINKS, MAX_LINKS + 1)]
    assert f"more than {MAX_LINKS} links" in result.refused[0][1]
    assert not os.path.lexists(tmp_path / "x" / "top" / f"l{MAX_LINKS:05d}")


def test_a_chain_of_41_links_inside_the_package_is_refused_as_too_many_levels(tmp_path):
    listed = [Member("", "directory")] + [Member(f"{i:02d}", "symlink", link=f"{i + 1:02d}") for i in range(41)]
    listed.append(Member("41", "file", b"end\n"))
    result = extract(write_archive(tmp_path / "a.tar.zst", "top", listed, sums=False), tmp_path / "x")
    assert [(name, "too many levels of links" in why) for name, why in result.refused] == [("top/00", True)]
    assert not os.path.lexists(tmp_path / "x" / "top" / "00") and os.path.islink(tmp_path / "x" / "top" / "01")


@pytest.mark.parametrize("first, second, twin", [
    ("artifacts/control.safetensors", "artifacts/Control.safetensors", "artifacts/control.safetensors"),
    ("analysis/" + unicodedata.normalize("NFC", "résumé.md"), "analysis/" + unicodedata.normalize("NFD", "résumé.md"),
     "analysis/" + unicodedata.normalize("NFC", "résumé.md")),
    ("Plots/a.md", "plots/b.md", "Plots"),  # two folders one disk keeps apart and another merges
])
def test_the_second_of_two_names_a_case_insensitive_disk_merges_is_refused_naming_the_first(tmp_path, first, second,
                                                                                           twin):
    listed = [Member("", "directory")]
    for name in (first, second):
        folder = name.rsplit("/", 1)[0]
        if not any(m.name == folder for m in listed):
            listed.append(Member(folder, "directory"))
        listed.append(Member(name, "file", name.encode()))
    result = extract(write_archive(tmp_path / "a.tar.zst", "top", listed, sums=False), tmp_path / "x")
    assert f"top/{second}" in [name for name, _ in result.refused] and first in result.files
    assert all(f"differs from top/{twin} only in case or Unicode normalisation" in why for _, why in result.refused)
