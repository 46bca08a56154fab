"""`SHA256SUMS` in the format of coreutils `sha256sum`, so `sha256sum -c` checks it with nothing else installed.

A line is `<64 hex>  <name>`. A name holding a backslash, a newline or a carriage return is escaped the way
`sha256sum` (coreutils 9) writes it: the line starts with `\\` and those characters become `\\\\`, `\\n`, `\\r`.
Names are str with surrogate escapes for bytes that are not UTF-8, so any Linux file name round-trips.
"""
from __future__ import annotations

import re

_ESCAPES = {"\\": "\\\\", "\n": "\\n", "\r": "\\r"}
_UNESCAPES = {"\\": "\\", "n": "\n", "r": "\r"}
_HEX = re.compile(rb"[0-9a-fA-F]{64}")


class SumsError(ValueError):
    """A malformed SHA256SUMS line (with its 1-based line number)."""

    def __init__(self, line: int, message: str):
        super().__init__(f"line {line}: {message}")
        self.line = line


def format_line(hexdigest: str, name: str) -> bytes:
    """One line of sha256sum output, newline included."""
    if any(c in name for c in _ESCAPES):
        escaped = "".join(_ESCAPES.get(c, c) for c in name)
        return f"\\{hexdigest}  {escaped}\n".encode("utf-8", "surrogateescape")
    return f"{hexdigest}  {name}\n".encode("utf-8", "surrogateescape")


def format_sums(digests: dict[str, str]) -> bytes:
    """The whole file, one line per name in sorted order (byte order of the UTF-8 name, like `sort` in C)."""
    names = sorted(digests, key=lambda n: n.encode("utf-8", "surrogateescape"))
    return b"".join(format_line(digests[name], name) for name in names)


def _unescape(text: str, line: int) -> str:
    out, chars = [], iter(text)
    for c in chars:
        if c != "\\":
            out.append(c)
            continue
        nxt = next(chars, "")
        if nxt not in _UNESCAPES:
            raise SumsError(line, f"invalid escape \\{nxt} in the file name")
        out.append(_UNESCAPES[nxt])
    return "".join(out)


def parse_sums(data: bytes) -> dict[str, str]:
    """{name: lowercase hex}. Raises SumsError on a malformed line or a name listed twice."""
    sums: dict[str, str] = {}
    for number, raw in enumerate(data.split(b"\n"), 1):
        if not raw:
            continue
        escaped = raw.startswith(b"\\")
        body = raw[1:] if escaped else raw
        if not _HEX.fullmatch(body[:64]) or body[64:66] not in (b"  ", b" *") or len(body) < 67:
            raise SumsError(number, "not `<64 hex>  <name>`")
        name = body[66:].decode("utf-8", "surrogateescape")
        if escaped:
            name = _unescape(name, number)
        if name in sums:
            raise SumsError(number, f"{name!r} is listed twice")
        sums[name] = body[:64].decode("ascii").lower()
    return sums
