"""itera_verify.record + RecordCallback on real Trainer runs: a full fine-tune control with a checkpoint, a
LoRA variant on the pinned base of the fixture's hub cache, a run whose NaN loss stops it, a run an eval floor
stops mid-training. The recorded package is then checked by the real CLI, reloads included (CPU)."""
from __future__ import annotations

import contextlib
import json
import math
import subprocess
from pathlib import Path

import pytest
import torch
from itera_verify.record import RecordError

from fixtures.artifacts import tiny_gpt2
from fixtures.hub import BASE_MODEL
from fixtures.train import token_dataset, torch_threads

ROOT = Path(__file__).resolve().parents[1]
EVAL_IDS = [f"ex-{i}" for i in range(6)]
RULES = [{"id": "nonfinite-loss", "kind": "nonfinite_loss", "metric": "loss"},
         {"id": "truncated", "kind": "truncated_input"}]
FLOOR = {"id": "acc-floor", "kind": "below_threshold", "metric": "eval_accuracy", "threshold": 0.05}


def verify(package: Path, hf_cache: Path, *extra: str) -> dict:
    done = subprocess.run([str(ROOT / ".venv/bin/itera-verify"), str(package), "--hf-cache", str(hf_cache),
                           "--no-seal", "--format", "json", "--device", "cpu", *extra],
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.stdout, done.stderr
    return json.loads(done.stdout)


def errors(report: dict) -> list[str]:
    return [f"{f['code']} {f.get('path')}: {f['message']}" for f in report["findings"] if f["severity"] == "error"]


def open_test_campaign(package: Path, rules=RULES):
    from itera_verify.record import open_campaign

    campaign = open_campaign(package, "record-test", "Does LoRA r=4 match the full fine-tune on toy sequences?",
                             "toy-progressions", "v1", EVAL_IDS)
    campaign.declare_plan(lots=[{"gpu": "RTX 4090", "days": 3, "gpus": 1, "price_usd": 47.14}],
                          reserved_hours=1, other_expenses=[{"label": "storage", "usd": 1.5, "included": True}])
    campaign.declare_stop_rules(rules)
    return campaign


def train(model, run, output_dir: str, max_steps: int = 4, save_steps: int | None = None, eval_steps=None,
          save_model_to=None, hf_cache=None, **extra):
    from itera_verify.integrations import RecordCallback
    from transformers import (
        PrinterCallback,
        ProgressCallback,
        Trainer,
        TrainingArguments,
    )

    data = token_dataset(8, 16, seed=7)
    args = TrainingArguments(
        output_dir=output_dir, max_steps=max_steps, per_device_train_batch_size=2,
        learning_rate=extra.pop("learning_rate", 5e-3),
        logging_steps=1, save_strategy="steps" if save_steps else "no", save_steps=save_steps or 500,
        eval_strategy="steps" if eval_steps else "no", eval_steps=eval_steps, report_to="none", use_cpu=True,
        disable_tqdm=True, dataloader_num_workers=0, seed=11, **extra)
    trainer = Trainer(model=model, args=args, train_dataset=data, eval_dataset=data[:4] if eval_steps else None,
                      compute_metrics=next_token_accuracy if eval_steps else None,
                      callbacks=[RecordCallback(run, save_model_to=save_model_to, hf_cache=hf_cache)])
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    trainer.train()
    return trainer


def next_token_accuracy(prediction) -> dict:
    predicted = prediction.predictions.argmax(-1)[:, :-1]
    return {"accuracy": float((predicted == prediction.label_ids[:, 1:]).mean())}


def write_predictions(run, model) -> None:
    rows = token_dataset(len(EVAL_IDS), 16, seed=99)
    model.eval()
    with torch.no_grad(), run.predictions() as stream:
        for eval_id, row in zip(EVAL_IDS, rows):
            logits = model(input_ids=row["input_ids"][None]).logits
            stream.write(eval_id, int(logits[0, -1].argmax()))


def load_base(hf_cache: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(BASE_MODEL, cache_dir=str(hf_cache), local_files_only=True)


def nan_model():
    model = tiny_gpt2(seed=0)
    with torch.no_grad():
        model.transformer.wte.weight[:, 0] = float("nan")  # every forward pass turns NaN
    return model


def collapsed_model():
    model = tiny_gpt2(seed=0)
    with torch.no_grad():
        model.transformer.wte.weight.zero_()
    return model


@pytest.fixture(scope="module")
def recorded(hf_cache, tmp_path_factory) -> dict:
    """One campaign, four real Trainer runs, recorded and closed (shared by this module's tests)."""
    from peft import LoraConfig, get_peft_model

    work = tmp_path_factory.mktemp("record")
    package = work / "pkg"
    with torch_threads(1), contextlib.chdir(work):  # relative output_dir: no /tmp path in training_args.bin
        campaign = open_test_campaign(Path("pkg"))
        control = campaign.run("control", "control", params={"model": "tiny-gpt2", "init_seed": 0})
        control.inputs("eval", len(EVAL_IDS), 0)  # the truncated rule's counts (IV412)
        model = tiny_gpt2(seed=0)
        # save_total_limit=1: checkpoint-2 is rotated away and must not stay registered.
        train(model, control, "pkg/checkpoints/control", save_steps=2, save_total_limit=1, eval_steps=4,
              save_model_to="artifacts/control-model")
        write_predictions(control, model)
        control.complete()
        campaign.decision("continue", after="pilot", note="the control's loss falls")

        lora = campaign.run("lora-r4", "variant", params={"base_model": BASE_MODEL, "lora_r": 4})
        lora.inputs("eval", len(EVAL_IDS), 0)
        peft_model = get_peft_model(load_base(hf_cache), LoraConfig(
            r=4, lora_alpha=8, target_modules=["c_attn", "c_proj", "c_fc"], task_type="CAUSAL_LM", fan_in_fan_out=True))
        train(peft_model, lora, "pkg/checkpoints/lora-r4", learning_rate=5e-2, save_model_to="artifacts/lora-r4",
              hf_cache=hf_cache)
        write_predictions(lora, peft_model)
        lora.complete()

        nan_run = campaign.run("nan", "variant", "exploratory", params={"weights": "nan"})
        nan_trainer = train(nan_model(), nan_run, "pkg/checkpoints/nan", max_steps=5)
        manifest = campaign.close("positive", "lora-r4 trains like the control on toy sequences.",
                                  accepted=["control", "lora-r4"], error_analysis="# Errors\n\nToy data.\n")
    return {"package": package, "manifest": manifest, "nan_steps": nan_trainer.state.global_step}


@pytest.fixture(scope="module")
def floored(hf_cache, tmp_path_factory) -> dict:
    """A campaign whose only run an eval floor stops mid-training: nothing accepted."""
    work = tmp_path_factory.mktemp("record-floor")
    with torch_threads(1), contextlib.chdir(work):
        campaign = open_test_campaign(Path("pkg"), RULES + [FLOOR])
        run = campaign.run("control", "control", params={"collapsed": True})
        # A collapsed model (embeddings zero, learning rate 0) predicts token 0 everywhere: under the floor.
        trainer = train(collapsed_model(), run, "pkg/checkpoints/control", max_steps=6, eval_steps=2,
                        learning_rate=0.0)
        manifest = campaign.close("negative", "the control collapsed; stopped by its accuracy floor.",
                                  accepted=[], error_analysis="# Errors\n\nEvery prediction is token 0.\n")
    return {"package": work / "pkg", "manifest": manifest, "steps": trainer.state.global_step}


@pytest.mark.slow
def test_the_recorded_campaign_verifies_clean_with_reloads(recorded, hf_cache):
    report = verify(recorded["package"], hf_cache)
    assert errors(report) == []
    reloaded = {r["artifact"] for r in report["reloads"] if r["ok"]} if "reloads" in report else None
    kinds = {a["id"]: a["kind"] for a in recorded["manifest"]["artifacts"]}
    assert kinds == {"control-checkpoint-4": "resume-checkpoint", "control-model": "transformers-model",
                     "lora-r4-adapter": "peft-adapter"}
    assert reloaded is None or reloaded == set(kinds)


def test_params_come_from_the_training_arguments(recorded):
    params = json.loads((recorded["package"] / "params/control.json").read_text())
    assert params["seed"] == 11 and params["learning_rate"] == 5e-3 and params["world_size"] == 1
    assert params["precision"] == "fp32" and params["output_dir"] == "checkpoints/control"
    assert params["logging_nan_inf_filter"] is False and params["init_seed"] == 0
    assert params["model_class"] == "GPT2LMHeadModel"


def test_a_lora_runs_params_hold_its_adapter_configuration_and_pinned_base(recorded, hf_cache):
    revision = (hf_cache / "models--itera-fixtures--tiny-gpt2/refs/main").read_text().strip()
    params = json.loads((recorded["package"] / "params/lora-r4.json").read_text())
    lora = params["peft"]["default"]
    assert lora["r"] == 4 and lora["target_modules"] == ["c_attn", "c_fc", "c_proj"]
    assert lora["revision"] == revision and params["model_name_or_path"] == BASE_MODEL


def test_a_checkpoint_rotated_away_is_not_left_registered(recorded):
    assert not (recorded["package"] / "checkpoints/control/checkpoint-2").exists()
    reload = json.loads((recorded["package"] / "reload.json").read_text())["artifacts"]
    assert sorted(reload) == ["control-checkpoint-4", "control-model", "lora-r4-adapter"]
    assert reload["control-checkpoint-4"]["loader"] == "hf-trainer-checkpoint"


def test_checkpoints_outside_the_package_are_refused_before_training(tmp_path):
    with contextlib.chdir(tmp_path):
        campaign = open_test_campaign(Path("pkg"))
        run = campaign.run("control", "control")
        with pytest.raises(RecordError, match="lies outside the package"):
            train(tiny_gpt2(seed=0), run, "elsewhere/control", max_steps=1, save_steps=1)
    assert json.loads((tmp_path / "pkg/manifest.json").read_text())["runs"] == []


def test_the_adapter_is_pinned_to_the_commit_the_base_was_loaded_from(recorded, hf_cache):
    revision = (hf_cache / "models--itera-fixtures--tiny-gpt2/refs/main").read_text().strip()
    config = json.loads((recorded["package"] / "artifacts/lora-r4/adapter_config.json").read_text())
    assert config["revision"] == revision and config["base_model_name_or_path"] == BASE_MODEL
    (adapter,) = [a for a in recorded["manifest"]["artifacts"] if a["kind"] == "peft-adapter"]
    assert adapter["base"] == {"name": BASE_MODEL, "revision": revision}


def test_a_nan_loss_stops_the_run_at_its_step_with_the_real_loss_logged(recorded):
    stops = json.loads((recorded["package"] / "stops.json").read_text())["stops"]
    (stop,) = [s for s in stops if s["run"] == "nan"]
    assert stop["rule"] == "nonfinite-loss" and stop["step"] == 1 and "loss became NaN" in stop["reason"]
    assert recorded["nan_steps"] == 1  # training stopped there, not after 5 steps
    lines = [json.loads(line) for line in (recorded["package"] / "metrics/nan.jsonl").read_text().splitlines()]
    losses = [r["value"] for r in lines if r["name"] == "loss"]
    assert losses and math.isnan(losses[0])  # not the window average the default filter would log


def test_an_eval_floor_stops_training_mid_run(floored, hf_cache):
    stops = json.loads((floored["package"] / "stops.json").read_text())["stops"]
    (stop,) = stops
    assert stop["rule"] == "acc-floor" and stop["step"] == 2 and floored["steps"] == 2
    (run,) = floored["manifest"]["runs"]
    assert run["status"] == "stopped" and run["predictions"] is None
    assert "cost_per_accepted_usd" not in floored["manifest"]["decision"]  # undefined at zero accepted
    assert errors(verify(floored["package"], hf_cache, "--no-reload")) == []


def test_cost_per_accepted_run_comes_from_the_lots(recorded):
    assert recorded["manifest"]["decision"]["cost_per_accepted_usd"] == round((47.14 + 1.5) / 2, 2)


def test_a_second_plan_after_a_run_started_is_refused_and_nothing_changes(recorded, tmp_path):
    import shutil

    from itera_verify.record import RecordError, open_campaign

    package = tmp_path / "pkg"
    shutil.copytree(recorded["package"], package, symlinks=True)
    before = (package / "manifest.json").read_bytes()
    campaign = open_campaign(package, "record-test", "Does LoRA r=4 match the full fine-tune on toy sequences?",
                             "toy-progressions", "v1", EVAL_IDS)
    with pytest.raises(RecordError, match="never rewritten.*deviation"):
        campaign.declare_plan(lots=[{"gpu": "RTX 4090", "days": 7, "gpus": 1, "price_usd": 110}],
                              reserved_hours=100)
    with pytest.raises(RecordError, match="never rewritten"):
        campaign.declare_stop_rules(RULES[:1])
    assert (package / "manifest.json").read_bytes() == before
    campaign.declare_stop_rules(RULES)  # the same rules again: a reopened script, no change
    assert (package / "manifest.json").read_bytes() == before


def test_a_callback_added_after_init_still_sees_the_real_nan_loss(tmp_path):
    from transformers import PrinterCallback, ProgressCallback, Trainer, TrainingArguments

    from itera_verify.integrations import RecordCallback

    with torch_threads(1), contextlib.chdir(tmp_path):
        run = open_test_campaign(Path("pkg")).run("control", "control")
        args = TrainingArguments(output_dir="pkg/out", max_steps=3, per_device_train_batch_size=2, logging_steps=1,
                                 save_strategy="no", report_to="none", use_cpu=True, disable_tqdm=True, seed=0)
        trainer = Trainer(model=nan_model(), args=args, train_dataset=token_dataset(8, 16, seed=7))
        assert trainer.args.logging_nan_inf_filter is True  # the Trainer's default, which masks the NaN
        trainer.add_callback(RecordCallback(run))  # on_init_end has run already: on_train_begin turns it off
        trainer.remove_callback(PrinterCallback)
        trainer.remove_callback(ProgressCallback)
        trainer.train()
    (stop,) = json.loads((tmp_path / "pkg/stops.json").read_text())["stops"]
    assert stop["step"] == 1 and stop["reason"].startswith("loss became NaN")
