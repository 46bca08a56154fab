"""`LightningRecorder`: a Lightning callback that records a run of the campaign.

It starts the run at fit start with the trainer's settings as params (seed, world size, precision, learning
rate, ...), appends the real per-step loss and every value the module logs, enforces the declared stop rules
live (every rank takes the decision together), and at the end saves the module's weights into the package as
safetensors and registers them. Only the global-zero process writes.

With `register_checkpoints=True`, the `.ckpt` files the trainer's ModelCheckpoint callbacks kept inside the
package are registered at the end as resume artifacts (loader `lightning-checkpoint`, SPEC's multi-GPU table);
off by default until every checker in use knows that loader."""
from __future__ import annotations

import os
import re
from pathlib import Path

try:
    import lightning.pytorch as pl
except ImportError:  # the standalone package
    import pytorch_lightning as pl

from ..record.artifacts import forget_missing
from ..record.files import prepare_target
from ..record.run import Run
from .common import json_value, package_relative


def _scalar(value):
    if hasattr(value, "numel") and value.numel() == 1:
        return float(value.detach().float().cpu())
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    return None


class LightningRecorder(pl.Callback):
    """Record `run` (a handle from `campaign.run(...)`) while a Lightning Trainer fits it.

    save_weights_to: a `.safetensors` path inside the package for the final weights (default
    artifacts/<run>.safetensors; None to save nothing)."""

    def __init__(self, run: Run, save_weights_to: str | None = "default", register_checkpoints: bool = False):
        self.run = run
        self.register_checkpoints = register_checkpoints
        self.save_weights_to = f"artifacts/{run.id}.safetensors" if save_weights_to == "default" else save_weights_to
        self.stopped = False
        self._last: dict[str, float] = {}

    def on_fit_start(self, trainer, pl_module):
        if self.run.started:
            return
        params = {"world_size": trainer.world_size, "precision": str(trainer.precision),
                  "max_steps": trainer.max_steps, "max_epochs": trainer.max_epochs,
                  "accumulate_grad_batches": trainer.accumulate_grad_batches,
                  "gradient_clip_val": json_value(trainer.gradient_clip_val)}
        # seed_everything() records its seed here; a run without one is refused (params need a seed).
        if os.environ.get("PL_GLOBAL_SEED", "").lstrip("-").isdigit():
            params["seed"] = int(os.environ["PL_GLOBAL_SEED"])
        params["mixed_precision"] = "fp16" if "16-mixed" == params["precision"] else (
            "bf16" if "bf16" in params["precision"] else None)
        if trainer.optimizers:
            optimizer = trainer.optimizers[0]
            params["optimizer"] = type(optimizer).__name__
            params["learning_rate"] = optimizer.param_groups[0].get("lr")
            params["weight_decay"] = optimizer.param_groups[0].get("weight_decay")
        self.run.start({k: v for k, v in params.items() if v is not None})

    def _record(self, trainer, values: dict) -> None:
        values = {k: v for k, v in values.items() if v is not None}
        if not values:
            return
        step = trainer.global_step
        if trainer.is_global_zero:
            violation = self.run.log_dict(step, values)
        else:
            violation = self.run.check(step, values)
        # Each rank sees its own loss: rank 0, whose values are the ones recorded, decides for all.
        stop = trainer.strategy.broadcast(violation is not None and not self.stopped, src=0)
        if stop and not self.stopped:
            self.stopped = True
            trainer.should_stop = True
            if trainer.is_global_zero:
                self.run.stop_for(violation)

    def _fresh(self, metrics: dict) -> dict:
        """Values logged since the last record (logged_metrics keeps the last value of each name)."""
        fresh = {}
        for name, value in metrics.items():
            number = _scalar(value)
            if number is not None and self._last.get(name) != number:
                fresh[name] = self._last[name] = number
        return fresh

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        values = {"loss": _scalar(loss)} if loss is not None else {}
        values.update(self._fresh(trainer.logged_metrics))
        self._record(trainer, values)

    def on_validation_epoch_end(self, trainer, pl_module):
        if not trainer.sanity_checking:
            self._record(trainer, self._fresh(trainer.callback_metrics))

    def on_train_end(self, trainer, pl_module):
        if trainer.is_global_zero and self.register_checkpoints:
            self._register_checkpoints(trainer)
        if trainer.is_global_zero and self.save_weights_to and not self.stopped:
            from safetensors.torch import save_model

            target = prepare_target(self.run.root, self.save_weights_to, is_folder=False)
            save_model(pl_module, str(target))  # handles tied weights, unlike save_file
            self.run.artifact(target, "safetensors")

    def _register_checkpoints(self, trainer) -> None:
        for callback in trainer.checkpoint_callbacks:
            folder = getattr(callback, "dirpath", None)
            if not folder or package_relative(self.run, folder) is None:
                continue
            for ckpt in sorted(Path(folder).glob("*.ckpt")):
                # ModelCheckpoint names files epoch=0-step=8.ckpt: '=' is not allowed in an artifact id.
                stem = re.sub(r"[^A-Za-z0-9._-]+", "-", ckpt.stem).strip("-.")
                self.run.artifact(ckpt.absolute(), "resume-checkpoint", id=f"{self.run.id}-{stem}",
                                  loader="lightning-checkpoint")
        forget_missing(self.run, "resume-checkpoint")
