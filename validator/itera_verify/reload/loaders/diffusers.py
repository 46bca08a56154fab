"""Loader `diffusers`: a pipeline folder as `save_pretrained` writes it (`model_index.json` + one folder per
component).

Proves: the pipeline class and every component class are diffusers' or transformers' own (anything else is custom
code, never imported); every component model_index.json names is present and loads from its folder with local
files only, no missing, unexpected or resized key, every weight finite; the pipeline assembled from exactly these
components runs one denoising step with finite output.
"""
from __future__ import annotations

import inspect
from pathlib import Path

from ..common import (LOAD, MISSING, Outcome, Stop, check_parameters, nonfinite_count, read_json_document, require,
                      scan_folder, short)
from .transformers import check_loading_info

MODEL_INDEX = "model_index.json"
LIBRARIES = ("diffusers", "transformers")
PROMPT = "a photograph of a red bicycle"
STEPS = 1


def read_index(folder: Path, outcome: Outcome) -> tuple[str, dict[str, tuple[str, str] | None]]:
    """The pipeline class and its components: name -> (library, class), None for an optional one left out."""
    path = folder / MODEL_INDEX
    index = read_json_document(path, outcome, MISSING, ": not a diffusers pipeline folder")
    if not isinstance(index, dict) or not isinstance(index.get("_class_name"), str):
        raise Stop(LOAD, f"{outcome.rel(path)} names no pipeline class (_class_name)", path)
    components: dict[str, tuple[str, str] | None] = {}
    for name, value in index.items():
        if name.startswith("_") or not isinstance(value, list) or len(value) != 2:
            continue  # configuration values (requires_safety_checker, ...)
        if value[0] is None and value[1] is None:
            components[name] = None
        elif value[0] not in LIBRARIES or not isinstance(value[1], str):
            outcome.fail(LOAD, f"component {name} comes from {value[0]!r}: custom code is never imported "
                               f"(only {' and '.join(LIBRARIES)} classes)", path)
        elif ".." in Path(name).parts or not (folder / name).is_dir():
            outcome.fail(MISSING, f"component {name} ({value[1]}) named by {MODEL_INDEX} is missing: no folder "
                                  f"{outcome.rel(folder / name)}", folder / name)
        else:
            components[name] = (value[0], value[1])
    if outcome.problems:
        raise Stop.recorded()
    return index["_class_name"], components


def own_class(library, module_name: str, name: str, what: str):
    cls = getattr(library, name, None) if name.isidentifier() else None
    if cls is None or not inspect.isclass(cls):
        raise Stop(LOAD, f"{what}: {module_name} has no class {name!r} (custom code is never imported)")
    return cls


def load_component(folder: Path, name: str, library_name: str, class_name: str, outcome: Outcome):
    import importlib

    cls = own_class(importlib.import_module(library_name), library_name, class_name, f"component {name}")
    sub = folder / name
    is_model = hasattr(cls, "named_parameters") or any(b.__name__ in ("ModelMixin", "PreTrainedModel")
                                                         for b in cls.__mro__)
    try:
        if is_model:
            model, info = cls.from_pretrained(str(sub), local_files_only=True, output_loading_info=True)
        else:  # tokenizers, schedulers, feature extractors: configuration files only
            return cls.from_pretrained(str(sub), local_files_only=True)
    except Stop:
        raise
    except Exception as exc:  # the libraries raise OSError, ValueError, EnvironmentError for damaged folders
        raise Stop(LOAD, f"component {name} ({class_name}) does not load: {short(exc)}", sub) from exc
    check_loading_info(model, info, f"component {name} ({class_name})")
    check_parameters(model, outcome, f"component {name}")
    return model.eval()


def denoise(pipeline, device) -> str:
    """One denoising step at the smallest size the UNet takes, with finite output."""
    import torch

    call = inspect.signature(pipeline.__call__).parameters
    kwargs = {"num_inference_steps": STEPS}
    if "prompt" in call:
        kwargs["prompt"] = PROMPT
    if "output_type" in call:
        kwargs["output_type"] = "pt"
    if "generator" in call:
        kwargs["generator"] = torch.Generator(device="cpu").manual_seed(0)
    unet = getattr(pipeline, "unet", None) or getattr(pipeline, "transformer", None)
    scale = getattr(pipeline, "vae_scale_factor", None)
    blocks = getattr(getattr(unet, "config", None), "down_block_types", None)
    if "height" in call and isinstance(scale, int) and blocks:
        kwargs["height"] = kwargs["width"] = max(8, 2 ** (len(blocks) - 1)) * scale
    try:
        with torch.no_grad():
            output = pipeline(**kwargs)
    except Exception as exc:  # noqa: BLE001 - any failure of the step is a pipeline that does not run
        raise Stop(LOAD, f"one denoising step failed: {short(exc)}") from exc
    images = getattr(output, "images", None)
    if images is None and isinstance(output, (tuple, list)) and output:
        images = output[0]
    if not torch.is_tensor(images):
        images = torch.as_tensor(images) if images is not None else None
    if images is None:
        return f"ran {STEPS} denoising step, no tensor output to check"
    bad = nonfinite_count(images)
    if bad:
        raise Stop(LOAD, f"one denoising step gave {bad} non-finite value(s) out of {images.numel()}")
    return f"{STEPS} denoising step, finite output {tuple(images.shape)}"


def load_pipeline(folder: Path, device, outcome: Outcome):
    diffusers = require(outcome.job)
    pipeline_name, components = read_index(folder, outcome)
    pipeline_cls = own_class(diffusers, "diffusers", pipeline_name, "model_index.json _class_name")
    if not issubclass(pipeline_cls, diffusers.DiffusionPipeline):
        raise Stop(LOAD, f"{pipeline_name} is not a diffusers pipeline")
    scan_folder(folder, outcome)
    loaded = {name: None if spec is None else load_component(folder, name, *spec, outcome)
              for name, spec in components.items()}
    outcome.facts["pipeline"] = pipeline_name
    outcome.facts["components"] = sorted(name for name, value in loaded.items() if value is not None)
    try:
        pipeline = pipeline_cls.from_pretrained(str(folder), local_files_only=True, **loaded)
    except Exception as exc:  # noqa: BLE001 - assembling from loaded parts fails only on a wrong index
        raise Stop(LOAD, f"{pipeline_name} does not assemble from its components: {short(exc)}", folder) from exc
    pipeline.to(device)
    pipeline.set_progress_bar_config(disable=True)
    return pipeline


def reload(job: dict, device, outcome: Outcome) -> None:
    pipeline = load_pipeline(Path(job["path"]), device, outcome)
    outcome.forward = denoise(pipeline, device)
