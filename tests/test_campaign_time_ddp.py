"""Two ranks agree on the resume proof's news (issue 26, docs/record.md): a DDP run (torchrun, 2 gloo processes on the
CPU, the real Trainer) whose first checkpoint is sabotaged on disk right after the save. Only rank 0 proves it,
in the background; when the proof fails under the declared `no_usable_resume` rule, rank 0 hands the stop to
every rank at the same step: both stop there, take the same stop record, and the package holds it once."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.helpers import torchrun_two

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = '''
import json, os, sys
from pathlib import Path
sys.path.insert(0, {root!r})
import torch
torch.set_num_threads(1)
from transformers import PrinterCallback, ProgressCallback, Trainer, TrainerCallback, TrainingArguments
from fixtures.artifacts import tiny_gpt2
from fixtures.train import token_dataset
from itera_verify.integrations import RecordCallback
from itera_verify.record import open_campaign

rank = int(os.environ["RANK"])
ids = [f"ex-{{i}}" for i in range(4)]
campaign = open_campaign("pkg", "ddp-proof", "Do two ranks agree on a failed resume proof?", "toy", "v1", ids)
campaign.declare_plan(lots=[{{"gpu": "RTX 4090", "days": 3, "gpus": 2, "price_usd": 94.28}}], reserved_hours=1)
campaign.declare_stop_rules([{{"id": "nonfinite-loss", "kind": "nonfinite_loss", "metric": "loss"}},
                             {{"id": "no-resume", "kind": "no_usable_resume"}}])
run = campaign.run("sabotaged", "variant", params={{"model": "tiny-gpt2"}})
taken = []
stop_for = run.stop_for
run.stop_for = lambda violation: (taken.append([violation.rule, violation.step, violation.reason]),
                                  stop_for(violation))


class Sabotage(TrainerCallback):
    """On rank 0, which writes optimizer.pt: cut the first checkpoint's in half right after the save (before the
    recorder sees it), then hold the next step's end until the proof has ended, so that the stop step is known.
    Rank 1 runs on meanwhile until the recorder's broadcast at that step makes it wait for rank 0."""

    def __init__(self):
        self.done = False

    def on_save(self, args, state, control, **kwargs):
        if not self.done and state.is_world_process_zero:
            target = Path(args.output_dir) / f"checkpoint-{{state.global_step}}" / "optimizer.pt"
            os.truncate(target, target.stat().st_size // 2)
        self.done = True

    def on_step_end(self, args, state, control, **kwargs):
        if self.done:
            run.proofs.wait(timeout=300)


args = TrainingArguments(output_dir="pkg/checkpoints/sabotaged", max_steps=6, per_device_train_batch_size=2,
                         learning_rate=5e-3, logging_steps=1, save_strategy="steps", save_steps=2,
                         report_to="none", use_cpu=True, disable_tqdm=True, dataloader_num_workers=0, seed=5,
                         ddp_backend="gloo")
trainer = Trainer(model=tiny_gpt2(seed=0), args=args, train_dataset=token_dataset(16, 16, seed=7),
                  callbacks=[Sabotage(), RecordCallback(run)])
trainer.remove_callback(PrinterCallback)
trainer.remove_callback(ProgressCallback)
trainer.train()
Path(f"rank{{rank}}.json").write_text(json.dumps({{"global_step": trainer.state.global_step,
                                                 "stopped": run.stopped, "taken": taken}}))
torch.distributed.destroy_process_group()  # gloo may abort a rank that exits still in the group
'''


@pytest.mark.slow
@pytest.mark.multiprocess
def test_two_ranks_stop_at_the_same_step_with_the_same_record_when_rank_0s_proof_fails(tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT.format(root=str(ROOT)))
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(ROOT / "validator"))
    done = torchrun_two("train.py", tmp_path, env, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    # Saved at step 2, proven while step 3 ran: both ranks stop at step 3, by the same decision, not 6 steps.
    assert ranks[0]["global_step"] == ranks[1]["global_step"] == 3
    assert ranks[0]["stopped"] is ranks[1]["stopped"] is True
    assert ranks[0]["taken"] == ranks[1]["taken"] and len(ranks[0]["taken"]) == 1
    rule, step, reason = ranks[0]["taken"][0]
    assert rule == "no-resume" and step == 3
    assert "sabotaged-checkpoint-2" in reason and "optimizer.pt" in reason and "IV5" in reason
    package = tmp_path / "pkg"
    [stop] = json.loads((package / "stops.json").read_text())["stops"]  # once, though two ranks took it
    assert (stop["run"], stop["rule"], stop["step"], stop["reason"]) == ("sabotaged", rule, step, reason)
    [run] = json.loads((package / "manifest.json").read_text())["runs"]
    assert run["status"] == "stopped"
    proof = run["checkpoints"][0]["proof"]
    assert run["checkpoints"][0]["artifact"] == "sabotaged-checkpoint-2" and proof["ok"] is False and proof["codes"]
