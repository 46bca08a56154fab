"""Campaign time (issue 26, docs/record.md) with the real Lightning Trainer on the CPU, recorded by LightningRecorder:
every save priced (step, time, write seconds, bytes), the first checkpoint's resume proven in the background, a
first checkpoint sabotaged on disk right after the save stopping its run under `no_usable_resume`, and a proof
process that hangs (stopped by SIGSTOP) killed at its timeout: the training goes on, the proof records that it
timed out, and `run.complete()` returns instead of waiting for it forever."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import xml.etree.ElementTree as ET
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from fixtures.train import torch_threads
from tests.test_record_lightning import Classifier, loader
from tests.helpers import context

pl = pytest.importorskip("lightning.pytorch")

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow

EVAL_IDS = [f"x-{i}" for i in range(8)]
RULES = [{"id": "nonfinite-loss", "kind": "nonfinite_loss", "metric": "loss"},
         {"id": "no-resume", "kind": "no_usable_resume"}]
STARTED = (datetime.now(UTC) - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
HUNG_TIMEOUT = 5.0  # the hung run's proof_timeout; its watcher kills it KILL_GRACE later


class Sabotage(pl.Callback):
    """Cuts the first .ckpt in half as soon as it is on disk (placed before the recorder, which registers it at
    the next batch start), then holds the next step until the proof has ended, so that the stop step is known."""

    def __init__(self, run, folder: Path):
        self.run, self.folder, self.cut, self.held = run, folder, None, False

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        saved = sorted(self.folder.glob("*.ckpt"))
        if self.cut is None and saved:
            self.cut = (trainer.global_step, saved[0].name)
            os.truncate(saved[0], saved[0].stat().st_size // 2)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self.cut is not None and not self.held:
            self.held = True
            self.run.proofs.wait(timeout=300)


class Freeze(pl.Callback):
    """Stops the proof process (SIGSTOP) as soon as it started (placed after the recorder): a hung proof."""

    def __init__(self, run):
        self.run, self.frozen = run, None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self.frozen is None and self.run.proofs.running():
            self.frozen = self.run.proofs.running()[0].pid
            os.kill(self.frozen, signal.SIGSTOP)


def fit(run, folder: str, *, before=(), after=(), **recorder):
    from itera_verify.integrations import LightningRecorder

    callbacks = [*before, LightningRecorder(run, register_checkpoints=True, **recorder), *after,
                 pl.callbacks.ModelCheckpoint(dirpath=folder, every_n_train_steps=2, save_top_k=-1)]
    trainer = pl.Trainer(max_steps=8, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, log_every_n_steps=1, val_check_interval=4,
                         num_sanity_val_steps=0, default_root_dir="lightning-work", callbacks=callbacks)
    trainer.fit(Classifier(), loader(), loader())
    return trainer


def predict(run) -> None:
    with run.predictions() as stream:
        for eval_id in EVAL_IDS:
            stream.write(eval_id, 0)


@pytest.fixture(scope="module")
def campaign(tmp_path_factory) -> dict:
    from itera_verify.record import open_campaign

    work = tmp_path_factory.mktemp("campaign-time-lightning")
    out: dict = {"package": work / "pkg"}
    with torch_threads(1), contextlib.chdir(work):
        pl.seed_everything(3, verbose=False)
        campaign = open_campaign("pkg", "lightning-time", "Does an MLP separate x0 > 0?", "toy", "v1", EVAL_IDS)
        campaign.declare_plan(lots=[{"gpu": "RTX 4090", "days": 3, "gpus": 1, "price_usd": 47.14}],
                              reserved_hours=1, started_at=STARTED)
        campaign.declare_stop_rules(RULES)

        control = campaign.run("control", "control")
        fit(control, "pkg/checkpoints/control")
        predict(control)
        control.complete()  # waits for the proof

        sabotaged = campaign.run("sabotaged", "variant")
        sabotage = Sabotage(sabotaged, out["package"] / "checkpoints/sabotaged")
        out["sabotaged_steps"] = fit(sabotaged, "pkg/checkpoints/sabotaged", before=[sabotage]).global_step
        out["cut"] = sabotage.cut

        hung = campaign.run("hung", "variant")
        freeze = Freeze(hung)
        try:
            out["hung_steps"] = fit(hung, "pkg/checkpoints/hung", after=[freeze], proof_timeout=HUNG_TIMEOUT
                                    ).global_step
            out["hung_running_at_fit_end"] = bool(hung.proofs.running())
            predict(hung)
            began = time.monotonic()
            hung.complete()
            out["complete_seconds"] = time.monotonic() - began
        finally:
            if freeze.frozen is not None:  # never leave a stopped process behind, whatever the code under test did
                with contextlib.suppress(ProcessLookupError):
                    os.kill(freeze.frozen, signal.SIGKILL)
        out["frozen"] = freeze.frozen
    manifest = json.loads((out["package"] / "manifest.json").read_text())
    out["runs"] = {r["id"]: r for r in manifest["runs"]}
    out["stops"] = {s["run"]: s for s in json.loads((out["package"] / "stops.json").read_text())["stops"]}
    return out


def test_every_lightning_save_is_priced_with_its_step_time_write_seconds_and_bytes(campaign):
    saves = campaign["runs"]["control"]["checkpoints"]
    assert [c["step"] for c in saves] == [2, 4, 6, 8]
    for save in saves:
        name = f"epoch={(save['step'] - 1) // 4}-step={save['step']}"  # 4 batches an epoch
        path = campaign["package"] / "checkpoints/control" / f"{name}.ckpt"
        assert save["artifact"] == "control-" + name.replace("=", "-")
        assert save["bytes"] == path.stat().st_size > 0
        assert 0 <= save["write_seconds"] < 30 and save["saved_at"].endswith("Z")


def test_the_first_lightning_checkpoint_is_proven(campaign):
    first, *later = campaign["runs"]["control"]["checkpoints"]
    proof = first["proof"]
    assert proof["ok"] is True and proof["codes"] == [] and proof["device"] == "cpu", proof
    assert proof["priority"]["nice"] == 19 and proof["seconds"] > 0
    assert all("proof" not in c for c in later)  # prove_resume="first"
    assert campaign["runs"]["control"]["status"] == "completed"


def test_a_sabotaged_first_lightning_checkpoint_stops_its_run_under_no_usable_resume(campaign):
    assert campaign["cut"] == (2, "epoch=0-step=2.ckpt")
    stop = campaign["stops"]["sabotaged"]
    # Cut at step 2's save, proven while step 3 ran (held until it ended): the recorder hears of it at the next
    # batch start, global step 3, and Lightning runs no batch after should_stop.
    assert stop["rule"] == "no-resume" and stop["step"] == 3 == campaign["sabotaged_steps"]
    assert "sabotaged-epoch-0-step-2" in stop["reason"] and "IV5" in stop["reason"], stop
    proof = campaign["runs"]["sabotaged"]["checkpoints"][0]["proof"]
    assert proof["ok"] is False and proof["codes"], proof
    assert campaign["runs"]["sabotaged"]["status"] == "stopped"
    assert not (campaign["package"] / "artifacts/sabotaged.safetensors").exists()


def test_a_hung_proof_is_killed_at_its_timeout_and_the_training_goes_on(campaign):
    from itera_verify.record.proofs import KILL_GRACE

    assert campaign["frozen"] is not None and campaign["hung_steps"] == 8  # every step ran
    assert campaign["hung_running_at_fit_end"]
    assert campaign["complete_seconds"] < HUNG_TIMEOUT + KILL_GRACE + 30  # waited for the watcher, not forever
    proof = campaign["runs"]["hung"]["checkpoints"][0]["proof"]
    assert proof["ok"] is False and proof["codes"] == [] and proof["timed_out"] is True, proof
    assert "did not end within its timeout of 5 s" in proof["error"]
    assert proof["proof_seconds"] >= HUNG_TIMEOUT + KILL_GRACE
    assert campaign["runs"]["hung"]["status"] == "completed" and "hung" not in campaign["stops"]
    with pytest.raises(ProcessLookupError):
        os.kill(campaign["frozen"], 0)  # gone (reaped by the watcher)


def test_the_hung_proof_is_IV413_naming_the_timeout(campaign):
    from itera_verify.rules import Selection
    from itera_verify.flows.checks import run_checks

    found = [f for f in run_checks(context(campaign["package"]), Selection(select=("IV413",)), "static")]
    assert [f.run for f in found] == ["hung"] and "did not end within its timeout" in found[0].message


def cli(package: Path, fmt: str) -> str:
    done = subprocess.run([str(ROOT / ".venv/bin/itera-verify"), str(package), "--no-reload", "--no-seal",
                           "--format", fmt], capture_output=True, text=True, timeout=300, check=False)
    assert done.stdout, done.stderr
    return done.stdout


def test_the_verify_report_carries_the_saves_in_every_format_and_follows_the_schema(campaign):
    import jsonschema

    report = json.loads(cli(campaign["package"], "json"))
    jsonschema.validate(report, json.loads((ROOT / "schemas/report.schema.json").read_text()))
    saves = {r["id"]: r.get("saves") for r in report["runs"]}
    assert saves["control"]["count"] == 4 and saves["control"]["proof_ok"] is True
    assert saves["sabotaged"]["proof_ok"] is False and saves["hung"]["proof_ok"] is False
    rental = report["plan"]["rental"]
    assert rental["fits"] is True and rental["rates"]["seal_rate_source"].startswith("measured here")
    junit = ET.fromstring(cli(campaign["package"], "junit").encode("utf-8"))
    properties = {p.get("name"): p.get("value") for p in junit.find("testsuite").find("properties")}
    assert properties["saves.control"].startswith("control: 4 saves, every 2 steps")
    assert "early resume proof passed" in properties["saves.control"]
    notices = [line for line in cli(campaign["package"], "github").splitlines() if "saves of" in line]
    assert [n.split("::")[1] for n in notices] == [f"notice title=itera-verify saves of {run}"
                                                   for run in ("control", "sabotaged", "hung")]
