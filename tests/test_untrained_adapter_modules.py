"""IV512: an adapter never trained although it carries a `modules_to_save` copy (issue 25): a fresh
get_peft_model saved by a process that never trained has every LoRA B zero and the saved module equal to the
base's; static, from the safetensors headers and bytes."""
from __future__ import annotations

import shutil
from pathlib import Path

from safetensors.torch import load_file, save_file

from tests.test_untrained_rule import iv512

ADAPTER = "artifacts/lora-r16/adapter_model.safetensors"


def fresh_adapter_with_saved_module(built, dest: Path) -> None:
    """What get_peft_model makes before any step, with a module saved whole beside the LoRA matrices."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(built["base_model"], revision=built["base_revision"],
                                                cache_dir=built["hf_cache"], local_files_only=True)
    config = LoraConfig(r=16, target_modules=["c_attn"], modules_to_save=["ln_f"], task_type="CAUSAL_LM")
    get_peft_model(base, config, revision=built["base_revision"]).save_pretrained(dest)


def test_fresh_adapter_with_a_modules_to_save_copy_of_the_base_is_IV512(package_dir, built, tmp_path):
    fresh_adapter_with_saved_module(built, tmp_path / "adapter")
    assert any("ln_f" in name for name in load_file(tmp_path / "adapter/adapter_model.safetensors"))
    shutil.copyfile(tmp_path / "adapter/adapter_model.safetensors", package_dir / ADAPTER)
    [finding] = iv512(package_dir, built["hf_cache"])
    assert (finding.path, finding.artifact) == (ADAPTER, "lora-r16-adapter")
    assert "LoRA B matrix" in finding.message and "ln_f" in finding.message and "nothing was trained" in finding.message


def test_zero_B_beside_a_trained_saved_module_is_not_IV512(package_dir, built, tmp_path):
    # Training only the saved module (LoRA B still zero) changes the model: not this rule's finding.
    fresh_adapter_with_saved_module(built, tmp_path / "adapter")
    tensors = load_file(tmp_path / "adapter/adapter_model.safetensors")
    name = next(n for n in sorted(tensors) if "ln_f.weight" in n)
    tensors[name] = tensors[name] * 1.5
    save_file(tensors, package_dir / ADAPTER, metadata={"format": "pt"})
    assert iv512(package_dir, built["hf_cache"]) == []


def test_trained_classifier_adapter_with_its_head_is_not_IV512(classifier_dir, built_classifier):
    # The LoRA classifier saves its trained head (modules_to_save) beside trained B matrices.
    assert iv512(classifier_dir, built_classifier["hf_cache"]) == []
