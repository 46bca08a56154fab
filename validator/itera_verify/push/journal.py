"""`<archive>.push.json`: what a multipart upload has done so far, so that a second push sends only what is missing.

Rewritten (temporary name, fsync, rename) after every part the store acknowledged: a kill -9, a reboot or a lost
connection leaves the last complete state, never half a file. It names the archive by size and modification
time, the destination, the upload id and the part size; each part done keeps the ETag the store returned and its
CRC64NVME and, when it was sent with Content-MD5, its MD5. The push trusts a part only when the store still lists
it with that ETag and the archive's bytes there still have that MD5 (or CRC64NVME), or the store lists it with
the MD5 of the bytes here as its ETag.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..format.push import JOURNAL_FORMAT, journal_name


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
    """The journal left by an earlier push, or None (none, unreadable or another format: started afresh)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict) or data.get("format") != JOURNAL_FORMAT:
            return None
        journal = Journal(**{k: data[k] for k in Journal.__dataclass_fields__ if k in data})
        if not isinstance(journal.parts, dict) or not isinstance(journal.upload_id, str):
            return None
        return journal
    except (OSError, ValueError, TypeError):
        return None


def save(path: Path, journal: Journal) -> None:
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    with open(partial, "w", encoding="utf-8") as fh:
        json.dump(asdict(journal), fh, indent=1, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(partial, path)


def remove(path: Path) -> None:
    path.unlink(missing_ok=True)
