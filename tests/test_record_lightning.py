"""LightningRecorder on real Lightning fits (CPU): a clean run whose package verifies with its weights reloaded,
and a run whose NaN loss stops training at that step with the stop record written."""
from __future__ import annotations

import contextlib
import json
import math
from pathlib import Path

import pytest
import torch

from fixtures.train import torch_threads
from tests.test_record_trainer import errors, verify

pl = pytest.importorskip("lightning.pytorch")

EVAL_IDS = [f"x-{i}" for i in range(8)]
ROOT = Path(__file__).resolve().parents[1]


def lightning_loader_known() -> bool:
    schema = json.loads((ROOT / "schemas/reload.schema.json").read_text())
    loaders = schema["properties"]["artifacts"]["additionalProperties"]["properties"]["loader"]["enum"]
    return "lightning-checkpoint" in loaders and (ROOT / "validator/itera_verify/reload/loaders/lightning.py").exists()
RULES = [{"id": "nonfinite-loss", "kind": "nonfinite_loss", "metric": "loss"},
         {"id": "acc-floor", "kind": "below_threshold", "metric": "val_acc", "threshold": 0.1}]


class Classifier(pl.LightningModule):
    def __init__(self, poison_at: int | None = None):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
        self.poison_at = poison_at

    def training_step(self, batch, batch_idx):
        x, y = batch
        if self.poison_at is not None and self.global_step + 1 >= self.poison_at:
            x = x * float("nan")
        loss = torch.nn.functional.cross_entropy(self.net(x), y)
        self.log("train_loss", loss, on_step=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_acc", (self.net(x).argmax(-1) == y).float().mean())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def loader():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 4, generator=g)
    y = (x[:, 0] > 0).long()
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)


def fit(run, module, steps=8, checkpoints_to=None):
    from itera_verify.integrations import LightningRecorder

    callbacks = [LightningRecorder(run, register_checkpoints=checkpoints_to is not None)]
    if checkpoints_to:
        callbacks.append(pl.callbacks.ModelCheckpoint(dirpath=checkpoints_to, every_n_train_steps=4, save_top_k=-1))
    trainer = pl.Trainer(max_steps=steps, accelerator="cpu", devices=1, logger=False,
                         enable_checkpointing=checkpoints_to is not None,
                         enable_progress_bar=False, enable_model_summary=False, log_every_n_steps=1,
                         val_check_interval=4, num_sanity_val_steps=0, default_root_dir="lightning-work",
                         callbacks=callbacks)
    trainer.fit(module, loader(), loader())
    return trainer


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    from itera_verify.record import open_campaign

    work = tmp_path_factory.mktemp("record-lightning")
    with torch_threads(1), contextlib.chdir(work):
        pl.seed_everything(3, verbose=False)
        campaign = open_campaign("pkg", "lightning-test", "Does an MLP separate x0 > 0?", "toy", "v1", EVAL_IDS)
        campaign.declare_plan(lots=[{"gpu": "RTX 4090", "days": 3, "gpus": 1, "price_usd": 47.14}],
                              reserved_hours=1)
        campaign.declare_stop_rules(RULES)
        control = campaign.run("control", "control")
        module = Classifier()
        fit(control, module)
        with control.predictions() as stream:
            for i, eval_id in enumerate(EVAL_IDS):
                stream.write(eval_id, int(module.net(torch.full((1, 4), i - 4.0)).argmax()))
        control.complete()
        poisoned = campaign.run("nan", "variant", "exploratory")
        trainer = fit(poisoned, Classifier(poison_at=3))
        campaign.decision("continue", after="pilot")
        manifest = campaign.close("positive", "the MLP separates the toy data.", accepted=["control"],
                                  error_analysis="# Errors\n\nNone on toy data.\n")
    return {"package": work / "pkg", "manifest": manifest, "nan_steps": trainer.global_step}


def test_the_recorded_lightning_campaign_verifies_clean_with_its_weights_reloaded(recorded, hf_cache):
    report = verify(recorded["package"], hf_cache)
    assert errors(report) == []
    assert [(r["artifact"], r["ok"]) for r in report["reloads"]] == [("control-weights", True)]
    params = json.loads((recorded["package"] / "params/control.json").read_text())
    assert params["seed"] == 3 and params["learning_rate"] == 0.1 and params["world_size"] == 1
    names = {json.loads(line)["name"] for line in (recorded["package"] / "metrics/control.jsonl").open()}
    assert {"loss", "train_loss", "val_acc"} <= names


@pytest.mark.slow
def test_the_kept_checkpoints_are_registered_as_lightning_resume_artifacts(tmp_path, hf_cache):
    from itera_verify.record import open_campaign

    with torch_threads(1), contextlib.chdir(tmp_path):
        pl.seed_everything(3, verbose=False)
        campaign = open_campaign("pkg", "lightning-ckpt", "Does an MLP separate x0 > 0?", "toy", "v1", EVAL_IDS)
        campaign.declare_plan(lots=[{"gpu": "RTX 4090", "days": 3, "gpus": 1, "price_usd": 47.14}],
                              reserved_hours=1)
        campaign.declare_stop_rules(RULES[:1])
        run = campaign.run("control", "control")
        fit(run, Classifier(), checkpoints_to="pkg/checkpoints/control")
        # The run stays open: its resume proofs still record into manifest.json (through a temporary file) as
        # they end. Verify the package once they have, not while the recorder writes it.
        run.proofs.wait(timeout=300)
    manifest = json.loads((tmp_path / "pkg/manifest.json").read_text())
    artifacts = {a["id"]: a for a in manifest["artifacts"]}
    assert sorted(artifacts) == ["control-epoch-0-step-4", "control-epoch-1-step-8", "control-weights"]
    assert artifacts["control-epoch-1-step-8"]["path"] == "checkpoints/control/epoch=1-step=8.ckpt"
    reload = json.loads((tmp_path / "pkg/reload.json").read_text())["artifacts"]
    assert reload["control-epoch-0-step-4"]["loader"] == "lightning-checkpoint"
    if not lightning_loader_known():
        pytest.skip("this checker has no lightning-checkpoint loader yet (issue 16)")
    report = verify(tmp_path / "pkg", hf_cache)
    assert {(r["artifact"], r["ok"]) for r in report["reloads"]} >= {
        ("control-epoch-0-step-4", True), ("control-epoch-1-step-8", True)}
    # ModelCheckpoint keeps its realpath'd dirpath in every .ckpt: under /tmp that is IV201, rightly.
    assert {(f["code"], f["path"]) for f in report["findings"] if f["severity"] == "error"} <= {
        ("IV201", "checkpoints/control/epoch=0-step=4.ckpt"), ("IV201", "checkpoints/control/epoch=1-step=8.ckpt"),
        ("IV101", "manifest.json"), ("IV105", "manifest.json"), ("IV106", "manifest.json"),
        ("IV607", "manifest.json")}  # the run is not completed nor the campaign closed: not this test's subject


def test_a_nan_loss_stops_the_lightning_fit_at_its_step(recorded):
    (stop,) = json.loads((recorded["package"] / "stops.json").read_text())["stops"]
    assert stop["run"] == "nan" and stop["rule"] == "nonfinite-loss" and stop["step"] == 3
    assert recorded["nan_steps"] == 3  # not the 8 steps asked for
    losses = [json.loads(line) for line in (recorded["package"] / "metrics/nan.jsonl").open()]
    assert math.isnan([r for r in losses if r["name"] == "loss"][-1]["value"])
    assert not (recorded["package"] / "artifacts/nan.safetensors").exists()
