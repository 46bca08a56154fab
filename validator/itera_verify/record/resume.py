"""A hand-written loop's resume file, written by the recorder: one `.pt` holding exactly what the
`torch-resume` reload proves (model, optimizer, scheduler, rng, step, data_state, and scaler with fp16), saved
atomically and registered as the run's resume artifact.

Without it each user spells the dict by hand, and the usual slips (no scheduler, no RNG, `step` as a tensor or
a float, `data_state` forgotten) surface only as IV507/IV508 when the rental is nearly over. torch is imported
here only when a file is written: importing itera_verify never imports it.
"""
from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from .errors import RecordError
from .files import package_relative, replace_atomically
from .lock import package_lock
from .handle import RunRecord



def _state_dict(value: Any, what: str) -> dict:
    """An object's state_dict(), or a state dict given as such."""
    if isinstance(value, dict):
        return value
    method = getattr(value, "state_dict", None)
    if not callable(method):
        raise RecordError(f"{what}: pass the {what} itself or its state_dict(), not a {type(value).__name__}")
    return method()


def model_state(model: Any, trainable_only: bool) -> dict:
    """The weights to resume from: a module's trainable parameters (a LoRA's adapter tensors), or its whole
    state_dict(), or a state dict given as such; detached copies."""
    import torch

    if isinstance(model, torch.nn.Module):
        if trainable_only:
            state = {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}
        else:
            state = {name: t.detach().clone() for name, t in model.state_dict().items()}
    elif isinstance(model, dict):
        state = model
    else:
        raise RecordError(f"model: pass the module or its state dict, not a {type(model).__name__}")
    if not any(torch.is_tensor(t) for t in state.values()):
        raise RecordError("model: no tensor to save (with trainable_only=True, no parameter requires grad)")
    return state


def rng_states() -> dict:
    """Every generator a resume must restore to continue the same random stream: Python's, numpy's, torch's
    CPU one and, where CUDA is in use, one per GPU."""
    import numpy as np
    import torch

    states = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def check_position(step, data_state) -> None:
    """What every rank can check without building the state: the step count and the data position."""
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise RecordError(f"step: a non-negative integer (the optimizer steps taken), not {step!r}")
    if data_state is None:
        raise RecordError("data_state: where the data loader stands (e.g. {'epoch': 0, 'index': 128}), not None")


def resume_state(*, model, optimizer, scheduler, step: int, data_state, scaler=None,
                 trainable_only: bool = True) -> dict:
    check_position(step, data_state)
    state = {"model": model_state(model, trainable_only), "optimizer": _state_dict(optimizer, "optimizer"),
             "scheduler": _state_dict(scheduler, "scheduler"), "rng": rng_states(), "step": step,
             "data_state": data_state}
    if scaler is not None:
        state["scaler"] = _state_dict(scaler, "scaler")
    return state


def resume_target(run: RunRecord, path) -> str:
    """The file `path` names, package-relative: a `.pt` inside the package."""
    if Path(path).suffix != ".pt":
        raise RecordError(f"{path}: a torch-resume file is named *.pt")
    return package_relative(run.root, path)


def save_resume(run: RunRecord, target: str, state: dict) -> None:
    """torch.save `state` to the package file `target` (resume_target's), atomically, under the package lock (the
    writing process, rank 0, calls it)."""
    import torch

    with package_lock(run.root):  # a reopen's sweep of stale temporaries runs under it too
        replace_atomically(run.root, target, lambda handle: torch.save(state, handle))
