"""Readings behind IV409: which metrics are loss-like, what fp16 mixed precision excuses, and what the Trainer's
own `trainer_state.json` logs (its `log_history` keeps the NaN `grad_norm` even when a run's metrics file omits
it). Facts only; the stop-rule family turns them into findings.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..package import Package, pointer_of

TRAINER_STATE = "trainer_state.json"


def is_loss_like(name: str) -> bool:
    """`loss`, `*_loss`, `grad_norm` (also under a logger's prefix: `train/loss`, `train/grad_norm`)."""
    base = name.rsplit("/", 1)[-1].lower()
    return base == "loss" or base.endswith("_loss") or is_grad_norm(base)


def is_grad_norm(name: str) -> bool:
    base = name.rsplit("/", 1)[-1].lower()
    return base == "grad_norm" or base.endswith("_grad_norm")


def fp16_amp(package: Package, run: dict) -> bool:
    """The run's params say fp16 mixed precision (SPEC §6: `"fp16": true` or `"mixed_precision": "fp16"`)."""
    ref = run.get("params")
    rel = package.normalise_ref(ref) if isinstance(ref, str) else None
    params = package.json_value(rel) if rel and package.is_file(rel) else None
    return isinstance(params, dict) and (params.get("fp16") is True or params.get("mixed_precision") == "fp16")


@dataclass
class LoggedNonFinite:
    """The first non-finite value of one metric in one trainer_state.json's log_history."""

    path: str
    pointer: str
    metric: str
    step: object
    value: float
    count: int
    last_finite: bool  # the metric's last logged value is finite (an fp16 scaler skip recovered)


def trainer_log_nonfinite(package: Package, run_id: str) -> list[LoggedNonFinite]:
    """Non-finite loss-like values in the log_history of every trainer_state.json under the run's artifacts,
    one per metric (the first file in path order: each checkpoint repeats the history before it)."""
    found: dict[str, LoggedNonFinite] = {}
    for rel in _trainer_states(package, run_id):
        history = package.json_value(rel)
        history = history.get("log_history") if isinstance(history, dict) else None
        if not isinstance(history, list):
            continue  # a malformed file is the structure rules' or the reload's to report
        for metric, facts in _nonfinite_in_history(rel, history).items():
            found.setdefault(metric, facts)
    return [found[metric] for metric in sorted(found)]


def _trainer_states(package: Package, run_id: str) -> list[str]:
    paths: set[str] = set()
    for artifact in package.artifacts():
        ref = artifact.get("path")
        rel = package.normalise_ref(ref) if artifact.get("run") == run_id and isinstance(ref, str) else None
        if not rel:
            continue
        if rel.rsplit("/", 1)[-1] == TRAINER_STATE and package.is_file(rel):
            paths.add(rel)
        paths.update(p for p in package.files_under(rel) if p.rsplit("/", 1)[-1] == TRAINER_STATE)
    return sorted(paths)


def _nonfinite_in_history(rel: str, history: list) -> dict[str, LoggedNonFinite]:
    found: dict[str, LoggedNonFinite] = {}
    last: dict[str, float] = {}
    for index, entry in enumerate(history):
        if not isinstance(entry, dict):
            continue
        for key, value in entry.items():
            if not (isinstance(key, str) and isinstance(value, float) and is_loss_like(key)):
                continue
            last[key] = value
            if math.isfinite(value):
                continue
            if key in found:
                found[key].count += 1
            else:
                found[key] = LoggedNonFinite(rel, pointer_of(["log_history", index, key]), key, entry.get("step"),
                                             value, 1, False)
    for key, facts in found.items():
        facts.last_finite = math.isfinite(last[key])
    return found
