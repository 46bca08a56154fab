"""Checks shared by the two resume loaders: the optimizer fits the model and agrees with the step count, the
scheduler, RNG and scaler states load and can be restored."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from ..common import INCONSISTENT, LOAD, MISSING, Outcome, Stop, nonfinite_count, safe_torch_load

# Per-parameter optimizer state that has the parameter's own shape (AdamW, SGD momentum, RMSprop, Adagrad...).
SHAPED_STATE = ("exp_avg", "momentum_buffer", "exp_avg_sq", "square_avg", "sum", "acc_delta")


@dataclass
class OptimizerSummary:
    param_ids: list = field(default_factory=list)
    state_shapes: Counter = field(default_factory=Counter)
    steps: list[float] = field(default_factory=list)
    states: int = 0


def load_resume_file(job: dict, device, outcome: Outcome, needs: str, not_a: str) -> tuple[Path, dict]:
    """A one-file resume artifact (a torch-resume .pt, a Lightning .ckpt) loaded as the dict of its components;
    `needs`: what the loader takes, `not_a`: what a non-dict is not. Its keys go into the facts."""
    file = Path(job["path"])
    if not file.is_file():
        raise Stop(LOAD, f"{outcome.rel(file)} is not a file ({needs})")
    data = safe_torch_load(file, outcome, device)
    if not isinstance(data, dict):
        raise Stop(LOAD, f"{outcome.rel(file)} holds a {type(data).__name__}, not {not_a}", file)
    outcome.facts["keys"] = sorted(map(str, data))
    return file, data


def attempt(outcome: Outcome, check, *args, **kwargs):
    """Run one component check; a Stop becomes a recorded problem so the other components are still checked."""
    try:
        return check(*args, **kwargs)
    except Stop as stop:
        if stop.failure:
            outcome.fail(stop.failure, stop.message, stop.file)
        return None


def summarise_optimizer(state_dict, outcome: Outcome, file: Path) -> OptimizerSummary:
    import torch

    if not isinstance(state_dict, dict) or not isinstance(state_dict.get("state"), dict) \
            or not isinstance(state_dict.get("param_groups"), list):
        raise Stop(LOAD, f"{outcome.rel(file)} is not an optimizer state (no `state` and `param_groups`)", file)
    summary = OptimizerSummary()
    for group in state_dict["param_groups"]:
        summary.param_ids += list(group.get("params", [])) if isinstance(group, dict) else []
    listed = set(summary.param_ids)
    if len(listed) != len(summary.param_ids):
        raise Stop(INCONSISTENT, f"{outcome.rel(file)} lists a parameter in two groups: torch refuses to load it", file)
    for param_id, state in state_dict["state"].items():
        if not isinstance(state, dict):
            continue
        summary.states += 1
        if param_id not in listed:
            raise Stop(INCONSISTENT, f"{outcome.rel(file)}: state for parameter {param_id}, which no group lists", file)
        for key, value in state.items():
            if torch.is_tensor(value) and nonfinite_count(value):
                raise Stop(LOAD, f"{outcome.rel(file)}: non-finite values in the {key} of parameter {param_id}", file)
        shaped = next((state[k] for k in SHAPED_STATE if torch.is_tensor(state.get(k))), None)
        if shaped is not None:
            summary.state_shapes[tuple(shaped.shape)] += 1
        step = state.get("step")
        if torch.is_tensor(step) and step.numel() == 1:
            summary.steps.append(float(step.item()))
        elif isinstance(step, (int, float)):
            summary.steps.append(float(step))
    outcome.facts["optimizer_parameters"] = len(summary.param_ids)
    outcome.facts["optimizer_states"] = summary.states
    outcome.facts["optimizer_groups"] = len(state_dict["param_groups"])
    return summary


def check_fits(summary: OptimizerSummary, model_shapes: Counter, outcome: Outcome, file: Path, what: str) -> None:
    """The optimizer's parameters are the model's trainable ones: same count, shapes drawn from the model's.

    Fewer optimizer parameters than model tensors is allowed (frozen parameters, buffers, tied weights saved
    twice in a state dict); more, or a shape the model does not have, is not.
    """
    count, available = len(summary.param_ids), sum(model_shapes.values())
    outcome.facts["optimizer_covers"] = f"{count} of {available} {what}"
    if count > available:
        raise Stop(INCONSISTENT, f"{outcome.rel(file)} holds state for {count} parameters, the model has "
                                 f"{available} {what}", file)
    extra = summary.state_shapes - model_shapes
    if extra:
        shown = ", ".join(f"{list(shape)}×{n}" for shape, n in list(extra.items())[:4])
        raise Stop(INCONSISTENT, f"{outcome.rel(file)} holds state shaped for another model: {shown} "
                                 f"not among the model's {what}", file)


def check_step(summary: OptimizerSummary, expected: int | None, outcome: Outcome, file: Path, against: str,
               fp16: bool) -> None:
    """The optimizer's own step count equals the recorded step (an fp16 scaler may have skipped a few)."""
    if not summary.steps:
        outcome.facts["optimizer_step"] = None  # an optimizer without a step count (plain SGD): nothing to compare
        return
    step = int(max(summary.steps))
    outcome.facts["optimizer_step"] = step
    if expected is None or step == expected:
        return
    if fp16 and step < expected:
        outcome.facts["steps_skipped_by_scaler"] = expected - step
        return
    raise Stop(INCONSISTENT, f"the optimizer has taken {step} step(s) but {against} is {expected}: the optimizer "
                             "state is not the one of this point of training", file)


def check_scheduler(state, outcome: Outcome, file: Path, expected: int | None = None, against: str = "",
                    fp16: bool = False) -> None:
    """A scheduler state; given the recorded step (`expected`, named `against`), a per-step scheduler's
    last_epoch equals it: the Trainer steps it once per optimizer step (an fp16 scaler's skipped steps excepted),
    so another count is a scheduler.pt from another checkpoint and a resume would replay the wrong schedule."""
    if not isinstance(state, dict):
        raise Stop(LOAD, f"{outcome.rel(file)} is not a scheduler state (a dict)", file)
    last_epoch = state.get("last_epoch")
    if "last_epoch" in state:
        outcome.facts["scheduler_last_epoch"] = last_epoch
    # ReduceLROnPlateau counts evaluations, not steps (the Trainer steps it on a metric).
    if expected is None or "patience" in state or not isinstance(last_epoch, int) or isinstance(last_epoch, bool):
        return
    if outcome.facts.get("optimizer_step") == last_epoch:
        return  # it agrees with the optimizer: a recorded step apart from both is the optimizer check's, once
    if last_epoch != expected and not (fp16 and last_epoch < expected):
        raise Stop(INCONSISTENT, f"{outcome.rel(file)}: the scheduler has stepped {last_epoch} time(s) "
                                 f"(last_epoch) but {against} is {expected}: the scheduler state is not the one "
                                 "of this point of training (files from different checkpoints were mixed)", file)


def check_scaler(state, outcome: Outcome, file: Path) -> None:
    if not isinstance(state, dict) or "scale" not in state:
        raise Stop(LOAD, f"{outcome.rel(file)} is not a gradient-scaler state (no `scale`)", file)
    scale = float(state["scale"].item() if hasattr(state["scale"], "item") else state["scale"])
    if not scale > 0 or scale == float("inf"):
        raise Stop(LOAD, f"{outcome.rel(file)}: gradient scale {scale} is unusable", file)
    outcome.facts["scaler_scale"] = scale


def restore_rng(state, outcome: Outcome, file: Path, device, required: tuple[str, ...] = ()) -> list[str]:
    """Apply each RNG state in this (disposable) process: proof that a resume could restore it."""
    import random

    import numpy as np
    import torch

    if not isinstance(state, dict):
        raise Stop(LOAD, f"{outcome.rel(file)} is not an RNG state (a dict)", file)
    for key in required:
        if key not in state:
            raise Stop(MISSING, f"{outcome.rel(file)} lacks the {key} RNG state", file)
    restorers = {
        "python": random.setstate,
        "numpy": np.random.set_state,
        "cpu": lambda s: torch.set_rng_state(s.cpu()),
        "torch": lambda s: torch.set_rng_state(s.cpu()),
    }
    if device.type == "cuda":
        restorers["cuda"] = _restore_cuda_rng
    restored = []
    for key, restore in restorers.items():
        if key in state:
            try:
                restore(state[key])
            except Exception as exc:
                raise Stop(LOAD, f"{outcome.rel(file)}: the {key} RNG state cannot be restored ({exc})", file) from exc
            restored.append(key)
    return restored


def _restore_cuda_rng(state) -> None:
    """One state per GPU of the training machine: restore those this machine has."""
    import torch

    states = list(state) if isinstance(state, (list, tuple)) else [state]
    for index, device_state in enumerate(states[: torch.cuda.device_count()]):
        torch.cuda.set_rng_state(device_state.cpu(), index)
