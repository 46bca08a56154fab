"""Every member is scanned and every member is signed (issue 35 item 3; docs/format.md, signatures): SEAL/statement.json,
its .sig and SEAL/model.sig are scanned like every file (IV506); a statement without its signature and a model.sig
that is no JSON Sigstore bundle are refused (IV802); with --allowed-signers every member `tar -xf` would write, and
every byte of the zstd stream, must be covered by what the allowed signer signed, with or without `<archive>.sig`.

Seals are made by the tool with a real key file from ssh-keygen; hostile archives are the sealed ones rewritten by
the seal's own writer (so only the rule under test can refuse them) or with bytes appended; GNU tar shows what a
reviewer's `tar -xf` would write."""
from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from itera_verify import verify
from itera_verify.archive import ArchiveReader, ArchiveWriter
from itera_verify.archive.zstdframes import FrameScanner
from itera_verify.flows.audit import audit
from itera_verify.format.names import OMS_SIGNATURE, STATEMENT, STATEMENT_SIG
from itera_verify.format.statement import NAMESPACE
from tests.tar_forms import gnu_extract, payload_pickle
from tests.test_signatures import allowed_signers, keygen, members_of, openssh_verifies
from itera_verify import settle

pytestmark = [pytest.mark.usefixtures("private_tmp"),
              pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="needs OpenSSH's ssh-keygen")]

CAMPAIGN = "reviews-lora-2026-11"
# A JSON Sigstore bundle in shape (what model-signing writes), signed by nobody the reviewer knows.
FORGED_BUNDLE = json.dumps({
    "mediaType": "application/vnd.dev.sigstore.bundle.v0.3+json",
    "verificationMaterial": {"publicKey": {"hint": "0" * 64}, "tlogEntries": []},
    "dsseEnvelope": {"payload": "e30=", "payloadType": "application/vnd.in-toto+json",
                     "signatures": [{"sig": "AAAA"}]}}).encode()


@pytest.fixture(scope="module")
def alice(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("alice")
    key = keygen(folder, "alice")
    return {"key": key, "allowed": allowed_signers(folder / "allowed", ("alice@example.com", key.with_suffix(".pub")))}


@pytest.fixture(scope="module")
def signed(built, alice, tmp_path_factory) -> Path:
    """The example package sealed with --sign ssh:alice (a private key file), once for this module."""
    folder = tmp_path_factory.mktemp("signed-members")
    shutil.copytree(built["package"], folder / "pkg", symlinks=True)
    report = verify(folder / "pkg", settle(reload=False, output=folder, sign=f"ssh:{alice['key']}"))
    assert report.sealed, [f.to_json() for f in report.findings]
    return folder / f"{CAMPAIGN}.tar.zst"


def rebuild(archive: Path, out: Path, *, replace: dict[str, bytes] | None = None, add: dict[str, bytes] | None = None,
            drop: tuple[str, ...] = (), links: dict[str, str] | None = None, folders: tuple[str, ...] = (),
            executable: tuple[str, ...] = ()) -> Path:
    """`archive` written again by the seal's own writer (canonical headers: only the rule under test refuses it),
    names under the top folder: files replaced, added or dropped, links and folders added, files made 0755.
    SHA256SUMS is left as it is. The `.sig` beside is not copied: a courier drops it."""
    replace, add, links = replace or {}, add or {}, links or {}
    with open(archive, "rb") as source, ArchiveReader(source) as reader:
        entries = [(m, b"".join(bytes(p) for p in reader.data(m)) if m.kind == "file" else None) for m in reader]
    with open(out, "wb") as target:
        writer = ArchiveWriter(target)
        for member, data in entries:
            rel = member.name.split("/", 1)[1].rstrip("/")
            if rel in drop:
                continue
            if member.kind == "directory":
                writer.add_directory(member.name, mtime=member.mtime)
            elif member.kind == "symlink":
                writer.add_symlink(member.name, member.linkname, mtime=member.mtime)
            else:
                writer.add_bytes(member.name, replace.get(rel, data), mtime=member.mtime,
                                 mode=0o755 if rel in executable else member.mode)
        for rel in folders:
            writer.add_directory(f"{CAMPAIGN}/{rel}", mtime=1)
        for rel, target_name in links.items():
            writer.add_symlink(f"{CAMPAIGN}/{rel}", target_name, mtime=1)
        for rel, data in add.items():
            writer.add_bytes(f"{CAMPAIGN}/{rel}", data, mtime=1)
        writer.close()
    return out


def codes_at(report) -> set[tuple[str, str]]:
    return {(f.code, f.path) for f in report.findings}


def iv802(report) -> list[str]:
    return [f.message for f in report.findings if f.code == "IV802"]


# ---- the clean case ------------------------------------------------------------------------------------------
def test_a_clean_signed_archive_passes_with_or_without_its_sig_and_openssh_verifies_its_statement(signed, alice,
                                                                                                   tmp_path):
    report = audit(signed, settle(reviewer=True, allowed_signers=alice["allowed"], signer="alice@example.com"))
    assert report.verdict == "pass" and report.audit["signature"]["uncovered"] == [], \
        [f.to_json() for f in report.findings]
    members = members_of(signed)
    statement = json.loads(members[f"{CAMPAIGN}/{STATEMENT}"])
    assert statement["sha256"][OMS_SIGNATURE] is None and statement["members"]["count"] == len(
        [n for n in _names(signed) if not n.endswith((STATEMENT, STATEMENT_SIG))])
    (tmp_path / "statement.sig").write_bytes(members[f"{CAMPAIGN}/{STATEMENT_SIG}"])
    done = openssh_verifies(alice["allowed"], "alice@example.com", tmp_path / "statement.sig",
                            members[f"{CAMPAIGN}/{STATEMENT}"])
    assert done.returncode == 0, done.stderr
    # The statement alone covers every member: the same bytes without the optional .sig beside pass too.
    alone = tmp_path / signed.name
    shutil.copy(signed, alone)
    assert audit(alone, settle(reviewer=True, allowed_signers=alice["allowed"], signer="alice@example.com")).verdict == "pass"


def _names(archive: Path) -> list[str]:
    with open(archive, "rb") as source, ArchiveReader(source) as reader:
        return [m.name for m in reader]


# ---- the cases ---------------------------------------------------------------------------------------
def test_a_pickle_added_as_SEAL_statement_json_to_an_unsigned_archive_is_IV506_and_refused(sealed, tmp_path):
    marker = tmp_path / "payload-ran"
    hostile = rebuild(sealed, tmp_path / sealed.name, add={STATEMENT: payload_pickle(marker)})
    report = audit(hostile)
    name = f"{CAMPAIGN}/{STATEMENT}"
    assert report.verdict == "fail"
    assert ("IV506", name) in codes_at(report) and ("IV802", name) in codes_at(report)
    assert any("builtins.open" in f.message or "io.open" in f.message for f in report.findings if f.code == "IV506")
    assert any("statement.json.sig is missing" in m for m in iv802(report))
    assert not marker.exists()


def test_a_pickle_added_as_SEAL_model_sig_to_a_signed_archive_is_IV506_and_IV802(signed, alice, tmp_path):
    marker = tmp_path / "payload-ran"
    hostile = rebuild(signed, tmp_path / signed.name, add={OMS_SIGNATURE: payload_pickle(marker)})
    name = f"{CAMPAIGN}/{OMS_SIGNATURE}"
    for options in ({}, {"allowed_signers": alice["allowed"], "signer": "alice@example.com"}):
        report = audit(hostile, settle(reviewer=True, **options))
        assert report.verdict == "fail"
        assert ("IV506", name) in codes_at(report) and ("IV802", name) in codes_at(report), options
        assert any("not a JSON Sigstore bundle" in m for m in iv802(report))
    assert not marker.exists()


def test_dropping_the_archive_sig_and_adding_a_model_sig_is_IV802_under_allowed_signers(signed, alice, tmp_path):
    """The issue's High: no `.sig` beside, a well-formed bundle added as SEAL/model.sig. GNU tar writes it; the
    statement Alice signed says the seal wrote no model.sig."""
    hostile = rebuild(signed, tmp_path / signed.name, add={OMS_SIGNATURE: FORGED_BUNDLE})
    assert not hostile.with_name(hostile.name + ".sig").exists()
    assert gnu_extract(hostile, tmp_path / "x") == 0
    assert (tmp_path / "x" / CAMPAIGN / OMS_SIGNATURE).read_bytes() == FORGED_BUNDLE
    report = audit(hostile, settle(reviewer=True, allowed_signers=alice["allowed"], signer="alice@example.com"))
    assert report.verdict == "fail" and {f.code for f in report.findings} == {"IV802"}, \
        [f.to_json() for f in report.findings]
    messages = " ".join(iv802(report))
    assert "SEAL/model.sig is in the archive but the statement signs none" in messages
    assert "members are not the ones signed" in messages


@pytest.mark.parametrize("where", ["after the last frame", "before the first frame"])
def test_a_skippable_frame_with_content_is_IV802_under_allowed_signers_and_IV703_without(signed, alice, tmp_path,
                                                                                         where):
    payload = b"PK\x03\x04" + b"a second file format riding along" * 8
    frame = (0x184D2A57).to_bytes(4, "little") + len(payload).to_bytes(4, "little") + payload
    hostile = tmp_path / signed.name
    hostile.write_bytes(signed.read_bytes() + frame if where.startswith("after") else frame + signed.read_bytes())
    assert subprocess.run(["zstd", "-t", "-q", str(hostile)]).returncode == 0  # valid zstd all the same
    report = audit(hostile)
    assert report.verdict == "fail" and [f.code for f in report.findings] == ["IV703"]
    assert f"1 skippable zstd frame(s) holding {len(payload)} bytes" in report.findings[0].message
    report = audit(hostile, settle(reviewer=True, allowed_signers=alice["allowed"]))
    assert {f.code for f in report.findings} == {"IV703", "IV802"}
    assert any("skippable zstd frame" in m for m in iv802(report))
    # an empty skippable frame carries nothing: no finding
    empty = tmp_path / "empty" / signed.name
    empty.parent.mkdir()
    empty.write_bytes(signed.read_bytes() + (0x184D2A50).to_bytes(4, "little") + bytes(4))
    assert audit(empty, settle(reviewer=True, allowed_signers=alice["allowed"])).verdict == "pass"


def test_the_frame_scanner_counts_the_skippable_frames_with_content():
    import zstandard

    data = zstandard.ZstdCompressor().compress(b"x" * 100)
    frame = (0x184D2A5F).to_bytes(4, "little") + (3).to_bytes(4, "little") + b"abc"
    empty = (0x184D2A50).to_bytes(4, "little") + bytes(4)
    scanner = FrameScanner()
    stream = data + frame + empty + data + frame
    for i in range(0, len(stream), 5):  # fed in small pieces, as a bucket's stream arrives
        scanner.feed(stream[i:i + 5])
    scanner.finish()
    assert (scanner.skippable.frames, scanner.skippable.bytes, scanner.skippable.first) == (2, 6, len(data))


def test_an_extra_member_not_in_SHA256SUMS_is_IV702_and_IV802_under_allowed_signers(signed, alice, tmp_path):
    hostile = rebuild(signed, tmp_path / signed.name, add={"analysis/extra.md": b"# signed by nobody\n"})
    report = audit(hostile, settle(reviewer=True, allowed_signers=alice["allowed"]))
    assert ("IV702", f"{CAMPAIGN}/analysis/extra.md") in codes_at(report)
    assert any("not in the signed SHA256SUMS: analysis/extra.md" in m for m in iv802(report))


@pytest.mark.parametrize("change", ["a link", "an empty folder", "an executable bit", "a dropped folder"])
def test_a_link_a_folder_or_a_mode_changed_in_a_signed_archive_is_IV802(signed, alice, tmp_path, change):
    """SHA256SUMS lists regular files only: the signed member listing binds what else `tar -xf` writes."""
    options = {"a link": {"links": {"analysis/latest": "errors.md"}},
               "an empty folder": {"folders": ("analysis/more",)},
               "an executable bit": {"executable": ("analysis/errors.md",)},
               "a dropped folder": {"drop": ("analysis",)}}[change]  # the files beneath stay: tar makes it anyway
    hostile = rebuild(signed, tmp_path / signed.name, **options)
    unsigned = audit(hostile)  # nothing else sees these: only the signed listing does
    assert {f.code for f in unsigned.findings} == {"IV802"}, [f.to_json() for f in unsigned.findings]
    report = audit(hostile, settle(reviewer=True, allowed_signers=alice["allowed"], signer="alice@example.com"))
    assert report.verdict == "fail" and any("members are not the ones signed" in m for m in iv802(report))


def test_a_statement_without_its_sig_is_IV802_and_IV801_when_a_signer_is_required(signed, alice, tmp_path):
    hostile = rebuild(signed, tmp_path / signed.name, drop=(STATEMENT_SIG,))
    report = audit(hostile)
    assert [f.code for f in report.findings] == ["IV802"]
    assert "statement.json.sig is missing" in report.findings[0].message
    report = audit(hostile, settle(reviewer=True, allowed_signers=alice["allowed"]))
    assert {f.code for f in report.findings} == {"IV801", "IV802"}


@pytest.mark.parametrize("bundle", [b"not json", b"[]", b"{}", FORGED_BUNDLE.replace(b"mediaType", b"mediatype"),
                                    json.dumps({**json.loads(FORGED_BUNDLE), "payload": "x"}).encode(),
                                    json.dumps({**json.loads(FORGED_BUNDLE), "messageSignature": {}}).encode()])
def test_a_model_sig_that_is_not_a_JSON_sigstore_bundle_is_IV802(sealed, tmp_path, bundle):
    hostile = rebuild(sealed, tmp_path / sealed.name, add={OMS_SIGNATURE: bundle})
    report = audit(hostile)
    assert [(f.code, f.path) for f in report.findings] == [("IV802", f"{CAMPAIGN}/{OMS_SIGNATURE}")]
    assert "not a JSON Sigstore bundle" in report.findings[0].message


def test_a_well_formed_bundle_without_the_public_key_is_reported_unchecked_not_refused(sealed, tmp_path):
    hostile = rebuild(sealed, tmp_path / sealed.name, add={OMS_SIGNATURE: FORGED_BUNDLE})
    report = audit(hostile)
    assert report.verdict == "pass" and report.audit["signature"]["model_signing"]["state"] == "unchecked"


def test_a_second_statement_member_is_refused(signed, alice, tmp_path):
    """GNU tar keeps the last of two members of one name; the audit refuses the second (IV703)."""
    statement = members_of(signed)[f"{CAMPAIGN}/{STATEMENT}"]
    hostile = rebuild(signed, tmp_path / signed.name, add={STATEMENT: statement.replace(b"Linux", b"Linus")})
    report = audit(hostile, settle(reviewer=True, allowed_signers=alice["allowed"]))
    assert ("IV703", f"{CAMPAIGN}/{STATEMENT}") in codes_at(report) and report.verdict == "fail"


@pytest.mark.parametrize("tail", ["tar data after the end-of-archive blocks", "bytes after the last frame"])
def test_data_past_the_end_is_refused_under_allowed_signers(signed, alice, tmp_path, tail):
    import zstandard

    hostile = tmp_path / signed.name
    extra = (zstandard.ZstdCompressor().compress(b"x".ljust(1024, b"\0")) if tail.startswith("tar")
             else b"\x00hidden bytes")
    hostile.write_bytes(signed.read_bytes() + extra)
    report = audit(hostile, settle(reviewer=True, allowed_signers=alice["allowed"]))
    assert report.verdict == "fail" and "IV701" in {f.code for f in report.findings}


# ---- a statement of an older seal (no member listing, no model.sig digest) -------------------------------------
def _older_statement(archive: Path, key: Path, folder: Path, out: Path) -> Path:
    """The archive with its statement as itera-verify 0.1 wrote it (before `members` and model.sig's digest),
    signed again with `key` by ssh-keygen itself."""
    members = members_of(archive)
    statement = json.loads(members[f"{CAMPAIGN}/{STATEMENT}"])
    del statement["members"], statement["sha256"][OMS_SIGNATURE]
    text = folder / "statement.json"
    text.write_bytes((json.dumps(statement, indent=2, sort_keys=True) + "\n").encode())
    subprocess.run(["ssh-keygen", "-q", "-Y", "sign", "-f", str(key), "-n", NAMESPACE, str(text)], check=True,
                   capture_output=True)
    return rebuild(archive, out, replace={STATEMENT: text.read_bytes(),
                                          STATEMENT_SIG: text.with_suffix(".json.sig").read_bytes()})


def test_an_older_statement_still_passes_and_binds_its_files_but_not_an_added_link(signed, alice, tmp_path):
    older = _older_statement(signed, alice["key"], tmp_path, tmp_path / signed.name)
    report = audit(older, settle(reviewer=True, allowed_signers=alice["allowed"], signer="alice@example.com"))
    assert report.verdict == "pass", [f.to_json() for f in report.findings]
    (tmp_path / "link").mkdir()
    with_link = rebuild(older, tmp_path / "link" / signed.name, links={"analysis/latest": "errors.md"})
    assert audit(with_link).verdict == "pass"  # unsigned reviewers see no difference: nothing lists links
    report = audit(with_link, settle(reviewer=True, allowed_signers=alice["allowed"]))
    assert [(f.code, f.path) for f in report.findings] == [("IV802", f"{CAMPAIGN}/analysis/latest")]
    assert "older seal" in report.findings[0].message


def test_an_unverified_model_sig_while_signers_are_required_is_IV802(built, alice, tmp_path):
    """An older dual-signed archive: its statement names no model.sig, so only the reviewer's --oms-public-key can
    cover it; without that key, a reviewer who requires signers gets IV802 for it."""
    pytest.importorskip("model_signing", reason="the model-signing extra")
    from tests.test_model_signing import ec_key

    private, public = ec_key(tmp_path, "oms")
    shutil.copytree(built["package"], tmp_path / "pkg", symlinks=True)
    (tmp_path / "dual").mkdir()
    report = verify(tmp_path / "pkg", settle(reload=False, output=tmp_path / "dual", sign=(f"ssh:{alice['key']}", f"model-signing:{private}")))
    assert report.sealed
    older = _older_statement(tmp_path / "dual" / f"{CAMPAIGN}.tar.zst", alice["key"], tmp_path,
                             tmp_path / f"{CAMPAIGN}.tar.zst")
    report = audit(older, settle(reviewer=True, allowed_signers=alice["allowed"]))
    assert [(f.code, f.path) for f in report.findings] == [("IV802", f"{CAMPAIGN}/{OMS_SIGNATURE}")]
    assert "not verified with --oms-public-key" in report.findings[0].message
    report = audit(older, settle(reviewer=True, allowed_signers=alice["allowed"], oms_public_key=public))
    assert report.verdict == "pass", [f.to_json() for f in report.findings]
    # the new statement binds model.sig itself: no key needed, and a swapped bundle is named
    dual = tmp_path / "dual" / f"{CAMPAIGN}.tar.zst"
    assert audit(dual, settle(reviewer=True, allowed_signers=alice["allowed"])).verdict == "pass"
    swapped = rebuild(dual, tmp_path / "swapped.tar.zst", replace={OMS_SIGNATURE: FORGED_BUNDLE})
    assert any("SEAL/model.sig is not the one signed" in m for m in iv802(audit(swapped)))
    assert hashlib.sha256(FORGED_BUNDLE).hexdigest() != json.loads(
        members_of(dual)[f"{CAMPAIGN}/{STATEMENT}"])["sha256"][OMS_SIGNATURE]


def test_a_principal_pattern_admits_the_signer_asked_for_and_a_negated_one_does_not(signed, alice, tmp_path):
    """`--signer` is matched against the line's principal patterns as `ssh-keygen -Y verify -I` matches it
    (tests/test_sshsig_differential.py compares the two on every pattern form)."""
    pattern = allowed_signers(tmp_path / "pattern", ("*@example.com,!mallory@example.com",
                                                     alice["key"].with_suffix(".pub")))
    assert audit(signed, settle(reviewer=True, allowed_signers=pattern, signer="alice@example.com")).verdict == "pass"
    for who in ("mallory@example.com", "alice@example.org"):
        assert [f.code for f in audit(signed, settle(reviewer=True, allowed_signers=pattern, signer=who)).findings] == ["IV803"], who


def test_many_skippable_frames_are_counted_not_listed(tmp_path):
    """Millions of 9-byte frames would make a table of millions of entries: past max_blocks frames and blocks, the
    table gives up (the reader then reads in one pass, where the scanner counts them)."""
    import os

    import zstandard

    from itera_verify.archive.zstdframes import frame_table

    path = tmp_path / "many.zst"
    path.write_bytes(zstandard.ZstdCompressor().compress(b"x") + ((0x184D2A50).to_bytes(4, "little")
                                                               + (1).to_bytes(4, "little") + b"y") * 50)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert frame_table(fd, max_blocks=10) is None and len(frame_table(fd)) == 51
    finally:
        os.close(fd)
