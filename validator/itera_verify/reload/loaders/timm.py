"""Loader `timm`: a timm model folder as `save_for_hf` writes it (`config.json` with `architecture` and
`pretrained_cfg`, `model.safetensors` or `pytorch_model.bin`).

Proves: the architecture is one timm itself defines (no remote code: timm has none); the model built from the
folder's config (timm's own reading of it, `local-dir:`) takes the weights strictly, no missing, unexpected or
resized key; every weight finite; one forward pass on an input of the configured size (pretrained_cfg
`input_size`) gives finite output.
"""
from __future__ import annotations

from pathlib import Path

from ..common import LOAD, MISSING, Outcome, Stop, check_parameters, nonfinite_count, require, safe_torch_load, short

WEIGHTS = ("model.safetensors", "pytorch_model.bin")
DEFAULT_INPUT = (3, 224, 224)


def load_weights(folder: Path, device, outcome: Outcome) -> dict:
    for name in WEIGHTS:
        path = folder / name
        if not path.is_file():
            continue
        if name.endswith(".safetensors"):
            from safetensors import SafetensorError
            from safetensors.torch import load_file

            try:
                return load_file(str(path), device=str(device))
            except (SafetensorError, OSError) as exc:
                raise Stop(LOAD, f"{outcome.rel(path)} is not a valid safetensors file: {short(exc)}", path) from exc
        return safe_torch_load(path, outcome, device)
    raise Stop(MISSING, f"{outcome.rel(folder)} holds no {' or '.join(WEIGHTS)}", folder)


def build(timm, folder: Path, outcome: Outcome):
    if not (folder / "config.json").is_file():
        raise Stop(MISSING, f"{outcome.rel(folder / 'config.json')} is missing: timm cannot build the model", folder)
    try:
        return timm.create_model(f"local-dir:{folder}", pretrained=False)
    except Exception as exc:  # RuntimeError 'Unknown model', KeyError, ValueError for a damaged config
        raise Stop(LOAD, f"timm cannot build the model of {outcome.rel(folder / 'config.json')}: {short(exc)}",
                   folder / "config.json") from exc


def load_strictly(model, state: dict, label: str) -> None:
    try:
        result = model.load_state_dict(state, strict=False)
    except RuntimeError as exc:  # a size mismatch raises even when not strict
        raise Stop(LOAD, f"{label}: {short(exc)}") from exc
    problems = []
    if result.missing_keys:
        problems.append(f"{len(result.missing_keys)} missing key(s): {', '.join(result.missing_keys[:5])}")
    if result.unexpected_keys:
        problems.append(f"{len(result.unexpected_keys)} unexpected key(s): {', '.join(result.unexpected_keys[:5])}")
    if problems:
        raise Stop(LOAD, f"{label}: " + "; ".join(problems))


def forward(model, device) -> str:
    import torch

    size = tuple((getattr(model, "pretrained_cfg", None) or {}).get("input_size") or DEFAULT_INPUT)
    dtype = next(model.parameters()).dtype
    images = torch.randn((1, *size), generator=torch.Generator().manual_seed(0)).to(device=device, dtype=dtype)
    try:
        with torch.no_grad():
            output = model(images)
    except Exception as exc:  # noqa: BLE001 - any failure of the forward is a model that does not run
        raise Stop(LOAD, f"forward pass on an input of the configured size {list(size)} failed: {short(exc)}") from exc
    if not torch.is_tensor(output):
        return f"ran on {list(size)}, no tensor output to check"
    bad = nonfinite_count(output)
    if bad:
        raise Stop(LOAD, f"forward pass on an input of the configured size gave {bad} non-finite value(s) out of "
                         f"{output.numel()}")
    return f"finite output {tuple(output.shape)} (input {tuple(images.shape)})"


def reload(job: dict, device, outcome: Outcome) -> None:
    folder = Path(job["path"])
    timm = require(job)
    model = build(timm, folder, outcome)
    load_strictly(model, load_weights(folder, device, outcome), "weights")
    model.to(device).eval()
    outcome.facts["architecture"] = getattr(model, "pretrained_cfg", {}).get("architecture") or type(model).__name__
    outcome.facts["parameters"] = sum(p.numel() for p in model.parameters())
    check_parameters(model, outcome, "model")
    outcome.forward = forward(model, device)
