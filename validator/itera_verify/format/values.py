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
