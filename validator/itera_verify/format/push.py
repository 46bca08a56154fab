"""What a push leaves beside the archive and in the store (docs/integration.md, leaving the machine): names and
fields.

The push writes the journal and the receipt with these names; the audit from a bucket reads the object's
metadata and the sidecars by them. Pure facts, no I/O.
"""
from __future__ import annotations

CHECKSUM_SUFFIX = ".sha256"  # `<hex>  <archive name>`, written by the seal (archive/publish.py)
# What the push and the audit read of it: `<64 hex>  <name>\n`, a name of at most 255 bytes.
CHECKSUM_FILE_MAX = 4096
SIGNATURE_SUFFIX = ".sig"  # the archive's OpenSSH signature, when the seal signed it
JOURNAL_SUFFIX = ".push.json"
RECEIPT_SUFFIX = ".receipt.json"

JOURNAL_FORMAT = "itera-push-journal/1"
RECEIPT_FORMAT = "itera-push-receipt/1"

# The object's user metadata (x-amz-meta-sha256): the archive's SHA-256, which no store computes for a multipart
# object; the audit from a bucket compares it with the bytes it streams.
METADATA_SHA256 = "sha256"
# The tag an upload whose SHA-256 came too late for its metadata tries first on its `.sha256` sidecar, to learn
# whether the store keeps tags apart from the bytes (push/__init__.py): the archive's SHA-256, under a key that
# says so (a `sha256` tag on the sidecar would name the sidecar's own bytes).
PROBE_TAG = "archive-sha256"

RECEIPT_FIELDS = ("format", "destination", "key", "version_id", "etag", "bytes", "sha256", "crc64nvme",
                  "checksum", "uploaded_at", "seconds", "verified_by", "sidecars")

# How the store checked the bytes it received (the receipt's `checksum`).
CHECKSUM_CRC64NVME = "crc64nvme-full-object"  # the store computes the full object's CRC64NVME and returns it
CHECKSUM_MD5 = "content-md5-per-part"  # the store accepts no flexible checksum: each part's MD5 only
CHECKSUM_LOCAL = "sha256-read-back"  # a folder: the copy is read back from the disk

# How the remote copy was proven equal (the receipt's `verified_by`).
VERIFIED_BY_STORE_CRC = "crc64nvme returned by the store"
VERIFIED_BY_READ_BACK = "read back and hashed (sha256)"

MIN_PART_SIZE = 5 << 20  # S3: every part but the last
MAX_PART_SIZE = 5 << 30  # S3: the largest part
MAX_PARTS = 10_000
DEFAULT_PART_SIZE = 32 << 20
# A push that overlaps the seal (push/follow.py) sends a part once its bytes are written: what is left after the
# seal is at most one part, so smaller parts shorten the end of the rental (a 68 MB archive: 9 parts, not 3).
FOLLOW_PART_SIZE = 8 << 20


def receipt_name(archive_name: str) -> str:
    return archive_name + RECEIPT_SUFFIX


def journal_name(archive_name: str) -> str:
    return archive_name + JOURNAL_SUFFIX


def part_size_for(size: int, wanted: int) -> int:
    """The part size actually used: at least S3's minimum, and large enough that the archive fits 10,000 parts."""
    size_needed = -(-size // MAX_PARTS)
    return max(wanted, MIN_PART_SIZE, size_needed)
