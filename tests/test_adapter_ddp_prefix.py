"""An adapter saved from the DDP wrapper (`module.` in every key) is IV504 with a message that says so
(issue 25), planted in the example package's LoRA adapter."""
from __future__ import annotations

import pytest
from safetensors.torch import load_file, save_file

from tests.test_reload import codes_for, reload

ADAPTER = "artifacts/lora-r16/adapter_model.safetensors"


@pytest.mark.slow
def test_adapter_keys_with_the_ddp_module_prefix_are_IV504_naming_the_prefix(package_dir, hf_cache):
    tensors = load_file(package_dir / ADAPTER)
    wrapped = {name.replace("base_model.model.", "base_model.model.module.", 1): t for name, t in tensors.items()}
    save_file(wrapped, package_dir / ADAPTER, metadata={"format": "pt"})
    _, findings = reload(package_dir, hf_cache, "lora-r16-adapter")
    assert codes_for(findings, "lora-r16-adapter") == ["IV504"]
    assert "DDP wrapper's `module.` prefix" in findings[0].message
