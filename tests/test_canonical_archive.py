"""The archive is canonical (docs/format.md, the sealed archive, issue 23): every header the audit accepts is the one the seal writes for
its member, the archive starts with its top folder, named as the manifest's campaign_id, and everything else is
IV703 before anything is written for it. Each hostile archive is the tool's own sealed archive with one change,
SEAL/SHA256SUMS re-computed so that it lists it: only the header rule can refuse it. GNU tar shows each form is
real: as root it restores the bit, the owner, the folder in the reviewer's home."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from itera_verify.archive import ArchiveReader, format_sums
from itera_verify.archive.canonical import NotCanonical, header as canonical_header
from itera_verify.archive.extract import safe_extract
from itera_verify.archive.tarheader import DIRECTORY, HARDLINK, REGULAR, tar_header
from itera_verify.flows.audit import audit
from itera_verify.model import UsageError
from itera_verify.seal.plan import SEAL_LAYOUT
from tests import tar_forms as tf
from tests.helpers import run_cli, context

pytestmark = [pytest.mark.skipif(not shutil.which("zstd") or not Path(tf.TAR).exists(), reason="GNU tar + zstd"),
              pytest.mark.usefixtures("private_tmp")]  # the audit's private folder in the test's own tmp

CAMPAIGN = "reviews-lora-2026-11"
AS_ROOT = os.geteuid() == 0


@dataclass
class Entry:
    name: str
    typeflag: bytes
    mode: int
    mtime: int
    data: bytes = b""
    linkname: str = ""
    raw: bytes | None = None  # header block(s) as given, instead of the ones the seal writes

    def headers(self) -> bytes:
        if self.raw is not None:
            return self.raw
        return tar_header(self.name, self.typeflag, size=len(self.data), mode=self.mode, mtime=self.mtime,
                          linkname=self.linkname)


def entries_of(sealed: Path) -> list[Entry]:
    """The sealed archive's members, read with the tool's own reader."""
    entries = []
    with open(sealed, "rb") as source, ArchiveReader(source) as reader:
        for member in reader:
            data = b"".join(bytes(piece) for piece in reader.data(member))
            entries.append(Entry(member.name, member.typeflag, member.mode, member.mtime, data, member.linkname))
    return entries


def write(entries: list[Entry], out: Path) -> Path:
    """The entries as a tar.zst, SEAL/SHA256SUMS listing every regular file under its top folder as it is."""
    top = entries[0].name.split("/")[0]
    sums_name = f"{top}/SEAL/SHA256SUMS"
    digests = {e.name.split("/", 1)[1]: hashlib.sha256(e.data).hexdigest() for e in entries
               if e.typeflag == REGULAR and e.name != sums_name and "/" in e.name}
    tar = b""
    for entry in entries:
        if entry.name == sums_name:
            entry = replace(entry, data=format_sums(digests))
        tar += entry.headers() + tf.padded(entry.data)
    out.write_bytes(tf.zst(tar + tf.END))
    return out


def renamed(entries: list[Entry], top: str) -> list[Entry]:
    return [replace(e, name=top + e.name[len(CAMPAIGN):]) for e in entries]


def before_seal(entries: list[Entry], *extra: Entry) -> list[Entry]:
    at = next(i for i, e in enumerate(entries) if e.name.split("/")[1:2] == ["SEAL"])
    return entries[:at] + list(extra) + entries[at:]


def iv7(report) -> list[tuple[str, str]]:
    return [(f.code, f.path) for f in report.findings if f.code.startswith("IV7")]


def extracted_by_the_audit_layer(archive: Path, work: Path):
    """What the audit's extraction writes for this archive (into a folder the test can look at)."""
    root, side = work / "audit-root", work / "audit-side"
    root.mkdir()
    side.mkdir()
    with open(archive, "rb") as source:
        extraction = safe_extract(source, str(root), max_expanded=1 << 30, seal_side=str(side),
                                  reserved=SEAL_LAYOUT)
    return extraction, root


# ---- the Critical finding: the top folder ------------------------------------------------------------------
DOT_FOLDERS = [(".local", "lib/python3.11/site-packages/zz.pth"), (".ssh", "authorized_keys"),
               (".git", "hooks/post-checkout"), (".config", "autostart/x.desktop")]


@pytest.mark.parametrize("top, planted", DOT_FOLDERS)
def test_a_sealed_archive_renamed_into_a_dot_folder_of_home_is_refused_before_anything_is_extracted(
        sealed, tmp_path, top, planted):
    marker = tmp_path / "payload-ran"
    payload = f"import os; open({str(marker)!r}, 'w')\n".encode()  # a .pth line python runs at start-up
    entries = renamed(entries_of(sealed), top)
    entries = before_seal(entries, Entry(f"{top}/{planted}", REGULAR, 0o644, 1_700_000_000, payload))
    (tmp_path / "delivery").mkdir()
    archive = write(entries, tmp_path / "delivery" / f"{CAMPAIGN}.tar.zst")
    # The form is real: GNU tar, run as the README says, writes into the reviewer's home folder.
    home = tmp_path / "gnu-home"
    assert tf.gnu_extract_as_reviewer(archive, home).returncode == 0
    assert (home / top / planted).read_bytes() == payload
    # The audit, run from an empty folder that is also HOME: exit 1, one IV703 naming the folder, nothing written.
    cwd, private = tmp_path / "reviewer", tmp_path / "audit-tmp"
    cwd.mkdir()
    private.mkdir()
    result = run_cli("audit", archive, "--format", "json", cwd=cwd, env={"HOME": str(cwd), "TMPDIR": str(private)},
                     timeout=120)
    document = json.loads(result.stdout)
    assert result.returncode == 1 and document["verdict"] == "fail"
    assert [(f["code"], f["path"]) for f in document["findings"]] == [("IV703", f"{top}/")], document["findings"]
    assert "campaign id" in document["findings"][0]["message"] and not document["audit"]["rechecked"]
    assert list(cwd.iterdir()) == [] and list(private.iterdir()) == []
    extraction, root = extracted_by_the_audit_layer(archive, tmp_path)
    assert isinstance(extraction.error, NotCanonical) and list(root.iterdir()) == [] and extraction.top is None
    assert not marker.exists()


def test_the_archive_must_start_with_its_top_folder(sealed, tmp_path):
    entries = entries_of(sealed)
    archive = write(entries[1:], tmp_path / "a.tar.zst")  # the same members without the folder itself
    report = audit(archive)
    assert iv7(report) == [("IV703", entries[1].name)] and not report.audit["rechecked"]
    assert "start with its top folder" in report.findings[0].message


def test_a_top_folder_that_is_not_the_manifests_campaign_id_is_IV703(sealed, tmp_path):
    archive = write(renamed(entries_of(sealed), "other-campaign"), tmp_path / "a.tar.zst")
    report = audit(archive)
    assert report.audit["rechecked"] and ("IV703", "other-campaign/") in iv7(report)
    assert [f for f in report.findings if f.code == "IV703"][0].message.count(repr(CAMPAIGN)) == 1


@pytest.mark.parametrize("top", ["other", "x" * 129, "-leading-dash", "a b"])
def test_a_member_outside_the_top_folder_or_a_top_folder_no_campaign_could_have_is_IV703(sealed, tmp_path, top):
    marker = tmp_path / "never"
    name = f"{top}/x"
    entries = before_seal(entries_of(sealed), Entry(name, REGULAR, 0o644, 0, b"x"),
                          Entry(".ssh/authorized_keys", REGULAR, 0o644, 0, str(marker).encode()))
    report = audit(write(entries, tmp_path / "a.tar.zst"))
    assert {("IV703", name), ("IV703", ".ssh/authorized_keys")} <= set(iv7(report))
    extraction, root = extracted_by_the_audit_layer(tmp_path / "a.tar.zst", tmp_path)
    assert sorted(os.listdir(root)) == [CAMPAIGN] and not marker.exists()


# ---- the Medium and Low findings: headers the seal never writes -----------------------------------------------
FILE = f"{CAMPAIGN}/analysis/errors.md"
FOLDER = f"{CAMPAIGN}/analysis/"


def _mode(mode: int):
    return lambda e: replace(e, mode=mode)


def _fields(**fields):
    return lambda e: replace(e, raw=tf.with_fields(e.headers(), **fields))


# (member changed, change, what GNU tar as root then restores: (mode, uid, gid) of the extracted entry or None)
HEADERS = {
    "setuid file": (FILE, _mode(0o4755), (0o4755, 0, 0)),
    "setgid file": (FILE, _mode(0o2755), (0o2755, 0, 0)),
    "sticky file": (FILE, _mode(0o1644), (0o1644, 0, 0)),
    "world-writable file": (FILE, _mode(0o666), (0o666, 0, 0)),
    "0777 folder": (FOLDER, _mode(0o777), (0o777, 0, 0)),
    "sticky folder": (FOLDER, _mode(0o1777), (0o1777, 0, 0)),
    "setgid folder": (FOLDER, _mode(0o2755), (0o2755, 0, 0)),
    "uid 65534": (FILE, _fields(uid=65534), (0o644, 65534, 0)),
    "gid 65534": (FILE, _fields(gid=65534), (0o644, 0, 65534)),
    "owner name nobody": (FILE, _fields(uname="nobody"), None),
    "group name": (FOLDER, _fields(gname="nogroup"), None),
    "PAX mtime where ustar fits": (FILE, lambda e: replace(e, raw=tf.extended([("mtime", str(e.mtime))]) +
                                                       e.headers()), None),
}


@pytest.mark.parametrize("case", sorted(HEADERS))
def test_a_header_the_seal_never_writes_is_IV703_and_nothing_is_written_for_it(sealed, tmp_path, case):
    name, change, restored = HEADERS[case]
    entries = [change(e) if e.name == name else e for e in entries_of(sealed)]
    archive = write(entries, tmp_path / "a.tar.zst")
    if restored is not None and AS_ROOT:  # the form is real: GNU tar as root restores it
        home = tmp_path / "gnu-home"
        assert tf.gnu_extract_as_reviewer(archive, home).returncode == 0
        st = os.lstat(home / name)
        assert (st.st_mode & 0o7777, st.st_uid, st.st_gid) == restored
    report = audit(archive)
    refused = [f for f in report.findings if f.code == "IV703"]
    assert report.verdict == "fail" and [f.path for f in refused] == [name], iv7(report)
    assert "the seal" in refused[0].message
    # The rest is re-checked without it (a re-check that fails beside a recorded pass is IV701 too).
    assert {code for code, _ in iv7(report)} <= {"IV703", "IV701"}
    extraction, root = extracted_by_the_audit_layer(archive, tmp_path)
    rel = name.split("/", 1)[1]
    assert rel not in extraction.files
    if name == FILE:
        assert not (root / name).exists()
    else:  # its files are still extracted (and checked): the folder only as the extraction's own private one
        assert os.stat(root / name).st_mode & 0o777 == 0o700


@pytest.mark.parametrize("target", [f"{CAMPAIGN}/analysis/", f"{CAMPAIGN}/analysis/errors.md"])
def test_a_hard_link_the_seal_never_writes_is_IV703(sealed, tmp_path, target):
    """The Low finding: a hard link whose target ends in `/` passed the audit, and GNU tar cannot make it.
    The seal never writes a hard link (every file is written whole): any is refused."""
    name = f"{CAMPAIGN}/analysis/copy.md"
    entries = before_seal(entries_of(sealed), Entry(name, HARDLINK, 0o644, 0, linkname=target))
    archive = write(entries, tmp_path / "a.tar.zst")
    if target.endswith("/"):
        assert tf.gnu_extract_as_reviewer(archive, tmp_path / "gnu-home").returncode != 0
    report = audit(archive)
    assert iv7(report) == [("IV703", name)] and "hard link" in report.findings[0].message


# ---- the control and the seal's side --------------------------------------------------------------------------
def test_every_header_of_the_sealed_archive_is_canonical_and_it_passes(sealed):
    with open(sealed, "rb") as source, ArchiveReader(source) as reader:
        members = [(member.name, member.not_canonical) for member in reader]
    assert members[0] == (f"{CAMPAIGN}/", None) and all(why is None for _, why in members)
    report = audit(sealed)
    assert report.verdict == "pass" and iv7(report) == []


def test_the_writer_cannot_write_a_header_the_audit_would_refuse():
    for kind, mode in [(REGULAR, 0o4755), (REGULAR, 0o600), (DIRECTORY, 0o777), (HARDLINK, 0o644)]:
        name = "top/d/" if kind == DIRECTORY else "top/f"
        with pytest.raises(ValueError):
            canonical_header(name, kind, mode=mode, linkname="top/g" if kind == HARDLINK else "")


def test_the_seal_refuses_a_campaign_id_no_audit_would_accept(package_dir, tmp_path):
    from itera_verify.seal import Sealing

    for campaign in (".local", "a/b", "", "x" * 129):
        with pytest.raises(UsageError, match="top folder"):
            Sealing(context(package_dir), campaign, tmp_path / "a.tar.zst")
