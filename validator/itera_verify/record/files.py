"""Writes that a crash at any point cannot corrupt: whole files by temporary name + fsync + rename, records by
one appended line each (at worst the last line is partial, and the checker's IV104 names it)."""
from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Temporary names start with this prefix; a reopened campaign removes its own leftovers (a crash between the
# write and the rename), so none is sealed with the package.
TEMP_PREFIX = ".itera-record-tmp-"


def dumps(value: Any) -> bytes:
    """The bytes every JSON document is written with: stable key order, so equal content means equal bytes
    (config_sha256 of the same params is the same on a reopened campaign)."""
    return (json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode("utf-8")


def fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes) -> None:
    """Replace `path` by `data`: readers see the old file or the new one, never a mixture."""
    replace_atomically(path, lambda tmp: _write_synced(tmp, data, os.O_TRUNC))


def replace_atomically(path: Path, write: Callable[[Path], None]) -> None:
    """`write(tmp)` fills a temporary file beside `path` (whole and synced), which then replaces `path`; a write
    that fails leaves `path` as it was and no temporary file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{TEMP_PREFIX}{os.getpid()}-{path.name}")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    fsync_dir(path.parent)


def write_json(path: Path, value: Any) -> bytes:
    data = dumps(value)
    write_atomic(path, data)
    return data


def json_line(record: dict) -> bytes:
    # json.dumps writes a non-finite float as the bare token NaN / Infinity: legal in metrics (SPEC §1).
    return (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8")


def append_lines(path: Path, data: bytes) -> None:
    """Append whole lines with one write and fsync them: a crash loses at most the end of the last line."""
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_synced(path, data, os.O_APPEND)


def _write_synced(path: Path, data: bytes, mode: int) -> None:
    """Write all of `data` (short writes continued) and fsync it; `mode`: O_TRUNC or O_APPEND."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | mode, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)


def cut_partial_line(path: Path) -> int:
    """Before appending to a file a crash may have left mid-line, drop the unfinished tail (it is no record:
    the next line would be glued to it). Returns the number of bytes dropped."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return 0
    if size == 0:
        return 0
    with open(path, "rb+") as f:
        keep = size
        while keep > 0:
            start = max(0, keep - 65536)
            f.seek(start)
            chunk = f.read(keep - start)
            newline = chunk.rfind(b"\n")
            if newline >= 0:
                keep = start + newline + 1
                break
            keep = start
        if keep == size:
            return 0
        f.truncate(keep)
        f.flush()
        os.fsync(f.fileno())
    return size - keep


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def remove_stale_temps(root: Path) -> list[str]:
    """Remove the temporary files an interrupted atomic write left under `root`; returns their paths."""
    removed = []
    for tmp in sorted(Path(root).rglob(TEMP_PREFIX + "*")):
        if tmp.is_file() and not tmp.is_symlink():
            tmp.unlink()
            removed.append(tmp.relative_to(root).as_posix())
    return removed
