"""`LightningRecorder`: a Lightning callback that records a run of the campaign.

It starts the run at fit start with the trainer's settings as params (seed, world size, precision, learning
rate, ...), appends the real per-step loss and every value the module logs, enforces the declared stop rules
live (every rank takes the decision together), and at the end saves the module's weights into the package as
safetensors and registers them. Only the global-zero process writes.

With `register_checkpoints=True`, each `.ckpt` file the trainer's ModelCheckpoint callbacks save inside the
package is registered as a resume artifact (loader `lightning-checkpoint`, docs/format.md's multi-GPU table) when it is
saved, priced (write seconds from the checkpoint's dump to its file's last write, bytes) and, by `prove_resume`
("first", "every", False), its resume proven in the background as RecordCallback does; those kept at the end are
registered again, those deleted forgotten. Off by default until every checker in use knows that loader."""
from __future__ import annotations

import os
import re
import time
from pathlib import Path

try:
    import lightning.pytorch as pl
except ImportError:  # the standalone package
    import pytorch_lightning as pl

from ..record.artifacts import forget_missing
from ..record.files import prepare_target
from ..record.proofs import DEFAULT_TIMEOUT, check_mode, warn
from ..record.run import Run
from .common import json_value, keep_the_world_group_destroyable, package_relative

keep_the_world_group_destroyable()


def _scalar(value):
    if hasattr(value, "numel") and value.numel() == 1:
        return float(value.detach().float().cpu())
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    return None


class LightningRecorder(pl.Callback):
    """Record `run` (a handle from `campaign.run(...)`) while a Lightning Trainer fits it.

    save_weights_to: a `.safetensors` path inside the package for the final weights (default
    artifacts/<run>.safetensors; None to save nothing). proof_timeout: seconds for the whole resume proof; a
    proof still running then is killed and recorded as unproven (training goes on)."""

    def __init__(self, run: Run, save_weights_to: str | None = "default", register_checkpoints: bool = False,
                 prove_resume: str | bool = "first", proof_device: str = "cpu", hf_cache=None,
                 proof_timeout: float = DEFAULT_TIMEOUT):
        self.run = run
        self.register_checkpoints = register_checkpoints
        self.save_weights_to = f"artifacts/{run.id}.safetensors" if save_weights_to == "default" else save_weights_to
        self.prove_resume = check_mode(prove_resume)
        self.proof_device, self.hf_cache, self.proof_timeout = proof_device, hf_cache, proof_timeout
        self.stopped = False
        self._last: dict[str, float] = {}
        self._save_began: float | None = None  # wall clock: compared with the file's mtime
        self._seen: set[str] = set()
        self._unsettled = 0

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
        self._decide(trainer, self.run.early_inputs() if trainer.is_global_zero else None)

    def _record(self, trainer, values: dict) -> None:
        values = {k: v for k, v in values.items() if v is not None}
        if not values:
            return
        step = trainer.global_step
        if trainer.is_global_zero:
            violation = self.run.log_dict(step, values)
        else:
            violation = self.run.check(step, values)
        self._decide(trainer, violation)

    def _decide(self, trainer, violation) -> None:
        # Each rank sees its own loss: rank 0, whose values are the ones recorded, decides for all.
        stop = trainer.strategy.broadcast(violation if not self.stopped else None, src=0)
        if stop is not None and not self.stopped:
            self.stopped = True
            trainer.should_stop = True
            self.run.stop_for(stop)  # another rank writes nothing: its run.stopped turns true

    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        self._save_began = time.time()  # the dump begins; the file is written right after this hook

    def _priced_saves(self, trainer) -> None:
        """Register and price each checkpoint file saved since the last hook; prove the resume of the first."""
        if not self.register_checkpoints or self._save_began is None:
            return
        began, self._save_began = self._save_began, None
        for callback in trainer.checkpoint_callbacks:
            saved = getattr(callback, "_last_checkpoint_saved", None) or getattr(callback, "last_model_path", "")
            if not saved or saved in self._seen or package_relative(self.run, saved) is None:
                continue
            self._seen.add(saved)
            prove = self.prove_resume == "every" or (self.prove_resume == "first" and len(self._seen) == 1)
            if prove and not self.stopped:
                self._unsettled += 1
            if trainer.is_global_zero and os.path.isfile(saved):
                artifact_id = self._register(Path(saved).absolute())
                write_seconds = max(0.0, os.stat(saved).st_mtime - began)
                self.run.saved(artifact_id, trainer.global_step, write_seconds,
                               prove_resume="every" if prove and not self.stopped else False,
                               device=self.proof_device, hf_cache=self.hf_cache, timeout=self.proof_timeout)

    def _proof_news(self, trainer) -> None:
        if not self._unsettled:
            return
        proofs = self.run.proofs
        news = (self.run.pending_stop(trainer.global_step), not proofs.running(), proofs.drain_warnings()) \
            if trainer.is_global_zero else (None, False, [])
        violation, settled, warnings = trainer.strategy.broadcast(news, src=0)
        if settled:
            self._unsettled = 0
        if not trainer.is_global_zero:
            for message in warnings:
                warn(message, stacklevel=2)
        self._decide(trainer, violation)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._priced_saves(trainer)
        self._proof_news(trainer)

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
        self._priced_saves(trainer)
        # A proof that failed at the last step (no batch came after it): the run stops here, not at complete().
        pending = self.run.pending_stop(trainer.global_step) if trainer.is_global_zero else None
        self._decide(trainer, pending)
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
                self._register(ckpt.absolute())
        forget_missing(self.run, "resume-checkpoint")

    def _register(self, ckpt: Path) -> str:
        # ModelCheckpoint names files epoch=0-step=8.ckpt: '=' is not allowed in an artifact id.
        stem = re.sub(r"[^A-Za-z0-9._-]+", "-", ckpt.stem).strip("-.")
        return self.run.artifact(ckpt, "resume-checkpoint", id=f"{self.run.id}-{stem}", loader="lightning-checkpoint")
