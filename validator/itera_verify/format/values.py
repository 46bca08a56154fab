"""Tolerant readings of JSON values: a hostile or malformed document never raises here."""
from __future__ import annotations

import math
from typing import Any


def is_number(value: Any) -> bool:
    """A finite int or float that arithmetic with floats can use (10**400 cannot)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False


def listed(container: dict, key: str) -> list:
    value = container.get(key)
    return value if isinstance(value, list) else []


def spoken_duration(seconds: float, seconds_with_minutes: bool = False) -> str:
    """A duration as a person reads it on a log line: 2 d 3 h, 3 h 12 min, 42 min (42 min 8 s with
    `seconds_with_minutes`), 8 s. The recorder's log and the report's rental warnings both say it so."""
    seconds = int(round(seconds))
    sign, seconds = ("-" if seconds < 0 else ""), abs(seconds)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{sign}{days} d {hours} h"
    if hours:
        return f"{sign}{hours} h {minutes} min"
    if minutes:
        return f"{sign}{minutes} min {secs} s" if seconds_with_minutes else f"{sign}{minutes} min"
    return f"{sign}{secs} s"
