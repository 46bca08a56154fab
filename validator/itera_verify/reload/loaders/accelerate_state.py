"""Loader `accelerate-state`: an `Accelerator.save_state` folder.

Per model index i (0 has no suffix): `model[_i].safetensors` or `pytorch_model[_i].bin`; per optimizer index
`optimizer[_i].bin`, per scheduler `scheduler[_i].bin`; per process `random_states_<rank>.pkl`; `scaler.pt` with
fp16. Every component present for every index and every rank, all loaded with weights_only=True; each optimizer
fits its model; its step agrees with the scheduler's, which AcceleratedScheduler steps once per process for
each optimizer step (unless the batches were split, then once).
"""
from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from ..common import (
    INCONSISTENT,
    LOAD,
    MISSING,
    Outcome,
    Stop,
    nonfinite_count,
    safe_torch_load,
)
from ...format import layouts
from . import _ranks, _resume, _trainer_layouts
from ._zero import check_zero_checkpoint

MODEL = re.compile(r"(?:model|pytorch_model|pytorch_model_fsdp)(?:_(\d+))?\.(safetensors|bin)")
OPTIMIZER = re.compile(r"optimizer(?:_(\d+))?\.bin")
SCHEDULER = re.compile(r"scheduler(?:_(\d+))?\.bin")
RANDOM_STATES = re.compile(r"random_states_(\d+)\.pkl")


def model_shapes(file: Path, device, outcome: Outcome) -> Counter:
    """Shapes of the model's tensors, each finite (accelerate drops a tied copy such as lm_head on save)."""
    if file.suffix == ".safetensors":
        from safetensors import SafetensorError, safe_open

        tensors = {}
        try:
            with safe_open(str(file), framework="pt", device="cpu") as handle:
                tensors = {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118 - a safe_open handle is no dict
        except (SafetensorError, OSError) as exc:
            raise Stop(LOAD, f"{outcome.rel(file)} is not a valid safetensors file: {exc}", file) from exc
    else:
        tensors = safe_torch_load(file, outcome, device)
        if not isinstance(tensors, dict):
            raise Stop(LOAD, f"{outcome.rel(file)} is not a state dict", file)
    bad = [name for name, tensor in tensors.items() if hasattr(tensor, "shape") and nonfinite_count(tensor)]
    if bad:
        raise Stop(LOAD, f"{outcome.rel(file)}: non-finite weights in {', '.join(bad[:5])}", file)
    outcome.facts["model_tensors"] = outcome.facts.get("model_tensors", 0) + len(tensors)
    return Counter(tuple(t.shape) for t in tensors.values() if hasattr(t, "shape"))


def check_random_states(file: Path, outcome: Outcome) -> None:
    import torch

    state = safe_torch_load(file, outcome, torch.device("cpu"))
    if not isinstance(state, dict):
        raise Stop(LOAD, f"{outcome.rel(file)} is not accelerate's RNG state (a dict)", file)
    for key in ("random_state", "numpy_random_seed", "torch_manual_seed"):
        if key not in state:
            raise Stop(MISSING, f"{outcome.rel(file)} lacks {key}: that process's RNG cannot be restored", file)
    _resume.restore_rng({"python": state["random_state"], "numpy": state["numpy_random_seed"],
                         "cpu": state["torch_manual_seed"]}, outcome, file, torch.device("cpu"))


def _indexed(folder: Path, pattern: re.Pattern) -> dict[int, Path]:
    found = {}
    for path in sorted(folder.iterdir()):
        match = pattern.fullmatch(path.name)
        if match and path.is_file():
            found.setdefault(int(match.group(1) or 0), path)
    return found


def reload(job: dict, device, outcome: Outcome) -> None:
    folder = Path(job["path"])
    if not folder.is_dir():
        raise Stop(LOAD, f"{outcome.rel(folder)} is not an Accelerator.save_state folder")
    models, optimizers = _indexed(folder, MODEL), _indexed(folder, OPTIMIZER)
    schedulers, ranks = _indexed(folder, SCHEDULER), _ranks.rank_files(folder, RANDOM_STATES)
    layout = layouts.detect((p.name for p in folder.iterdir() if p.is_file()),
                            (p.name for p in folder.iterdir() if p.is_dir()))
    fsdp_model = None
    outcome.facts["layout"] = layout
    if layout == layouts.DEEPSPEED:
        # Under DeepSpeed the engine saves model, optimizer and its scheduler (`latest` names pytorch_model/).
        check_zero_checkpoint(folder, job, device, outcome)
    elif layout == layouts.FSDP:  # sharded FSDP: pytorch_model_fsdp_<i>/ and optimizer_<i>/
        for need in layouts.fsdp_requirements(outcome.rel(folder), (p.name for p in folder.iterdir() if p.is_dir())):
            outcome.unmet(need, folder)
        fsdp_model = _trainer_layouts.check_fsdp(folder, job, device, outcome, None)
    elif not models:
        outcome.fail(MISSING, f"no model.safetensors (or pytorch_model.bin) in {outcome.rel(folder)}",
                     folder / "model.safetensors")
    required = [("RNG state", ranks, "random_states_0.pkl")]
    if layout == layouts.SINGLE:
        required += [("optimizer", optimizers, "optimizer.bin"), ("scheduler", schedulers, "scheduler.bin")]
    for what, found, name in required:
        if not found:
            outcome.fail(MISSING, f"no {name} in {outcome.rel(folder)}: the {what} cannot resume", folder / name)
    for index in sorted(set(optimizers) - set(models)):
        outcome.fail(MISSING, f"{optimizers[index].name} has no model file of index {index}", optimizers[index])
    if job.get("fp16") and not (folder / "scaler.pt").is_file():
        outcome.fail(MISSING, f"no scaler.pt in {outcome.rel(folder)} (the run used fp16 mixed precision)",
                     folder / "scaler.pt")
    _ranks.check_ranks(ranks, job.get("world_size"), "RNG state (random_states_<rank>.pkl)", outcome, folder,
                       "the run's params world_size")
    processes = job.get("world_size") or (max(ranks) + 1 if ranks else 1)
    shapes = {i: _resume.attempt(outcome, model_shapes, path, device, outcome) for i, path in models.items()}
    steps = {}
    for index, path in optimizers.items():
        state = _resume.attempt(outcome, safe_torch_load, path, outcome, device)
        summary = _resume.attempt(outcome, _resume.summarise_optimizer, state, outcome, path) if state else None
        if summary is None:
            continue
        if shapes.get(index) is not None:
            _resume.attempt(outcome, _resume.check_fits, summary, shapes[index], outcome, path, "model tensors")
        steps[index] = int(max(summary.steps)) if summary.steps else None
    for index, path in schedulers.items():
        state = _resume.attempt(outcome, safe_torch_load, path, outcome, device)
        _resume.attempt(outcome, _resume.check_scheduler, state, outcome, path)
        last, step = state.get("last_epoch") if isinstance(state, dict) else None, steps.get(index)
        outcome.facts["optimizer_step"] = step
        if isinstance(last, int) and step is not None and last not in (step * processes, step):
            outcome.fail(INCONSISTENT, f"{outcome.rel(path)} has stepped {last} time(s), the optimizer {step} step(s) "
                                       f"over {processes} process(es) (accelerate steps it {step * processes} times)",
                         path)
    for path in ranks.values():
        _resume.attempt(outcome, check_random_states, path, outcome)
    if layout == layouts.SINGLE:
        outcome.forward = "not run: an accelerate state holds no architecture"
    else:
        _trainer_layouts.forward(fsdp_model, device, outcome, layout)
