"""Loader `timm`: a timm model folder as `save_for_hf` writes it (`config.json` with `architecture` and
`pretrained_cfg`, `model.safetensors` or `pytorch_model.bin`).

Proves: config.json holds only what this loader admits (TOP, PRETRAINED_CFG, and architecture values in
`model_args`: timm hands them to the model's constructor, and a pretrained_cfg's `file`, `url`, `hf_hub_id` or
`state_dict` would name weights to fetch); the architecture is one timm itself defines (no remote code: timm has
none); the model is built here from those checked parts (timm never reads the folder), takes the weights strictly,
no missing, unexpected or resized key; every weight finite; one forward pass on an input of the configured size
(pretrained_cfg `input_size`) gives finite output.
"""
from __future__ import annotations

import re
from pathlib import Path

from ..common import (LOAD, MISSING, Outcome, Stop, check_parameters, nonfinite_count, read_json_document, require,
                      safe_torch_load, short)
from ._admit import (BOOLEAN, MODULE, NUMBER, TEXT, WHOLE, Admit, Section, admit, list_of, mapping_of, one_of,
                     optional, refuse, stop_if_refused)

WEIGHTS = ("model.safetensors", "pytorch_model.bin")
DEFAULT_INPUT = (3, 224, 224)

# ----------------------------------------------------------------------------- what this loader admits
LABELS = 1 << 16
WORD = Admit(lambda v: isinstance(v, str) and bool(re.fullmatch(r"[a-z0-9_]{0,32}", v)),
             "a plain lowercase name (timm looks it up in its own tables)")
SIZE = list_of(WHOLE, 3)
MODULES = Admit(lambda v: MODULE(v) or list_of(MODULE, 8)(v), MODULE.what)
# pretrained_cfg: the input it was trained on and facts about it. Never where weights come from (`file`, `url`,
# `hf_hub_id`, `hf_hub_filename`, `state_dict`, `source`) nor a custom loader (`custom_load`).
PRETRAINED_CFG: Section = {
    "architecture": optional(TEXT), "tag": optional(TEXT), "custom_load": one_of(False),
    "input_size": SIZE, "test_input_size": optional(SIZE), "min_input_size": optional(SIZE),
    "fixed_input_size": BOOLEAN, "interpolation": optional(WORD), "crop_pct": optional(NUMBER),
    "test_crop_pct": optional(NUMBER), "crop_mode": optional(WORD), "mean": list_of(NUMBER, 4),
    "std": list_of(NUMBER, 4), "num_classes": WHOLE, "label_offset": optional(WHOLE),
    "label_names": optional(list_of(TEXT, LABELS)), "label_descriptions": optional(mapping_of(TEXT, TEXT, LABELS)),
    "pool_size": optional(list_of(WHOLE, 4)), "test_pool_size": optional(list_of(WHOLE, 4)),
    "first_conv": optional(MODULES), "classifier": optional(MODULES), "license": optional(TEXT),
    "description": optional(TEXT), "origin_url": optional(TEXT), "paper_name": optional(TEXT),
    "paper_ids": optional(Admit(lambda v: TEXT(v) or list_of(TEXT, 8)(v), TEXT.what)),
    "notes": optional(list_of(TEXT, 16)),
}
TOP: Section = {"architecture": TEXT, "num_classes": WHOLE, "num_features": WHOLE, "global_pool": optional(WORD),
                "label_names": list_of(TEXT, LABELS), "label_descriptions": mapping_of(TEXT, TEXT, LABELS),
                "pretrained_cfg": PRETRAINED_CFG}
# save_for_hf's older single-object form: pretrained_cfg's keys at the top, `labels` for label_names.
LEGACY: Section = {**PRETRAINED_CFG, "architecture": TEXT, "num_features": WHOLE, "labels": list_of(TEXT, LABELS)}
# model_args are the constructor's keyword arguments: admitted are the architecture's sizes and switches (numbers,
# booleans, lists of numbers, timm's own layer names), never one of the factory's own loading or placement options.
FACTORY_KEYS = frozenset({
    "pretrained", "pretrained_cfg", "pretrained_cfg_overlay", "pretrained_strict", "pretrained_filter_fn",
    "pretrained_model_args", "checkpoint_path", "cache_dir", "device", "dtype", "features_only", "feature_cfg",
    "feature_cls", "out_indices", "pruned", "scriptable", "exportable", "no_jit", "model_cfg", "kwargs_filter",
    "variant", "model_cls"})
ARCHITECTURE_VALUE = Admit(lambda v: v is None or BOOLEAN(v) or NUMBER(v) or WORD(v) or list_of(NUMBER, 16)(v)
                           or list_of(list_of(NUMBER, 16), 16)(v),
                           "null, true or false, a number, a list of numbers or a plain lowercase name")


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


def admit_config(timm, config, path: Path, outcome: Outcome) -> None:
    """config.json holds only what TOP (or LEGACY), PRETRAINED_CFG and the model_args rule admit; else IV504."""
    if not isinstance(config, dict):
        raise Stop(LOAD, f"{outcome.rel(path)} is not a JSON object", path)
    model_args = config.get("model_args", {})
    admit({k: v for k, v in config.items() if k != "model_args"}, TOP if "pretrained_cfg" in config else LEGACY,
          path, outcome)
    if not isinstance(model_args, dict):
        refuse(outcome, path, "model_args", model_args, "expected a JSON object")
    else:
        for key, value in model_args.items():
            if key in FACTORY_KEYS or not isinstance(key, str) or not key.isidentifier():
                refuse(outcome, path, f"model_args.{key}", value, "not an architecture value: the loader chooses "
                                                                  f"{', '.join(sorted(FACTORY_KEYS))} itself")
            elif not ARCHITECTURE_VALUE(value):
                refuse(outcome, path, f"model_args.{key}", value, f"expected {ARCHITECTURE_VALUE.what}")
    architecture = config.get("architecture")
    if isinstance(architecture, str) and not timm.is_model(architecture):
        refuse(outcome, path, "architecture", architecture, "not a model timm itself defines")
    stop_if_refused(outcome)


def build(timm, folder: Path, outcome: Outcome):
    """The model of config.json's admitted parts: create_model of the architecture, never of the folder."""
    path = folder / "config.json"
    if not path.is_file():
        raise Stop(MISSING, f"{outcome.rel(path)} is missing: timm cannot build the model", folder)
    config = read_json_document(path, outcome)
    admit_config(timm, config, path, outcome)
    from timm.models._hub import _parse_model_cfg  # timm's own reading of the file (sizes, legacy form)

    try:
        pretrained_cfg, architecture, model_args = _parse_model_cfg(dict(config), extra_fields={})
        return timm.create_model(architecture, pretrained=False, pretrained_cfg=pretrained_cfg, **model_args)
    except Exception as exc:  # RuntimeError 'Unknown model', KeyError, ValueError, TypeError for a damaged config
        raise Stop(LOAD, f"timm cannot build the model of {outcome.rel(path)}: {short(exc)}", path) from exc


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
