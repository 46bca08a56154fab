"""Safe extraction of an untrusted tar.zst into a private folder, hashing every member on the way.

Returns facts (what was extracted, what was refused and why, the digests, the stream's fate); the audit
workflow turns them into findings. Defences:

- the archive starts with its top folder, named as the seal names it (canonical.py: never `.local`, `.ssh`,
  `.git`...), or nothing at all is extracted (NotCanonical); every other member lies beneath it;
- every header is the one the seal writes for its member (canonical.py: modes, owners, times, types, encoding),
  or the member is refused before anything is written for it: no setuid bit, foreign owner, 0777 folder,
  hard link, device or fifo;
- names: absolute, `..`, empty or NUL-bearing names are refused, as is anything outside the one top folder;
- every file is created through folder descriptors opened with O_NOFOLLOW, with O_EXCL: a write can never go
  through a symbolic link or replace something already extracted, whatever order members come in;
- links: a symlink whose target is absolute or climbs out of the top folder is refused; once everything is
  extracted each symlink is resolved for real (links.py: each once, iteratively) and removed if it lands outside
  (chains of inside-looking links) or needs more than 40 links on its way (the kernel's ELOOP); at most MAX_LINKS
  links are extracted;
- counts: past `member_limit(max_expanded)` members the stream is refused (TooManyMembers), so an archive of
  empty files costs a bounded number of inodes and facts, like a bomb a bounded number of bytes;
- names that differ only in case or Unicode normalisation (or whose folders do) are refused, the second one:
  `tar -x` on a case-insensitive disk (macOS, Windows) would write one over the other;
- names seen twice, names with empty or `.` components: refused (the reader has already refused every header
  outside the seal's profile, archive/profile.py, and the whole stream with it);
- the caller's reserved folder (`Reserved`: the seal's `SEAL/`) is never written into the tree: the members it
  names as kept are held in memory (bounded); every file there, kept or not, is hashed and, when the caller
  gives a `seal_side` folder, written there (outside the tree) so it can be scanned like every file; the
  extracted tree is the package as it was sealed.

Besides what it extracted, the result says what `tar -xf` would act on: every member's header facts in order
(`headers`, refused members too: canonical.member_listing) and the skippable zstd frames that hold bytes.
"""
from __future__ import annotations

import hashlib
import os
import queue
import threading
from dataclasses import dataclass, field
from typing import Callable

from ..format.names import folded
from .canonical import HeaderFacts, NotCanonical, top_folder_problem
from .errors import ArchiveError, TooManyMembers
from .links import MAX_HOPS, TOO_MANY, LinkResolver
from .reader import ArchiveReader, Member
from .zstdframes import Skipped


# One member per 32 KiB of the allowed expanded size (--max-size), at least 4,096: 32,768 members at the default
# 1 GiB. Each member costs the audit about 70 µs of CPU (its header rebuilt and compared, an inode created, hashed
# and listed) and about 1 KiB of memory, as much as a few MB of content; real packages hold hundreds to a few tens
# of thousands of files (20,000 pass at the smallest default), and a larger one raises --max-size.
MEMBER_BYTES = 32 << 10
MIN_MEMBERS = 4096
# A package's links are aliases (checkpoints/best -> checkpoint-400): a few, thousands at the very most.
MAX_LINKS = 10_000
# A piece of a member at least this large is hashed on a helper thread while this one writes it; a smaller one is
# not worth the two hand-offs.
HASH_BESIDE_MIN = 256 << 10


def member_limit(max_expanded: int | None) -> int | None:
    """How many members an archive may hold when it may expand to `max_expanded` bytes (None: no limit)."""
    return None if max_expanded is None else max(MIN_MEMBERS, max_expanded // MEMBER_BYTES)


@dataclass(frozen=True)
class Reserved:
    """A folder under the top folder that the caller's format reserves (the audit: the seal's `SEAL/`), with
    names relative to the top folder: `kept` members are held in memory up to their size limit, `written` are
    all the members the format puts there; anything else there is reported in Extraction.seal_extras."""

    folder: str
    kept: dict[str, int]
    written: frozenset[str]


@dataclass
class Extraction:
    top: str | None = None
    files: dict[str, str] = field(default_factory=dict)  # name under the top folder -> sha256 (regular files)
    seal_files: dict[str, bytes] = field(default_factory=dict)  # the reserved folder's kept members
    seal_side: dict[str, str] = field(default_factory=dict)  # its files -> where they were written (to scan)
    seal_extras: list[tuple[str, str]] = field(default_factory=list)  # (a member there it never holds, what)
    refused: list[tuple[str, str]] = field(default_factory=list)  # (member name, why)
    members: int = 0
    error: ArchiveError | None = None
    archive_sha256: str = ""
    archive_bytes: int = 0
    expanded_bytes: int = 0
    headers: list[HeaderFacts] = field(default_factory=list)  # every member read, in order (refused ones too)
    skippable: Skipped = field(default_factory=Skipped)  # the skippable zstd frames that hold bytes


def member_parts(name: str) -> list[str] | str:
    """The name's components, or why it is unsafe."""
    if "\0" in name:
        return "a NUL byte in the name"
    if name.startswith("/"):
        return "an absolute name"
    parts = (name[:-1] if name.endswith("/") else name).split("/")  # only a directory ends in / (the reader)
    if ".." in parts:
        return "`..` in the name"
    if parts == [""]:
        return "an empty name"
    if "" in parts or "." in parts:
        return "a name with empty or `.` components (the seal writes none; tools resolve them differently)"
    return parts


def link_escapes(link_parts: list[str], target: str) -> bool:
    """Whether a symlink at link_parts (top folder first) pointing at target leaves the top folder, lexically."""
    if target.startswith("/") or "\0" in target or not target:
        return True
    depth = 0
    for part in link_parts[1:-1] + target.split("/"):
        if part in ("", "."):
            continue
        depth = depth - 1 if part == ".." else depth + 1
        if depth < 0:
            return True
    return False


class _Tree:
    """Creation under one root folder through descriptors, never following a link."""

    FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)

    def __init__(self, root: str):
        self.root = root
        self.root_fd = os.open(root, self.FLAGS)
        self._cached: tuple[tuple[str, ...], int] | None = None

    def folder(self, parts: list[str], create: bool) -> int:
        """A descriptor of the folder `parts` (cached: members come sorted, siblings share it)."""
        key = tuple(parts)
        if self._cached and self._cached[0] == key:
            return self._cached[1]
        fd = os.dup(self.root_fd)
        try:
            for part in parts:
                if create:
                    try:
                        os.mkdir(part, 0o700, dir_fd=fd)
                    except FileExistsError:
                        pass
                next_fd = os.open(part, self.FLAGS, dir_fd=fd)
                os.close(fd)
                fd = next_fd
        except BaseException:
            os.close(fd)
            raise
        if self._cached:
            os.close(self._cached[1])
        self._cached = (key, fd)
        return fd

    def create_file(self, parts: list[str]) -> int:
        parent = self.folder(parts[:-1], create=True)
        return os.open(parts[-1], os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=parent)

    def close(self) -> None:
        if self._cached:
            os.close(self._cached[1])
            self._cached = None
        os.close(self.root_fd)


def _write_all(fd: int, data: memoryview) -> None:
    while data:
        data = data[os.write(fd, data):]


class _HashBeside:
    """A helper thread that hashes a piece while the extracting thread writes it. SHA-256 and write() both
    release the GIL: on two cores they overlap, where one after the other they made the extracting thread the
    audit's critical path. The caller waits for the digest before it asks for the next piece, so the piece stays
    valid while it is hashed (ArchiveReader.data's contract) and the digest sees the pieces in order."""

    def __init__(self):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._done: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._alone = False  # no thread could be started

    def update_writing(self, digest, piece: memoryview, fd: int) -> None:
        """digest.update(piece) and _write_all(fd, piece), side by side for a piece of HASH_BESIDE_MIN bytes or
        more; both done when this returns."""
        if len(piece) >= HASH_BESIDE_MIN and self._started():
            self._beside(digest, piece, fd)
        else:
            digest.update(piece)
            _write_all(fd, piece)

    def _started(self) -> bool:
        """Whether the helper runs (started at its first piece); False where no thread can be started."""
        if self._thread is None and not self._alone:
            # "archive-": a fork refuses to run beside it (runtime/launcher.py TOOL_THREADS)
            thread = threading.Thread(target=self._run, name="archive-extract-digest", daemon=True)
            try:
                thread.start()
            except RuntimeError:  # "can't start new thread" (a process limit): hash here, one after the other
                self._alone = True
            else:
                self._thread = thread
        return self._thread is not None

    def _beside(self, digest, piece: memoryview, fd: int) -> None:
        self._jobs.put((digest, piece))
        try:
            _write_all(fd, piece)
        finally:
            error = self._done.get()
        if error is not None:
            raise error

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            digest, piece = job
            try:
                digest.update(piece)
            except BaseException as exc:  # noqa: BLE001 - raised in the extracting thread
                self._done.put(exc)
            else:
                self._done.put(None)

    def close(self) -> None:
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join()
            self._thread = None


class _Extractor:
    def __init__(self, root: str, result: Extraction, on_bytes: Callable[[int], None],
                 seal_side: str | None = None, reserved: Reserved | None = None):
        self.tree = _Tree(root)
        self.reserved = reserved
        self.seal_side = seal_side
        self.root = root
        self.result = result
        self.on_bytes = on_bytes
        self.seen: set[str] = set()
        self.folded: dict[str, str] = {}  # every name and folder extracted, folded -> as the archive spells it
        self.seen_folders: set[str] = set()  # the folders of the names in `folded`, as spelt
        self.symlinks: list[list[str]] = []
        self.refused_links: set[str] = set()  # a member beneath one would go where the link pointed
        self.hasher = _HashBeside()

    def refuse(self, member: Member, why: str) -> None:
        self.result.refused.append((member.name, why))

    def add(self, reader: ArchiveReader, member: Member) -> None:
        if self.result.top is None:  # the first member: the top folder itself, or nothing is extracted
            problem = top_folder_problem(member.name, member.typeflag) or member.not_canonical
            if problem:
                raise NotCanonical(problem, member.name)
            self.result.top = member.name[:-1]
            self.seen.add("")
            self.tree.folder([self.result.top], create=True)
            return
        parts = member_parts(member.name)
        if isinstance(parts, str):
            return self.refuse(member, parts)
        if parts[0] != self.result.top:
            return self.refuse(member, f"outside the package folder {self.result.top}/")
        rel = "/".join(parts[1:])
        if any("/".join(parts[1:depth]) in self.refused_links for depth in range(2, len(parts))):
            return self.refuse(member, "beneath a link that was refused")
        if rel in self.seen:
            return self.refuse(member, "a second member with this name (which one a tool keeps is ambiguous)")
        self.seen.add(rel)
        twin = self._case_twin(parts)
        if twin is not None:
            return self.refuse(member, f"its name differs from {self.result.top}/{twin} only in case or Unicode "
                                       "normalisation: tar on a case-insensitive disk (macOS, Windows) writes one "
                                       "over the other")
        if member.not_canonical:  # nothing is written for it, nor beneath it unless it is a folder (a link)
            if member.kind != "directory":
                self.refused_links.add(rel)
            return self.refuse(member, f"{member.not_canonical} (a header the seal never writes)")
        if member.kind != "file" and member.size:
            return self.refuse(member, f"a {member.kind} announcing {member.size} bytes of data")
        if self.reserved is not None and (rel == self.reserved.folder or rel.startswith(self.reserved.folder + "/")):
            return self._seal_member(reader, member, rel)
        try:
            getattr(self, "_" + member.kind.replace("-", "_"), self._unsupported)(reader, member, parts, rel)
        except OSError as exc:
            self.refuse(member, f"cannot be extracted safely ({exc.strerror or exc}: a link or file in its way)")

    def _case_twin(self, parts: list[str]) -> str | None:
        """The name already extracted that this one (or one of its folders) equals on a case-insensitive disk;
        None when there is none, and then the name and its folders are remembered."""
        names = ["/".join(parts[1:depth]) for depth in range(2, len(parts) + 1)]
        new = [name for name in names if name not in self.seen_folders]  # a folder met before was checked then
        for name in new:
            earlier = self.folded.get(folded(name))
            if earlier is not None and earlier != name:
                return earlier
        for name in new:
            self.folded.setdefault(folded(name), name)
        self.seen_folders.update(names[:-1])
        return None

    def _file(self, reader: ArchiveReader, member: Member, parts: list[str], rel: str) -> None:
        """Every byte is written whole and hashed (IV512 compares tensor payloads without --reload too)."""
        fd = self.tree.create_file(parts)
        digest = hashlib.sha256()
        try:
            for piece in reader.data(member):
                self.hasher.update_writing(digest, piece, fd)
                self.on_bytes(len(piece))
        finally:
            os.close(fd)
        self.result.files[rel] = digest.hexdigest()

    def _directory(self, reader, member: Member, parts: list[str], rel: str) -> None:
        self.tree.folder(parts, create=True)

    def _symlink(self, reader, member: Member, parts: list[str], rel: str) -> None:
        if link_escapes(parts, member.linkname):
            self.refused_links.add(rel)
            return self.refuse(member, f"a link leaving the package ({member.linkname})")
        if len(self.symlinks) >= MAX_LINKS:
            self.refused_links.add(rel)
            return self.refuse(member, f"more than {MAX_LINKS} links in one archive (a package's links are a few "
                                       "aliases)")
        os.symlink(member.linkname, parts[-1], dir_fd=self.tree.folder(parts[:-1], create=True))
        self.symlinks.append(parts)

    def _unsupported(self, reader, member: Member, parts: list[str], rel: str) -> None:
        what = {"fifo": "a fifo", "char-device": "a character device", "block-device": "a block device"}
        self.refuse(member, what.get(member.kind, f"an unsupported member type {member.typeflag!r}"))

    def _seal_member(self, reader: ArchiveReader, member: Member, rel: str) -> None:
        reserved = self.reserved
        if rel == reserved.folder and member.kind == "directory":
            return
        if member.kind not in ("file", "directory"):
            return self.refuse(member, f"a {member.kind} inside {reserved.folder}/")
        if rel not in reserved.written or member.kind == "directory":
            # Never trusted, whatever SHA256SUMS says; a file is still hashed (and scanned by the caller) below.
            self.result.seal_extras.append((member.name, f"a {member.kind} the seal never writes"))
            if member.kind == "directory":
                return
        limit = reserved.kept.get(rel)
        if limit is not None and member.size > limit:
            return self.refuse(member, f"{member.size} bytes, more than a seal record can be ({limit})")
        digest, kept, fd = hashlib.sha256(), [], None
        if self.seal_side is not None:
            side = os.path.join(self.seal_side, f"{len(self.result.seal_side)}-{rel.rsplit('/', 1)[-1]}"[:200])
            fd = os.open(side, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            self.result.seal_side[rel] = side
        try:
            for piece in reader.data(member):
                digest.update(piece)
                if limit is not None:
                    kept.append(bytes(piece))
                if fd is not None:
                    _write_all(fd, piece)
                self.on_bytes(len(piece))
        finally:
            if fd is not None:
                os.close(fd)
        self.result.files[rel] = digest.hexdigest()
        if limit is not None:
            self.result.seal_files[rel] = b"".join(kept)

    def check_symlinks(self) -> None:
        """Resolve every extracted symlink for real (all of them before removing any: removing one changes
        where the others lead); remove those that land outside the top folder or need too many links."""
        resolver = LinkResolver()
        top = resolver.resolve(os.path.join(self.root, self.result.top or "")).path
        refused = []
        for parts in self.symlinks:
            path = os.path.join(self.root, *parts)
            resolved = resolver.resolve(path)
            if resolved.looped:
                refused.append((parts, path, f"{TOO_MANY}: more than {MAX_HOPS} links on its way (the kernel "
                                             "refuses it, ELOOP), or a loop"))
            elif not _within(resolved.path, top):
                refused.append((parts, path, "a link leaving the package through other links"))
        for parts, path, why in refused:
            os.unlink(path)
            self.result.refused.append(("/".join(parts), why))


def _within(path: str, top: str) -> bool:
    return path == top or path.startswith(top + os.sep)


def safe_extract(fileobj, root: str, *, max_expanded: int | None,
                 on_bytes: Callable[[int], None] = lambda n: None, hash_archive: bool = True,
                 seal_side: str | None = None, reserved: Reserved | None = None) -> Extraction:
    """Extract into `root` (an empty private folder). Never raises for a bad archive: see Extraction.error.

    `hash_archive=False` leaves the archive's own SHA-256 to the caller (archive_sha256 stays "");
    `reserved`: the folder kept out of the tree (the seal's SEAL/); `seal_side`: an empty private folder
    outside `root` for its files other than the kept ones."""
    result = Extraction()
    extractor = _Extractor(root, result, on_bytes, seal_side, reserved)
    most_members = member_limit(max_expanded)
    reader = None
    try:
        reader = ArchiveReader(fileobj, max_expanded=max_expanded, frames="scan", hash_archive=hash_archive)
        for member in reader:
            result.members += 1
            if most_members is not None and result.members > most_members:
                raise TooManyMembers(f"more than {most_members} members (one per {MEMBER_BYTES // 1024} KiB of "
                                     f"the {max_expanded} bytes it may expand to)")
            result.headers.append((member.name, member.kind, member.size, member.mode, member.mtime,
                                   member.linkname))
            extractor.add(reader, member)
        result.archive_sha256, result.archive_bytes = reader.archive_sha256, reader.archive_bytes
        result.skippable = reader.skippable
    except ArchiveError as exc:
        result.error = exc
    finally:
        try:
            extractor.tree.close()
        finally:
            try:
                extractor.hasher.close()
            finally:
                if reader is not None:  # its threads end even when a close above raised
                    reader.close()
                    result.expanded_bytes = reader.expanded_bytes
    extractor.check_symlinks()
    return result
