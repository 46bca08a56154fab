"""Loader `diffusers`: a pipeline folder as `save_pretrained` writes it (`model_index.json` + one folder per
component).

Proves: the pipeline class is diffusers' own and every component class is one a pipeline is made of (COMPONENTS:
models, schedulers, tokenizers, feature extractors, processors of diffusers or transformers; never a pipeline, whose
folder diffusers would load with its own loader, past every check here; anything else is custom code, never
imported); model_index.json's other entries are the settings SETTINGS admits; every component model_index.json
names is present and loads from its folder with local files only, its config.json's steering keys admitted
(quantization, kernels, code), no missing, unexpected or resized key, every weight finite; the pipeline is built
from exactly these components (its own constructor: diffusers' from_pretrained would read the folder again) and
every torch module in it proven finite; one denoising step gives finite output.
"""
from __future__ import annotations

import importlib
import inspect
from pathlib import Path

from ..common import (LOAD, MISSING, Outcome, Stop, check_parameters, nonfinite_count, read_json_document, require,
                      scan_folder, short)
from ._admit import BOOLEAN, TEXT, Section, admit, one_of, refuse, stop_if_refused
from ._hf_config import admit_config, refuse_adapter
from .transformers import check_loading_info

MODEL_INDEX = "model_index.json"
PROMPT = "a photograph of a red bicycle"
STEPS = 1

# ----------------------------------------------------------------------------- what this loader admits
# What a pipeline is made of: a component's class must derive from one of these (library, base class). A pipeline
# class (DiffusionPipeline, ModularPipeline, the auto pipelines) derives from none of them.
COMPONENTS = (("diffusers", "ModelMixin"), ("diffusers", "SchedulerMixin"), ("transformers", "PreTrainedModel"),
              ("transformers", "PreTrainedTokenizerBase"), ("transformers", "ImageProcessingMixin"),
              ("transformers", "FeatureExtractionMixin"), ("transformers", "ProcessorMixin"))
MODELS = (("diffusers", "ModelMixin"), ("transformers", "PreTrainedModel"))
NEVER = (("diffusers", "DiffusionPipeline"), ("diffusers", "ModularPipeline"))  # named in the refusal
LIBRARIES = tuple(dict.fromkeys(library for library, _ in COMPONENTS))
# model_index.json's entries that are not components: the pipeline constructor's settings, and facts.
SETTINGS: Section = {"_class_name": TEXT, "_diffusers_version": TEXT, "_name_or_path": TEXT,
                     "requires_safety_checker": BOOLEAN, "force_zeros_for_empty_prompt": BOOLEAN}
# A diffusers model component's config.json keys that choose something other than its shape.
MODEL_STEERING: Section = {"quantization_config": one_of(None)}


def read_index(folder: Path, outcome: Outcome) -> tuple[str, dict[str, tuple[str, str] | None], dict]:
    """The pipeline class, its components (name -> (library, class), None for an optional one left out) and its
    admitted settings."""
    path = folder / MODEL_INDEX
    index = read_json_document(path, outcome, MISSING, ": not a diffusers pipeline folder")
    if not isinstance(index, dict) or "_class_name" not in index:
        raise Stop(LOAD, f"{outcome.rel(path)} names no pipeline class (_class_name)", path)
    components: dict[str, tuple[str, str] | None] = {}
    settings = {}
    for name, value in index.items():
        if not (isinstance(value, list) and len(value) == 2) or name.startswith("_"):
            if admit({name: value}, SETTINGS, path, outcome) == 0:
                settings[name] = value
        elif value[0] is None and value[1] is None:
            components[name] = None
        elif value[0] not in LIBRARIES or not isinstance(value[1], str):
            outcome.fail(LOAD, f"component {name} comes from {value[0]!r}: custom code is never imported "
                               f"(only {' and '.join(LIBRARIES)} classes)", path)
        elif ".." in Path(name).parts or not (folder / name).is_dir():
            outcome.fail(MISSING, f"component {name} ({value[1]}) named by {MODEL_INDEX} is missing: no folder "
                                  f"{outcome.rel(folder / name)}", folder / name)
        else:
            components[name] = (value[0], value[1])
    stop_if_refused(outcome)
    return index["_class_name"], components, settings


def own_class(library, module_name: str, name: str, what: str):
    cls = getattr(library, name, None) if name.isidentifier() else None
    if cls is None or not inspect.isclass(cls):
        raise Stop(LOAD, f"{what}: {module_name} has no class {name!r} (custom code is never imported)")
    return cls


def _derives(cls, bases) -> bool:
    return any(issubclass(cls, getattr(importlib.import_module(library), base)) for library, base in bases)


def component_class(folder: Path, name: str, library_name: str, class_name: str, outcome: Outcome):
    """The class model_index.json names for a component: the library's own, of a kind COMPONENTS admits."""
    cls = own_class(importlib.import_module(library_name), library_name, class_name, f"component {name}")
    if not _derives(cls, COMPONENTS) or _derives(cls, NEVER):
        refuse(outcome, folder / MODEL_INDEX, name, [library_name, class_name],
               "a component is a model, scheduler, tokenizer, feature extractor or processor class, never a "
               "pipeline; admitted bases: " + ", ".join(f"{lib}.{base}" for lib, base in COMPONENTS))
        raise Stop.recorded()
    return cls


def admit_component_config(sub: Path, cls, outcome: Outcome) -> None:
    """A model component's config.json, before its from_pretrained reads it: a transformers model's steering keys
    as the `transformers` loader admits them (and no adapter beside it); a diffusers model's, MODEL_STEERING."""
    path = sub / "config.json"
    if not path.is_file():
        return
    config = read_json_document(path, outcome)
    if _derives(cls, (("transformers", "PreTrainedModel"),)):
        if not isinstance(config, dict):
            raise Stop(LOAD, f"{outcome.rel(path)} is not a JSON object", path)
        admit_config(config, path, outcome)
        refuse_adapter(sub, outcome)
    elif isinstance(config, dict):
        for key, rule in MODEL_STEERING.items():
            if key in config and not rule(config[key]):
                refuse(outcome, path, key, config[key], f"expected {rule.what}")
    stop_if_refused(outcome)


def load_component(folder: Path, name: str, library_name: str, class_name: str, outcome: Outcome):
    cls = component_class(folder, name, library_name, class_name, outcome)
    sub = folder / name
    is_model = _derives(cls, MODELS)
    if is_model:
        admit_component_config(sub, cls, outcome)
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


def assemble(pipeline_cls, loaded: dict, settings: dict, folder: Path, outcome: Outcome):
    """The pipeline built by its own constructor from the checked components and admitted settings: nothing of
    the folder is read again."""
    parameters = inspect.signature(pipeline_cls.__init__).parameters
    unused = sorted(set(loaded) - set(parameters))
    if unused:
        raise Stop(LOAD, f"{outcome.rel(folder / MODEL_INDEX)} names component(s) {', '.join(unused)} that "
                         f"{pipeline_cls.__name__} does not take", folder / MODEL_INDEX)
    arguments = {name: value for name, value in {**settings, **loaded}.items() if name in parameters}
    needed = [name for name, parameter in parameters.items() if name != "self" and name not in arguments
              and parameter.default is inspect.Parameter.empty
              and parameter.kind not in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD)]
    if needed:
        raise Stop(MISSING, f"{pipeline_cls.__name__} needs component(s) {', '.join(needed)}, which "
                            f"{MODEL_INDEX} does not name", folder / MODEL_INDEX)
    try:
        return pipeline_cls(**arguments)
    except Exception as exc:  # noqa: BLE001 - a constructor refusing its parts: the index does not fit the class
        raise Stop(LOAD, f"{pipeline_cls.__name__} does not assemble from its components: {short(exc)}",
                   folder) from exc


def check_modules(pipeline, checked: set[int], outcome: Outcome) -> None:
    """Every torch module of the assembled pipeline, not only those loaded here as models, proven finite."""
    import torch

    for name, component in (getattr(pipeline, "components", None) or {}).items():
        if isinstance(component, torch.nn.Module) and id(component) not in checked:
            check_parameters(component, outcome, f"component {name}")


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
    pipeline_name, components, settings = read_index(folder, outcome)
    pipeline_cls = own_class(diffusers, "diffusers", pipeline_name, "model_index.json _class_name")
    if not issubclass(pipeline_cls, diffusers.DiffusionPipeline) or pipeline_cls is diffusers.DiffusionPipeline:
        raise Stop(LOAD, f"{pipeline_name} is not a diffusers pipeline class")
    scan_folder(folder, outcome)
    loaded = {name: None if spec is None else load_component(folder, name, *spec, outcome)
              for name, spec in components.items()}
    outcome.facts["pipeline"] = pipeline_name
    outcome.facts["components"] = sorted(name for name, value in loaded.items() if value is not None)
    pipeline = assemble(pipeline_cls, loaded, settings, folder, outcome)
    check_modules(pipeline, {id(value) for value in loaded.values() if value is not None}, outcome)
    pipeline.to(device)
    pipeline.set_progress_bar_config(disable=True)
    return pipeline


def reload(job: dict, device, outcome: Outcome) -> None:
    pipeline = load_pipeline(Path(job["path"]), device, outcome)
    outcome.forward = denoise(pipeline, device)
