"""IV201–IV205: paths that only worked on the rented machine, links that leave the package, escaping references."""
from __future__ import annotations

import json
import os
import re
import struct
from typing import Any, Iterator

import yaml

from ..package.jsonpos import line_of, pointer_lines
from ..package.files import open_binary
from ..package.lineblocks import line_blocks
from ..package.layout import references
from ..model import Finding, Rule, Severity, UsageError
from ..package import MANIFEST, RELOAD, Package, pointer_of
from ..package.pickles.strings import pickled_strings

# Relative CPU time on a package of many files; run_checks balances its processes by it.
COST = 25  # searches every text file and pickle; parses only the JSON documents that could hold a path

RULES = [
    Rule("IV201", Severity.ERROR, "temporary-directory path",
         explain="A path under /tmp/, /var/tmp/, /dev/shm/, /run/user/, /private/var/folders/, /var/folders/, "
                 "$TMPDIR or Windows' \\AppData\\Local\\Temp\\ inside a file or a config value points at "
                 "something that vanished with the rental. Checked in text files, JSON and YAML values, "
                 "config.json, adapter_config.json, safetensors metadata and pickled strings. Write paths "
                 "relative to the package, or hub ids.",
         bad='{"output_dir": "/tmp/run3"}', good='{"output_dir": "runs/3"}'),
    Rule("IV202", Severity.WARNING, "absolute path outside the package",
         explain="An absolute path in a config value that points outside the package will not exist on the "
                 "reviewer's machine. Prefer a path relative to the package root, or a hub id at a revision.",
         bad='{"base_model_name_or_path": "/home/alice/models/base"}',
         good='{"base_model_name_or_path": "org/base-model"}'),
    Rule("IV203", Severity.ERROR, "symbolic link leaves the package",
         explain="A link that resolves outside the package (or into a temporary directory) delivers nothing: the "
                 "archive would hold a link to a file the reviewer does not have. A link that stays inside the "
                 "package is fine wherever the package itself lives. Copy the target in instead.",
         bad="artifacts/base -> /home/alice/.cache/huggingface/hub/...", good="artifacts/latest -> checkpoint-400"),
    Rule("IV204", Severity.ERROR, "broken symbolic link",
         explain="A link whose target does not exist: the file it stood for was moved or never written.",
         bad="checkpoints/best -> checkpoint-900  (missing)", good="checkpoints/best -> checkpoint-400"),
    Rule("IV205", Severity.ERROR, "referenced path escapes the package",
         explain="Every path in manifest.json and reload.json is relative to the package root and stays inside "
                 "it: no absolute path, no `..` that climbs out.",
         bad='{"params": "../params/control.json"}', good='{"params": "params/control.json"}'),
]

STANDARD_TMP = ("/tmp", "/var/tmp", "/dev/shm", "/run/user", "/private/var/folders", "/var/folders")
TEXT_SUFFIXES = {"jsonl", "csv", "tsv", "txt", "md", "rst", "log", "py", "sh", "cfg", "ini", "toml", "ipynb", ""}
PICKLE_SUFFIXES = {"bin", "pt", "pth", "pkl", "pickle", "ckpt"}
MAX_BINARY_SCAN = 64 << 20  # pickled configs are small; weights files are not searched byte by byte
MAX_DOCUMENT = 256 << 20
BLOCK = 8 << 20
LONG_LINE = 8 << 20  # past this without a newline, a line is searched in overlapping windows, never held whole
SNIPPET_BEFORE, SNIPPET_AFTER = 20, 60  # bytes of the line a text finding shows around its match
PER_FILE = 5  # findings shown per file before a count
_BOUNDARY_BEFORE = r"(?<![A-Za-z0-9._~-])"
_BOUNDARY_AFTER = r"(?=[/\\\s\"'`,;:)\]}>]|$)"
_WINDOWS_TMP = r"\\\\?AppData\\\\?Local\\\\?Temp(?=\\|$|[\s\"'])"
_WINDOWS_TMP_LONGEST = len(rb"\\AppData\\Local\\Temp")  # the longest text _WINDOWS_TMP matches
_ABSOLUTE_POSIX = re.compile(r"^/[^/\s]+(/[^/\s]*)+$")
_ABSOLUTE_WINDOWS = re.compile(r"^[A-Za-z]:[\\/]")


def tmp_prefixes(package: Package) -> list[str]:
    prefixes = list(STANDARD_TMP)
    tmpdir = os.environ.get("TMPDIR", "").rstrip("/")
    if tmpdir.startswith("/") and tmpdir.count("/") >= 1 and len(tmpdir) > 1:
        prefixes.append(tmpdir)
    prefixes += [p.rstrip("/") for p in package.tmp_patterns if p.rstrip("/")]
    return sorted(set(prefixes), key=len, reverse=True)


def tmp_regex(package: Package) -> re.Pattern[str]:
    alternatives = "|".join(re.escape(p) for p in tmp_prefixes(package))
    return re.compile(rf"{_BOUNDARY_BEFORE}(?:{alternatives}){_BOUNDARY_AFTER}|(?i:{_WINDOWS_TMP})")


class TmpMatcher:
    """The temporary-directory regex, behind a literal prefilter: `in` on bytes runs at memory speed, the
    regex with its look-behind does not, and almost no block of a clean package holds any anchor at all."""

    def __init__(self, package: Package):
        self.text = tmp_regex(package)
        self.bytes = re.compile(self.text.pattern.encode("utf-8"))
        prefixes = tmp_prefixes(package)
        anchors = {p.rsplit("/", 1)[-1].lower() for p in prefixes} | {"temp"}
        self.anchors = tuple(a for a in anchors if a)
        self.byte_anchors = tuple(a.encode("utf-8") for a in self.anchors)
        # Every match starts with a prefix's first character, or with the backslash of the Windows form. A
        # single-byte `in` is a memchr (tens of GB/s): a block holding none of them is done without lower().
        self.leads = tuple({p[0] for p in prefixes} | {"\\"})
        self.byte_leads = tuple({lead.encode("utf-8")[:1] for lead in self.leads})
        # The boundaries are look-arounds, so a match is one prefix or the Windows form: no match is longer.
        self.longest = max(_WINDOWS_TMP_LONGEST, *(len(p.encode("utf-8")) for p in prefixes))
        # What any path a rule here reports must contain: a temporary prefix's first character, "/" (an absolute
        # POSIX path, or a JSON-escaped "\/") or "\\" (a Windows path, or a \uXXXX escape that may hide one).
        self.path_leads = tuple(set(self.leads) | {"/", "\\"})
        self.path_byte_leads = tuple({lead.encode("utf-8")[:1] for lead in self.path_leads})

    def may_match_text(self, text: str) -> bool:
        if not any(lead in text for lead in self.leads):
            return False
        lowered = text.lower()
        return any(anchor in lowered for anchor in self.anchors)

    def may_match_bytes(self, data: bytes) -> bool:
        if not any(lead in data for lead in self.byte_leads):
            return False
        lowered = data.lower()
        return any(anchor in lowered for anchor in self.byte_anchors)


def check(package: Package) -> Iterator[Finding]:
    matcher = TmpMatcher(package)
    text_pattern = matcher.text
    root = os.path.realpath(package.root)
    for rel in sorted(package.files):
        entry = package.files[rel]
        if entry.size == 0:
            continue
        name = rel.rsplit("/", 1)[-1]
        suffix = name.rsplit(".", 1)[-1].lower() if "." in name else ""
        if suffix in ("json", "yaml", "yml") and entry.size <= MAX_DOCUMENT:
            yield from _document_values(package, rel, suffix, matcher, root)
        elif suffix == "safetensors":
            yield from _safetensors_metadata(package, rel, text_pattern)
        elif suffix in PICKLE_SUFFIXES and entry.size <= MAX_BINARY_SCAN:
            yield from _binary(package, rel, matcher)
        elif suffix in TEXT_SUFFIXES:
            yield from _text_lines(package, rel, matcher)
    yield from _links(package, text_pattern)
    yield from _escaping_references(package)


def _limited(findings: Iterator[Finding], rel: str, what: str) -> Iterator[Finding]:
    count = 0
    for finding in findings:
        count += 1
        if count <= PER_FILE:
            yield finding
    if count > PER_FILE:
        yield Finding("IV201", rel, message=f"{count - PER_FILE} more {what} in this file")


def _strings(value: Any, path: list) -> Iterator[tuple[list, str]]:
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _strings(item, [*path, key])
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _strings(item, [*path, index])


def _document_values(package: Package, rel: str, suffix: str, matcher: TmpMatcher, root: str) -> Iterator[Finding]:
    pattern = matcher.text
    if suffix == "json":
        if package.parsed(rel) is None and package.is_file(rel):
            raw = package.document_bytes(rel)  # kept for the family that parses it (structure), if any
            if not _holds_any(raw, matcher.path_byte_leads):
                return  # no character a path needs: not even parsed (most of many small documents)
        doc = package.document(rel)
        if doc is None or not doc.ok:
            return
        text = doc.text
        if not _may_hold_paths(text, matcher):
            return  # most documents name no path at all: skip walking their values
        value = doc.value
    else:
        try:
            text = package.read_bytes(rel).decode("utf-8")
            value = yaml.safe_load(text)
        except (UnicodeDecodeError, yaml.YAMLError):
            return  # IV104 reports it
    tmp_hits, outside_hits = [], []
    for path, string in _strings(value, []):
        if pattern.search(string):
            tmp_hits.append((path, string))
        elif _points_outside(string, root):
            outside_hits.append((path, string))
    line_cache: list[dict] = []  # pointer -> line, computed once and only when a JSON document has a finding

    def located(path: list) -> tuple[str, int | None]:
        pointer = pointer_of(path)
        if suffix != "json":
            return pointer, None
        if not line_cache:
            line_cache.append(pointer_lines(text))
        return pointer, line_of(text, pointer, line_cache[0])

    for path, string in tmp_hits[:PER_FILE]:
        pointer, line = located(path)
        yield Finding("IV201", rel, pointer=pointer, line=line, message=f"temporary-directory path {_short(string)}")
    if len(tmp_hits) > PER_FILE:
        yield Finding("IV201", rel, message=f"{len(tmp_hits) - PER_FILE} more temporary-directory paths in this file")
    for path, string in outside_hits[:PER_FILE]:
        pointer, line = located(path)
        yield Finding("IV202", rel, pointer=pointer, line=line,
                      message=f"absolute path outside the package: {_short(string)}")

_VALUE_MAY_BE_ABSOLUTE = re.compile(r'"(?:/|\\/|[A-Za-z]:(?:\\\\|/|\\/))')


def _may_hold_paths(text: str, matcher: TmpMatcher) -> bool:
    """A cheap look at the raw JSON text: could any string value be a temporary or absolute path?

    JSON may escape "/" as "\\/" and may escape any character as \\uXXXX, so those texts are always walked."""
    if not _holds_any(text, matcher.path_leads):
        return False  # two or three scans at memory speed, where the regex below walks the text in Python's re
    if "\\u" in text:
        return True
    return bool(_VALUE_MAY_BE_ABSOLUTE.search(text) or matcher.may_match_text(text))


def _holds_any(data, leads) -> bool:
    for lead in leads:  # a plain loop: any() over a generator costs more than the scans on a small document
        if lead in data:
            return True
    return False


def _points_outside(value: str, root: str) -> bool:
    if _ABSOLUTE_WINDOWS.match(value):
        return True
    if not _ABSOLUTE_POSIX.match(value):
        return False
    return not (value == root or value.startswith(root.rstrip("/") + "/"))


def _short(value: str) -> str:
    return json.dumps(value if len(value) <= 120 else value[:117] + "...")


def _text_lines(package: Package, rel: str, matcher: TmpMatcher) -> Iterator[Finding]:
    def hits() -> Iterator[Finding]:
        for number, column, snippet in _search_lines(package, rel, matcher):
            yield Finding("IV201", rel, line=number, column=column,
                          message=f"temporary-directory path in text: …{snippet.decode('utf-8', 'replace')}…")
    yield from _limited(hits(), rel, "temporary-directory paths")


def _search_lines(package: Package, rel: str, matcher: TmpMatcher) -> Iterator[tuple[int, int, bytes]]:
    """(line number, 1-based column, the line's bytes around the match) of each line holding a match, searching
    whole blocks at a time: a per-line loop in Python costs more than the regex itself on a large metrics or
    predictions file. Lines are counted only up to a block that holds a match (almost never): counting every
    block costs as much as the search itself. A line longer than LONG_LINE is searched in windows as it is read."""
    lines = _LineCounter()
    offset = 0  # of the current piece in the file
    long_line: _LongLine | None = None
    try:
        with open_binary(package.abspath(rel)) as fh:
            for data, whole in line_blocks(fh, BLOCK, LONG_LINE):
                if long_line is None and not whole:
                    long_line = _LongLine(offset, matcher)
                start = 0  # where the piece's own lines begin
                if long_line is not None:  # the piece is part of the long line, or opens with its end
                    hit, start = long_line.take(data, whole)  # the hit comes when the line ends
                    if hit:
                        yield lines.before(fh, long_line.start) + 1, *hit
                    long_line = None if whole else long_line
                if start < len(data):
                    for newlines, column, snippet in _block_hits(data, start, matcher):
                        yield lines.before(fh, offset) + newlines + 1, column, snippet
                offset += len(data)
    except OSError as exc:
        raise UsageError(f"{rel}: cannot read ({exc.strerror})") from exc


def _block_hits(block: bytes, start: int, matcher: TmpMatcher) -> Iterator[tuple[int, int, bytes]]:
    """(newlines before the line, 1-based column, snippet) of the first match on each line of `block` (whole
    lines) from `start` on; the prefilter keeps a clean block to one pass at memory speed."""
    if not matcher.may_match_bytes(block):
        return
    position = start
    for match in matcher.bytes.finditer(block, start):
        if match.start() < position:
            continue  # one finding per line
        line_start = block.rfind(b"\n", 0, match.start()) + 1
        line_end = block.find(b"\n", match.start())
        line_end = len(block) if line_end < 0 else line_end
        column = match.start() - line_start + 1
        yield block.count(b"\n", 0, line_start), column, _snippet(block[line_start:line_end].rstrip(b"\r"), column)
        position = line_end


def _snippet(line: bytes, column: int) -> bytes:
    return line[max(0, column - 1 - SNIPPET_BEFORE):column - 1 + SNIPPET_AFTER]


class _LongLine:
    """A line longer than LONG_LINE, searched window by window as it is read: never held whole.

    A window is the part just read, after the last bytes of the window before. A window that does not end the
    line takes only the matches that start at least `overlap` bytes before its end: a match is at most
    `matcher.longest` bytes plus one byte of look-ahead, so such a match, the byte after it and its snippet lie
    in the window. A match starting later (across the boundary) is left to the next window, which begins with
    those `overlap` bytes and SNIPPET_BEFORE more (for the look-behind and the snippet): each match start is
    looked at in exactly one window, and the first match of the line is the one a whole-line search finds."""

    def __init__(self, start: int, matcher: TmpMatcher):
        self.start = start  # file offset of the line
        self.matcher = matcher
        self.overlap = max(matcher.longest + 1, SNIPPET_AFTER)
        self.kept = b""  # the line's last bytes read, the next window's beginning
        self.read = 0  # bytes of the line read so far
        self.searched = 0  # matches starting before this offset in the line were looked for
        self.hit: tuple[int, bytes] | None = None  # (1-based column, snippet) of the line's first match
        self.cr_after = True  # nothing but CRs after the snippet: trailing CRs, which a line never shows

    def take(self, data: bytes, whole: bool) -> tuple[tuple[int, bytes] | None, int]:
        """For a piece of line_blocks: (the line's hit once the line ends in it, where the piece's own lines
        begin). A piece that is not whole is all the line's; a whole one ends it at its first newline, or at its
        end (the file's). The hit waits for the line's end, which alone tells whether its CRs are trailing."""
        end = data.find(b"\n") if whole else -1
        end = len(data) if end < 0 else end
        part = data[:end]
        if self.hit is None:
            self._search(part, last=whole)
        elif self.cr_after:
            self.cr_after = part.count(b"\r") == len(part)
        if not whole or self.hit is None:
            return None, end + 1
        column, snippet = self.hit
        return (column, snippet.rstrip(b"\r") if self.cr_after else snippet), end + 1

    def _search(self, part: bytes, last: bool) -> None:
        window = self.kept + part
        origin = self.read - len(self.kept)  # offset in the line of window[0]
        begin = self.searched - origin
        limit = len(window) if last else max(begin, len(window) - self.overlap)
        self.read += len(part)
        self.searched = origin + limit
        self.kept = window[max(0, limit - SNIPPET_BEFORE):]
        match = self.matcher.bytes.search(window, begin) if self.matcher.may_match_bytes(window) else None
        if match is None or match.start() >= limit:
            return
        after = match.start() + SNIPPET_AFTER  # where the snippet ends in the window
        self.hit = origin + match.start() + 1, _snippet(window, match.start() + 1)
        self.cr_after = window.count(b"\r", after) == max(0, len(window) - after)


class _LineCounter:
    """Newlines in a file before a byte offset, counted with pread on demand and remembered (offsets only grow)."""

    def __init__(self):
        self.offset = self.count = 0

    def before(self, fh, offset: int) -> int:
        while self.offset < offset:
            data = os.pread(fh.fileno(), min(BLOCK, offset - self.offset), self.offset)
            if not data:
                break
            self.count += data.count(b"\n")
            self.offset += len(data)
        return self.count


def _binary(package: Package, rel: str, matcher: TmpMatcher) -> Iterator[Finding]:
    """Pickled configs (training_args.bin) keep their strings as plain bytes: an output_dir under /tmp shows."""
    data = package.read_bytes(rel)
    if not matcher.may_match_bytes(data):
        return
    strings = pickled_strings(data)
    if strings is not None:  # a pickle: the exact strings it holds, not bytes that run into the next opcode
        hits = dict.fromkeys(s for s in strings if matcher.may_match_text(s) and matcher.text.search(s))
        yield from _limited((Finding("IV201", rel, message=f"temporary-directory path stored in the pickle: "
                                     f"{_short(text)}; the file is a record of the run, so fix the run: train "
                                     "with a relative output_dir (and relative paths elsewhere), or leave the "
                                     "file out of the package") for text in hits), rel, "temporary-directory paths")
        return
    seen = set()
    for match in matcher.bytes.finditer(data):
        end = match.end()
        while end < len(data) and end - match.start() < 120 and 32 <= data[end] < 127 and data[end] not in b"\"'":
            end += 1
        text = data[match.start():end].decode("ascii", "replace")
        if text not in seen:
            seen.add(text)
            if len(seen) <= PER_FILE:
                yield Finding("IV201", rel, message=f"temporary-directory path stored in the file: {_short(text)}")


def _safetensors_metadata(package: Package, rel: str, pattern: re.Pattern[str]) -> Iterator[Finding]:
    try:
        with open_binary(package.abspath(rel)) as fh:
            (length,) = struct.unpack("<Q", fh.read(8))
            if length > 100_000_000:
                return  # the reload reports an invalid header
            header = json.loads(fh.read(length))
    except OSError as exc:  # a file that cannot be read is unreadable input, with or without --no-reload
        raise UsageError(f"{rel}: cannot read ({exc.strerror or exc})") from exc
    except (struct.error, ValueError, RecursionError):
        return  # the reload reports a header that does not parse
    metadata = header.get("__metadata__") if isinstance(header, dict) else None
    for key, value in (metadata.items() if isinstance(metadata, dict) else []):
        if isinstance(value, str) and pattern.search(value):
            yield Finding("IV201", rel, pointer=pointer_of(["__metadata__", key]),
                          message=f"temporary-directory path in safetensors metadata {key}: {_short(value)}")


def _links(package: Package, pattern: re.Pattern[str]) -> Iterator[Finding]:
    for rel, link in sorted(package.links.items()):
        if link.broken:
            yield Finding("IV204", rel, message=f"broken symbolic link -> {link.target}")
        if not link.inside:
            into_tmp = bool(pattern.search(link.resolved) or pattern.search(link.target))
            where = "into a temporary directory" if into_tmp else "outside the package"
            yield Finding("IV203", rel, message=f"symbolic link {where}: -> {link.target}")


def _escaping_references(package: Package) -> Iterator[Finding]:
    for ref in references(package):
        if package.normalise_ref(ref.value) is None:
            yield Finding("IV205", MANIFEST, pointer=ref.pointer, run=ref.run,
                          message=f"{ref.kind} path {ref.value!r} is absolute or climbs out of the package")
    entries = package.reload_spec.get("artifacts")
    for artifact_id, entry in (entries.items() if isinstance(entries, dict) else []):
        path = entry.get("path") if isinstance(entry, dict) else None
        if isinstance(path, str) and package.normalise_ref(path) is None:
            yield Finding("IV205", RELOAD, pointer=pointer_of(["artifacts", artifact_id, "path"]), artifact=artifact_id,
                          message=f"path {entry['path']!r} is absolute or climbs out of the package")
