"""Auditing a delivered archive as hostile input: each hostile archive is built here, with tarfile + zstandard."""
from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import tarfile
import tempfile
from pathlib import Path

import pytest
import zstandard

from itera_verify.archive import format_sums, parse_sums
from itera_verify.flows.audit import audit, default_max_size
from itera_verify.model import UsageError
from itera_verify.runtime.environment import Environment
from tests.helpers import run_cli
from itera_verify import settle

# Every audit here makes its private folder in the test's own temporary folder (conftest.private_tmp).
pytestmark = pytest.mark.usefixtures("private_tmp")

CAMPAIGN = "reviews-lora-2026-11"
SUMS = f"{CAMPAIGN}/SEAL/SHA256SUMS"


def entries_of(archive: Path) -> list[tuple[tarfile.TarInfo, bytes | None]]:
    with open(archive, "rb") as fh:  # the seal writes several frames when a file is large: read them all
        data = zstandard.ZstdDecompressor().stream_reader(fh, read_across_frames=True).read()
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return [(info, tar.extractfile(info).read() if info.isfile() else None) for info in tar.getmembers()]


def write_archive(path: Path, entries, *, resum: bool = False) -> Path:
    """Write (TarInfo, data) entries as a tar.zst; `resum` rewrites SHA256SUMS to match the files."""
    if resum:  # a hard link is a file of the extracted package too: listed with its target's digest
        data = {i.name: d for i, d in entries if i.isfile()}
        digests = {i.name.split("/", 1)[1]: hashlib.sha256(data[i.linkname if i.islnk() else i.name]).hexdigest()
                   for i, _ in entries if (i.isfile() or i.islnk()) and i.name != SUMS}
        entries = [(i, format_sums(digests) if i.name == SUMS else d) for i, d in entries]
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in entries:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    path.write_bytes(zstandard.ZstdCompressor(level=3).compress(buffer.getvalue()))
    return path


def member(name: str, kind=tarfile.REGTYPE, data: bytes | None = b"", linkname: str = "") -> tuple:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, linkname, 0o644
    if kind in (tarfile.CHRTYPE, tarfile.BLKTYPE):
        info.devmajor, info.devminor = 1, 3
    return info, data if kind == tarfile.REGTYPE else None


def with_extra(sealed: Path, *extra) -> list:
    """The clean entries with hostile ones inserted before SEAL/ (where a package member would be)."""
    entries = entries_of(sealed)
    seal_at = next(i for i, (info, _) in enumerate(entries) if info.name.startswith(f"{CAMPAIGN}/SEAL"))
    return entries[:seal_at] + list(extra) + entries[seal_at:]


def archive_findings(report) -> list[tuple[str, str]]:
    return [(f.code, f.path) for f in report.findings if f.code.startswith("IV7")]


@pytest.fixture
def hostile_dir(tmp_path) -> Path:
    folder = tmp_path / "delivery"
    folder.mkdir()
    return folder


def audit_leaving_nothing_behind(archive: Path, **options):
    """Audit, and check nothing appeared beside the archive and the private folder was removed."""
    before = sorted(p.name for p in archive.parent.iterdir())
    report = audit(archive, settle(reviewer=True, **options))
    assert sorted(p.name for p in archive.parent.iterdir()) == before
    assert list(Path(tempfile.gettempdir()).iterdir()) == []
    return report


# ---- the clean archive ---------------------------------------------------------------------------------
def test_clean_sealed_archive_passes_and_matches_its_record(sealed):
    report = audit_leaving_nothing_behind(sealed)
    assert report.verdict == "pass", [f.to_json() for f in report.findings]
    assert report.mode == "audit" and report.package == str(sealed)
    assert report.audit["rechecked"] and report.audit["stream"] == "ok"
    assert report.audit["comparison"]["recorded_verdict"] == "pass" and report.audit["comparison"]["matches"]
    assert report.archive["sha256"] == (sealed.parent / (sealed.name + ".sha256")).read_text()[:64]


def test_cli_audit_of_the_clean_archive_exits_0_with_json_facts(sealed):
    result = run_cli("audit", sealed, "--format", "json")
    assert result.returncode == 0, result.stdout + result.stderr
    document = json.loads(result.stdout)
    assert document["mode"] == "audit" and document["verdict"] == "pass"
    assert document["audit"]["members"] > 20
    assert document["audit"]["sha256_named_by"] == {"by": sealed.name + ".sha256", "equal": True}


def test_the_audit_says_what_names_the_archives_sha256_or_that_nothing_does(sealed, tmp_path):
    """An archive without its `.sha256` (sent alone, or from a bucket holding nothing beside it) is audited all
    the same, but the reviewer is told that nothing vouched for its SHA-256."""
    named = run_cli("audit", sealed)
    assert named.returncode == 0 and f"(named by {sealed.name}.sha256)" in named.stdout, named.stdout
    alone = tmp_path / sealed.name
    shutil.copy(sealed, alone)
    result = run_cli("audit", alone)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "(nothing beside the archive names it: compare it with the SHA-256 the sender published)" in result.stdout
    assert json.loads(run_cli("audit", alone, "--format", "json").stdout)["audit"]["sha256_named_by"] is None
    (tmp_path / (sealed.name + ".sha256")).write_text(f"{'0' * 64}  {sealed.name}\n")
    result = run_cli("audit", alone)
    assert result.returncode == 1 and f"(NOT the one named by {sealed.name}.sha256)" in result.stdout, result.stdout
    # An archive that cannot be read whole was not compared: it is not said to have nothing beside it.
    shutil.copy(sealed.with_name(sealed.name + ".sha256"), tmp_path)
    with open(alone, "r+b") as fh:
        fh.truncate(alone.stat().st_size // 2)
    result = run_cli("audit", alone, "--format", "json")
    report = json.loads(result.stdout)
    assert result.returncode == 1 and "sha256_named_by" not in report["audit"], report["audit"]
    assert "names it" not in run_cli("audit", alone).stdout


@pytest.mark.parametrize("form", ["fifo", "link", "sparse"])
def test_a_sha256_beside_the_archive_that_is_no_small_file_names_nothing_and_is_never_read(sealed, tmp_path, form):
    """A fifo would block the audit for ever, a sparse 1 GiB file fill its memory, a link read what it points at:
    `.sha256` is read as every file beside an archive (push/beside.py), and the report says why it was not."""
    alone = tmp_path / sealed.name
    shutil.copy(sealed, alone)
    beside = tmp_path / (sealed.name + ".sha256")
    if form == "fifo":
        os.mkfifo(beside)
    elif form == "link":
        shutil.copy(sealed.with_name(sealed.name + ".sha256"), tmp_path / "real.sha256")
        os.symlink("real.sha256", beside)
    else:
        beside.write_text(f"{'0' * 64}  {sealed.name}\n")  # a wrong digest: never read, never compared
        with open(beside, "r+b") as fh:
            fh.truncate(1 << 30)
    result = run_cli("audit", alone, "--format", "json", timeout=120)
    report = json.loads(result.stdout)
    assert result.returncode == 0 and report["audit"]["sha256_named_by"] is None, report["findings"]
    (unread,) = report["audit"]["sidecars_unread"]
    assert unread["path"] == beside.name
    assert {"fifo": "not a regular file", "link": "a link", "sparse": "larger than 4096 bytes"}[form] in unread["why"]
    text = run_cli("audit", alone, timeout=120).stdout
    assert f"{beside.name}: " in text and "not read" in text, text


def test_audit_of_a_missing_archive_exits_2(tmp_path):
    result = run_cli("audit", tmp_path / "nothing.tar.zst")
    assert result.returncode == 2 and "no such file" in result.stderr
    with pytest.raises(UsageError):
        audit(tmp_path)


# ---- content that is not what was sealed ---------------------------------------------------------------
def test_one_tampered_byte_in_a_member_is_IV701(sealed, hostile_dir):
    entries = [(i, d[:-2] + b"X\n" if i.name.endswith("analysis/errors.md") else d) for i, d in entries_of(sealed)]
    report = audit_leaving_nothing_behind(write_archive(hostile_dir / "a.tar.zst", entries))
    assert archive_findings(report) == [("IV701", f"{CAMPAIGN}/analysis/errors.md")]
    assert report.verdict == "fail"


def test_one_flipped_byte_in_the_compressed_stream_is_IV701(sealed, hostile_dir):
    data = bytearray(sealed.read_bytes())
    data[-2] ^= 0x01  # inside the last frame's checksum
    (hostile_dir / "a.tar.zst").write_bytes(bytes(data))
    report = audit_leaving_nothing_behind(hostile_dir / "a.tar.zst")
    assert [c for c, _ in archive_findings(report)] == ["IV701"] and not report.audit["rechecked"]


def test_extra_member_not_listed_is_IV702(sealed, hostile_dir):
    entries = with_extra(sealed, member(f"{CAMPAIGN}/analysis/payload.md", data=b"added later\n"))
    report = audit_leaving_nothing_behind(write_archive(hostile_dir / "a.tar.zst", entries))
    assert archive_findings(report) == [("IV702", f"{CAMPAIGN}/analysis/payload.md")]


def test_missing_member_is_IV702(sealed, hostile_dir):
    entries = [(i, d) for i, d in entries_of(sealed) if not i.name.endswith("predictions/lora-r16.jsonl")]
    report = audit_leaving_nothing_behind(write_archive(hostile_dir / "a.tar.zst", entries))
    assert ("IV702", f"{CAMPAIGN}/predictions/lora-r16.jsonl") in archive_findings(report)
    assert report.verdict == "fail"


def test_truncated_archive_is_IV702(sealed, hostile_dir):
    data = sealed.read_bytes()
    (hostile_dir / "a.tar.zst").write_bytes(data[: len(data) // 2])
    report = audit_leaving_nothing_behind(hostile_dir / "a.tar.zst")
    assert archive_findings(report) == [("IV702", "a.tar.zst")] and "truncated" in report.findings[0].message
    assert report.verdict == "fail" and not report.audit["rechecked"]
    # The report names the file it audited: the digest of all its bytes, not of the part read before the cut.
    assert report.archive["sha256"] == hashlib.sha256(data[: len(data) // 2]).hexdigest()


def test_file_that_is_not_zstd_is_IV701(hostile_dir):
    archive = hostile_dir / "a.tar.zst"
    archive.write_bytes(gzip.compress(b"not what was sealed" * 100))
    report = audit_leaving_nothing_behind(archive)
    assert archive_findings(report) == [("IV701", "a.tar.zst")] and "not a sealed archive" in report.findings[0].message


def test_checksum_file_beside_the_archive_that_disagrees_is_IV701(sealed, hostile_dir):
    shutil.copy(sealed, hostile_dir / sealed.name)
    (hostile_dir / (sealed.name + ".sha256")).write_text("0" * 64 + f"  {sealed.name}\n")
    report = audit_leaving_nothing_behind(hostile_dir / sealed.name)
    assert archive_findings(report) == [("IV701", sealed.name)]


def test_recorded_pass_that_the_recheck_contradicts_is_IV701(sealed, hostile_dir):
    """Rewritten content with SHA256SUMS rewritten to match: only the re-check can tell."""
    entries = [(i, b'{"stops": [}' if i.name.endswith("/stops.json") else d) for i, d in entries_of(sealed)]
    report = audit_leaving_nothing_behind(write_archive(hostile_dir / "a.tar.zst", entries, resum=True))
    assert ("IV701", f"{CAMPAIGN}/SEAL/verification.json") in archive_findings(report)
    assert "IV104" in {f.code for f in report.findings}
    assert report.audit["comparison"]["codes_only_now"]


# ---- unsafe members: rejected, never written -------------------------------------------------------------
def test_path_traversal_is_IV703_and_nothing_is_written_outside(sealed, hostile_dir, tmp_path):
    target = tmp_path / "sentinel-dotdot"
    name = f"{CAMPAIGN}/" + "../" * 12 + str(target).lstrip("/")
    report = audit_leaving_nothing_behind(write_archive(hostile_dir / "a.tar.zst", with_extra(
        sealed, member(name, data=b"owned\n"))))
    assert archive_findings(report) == [("IV703", name)] and not target.exists()
    assert report.audit["rechecked"] and report.verdict == "fail"


def test_absolute_name_is_IV703(sealed, hostile_dir, tmp_path):
    target = tmp_path / "sentinel-absolute"
    report = audit_leaving_nothing_behind(write_archive(hostile_dir / "a.tar.zst", with_extra(
        sealed, member(str(target), data=b"owned\n"))))
    assert archive_findings(report) == [("IV703", str(target))] and not target.exists()


def test_symlink_leaving_the_package_is_IV703_and_not_followed(sealed, hostile_dir, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    report = audit_leaving_nothing_behind(write_archive(hostile_dir / "a.tar.zst", with_extra(
        sealed,
        member(f"{CAMPAIGN}/escape", tarfile.SYMTYPE, linkname=str(outside)),
        member(f"{CAMPAIGN}/escape/planted", data=b"owned\n"),
        member(f"{CAMPAIGN}/up", tarfile.SYMTYPE, linkname="../" * 12 + str(outside).lstrip("/")),
    )))
    assert archive_findings(report) == [("IV703", f"{CAMPAIGN}/escape"), ("IV703", f"{CAMPAIGN}/escape/planted"),
                                        ("IV703", f"{CAMPAIGN}/up")]
    assert list(outside.iterdir()) == []


def test_chain_of_inside_looking_links_that_lands_outside_is_IV703(sealed, hostile_dir):
    report = audit_leaving_nothing_behind(write_archive(hostile_dir / "a.tar.zst", with_extra(
        sealed,
        member(f"{CAMPAIGN}/analysis/s", tarfile.SYMTYPE, linkname="."),
        member(f"{CAMPAIGN}/analysis/t", tarfile.SYMTYPE, linkname="s/../.."),
        member(f"{CAMPAIGN}/analysis/u", tarfile.SYMTYPE, linkname="t/.."),
        member(f"{CAMPAIGN}/analysis/u/planted", data=b"owned\n"),
    )))
    refused = {path for code, path in archive_findings(report) if code == "IV703"}
    assert {f"{CAMPAIGN}/analysis/t", f"{CAMPAIGN}/analysis/u", f"{CAMPAIGN}/analysis/u/planted"} <= refused


def test_hard_link_leaving_the_package_is_IV703(sealed, hostile_dir, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    report = audit_leaving_nothing_behind(write_archive(hostile_dir / "a.tar.zst", with_extra(
        sealed,
        member(f"{CAMPAIGN}/hard-abs", tarfile.LNKTYPE, linkname=str(victim)),
        member(f"{CAMPAIGN}/hard-rel", tarfile.LNKTYPE, linkname=f"{CAMPAIGN}/" + "../" * 12 + str(victim)[1:]),
    )))
    assert [c for c, _ in archive_findings(report)] == ["IV703", "IV703"]
    assert victim.stat().st_nlink == 1 and victim.read_text() == "keep me\n"


def test_hard_link_inside_the_package_is_IV703_the_seal_writes_none(sealed, hostile_dir):
    entries = with_extra(sealed, member(f"{CAMPAIGN}/analysis/copy.md", tarfile.LNKTYPE,
                                        linkname=f"{CAMPAIGN}/analysis/errors.md"))
    report = audit_leaving_nothing_behind(write_archive(hostile_dir / "a.tar.zst", entries, resum=True))
    assert archive_findings(report) == [("IV703", f"{CAMPAIGN}/analysis/copy.md")]


@pytest.mark.parametrize("kind", [tarfile.CHRTYPE, tarfile.BLKTYPE, tarfile.FIFOTYPE])
def test_device_node_or_fifo_is_IV703(sealed, hostile_dir, kind):
    name = f"{CAMPAIGN}/analysis/node"
    report = audit_leaving_nothing_behind(write_archive(hostile_dir / "a.tar.zst", with_extra(
        sealed, member(name, kind))))
    assert archive_findings(report) == [("IV703", name)]


def test_member_outside_the_package_folder_or_twice_is_IV703(sealed, hostile_dir):
    report = audit_leaving_nothing_behind(write_archive(hostile_dir / "a.tar.zst", with_extra(
        sealed, member("other-folder/x.md", data=b"x"), member(f"{CAMPAIGN}/analysis/errors.md", data=b"shadow"))))
    assert archive_findings(report) == [("IV703", "other-folder/x.md"), ("IV703", f"{CAMPAIGN}/analysis/errors.md")]


# ---- decompression bomb --------------------------------------------------------------------------------
def bomb(path: Path, expanded: int) -> Path:
    """A valid-looking archive whose one member is `expanded` bytes of zeros, in a few KiB."""
    with open(path, "wb") as out, zstandard.ZstdCompressor(level=3).stream_writer(out) as stream:
        top = tarfile.TarInfo(CAMPAIGN)
        top.type, top.mode = tarfile.DIRTYPE, 0o755  # the top folder first, as the seal writes it
        stream.write(top.tobuf(tarfile.PAX_FORMAT))
        info = tarfile.TarInfo(f"{CAMPAIGN}/weights.bin")
        info.size = expanded
        stream.write(info.tobuf(tarfile.PAX_FORMAT))
        block = bytes(4 << 20)
        for _ in range(expanded // len(block)):
            stream.write(block)
        stream.write(bytes(1024))
    return path


def test_decompression_bomb_is_IV705_and_stops_at_the_limit(hostile_dir):
    archive = bomb(hostile_dir / "a.tar.zst", 256 << 20)
    assert archive.stat().st_size < 100_000
    result = run_cli("audit", archive, "--max-size", str(32 << 20), "--format", "json")
    document = json.loads(result.stdout)
    assert result.returncode == 1
    assert [(f["code"], f["path"]) for f in document["findings"]] == [("IV705", "a.tar.zst")]
    assert document["audit"]["expanded_bytes"] < 48 << 20
    assert sorted(p.name for p in hostile_dir.iterdir()) == ["a.tar.zst"]


def test_default_size_limit_is_20_times_the_archive_and_at_least_1_gib():
    assert default_max_size(1000) == 1 << 30
    assert default_max_size(10 << 30) == 200 << 30


def test_parse_sums_reads_what_the_seal_wrote(sealed):
    entries = {i.name: d for i, d in entries_of(sealed)}
    listed = parse_sums(entries[SUMS])
    assert "manifest.json" in listed and "SEAL/verification.json" in listed and "SEAL/SHA256SUMS" not in listed
    assert os.path.basename(sealed) == f"{CAMPAIGN}.tar.zst"


def test_archive_of_many_frames_is_audited_in_parallel_and_a_flipped_byte_still_found(package_dir, tmp_path,
                                                                                      monkeypatch):
    from itera_verify import verify
    from itera_verify.archive import writer
    from itera_verify.archive.zstdframes import frame_table

    monkeypatch.setattr(writer, "FRAME_SPAN", 32 << 10)
    report = verify(package_dir, settle(reload=False, output=tmp_path / "a.tar.zst"))
    assert report.sealed and report.archive["frames"] > 5
    assert audit_leaving_nothing_behind(tmp_path / "a.tar.zst").verdict == "pass"
    with open(tmp_path / "a.tar.zst", "rb") as fh:
        frames = frame_table(fh.fileno())
    data = bytearray((tmp_path / "a.tar.zst").read_bytes())
    data[frames[2][1] - 1] ^= 0x01  # the content checksum of the third frame
    damaged = tmp_path / "damaged" / "a.tar.zst"
    damaged.parent.mkdir()
    damaged.write_bytes(bytes(data))
    found = audit_leaving_nothing_behind(damaged)
    assert [c for c, _ in archive_findings(found)] == ["IV701"] and found.verdict == "fail"


def test_extraction_folder_is_private_and_removed(sealed, monkeypatch, private_tmp):
    from itera_verify.flows import audit as audit_flow

    seen = {}
    real_extract = audit_flow.safe_extract

    def spy(source, root, **options):
        seen["mode"] = os.stat(root).st_mode & 0o777
        seen["root"] = Path(root)
        return real_extract(source, root, **options)

    monkeypatch.setattr(audit_flow, "safe_extract", spy)
    assert audit(sealed).verdict == "pass"
    assert seen["mode"] == 0o700 and seen["root"].parent.parent == private_tmp and not seen["root"].parent.exists()
    assert seen["root"].parent.name.startswith("itera-audit-")


def _package_with_large_shard(built, folder: Path) -> Path:
    import torch

    from fixtures.artifacts import write_safetensors

    shutil.copytree(built["package"], folder / "pkg", symlinks=True)
    write_safetensors(folder / "pkg" / "artifacts" / "big.safetensors", {"w": torch.randn(5 << 20)},
                      metadata={"note": "20 MiB of tensor data"})
    from itera_verify import verify

    report = verify(folder / "pkg", settle(reload=False, output=folder / f"{CAMPAIGN}.tar.zst"))
    assert report.sealed, [f.to_json() for f in report.findings]
    return folder / f"{CAMPAIGN}.tar.zst"


def test_a_flipped_byte_in_a_large_shards_tensor_data_is_IV701(built, tmp_path):
    archive = _package_with_large_shard(built, tmp_path)
    name = f"{CAMPAIGN}/artifacts/big.safetensors"
    entries = entries_of(archive)
    tampered = []
    for info, data in entries:
        if info.name == name:
            data = data[:-100] + bytes([data[-100] ^ 1]) + data[-99:]
        tampered.append((info, data))
    report = audit(write_archive(tmp_path / "tampered.tar.zst", tampered))
    assert ("IV701", name) in archive_findings(report)


def test_member_names_nested_past_path_max_are_IV703_not_a_crash(sealed, tmp_path):
    deep = "/".join(["d" * 200] * 24)  # about 4,800 characters: more than PATH_MAX once extracted
    entries = with_extra(sealed, member(f"{CAMPAIGN}/{deep}/x.txt", data=b"x"))
    report = audit(write_archive(tmp_path / "deep.tar.zst", entries, resum=True))
    assert report.verdict == "fail"
    assert "IV703" in {f.code for f in report.findings}


# ---- where the private folder goes ------------------------------------------------------------------------
def test_private_folder_goes_to_memory_only_when_nobody_chose_a_temporary_folder(sealed, tmp_path, monkeypatch):
    from itera_verify.flows import scratch as audit_flow

    if not audit_flow.MEMORY_SCRATCH.is_dir() or not os.access(audit_flow.MEMORY_SCRATCH, os.W_OK):
        pytest.skip("no writable /dev/shm here")
    for name in ("TMPDIR", "TEMP", "TMP"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(tempfile, "tempdir", "/tmp")
    assert audit_flow.scratch_folder(sealed, None, Environment.read()) == "/dev/shm"  # our archive: every frame declares its size
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    assert audit_flow.scratch_folder(sealed, None, Environment.read()) is None  # the user's choice wins
    monkeypatch.delenv("TMPDIR")
    monkeypatch.setattr(audit_flow, "available_memory", lambda: 1024)
    assert audit_flow.scratch_folder(sealed, None, Environment.read()) is None  # would not fit


def test_a_stream_without_declared_sizes_is_never_extracted_into_memory(tmp_path, monkeypatch):
    """zstd from a pipe does not know the size: nothing bounds the expansion ahead, so the disk it is."""
    from itera_verify.flows import scratch as audit_flow

    streamed = tmp_path / "piped.tar.zst"
    with open(streamed, "wb") as out, zstandard.ZstdCompressor().stream_writer(out) as writer:
        writer.write(b"\0" * (1 << 20))
    monkeypatch.setattr(tempfile, "tempdir", "/tmp")
    for name in ("TMPDIR", "TEMP", "TMP"):
        monkeypatch.delenv(name, raising=False)
    assert audit_flow.scratch_folder(streamed, None, Environment.read()) is None
    assert audit_flow.declared_content_size(os.open(streamed, os.O_RDONLY)) is None
