"""`--format json`: the stable machine shape, one document."""
from __future__ import annotations

import json

from . import Report


def render(report: Report, options: dict) -> str:
    return json.dumps(report.to_json(), indent=2, allow_nan=False, default=str) + "\n"
