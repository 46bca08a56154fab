"""Line numbers for JSON pointers, so a schema finding says where to look in the file, not just the pointer."""
from __future__ import annotations

import bisect
import json
import re

_WS = re.compile(r"[ \t\n\r]*")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.S)
_SCALAR = re.compile(r"[^,\]\}\s]+")


def _escape(token) -> str:
    return str(token).replace("~", "~0").replace("/", "~1")


def pointer_lines(text: str) -> dict[str, int]:
    """Map every JSON pointer of an already-valid JSON text to the 1-based line where its value starts."""
    newlines = [m.start() for m in re.finditer("\n", text)]
    lines: dict[str, int] = {}

    def skip(pos: int) -> int:
        return _WS.match(text, pos).end()

    def value(pos: int, pointer: str) -> int:
        pos = skip(pos)
        lines[pointer] = bisect.bisect_right(newlines, pos - 1) + 1
        char = text[pos]
        if char == "{":
            pos = skip(pos + 1)
            if text[pos] == "}":
                return pos + 1
            while True:
                match = _STRING.match(text, pos)
                key = json.loads(match.group())
                pos = skip(match.end()) + 1  # the colon
                pos = skip(value(pos, f"{pointer}/{_escape(key)}"))
                if text[pos] == ",":
                    pos = skip(pos + 1)
                    continue
                return pos + 1
        if char == "[":
            pos = skip(pos + 1)
            if text[pos] == "]":
                return pos + 1
            index = 0
            while True:
                pos = skip(value(pos, f"{pointer}/{index}"))
                index += 1
                if text[pos] == ",":
                    pos = skip(pos + 1)
                    continue
                return pos + 1
        match = (_STRING if char == '"' else _SCALAR).match(text, pos)
        return match.end()

    try:
        value(0, "")
    except (RecursionError, IndexError, AttributeError, ValueError):
        pass  # a best effort: findings keep their pointer even when no line can be given
    return lines


def line_of(text: str, pointer: str, cache: dict | None = None) -> int | None:
    lines = pointer_lines(text) if cache is None else cache
    while pointer:
        if pointer in lines:
            return lines[pointer]
        pointer = pointer.rsplit("/", 1)[0]  # a missing key: point at the object that lacks it
    return lines.get("")


LOCATED_MAX_CHARS = 2 << 20  # a larger document (a long trainer_state.json) keeps pointers without lines


def locate(documents, findings) -> None:
    """Give each finding that has a JSON pointer but no line the line its pointer names (the nearest existing
    parent's, for a missing key), read from the document the rules parsed: SARIF, the GitHub annotations and the
    text point at a line. A document that does not parse, or is too large, leaves them as they are."""
    lines_of: dict[str, dict | None] = {}
    for finding in findings:
        if finding.pointer is None or finding.line is not None or not finding.path \
                or not finding.path.endswith(".json"):
            continue
        if finding.path not in lines_of:
            entry = documents.inventory.files.get(finding.path)
            try:  # a large document is not read again for a line
                doc = documents.document(finding.path) if entry is not None and entry.size <= LOCATED_MAX_CHARS \
                    else None
            except Exception:  # noqa: BLE001 - a file that cannot be read again keeps its pointer
                doc = None
            ok = doc is not None and doc.ok and 0 < len(doc.text) <= LOCATED_MAX_CHARS
            lines_of[finding.path] = pointer_lines(doc.text) if ok else None
        lines = lines_of[finding.path]
        if lines:
            finding.line = line_of("", finding.pointer, lines)
