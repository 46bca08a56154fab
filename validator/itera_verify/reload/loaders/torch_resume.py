"""Loader `torch-resume`: one .pt file of a hand-written loop holding model, optimizer, scheduler, rng, step and
data_state (and scaler with fp16), loaded with weights_only=True; the same proofs as a Trainer checkpoint."""
from __future__ import annotations

from collections import Counter
from pathlib import Path

from ..common import INCONSISTENT, LOAD, MISSING, Outcome, Stop, nonfinite_count
from ...format import layouts
from . import _resume



def model_tensors(state, outcome: Outcome, file: Path, prefix: str = "") -> dict:
    """name -> tensor of the `model` entry (nested dicts flattened), each one non-empty and finite."""
    import torch

    if torch.is_tensor(state):
        return {prefix or "model": state}
    if not isinstance(state, dict):
        raise Stop(LOAD, f"{outcome.rel(file)}: `model` is not a state dict", file)
    tensors = {}
    for key, value in state.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict) or torch.is_tensor(value):
            tensors.update(model_tensors(value, outcome, file, name))
    return tensors


def check_model(state, outcome: Outcome, file: Path) -> Counter:
    tensors = model_tensors(state, outcome, file)
    if not tensors:
        raise Stop(LOAD, f"{outcome.rel(file)}: `model` holds no tensor", file)
    empty = [n for n, t in tensors.items() if t.numel() == 0]
    bad = [f"{n} ({nonfinite_count(t)} non-finite)" for n, t in tensors.items() if nonfinite_count(t)]
    outcome.facts["model_tensors"] = len(tensors)
    if empty:
        raise Stop(LOAD, f"{outcome.rel(file)}: {len(empty)} empty model tensor(s): {', '.join(empty[:4])}", file)
    if bad:
        raise Stop(LOAD, f"{outcome.rel(file)}: non-finite weights in {', '.join(bad[:4])}", file)
    return Counter(tuple(t.shape) for t in tensors.values())


def read_step(value, outcome: Outcome, file: Path) -> int:
    step = value.item() if hasattr(value, "item") else value
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise Stop(INCONSISTENT, f"{outcome.rel(file)}: `step` is {value!r}, not a step count", file)
    outcome.facts["step"] = step
    return step


def check_optimizer(state, model_shapes: Counter | None, step, fp16: bool, outcome: Outcome, file: Path) -> None:
    summary = _resume.summarise_optimizer(state, outcome, file)
    if model_shapes is not None:
        # In a LoRA resume file `model` holds the trainable tensors only; a full one may add buffers.
        _resume.check_fits(summary, model_shapes, outcome, file, "tensors in `model`")
    _resume.check_step(summary, step, outcome, file, "`step`", fp16)


def reload(job: dict, device, outcome: Outcome) -> None:
    file, data = _resume.load_resume_file(job, device, outcome, "torch-resume needs one .pt file",
                                          "a dict of resume components")
    fp16 = bool(job.get("fp16"))
    for need in layouts.resume_key_requirements(outcome.rel(file), data, fp16=fp16):
        outcome.fail(MISSING, need.message, file, requirement=need.id)
    shapes = _resume.attempt(outcome, check_model, data["model"], outcome, file) if "model" in data else None
    step = _resume.attempt(outcome, read_step, data["step"], outcome, file) if "step" in data else None
    if "optimizer" in data:
        _resume.attempt(outcome, check_optimizer, data["optimizer"], shapes, step, fp16, outcome, file)
    if "scheduler" in data:
        _resume.attempt(outcome, _resume.check_scheduler, data["scheduler"], outcome, file)
    if "rng" in data:
        restored = _resume.attempt(outcome, _resume.restore_rng, data["rng"], outcome, file, device)
        outcome.facts["rng_restored"] = restored or []
    if "scaler" in data and fp16:
        _resume.attempt(outcome, _resume.check_scaler, data["scaler"], outcome, file)
    if "data_state" in data:
        outcome.facts["data_state"] = type(data["data_state"]).__name__
    if "data_state" in data and data["data_state"] is None:
        outcome.fail(MISSING, f"{outcome.rel(file)}: `data_state` is empty (None)", file)
    outcome.forward = "not run: a torch-resume file holds no architecture"
