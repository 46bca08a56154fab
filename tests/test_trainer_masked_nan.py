"""The Trainer's masked NaN, produced by the real Trainer (FIELD-NOTES): with logging_nan_inf_filter=True (its
default) a NaN step loss is logged as the window's average (0.0 when every step was NaN) while grad_norm stays
NaN. The metrics file written from its log_history passes IV404 (train_loss is finite); IV409 catches it."""
from __future__ import annotations

import contextlib
import json
import math

import pytest
import torch

from fixtures.artifacts import tiny_gpt2
from fixtures.edit import write_text
from fixtures.train import torch_threads
from tests.helpers import static_findings


def only(findings, code):
    return [f for f in findings if f.code == code]


def _train_with_nan_weights(workdir, nan_inf_filter: bool) -> list[dict]:
    from transformers import PrinterCallback, ProgressCallback, Trainer, TrainingArguments

    model = tiny_gpt2(seed=0)
    with torch.no_grad():
        model.transformer.wte.weight[0, 0] = float("nan")  # every forward pass through token 0 turns NaN
    data = [{"input_ids": torch.zeros(8, dtype=torch.long), "labels": torch.zeros(8, dtype=torch.long)}
            for _ in range(8)]
    args = TrainingArguments(output_dir="out", max_steps=3, per_device_train_batch_size=4, logging_steps=1,
                             save_strategy="no", report_to="none", use_cpu=True, disable_tqdm=True,
                             dataloader_num_workers=0, logging_nan_inf_filter=nan_inf_filter, seed=0)
    with torch_threads(1), contextlib.chdir(workdir):
        trainer = Trainer(model=model, args=args, train_dataset=data)
        trainer.remove_callback(PrinterCallback)
        trainer.remove_callback(ProgressCallback)
        trainer.train()
    return trainer.state.log_history


def _as_metrics(log_history: list[dict], kept_lines: list[str]) -> str:
    records = [json.dumps({"step": entry["step"], "name": key, "value": value})
               for entry in log_history for key, value in entry.items()
               if key in ("loss", "grad_norm", "train_loss")]
    return "\n".join(kept_lines + records) + "\n"


@pytest.fixture(scope="module")
def masked_log(tmp_path_factory) -> list[dict]:
    return _train_with_nan_weights(tmp_path_factory.mktemp("trainer"), nan_inf_filter=True)


def test_the_real_trainer_logs_a_finite_loss_beside_a_nan_grad_norm(masked_log):
    steps = [entry for entry in masked_log if "grad_norm" in entry]
    assert steps and all(math.isfinite(entry["loss"]) for entry in steps)
    assert all(math.isnan(entry["grad_norm"]) for entry in steps)
    assert all(math.isfinite(entry["train_loss"]) for entry in masked_log if "train_loss" in entry)


def test_a_metrics_file_written_from_that_log_is_IV409_not_silently_finite(package_dir, masked_log):
    # The control's eval lines stay; its losses are what the Trainer logged.
    kept = [line for line in (package_dir / "metrics/control.jsonl").read_text().splitlines()
            if "eval_macro_f1" in line]
    write_text(package_dir, "metrics/control.jsonl", _as_metrics(masked_log, kept))
    found = static_findings(package_dir)
    assert not only(found, "IV404")  # train_loss, the rule's metric, is finite: the masking fooled it
    (finding,) = only(found, "IV409")
    assert finding.run == "control" and "grad_norm is NaN at step 1" in finding.message
