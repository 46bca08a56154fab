"""IV501's advice, checked against the installed peft: loading the base with revision= does not record the pin in
adapter_config.json; get_peft_model(..., revision=...) does. The finding must say the second."""
from __future__ import annotations

import json
import shutil

from tests.helpers import static_findings

ADAPTER = "artifacts/lora-r16"


def save_adapter(built, dest, *, revision_to_peft: bool) -> dict:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(built["base_model"], revision=built["base_revision"],
                                                cache_dir=built["hf_cache"], local_files_only=True)
    config = LoraConfig(r=4, target_modules=["c_attn"], task_type="CAUSAL_LM")
    extra = {"revision": built["base_revision"]} if revision_to_peft else {}
    model = get_peft_model(base, config, **extra)
    model.save_pretrained(dest)
    return json.loads((dest / "adapter_config.json").read_text())


def adapter_iv501(package_dir) -> list:
    return [f for f in static_findings(package_dir) if f.code == "IV501" and f.path == f"{ADAPTER}/adapter_config.json"]


def test_base_loaded_with_revision_leaves_adapter_unpinned_and_the_advice_names_get_peft_model(package_dir, built,
                                                                                              tmp_path):
    config = save_adapter(built, tmp_path / "adapter", revision_to_peft=False)
    assert config["revision"] is None  # what the user did: from_pretrained(..., revision=SHA) only
    shutil.copyfile(tmp_path / "adapter" / "adapter_config.json", package_dir / ADAPTER / "adapter_config.json")
    [finding] = adapter_iv501(package_dir)
    assert "get_peft_model(model, config, revision=SHA)" in finding.message
    assert "does not record it" in finding.message


def test_following_the_advice_pins_the_adapter(package_dir, built, tmp_path):
    config = save_adapter(built, tmp_path / "adapter", revision_to_peft=True)
    assert config["revision"] == built["base_revision"]
    shutil.copyfile(tmp_path / "adapter" / "adapter_config.json", package_dir / ADAPTER / "adapter_config.json")
    assert adapter_iv501(package_dir) == []


def test_explanation_gives_the_same_advice():
    from itera_verify.rules import all_rules

    explain = all_rules()["IV501"].explain
    assert "get_peft_model(model, config, revision=SHA)" in explain and "does not put it there" in explain
