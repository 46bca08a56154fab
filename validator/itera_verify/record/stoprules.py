"""Declared stop rules, checked live against each logged value (the reading of IV404, IV405 and IV409): a
non-finite loss, a floor (`below_threshold`) and a ceiling (`above_threshold`) on a metric."""
from __future__ import annotations

import math
from dataclasses import dataclass

from .errors import RecordError

KINDS = ("nonfinite_loss", "below_threshold", "above_threshold", "truncated_input", "no_usable_resume")
THRESHOLDS = ("below_threshold", "above_threshold")  # a floor, a ceiling


@dataclass(frozen=True)
class Violation:
    rule: str  # the declared rule's id
    step: int
    metric: str
    value: float
    reason: str


def is_loss_like(name: str) -> bool:
    """What IV409 calls loss-like: a non-finite one in a run that was not stopped is an error."""
    return name in ("loss", "grad_norm") or name.endswith("_loss")


def validate_rules(rules: list[dict]) -> list[dict]:
    if not isinstance(rules, list) or not rules:
        raise RecordError("stop rules: give a non-empty list of {id, kind, metric?, threshold?}")
    seen = set()
    for rule in rules:
        if not isinstance(rule, dict) or not isinstance(rule.get("id"), str) or rule.get("kind") not in KINDS:
            raise RecordError(f"stop rule {rule!r}: needs an id and a kind among {', '.join(KINDS)}")
        if rule["id"] in seen:
            raise RecordError(f"stop rule id {rule['id']!r} is declared twice")
        seen.add(rule["id"])
        if rule["kind"] in ("nonfinite_loss", *THRESHOLDS) and not isinstance(rule.get("metric"), str):
            raise RecordError(f"stop rule {rule['id']!r} ({rule['kind']}) needs the metric it watches")
        threshold = rule.get("threshold")
        if rule["kind"] in THRESHOLDS and (isinstance(threshold, bool) or not isinstance(threshold, (int, float))
                                           or not math.isfinite(threshold)):
            raise RecordError(f"stop rule {rule['id']!r} ({rule['kind']}) needs a numeric threshold")
    return [dict(rule) for rule in rules]


def spelled(value: float) -> str:
    """A value as the metrics file and the checker's messages spell it: NaN, Infinity, -Infinity for non-finite."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return repr(value)


def check(rules: list[dict], step: int, name: str, value: float) -> Violation | None:
    """The first declared rule that `name = value` at `step` breaks, if any."""
    finite = math.isfinite(value)
    for rule in rules:
        kind = rule.get("kind")
        if kind == "nonfinite_loss" and not finite and (name == rule.get("metric") or is_loss_like(name)):
            # A non-finite grad_norm is the Trainer's masked NaN (FIELD-NOTES): the weights are garbage too.
            return Violation(rule["id"], step, name, value, f"{name} became {spelled(value)} at step {step}")
        if kind == "below_threshold" and name == rule.get("metric") and (not finite or value < rule["threshold"]):
            return Violation(rule["id"], step, name, value,
                             f"{name} = {spelled(value)} at step {step}, under the floor {rule['threshold']}")
        if kind == "above_threshold" and name == rule.get("metric") and (not finite or value > rule["threshold"]):
            return Violation(rule["id"], step, name, value,
                             f"{name} = {spelled(value)} at step {step}, above the ceiling {rule['threshold']}")
    return None
