"""Loader `dcp`: a torch.distributed.checkpoint folder, as FSDP and dcp.save write it.

`.metadata` read through the restricted unpickler, every item inside an existing `.distcp` file, every embedded
archive scanned, the state loaded in this one process with no process group (_dcp.py); tensors finite and
shaped as listed; a model state fits the model built from reload.json's `config` (a model folder in the
package), loads into it and gives a finite forward pass. A folder holding only a model state needs nothing else.
"""
from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from ..common import (
    INCONSISTENT,
    LOAD,
    Outcome,
    Stop,
    check_parameters,
    forward_pass,
    short,
)
from . import _dcp, _resume

SHAPED = set(_resume.SHAPED_STATE)
# dcp.save flattens nested state dicts: {"model": ..., "optimizer": ...} is stored as `model.<name>` and
# `optimizer.state.<parameter>.<entry>` (the parameter an fqn from get_state_dict, or an index from
# optimizer.state_dict()). Any top-level name holding `optim` with `state.` under it is an optimizer.
OPTIMIZER_STATE = re.compile(r"(?P<section>[^.]*optim[^.]*)\.state\.(?P<name>.+)\.(?P<entry>[^.]+)")
OPTIMIZER_SECTION = re.compile(r"[^.]*optim[^.]*\.")


def build_model(job: dict, config_folder: Path | None, outcome: Outcome, device, stored: dict | None = None):
    """The model of `config` (reload.json) or of the checkpoint's own config.json, with fresh weights.
    `stored`: the model tensors of the state it is built for; the model declared must fit them (checked on
    the meta device before it is built: transformers.check_declared_size)."""
    from .transformers import check_declared_size, model_class, read_config

    if config_folder is None:
        ref = job.get("config_ref")
        raise Stop(LOAD, f"reload.json `config` {ref!r} is not a model folder inside the package" if ref else
                   "reload.json gives no `config` (a model folder in the package): nothing to check the sharded "
                   "state against")
    if stored:
        raw = read_config(config_folder, outcome)
        values = sum(t.numel() for t in stored.values())
        check_declared_size(config_folder, model_class(job.get("class"), raw, default="AutoModelForCausalLM"), None,
                            raw, outcome, stored=(values, sum(t.numel() * t.element_size() for t in stored.values()),
                                                  {d for t in stored.values() for d in t.shape}))
    try:
        from transformers import AutoConfig

        raw = read_config(config_folder, outcome)  # its steering keys admitted before AutoConfig reads it
        config = AutoConfig.from_pretrained(str(config_folder), local_files_only=True, trust_remote_code=False)
        cls = model_class(job.get("class"), raw, default="AutoModelForCausalLM")
        model = cls.from_config(config) if hasattr(cls, "from_config") else cls(config)
    except Stop:
        raise
    except Exception as exc:
        raise Stop(LOAD, f"the model of {outcome.rel(config_folder)} cannot be built: {short(exc)}") from exc
    outcome.facts["config"] = outcome.rel(config_folder)
    return model.to(device)


def model_tensors(state: _dcp.DcpState) -> dict:
    """The model's tensors: `model.<name>` (accelerate and most recipes save {"model": state_dict}), else every
    tensor outside an optimizer section (a bare model state dict saved as it is)."""
    prefixed = {k.removeprefix("model."): t for k, t in state.tensors.items() if k.startswith("model.")}
    if prefixed:
        return prefixed
    return {k: t for k, t in state.tensors.items() if not OPTIMIZER_SECTION.match(k)}


def has_optimizer(state: _dcp.DcpState) -> bool:
    return any(OPTIMIZER_STATE.fullmatch(key) for key in {**state.tensors, **state.values})


def load_into_model(model, tensors: dict, outcome: Outcome, folder: Path, device) -> None:
    """Every key and shape fits the model (a tied weight saved once is fine), then the values go in."""
    import torch

    expected = model.state_dict()
    tied = {name for name in expected if name not in tensors and _shares_storage(model, name, tensors)}
    missing = sorted(set(expected) - set(tensors) - tied)
    unexpected = sorted(set(tensors) - set(expected))
    wrong = [f"{name} {list(tensors[name].shape)} (model: {list(expected[name].shape)})"
             for name in sorted(set(tensors) & set(expected)) if tensors[name].shape != expected[name].shape]
    if missing or unexpected or wrong:
        parts = [f"missing {', '.join(missing[:4])}" if missing else "",
                 f"not in the model {', '.join(unexpected[:4])}" if unexpected else "",
                 f"shaped otherwise {', '.join(wrong[:3])}" if wrong else ""]
        raise Stop(INCONSISTENT, f"{outcome.rel(folder)} does not fit the model of `config`: "
                                 + "; ".join(p for p in parts if p), folder)
    with torch.no_grad():
        model.load_state_dict({k: v.to(expected[k].dtype) for k, v in tensors.items()}, strict=False)
    model.to(device)


def _shares_storage(model, name: str, tensors: dict) -> bool:
    """GPT-2's lm_head.weight is wte.weight: saved once under the other name."""
    params = dict(model.named_parameters(remove_duplicate=False))
    target = params.get(name)
    return target is not None and any(p is target and other in tensors for other, p in params.items())


def check_optimizer_state(state: _dcp.DcpState, model, global_step: int | None, outcome: Outcome,
                          against: str) -> None:
    """`<optimizer>.state.<parameter>.<entry>` entries: a parameter named by its fqn is one of the model's
    trainable parameters and each shaped entry has its shape; parameters named by index are matched by shape
    (as for optimizer.pt); the step equals `global_step`."""
    import torch

    params = {name: p for name, p in model.named_parameters() if p.requires_grad} if model is not None else None
    steps, shaped, wrong, foreign = [], {}, [], []
    for key, value in {**state.tensors, **state.values}.items():
        match = OPTIMIZER_STATE.fullmatch(key)
        if not match:
            continue
        name, entry = f"{match['section']}/{match['name']}", match["entry"]
        shaped.setdefault(name, None)
        if entry == "step":
            steps.append(float(value.item() if torch.is_tensor(value) else value))
        elif entry in SHAPED and torch.is_tensor(value) and shaped[name] is None:
            shaped[name] = tuple(value.shape)
            parameter = match["name"]
            if params is not None and not parameter.isdigit():
                if parameter not in params:
                    foreign.append(parameter)
                elif shaped[name] != tuple(params[parameter].shape):
                    wrong.append(f"{key} {list(value.shape)} (parameter: {list(params[parameter].shape)})")
    outcome.facts["optimizer_parameters"] = len(shaped)
    folder = state.folder
    if not shaped:
        raise Stop(LOAD, f"{outcome.rel(folder)} holds no optimizer state (no <optimizer>.state.* entries)", folder)
    if foreign or wrong:
        shown = f"state for parameters the model lacks: {', '.join(sorted(set(foreign))[:4])}" if foreign \
            else f"state shaped unlike its parameter: {', '.join(wrong[:3])}"
        raise Stop(INCONSISTENT, f"{outcome.rel(folder)} holds {shown}", folder)
    if state.nonfinite:
        raise Stop(LOAD, f"{outcome.rel(folder)}: non-finite values in {', '.join(state.nonfinite[:4])}", folder)
    summary = _resume.OptimizerSummary(param_ids=list(shaped), steps=steps,
                                       state_shapes=Counter(shape for shape in shaped.values() if shape))
    if params is not None:
        _resume.check_fits(summary, Counter(tuple(p.shape) for p in params.values()), outcome, folder,
                           "trainable parameters")
    _resume.check_step(summary, global_step, outcome, folder, against, bool(outcome.job.get("fp16")))


def check_model_state(state: _dcp.DcpState, model, outcome: Outcome, device) -> bool:
    tensors = model_tensors(state)
    if not tensors:
        raise Stop(LOAD, f"{outcome.rel(state.folder)} holds no model tensor", state.folder)
    if state.nonfinite:
        raise Stop(LOAD, f"{outcome.rel(state.folder)}: non-finite weights in {', '.join(state.nonfinite[:5])}",
                   state.folder)
    outcome.facts["model_parameters"] = sum(t.numel() for t in tensors.values())
    load_into_model(model, tensors, outcome, state.folder, device)
    return True


def reload(job: dict, device, outcome: Outcome) -> None:
    folder = Path(job["path"])
    if not folder.is_dir():
        raise Stop(LOAD, f"{outcome.rel(folder)} is not a torch.distributed.checkpoint folder")
    state = _dcp.read_dcp(folder, outcome, job.get("world_size"))
    config = Path(job["config"]) if job.get("config") else None
    model = build_model(job, config, outcome, device, model_tensors(state))
    holds_model = bool(model_tensors(state))
    if holds_model:
        check_model_state(state, model, outcome, device)
        check_parameters(model, outcome, "model")
    if has_optimizer(state):
        check_optimizer_state(state, model, None, outcome, "")
    if not holds_model:
        outcome.forward = "not run: an optimizer state alone"
        return
    model.eval()
    outcome.forward = forward_pass(model, device)
