"""The search behind IV201 (rules/paths.py): what a temporary-directory path looks like (TmpMatcher), and where
such paths sit in a text file of any size (search_lines), read in blocks and never held whole.

Facts only, no findings: rules/paths.py declares and emits the codes. The leading underscore keeps this module
out of the rule registry.
"""
from __future__ import annotations

import os
import re
from typing import Iterator

from ..model import UsageError
from ..package import RunContext
from ..package.lineblocks import line_blocks

STANDARD_TMP = ("/tmp", "/var/tmp", "/dev/shm", "/run/user", "/private/var/folders", "/var/folders")
_BOUNDARY_BEFORE = r"(?<![A-Za-z0-9._~-])"
_BOUNDARY_AFTER = r"(?=[/\\\s\"'`,;:)\]}>]|$)"
_WINDOWS_TMP = r"\\\\?AppData\\\\?Local\\\\?Temp(?=\\|$|[\s\"'])"
_WINDOWS_TMP_LONGEST = len(rb"\\AppData\\Local\\Temp")  # the longest text _WINDOWS_TMP matches


def tmp_prefixes(ctx: RunContext) -> list[str]:
    prefixes = list(STANDARD_TMP)
    tmpdir = ctx.environment.tmpdir
    if tmpdir.startswith("/") and tmpdir.count("/") >= 1 and len(tmpdir) > 1:
        prefixes.append(tmpdir)
    prefixes += [p.rstrip("/") for p in ctx.options.tmp_patterns if p.rstrip("/")]
    return sorted(set(prefixes), key=len, reverse=True)


def tmp_regex(ctx: RunContext) -> re.Pattern[str]:
    alternatives = "|".join(re.escape(p) for p in tmp_prefixes(ctx))
    return re.compile(rf"{_BOUNDARY_BEFORE}(?:{alternatives}){_BOUNDARY_AFTER}|(?i:{_WINDOWS_TMP})")


class TmpMatcher:
    """The temporary-directory regex, behind a literal prefilter: `in` on bytes runs at memory speed, the
    regex with its look-behind does not, and almost no block of a clean package holds any anchor at all."""

    def __init__(self, ctx: RunContext):
        self.text = tmp_regex(ctx)
        self.bytes = re.compile(self.text.pattern.encode("utf-8"))
        prefixes = tmp_prefixes(ctx)
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


# ---- where in a text file: blocks, long lines in windows, line numbers counted on demand ---------------
BLOCK = 8 << 20
LONG_LINE = 8 << 20  # past this without a newline, a line is searched in overlapping windows, never held whole
SNIPPET_BEFORE, SNIPPET_AFTER = 20, 60  # bytes of the line a text finding shows around its match


def search_lines(ctx: RunContext, rel: str, matcher: TmpMatcher) -> Iterator[tuple[int, int, bytes]]:
    """(line number, 1-based column, the line's bytes around the match) of each line holding a match, searching
    whole blocks at a time: a per-line loop in Python costs more than the regex itself on a large metrics or
    predictions file. Lines are counted only up to a block that holds a match (almost never): counting every
    block costs as much as the search itself. A line longer than LONG_LINE is searched in windows as it is read."""
    lines = _LineCounter()
    offset = 0  # of the current piece in the file
    long_line: _LongLine | None = None
    try:
        with ctx.documents.open(rel) as fh:
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
