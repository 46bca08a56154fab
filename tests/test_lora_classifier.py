"""A new user's LoRA classifier (issue 15): a plain BertModel base from the hub cache, PEFT task_type=SEQ_CLS.

The classifier head is new by design: the base checkpoint lacks classifier.*, the run trains the head and PEFT
saves it through modules_to_save. The campaign must pass with zero findings; a head that neither the base nor
the adapter holds is still IV504. Everything here is real: the base, its tokenizer, the Trainer runs.
"""
from __future__ import annotations
from dataclasses import replace

import pytest
import json
from pathlib import Path

from safetensors import safe_open
from safetensors.torch import load_file

from fixtures.artifacts import write_safetensors
from fixtures.classifier import BERT_MODEL, build_bert_hub_cache
from fixtures.edit import edit_json
from itera_verify.runtime.progress import NULL_PROGRESS
from itera_verify.reload import run_reloads
from itera_verify.reload.loaders.peft import model_key
from itera_verify.rules import reload as reload_rules
from tests.helpers import run_cli, context

ADAPTER = "artifacts/lora-r8"
CHECKPOINT = "checkpoints/lora-r8/checkpoint-200"


def reload(package_dir, hf_cache, *only):
    """Reload some artifacts like the workflow does: (results by artifact, their findings but IV509)."""
    package = context(package_dir, hf_cache=Path(hf_cache))
    package = replace(package, reloads=run_reloads(package, device="cpu", timeout=300, jobs=2, progress=NULL_PROGRESS,
                                  only=set(only) or None))
    return {r.artifact: r for r in package.reloads}, [f for f in reload_rules.check(package) if f.code != "IV509"]


def drop_head(adapter_file: Path) -> list[str]:
    """Save the adapter as a run without modules_to_save would have: LoRA tensors only, no classifier."""
    tensors = load_file(str(adapter_file))
    head = sorted(name for name in tensors if ".classifier." in name)
    for name in head:
        del tensors[name]
    write_safetensors(adapter_file, tensors, metadata={"format": "pt"})
    return head


@pytest.mark.slow
def test_lora_classification_campaign_passes_with_zero_findings(built_classifier):
    done = run_cli(built_classifier["package"], "--hf-cache", built_classifier["hf_cache"], "--no-seal",
                   "--format", "json", "--device", "cpu")
    report = json.loads(done.stdout)
    assert report["findings"] == [], report["findings"]
    assert done.returncode == 0, done.stderr
    reloads = {r["artifact"]: r for r in report["reloads"]}
    assert {a: r["ok"] for a, r in reloads.items()} == {
        "control-model": True, "lora-r8-adapter": True, "lora-r8-resume": True}
    assert all(r["device"] == "cpu" and r["forward"] == "finite output (1, 3) float32" for r in reloads.values())
    adapter = reloads["lora-r8-adapter"]["facts"]
    assert adapter["base_keys_from_adapter"] == ["classifier.bias", "classifier.weight"]
    assert (adapter["num_labels"], adapter["num_labels_from"]) == (3, "adapter classifier.weight")


@pytest.mark.slow
def test_adapter_without_its_head_is_IV504_naming_the_keys(classifier_dir, built_classifier):
    assert drop_head(classifier_dir / ADAPTER / "adapter_model.safetensors") == [
        "base_model.model.classifier.bias", "base_model.model.classifier.weight"]
    results, findings = reload(classifier_dir, built_classifier["hf_cache"], "lora-r8-adapter")
    assert not results["lora-r8-adapter"].ok
    assert [f.code for f in findings] == ["IV504"]
    assert "2 missing key(s): classifier.bias, classifier.weight" in findings[0].message
    assert "in neither the checkpoint nor the adapter" in findings[0].message


@pytest.mark.slow
def test_trainer_checkpoint_of_the_lora_run_reloads_and_its_optimizer_fits(classifier_dir, built_classifier):
    results, findings = reload(classifier_dir, built_classifier["hf_cache"], "lora-r8-resume")
    assert findings == []
    facts = results["lora-r8-resume"].facts
    with safe_open(str(classifier_dir / CHECKPOINT / "adapter_model.safetensors"), "pt") as handle:
        saved = list(handle.keys())  # LoRA A/B of every target plus the classifier's weight and bias
    assert any(".classifier." in name for name in saved)
    assert facts["optimizer_covers"] == f"{len(saved)} of {len(saved)} trainable parameters"
    assert facts["optimizer_step"] == facts["global_step"] == 200
    assert sorted(facts["rng_restored"]) == ["cpu", "numpy", "python"]


@pytest.mark.slow
def test_trainer_checkpoint_without_the_head_is_IV504(classifier_dir, built_classifier):
    drop_head(classifier_dir / CHECKPOINT / "adapter_model.safetensors")
    results, findings = reload(classifier_dir, built_classifier["hf_cache"], "lora-r8-resume")
    assert not results["lora-r8-resume"].ok
    assert [f.code for f in findings] == ["IV504"]
    assert "classifier.weight" in findings[0].message


@pytest.mark.slow
def test_num_labels_in_reload_json_that_agrees_with_the_adapter_passes(classifier_dir, built_classifier):
    edit_json(classifier_dir, "reload.json", lambda doc: doc["artifacts"]["lora-r8-adapter"].update(num_labels=3))
    results, findings = reload(classifier_dir, built_classifier["hf_cache"], "lora-r8-adapter")
    assert findings == [] and results["lora-r8-adapter"].ok


@pytest.mark.slow
def test_num_labels_in_reload_json_against_the_adapters_head_is_IV504(classifier_dir, built_classifier):
    edit_json(classifier_dir, "reload.json", lambda doc: doc["artifacts"]["lora-r8-adapter"].update(num_labels=5))
    _, findings = reload(classifier_dir, built_classifier["hf_cache"], "lora-r8-adapter")
    assert [f.code for f in findings] == ["IV504"]
    assert "num_labels is 5, but the adapter's classifier.weight has 3 rows" in findings[0].message


@pytest.mark.slow
def test_num_labels_in_reload_json_sizes_a_head_the_adapter_does_not_hold(classifier_dir, built_classifier):
    """Without the head in the adapter, num_labels cannot make missing keys acceptable: still IV504."""
    drop_head(classifier_dir / ADAPTER / "adapter_model.safetensors")
    edit_json(classifier_dir, "reload.json", lambda doc: doc["artifacts"]["lora-r8-adapter"].update(num_labels=3))
    results, findings = reload(classifier_dir, built_classifier["hf_cache"], "lora-r8-adapter")
    assert [f.code for f in findings] == ["IV504"]
    assert results["lora-r8-adapter"].facts.get("num_labels_from") == "reload.json"


def test_peft_key_names_map_to_the_models_own():
    assert model_key("base_model.model.classifier.weight") == "classifier.weight"
    assert model_key("base_model.model.classifier.modules_to_save.default.weight") == "classifier.weight"
    assert model_key("base_model.model.bert.encoder.layer.0.attention.self.query.lora_A.weight") == \
        "bert.encoder.layer.0.attention.self.query.lora_A.weight"


def test_one_hub_cache_holds_the_bert_base_beside_another(built_classifier, tmp_path):
    other = tmp_path / "hf" / "models--itera-fixtures--tiny-gpt2" / "refs" / "main"
    other.parent.mkdir(parents=True)
    other.write_text("0" * 40)
    cache = build_bert_hub_cache(tmp_path / "hf")
    assert cache["revision"] == built_classifier["base_revision"]  # deterministic: same files, same pin
    assert other.read_text() == "0" * 40
    snapshot = Path(cache["snapshot"])
    assert sorted(p.name for p in snapshot.iterdir()) == [
        "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
    assert json.loads((snapshot / "config.json").read_text())["architectures"] == ["BertModel"]
    assert BERT_MODEL == "itera-fixtures/tiny-bert"


def test_num_labels_that_is_not_a_positive_integer_is_a_schema_finding(classifier_dir):
    edit_json(classifier_dir, "reload.json", lambda doc: doc["artifacts"]["lora-r8-adapter"].update(num_labels=0))
    done = run_cli(classifier_dir, "--no-reload", "--no-seal", "--format", "json")
    findings = json.loads(done.stdout)["findings"]
    assert [(f["code"], f["path"]) for f in findings] == [("IV105", "reload.json")], findings


@pytest.mark.parametrize("added, stale", [(["pre_classifier"], False), (["dense"], True)])
def test_task_heads_peft_adds_itself_are_not_a_stale_modules_to_save(built_classifier, tmp_path, added, stale):
    """PEFT adds a classification task's heads to modules_to_save by itself: classifier and score, and since PEFT
    0.22 pre_classifier (DistilBERT's head), so adapter_config.json lists more than the params declared. Those are
    not a stale declaration (IV514); a module the params left out that PEFT never adds is."""
    import shutil

    from tests.helpers import static_findings

    package = Path(shutil.copytree(built_classifier["package"], tmp_path / "package", symlinks=True))
    edit_json(package, f"{ADAPTER}/adapter_config.json",
              lambda config: config.update(modules_to_save=list(config["modules_to_save"] or []) + added))
    findings = [f for f in static_findings(package, select=("IV514",)) if f.code == "IV514"]
    assert [(f.path, f.pointer, "dense" in f.message) for f in findings] == \
        ([("params/lora-r8.json", "/modules_to_save", True)] if stale else []), [f.message for f in findings]
