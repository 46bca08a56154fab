"""What an artifact is, from its files: the kind and the loader that proves it (pure, no I/O).

One reading for every stage: IV510 (rules/artifacts.py) and the reload plan (reload/jobs.py) compare it with the
loader a package declares, the recorder names the kind of `run.artifact(path)` by it, and `init` lists the
artifacts it finds. The caller walks the artifact, asks `wanted(...)` which small files it needs, reads them
(JSON documents parsed, a safetensors file as its tensor names) and hands them to `identify(...)`.

A declared loader that is not among the identity's `provers` cannot prove what the files are: a diffusers
pipeline declared `safetensors` would fail on its folders, a LoRA declared `safetensors` would pass on a bare
tensor check. Where the files say nothing certain, `identify` returns None and the declaration stands.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .layouts import LATEST, PIPELINE_INDEX, STEP_PREFIX, TRAINER_STATE
from .loaders import LOADERS

# The files whose presence names the library that wrote the folder (beside a pipeline's model_index.json and a
# Trainer checkpoint's trainer_state.json, format/layouts.py's).
MODULES = "modules.json"  # SentenceTransformer.save
ADAPTER_CONFIG = "adapter_config.json"  # PEFT save_pretrained
CONFIG = "config.json"  # transformers and timm (save_for_hf)
LORA_FILES = ("pytorch_lora_weights.safetensors", "pytorch_lora_weights.bin")  # diffusers save_lora_weights
WEIGHT_NAMES = re.compile(r"(model|pytorch_model|tf_model|flax_model)(-\d+-of-\d+)?\.(safetensors|bin|h5|msgpack)"
                          r"|(model|pytorch_model)\.(safetensors|bin)\.index\.json")
# kohya's sd-scripts names modules `lora_unet_…`, `lora_te_…` (`lora_te1_`/`lora_te2_` for SDXL), with
# `.lora_down.weight`, `.lora_up.weight` and `.alpha`; diffusers' save_lora_weights prefixes each component.
KOHYA_KEY = re.compile(r"lora_(unet|te\d?|transformer)_\S+\.(lora_down\.weight|lora_up\.weight|alpha)")
DIFFUSERS_KEY = re.compile(r"(unet|text_encoder(_\d)?|transformer|prior)\.\S*(\.lora\.|\.lora_[AB]\.|lora_linear_layer)"
                           r"\S*")
RESUME_LOADERS = frozenset(name for name, row in LOADERS.items() if "resume-checkpoint" in row.kinds)
# A checkpoint folder also holds a loadable model: declared as one, it is proven as one.
CHECKPOINT_PROVERS = RESUME_LOADERS | {"transformers", "peft", "safetensors"}
HEADER_SAMPLE = 2  # safetensors files whose tensor names are read to recognise a LoRA layout
# What only a checkpoint holds beside the weights: the optimizer, the scheduler, the RNG states (Trainer, accelerate).
RESUME_FILE = re.compile(r"(optimizer|scheduler)(_\d+)?\.(pt|bin)|rng_state(_\d+)?\.pth|random_states_\d+\.pkl")
# A model or adapter folder declared as a resume checkpoint is one stripped of its resume files: the resume
# loader says which are missing (IV507), not IV510.
MODEL_PROVERS = RESUME_LOADERS


@dataclass(frozen=True)
class Identity:
    """What the files are: the manifest kind, the loader that proves it, and the loaders whose reload proves
    it too (`provers`, the loader among them). `what` says it in words, with the file that shows it. `path`:
    where that loader must point when it is not the artifact itself (a lone .gguf inside a folder).
    `unread`: files inside that none of the provers reads (a .gguf beside a model's weights)."""

    kind: str
    loader: str
    what: str
    provers: frozenset[str]
    path: str = ""
    unread: tuple[str, ...] = ()

    def proven_by(self, loader: str) -> bool:
        return loader in self.provers


def _identity(kind: str, loader: str, what: str, provers: Iterable[str] = (), **more) -> Identity:
    return Identity(kind, loader, what, frozenset({loader, *provers}), **more)


def _top(files: Iterable[str]) -> set[str]:
    return {name for name in files if "/" not in name}


def _suffixed(names: Iterable[str], suffix: str) -> list[str]:
    return sorted(name for name in names if name.lower().endswith(suffix))


def wanted(files: Iterable[str], is_folder: bool) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(JSON documents, safetensors files) `identify` reads among `files` (paths relative to the artifact, or
    the file's own name): the top-level documents that name a library and, where none but config.json does
    and no model weights are there, the first few safetensors files, whose tensor names tell a LoRA."""
    files = list(files)
    if not is_folder:
        return (), tuple(name for name in files if name.lower().endswith(".safetensors"))
    top = _top(files)
    documents = tuple(name for name in (PIPELINE_INDEX, MODULES, ADAPTER_CONFIG, CONFIG) if name in top)
    if set(documents) - {CONFIG} or any(WEIGHT_NAMES.fullmatch(name) for name in top):
        return documents, ()
    return documents, tuple(_suffixed(top, ".safetensors")[:HEADER_SAMPLE])


def lora_layout(tensor_names: Iterable[str]) -> str | None:
    """"kohya" or "diffusers" when most tensor names follow that LoRA layout, else None."""
    names = list(tensor_names)
    if not names:
        return None
    kohya = sum(1 for name in names if KOHYA_KEY.fullmatch(name))
    diffusers = sum(1 for name in names if DIFFUSERS_KEY.fullmatch(name))
    best, count = max((("kohya", kohya), ("diffusers", diffusers)), key=lambda pair: pair[1])
    return best if count * 2 >= len(names) else None


def identify(name: str, files: Iterable[str], is_folder: bool, documents: Mapping[str, object],
             tensor_names: Mapping[str, Iterable[str]]) -> Identity | None:
    """The identity of the artifact `name` (its package path), from `files` (relative to it; for a file, its
    own name), `documents` (wanted JSON, parsed) and `tensor_names` (wanted safetensors files). None where the
    files name nothing certain."""
    files = list(files)
    if not is_folder:
        return _identify_file(name, files[0] if files else name.rsplit("/", 1)[-1], tensor_names)
    top = _top(files)
    dirs = {name.split("/", 1)[0] for name in files if "/" in name}
    if TRAINER_STATE in top or LATEST in top or any(d.startswith(STEP_PREFIX) for d in dirs) \
            or any(RESUME_FILE.fullmatch(f) for f in top) \
            or ".metadata" in top and any(f.endswith(".distcp") for f in top):
        return _identity("resume-checkpoint", _resume_loader(top, dirs), "a resume checkpoint folder",
                         CHECKPOINT_PROVERS)
    if PIPELINE_INDEX in top:
        return _identity("diffusers-pipeline", "diffusers", f"a diffusers pipeline folder ({PIPELINE_INDEX})")
    if MODULES in top:
        return _identity("sentence-transformers-model", "sentence-transformers",
                         f"a sentence-transformers folder ({MODULES})")
    if ADAPTER_CONFIG in top:
        return _identity("peft-adapter", "peft", f"a PEFT adapter folder ({ADAPTER_CONFIG})", MODEL_PROVERS)
    lora = [f for f in LORA_FILES if f in top] or [
        f for f in _suffixed(top, ".safetensors") if lora_layout(tensor_names.get(f, ()))]
    config = documents.get(CONFIG)
    if CONFIG in top and not isinstance(config, dict):
        return None  # an unreadable config.json: the loader's reload says what is wrong with it
    found = _identify_config(config, top) if isinstance(config, dict) else None
    if found is not None:
        return found
    if lora:
        return _identity("diffusers-lora", "diffusers-lora", f"a diffusers LoRA ({lora[0]})")
    return _identify_bare(name, top)


def _resume_loader(top: set[str], dirs: set[str]) -> str:
    """The resume loader of a checkpoint folder, from the names directly inside it."""
    if TRAINER_STATE in top or any(name.startswith("rng_state") for name in top):
        return "hf-trainer-checkpoint"
    if LATEST in top or any(d.startswith(STEP_PREFIX) for d in dirs):
        return "deepspeed-checkpoint"
    if ".metadata" in top:
        return "dcp"
    return "accelerate-state"


def _identify_config(config: dict, top: set[str]) -> Identity | None:
    unread = tuple(_suffixed(top, ".gguf") + _suffixed(top, ".onnx"))
    if isinstance(config.get("architecture"), str) and "model_type" not in config:
        return _identity("timm-model", "timm", f"a timm model folder ({CONFIG} with `architecture`)")
    weights = any(WEIGHT_NAMES.fullmatch(f) for f in top)
    if isinstance(config.get("quantization_config"), dict):
        return _identity("transformers-model", "transformers",
                         f"a quantized transformers model ({CONFIG} with `quantization_config`)", MODEL_PROVERS,
                         unread=unread)
    if weights:
        # The safetensors loader proves a model's shards tensor by tensor (the format's documented use).
        return _identity("transformers-model", "transformers", f"a transformers model folder ({CONFIG} + weights)",
                         MODEL_PROVERS | {"safetensors"}, unread=unread)
    return None


def _identify_bare(name: str, top: set[str]) -> Identity | None:
    """A folder no document names: an ONNX export, GGUF files, or bare tensors (no opinion)."""
    onnx, gguf = _suffixed(top, ".onnx"), _suffixed(top, ".gguf")
    if onnx:
        return _identity("onnx", "onnx", f"an ONNX model ({onnx[0]})")
    if gguf:
        return _identity("gguf", "gguf", f"a GGUF file ({gguf[0]})", path=f"{name}/{gguf[0]}",
                         unread=tuple(gguf[1:]))
    # Bare tensors (a model folder that lost its config.json, shards of one file): the loader declared says
    # what is wrong with them.
    return None


def _identify_file(name: str, file: str, tensor_names: Mapping[str, Iterable[str]]) -> Identity | None:
    lower = file.lower()
    if lower.endswith(".gguf"):
        return _identity("gguf", "gguf", f"a GGUF file ({file})")
    if lower.endswith(".onnx"):
        return _identity("onnx", "onnx", f"an ONNX model ({file})")
    if lower.endswith(".ckpt"):
        return _identity("resume-checkpoint", "lightning-checkpoint", "a Lightning checkpoint", CHECKPOINT_PROVERS)
    if lower.endswith(".safetensors"):
        layout = lora_layout(tensor_names.get(file, ()))
        if layout is not None or file in LORA_FILES:
            return _identity("diffusers-lora", "diffusers-lora",
                             f"a LoRA in {layout or 'the diffusers'} layout ({file})")
        return _identity("safetensors", "safetensors", f"a safetensors file ({file})")
    return None
