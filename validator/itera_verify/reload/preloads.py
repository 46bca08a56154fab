"""What a run's zygote imports, and what it keeps out: the children's libraries, once, and nothing more.

A zygote (zygote.py) imports once what every child of its run would import: torch, then each loader's libraries
(IMPORTS). A library also imports others for features no reload uses, and those cost more than the reload:
peft imports bitsandbytes (1.5 s on 2 cores, torch's compiler with it) to recognise quantized layers; accelerate
imports boto3 for its SageMaker settings; transformers imports scipy and torchvision for a few architectures'
losses and image tools. The zygote keeps such a library out (`sys.modules[name] = None`: the libraries then see
it as not installed) only where no artifact of the run can need it:

- boto3: never needed (no reload reads a bucket);
- bitsandbytes: unless a model configuration the run loads declares a quantization (a config.json in an artifact,
  or in the hub-cache snapshot of its base);
- scipy and torchvision: where every loader of the run is a Hugging Face model or checkpoint loader (TEXT_LOADERS)
  and the modelling file of every architecture the run loads never names them.

Its forked children keep them out too, as a spawned child does (child.py): peft asks whether bitsandbytes is
installed only when it attaches an adapter, and would import it then, in every child (2 s each). This module
imports nothing heavy: the runner reads it before any child or zygote starts.
"""
from __future__ import annotations

import importlib.util
import os
import re
from dataclasses import dataclass
from pathlib import Path

from ..package.jsonread import read_json_file

# What every child imports, whatever its loader (child.py, common.py and the loader modules).
BASE = ("numpy", "torch", "safetensors", "safetensors.torch", "itera_verify.reload.child", "itera_verify.reload.common")
HF = ("huggingface_hub", "transformers", "transformers.modeling_utils", "transformers.models.auto.modeling_auto",
      "accelerate")
# Per loader, what its child imports beyond BASE (an optional library that is not installed is skipped: the
# child's require() names the extra). The light zygote of format/loaders.py is a run whose loaders need no HF.
IMPORTS = {
    "safetensors": (), "torch-resume": (), "lightning-checkpoint": (), "deepspeed-checkpoint": (),
    "transformers": HF, "peft": (*HF, "peft"), "hf-trainer-checkpoint": (*HF, "peft"), "dcp": HF,
    "accelerate-state": HF,
    "diffusers": (*HF, "diffusers"), "diffusers-lora": (*HF, "peft", "diffusers"),
    "sentence-transformers": (*HF, "sentence_transformers"),
    "timm": ("timm",), "gguf": ("gguf",), "onnx": ("onnx",),
}
# Not onnxruntime: its import starts native threads (two here), and a zygote with more than one thread cannot fork
# safely; every child of the run would then start a fresh interpreter. Each onnx child imports it (0.15 s).
# Loaders whose children load Hugging Face models and checkpoints and nothing else: scipy and torchvision reach
# them only through an architecture's modelling file.
TEXT_LOADERS = frozenset({"safetensors", "torch-resume", "lightning-checkpoint", "deepspeed-checkpoint",
                          "transformers", "peft", "hf-trainer-checkpoint", "dcp", "accelerate-state"})
NEVER_NEEDED = ("boto3",)
QUANTIZATION = "bitsandbytes"
ARCHITECTURE_LIBRARIES = ("scipy", "torchvision")
CONFIG_NAMES = ("config.json", "adapter_config.json")
CONFIG_MAX_BYTES = 1 << 20  # a model configuration is kilobytes; a larger one is read by the child, not here
CONFIG_DEPTH = 2  # a pipeline's component folders, a sentence-transformers module folder
MODEL_TYPE = re.compile(r"[a-z][a-z0-9_]{0,63}")


@dataclass(frozen=True)
class Preloads:
    """What a zygote imports (`imports`, in order), keeps out (`without`), and the architectures' modelling
    modules it imports besides (`model_types`, config.json's `model_type`)."""

    imports: tuple[str, ...]
    without: tuple[str, ...] = ()
    model_types: tuple[str, ...] = ()

    @property
    def light(self) -> bool:
        return "transformers" not in self.imports

    def covers(self, need: Preloads) -> bool:
        """A zygote that imports these serves a run that needs `need`: every import (the libraries kept out are
        the caller's to compare). The architectures' modelling modules are not required: a child imports one it
        lacks itself."""
        return set(need.imports) <= set(self.imports)


def imports_for(loaders) -> tuple[str, ...]:
    """BASE, then each loader's libraries, once each, the loaders in IMPORTS' order, not the package's: one set of
    loaders, one zygote (a shared server's key names its imports in order, reload/shared.py). An unknown loader
    adds nothing (its child fails)."""
    names, wanted = list(BASE), set(loaders)
    for loader in (known for known in IMPORTS if known in wanted):
        names += [name for name in IMPORTS[loader] if name not in names]
    return tuple(names)


def configs_under(folder: Path, depth: int = CONFIG_DEPTH) -> list[dict]:
    """The model configurations in a folder and its subfolders down to `depth` (bounded reads)."""
    found: list[dict] = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return found
    for entry in entries:
        try:
            if entry.name in CONFIG_NAMES and entry.is_file() and entry.stat().st_size <= CONFIG_MAX_BYTES:
                value = read_json_file(entry.path)
                if isinstance(value, dict):
                    found.append(value)
            elif depth > 0 and entry.is_dir(follow_symlinks=False):
                found += configs_under(Path(entry.path), depth - 1)
        except (OSError, ValueError):
            continue
    return found


def _modelling_file(model_type: str) -> Path | None:
    """transformers' modelling file of an architecture, found without importing transformers."""
    try:
        spec = importlib.util.find_spec("transformers")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]) / "models" / model_type / f"modeling_{model_type}.py"


def _names_a_library(model_type: str, libraries) -> bool:
    """The architecture's modelling file names one of `libraries`, or cannot be read (then it may)."""
    if not MODEL_TYPE.fullmatch(model_type):
        return True
    path = _modelling_file(model_type)
    try:
        text = path.read_text(encoding="utf-8", errors="replace") if path is not None else None
    except OSError:
        text = None
    return text is None or any(name in text for name in libraries)


def plan(loaders, folders) -> Preloads:
    """The zygote of a run whose children use `loaders` and load the models of `folders` (the artifacts'
    folders and the hub-cache snapshots of their bases)."""
    loaders = [loader for loader in loaders if isinstance(loader, str)]
    configs = [config for folder in folders for config in configs_under(Path(folder))]
    model_types: list[str] = []
    for config in configs:
        kind = config.get("model_type")
        if isinstance(kind, str) and MODEL_TYPE.fullmatch(kind) and kind not in model_types:
            model_types.append(kind)
    without = list(NEVER_NEEDED)
    if not any(config.get("quantization_config") is not None for config in configs):
        without.append(QUANTIZATION)
    if set(loaders) <= TEXT_LOADERS and not any(_names_a_library(kind, ARCHITECTURE_LIBRARIES)
                                                for kind in model_types):
        without += ARCHITECTURE_LIBRARIES
    return Preloads(imports_for(loaders), tuple(without), tuple(model_types))


def keep_out(names) -> None:
    """In the zygote, before its imports: these libraries look not installed to every library it imports."""
    import sys

    for name in names:
        if name not in sys.modules:
            sys.modules[name] = None  # type: ignore[assignment]
