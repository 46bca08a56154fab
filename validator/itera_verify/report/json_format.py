"""`--format json`: the stable machine shape, one document."""
from __future__ import annotations

import json
import math

from . import Report


def render(report: Report, options: dict) -> str:
    return json.dumps(finite(report.to_json()), indent=2, allow_nan=False, default=str) + "\n"


def finite(value):
    """JSON has no NaN or Infinity: a non-finite number copied from a hostile package becomes null."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(item) for item in value]
    return value
