"""Loader `deepspeed-checkpoint`: a DeepSpeed checkpoint folder (`latest` + `global_step<N>/`), ZeRO stages 1-3.

`latest` names a folder that exists; one optimizer shard per data-parallel rank the model states record; every
file loads with weights_only=True (DeepSpeed's records as inert stand-ins: DeepSpeed itself is never imported);
the flat fp32 partitions hold exactly the model's parameter count; the optimizer step equals global_steps; the
module weights are finite; under tensor parallelism, for every model-parallel rank (_zero.py).
"""
from __future__ import annotations

from pathlib import Path

from ..common import LOAD, Outcome, Stop
from ._zero import check_zero_checkpoint


def reload(job: dict, device, outcome: Outcome) -> None:
    folder = Path(job["path"])
    if not folder.is_dir():
        raise Stop(LOAD, f"{outcome.rel(folder)} is not a DeepSpeed checkpoint folder (latest + global_step<N>/)")
    check_zero_checkpoint(folder, job, device, outcome)
    outcome.forward = "not run: a DeepSpeed checkpoint folder holds no architecture"
