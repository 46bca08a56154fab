"""What each artifact of the example package costs to load with its library alone, nothing of the tool around
it: the plain side of reload_bench.py's and reload_scale.py's comparisons (both import it from here)."""
from __future__ import annotations

import json
from pathlib import Path


def bare_load(artifact: str, package: Path, hf_cache: Path, device: str) -> None:
    import torch

    from itera_verify.reload.common import numpy_rng_globals

    checkpoint = package / "checkpoints/control/checkpoint-4"
    if artifact == "control-model":
        from transformers import AutoModelForCausalLM

        AutoModelForCausalLM.from_pretrained(package / "artifacts/control-model", local_files_only=True).to(device)
    elif artifact == "lora-r16-adapter":
        from peft import PeftModel
        from transformers import AutoModelForCausalLM

        config = json.loads((package / "artifacts/lora-r16/adapter_config.json").read_text())
        base = AutoModelForCausalLM.from_pretrained(config["base_model_name_or_path"], revision=config["revision"],
                                                    cache_dir=str(hf_cache), local_files_only=True)
        PeftModel.from_pretrained(base, str(package / "artifacts/lora-r16")).to(device)
    elif artifact == "control-resume":
        from transformers import AutoModelForCausalLM

        AutoModelForCausalLM.from_pretrained(checkpoint, local_files_only=True).to(device)
        for name in ("optimizer.pt", "scheduler.pt"):
            torch.load(checkpoint / name, map_location=device, weights_only=True)
        with torch.serialization.safe_globals(numpy_rng_globals()):
            torch.load(checkpoint / "rng_state.pth", weights_only=True)
    elif artifact == "lora-r16-resume":
        with torch.serialization.safe_globals(numpy_rng_globals()):
            torch.load(package / "checkpoints/lora-r16/resume.pt", map_location=device, weights_only=True)
    else:
        from safetensors import safe_open

        for file in sorted(package.rglob("*.safetensors")):
            with safe_open(str(file), framework="pt", device=device) as handle:
                for name in handle.keys():
                    handle.get_tensor(name)
