"""Declared stop rules, checked live against each logged value (the reading of IV404, IV405, IV409 and IV412): a
non-finite loss, a floor (`below_threshold`) and a ceiling (`above_threshold`) on a metric, truncated inputs
(`truncated_input`, over the metric `inputs_truncated/<split>`). `no_usable_resume` is broken by a failed resume
proof (record/proofs.py)."""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..format.names import inputs_metric
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
        if rule["kind"] == "truncated_input":
            limit = rule.get("max_truncated", 0)
            if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
                raise RecordError(f"stop rule {rule['id']!r}: max_truncated is a count, 0 or more (got {limit!r})")
            if not isinstance(rule.get("split", "eval"), str) or not rule.get("split", "eval"):
                raise RecordError(f"stop rule {rule['id']!r}: split names the inputs it watches (default eval)")
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
        split = rule.get("split", "eval")
        if kind == "truncated_input" and name == inputs_metric("truncated", split) and (
                not finite or value > rule.get("max_truncated", 0)):
            count = str(int(value)) if finite and value.is_integer() else spelled(value)
            return Violation(rule["id"], step, name, value,
                             f"{count} {split} input(s) truncated at step {step}, over the rule's limit "
                             f"of {rule.get('max_truncated', 0)}")
    return None


def inputs_metrics(split: str, total: int, truncated: int) -> dict[str, int]:
    """The metric lines `run.inputs` writes; refused when the counts are no counts."""
    if not isinstance(split, str) or not split or "/" in split or split != split.strip():
        raise RecordError(f"inputs split {split!r}: a name such as eval or train")
    for what, count in (("total", total), ("truncated", truncated)):
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise RecordError(f"inputs {what} {count!r}: a count, 0 or more")
    if truncated > total:
        raise RecordError(f"inputs: {truncated} truncated out of {total}: more than the total")
    return {inputs_metric("total", split): total, inputs_metric("truncated", split): truncated}


def check_inputs(rules: list[dict], step: int, values: dict[str, float]) -> Violation | None:
    for name, value in values.items():
        violation = check(rules, step, name, float(value))
        if violation:
            return violation
    return None
