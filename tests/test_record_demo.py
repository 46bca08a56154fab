"""Issue 18 item 3: the demo package (fixtures/build.py, the session's `built` package) is recorded through the
recorder and the Trainer callback, not assembled by hand, and it verifies clean with every artifact reloaded."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.test_record_trainer import errors, verify


def load(package, name):
    return json.loads((Path(package) / name).read_text())


def metric_names(package, run_id) -> set[str]:
    lines = (Path(package) / f"metrics/{run_id}.jsonl").read_text().splitlines()
    return {json.loads(line)["name"] for line in lines}


@pytest.mark.slow
def test_the_recorded_demo_verifies_clean_with_every_artifact_reloaded(built):
    report = verify(Path(built["package"]), Path(built["hf_cache"]))
    assert errors(report) == []
    assert [f["code"] for f in report["findings"] if f["severity"] == "warning"] == []
    assert sorted(r["artifact"] for r in report["reloads"] if r["ok"]) == [
        "control-model", "control-resume", "lora-r16-adapter", "lora-r16-resume"]


def test_the_control_was_recorded_by_the_trainer_callback(built):
    params = load(built["package"], "params/control.json")
    # The callback's params come from the TrainingArguments, with the NaN filter it turned off.
    assert params["logging_nan_inf_filter"] is False and params["world_size"] == 1 and params["precision"] == "fp32"
    assert params["seed"] == 42 and params["output_dir"] == "checkpoints/control"
    # Every value the Trainer logged, under its own names, then the eval metric the demo computes.
    assert {"loss", "grad_norm", "learning_rate", "train_loss", "eval_macro_f1"} <= metric_names(
        built["package"], "control")
    artifacts = {a["id"]: a for a in load(built["package"], "manifest.json")["artifacts"]}
    assert artifacts["control-resume"]["path"] == "checkpoints/control/checkpoint-4"
    assert (Path(built["package"]) / "checkpoints/control/checkpoint-4/trainer_state.json").is_file()


def test_the_pilot_was_stopped_by_its_declared_rule_and_the_runs_are_in_the_order_they_ran(built):
    manifest = load(built["package"], "manifest.json")
    assert [r["id"] for r in manifest["runs"]] == ["lora-r64", "control", "lora-r16"]
    (stop,) = load(built["package"], "stops.json")["stops"]
    assert (stop["run"], stop["rule"], stop["step"], stop["reason"]) == (
        "lora-r64", "nonfinite-loss", 3, "train_loss became NaN at step 3")
    r64 = manifest["runs"][0]
    assert (r64["status"], r64["ended_at"], r64["predictions"]) == ("stopped", stop["at"], None)
    adapter = next(a for a in manifest["artifacts"] if a["id"] == "lora-r16-adapter")
    assert adapter["base"] == {"name": built["base_model"], "revision": built["base_revision"]}
    config = load(built["package"], "artifacts/lora-r16/adapter_config.json")
    assert config["revision"] == built["base_revision"]
