"""The multi-process forms of a Trainer `checkpoint-N/` (SPEC, multi-GPU training outputs).

Under DeepSpeed the optimizer (and, under ZeRO-3, the weights) live in `global_step<N>/`, named by `latest`, and
there is no optimizer.pt; under sharded FSDP the weights and the optimizer are torch.distributed.checkpoint
folders `pytorch_model_fsdp_<i>/` and `optimizer_<i>/`, and no config.json is written (reload.json `config`
names the model folder). Several processes write one `rng_state_<rank>.pth` each.
"""
from __future__ import annotations

import re
from pathlib import Path

from ..common import MISSING, Outcome, check_parameters, forward_pass
from . import _dcp, _ranks, _resume
from ._zero import check_zero_checkpoint

FSDP_MODEL = re.compile(r"pytorch_model_fsdp(?:_(\d+))?")
FSDP_OPTIMIZER = re.compile(r"optimizer(?:_(\d+))?")
SINGLE, DEEPSPEED, FSDP = "single-process", "deepspeed", "fsdp"


def layout_of(folder: Path) -> str:
    if (folder / "latest").is_file() or any(p.is_dir() for p in folder.glob("global_step*")):
        return DEEPSPEED
    if any(p.is_dir() and FSDP_MODEL.fullmatch(p.name) for p in folder.iterdir()):
        return FSDP
    return SINGLE


def _indexed_folders(folder: Path, pattern: re.Pattern) -> dict[int, Path]:
    return {int(m.group(1) or 0): p for p in sorted(folder.iterdir())
            if p.is_dir() and (m := pattern.fullmatch(p.name))}


def rng_files(folder: Path, world_size: int | None, outcome: Outcome) -> list[Path]:
    """rng_state.pth (one process) or rng_state_<rank>.pth for exactly ranks 0 … world_size-1."""
    ranked = {rank: path for rank, path in _ranks.rank_files(folder, _ranks.RNG_FILE).items()
              if path.name != "rng_state.pth"}
    single = folder / "rng_state.pth"
    if not ranked:
        if single.is_file() and world_size is not None and world_size > 1:
            outcome.fail(MISSING, f"{outcome.rel(folder)} has one rng_state.pth for {world_size} processes: "
                                  "the other ranks' RNG states are missing", single)
        return [single] if single.is_file() else []
    _ranks.check_ranks(ranked, world_size, "RNG state (rng_state_<rank>.pth)", outcome, folder)
    return [ranked[rank] for rank in sorted(ranked)]


def check_deepspeed(folder: Path, job: dict, device, outcome: Outcome, global_step: int | None) -> int | None:
    """The DeepSpeed proofs on the checkpoint's own `latest` / global_step folder; its dp_world_size."""
    facts = check_zero_checkpoint(folder, job, device, outcome, global_step, "trainer_state.json's global_step")
    return facts.dp_world_size if facts else None


def check_fsdp(folder: Path, job: dict, device, outcome: Outcome, global_step: int | None):
    """Each `pytorch_model_fsdp_<i>/` fits the model of `config` and loads into it; each `optimizer_<i>/` fits
    that model, its step equal to global_step. The model of index 0 (for the forward pass), or None."""
    from .dcp import build_model, check_model_state, check_optimizer_state

    models, optimizers = _indexed_folders(folder, FSDP_MODEL), _indexed_folders(folder, FSDP_OPTIMIZER)
    for index in sorted(set(models) - set(optimizers)):
        outcome.fail(MISSING, f"no optimizer_{index}/ beside {models[index].name}/ in {outcome.rel(folder)}: the "
                              "optimizer cannot resume", folder / f"optimizer_{index}")
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


def forward(model, device, outcome: Outcome, layout: str = SINGLE) -> None:
    if model is None and layout == DEEPSPEED and outcome.ok:
        outcome.forward = "not run: the weights are DeepSpeed's partitions (global_step folder), checked there"
    elif model is not None and outcome.ok:
        model.eval()
        outcome.forward = _resume.attempt(outcome, forward_pass, model, device)
