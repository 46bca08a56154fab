"""The audit against GNU tar 1.34 (issue 14): the members the audit accepts are exactly the members GNU tar
lists and extracts, byte for byte; an archive they would read differently is refused (IV703, the member
named, nothing re-checked). Real GNU tar, real sealed archives, payloads that would write a marker file."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from itera_verify.archive import ArchiveReader
from itera_verify.archive.profile import OutsideProfile
from itera_verify.flows.audit import audit
from tests import tar_forms as tf
from tests.fuzz.tar_differential import compare_with_gnu, differential_property, tar_streams

pytestmark = [pytest.mark.skipif(not shutil.which("zstd") or not Path(tf.TAR).exists(), reason="GNU tar + zstd"),
              pytest.mark.usefixtures("private_tmp")]  # the audit's private folder in the test's own tmp

CAMPAIGN = "reviews-lora-2026-11"
VICTIM = f"{CAMPAIGN}/checkpoints/lora-r16/resume.pt"


def test_the_control_archive_audits_clean_and_reads_as_gnu_tar_reads_it(sealed, tmp_path):
    report = audit(sealed)
    assert report.verdict == "pass", [f.to_json() for f in report.findings]
    assert compare_with_gnu(sealed, tmp_path)  # accepted, and the same members and bytes as GNU tar's


def test_zstd_piped_into_tar_extracts_what_tar_zstd_does(sealed, tmp_path):
    (tmp_path / "piped").mkdir()
    piped = subprocess.run(f"zstd -dc '{sealed}' | {tf.TAR} -x -C '{tmp_path / 'piped'}'", shell=True,
                           capture_output=True)
    assert piped.returncode == 0 and tf.gnu_extract(sealed, tmp_path / "direct") == 0
    assert tf.tree(tmp_path / "piped") == tf.tree(tmp_path / "direct")


def test_the_command_line_refuses_a_renaming_form_with_one_IV703(sealed, tmp_path):
    import json

    from tests.helpers import run_cli

    archive = tf.attack(sealed, tmp_path / "a.tar.zst", "pax-path-and-gnu-long-name", tmp_path / "payload-ran")
    result = run_cli("audit", archive, "--format", "json", timeout=120)
    document = json.loads(result.stdout)
    assert result.returncode == 1 and document["verdict"] == "fail"
    assert [(f["code"], f["path"]) for f in document["findings"]] == [("IV703", VICTIM)]
    assert not (tmp_path / "payload-ran").exists()


def _load_like_a_reviewer(path: Path) -> None:
    """torch.load as a careful reviewer would (weights_only=True): refused, and the payload never runs."""
    import pickle

    import torch

    with pytest.raises(pickle.UnpicklingError):
        torch.load(path, weights_only=True)


@pytest.mark.parametrize("placement", ["SEAL", "package"])
@pytest.mark.parametrize("form", tf.FORMS)
def test_each_form_that_renamed_members_for_gnu_tar_is_refused_as_IV703(sealed, tmp_path, form, placement):
    marker = tmp_path / "payload-ran"
    names = ("SEAL/zz1", "SEAL/zz2") if placement == "SEAL" else ("analysis/zz1.md", "analysis/zz2.md")
    archive = tf.attack(sealed, tmp_path / f"{form}.tar.zst", form, marker, audit_names=names)
    # The form is real: GNU tar extracts the pickle as resume.pt, and sha256sum -c passes on what it extracted.
    gnu = tmp_path / "gnu"
    assert tf.gnu_extract(archive, gnu) == 0
    assert (gnu / VICTIM).read_bytes() == tf.payload_pickle(marker)
    assert subprocess.run(["sha256sum", "-c", "--quiet", "SEAL/SHA256SUMS"], cwd=gnu / CAMPAIGN,
                          capture_output=True).returncode == 0
    report = audit(archive)
    assert report.verdict == "fail" and not report.audit["rechecked"]
    refused = [f for f in report.findings if f.code == "IV703"]
    assert len(refused) == 1 and refused[0].path in {f"{CAMPAIGN}/{names[0]}", f"{CAMPAIGN}/{names[0]}/", VICTIM}
    _load_like_a_reviewer(gnu / VICTIM)
    assert not marker.exists()


def _read(tar: bytes) -> list[str]:
    with ArchiveReader(__import__("io").BytesIO(tf.zst(tar))) as reader:
        return [member.name for member in reader]


TOP = tf.header(b"top/", b"5", mode=0o755)
OUTSIDE = {
    "GNU long link name": tf.gnu_long("top/target", b"K") + tf.header(b"top/l", b"2", linkname=b"t"),
    "global header": tf.extended([("comment", "x")], b"g") + tf.regular("top/a", b"a"),
    "sparse member": tf.header(b"top/s", b"S", size=0),
    "typeflag NUL": tf.header(b"top/n", b"\0", size=0),
    "contiguous file": tf.header(b"top/c", b"7", size=0),
    "Solaris extended header": tf.extended([("path", "top/p")], b"X") + tf.regular("top/a", b"a"),
    "unknown PAX key": tf.extended([("path", "top/a"), ("SCHILY.xattr.user.x", "1")]) + tf.regular("top/a", b"a"),
    "sparse PAX key": tf.extended([("GNU.sparse.size", "3")]) + tf.regular("top/a", b"abc"),
    "repeated PAX key": tf.extended([("path", "top/a"), ("path", "top/b")]) + tf.regular("top/a", b"a"),
    "NUL in a PAX path": tf.extended([("path", "top/a\0b")]) + tf.regular("top/a", b"a"),
    "empty PAX path": tf.extended([("path", "")]) + tf.regular("top/a", b"a"),
    "two extended headers": tf.extended([("path", "top/a")]) + tf.extended([("path", "top/b")]) +
    tf.regular("top/a", b"a"),
    "base-256 size": tf.header(b"top/a", b"0", size_field=b"\x80" + (3).to_bytes(11, "big")) + tf.padded(b"abc"),
    "size after a leading NUL": tf.header(b"top/a", b"0", size_field=b"\0" + b"%010o\0" % 3) + tf.padded(b"abc"),
    "ustar prefix": tf.header(b"a", b"0", prefix=b"top", size=0),
    "old GNU magic": tf.header(b"top/a", b"0", magic=b"ustar  \0"),
    "no magic (v7)": tf.header(b"top/a", b"0", magic=bytes(8)),
    "regular file named like a folder": tf.regular("top/a/", b""),
    "folder named like a file": tf.header(b"top/d", b"5", mode=0o755),
    "symlink with data": tf.header(b"top/l", b"2", size=3, linkname=b"a") + tf.padded(b"abc"),
    "folder with data": tf.header(b"top/d/", b"5", size=3) + tf.padded(b"abc"),
    "hard link with data": tf.regular("top/a", b"a") + tf.header(b"top/h", b"1", size=1, linkname=b"top/a") +
    tf.padded(b"x"),
    "PAX size on a folder": tf.extended([("size", "0")]) + tf.header(b"top/d/", b"5"),
    "link target on a file": tf.header(b"top/a", b"0", linkname=b"top/b"),
    "PAX mtime out of GNU tar's range": tf.extended([("mtime", "9" * 20)]) + tf.regular("top/a", b"a"),
    "PAX size with a space": tf.extended([("size", "3 ")]) + tf.regular("top/a", b"abc"),
    "bytes hidden after the name": tf.header(b"top/a\0hidden", b"0"),
}


@pytest.mark.parametrize("case", sorted(OUTSIDE))
def test_a_header_outside_the_seals_profile_refuses_the_stream(case):
    assert _read(TOP + tf.regular("top/ok", b"ok") + tf.END)  # the same stream without it reads
    with pytest.raises(OutsideProfile) as raised:
        _read(TOP + OUTSIDE[case] + tf.regular("top/ok", b"ok") + tf.END)
    assert raised.value.member.startswith("top/"), raised.value.member


def test_an_extended_header_just_before_the_end_of_the_archive_is_refused():
    with pytest.raises(OutsideProfile, match="followed by the end"):
        _read(TOP + tf.extended([("path", "top/a")]) + tf.END)


def test_the_leading_nul_size_is_a_real_difference_gnu_tar_would_read(tmp_path):
    """GNU tar skips a leading NUL in a number (`where += !*where`): the old reader read size 0 there, and the
    member's data (a header) as the next member."""
    hidden = tf.regular("top/hidden.pt", b"payload")
    tar = TOP + tf.header(b"top/a", b"0", size_field=b"\0" + b"%010o\0" % len(hidden)) + hidden + tf.END
    archive = tmp_path / "a.tar.zst"
    archive.write_bytes(tf.zst(tar))
    rc, listed = tf.gnu_listing(archive)
    assert rc == 0 and listed == ["top/", "top/a"]  # GNU tar: hidden.pt is a's data
    with pytest.raises(OutsideProfile):
        _read(tar)


def test_names_the_writer_makes_through_pax_read_as_gnu_tar_reads_them(tmp_path):
    """The writer's own PAX forms (long, non-ASCII, non-UTF-8 names, long link targets, a 100-byte truncation
    ending in /) are accepted and read exactly as GNU tar reads them."""
    from itera_verify.archive.canonical import header as tar_header  # the writer's headers, modes included
    from itera_verify.archive.tarheader import DIRECTORY, REGULAR, SYMLINK

    tricky = "top/" + "x" * 95 + "/y" * 4  # its 100-byte ustar truncation ends in "/": only the PAX path counts
    members = [tar_header("top/", DIRECTORY), tar_header("top/" + "d" * 120 + "/", DIRECTORY)]
    for name, data in [(tricky, b"t"), ("top/é/ünï.txt", b"u"), ("top/bad\udcff.bin", b"b"), ("top/a", b"a")]:
        members.append(tar_header(name, REGULAR, size=len(data)) + tf.padded(data))
    members.append(tar_header("top/link", SYMLINK, linkname="a" + "/." * 70))
    archive = tmp_path / "a.tar.zst"
    archive.write_bytes(tf.zst(b"".join(members) + tf.END))
    assert compare_with_gnu(archive, tmp_path)


@pytest.mark.slow
@settings(max_examples=400, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@pytest.mark.slow
@given(tar_streams())
def test_fuzzed_archives_the_audit_accepts_are_what_gnu_tar_extracts(data):
    differential_property(None, data)  # what `make fuzz` runs at 10,000 inputs


@settings(max_examples=300, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(st.lists(st.text(st.characters(blacklist_characters="\0/"), min_size=1, max_size=160)
                .filter(lambda n: n not in (".", "..")), unique=True, min_size=1, max_size=5),
       st.sampled_from([0, 1_700_000_000, -86_400, 8 ** 11, 2 ** 40]), st.sampled_from([0, 5, 9 << 30]))
def test_everything_the_writer_writes_is_inside_the_profile(names, mtime, big):
    """The seal reads its own archive back through the same reader: the profile must hold every name, link
    target, time and size the writer can emit (non-UTF-8 names included)."""
    from itera_verify.archive.tarheader import DIRECTORY, REGULAR, SYMLINK, tar_header

    tar = tar_header("top/", DIRECTORY, mode=0o755, mtime=mtime)
    for index, rel in enumerate(names):
        rel = rel.encode("utf-8", "surrogatepass").decode("utf-8", "surrogateescape")  # as os.listdir names it
        name = "top/" + rel
        if index % 3 == 0:
            tar += tar_header(name + "/", DIRECTORY, mode=0o755, mtime=mtime)
        elif index % 3 == 1:
            tar += tar_header(name, SYMLINK, mode=0o777, mtime=mtime, linkname=rel * 2)
        else:
            tar += tar_header(name, REGULAR, size=3, mtime=mtime) + tf.padded(b"abc")
    header = tar_header("top/big", REGULAR, size=big, mtime=mtime)
    with ArchiveReader(__import__("io").BytesIO(tf.zst(tar + header + (tf.padded(bytes(big)) if big < 512 else bytes(512)) + tf.END))) as reader:
        try:
            read = [(member.name, member.size) for member in reader]
        except Exception as error:  # noqa: BLE001 — the 9 GiB member ends early: Truncated, never OutsideProfile
            assert not isinstance(error, OutsideProfile), error
            read = None
    assert (read is None) == (big > 512)
    if read is not None:
        assert len(read) == len(names) + 2 and read[-1] == ("top/big", big)
