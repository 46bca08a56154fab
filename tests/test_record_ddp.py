"""A DDP run (torchrun, 2 gloo processes on the CPU) recorded through RecordCallback: every rank runs the same
script, only rank 0 writes, and the package holds exactly one set of files: one params file, each logged value
once, one checkpoint with both ranks' RNG states, registered after both wrote them."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.helpers import torchrun_two
from tests.test_record_trainer import errors, verify

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = '''
import contextlib, os, sys
sys.path.insert(0, {root!r})
import torch
torch.set_num_threads(1)
from transformers import PrinterCallback, ProgressCallback, Trainer, TrainingArguments
from fixtures.artifacts import tiny_gpt2
from fixtures.train import token_dataset
from itera_verify.integrations import RecordCallback
from itera_verify.record import open_campaign

ids = [f"ex-{{i}}" for i in range(4)]
campaign = open_campaign("pkg", "ddp-test", "Does DDP record one set of files?", "toy", "v1", ids)
campaign.declare_plan(lots=[{{"gpu": "RTX 4090", "days": 3, "gpus": 2, "price_usd": 94.28}}], reserved_hours=1)  # 2 processes, 2 GPUs (IV613)
campaign.declare_stop_rules([{{"id": "nonfinite-loss", "kind": "nonfinite_loss", "metric": "loss"}}])
run = campaign.run("control", "control", params={{"model": "tiny-gpt2"}})
args = TrainingArguments(output_dir="pkg/checkpoints/control", max_steps=4, per_device_train_batch_size=2,
                         learning_rate=5e-3, logging_steps=1, save_strategy="steps", save_steps=4,
                         report_to="none", use_cpu=True, disable_tqdm=True, dataloader_num_workers=0, seed=5,
                         ddp_backend="gloo")
trainer = Trainer(model=tiny_gpt2(seed=0), args=args, train_dataset=token_dataset(16, 16, seed=7),
                  callbacks=[RecordCallback(run, save_model_to="artifacts/control-model")])
trainer.remove_callback(PrinterCallback)
trainer.remove_callback(ProgressCallback)
trainer.train()
if trainer.is_world_process_zero():
    with run.predictions() as stream:
        for i in ids:
            stream.write(i, 0)
    run.complete()
    campaign.decision("continue", after="pilot")
    campaign.close("inconclusive", "a DDP smoke run", accepted=["control"], error_analysis="# none\\n")
torch.distributed.destroy_process_group()  # gloo may abort a rank that exits still in the group
'''


@pytest.mark.slow
def test_a_two_process_ddp_run_writes_exactly_one_set_of_files(tmp_path, hf_cache):
    (tmp_path / "train.py").write_text(SCRIPT.format(root=str(ROOT)))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT / "validator"))
    done = torchrun_two("train.py", tmp_path, env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    package = tmp_path / "pkg"
    manifest = json.loads((package / "manifest.json").read_text())
    assert [r["id"] for r in manifest["runs"]] == ["control"]
    assert sorted(p.name for p in (package / "params").iterdir()) == ["control.json"]
    params = json.loads((package / "params/control.json").read_text())
    assert params["world_size"] == 2
    records = [json.loads(line) for line in (package / "metrics/control.jsonl").read_text().splitlines()]
    losses = [r["step"] for r in records if r["name"] == "loss"]
    assert losses == [1, 2, 3, 4]  # each logged value once, not once per rank
    checkpoint = package / "checkpoints/control/checkpoint-4"
    assert sorted(p.name for p in checkpoint.glob("rng_state*")) == ["rng_state_0.pth", "rng_state_1.pth"]
    assert sorted(a["id"] for a in manifest["artifacts"]) == ["control-checkpoint-4", "control-model"]
    assert not list(package.rglob(".itera-record-tmp-*"))
    assert errors(verify(package, hf_cache)) == []
