"""The multi-process forms of a Trainer `checkpoint-N/` (docs/format.md, Multi-GPU training outputs).

Under DeepSpeed the optimizer (and, under ZeRO-3, the weights) live in `global_step<N>/`, named by `latest`, and
there is no optimizer.pt; under sharded FSDP the weights and the optimizer are torch.distributed.checkpoint
folders `pytorch_model_fsdp_<i>/` and `optimizer_<i>/`, and no config.json is written (reload.json `config`
names the model folder). Several processes write one `rng_state_<rank>.pth` each.
"""
from __future__ import annotations

import re
from pathlib import Path

from ...format import layouts
from ..common import Outcome, check_parameters, forward_pass
from . import _dcp, _resume
from ._zero import check_zero_checkpoint

FSDP_MODEL, FSDP_OPTIMIZER = layouts.FSDP_MODEL, layouts.FSDP_OPTIMIZER


def _indexed_folders(folder: Path, pattern: re.Pattern) -> dict[int, Path]:
    return {int(m.group(1) or 0): p for p in sorted(folder.iterdir())
            if p.is_dir() and (m := pattern.fullmatch(p.name))}


def check_deepspeed(folder: Path, job: dict, device, outcome: Outcome, global_step: int | None) -> int | None:
    """The DeepSpeed proofs on the checkpoint's own `latest` / global_step folder; its dp_world_size."""
    facts = check_zero_checkpoint(folder, job, device, outcome, global_step, "trainer_state.json's global_step",
                                  trainer=True)
    return facts.dp_world_size if facts else None


def check_fsdp(folder: Path, job: dict, device, outcome: Outcome, global_step: int | None):
    """Each `pytorch_model_fsdp_<i>/` fits the model of `config` and loads into it; each `optimizer_<i>/` fits
    that model, its step equal to global_step. The model of index 0 (for the forward pass), or None."""
    from .dcp import build_model, check_model_state, check_optimizer_state

    models, optimizers = _indexed_folders(folder, FSDP_MODEL), _indexed_folders(folder, FSDP_OPTIMIZER)
    # a model folder without its optimizer folder is an unmet requirement (format/layouts.py), said by the caller
    own_config = folder if (folder / "config.json").is_file() else None
    config = Path(job["config"]) if job.get("config") else own_config
    first = None
    for index, model_folder in sorted(models.items()):
        model = _resume.attempt(outcome, build_model, job, config, outcome, device)
        if model is None:
            return None
        state = _resume.attempt(outcome, _dcp.read_dcp, model_folder, outcome, job.get("world_size"))
        if state is not None and _resume.attempt(outcome, check_model_state, state, model, outcome, device):
            _resume.attempt(outcome, check_parameters, model, outcome, "model")
            first = first or model
        if index in optimizers:
            optimizer = _resume.attempt(outcome, _dcp.read_dcp, optimizers[index], outcome, job.get("world_size"))
            if optimizer is not None:
                _resume.attempt(outcome, check_optimizer_state, optimizer, model, global_step, outcome,
                                "trainer_state.json's global_step")
    return first


def forward(model, device, outcome: Outcome, layout: str = layouts.SINGLE) -> None:
    if model is None and layout == layouts.DEEPSPEED and outcome.ok:
        outcome.forward = "not run: the weights are DeepSpeed's partitions (global_step folder), checked there"
    elif model is not None and outcome.ok:
        model.eval()
        outcome.forward = _resume.attempt(outcome, forward_pass, model, device)
