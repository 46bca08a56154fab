"""Run.resume_file: a hand-written loop's torch-resume file written by the recorder holds what the torch-resume
reload proves, is written atomically by the writing rank only, and refuses the usual slips before writing."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from itera_verify.record import RecordError, open_campaign
from tests.test_record_api import EVAL_IDS, QUESTION, campaign_at, finish
from tests.test_record_trainer import errors, verify

RESUME = "checkpoints/control/resume.pt"


def tiny_loop(steps: int = 3, fp16_scaler: bool = False):
    """A real two-layer model trained a few AdamW steps under a linear LR schedule."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    model[0].weight.requires_grad_(False)  # a frozen part: trainable_only leaves it out
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LinearLR(optimizer, 1.0, 0.1, total_iters=steps)
    scaler = torch.amp.GradScaler("cpu", enabled=True) if fp16_scaler else None
    for _ in range(steps):
        loss = model(torch.randn(4, 8)).pow(2).mean()
        loss.backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
    return {"model": model, "optimizer": optimizer, "scheduler": scheduler, "step": steps,
            "data_state": {"epoch": 0, "index": steps * 4}, "scaler": scaler}


def started(tmp_path: Path):
    campaign = campaign_at(tmp_path / "pkg")
    run = campaign.start_run("control", "control", params={"seed": 1, "lr": 0.01})
    run.log_dict(1, {"loss": 2.0})
    return campaign, run


@pytest.mark.slow
def test_the_written_resume_file_reloads_clean_with_every_component(tmp_path, hf_cache):
    campaign, run = started(tmp_path)
    loop = tiny_loop()
    artifact = run.resume_file(RESUME, **loop)
    finish(campaign, run)
    package = tmp_path / "pkg"
    assert artifact == "control-resume"
    entry = json.loads((package / "reload.json").read_text())["artifacts"][artifact]
    assert entry["loader"] == "torch-resume" and "fp16" not in entry
    saved = torch.load(package / RESUME, weights_only=False)  # our own file, read back to look at it
    assert sorted(saved) == ["data_state", "model", "optimizer", "rng", "scheduler", "step"]
    assert sorted(saved["model"]) == ["0.bias", "2.bias", "2.weight"]  # the frozen 0.weight left out
    assert sorted(saved["rng"]) == ["numpy", "python", "torch"]
    report = verify(package, hf_cache)
    assert errors(report) == []
    (result,) = [r for r in report["reloads"] if r["artifact"] == artifact]
    assert result["ok"] and sorted(result["facts"]["rng_restored"]) == ["numpy", "python", "torch"]
    assert not [p for p in package.rglob(".itera-record-tmp-*")]


@pytest.mark.slow
def test_the_whole_state_dict_with_trainable_only_false_and_a_scaler_marks_fp16(tmp_path, hf_cache):
    campaign, run = started(tmp_path)
    artifact = run.resume_file(RESUME, **tiny_loop(fp16_scaler=True), trainable_only=False)
    finish(campaign, run)
    package = tmp_path / "pkg"
    assert json.loads((package / "reload.json").read_text())["artifacts"][artifact]["fp16"] is True
    saved = torch.load(package / RESUME, weights_only=False)
    assert "0.weight" in saved["model"] and "scaler" in saved
    assert errors(verify(package, hf_cache)) == []


@pytest.mark.parametrize("change,words", [
    ({"step": torch.tensor(3)}, "non-negative integer"),
    ({"step": 3.0}, "non-negative integer"),
    ({"step": True}, "non-negative integer"),
    ({"step": -1}, "non-negative integer"),
    ({"data_state": None}, "data_state"),
    ({"scheduler": 0.01}, "scheduler"),
    ({"optimizer": "adamw"}, "optimizer"),
    ({"model": [1, 2]}, "model"),
])
def test_the_usual_slips_are_refused_before_anything_is_written(tmp_path, change, words):
    _, run = started(tmp_path)
    with pytest.raises(RecordError, match=words):
        run.resume_file(RESUME, **{**tiny_loop(), **change})
    package = tmp_path / "pkg"
    assert not (package / RESUME).exists()
    assert not any(a["kind"] == "resume-checkpoint"
                   for a in json.loads((package / "manifest.json").read_text()).get("artifacts", []))


def test_a_model_with_nothing_trainable_is_refused(tmp_path):
    _, run = started(tmp_path)
    loop = tiny_loop()
    for parameter in loop["model"].parameters():
        parameter.requires_grad_(False)
    with pytest.raises(RecordError, match="no tensor"):
        run.resume_file(RESUME, **loop)


@pytest.mark.parametrize("path,words", [("checkpoints/control/resume.bin", r"\*\.pt"),
                                        ("../outside.pt", "outside the package")])
def test_a_path_that_is_not_a_pt_inside_the_package_is_refused(tmp_path, path, words):
    _, run = started(tmp_path)
    with pytest.raises(RecordError, match=words):
        run.resume_file(path, **tiny_loop())
    assert not (tmp_path / "outside.pt").exists()


def test_a_save_that_fails_half_way_leaves_neither_the_file_nor_a_temporary(tmp_path):
    _, run = started(tmp_path)
    loop = tiny_loop()
    loop["data_state"] = {"sampler": lambda: None}  # torch.save cannot pickle a lambda: it fails mid-write
    with pytest.raises(Exception, match="(?i)pickle|lambda"):
        run.resume_file(RESUME, **loop)
    package = tmp_path / "pkg"
    assert not (package / RESUME).exists()
    assert not list(package.rglob(".itera-record-tmp-*"))


def test_a_second_save_replaces_the_first_whole(tmp_path):
    _, run = started(tmp_path)
    run.resume_file(RESUME, **tiny_loop(steps=2))
    run.resume_file(RESUME, **tiny_loop(steps=3))
    package = tmp_path / "pkg"
    assert torch.load(package / RESUME, weights_only=False)["step"] == 3
    assert [a["id"] for a in json.loads((package / "manifest.json").read_text())["artifacts"]] == ["control-resume"]


def test_a_process_that_is_not_the_writer_writes_nothing(tmp_path):
    started(tmp_path)  # the main process created the campaign and started the run
    other = open_campaign(tmp_path / "pkg", "api-test", QUESTION, "toy", "v1", EVAL_IDS, main_process=False)
    run = other.start_run("control", "control", params={"seed": 1, "lr": 0.01})
    assert run.resume_file("checkpoints/control/rank1.pt", **tiny_loop()) == "control-resume"
    assert not (tmp_path / "pkg/checkpoints/control/rank1.pt").exists()


def test_another_rank_makes_the_same_refusals(tmp_path):
    started(tmp_path)
    other = open_campaign(tmp_path / "pkg", "api-test", QUESTION, "toy", "v1", EVAL_IDS, main_process=False)
    run = other.start_run("control", "control", params={"seed": 1, "lr": 0.01})
    with pytest.raises(RecordError, match="non-negative integer"):
        run.resume_file("checkpoints/control/rank1.pt", **{**tiny_loop(), "step": 2.0})
    with pytest.raises(RecordError, match="outside the package"):
        run.resume_file("../rank1.pt", **tiny_loop())
