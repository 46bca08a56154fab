"""The reload.json loaders, in one table: what each one reloads and how the tool treats it.

Read by the reload registry (reload/loaders/__init__.py: the module each loader lives in), the light zygote
(reload/runner.py: loaders whose children need no modelling library), IV510 and its text (rules/artifacts.py:
which loaders fit an artifact kind, and whether they take a folder or one file), the recorder (record/artifacts.py:
the artifact kinds and the default loader of each) and the schema's loader enum (schemas/reload.schema.json,
tested equal to this table). A new loader is one row here and its module under reload/loaders/.
"""
from __future__ import annotations

from dataclasses import dataclass

FOLDER, FILE, EITHER = "folder", "file", "either"

# reload.json's `dtype` of an entry (besides "auto", the stored one): its names and the torch dtype each means.
# schemas/reload.schema.json's dtype enum is these and "auto" (tests/test_docs_match_code.py holds them equal).
DTYPES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
          "float16": "float16", "fp16": "float16"}

# The artifact kinds of manifest.artifacts[].kind, in the order the docs list them.
KINDS = ("safetensors", "transformers-model", "peft-adapter", "resume-checkpoint", "diffusers-pipeline",
         "diffusers-lora", "timm-model", "sentence-transformers-model", "gguf", "onnx")


@dataclass(frozen=True)
class Loader:
    name: str  # reload.json's `loader`
    module: str  # its module under itera_verify/reload/loaders/
    kinds: tuple[str, ...]  # the artifact kinds it reloads
    shape: str  # FOLDER, FILE or EITHER: what its path must be
    file_form: str = ""  # for FILE loaders: what the file is, in words (IV510's message)
    file_suffix: str = ""  # for FILE loaders: the suffix the recorder recognises a resume file by
    light: bool = False  # its child imports no modelling library (transformers, peft): the light zygote serves it
    default_for: tuple[str, ...] = ()  # the kinds the recorder registers with this loader unless told otherwise
    what: str = ""  # what its path is, in words, where a kind has several loaders (IV510's explanation)
    libraries: tuple[str, ...] = ()  # what its child imports beyond the tool's own dependencies (reload/common.require)
    extra: str = ""  # the pip extra that installs them: `pip install 'itera-verify[EXTRA]'`
    loads_pinned_base: bool = False  # its child loads the manifest's pinned base beside the artifact (memory limit)


TABLE = (
    Loader("safetensors", "safetensors", ("safetensors",), EITHER, light=True, default_for=("safetensors",)),
    Loader("transformers", "transformers", ("transformers-model",), FOLDER, default_for=("transformers-model",)),
    Loader("peft", "peft", ("peft-adapter",), FOLDER, default_for=("peft-adapter",)),
    Loader("hf-trainer-checkpoint", "trainer_checkpoint", ("resume-checkpoint",), FOLDER,
           what="a checkpoint-N folder"),
    Loader("torch-resume", "torch_resume", ("resume-checkpoint",), FILE, "one .pt file", ".pt", light=True,
           what="one .pt file"),
    Loader("deepspeed-checkpoint", "deepspeed", ("resume-checkpoint",), FOLDER, what="latest + global_step<N>/"),
    Loader("dcp", "dcp", ("resume-checkpoint",), FOLDER, what="a torch.distributed.checkpoint folder"),
    Loader("accelerate-state", "accelerate_state", ("resume-checkpoint",), FOLDER,
           what="an Accelerator.save_state folder"),
    Loader("lightning-checkpoint", "lightning", ("resume-checkpoint",), FILE, "one .ckpt file", ".ckpt",
           what="one .ckpt file"),
    # docs/format.md, loaders "Loaders beyond Hugging Face text models": each library is an optional extra of the tool.
    Loader("diffusers", "diffusers", ("diffusers-pipeline",), FOLDER, default_for=("diffusers-pipeline",),
           libraries=("diffusers",), extra="diffusers"),
    # peft, which load_lora_weights needs, is one of the tool's own dependencies.
    Loader("diffusers-lora", "diffusers_lora", ("diffusers-lora",), EITHER, default_for=("diffusers-lora",),
           what="a LoRA file or its folder, on the manifest's base pipeline", libraries=("diffusers",),
           extra="diffusers", loads_pinned_base=True),
    Loader("timm", "timm", ("timm-model",), FOLDER, light=True, default_for=("timm-model",), libraries=("timm",),
           extra="timm"),
    Loader("sentence-transformers", "sentence_transformers", ("sentence-transformers-model",), FOLDER,
           default_for=("sentence-transformers-model",), libraries=("sentence_transformers",),
           extra="sentence-transformers"),
    Loader("gguf", "gguf", ("gguf",), FILE, "one .gguf file", light=True, default_for=("gguf",),
           libraries=("gguf",), extra="gguf"),
    Loader("onnx", "onnx", ("onnx",), EITHER, light=True, default_for=("onnx",),
           libraries=("onnx", "onnxruntime"), extra="onnx"),
)
LOADERS: dict[str, Loader] = {row.name: row for row in TABLE}
# A model's config.json `quantization_config.quant_method` -> (the library transformers needs to load it, the
# extra that installs it): the `transformers` loader requires it before loading (a missing one is IV505).
QUANTIZATION_LIBRARIES = {"bitsandbytes": ("bitsandbytes", "bitsandbytes")}
NAMES = tuple(LOADERS)


def fitting(kind: str) -> frozenset[str] | None:
    """The loaders that reload an artifact of `kind`; None for a kind the table does not know (IV1xx says so)."""
    if kind not in KINDS:
        return None
    return frozenset(row.name for row in TABLE if kind in row.kinds)


def recorder_default(kind: str) -> str | None:
    return next((row.name for row in TABLE if kind in row.default_for), None)


def file_loader_for(suffix: str) -> str | None:
    """The resume loader of a single file with this suffix (`.pt`: torch-resume, `.ckpt`: lightning)."""
    return next((row.name for row in TABLE if row.shape == FILE and row.file_suffix == suffix), None)


def light(names) -> bool:
    """No loader among `names` needs a modelling library (an empty run too: nothing to import them for)."""
    return all(name in LOADERS and LOADERS[name].light for name in names)


def fitting_in_words() -> str:
    """Each kind and the loaders that fit it, as IV510's explanation lists them."""
    parts = []
    for kind in KINDS:
        rows = [row for row in TABLE if kind in row.kinds]
        named = [f"`{row.name}`" + (f" ({row.what})" if row.what else "") for row in rows]
        parts.append(f"{kind} → " + (", ".join(named[:-1]) + f" or {named[-1]}" if len(named) > 1 else named[0]))
    return ", ".join(parts)
