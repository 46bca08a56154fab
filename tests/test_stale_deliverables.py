"""Stale deliverables (issue 25): a delivered model or adapter that is an earlier checkpoint of its own run, two
checkpoints of one run holding the same weights at different steps (IV512, static), and a checkpoint whose
scheduler.pt belongs to another step (IV508, the reload). Planted in the real packages: the multi-process one
(checkpoints of the control written by two gloo ranks at step 2, its Trainer checkpoint at step 4) and the
LoRA classification campaign (a Trainer checkpoint of the adapter)."""
from __future__ import annotations

import shutil

import torch
from safetensors.torch import load_file, save_file

from fixtures.edit import edit_json
from tests.test_reload import codes_for, reload
from tests.test_untrained_rule import add_artifact, iv512

DDP_WEIGHTS = "checkpoints/ddp/checkpoint-2/model.safetensors"  # the control at step 2, written by a DDP run
LAST = "checkpoints/control/checkpoint-4"  # the control's last checkpoint, step 4
MODEL = "artifacts/control-model/model.safetensors"


def test_final_model_equal_to_an_earlier_checkpoint_of_its_own_run_is_IV512(multigpu_dir, built_multigpu):
    # The run trained to step 4, but the model delivered is the DDP checkpoint's step-2 weights.
    shutil.copyfile(multigpu_dir / DDP_WEIGHTS, multigpu_dir / MODEL)
    [finding] = iv512(multigpu_dir, built_multigpu["hf_cache"])
    assert (finding.path, finding.artifact, finding.run) == (MODEL, "control-model", "control")
    assert "ddp-checkpoint" in finding.message and "step 2" in finding.message and "step 4" in finding.message
    assert "stale" in finding.message


def test_final_model_equal_to_the_runs_best_checkpoint_is_not_IV512(multigpu_dir, built_multigpu):
    # load_best_model_at_end: the Trainer delivers the checkpoint its trainer_state.json names as the best.
    shutil.copyfile(multigpu_dir / DDP_WEIGHTS, multigpu_dir / MODEL)
    edit_json(multigpu_dir, f"{LAST}/trainer_state.json",
              lambda s: s.update(best_model_checkpoint="checkpoints/ddp/checkpoint-2"))
    assert iv512(multigpu_dir, built_multigpu["hf_cache"]) == []


def test_last_checkpoint_holding_an_earlier_checkpoints_weights_is_IV512(multigpu_dir, built_multigpu):
    # checkpoint-4 "mixes steps": its weights are the step-2 checkpoint's.
    shutil.copyfile(multigpu_dir / DDP_WEIGHTS, multigpu_dir / f"{LAST}/model.safetensors")
    [finding] = iv512(multigpu_dir, built_multigpu["hf_cache"])
    assert (finding.path, finding.artifact) == (f"{LAST}/model.safetensors", "control-resume")
    assert "ddp-checkpoint" in finding.message and "step 2" in finding.message and "mixes steps" in finding.message


def test_clean_multigpu_package_has_no_stale_deliverable(multigpu_dir, built_multigpu):
    # Five checkpoints of the control at step 2 from different layouts, each trained: no two alike.
    assert iv512(multigpu_dir, built_multigpu["hf_cache"]) == []


def test_adapter_equal_to_a_checkpoint_before_the_runs_last_is_IV512(classifier_dir, built_classifier):
    # The LoRA run saved checkpoint-200 and trained on to checkpoint-300; the adapter delivered is step 200's.
    first, later = "checkpoints/lora-r8/checkpoint-200", "checkpoints/lora-r8/checkpoint-300"
    shutil.copytree(classifier_dir / first, classifier_dir / later)
    tensors = load_file(classifier_dir / later / "adapter_model.safetensors")
    name = next(n for n in sorted(tensors) if "lora_B" in n)
    tensors[name] = tensors[name] + 0.01
    save_file(tensors, classifier_dir / later / "adapter_model.safetensors", metadata={"format": "pt"})
    edit_json(classifier_dir, f"{later}/trainer_state.json", lambda s: s.update(global_step=300))
    add_artifact(classifier_dir, {"id": "lora-r8-checkpoint-300", "run": "lora-r8", "kind": "resume-checkpoint",
                                  "path": later}, {"loader": "hf-trainer-checkpoint"})
    [finding] = iv512(classifier_dir, built_classifier["hf_cache"])
    assert (finding.artifact, finding.path) == ("lora-r8-adapter", "artifacts/lora-r8/adapter_model.safetensors")
    assert "step 200" in finding.message and "step 300" in finding.message


def test_scheduler_of_an_earlier_step_in_a_trainer_checkpoint_is_IV508(multigpu_dir, built_multigpu):
    # checkpoint-4 carries the step-2 DDP checkpoint's scheduler.pt (last_epoch 2): a resume would replay the
    # learning-rate schedule from step 2 while the optimizer and trainer_state say 4.
    shutil.copyfile(multigpu_dir / "checkpoints/ddp/checkpoint-2/scheduler.pt", multigpu_dir / f"{LAST}/scheduler.pt")
    assert torch.load(multigpu_dir / f"{LAST}/scheduler.pt", weights_only=True)["last_epoch"] == 2
    _, findings = reload(multigpu_dir, built_multigpu["hf_cache"], "control-resume")
    assert codes_for(findings, "control-resume") == ["IV508"]
    assert "last_epoch" in findings[0].message and "2" in findings[0].message and "4" in findings[0].message


def test_clean_trainer_checkpoint_scheduler_agrees_with_global_step(multigpu_dir, built_multigpu):
    results, findings = reload(multigpu_dir, built_multigpu["hf_cache"], "control-resume", "ddp-checkpoint")
    assert findings == []
    assert results["control-resume"].facts["scheduler_last_epoch"] == 4
