"""Loader `hf-trainer-checkpoint`: a Trainer `checkpoint-N/` folder holds everything a resume needs, and it fits.

The Trainer itself skips a missing optimizer or scheduler silently, only logs a missing RNG file and loads
weights with strict=False: a checkpoint can "resume" from scratch. Here every component must be present, load
with weights_only=True, and agree: optimizer state shaped like the trainable parameters, its step equal to
trainer_state.json's global_step.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path

from ...package.jsonread import read_json_file
from ...package.pickles import scan_file
from ..common import LOAD, MISSING, Outcome, Stop, safe_torch_load, short
from ...format import layouts
from . import _resume, _trainer_layouts
from .peft import load_adapter_model
from .transformers import load_model



def read_global_step(folder: Path, outcome: Outcome) -> int | None:
    path = folder / layouts.TRAINER_STATE
    if not path.is_file():
        return None  # an unmet requirement: find_components reports it
    try:
        state = read_json_file(path)
    except (OSError, ValueError) as exc:
        outcome.fail(LOAD, f"{outcome.rel(path)} does not parse: {short(exc)}", path)
        return None
    step = state.get("global_step") if isinstance(state, dict) else None
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        outcome.fail(MISSING, f"{outcome.rel(path)} has no global_step", path, requirement=layouts.GLOBAL_STEP)
        return None
    outcome.facts["global_step"] = step
    return step


def find_components(folder: Path, fp16: bool, outcome: Outcome, world_size: int | None = None) -> dict[str, list[Path]]:
    """Each component's files; every unmet requirement of the folder's layout (format/layouts.py, the reading
    the static checks share) is recorded under its id, and the components present still get checked. Under
    DeepSpeed and FSDP the weights and the optimizer are checked in their own folders (_trainer_layouts.py)."""
    files = {p.name for p in folder.iterdir() if p.is_file()}
    dirs = {p.name for p in folder.iterdir() if p.is_dir()}
    for need in layouts.trainer_requirements(outcome.rel(folder), files, dirs, fp16=fp16, world_size=world_size):
        outcome.unmet(need, folder)
    rng = layouts.rng_by_rank(files)
    if layouts.SINGLE_RNG not in rng.values():
        outcome.facts.setdefault("ranks", {})["RNG state (rng_state_<rank>.pth)"] = sorted(rng)
    components = {
        "weights": [folder / name for name in layouts.WEIGHT_FILES if name in files],
        # FSDP with a full state dict saves the optimizer as optimizer.bin (accelerate's save_fsdp_optimizer).
        "optimizer": [folder / name for name in ("optimizer.pt", "optimizer.bin") if name in files][:1],
        "scheduler": [folder / "scheduler.pt"] if "scheduler.pt" in files else [],
        "rng": [folder / name for _, name in sorted(rng.items())],
    }
    if fp16:
        components["scaler"] = [folder / "scaler.pt"] if "scaler.pt" in files else []
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


def check_scheduler(file: Path, device, outcome: Outcome, global_step=None, fp16: bool = False) -> None:
    _resume.check_scheduler(safe_torch_load(file, outcome, device), outcome, file, global_step,
                            "trainer_state.json's global_step", fp16)


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
    layout = layouts.detect((p.name for p in folder.iterdir() if p.is_file()),
                            (p.name for p in folder.iterdir() if p.is_dir()))
    outcome.facts["layout"] = layout
    world_size = job.get("world_size")
    if layout == layouts.DEEPSPEED:
        world_size = world_size or _trainer_layouts.check_deepspeed(folder, job, device, outcome, global_step)
    components = find_components(folder, bool(job.get("fp16")), outcome, world_size)
    model = None
    if layout == layouts.FSDP:
        model = _trainer_layouts.check_fsdp(folder, job, device, outcome, global_step)
    elif components["weights"]:
        model = _resume.attempt(outcome, load_weights, folder, job, device, outcome)
    for file in components["optimizer"]:
        _resume.attempt(outcome, check_optimizer, file, model, global_step, job, device, outcome)
    for file in components["scheduler"]:
        _resume.attempt(outcome, check_scheduler, file, device, outcome, global_step, bool(job.get("fp16")))
    restored: set[str] = set()
    for file in components["rng"]:
        restored |= set(_resume.attempt(outcome, check_rng, file, device, outcome) or ())
    outcome.facts["rng_restored"] = sorted(restored)
    for file in components.get("scaler", []):
        _resume.attempt(outcome, check_scaler, file, device, outcome)
    args = folder / "training_args.bin"
    if args.is_file():  # scanned, never loaded, not needed to resume (docs/format.md, Declared facts)
        outcome.facts["training_args"] = "scanned only" if not scan_file(args).unsafe else "unsafe (IV506)"
    _trainer_layouts.forward(model, device, outcome, layout)
