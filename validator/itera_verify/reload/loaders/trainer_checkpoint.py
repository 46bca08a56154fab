"""Loader `hf-trainer-checkpoint`: a Trainer `checkpoint-N/` folder holds everything a resume needs, and it fits.

The Trainer itself skips a missing optimizer or scheduler silently, only logs a missing RNG file and loads
weights with strict=False: a checkpoint can "resume" from scratch. Here every component must be present, load
with weights_only=True, and agree: optimizer state shaped like the trainable parameters, its step equal to
trainer_state.json's global_step.
"""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from ...package.pickles import scan_file
from ..common import LOAD, MISSING, Outcome, Stop, safe_torch_load, short
from . import _resume, _trainer_layouts
from .peft import load_adapter_model
from .transformers import load_model

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json", "adapter_model.safetensors", "adapter_model.bin")


def read_global_step(folder: Path, outcome: Outcome) -> int | None:
    path = folder / "trainer_state.json"
    if not path.is_file():
        outcome.fail(MISSING, f"{outcome.rel(path)} is missing: no record of progress (global_step)", path)
        return None
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        outcome.fail(LOAD, f"{outcome.rel(path)} does not parse: {short(exc)}", path)
        return None
    step = state.get("global_step") if isinstance(state, dict) else None
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        outcome.fail(MISSING, f"{outcome.rel(path)} has no global_step", path)
        return None
    outcome.facts["global_step"] = step
    return step


def find_components(folder: Path, fp16: bool, outcome: Outcome, layout: str = _trainer_layouts.SINGLE,
                    world_size: int | None = None) -> dict[str, list[Path]]:
    """Each component's files; a missing one is recorded (IV507) and the others still get checked. Under
    DeepSpeed and FSDP the weights and the optimizer are checked in their own folders (_trainer_layouts.py)."""
    # FSDP with a full state dict saves the optimizer as optimizer.bin (accelerate's save_fsdp_optimizer).
    optimizer = [folder / name for name in ("optimizer.pt", "optimizer.bin") if (folder / name).is_file()][:1]
    components = {
        "weights": [folder / name for name in WEIGHT_FILES if (folder / name).is_file()],
        "optimizer": optimizer,
        "scheduler": [folder / "scheduler.pt"] if (folder / "scheduler.pt").is_file() else [],
        "rng": _trainer_layouts.rng_files(folder, world_size, outcome),
    }
    if fp16:
        components["scaler"] = [folder / "scaler.pt"] if (folder / "scaler.pt").is_file() else []
    expected = {"weights": "model weights (model.safetensors, pytorch_model.bin or adapter_model.safetensors)",
                "optimizer": "optimizer.pt (optimizer.bin under FSDP)", "scheduler": "scheduler.pt",
                "rng": "rng_state.pth (or rng_state_<rank>.pth)",
                "scaler": "scaler.pt (the run used fp16 mixed precision)"}
    # DeepSpeed keeps the optimizer (and the scheduler, and under ZeRO-3 the weights) in global_step<N>/;
    # FSDP keeps weights and optimizer in pytorch_model_fsdp_<i>/ and optimizer_<i>/.
    not_here = {_trainer_layouts.DEEPSPEED: {"weights", "optimizer", "scheduler"},
                _trainer_layouts.FSDP: {"weights", "optimizer"}}.get(layout, set())
    for name, files in components.items():
        if not files and name not in not_here:
            outcome.fail(MISSING, f"no {expected[name]} in {outcome.rel(folder)}: the run cannot resume exactly",
                         folder / expected[name].split(" ")[0])
    return components


def load_weights(folder: Path, job: dict, device, outcome: Outcome):
    if (folder / "adapter_config.json").is_file():
        return load_adapter_model(folder, job, device, outcome, trainable=True)
    return load_model(folder, job, device, outcome)


def check_optimizer(file: Path, model, global_step, job: dict, device, outcome: Outcome) -> None:
    state = safe_torch_load(file, outcome, device)
    summary = _resume.summarise_optimizer(state, outcome, file)
    if model is not None:
        # parameters() lists a tied weight (lm_head = wte) once, as the Trainer's optimizer does.
        trainable = Counter(tuple(p.shape) for p in model.parameters() if p.requires_grad)
        _resume.check_fits(summary, trainable, outcome, file, "trainable parameters")
    _resume.check_step(summary, global_step, outcome, file, "trainer_state.json's global_step", job.get("fp16"))


def check_scheduler(file: Path, device, outcome: Outcome) -> None:
    _resume.check_scheduler(safe_torch_load(file, outcome, device), outcome, file)


def check_rng(file: Path, device, outcome: Outcome) -> list[str]:
    import torch

    state = safe_torch_load(file, outcome, torch.device("cpu"))  # torch.set_rng_state takes CPU tensors
    # What Trainer._load_rng_state restores; the accelerator states are optional.
    return _resume.restore_rng(state, outcome, file, device, required=("python", "numpy", "cpu"))


def check_scaler(file: Path, device, outcome: Outcome) -> None:
    _resume.check_scaler(safe_torch_load(file, outcome, device), outcome, file)


def reload(job: dict, device, outcome: Outcome) -> None:
    folder = Path(job["path"])
    if not folder.is_dir():
        raise Stop(LOAD, f"{outcome.rel(folder)} is not a checkpoint folder")
    global_step = read_global_step(folder, outcome)
    layout = _trainer_layouts.layout_of(folder)
    outcome.facts["layout"] = layout
    world_size = job.get("world_size")
    if layout == _trainer_layouts.DEEPSPEED:
        world_size = world_size or _trainer_layouts.check_deepspeed(folder, job, device, outcome, global_step)
    components = find_components(folder, bool(job.get("fp16")), outcome, layout, world_size)
    model = None
    if layout == _trainer_layouts.FSDP:
        model = _trainer_layouts.check_fsdp(folder, job, device, outcome, global_step)
    elif components["weights"]:
        model = _resume.attempt(outcome, load_weights, folder, job, device, outcome)
    for file in components["optimizer"]:
        _resume.attempt(outcome, check_optimizer, file, model, global_step, job, device, outcome)
    for file in components["scheduler"]:
        _resume.attempt(outcome, check_scheduler, file, device, outcome)
    restored: set[str] = set()
    for file in components["rng"]:
        restored |= set(_resume.attempt(outcome, check_rng, file, device, outcome) or ())
    outcome.facts["rng_restored"] = sorted(restored)
    for file in components.get("scaler", []):
        _resume.attempt(outcome, check_scaler, file, device, outcome)
    args = folder / "training_args.bin"
    if args.is_file():  # scanned, never loaded, not needed to resume (SPEC §6)
        outcome.facts["training_args"] = "scanned only" if not scan_file(args).unsafe else "unsafe (IV506)"
    _trainer_layouts.forward(model, device, outcome, layout)
