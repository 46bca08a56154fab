"""`<archive>.push.json`: what a multipart upload has done so far, so that a second push sends only what is missing.

Rewritten (temporary name, fsync, rename) after every part the store acknowledged: a kill -9, a reboot or a lost
connection leaves the last complete state, never half a file. It names the archive by size and modification
time, the destination, the upload id and the part size; each part done keeps the ETag the store returned and its
CRC64NVME and, when it was sent with Content-MD5, its MD5 (a record for the reader: the push never decides on
them). A part is reused only on the store's word about the bytes here: the store lists it with this size and with
the MD5 of the bytes here as its ETag, or with their CRC64NVME (multipart._already_there).

The journal may have been changed between two runs: it steers nothing but which upload of the command's own
destination is resumed. It is read bounded (beside.py); one that is not a journal of this form (wrong types, an
upload id that is not one, a part size or a part count S3 does not allow) is ignored and the upload starts afresh;
one that names another archive, destination or endpoint is not this push's (multipart._resume).
"""
from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..format.push import (CHECKSUM_CRC64NVME, CHECKSUM_MD5, JOURNAL_FORMAT, MAX_PART_SIZE, MAX_PARTS, MIN_PART_SIZE,
                           journal_name)
from .beside import read_beside, write_beside

JOURNAL_MAX = 8 << 20  # 10,000 parts take about 2 MB
UPLOAD_ID = re.compile(r"[\x21-\x7e]{1,1024}")  # printable, no space: what S3 upload ids are


@dataclass
class Journal:
    archive: str  # the archive's name
    bytes: int
    mtime_ns: int
    destination: str  # s3://bucket/key
    endpoint: str | None
    upload_id: str
    part_size: int
    checksum: str  # format/push.py CHECKSUM_*
    sha256: str
    started_at: str
    parts: dict[str, dict] = field(default_factory=dict)  # "1" -> {etag, md5 (or None), crc64nvme, bytes}
    format: str = JOURNAL_FORMAT

    def same_upload(self, other: "Journal") -> bool:
        """The same archive (size, time, digest) to the same place in the same parts."""
        return (self.archive, self.bytes, self.mtime_ns, self.destination, self.endpoint, self.part_size,
                self.sha256) == (other.archive, other.bytes, other.mtime_ns, other.destination, other.endpoint,
                                 other.part_size, other.sha256)


def journal_path(archive: Path) -> Path:
    return archive.with_name(journal_name(archive.name))


def load(path: Path) -> Journal | None:
    """The journal left by an earlier push, or None (none, unreadable, too large, another format or not a sound
    journal: started afresh)."""
    try:
        text = read_beside(path, JOURNAL_MAX)
        data = json.loads(text) if text is not None else None
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or data.get("format") != JOURNAL_FORMAT:
        return None
    try:
        journal = Journal(**{k: data[k] for k in Journal.__dataclass_fields__ if k in data})
    except TypeError:  # a field missing
        return None
    return journal if _sound(journal) else None


def _integer(value, low: int, high: int) -> bool:
    return type(value) is int and low <= value <= high


def _sound(journal: Journal) -> bool:
    """Every field of the type and range a push writes."""
    texts = (journal.archive, journal.destination, journal.sha256, journal.started_at, journal.checksum)
    if not all(isinstance(t, str) for t in texts) or not isinstance(journal.endpoint, (str, type(None))):
        return False
    if not UPLOAD_ID.fullmatch(journal.upload_id if isinstance(journal.upload_id, str) else ""):
        return False
    if journal.checksum not in (CHECKSUM_CRC64NVME, CHECKSUM_MD5):
        return False
    if not (_integer(journal.bytes, 0, MAX_PART_SIZE * MAX_PARTS) and _integer(journal.mtime_ns, 0, 1 << 63)
            and _integer(journal.part_size, MIN_PART_SIZE, MAX_PART_SIZE)):
        return False
    if not isinstance(journal.parts, dict) or len(journal.parts) > MAX_PARTS:
        return False
    return all(isinstance(number, str) and number.isdigit() and _integer(int(number), 1, MAX_PARTS)
               and isinstance(part, dict) and _integer(part.get("bytes"), 0, MAX_PART_SIZE)
               and all(isinstance(part.get(k), (str, type(None))) for k in ("etag", "md5", "crc64nvme"))
               for number, part in journal.parts.items())


def save(path: Path, journal: Journal) -> None:
    write_beside(path, (json.dumps(asdict(journal), indent=1, sort_keys=True)).encode("utf-8"))


def remove(path: Path) -> None:
    path.unlink(missing_ok=True)
