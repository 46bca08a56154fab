"""Loader `lightning-checkpoint`: a PyTorch Lightning `.ckpt` file, loaded with weights_only=True.

A resumable checkpoint holds `state_dict`, `optimizer_states`, `lr_schedulers`, `loops` (progress and data
position) and `global_step`; one saved with save_weights_only=True lacks the optimizer and schedulers and cannot
resume (IV507). Each optimizer state fits state_dict's tensors and its step agrees with global_step.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path

from ..common import LOAD, MISSING, Outcome, Stop, nonfinite_count
from . import _resume

COMPONENTS = {"state_dict": "the weights", "optimizer_states": "the optimizer states",
              "lr_schedulers": "the LR scheduler states", "loops": "the loops' progress and data position",
              "global_step": "the step reached"}


def check_state_dict(state, outcome: Outcome, file: Path) -> Counter:
    import torch

    if not isinstance(state, dict) or not state:
        raise Stop(LOAD, f"{outcome.rel(file)}: `state_dict` is not a non-empty state dict", file)
    bad = [name for name, tensor in state.items() if torch.is_tensor(tensor) and nonfinite_count(tensor)]
    outcome.facts["model_tensors"] = len(state)
    if bad:
        raise Stop(LOAD, f"{outcome.rel(file)}: non-finite weights in {', '.join(map(str, bad[:5]))}", file)
    return Counter(tuple(t.shape) for t in state.values() if torch.is_tensor(t))


def reload(job: dict, device, outcome: Outcome) -> None:
    file, data = _resume.load_resume_file(job, device, outcome, "lightning-checkpoint needs one .ckpt file",
                                          "a Lightning checkpoint")
    missing = [key for key in COMPONENTS if key not in data]
    if missing:
        weights_only = "state_dict" in data and "optimizer_states" not in data
        outcome.fail(MISSING, f"{outcome.rel(file)} has no {', '.join(f'`{k}`' for k in missing)} "
                              f"({'; '.join(COMPONENTS[k] for k in missing)})"
                              + (": it was saved with save_weights_only=True and cannot resume" if weights_only
                                 else ": the run cannot resume exactly"), file)
    shapes = _resume.attempt(outcome, check_state_dict, data.get("state_dict"), outcome, file) \
        if "state_dict" in data else None
    step = data.get("global_step")
    if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
        outcome.fail(LOAD, f"{outcome.rel(file)}: global_step is {step!r}, not a step count", file)
        step = None
    outcome.facts["global_step"] = step
    optimizers = data.get("optimizer_states")
    if "optimizer_states" in data and (not isinstance(optimizers, list) or not optimizers):
        outcome.fail(MISSING, f"{outcome.rel(file)}: `optimizer_states` is empty", file)
    for state in optimizers if isinstance(optimizers, list) else []:
        summary = _resume.attempt(outcome, _resume.summarise_optimizer, state, outcome, file)
        if summary is None:
            continue
        if shapes is not None:
            _resume.attempt(outcome, _resume.check_fits, summary, shapes, outcome, file, "tensors in `state_dict`")
        if len(optimizers) == 1:  # global_step counts the steps of all optimizers together
            _resume.attempt(outcome, _resume.check_step, summary, step, outcome, file, "global_step", False)
    for state in data.get("lr_schedulers") or []:
        _resume.attempt(outcome, _resume.check_scheduler, state, outcome, file)
    outcome.forward = "not run: a Lightning checkpoint holds no architecture"
