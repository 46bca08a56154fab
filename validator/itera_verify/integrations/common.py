"""What both callbacks share: JSON-safe parameter values, package-relative paths, saving the final model."""
from __future__ import annotations

import enum
import importlib.util
import math
import os
import warnings
from pathlib import Path
from typing import Any

from ..record.errors import RecordError
from ..record.facts_check import base_vocab_size
from ..record.files import prepare_target
from ..record.hub import COMMIT, loaded_commit, resolve_commit
from ..record.run import Run


def keep_the_world_group_destroyable(*, deepspeed: bool = False) -> None:
    """Import, while no process group exists, the modules that take the world group as a default argument
    (`group=group.WORLD`): torch.distributed.nn, which DDP's constructor imports through torch._dynamo, and
    DeepSpeed's torch backend, which transformers' Trainer imports when DeepSpeed is installed. Imported after
    init_process_group, they hold the group past destroy_process_group, so gloo's worker threads outlive it and
    race the interpreter's exit, which aborts a rank now and then ('terminate called without an active
    exception'). Imported first, the default they hold is None. Called as a callback's module is imported,
    which a training script does before its Trainer starts the group."""
    import torch.distributed as dist

    if not dist.is_available() or dist.is_initialized():
        return
    import torch.distributed.nn  # noqa: F401

    if deepspeed and importlib.util.find_spec("deepspeed") is not None:
        try:
            import deepspeed.comm.torch  # noqa: F401
        except (ImportError, OSError, RuntimeError):  # a broken DeepSpeed: the Trainer says so if it needs it
            pass


def json_value(value: Any) -> Any:
    """A parameter as JSON, or None when it has no faithful JSON form (it is then left out)."""
    if isinstance(value, enum.Enum):
        value = value.value
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (list, tuple)) and all(isinstance(v, (bool, int, float, str)) for v in value):
        return list(value)
    return None


def model_params(model) -> dict:
    """What the model says about itself: its class, the hub id it was loaded from (never a local path: a /tmp
    path in params is IV201) and, for a PEFT model, the adapter's configuration."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    params = {"model_class": type(base).__name__}
    name = getattr(getattr(base, "config", None), "name_or_path", None)
    if isinstance(name, str) and name and not os.path.isabs(name) and not os.path.exists(name):
        params["model_name_or_path"] = name
    if hasattr(model, "peft_config"):
        adapters = {}
        for adapter, config in model.peft_config.items():
            fields = {}
            for key, value in config.to_dict().items():
                value = sorted(value) if isinstance(value, (set, frozenset)) else value
                if json_value(value) is not None:
                    fields[key] = json_value(value)
            adapters[adapter] = fields
        params["peft"] = adapters
    return params


# The precision a model's own weights train in when no autocast runs (a model loaded in bf16 trains in bf16).
WEIGHT_PRECISION = {"torch.bfloat16": "bf16", "torch.float16": "fp16", "torch.float32": "fp32"}


def weights_precision(model) -> str | None:
    """fp32, bf16 or fp16: the float format of the model's first floating parameter (a PEFT model's base)."""
    for parameter in getattr(model, "parameters", lambda: ())():
        if parameter.is_floating_point():
            return WEIGHT_PRECISION.get(str(parameter.dtype))
    return None


def vocab_params(model, hf_cache=None) -> dict:
    """The model's token ids as it trains (`vocab_size`: its input embeddings' rows, after any resize) and, for a
    PEFT model, its base's (`base_vocab_size`, from the base's config.json in the hub cache): what IV516 compares
    a delivered adapter's tokenizer and saved embeddings with."""
    params = {}
    embeddings = model.get_input_embeddings() if callable(getattr(model, "get_input_embeddings", None)) else None
    rows = getattr(embeddings, "num_embeddings", None)
    if isinstance(rows, int):
        params["vocab_size"] = rows
    if hasattr(model, "peft_config"):
        config = next(iter(model.peft_config.values()))
        base = base_vocab_size(config.base_model_name_or_path, getattr(config, "revision", None), hf_cache)
        if base is not None:
            params["base_vocab_size"] = base
    return params


def package_relative(run: Run, path: str | os.PathLike) -> str | None:
    """`path` relative to the package root when it lies inside it (an absolute /tmp/... output_dir in the
    params would be IV201), else None."""
    try:
        return Path(os.path.realpath(path)).relative_to(os.path.realpath(run.root)).as_posix()
    except ValueError:
        return None


def numeric_logs(logs: dict) -> dict[str, float]:
    return {k: v for k, v in (logs or {}).items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def save_final_model(run: Run, model, rel_path: str, hf_cache=None, processing_class=None) -> str:
    """Save `model` into the package at `rel_path` as safetensors and register it: a PeftModel as an adapter
    pinned to its base's commit, any other model as what its saved files are (format/artifact_kinds.py).
    `processing_class` (the Trainer's tokenizer or processor) is saved beside it, as in every checkpoint: without
    it a reviewer cannot turn the frozen eval inputs into ids (IV513)."""
    target = prepare_target(run.root, rel_path, is_folder=True)
    if processing_class is not None and callable(getattr(processing_class, "save_pretrained", None)):
        processing_class.save_pretrained(target)
    if hasattr(model, "peft_config"):
        config = next(iter(model.peft_config.values()))
        # PEFT's "auto" would look the base config up on the hub (and, offline, assume nothing was resized):
        # the base's vocabulary comes from the hub cache, and resized embeddings are saved with the adapter (IV516).
        rows = vocab_params(model, hf_cache)
        resized = "base_vocab_size" in rows and rows.get("vocab_size") != rows["base_vocab_size"]
        # Embeddings trained as a modules_to_save entry are saved with the adapter already; asking PEFT for them
        # again writes two more copies under names that match nothing when the adapter is loaded.
        trained = hasattr(model.get_input_embeddings(), "modules_to_save")
        if resized and not trained:
            warnings.warn(f"{rel_path}: the embeddings were resized ({rows['base_vocab_size']} -> "
                          f"{rows['vocab_size']} token ids): saving them with the adapter", stacklevel=2)
        model.save_pretrained(target, safe_serialization=True, save_embedding_layers=resized and not trained)
        return run.adapter(target, base=config.base_model_name_or_path, model=model,
                           revision=getattr(config, "revision", None), cache_dir=hf_cache)
    model.save_pretrained(target, safe_serialization=True)
    return run.artifact(target)  # what the folder is (a transformers, timm or sentence-transformers model)


def pin_peft_revision(model, hf_cache=None) -> None:
    """Pin the PEFT config's base revision to a 40-hex commit before anything is saved, so that every
    adapter_config.json of the run (its checkpoints' included) names the pinned base, not `revision: null` or
    a branch. The commit is the one transformers recorded at load (4.x), else the cache's commit for the
    revision the config names (default `main`): give `get_peft_model(..., revision=...)` the revision you
    loaded the base at when it is not the default branch."""
    for config in model.peft_config.values():
        revision = getattr(config, "revision", None)
        if isinstance(revision, str) and COMMIT.fullmatch(revision):
            continue
        try:
            commit = loaded_commit(model) or resolve_commit(config.base_model_name_or_path, revision, hf_cache)
        except RecordError as exc:
            warnings.warn(f"the adapter's base is not pinned: {exc}", stacklevel=2)
            continue
        config.revision = commit
