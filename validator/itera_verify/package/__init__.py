"""Discovery: one walk of the package, stat data per file, each document parsed once.

The walk never follows a link: links are recorded with where they point, so the path rules can judge them and
the seal can detect a file that changed after the check (size, mtime, inode). Large files are never read here.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from types import MappingProxyType
from typing import Any, BinaryIO, Iterator, Mapping

from ..format.names import MANIFEST, RELOAD, STOPS  # noqa: F401  (the rules read them here)
from ..model import ReloadResult, UsageError
from ..options import RunOptions
from ..runtime.environment import Environment
from ..archive.links import LinkResolver, real_path
from .files import READ_FLAGS, open_binary, read_safetensors_header

HASH_CHUNK = 1 << 20
# The package's caches (Documents.cache): file digests, the pickle scan's results (the reload refuses what it
# refused), the parsed run files (the report's runs table and curves). Each is filled once, in whichever process
# ran the check, and merged into the parent.
DIGESTS, PICKLE_SCAN, READER_SCANS = "digests", "pickle_scan", "reader_scans"
CACHES = (DIGESTS, PICKLE_SCAN, READER_SCANS)


@dataclass(frozen=True)
class FileEntry:
    path: str  # relative, "/"-separated
    size: int
    mtime_ns: int
    inode: int
    device: int
    ctime_ns: int = 0  # a rewrite that restores size and mtime (utime) still moves the ctime


@dataclass(frozen=True)
class LinkEntry:
    path: str
    target: str  # as written in the link
    resolved: str  # absolute, fully resolved
    inside: bool  # resolves inside the package
    broken: bool
    looped: bool = False  # more than 40 links on its way, or a loop (archive/links.py): broken as well


@dataclass
class ParseError:
    message: str
    line: int | None = None
    column: int | None = None
    too_large: bool = False  # not parsed at all: past jsonread.MAX_VALUES


@dataclass
class Document:
    """A parsed JSON document: `value` when it parsed, `error` when it did not."""

    path: str
    value: Any = None
    error: ParseError | None = None
    text: str = ""

    @property
    def ok(self) -> bool:
        return self.error is None


_DECODER = json.JSONDecoder()
_JSON_SPACE = " \t\n\r"


def loads_json(text: str) -> Any:
    """json.loads(text), with the same value and the same errors (message and position), without its two
    whitespace regex matches per call: on 20,000 small documents those cost more than half the parsing."""
    if text.startswith("\ufeff"):
        raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", text, 0)
    value, end = _DECODER.raw_decode(text, len(text) - len(text.lstrip(_JSON_SPACE)))
    if end != len(text):
        rest = text[end:].lstrip(_JSON_SPACE)
        if rest:
            raise json.JSONDecodeError("Extra data", text, len(text) - len(rest))
    return value


UNPARSED_KEEP = 64 << 20  # bytes of documents read by document_bytes() and kept until document() parses them
# Parsed documents kept for the next family that reads them, in all: a document past either is parsed again
# when asked again, so that no number of large documents is ever held at once.
KEEP_VALUES = 3_000_000
KEEP_BYTES = 64 << 20


@dataclass(frozen=True)
class Inventory:
    """What discovery found (one walk), and nothing else: no entry can be added or changed after it (the
    mappings are read-only views, the folders a frozenset), so every check, the reload and the seal see the same
    package. The path questions answered from it read no file."""

    root: Path
    files: Mapping[str, FileEntry] = field(default_factory=lambda: MappingProxyType({}))
    links: Mapping[str, LinkEntry] = field(default_factory=lambda: MappingProxyType({}))
    dirs: frozenset[str] = frozenset()
    specials: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))  # "fifo" | "socket" | "device"
    _root_prefix: str = field(default="", init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("files", "links", "specials"):
            value = getattr(self, name)
            if not isinstance(value, MappingProxyType):
                object.__setattr__(self, name, MappingProxyType(dict(value)))
        if not isinstance(self.dirs, frozenset):
            object.__setattr__(self, "dirs", frozenset(self.dirs))
        object.__setattr__(self, "_root_prefix", os.fspath(self.root).rstrip("/") + "/")

    def abspath(self, rel: str) -> Path:
        return self.root.joinpath(*rel.split("/"))

    def os_path(self, rel: str) -> str:
        """abspath() as a string, for loops over every file: a Path per file costs more than the work on it, and
        on POSIX even os.path.join does (it converts the root on every call): 40,000 calls a check of 20,000 files."""
        if os.sep != "/":
            return os.path.join(self.root, *rel.split("/"))
        return self._root_prefix + rel

    def is_file(self, rel: str) -> bool:
        return rel in self.files or (rel in self.links and self.links[rel].inside and not self.links[rel].broken
                                     and os.path.isfile(self.links[rel].resolved))

    def exists(self, rel: str) -> bool:
        rel = rel.rstrip("/")
        return rel in self.files or rel in self.dirs or rel in self.links or rel in self.specials or rel == ""

    def files_under(self, rel: str) -> list[str]:
        prefix = rel.rstrip("/") + "/"
        return sorted(p for p in self.files if p.startswith(prefix) or p == rel)

    @staticmethod
    def normalise_ref(ref: str) -> str | None:
        """A reference as a package-relative path, or None when it is absolute or escapes with `..`."""
        if not isinstance(ref, str) or not ref or ref.startswith(("/", "\\")) or (len(ref) > 1 and ref[1] == ":"):
            return None
        if "\0" in ref:
            return None  # no file system path holds a NUL byte
        parts: list[str] = []
        for part in ref.replace("\\", "/").split("/"):
            if part in ("", "."):
                continue
            if part == "..":
                if not parts:
                    return None
                parts.pop()
            else:
                parts.append(part)
        return "/".join(parts)


class Documents:
    """The one reader of the package's bytes for the checks: documents parsed once, digests, streamed lines, a
    file opened for a reader of its own format. What the checks compute that later steps reuse is kept in the
    declared CACHES: one export/merge hands all of them from a forked check process back to the parent, so a new
    cache needs no new hand-written transfer."""

    def __init__(self, inventory: Inventory):
        self.inventory = inventory
        self.caches: dict[str, dict] = {}
        self._documents: dict[str, Document] = {}
        self._unparsed: dict[str, bytes] = {}  # document_bytes() read, not parsed yet
        self._unparsed_bytes = 0
        self._kept = [0, 0]  # values, bytes of _documents
        self._derived: dict[str, Any] = {}  # facts computed from the documents (package/facts.py), per process

    def derived(self, name: str, compute):
        """A fact derived from the documents, computed once in this process (rules and report read the same)."""
        if name not in self._derived:
            self._derived[name] = compute()
        return self._derived[name]

    # ---- caches --------------------------------------------------------------------------------------

    def cache(self, name: str) -> dict:
        """One of the declared CACHES (a typo is a KeyError, never a second, silent cache)."""
        if name not in CACHES:
            raise KeyError(f"{name!r} is not a declared package cache ({', '.join(CACHES)})")
        return self.caches.setdefault(name, {})

    def export_caches(self) -> dict[str, dict]:
        """Every cache's entries: what a forked check process sends back to its parent."""
        return {name: dict(entries) for name, entries in self.caches.items() if entries}

    def merge_caches(self, exported: dict[str, dict]) -> None:
        """A child's caches merged into this process's: an entry already known here is kept (one file, one
        reading)."""
        for name, entries in exported.items():
            mine = self.cache(name)
            for key, value in entries.items():
                mine.setdefault(key, value)

    @property
    def digests(self) -> dict[str, str]:
        """Digests computed by checks; the seal compares them with what it hashes (IV704)."""
        return self.cache(DIGESTS)

    # ---- files ---------------------------------------------------------------------------------------
    def path(self, rel: str) -> str:
        """Where a package file lies, for a reader that opens it by name itself (simdjson's validation, the
        tensor readers): the rules name a package file on disk only through here."""
        return self.inventory.os_path(rel)

    def open(self, rel: str) -> BinaryIO:
        """The file, opened for reading in binary (never blocking on a fifo); OSError as open() raises it."""
        return open_binary(self.inventory.abspath(rel))

    def safetensors_header(self, rel: str, *, unreadable_is_none: bool = True):
        """The one safetensors header reader (package/files.py) over a package file."""
        return read_safetensors_header(self.inventory.abspath(rel), unreadable_is_none=unreadable_is_none)

    def read_bytes(self, rel: str) -> bytes:
        """The whole file, with plain os calls sized by what discovery recorded: open, read, read (the end),
        close. Python's open() adds two stats, an isatty ioctl and two seeks: for 20,000 small files that is
        most of a second of system time."""
        entry = self.inventory.files.get(rel)
        try:
            fd = os.open(self.inventory.os_path(rel), READ_FLAGS)
            try:
                expected = entry.size if entry is not None else os.fstat(fd).st_size
                parts = [os.read(fd, expected + 1)]  # one more byte: a file grown since discovery reads whole
                while parts[-1]:
                    parts.append(os.read(fd, max(HASH_CHUNK, expected)))
                return parts[0] if len(parts) == 2 else b"".join(parts)
            finally:
                os.close(fd)
        except PermissionError as exc:
            raise UsageError(f"{rel}: permission denied") from exc
        except OSError as exc:
            raise UsageError(f"{rel}: cannot read ({exc.strerror})") from exc

    def document_bytes(self, rel: str) -> bytes:
        """The bytes of a document, for a look before parsing it (most small documents need no parse for some
        rules); kept, up to UNPARSED_KEEP bytes in all, so that document() does not read the file again."""
        raw = self._unparsed.get(rel)
        if raw is None:
            raw = self.read_bytes(rel)
            if rel not in self._documents and self._unparsed_bytes + len(raw) <= UNPARSED_KEEP:
                self._unparsed[rel] = raw
                self._unparsed_bytes += len(raw)
        return raw

    def document(self, rel: str) -> Document | None:
        """The JSON document at `rel`, parsed once while the kept documents stay within KEEP_VALUES and
        KEEP_BYTES (a larger one is parsed again when asked again); None when there is no such file. One of more
        than jsonread.MAX_VALUES values is never parsed: its error says it is too large to check."""
        if rel in self._documents:
            return self._documents[rel]
        if not self.inventory.is_file(rel):
            return None
        from .jsonread import MAX_VALUES, count_values, too_many_values  # jsonread imports this module

        raw = self._unparsed.pop(rel, None)
        if raw is not None:
            self._unparsed_bytes -= len(raw)
        else:
            raw = self.read_bytes(rel)
        doc = Document(rel)
        values = count_values(raw, exact_above=MAX_VALUES)
        try:
            doc.text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            line = raw[: exc.start].count(b"\n") + 1
            doc.error = ParseError(f"not UTF-8 text (byte {exc.start})", line=line)
        else:
            if values > MAX_VALUES:
                doc.error = ParseError(too_many_values(values), too_large=True)
                doc.text = ""
            else:
                try:
                    doc.value = loads_json(doc.text)
                except json.JSONDecodeError as exc:
                    doc.error = ParseError(exc.msg, line=exc.lineno, column=exc.colno)
                except RecursionError:
                    doc.error = ParseError("nesting too deep")
                except ValueError as exc:  # e.g. an integer beyond Python's digit limit
                    doc.error = ParseError(str(exc).split(";")[0])
        del raw
        if self._kept[0] + values <= KEEP_VALUES and self._kept[1] + len(doc.text) <= KEEP_BYTES:
            self._documents[rel] = doc
            self._kept[0] += values
            self._kept[1] += len(doc.text)
        return doc

    def parsed(self, rel: str) -> Document | None:
        """The document at `rel` if it was parsed already, else None (without reading anything)."""
        return self._documents.get(rel)

    def cached_head(self, rel: str, size: int) -> bytes | None:
        """The first `size` bytes of a document already read (parsed, or kept by document_bytes), without
        opening it again; None when it was not read."""
        raw = self._unparsed.get(rel)
        if raw is not None:
            return raw[:size]
        doc = self._documents.get(rel)
        return doc.text[:size].encode("utf-8")[:size] if doc is not None and doc.ok else None

    def json_value(self, rel: str) -> Any:
        """The parsed value, or None when missing or unparsable (the structure rules report those)."""
        doc = self.document(rel)
        return doc.value if doc is not None and doc.ok else None

    @property
    def manifest(self) -> dict:
        value = self.json_value(MANIFEST)
        return value if isinstance(value, dict) else {}

    @property
    def reload_spec(self) -> dict:
        value = self.json_value(RELOAD)
        return value if isinstance(value, dict) else {}

    @property
    def stops(self) -> dict:
        value = self.json_value(STOPS)
        return value if isinstance(value, dict) else {}

    def runs(self) -> list[dict]:
        runs = self.manifest.get("runs")
        return [r for r in runs if isinstance(r, dict)] if isinstance(runs, list) else []

    def artifacts(self) -> list[dict]:
        arts = self.manifest.get("artifacts")
        return [a for a in arts if isinstance(a, dict)] if isinstance(arts, list) else []

    def sha256(self, rel: str) -> str:
        """Hash a file a check needs the digest of; recorded so the seal can prove it did not change."""
        if rel in self.digests:
            return self.digests[rel]
        digest = hashlib.sha256()
        try:
            with self.open(rel) as fh:
                while chunk := fh.read(HASH_CHUNK):
                    digest.update(chunk)
        except OSError as exc:
            raise UsageError(f"{rel}: cannot read ({exc.strerror})") from exc
        self.digests[rel] = digest.hexdigest()
        return self.digests[rel]

    def iter_lines(self, rel: str) -> Iterator[tuple[int, bytes]]:
        """(line number, raw line without newline), streamed; for files too big to load."""
        try:
            with self.open(rel) as fh:
                for number, line in enumerate(fh, 1):
                    yield number, line.rstrip(b"\r\n")
        except OSError as exc:
            raise UsageError(f"{rel}: cannot read ({exc.strerror})") from exc




@dataclass(frozen=True)
class RunContext:
    """What a rule receives (`check(ctx)`): the inventory, the one documents reader over it, the run's options
    (options.py: settled once at the entry point, the environment with them), and the reload results once the
    reload phase ran (None when it was skipped). Frozen: a later phase gets `dataclasses.replace(ctx,
    reloads=...)`, the same documents reader handed on."""

    inventory: Inventory
    options: RunOptions
    documents: Documents = field(default=None, repr=False)  # type: ignore[assignment]  # built when not given
    reloads: tuple[ReloadResult, ...] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.options, RunOptions):
            raise TypeError(f"RunContext needs the run's RunOptions (settle()), not {type(self.options).__name__}")
        if self.documents is None:
            object.__setattr__(self, "documents", Documents(self.inventory))
        if self.reloads is not None:
            object.__setattr__(self, "reloads", tuple(self.reloads))

    @property
    def environment(self) -> Environment:
        return self.options.environment


def discover(root: str | os.PathLike) -> Inventory:
    """Walk the package once: its inventory, which nothing changes afterwards. Raises UsageError when it is not a
    readable folder."""
    root = Path(root)
    try:
        if not root.exists():
            raise UsageError(f"{root}: no such folder")
        if not root.is_dir():
            raise UsageError(f"{root}: not a folder (give the campaign's output folder)")
        resolver = LinkResolver()  # every link resolved once, iteratively: a chain costs its length, never its square
        real_root = resolver.resolve(root).path
        found = _Found({}, {}, set(), {})
        _walk(found, root, "", real_root, resolver)
    except OSError as exc:  # what _walk does not name itself: the root, or a path the system cannot name
        raise _unreadable(exc, exc.filename or root) from exc
    return Inventory(root, found.files, found.links, frozenset(found.dirs), found.specials)


@dataclass
class _Found:
    """The walk's entries while it walks; frozen into the Inventory when it ends."""

    files: dict[str, FileEntry]
    links: dict[str, LinkEntry]
    dirs: set[str]
    specials: dict[str, str]


def inside_package(root: str | os.PathLike, path: str | os.PathLike) -> bool:
    """Whether writing `path` (existing or not) would write inside the package folder `root`: both resolved,
    links followed in the path itself and in any parent. The guard for every file the tool writes (-o, --report)."""
    return _inside(real_path(path), real_path(root))


def shortened(path: str | os.PathLike, limit: int = 120) -> str:
    """A path for a one-line message: a 5,000-byte path shows its start and its end."""
    text = os.fspath(path)
    return text if len(text) <= limit else f"{text[:limit // 2]}…{text[-(limit // 2 - 1):]}"


def _unreadable(exc: OSError, where) -> UsageError:
    if exc.errno == errno.ENAMETOOLONG:
        length = len(os.fsencode(where))
        return UsageError(f"{shortened(where)}: path too long ({length} bytes; the system allows at most "
                          f"{os.pathconf('/', 'PC_PATH_MAX') - 1}): move the package to a shorter path or "
                          f"flatten its folders")
    if isinstance(exc, PermissionError):
        return UsageError(f"{shortened(where)}: permission denied")
    return UsageError(f"{shortened(where)}: cannot read ({exc.strerror or exc})")


def _inside(resolved: str, real_root: str) -> bool:
    return resolved == real_root or resolved.startswith(real_root.rstrip(os.sep) + os.sep)


def _walk(package: _Found, folder: Path, prefix: str, real_root: str, resolver: LinkResolver) -> None:
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except PermissionError as exc:
        raise UsageError(f"{prefix or '.'}: permission denied") from exc
    except OSError as exc:
        if exc.errno == errno.ENAMETOOLONG:
            raise _unreadable(exc, folder) from exc
        raise UsageError(f"{prefix or '.'}: cannot read folder ({exc.strerror})") from exc
    for entry in entries:
        rel = f"{prefix}{entry.name}"
        try:
            st = entry.stat(follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                target = os.readlink(entry.path)
                resolved = resolver.resolve(entry.path)
                package.links[rel] = LinkEntry(rel, target, resolved.path or entry.path,
                                               resolved.looped or _inside(resolved.path, real_root),
                                               resolved.looped or not os.path.exists(entry.path), resolved.looped)
                continue
        except OSError as exc:
            raise _unreadable(exc, entry.path if exc.errno == errno.ENAMETOOLONG else rel) from exc
        if stat.S_ISDIR(st.st_mode):
            package.dirs.add(rel)
            _walk(package, Path(entry.path), rel + "/", real_root, resolver)
        elif stat.S_ISREG(st.st_mode):
            package.files[rel] = FileEntry(rel, st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev, st.st_ctime_ns)
        else:
            kind = "fifo" if stat.S_ISFIFO(st.st_mode) else "socket" if stat.S_ISSOCK(st.st_mode) else "device"
            package.specials[rel] = kind


def pointer_of(path_parts) -> str:
    """RFC 6901 JSON pointer for a sequence of keys and indexes."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in path_parts)


def relpath_str(path: PurePosixPath | str) -> str:
    return str(path).replace(os.sep, "/")
