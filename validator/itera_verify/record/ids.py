"""Run ids, artifact ids and the campaign id name files and archive members (docs/format.md)."""
from __future__ import annotations

from ..format.names import ID
from .errors import RecordError


def check_id(kind: str, value: str) -> str:
    if not isinstance(value, str) or not ID.fullmatch(value):
        raise RecordError(f"{kind} {value!r} must match {ID.pattern} (it names files and archive members)")
    return value
