"""What a batch audits: every `*.tar.zst` under a folder or an s3:// prefix, or each archive a list names; and the
I-th of N slices of them (`--shard I/N`).

Every listing is bounded (keys, key length, a list file's size and lines; a bucket's pages in push/listing.py).
Entries that are not archives are counted and a few named (`skipped`): sidecars (`.sha256`, `.sig`, receipts)
and foreign files alike. The slices are taken from the keys sorted as strings, key i going to slice i mod N: every
key lands in exactly one slice, whichever machine lists them.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from ..seal.destination import ARCHIVE_SUFFIX
from ..model import UsageError

MAX_ENTRIES = 1_000_000  # files walked under a folder, or lines of a list
MAX_LIST_BYTES = 64 << 20
MAX_NAME_BYTES = 4096  # a path or a key, as listed
SKIPPED_SHOWN = 20


@dataclass(frozen=True)
class Entry:
    key: str  # what is sorted and sliced: the path under the folder, the object key, the list's line
    source: str  # what the audit reads: a path, or s3://bucket/key
    size: int | None = None  # bytes, when the listing says


@dataclass
class Listing:
    entries: list[Entry] = field(default_factory=list)  # the archives, sorted by key
    skipped: list[str] = field(default_factory=list)  # the first few entries that are not archives
    skipped_count: int = 0

    def skip(self, name: str) -> None:
        self.skipped_count += 1
        if len(self.skipped) < SKIPPED_SHOWN:
            self.skipped.append(name)


def is_batch_target(target: str) -> bool:
    """A folder, an s3:// prefix (`s3://bucket/` or ending in `/`), or `@list.txt`: a batch, not one archive."""
    if target.startswith("@"):
        return True
    if target.startswith("s3://"):
        rest = target[len("s3://"):]
        return "/" not in rest.rstrip("/") or target.endswith("/")
    return os.path.isdir(target)


def list_archives(target: str, endpoint_url: str | None = None) -> Listing:
    """The archives `target` names, sorted by key. UsageError (exit 2) when it cannot be listed."""
    if target.startswith("@"):
        return _from_list(Path(target[1:]))
    if target.startswith("s3://"):
        return _from_prefix(target if target.endswith("/") else target + "/", endpoint_url)
    return _from_folder(Path(target))


def is_archive(name: str) -> bool:
    return name.endswith(ARCHIVE_SUFFIX) and len(name) > len(ARCHIVE_SUFFIX)


def _from_folder(folder: Path) -> Listing:
    """Every `*.tar.zst` below `folder` (links to files included: the audit opens what they name; links to
    folders are not followed)."""
    listing, seen = Listing(), 0

    def refuse(exc: OSError) -> None:
        raise UsageError(f"{exc.filename or folder}: cannot list ({exc.strerror or exc})")

    for root, dirs, files in os.walk(folder, onerror=refuse):
        dirs.sort()
        for name in sorted(files) + [d for d in dirs if is_archive(d)]:
            seen += 1
            if seen > MAX_ENTRIES:
                raise UsageError(f"{folder}: more than {MAX_ENTRIES:,} entries below it (audit fewer at once)")
            path = os.path.join(root, name)
            key = os.path.relpath(path, folder)
            if len(key.encode("utf-8", "surrogateescape")) > MAX_NAME_BYTES:
                listing.skip(key[:200] + "…")
            elif is_archive(name):  # a folder so named is one failed row: the audit says what it is
                listing.entries.append(Entry(key, path, _size(path)))
            else:
                listing.skip(key)
    listing.entries.sort(key=lambda entry: entry.key)
    return listing


def _size(path: str) -> int | None:
    try:
        return os.stat(path).st_size
    except OSError:
        return None


def _from_prefix(url: str, endpoint_url: str | None) -> Listing:
    from ..push.listing import list_prefix

    listing = Listing()
    bucket = url[len("s3://"):].split("/", 1)[0]
    for listed in list_prefix(url, endpoint_url):
        if is_archive(listed.key):
            listing.entries.append(Entry(listed.key, f"s3://{bucket}/{listed.key}", listed.size))
        else:
            listing.skip(listed.key)
    return listing


def _from_list(path: Path) -> Listing:
    """`@list.txt`: one archive per line (a path, relative to the current folder, or s3://bucket/key); blank
    lines and `#` comments are passed over. A line naming no archive is skipped and said."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_LIST_BYTES + 1)
    except OSError as exc:
        raise UsageError(f"@{path}: cannot read ({exc.strerror or exc})") from None
    if len(raw) > MAX_LIST_BYTES:
        raise UsageError(f"@{path}: larger than {MAX_LIST_BYTES >> 20} MiB (split the list)")
    lines = raw.decode("utf-8", "replace").splitlines()
    if len(lines) > MAX_ENTRIES:
        raise UsageError(f"@{path}: more than {MAX_ENTRIES:,} lines (split the list)")
    listing, seen = Listing(), set()
    for number, line in enumerate(lines, 1):
        name = line.strip()
        if not name or name.startswith("#"):
            continue
        if len(name.encode("utf-8")) > MAX_NAME_BYTES or not is_archive(name) or any(c < " " for c in name):
            listing.skip(f"@{path.name}:{number}: {name[:200]}")
        elif name not in seen:  # one archive listed twice is audited once
            seen.add(name)
            listing.entries.append(Entry(name, name, None if name.startswith("s3://") else _size(name)))
    listing.entries.sort(key=lambda entry: entry.key)
    return listing


def shard_of(entries: list[Entry], shard: tuple[int, int] | None) -> list[Entry]:
    """The I-th of N slices of the sorted keys (key i goes to slice i mod N); all of them without --shard."""
    if shard is None:
        return list(entries)
    index, count = shard
    return [entry for position, entry in enumerate(sorted(entries, key=lambda e: e.key)) if position % count == index]


__all__ = ["Entry", "Listing", "is_archive", "is_batch_target", "list_archives", "shard_of"]
