"""Loader `diffusers-lora`: a LoRA file for a diffusers pipeline, in the diffusers layout (`save_lora_weights`,
train_dreambooth_lora: `pytorch_lora_weights.safetensors`, keys `unet.….lora.down.weight`) or kohya's
(`lora_unet_…​.lora_down.weight`, `.lora_up.weight`, `.alpha`), with the manifest's pinned base pipeline.

Proves: every LoRA tensor present and finite; the base (manifest `base`: hub id and revision) loads from the local
hub cache as the `diffusers` loader loads a pipeline; `load_lora_weights` attaches every tensor of the file to a
module of the base: an unexpected or unmatched key (diffusers only logs a warning, or drops a key no component
claims without a word) or a size mismatch is IV504; one denoising step with the LoRA active gives finite output.
"""
from __future__ import annotations

import logging
import re
import warnings
from pathlib import Path

from ...format.names import HUB_ID
from ..common import BASE_UNAVAILABLE, LOAD, Outcome, Stop, require, safe_torch_load, short
from . import safetensors as safetensors_loader
from .diffusers import denoise, load_pipeline

LORA_WEIGHTS = ("pytorch_lora_weights.safetensors", "pytorch_lora_weights.bin")
ADAPTER = "reloaded"
# Tensors that are not a module's weights: kohya's per-module alpha (diffusers folds it into the scale).
NOT_ATTACHED = re.compile(r".*\.alpha")
# What diffusers and PEFT say, as a warning, about a key they could not place (anything else they log is advice).
KEY_WARNING = re.compile(r"unexpected keys|missing keys|missing adapter keys|were not used|size mismatch", re.I)


def lora_file(path: Path, outcome: Outcome) -> Path:
    """The LoRA weights: the file itself, or in a folder save_lora_weights' file, else its only .safetensors."""
    if path.is_file():
        return path
    for name in LORA_WEIGHTS:
        if (path / name).is_file():
            return path / name
    candidates = sorted(path.glob("*.safetensors"))
    if len(candidates) == 1:
        return candidates[0]
    raise Stop(LOAD, f"{outcome.rel(path)} holds no {LORA_WEIGHTS[0]}" + (
        f" and {len(candidates)} other .safetensors files: give the LoRA file itself as the artifact's path"
        if candidates else " (nor any .safetensors file)"), path)


def read_lora(file: Path, device, outcome: Outcome) -> dict:
    """The LoRA's tensors, each present, non-empty and finite, before diffusers sees them (a pickle: scanned
    first, loaded weights_only)."""
    checked = Outcome(outcome.job)
    if file.suffix == ".safetensors":
        safetensors_loader.load_file(file, device, None, checked)
        if not checked.problems:
            from safetensors.torch import load_file

            state = load_file(str(file))
    else:
        state = safe_torch_load(file, outcome, "cpu")
        if not isinstance(state, dict) or not all(hasattr(t, "numel") for t in state.values()):
            raise Stop(LOAD, f"{outcome.rel(file)} is not a state dict of tensors", file)
        for name, tensor in state.items():
            safetensors_loader.check_tensor(str(name), tensor, None, file, checked)
    outcome.problems += checked.problems
    empty = checked.facts.get("empty_tensors", [])
    if empty:
        outcome.fail(LOAD, f"{len(empty)} LoRA tensor(s) are empty: {', '.join(empty[:4])}", file)
    if outcome.problems:
        raise Stop.recorded()
    if not state:
        raise Stop(LOAD, f"{outcome.rel(file)} holds no tensor", file)
    outcome.facts["lora_tensors"] = len(state)
    outcome.facts["layout"] = "kohya" if any(k.startswith("lora_unet_") or k.startswith("lora_te") for k in state) \
        else "diffusers"
    return state


def base_snapshot(job: dict, outcome: Outcome) -> Path:
    """The base pipeline's snapshot folder in the local hub cache, at the manifest's pinned revision."""
    base = job.get("base") or {}
    name, revision = base.get("name"), base.get("revision")
    if not isinstance(name, str) or not name:
        raise Stop(BASE_UNAVAILABLE, "the manifest names no base pipeline for this LoRA (artifact `base`: its hub id "
                                     "and revision): a LoRA cannot be verified without the pipeline it was trained on")
    if not HUB_ID.fullmatch(name):
        raise Stop(BASE_UNAVAILABLE, f"base {name!r} is a local path, not a hub id: it cannot be verified offline")
    outcome.facts["base"] = f"{name}@{revision or 'default branch'}"
    from huggingface_hub import try_to_load_from_cache

    index = try_to_load_from_cache(name, "model_index.json", cache_dir=job.get("hf_cache"),
                                   revision=revision if isinstance(revision, str) else None)
    if not isinstance(index, str):
        raise Stop(BASE_UNAVAILABLE, f"base pipeline {name}@{revision or 'main'} is not in the local hub cache "
                                     f"({job.get('hf_cache')}); unverified is not verified")
    return Path(index).parent


class KeyWarnings(logging.Handler):
    """diffusers' and PEFT's words about keys they could not place, logged or warned while the LoRA loads."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.said: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.note(record.getMessage())

    def note(self, text: str) -> None:
        if KEY_WARNING.search(text):
            self.said.append(" ".join(text.split()))


def attached_count(pipeline) -> int:
    """The LoRA tensors now inside the pipeline's modules under our adapter name."""
    import torch

    count = 0
    for component in pipeline.components.values():
        if isinstance(component, torch.nn.Module):
            count += sum(1 for name, _ in component.named_parameters()
                         if f".{ADAPTER}." in f"{name}." and ".lora_" in f".{name}")
    return count


def attach(pipeline, state: dict, file: Path, outcome: Outcome) -> None:
    """load_lora_weights with every tensor of the file placed on a module of the pipeline."""
    heard = KeyWarnings()
    loggers = [logging.getLogger(name) for name in ("diffusers", "peft")]
    for logger in loggers:
        logger.addHandler(heard)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            pipeline.load_lora_weights(dict(state), adapter_name=ADAPTER)  # a copy: diffusers pops converted keys
    except Exception as exc:  # noqa: BLE001 - a size mismatch, a key diffusers cannot convert: not attachable
        raise Stop(LOAD, f"the LoRA does not attach to its base: {short(exc)}", file) from exc
    finally:
        for logger in loggers:
            logger.removeHandler(heard)
    for warning in caught:
        heard.note(str(warning.message))
    expected = sum(1 for key in state if not NOT_ATTACHED.fullmatch(key))
    attached = attached_count(pipeline)
    outcome.facts["attached_tensors"] = attached
    problems = list(dict.fromkeys(heard.said))
    if attached < expected:
        loadable = set(getattr(pipeline, "_lora_loadable_modules", ()) or ())
        if outcome.facts.get("layout") == "diffusers" and loadable:
            claimed = {key for key in state if key.split(".", 1)[0] in loadable}
            dropped = sorted(set(state) - claimed - {k for k in state if NOT_ATTACHED.fullmatch(k)})
        else:
            dropped = []
        problems.append(f"only {attached} of the file's {expected} LoRA tensors attached to a module of the base"
                        + (f"; {len(dropped)} name no component ({', '.join(sorted(loadable))}): "
                           f"{', '.join(dropped[:3])}" if dropped else ""))
    if problems:
        raise Stop(LOAD, "the LoRA does not fit its base: " + "; ".join(p[:400] for p in problems), file)


def reload(job: dict, device, outcome: Outcome) -> None:
    require(job)
    file = lora_file(Path(job["path"]), outcome)
    state = read_lora(file, device, outcome)
    snapshot = base_snapshot(job, outcome)
    pipeline = load_pipeline(snapshot, device, outcome)
    attach(pipeline, state, file, outcome)
    outcome.forward = denoise(pipeline, device) + f" with the LoRA ({outcome.facts['attached_tensors']} tensors)"
