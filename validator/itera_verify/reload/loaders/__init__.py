"""One module per reload.json loader; each exposes `reload(job, device, outcome)` and reports facts only."""
from __future__ import annotations

import importlib

MODULES = {
    "safetensors": "safetensors",
    "transformers": "transformers",
    "peft": "peft",
    "hf-trainer-checkpoint": "trainer_checkpoint",
    "torch-resume": "torch_resume",
    "deepspeed-checkpoint": "deepspeed",
    "dcp": "dcp",
    "accelerate-state": "accelerate_state",
    "lightning-checkpoint": "lightning",
}
LOADERS = tuple(MODULES)


def loader_module(name: str):
    """The module of a loader, imported only in the reload child (it pulls in torch and the libraries)."""
    return importlib.import_module(f"{__name__}.{MODULES[name]}")
