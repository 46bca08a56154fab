"""`RecordCallback`: a transformers TrainerCallback that records a run of the campaign.

It starts the run with the training arguments as params (seed, world size, precision, learning rate, ...),
appends every logged value to the metrics, enforces the declared stop rules live, registers each saved
checkpoint as a resume artifact, prices it (write seconds measured around the save, bytes on disk) and proves
the first one's resume in the background, and, when asked, saves and registers the final model. Only the main
process writes; every process takes the same stop decision (rank 0's, handed to every rank)."""
from __future__ import annotations

import os
import time
from pathlib import Path

from transformers import TrainerCallback

from ..record.artifacts import forget_missing
from ..record.errors import RecordError
from ..record.facts_check import conflicting_declarations, overridden
from ..record.proofs import DEFAULT_TIMEOUT, check_mode, warn
from ..record.run import Run
from .common import (
    json_value,
    keep_the_world_group_destroyable,
    model_params,
    numeric_logs,
    package_relative,
    pin_peft_revision,
    save_final_model,
    vocab_params,
    weights_precision,
)

keep_the_world_group_destroyable(deepspeed=True)

# TrainingArguments recorded in params/<run>.json, under their own names.
RECORDED_ARGS = (
    "seed", "data_seed", "learning_rate", "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon",
    "max_grad_norm", "num_train_epochs", "max_steps", "per_device_train_batch_size", "per_device_eval_batch_size",
    "gradient_accumulation_steps", "lr_scheduler_type", "warmup_steps", "warmup_ratio", "optim", "fp16", "bf16",
    "tf32", "gradient_checkpointing", "logging_steps", "save_strategy", "save_steps", "save_total_limit",
    "eval_strategy", "eval_steps", "logging_nan_inf_filter", "save_only_model")


def training_params(args, run: Run) -> dict:
    params = {}
    for name in RECORDED_ARGS:
        if hasattr(args, name):
            value = json_value(getattr(args, name))
            if value is not None or getattr(args, name) is None:
                params[name] = value
    params["world_size"] = args.world_size
    params["mixed_precision"] = "fp16" if args.fp16 else "bf16" if args.bf16 else None
    params["precision"] = params["mixed_precision"] or "fp32"
    output_dir = package_relative(run, args.output_dir)
    params["output_dir"] = output_dir if output_dir is not None else os.path.basename(str(args.output_dir))
    return params


class RecordCallback(TrainerCallback):
    """Record `run` (a handle from `campaign.run(...)`) while a Trainer trains it.

    save_model_to: a folder inside the package where the final model (or adapter) is saved, with the Trainer's
    processing_class (tokenizer or processor), and registered at the end of a run that was not stopped.
    hf_cache: the hub cache the base of an adapter was loaded from (default: the environment's). checkpoint_id:
    the artifact id of each checkpoint, formatted with the run id and the step. prove_resume: "first" (the
    run's first checkpoint), "every" or False: its resume proven in a background process at the lowest
    priority on `proof_device` (the CPU: the GPU is training); a failed proof stops the run at its next step
    under a declared `no_usable_resume` rule, else warns on every rank. proof_timeout: seconds for the whole
    proof; a proof still running then is killed and recorded as unproven (training goes on)."""

    def __init__(self, run: Run, save_model_to: str | None = None, hf_cache=None,
                 checkpoint_id: str = "{run}-checkpoint-{step}", prove_resume: str | bool = "first",
                 proof_device: str = "cpu", proof_timeout: float = DEFAULT_TIMEOUT):
        self.run = run
        self.checkpoint_id = checkpoint_id
        self.save_model_to = save_model_to
        self.hf_cache = hf_cache
        self.prove_resume = check_mode(prove_resume)
        self.proof_device, self.proof_timeout = proof_device, proof_timeout
        self.stopped = run.stopped
        self._mark = time.monotonic()  # the end of the last hook before a save: the save's write time runs from it
        self._saves = 0
        self._unsettled = 0  # proofs started whose end every rank has not heard of yet

    # The Trainer's default logging_nan_inf_filter=True logs a NaN step's loss as the window's average
    # (FIELD-NOTES): the non-finite rule would be blind. The Trainer reads the flag at every step, so turning it
    # off here (and again at train begin, for a callback added after init) makes it log the real loss.
    def on_init_end(self, args, state, control, **kwargs):
        args.logging_nan_inf_filter = False

    def on_train_begin(self, args, state, control, **kwargs):
        args.logging_nan_inf_filter = False
        saving = str(getattr(args.save_strategy, "value", args.save_strategy)) != "no"
        if saving and package_relative(self.run, args.output_dir) is None:
            raise RecordError(f"output_dir {args.output_dir} lies outside the package {self.run.root}: "
                              "checkpoints must be saved inside it (use a relative output_dir such as "
                              f"{self.run.root.name}/checkpoints/{self.run.id}), or set save_strategy='no'")
        model = kwargs.get("model")
        if model is not None and hasattr(model, "peft_config"):
            pin_peft_revision(model, self.hf_cache)
        if not self.run.started:
            params = training_params(args, self.run)
            if model is not None:
                params.update(model_params(model))
                params.update(vocab_params(model, self.hf_cache))
                if params["mixed_precision"] is None:
                    params["precision"] = weights_precision(model) or params["precision"]
            _settle_declarations(self.run, params)
            self.run.start(params)
        # Inputs counted before train() (run.inputs): recorded at step 0, and a broken truncated_input rule stops
        # the run before its first step.
        self._stop(args, control, _rank_zeros(args, self.run.early_inputs()))
        self._mark = time.monotonic()

    def _stop(self, args, control, violation) -> None:
        if violation is None or self.stopped:
            return
        self.stopped = True
        self.run.stop_for(violation)  # another rank writes nothing: its run.stopped turns true
        control.should_training_stop = True

    def on_step_end(self, args, state, control, **kwargs):
        if self._unsettled:
            # While a proof runs, rank 0 says at each step whether it ended and what it broke: every rank stops
            # (or warns) at the same step.
            proofs = self.run.proofs
            news = (self.run.pending_stop(state.global_step), not proofs.running(), proofs.drain_warnings()) \
                if state.is_world_process_zero else (None, False, [])
            violation, settled, warnings = _rank_zeros(args, news)
            if settled:
                self._unsettled = 0
            if not state.is_world_process_zero:
                for message in warnings:
                    warn(message, stacklevel=2)
            self._stop(args, control, violation)
        self._mark = time.monotonic()

    def on_log(self, args, state, control, logs=None, **kwargs):
        values = numeric_logs(logs)
        if not values:
            return
        # Written by the main process only; every rank checks the rules, and under torch.distributed takes rank
        # 0's decision, so all of them stop together and see the same run.stopped.
        if state.is_world_process_zero:
            violation = self.run.log_dict(state.global_step, values)
        else:
            violation = self.run.check(state.global_step, values)
        self._stop(args, control, _rank_zeros(args, violation))
        self._mark = time.monotonic()

    def on_evaluate(self, args, state, control, **kwargs):
        self._mark = time.monotonic()

    def on_save(self, args, state, control, **kwargs):
        # The Trainer calls no hook between the last one (step end, log, evaluate) and the save itself.
        write_seconds = time.monotonic() - self._mark
        _barrier(args)  # every rank has written its own files (rng_state_<rank>.pth) before it is registered
        prove = self.prove_resume == "every" or (self.prove_resume == "first" and self._saves == 0)
        self._saves += 1
        folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if prove and not self.stopped:
            self._unsettled += 1  # on every rank alike: each asks rank 0 at its next steps
        if state.is_world_process_zero:
            if folder.is_dir():
                artifact_id = self.checkpoint_id.format(run=self.run.id, step=state.global_step)
                self.run.artifact(folder.absolute(), "resume-checkpoint", id=artifact_id)
                self.run.saved(artifact_id, state.global_step, write_seconds,
                               prove_resume="every" if prove and not self.stopped else False,
                               device=self.proof_device, hf_cache=self.hf_cache, timeout=self.proof_timeout)
            forget_missing(self.run, "resume-checkpoint")  # save_total_limit deleted older ones
        self._mark = time.monotonic()

    def on_train_end(self, args, state, control, model=None, **kwargs):
        # A proof that failed at the last step (no step came after it): the run stops here, not at complete().
        violation = self.run.pending_stop(state.global_step) if state.is_world_process_zero else None
        self._stop(args, control, _rank_zeros(args, violation))
        if state.is_world_process_zero:
            forget_missing(self.run, "resume-checkpoint")
            if self.save_model_to and model is not None and not self.stopped:
                # The tokenizer or processor too, as the Trainer saves it in every checkpoint (IV513).
                save_final_model(self.run, model, self.save_model_to, self.hf_cache,
                                 processing_class=kwargs.get("processing_class") or kwargs.get("tokenizer"))
        _barrier(args)


def _settle_declarations(run: Run, params: dict) -> None:
    """The params are written as the Trainer runs: a value the user gave that the training arguments replace is
    said (the params then record what ran, IV514), and two keys declaring one fact with two values (`lora_r` and
    the PEFT config's `r`) are refused before the first step."""
    changed = overridden(run.params, params)
    if changed:
        warn(f"run {run.id}: the params record the values the Trainer runs with, not those given: "
             f"{'; '.join(changed)}", stacklevel=3)
    conflicts = conflicting_declarations({**run.params, **params})
    if conflicts:
        raise RecordError(f"run {run.id}: the params declare {conflicts[0]}"
                          + (f" (and {len(conflicts) - 1} more)" if len(conflicts) > 1 else "")
                          + ": one of them is not what the run trains with; give the value the run uses once")


def _rank_zeros(args, violation):
    """Rank 0's stop decision (or news) on every rank (each called the hook at this step), when
    torch.distributed runs."""
    if args.world_size > 1:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            shared = [violation if dist.get_rank() == 0 else None]
            dist.broadcast_object_list(shared, src=0)
            return shared[0]
    return violation


def _barrier(args) -> None:
    if args.world_size > 1:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.barrier()
