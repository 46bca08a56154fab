"""`itera-verify audit s3://bucket/key.tar.zst`: the archive as a stream from the bucket, no local copy.

The object is read once, in parallel ranges handed out in order (ranged.py), every range pinned by If-Match to
the ETag seen first: an object replaced during the audit stops it. What the push left beside it is compared
with the bytes streamed: the object's sha256 metadata, `<key>.sha256` and the receipt's sha256. An object
changed after the push (one byte is enough) differs from all three and from SEAL/SHA256SUMS: IV701.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

from ..format.push import (CHECKSUM_SUFFIX, MAX_PART_SIZE, MAX_PARTS, METADATA_SHA256, RECEIPT_SUFFIX,
                           SIGNATURE_SUFFIX)
from .answers import LIMITS, StoreLimits, printable
from .ranged import RangedReader, read_back_sha256, read_start
from .store import PushError, S3Location, client, error_code, explain, parse_s3

SIDECAR_MAX = 1 << 20  # a checksum file or a receipt; anything larger is not one
SIDECAR_SUFFIXES = (CHECKSUM_SUFFIX, SIGNATURE_SUFFIX)  # what a push writes beside the archive, receipt aside
MAX_OBJECT_SIZE = MAX_PART_SIZE * MAX_PARTS  # the largest object a multipart upload can make (about 54 TB)
READING = "reading the archive"  # what an audit from a bucket is doing when the store fails it


@dataclass
class RemoteArchive:
    s3: object
    bucket: str
    key: str
    size: int
    etag: str | None
    version_id: str | None
    metadata_sha256: str | None
    jobs: int = 4
    tag_sha256: str | None = None  # an upload that overlapped the seal records the SHA-256 as a tag (follow.py)

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.key}"

    @property
    def name(self) -> str:
        return self.key.rsplit("/", 1)[-1]

    def open(self) -> RangedReader:
        return RangedReader(self.s3, self.bucket, self.key, self.size, self.etag, jobs=self.jobs,
                            version_id=self.version_id, what=READING, resume=False)

    def sha256(self, algorithm: str = "sha256") -> str:
        """The object's digest, read again in ranges (the audit's stream hashes sha256 itself)."""
        return read_back_sha256(self.s3, self.bucket, self.key, self.size, self.etag, self.jobs,
                                version_id=self.version_id, algorithm=algorithm, what=READING, resume=False)[0]

    def sidecar(self, suffix: str, limit: int = SIDECAR_MAX) -> bytes | None:
        """`<key><suffix>` beside the object (its `.sha256`, `.sig`, receipt): at most `limit` + 1 bytes, so a
        caller sees one too large; None when there is none."""
        try:
            return read_start(self.s3, self.bucket, self.key + suffix, limit)
        except Exception as exc:  # noqa: BLE001 - a missing sidecar is no error; the rest is one line
            if error_code(exc) in ("NoSuchKey", "404", "AccessDenied", "InvalidRange"):
                return None
            raise explain(exc, f"reading {self.name}{suffix}", self.url, resume=False) from None

    def detached(self, streamed_sha256: str) -> tuple[str, bool] | None:
        """What the push recorded of the archive's SHA-256 (metadata, `.sha256`, receipt), and whether every one
        names the bytes streamed; None when nothing was recorded."""
        recorded: list[tuple[str, str]] = []
        if self.metadata_sha256:
            recorded.append((f"the object's {METADATA_SHA256} metadata", self.metadata_sha256.lower()))
        if self.tag_sha256:
            recorded.append((f"the object's {METADATA_SHA256} tag", self.tag_sha256.lower()))
        checksum = self.sidecar(CHECKSUM_SUFFIX)
        if checksum is not None:
            match = re.match(rb"\\?([0-9a-fA-F]{64})", checksum)
            recorded.append((self.name + CHECKSUM_SUFFIX, match.group(1).decode().lower() if match else ""))
        receipt = self.receipt()
        if receipt is not None:
            value = receipt.get("sha256")
            recorded.append((self.name + RECEIPT_SUFFIX, value.lower() if isinstance(value, str) else ""))
        if not recorded:
            return None
        differing = [what for what, value in recorded if value != streamed_sha256]
        return (", ".join(differing or [what for what, _ in recorded]), not differing)


    def receipt(self) -> dict | None:
        """The push's receipt beside the object, parsed (None when absent or not a JSON object); read once."""
        if not hasattr(self, "_receipt"):
            raw = self.sidecar(RECEIPT_SUFFIX)
            try:
                value = json.loads(raw) if raw is not None else None
            except (ValueError, RecursionError):  # RecursionError: `[[[[...` a megabyte deep
                value = None
            self._receipt = value if isinstance(value, dict) else None
        return self._receipt

    def missing_sidecars(self) -> tuple[str, ...]:
        """What the receipt lists beside the archive (its `.sha256`, its `.sig`) that the bucket does not hold: a
        signature deleted after the push reads as an unsigned delivery otherwise. Only the sidecar names a push
        writes are looked at, whatever else a receipt lists."""
        listed = (self.receipt() or {}).get("sidecars")
        known = {self.name + suffix: suffix for suffix in SIDECAR_SUFFIXES}
        names = [n for n in listed if isinstance(n, str) and n in known][:len(known)] \
            if isinstance(listed, list) else []
        return tuple(name for name in dict.fromkeys(names) if self.sidecar(known[name], 64) is None)


def open_remote(url: str, endpoint_url: str | None = None, jobs: int = 4,
                limits: StoreLimits = LIMITS) -> RemoteArchive:
    """HEAD the object once: its size, ETag and version are what the whole audit reads. PushError (exit 2)."""
    location = parse_s3(url)
    if not location.key or location.key.endswith("/"):
        raise PushError(f"{url}: give the archive's key (s3://bucket/prefix/name.tar.zst)")
    s3 = client(endpoint_url, jobs, limits)
    try:
        head = s3.head_object(Bucket=location.bucket, Key=location.key)
    except Exception as exc:  # noqa: BLE001 - one line
        if error_code(exc) in ("404", "NoSuchKey", "NotFound"):
            raise PushError(f"{url}: no such object") from None
        raise explain(exc, READING, url, resume=False) from None
    size = head.get("ContentLength")
    if not isinstance(size, int) or not 0 <= size <= MAX_OBJECT_SIZE:
        raise PushError(f"{url}: the store answered a size of {printable(size, 40)} bytes for the object (at most "
                        f"{MAX_OBJECT_SIZE} can be one)")
    in_metadata, tag = recorded_sha256(s3, location, head)
    return RemoteArchive(s3, location.bucket, location.key, size, head.get("ETag"), head.get("VersionId"),
                         in_metadata, jobs, tag)


def recorded_sha256(s3, location: S3Location, head: dict) -> tuple[str | None, str | None]:
    """The SHA-256 a push recorded on the object whose HEAD is `head`: (its sha256 metadata, its sha256 tag); the
    tag is asked for only when the metadata holds none (an upload begun before the SHA-256 was known)."""
    metadata = {k.lower(): v for k, v in (head.get("Metadata") or {}).items()}
    in_metadata = metadata.get(METADATA_SHA256)
    return in_metadata, None if in_metadata else _sha256_tag(s3, location.bucket, location.key,
                                                             head.get("VersionId"))


def _sha256_tag(s3, bucket: str, key: str, version_id: str | None) -> str | None:
    """The object's sha256 tag, when the store keeps tags and the push set one."""
    arguments = {"Bucket": bucket, "Key": key, **({"VersionId": version_id} if version_id else {})}
    try:
        tags = s3.get_object_tagging(**arguments).get("TagSet") or []
    except Exception:  # noqa: BLE001 - no tags there (or no right to read them): the sidecars still say it
        return None
    values = [t.get("Value") for t in tags if t.get("Key") == METADATA_SHA256]
    return values[0] if values and isinstance(values[0], str) else None
