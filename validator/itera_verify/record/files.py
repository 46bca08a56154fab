"""Every file the recorder reads or writes in the package, opened so that no link is ever followed.

A package folder can hold links somebody planted (`params/` to another folder, `metrics/control.jsonl` to a file
of the user's): writing through one would truncate, fill or create a file outside the package. So each path is
walked from the package root's descriptor one component at a time, every folder opened O_DIRECTORY|O_NOFOLLOW,
every file O_NOFOLLOW, folders created with mkdir(dir_fd=), whole files replaced by renameat; a link anywhere in
the path is a RecordError naming it and what it points to, raised before anything is written. Only the package
root itself, the folder the user named, may be a link.

Crash safety: whole files by temporary name + fsync + rename, records by one appended line each (at worst the
last line is partial, and the checker's IV104 names it)."""
from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from .errors import RecordError

# Temporary names start with this prefix; a reopened campaign removes its own leftovers (a crash between the
# write and the rename), so none is sealed with the package.
TEMP_PREFIX = ".itera-record-tmp-"

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
ROOT_FLAGS = os.O_RDONLY | os.O_DIRECTORY | _CLOEXEC
FOLDER_FLAGS = ROOT_FLAGS | os.O_NOFOLLOW
# O_NONBLOCK: a fifo planted under a record's name fails at once (ENXIO) instead of blocking the training job.
FILE_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | _CLOEXEC
# Neither a link nor a folder, and a wrong type, read as one of these when opened O_NOFOLLOW / O_DIRECTORY.
_NOT_OPENABLE = {errno.ELOOP, errno.ENOTDIR, errno.EISDIR, errno.ENXIO, errno.EMLINK}


def dumps(value: Any) -> bytes:
    """The bytes every JSON document is written with: stable key order, so equal content means equal bytes
    (config_sha256 of the same params is the same on a reopened campaign)."""
    return (json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode("utf-8")


def json_line(record: dict) -> bytes:
    # json.dumps writes a non-finite float as the bare token NaN / Infinity: legal in metrics (docs/format.md, loaders).
    return (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8")


# ---- paths --------------------------------------------------------------------------------------------------
def _parts(rel: str) -> list[str]:
    parts = rel.split("/")
    if not rel or any(p in ("", ".", "..") for p in parts):
        raise RecordError(f"{rel!r} is no package-relative path")
    return parts


def package_relative(root: Path, path) -> str:
    """A path the recorder is asked to write (absolute, or relative to the package root), as a package-relative
    "/" path, read as written: its links are not resolved (the writer refuses them)."""
    given = Path(os.path.normpath(path))
    candidates = [given] if not given.is_absolute() else [
        Path(os.path.relpath(given, base)) for base in (Path(root).absolute(), Path(os.path.realpath(root)))]
    for rel in candidates:
        if rel.parts and rel.parts[0] != ".." and rel != Path("."):
            return rel.as_posix()
    raise RecordError(f"{path} lies outside the package {root}: save it inside (e.g. checkpoints/<run>/)")


def _refuse(dir_fd: int, name: str, shown: str, wanted: str) -> RecordError:
    """The error for `name` (in `dir_fd`) that could not be opened as a `wanted` without following it."""
    try:
        mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
    except OSError:
        mode = 0
    if stat.S_ISLNK(mode):
        target = os.readlink(name, dir_fd=dir_fd)
        return RecordError(f"{shown} is a link to {target}: the recorder never writes or reads through a link "
                           f"(it would change what lies outside the package); replace it by a real {wanted}")
    return RecordError(f"{shown} is not a {wanted}: remove it or record into another folder")


def open_at(dir_fd: int, name: str, flags: int, shown: str, mode: int = 0o644) -> int:
    """`name` in the folder `dir_fd`, opened never through a link and only as a regular file."""
    try:
        fd = os.open(name, flags | FILE_FLAGS, mode, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in _NOT_OPENABLE:
            raise _refuse(dir_fd, name, shown, "file") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise _refuse(dir_fd, name, shown, "file")
    return fd


def _open_folder_at(dir_fd: int, name: str, shown: str, create: bool) -> int:
    for attempt in (0, 1):
        try:
            return os.open(name, FOLDER_FLAGS, dir_fd=dir_fd)
        except FileNotFoundError:
            if not create or attempt:
                raise
            with contextlib.suppress(FileExistsError):  # another process made it meanwhile
                os.mkdir(name, 0o755, dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno in _NOT_OPENABLE:
                raise _refuse(dir_fd, name, shown, "folder") from None
            raise
    raise AssertionError("unreachable")


@contextlib.contextmanager
def folder(root: Path, rel: str | None, create: bool = False) -> Iterator[int]:
    """The descriptor of the package folder `rel` (None: the root), each component opened from the one above it
    without following a link; missing folders are created when `create` (else FileNotFoundError)."""
    fd = os.open(root, ROOT_FLAGS)
    try:
        done: list[str] = []
        for part in _parts(rel) if rel else []:
            done.append(part)
            child = _open_folder_at(fd, part, "/".join(done), create)
            os.close(fd)
            fd = child
        yield fd
    finally:
        os.close(fd)


def _split(rel: str) -> tuple[str | None, str]:
    parts = _parts(rel)
    return ("/".join(parts[:-1]) or None), parts[-1]


@contextlib.contextmanager
def opened(root: Path, rel: str, flags: int, create_folders: bool = False) -> Iterator[int]:
    """A descriptor of the package file `rel` (see open_at); FileNotFoundError when it or a folder is missing."""
    parent, name = _split(rel)
    with folder(root, parent, create_folders) as dir_fd:
        fd = open_at(dir_fd, name, flags, rel)
    try:
        yield fd
    finally:
        os.close(fd)


# ---- reading ------------------------------------------------------------------------------------------------
def read_bytes(root: Path, rel: str) -> bytes:
    """The whole package file `rel`; FileNotFoundError when absent."""
    with opened(root, rel, os.O_RDONLY) as fd, os.fdopen(os.dup(fd), "rb") as f:
        return f.read()


def exists(root: Path, rel: str) -> bool:
    try:
        with opened(root, rel, os.O_RDONLY):
            return True
    except FileNotFoundError:
        return False


# ---- whole files --------------------------------------------------------------------------------------------
def write_atomic(root: Path, rel: str, data: bytes) -> None:
    """Replace the package file `rel` by `data`: readers see the old file or the new one, never a mixture."""
    replace_atomically(root, rel, lambda f: f.write(data))


def write_json(root: Path, rel: str, value: Any) -> bytes:
    data = dumps(value)
    write_atomic(root, rel, data)
    return data


def _refuse_link(dir_fd: int, name: str, shown: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
            raise _refuse(dir_fd, name, shown, "file")


def replace_atomically(root: Path, rel: str, write: Callable[[BinaryIO], Any]) -> None:
    """`write(f)` fills a temporary file beside `rel` (flushed and synced here), which then replaces `rel`; a
    write that fails leaves `rel` as it was and no temporary file. `rel` itself being a link is refused too,
    although the rename would only replace the link: what the user sees there is not what was recorded."""
    parent, name = _split(rel)
    tmp = f"{TEMP_PREFIX}{os.getpid()}-{name}"
    with folder(root, parent, create=True) as dir_fd:
        _refuse_link(dir_fd, name, rel)
        # A leftover of a dead process with our pid (pid 1 in every container); unlinking a link removes only it.
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=dir_fd)
        fd = open_at(dir_fd, tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, rel)
        try:
            with os.fdopen(fd, "wb") as f:
                write(f)
                f.flush()
                os.fsync(f.fileno())
            os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=dir_fd)
            raise
        os.fsync(dir_fd)


# ---- records ------------------------------------------------------------------------------------------------
def _in_place(fd: int, rel: str) -> None:
    """A file changed in place (appended, cut) has one name: a hard link would carry the change outside."""
    if os.fstat(fd).st_nlink > 1:
        raise RecordError(f"{rel} has {os.fstat(fd).st_nlink} names (a hard link): the recorder never changes a "
                          "file that also lies elsewhere; replace it by a copy")


def append_lines(root: Path, rel: str, data: bytes) -> None:
    """Append whole lines with one write and fsync them: a crash loses at most the end of the last line."""
    with opened(root, rel, os.O_WRONLY | os.O_CREAT | os.O_APPEND, create_folders=True) as fd:
        _in_place(fd, rel)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)


def cut_partial_line(root: Path, rel: str) -> int:
    """Before appending to a file a crash may have left mid-line, drop the unfinished tail (it is no record:
    the next line would be glued to it). Returns the number of bytes dropped."""
    try:
        with opened(root, rel, os.O_RDWR) as fd:
            _in_place(fd, rel)
            return _cut(fd)
    except FileNotFoundError:
        return 0


def _cut(fd: int) -> int:
    size = os.fstat(fd).st_size
    keep = size
    while keep > 0:
        start = max(0, keep - 65536)
        newline = os.pread(fd, keep - start, start).rfind(b"\n")
        if newline >= 0:
            keep = start + newline + 1
            break
        keep = start
    if keep == size:
        return 0
    os.ftruncate(fd, keep)
    os.fsync(fd)
    return size - keep


# ---- folders for other writers ------------------------------------------------------------------------------
def prepare_target(root: Path, path, is_folder: bool) -> Path:
    """Make ready the package path `path` (see package_relative) that a library (save_pretrained, safetensors)
    will write by name: its folders created without following links, and no link where it writes (for a folder:
    none directly inside it). Returns the path to give the library. A link planted afterwards is not seen: the
    library opens names."""
    rel = package_relative(root, path)
    if is_folder:
        with folder(root, rel, create=True) as dir_fd:
            for entry in os.listdir(dir_fd):
                _refuse_link(dir_fd, entry, f"{rel}/{entry}")
    else:
        parent, name = _split(rel)
        with folder(root, parent, create=True) as dir_fd:
            _refuse_link(dir_fd, name, rel)
    return Path(root) / rel


def remove_stale_temps(root: Path) -> list[str]:
    """Remove the temporary files an interrupted atomic write left in the package (never entering a linked
    folder); returns their paths."""
    removed = []
    with folder(root, None) as root_fd:
        for top, _, names, dir_fd in os.fwalk(".", dir_fd=root_fd):
            for name in names:
                if name.startswith(TEMP_PREFIX) and stat.S_ISREG(
                        os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
                    os.unlink(name, dir_fd=dir_fd)
                    removed.append(os.path.normpath(os.path.join(top, name)))
    return sorted(removed)
