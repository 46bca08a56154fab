"""Loader `sentence-transformers`: a `SentenceTransformer.save` folder (`modules.json` + one folder per module).

Proves: every module modules.json lists is one of the sentence-transformers classes ADMITTED names (a module type
names code to import: anything else would be custom code) and its folder is there; every configuration file the
library would read for those modules holds only the keys and values ADMITTED lists (sentence-transformers merges
them into the keyword arguments of from_pretrained, of the tokenizer and of the modules' constructors); each
Transformer module's model loads as the `transformers` loader loads one (its config.json's steering keys admitted,
no missing or unexpected key, finite); the whole model loads with local files only and no remote code, every weight
finite (Dense, …); the tokenizer is there and holds more than its special tokens (without its files
sentence-transformers silently builds one of five); `encode` of a fixed text gives finite embeddings.
"""
from __future__ import annotations

import gc
from pathlib import Path

from ..common import (LOAD, MISSING, Outcome, Stop, check_parameters, nonfinite_count, read_json_document, require,
                      scan_folder, short)
from ._admit import (ANY, BOOLEAN, NUMBER, TEXT, WHOLE, Admit, Section, admit, mapping_of, one_of, optional, refuse,
                     stop_if_refused)
from ._hf_config import ATTENTION
from .transformers import load_model

MODULES = "modules.json"
MODEL_CONFIG = "config_sentence_transformers.json"
TEXT_TO_ENCODE = "The reviewer reloads what was delivered."
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "spiece.model", "sentencepiece.bpe.model",
                   "tokenizer.model")
# The Transformer module's own file, under each name sentence-transformers has read it by (the first it finds wins).
TRANSFORMER_FILES = ("sentence_bert_config.json", "sentence_roberta_config.json", "sentence_distilbert_config.json",
                     "sentence_camembert_config.json", "sentence_albert_config.json",
                     "sentence_xlm-roberta_config.json", "sentence_xlnet_config.json")

# ----------------------------------------------------------------------------- what this loader admits
# Everything the artifact's files may say to sentence-transformers. Each key reaches a library call: the Transformer
# module's file is its constructor's keyword arguments, and its model_args/tokenizer_args/config_args (new names
# model_kwargs/processor_kwargs/config_kwargs) are merged into from_pretrained's. Only the model's own shape,
# precision and text handling are admitted: never a placement (device_map, max_memory, offload_folder), a file
# (gguf_file, tokenizer_file, a tokenizer path), a weights choice (use_safetensors, weights_only, variant), a
# quantization or a revision.
DTYPE = one_of("auto", "float32", "float16", "bfloat16")
EMBEDDING = one_of("sentence_embedding", "token_embeddings")
POOLING_MODE = one_of("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")
# Dense's activation is a class path sentence-transformers imports: the activations of torch.nn only.
ACTIVATIONS = one_of(*(f"torch.nn.modules.activation.{name}" for name in ("Tanh", "ReLU", "GELU", "Sigmoid", "SiLU")),
                     "torch.nn.modules.linear.Identity")
MODEL_ARGS: Section = {"torch_dtype": DTYPE, "dtype": DTYPE, "attn_implementation": ATTENTION}
TOKENIZER_ARGS: Section = {"model_max_length": WHOLE, "do_lower_case": BOOLEAN}
TRANSFORMER: Section = {
    "max_seq_length": optional(WHOLE), "do_lower_case": BOOLEAN,
    "transformer_task": one_of("feature-extraction"),
    # The method of the model sentence-transformers calls on the text, and the output it reads.
    "modality_config": {"text": {"method": one_of("forward"), "method_output_name": optional(one_of(
        "last_hidden_state"))}},
    "module_output_name": one_of("token_embeddings"),
    "unpad_inputs": optional(BOOLEAN), "query_length": optional(WHOLE), "document_length": optional(WHOLE),
    "query_expansion": one_of(None), "processing_kwargs": one_of({}),
    "model_args": MODEL_ARGS, "model_kwargs": MODEL_ARGS, "tokenizer_args": TOKENIZER_ARGS,
    "processor_kwargs": TOKENIZER_ARGS, "config_args": {}, "config_kwargs": {},
}
POOLING: Section = {
    "embedding_dimension": WHOLE, "word_embedding_dimension": WHOLE,
    "pooling_mode": Admit(lambda v: POOLING_MODE(v) or (isinstance(v, list) and 0 < len(v) <= 6
                                                        and all(POOLING_MODE(m) for m in v)), POOLING_MODE.what),
    "include_prompt": BOOLEAN,
    **{f"pooling_mode_{legacy}": BOOLEAN for legacy in ("cls_token", "max_tokens", "mean_tokens",
                                                        "mean_sqrt_len_tokens", "weightedmean_tokens", "lasttoken")},
}
DENSE: Section = {"in_features": WHOLE, "out_features": WHOLE, "bias": BOOLEAN, "activation_function": ACTIVATIONS,
                  "module_input_name": EMBEDDING, "module_output_name": optional(EMBEDDING), "use_residual": BOOLEAN}
NORMALIZE: Section = {"module_input_name": EMBEDDING, "module_output_name": optional(EMBEDDING)}
# Module class (modules.json `type`, its last part) -> (the files its load reads, what they may hold).
ADMITTED: dict[str, tuple[tuple[str, ...], Section]] = {
    "Transformer": (TRANSFORMER_FILES, TRANSFORMER),
    "Pooling": (("config.json",), POOLING),
    "Dense": (("config.json",), DENSE),
    "Normalize": (("config.json",), NORMALIZE),
    "Dropout": (("config.json",), {"dropout": NUMBER}),
    "LayerNorm": (("config.json",), {"dimension": WHOLE}),
}
# modules.json's entries; `kwargs` would route encode()'s arguments to a module: none is.
MODULE_ENTRY: Section = {"idx": WHOLE, "name": TEXT, "path": TEXT, "type": TEXT, "kwargs": one_of([])}
# config_sentence_transformers.json: prompts, similarity and version facts; `requirements` is only compared with
# the installed versions.
MODEL_SETTINGS: Section = {
    "__version__": mapping_of(TEXT, TEXT), "model_type": one_of("SentenceTransformer"),
    "prompts": mapping_of(TEXT, TEXT), "default_prompt_name": optional(TEXT),
    "similarity_fn_name": optional(one_of("cosine", "dot", "euclidean", "manhattan")),
    "truncate_dim": optional(WHOLE), "requirements": mapping_of(TEXT, ANY),
}


def module_types() -> dict[str, str]:
    """Every spelling of an admitted module class in modules.json (`sentence_transformers.models.Pooling`, the
    class's own module path) -> its name in ADMITTED."""
    from sentence_transformers import models

    spellings = {}
    for name in ADMITTED:
        cls = getattr(models, name)
        for spelling in (f"sentence_transformers.models.{name}", f"{cls.__module__}.{cls.__qualname__}"):
            spellings[spelling] = name
    return spellings


def admit_module_files(folder: Path, modules: list[dict], outcome: Outcome) -> None:
    """Each file sentence-transformers reads for these modules holds only what ADMITTED lists; else IV504."""
    documents = [(folder / MODEL_CONFIG, MODEL_SETTINGS)]
    for module in modules:
        files, section = ADMITTED[module["kind"]]
        documents += [(folder / str(module.get("path", "")) / name, section) for name in files]
    for path, section in documents:
        if path.is_file():
            admit(read_json_document(path, outcome), section, path, outcome)
    stop_if_refused(outcome)


def read_modules(folder: Path, outcome: Outcome, spellings: dict[str, str]) -> list[dict]:
    """modules.json's entries, each of an admitted class (recorded as `kind`) with its folder present."""
    path = folder / MODULES
    modules = read_json_document(path, outcome, MISSING, ": not a SentenceTransformer.save folder")
    if not isinstance(modules, list) or not modules or not all(isinstance(m, dict) for m in modules):
        raise Stop(LOAD, f"{outcome.rel(path)} lists no module", path)
    for index, module in enumerate(modules):
        kind, sub = str(module.get("type")), str(module.get("path", ""))
        if not kind.startswith("sentence_transformers."):
            outcome.fail(LOAD, f"module {module.get('name')!r} is of type {kind!r}, not a sentence-transformers "
                               "class: custom code is never imported", path)
        elif kind not in spellings:
            refuse(outcome, path, f"{index}.type", kind, f"admitted module classes: {', '.join(ADMITTED)}")
        elif admit(module, MODULE_ENTRY, path, outcome, prefix=f"{index}."):
            continue
        elif ".." in Path(sub).parts or Path(sub).is_absolute() or not (folder / sub).is_dir():
            outcome.fail(MISSING, f"module {module.get('name')!r} ({kind.rsplit('.', 1)[-1]}): its folder "
                                  f"{sub!r} is missing", folder / sub)
        else:
            module["kind"] = spellings[kind]
    stop_if_refused(outcome)
    return modules


def check_transformer_modules(folder: Path, modules: list[dict], device, outcome: Outcome) -> None:
    """The Transformer modules' models, loaded and checked as the `transformers` loader does: sentence-transformers
    itself only warns about a missing key (a weight left random) and would pass."""
    for module in modules:
        if module["kind"] != "Transformer":
            continue
        sub = folder / str(module.get("path", ""))
        model = load_model(sub, {**outcome.job, "class": None}, device, outcome)
        del model
        gc.collect()


def check_tokenizer(folder: Path, modules: list[dict], model, outcome: Outcome) -> None:
    for module in modules:
        if module["kind"] != "Transformer":
            continue
        sub = folder / str(module.get("path", ""))
        if not any((sub / name).is_file() for name in TOKENIZER_FILES):
            outcome.fail(MISSING, f"module {module.get('name')!r}: no tokenizer file in {outcome.rel(sub)} "
                                  f"({', '.join(TOKENIZER_FILES[:3])}, …)", sub)
    tokenizer = getattr(model, "tokenizer", None)
    if tokenizer is None:
        outcome.fail(MISSING, "the model has no tokenizer")
        return
    words = len(tokenizer) - len(set(getattr(tokenizer, "all_special_ids", []) or []))
    outcome.facts["tokenizer"] = f"{type(tokenizer).__name__}, {len(tokenizer)} tokens"
    if words <= 0:
        outcome.fail(LOAD, f"the tokenizer is empty: {len(tokenizer)} token(s), all special")


def reload(job: dict, device, outcome: Outcome) -> None:
    folder = Path(job["path"])
    sentence_transformers = require(job)
    modules = read_modules(folder, outcome, module_types())
    admit_module_files(folder, modules, outcome)
    scan_folder(folder, outcome)
    check_transformer_modules(folder, modules, device, outcome)
    try:
        model = sentence_transformers.SentenceTransformer(str(folder), device=str(device), local_files_only=True,
                                                          trust_remote_code=False)
    except Exception as exc:  # the library raises ValueError, OSError and others for a damaged folder
        raise Stop(LOAD, f"SentenceTransformer does not load {outcome.rel(folder)}: {short(exc)}", folder) from exc
    model.eval()
    outcome.facts["modules"] = [type(m).__name__ for m in model]
    if len(model) != len(modules):
        outcome.fail(LOAD, f"{MODULES} lists {len(modules)} modules, {len(model)} loaded")
    check_tokenizer(folder, modules, model, outcome)
    check_parameters(model, outcome, "model")
    if outcome.problems:
        raise Stop.recorded()
    import torch

    try:
        with torch.no_grad():
            embeddings = model.encode([TEXT_TO_ENCODE], convert_to_tensor=True, show_progress_bar=False)
    except Exception as exc:  # noqa: BLE001 - any failure of encode is a model that does not run
        raise Stop(LOAD, f"encode failed: {short(exc)}") from exc
    bad = nonfinite_count(embeddings)
    if bad:
        raise Stop(LOAD, f"encode gave {bad} non-finite value(s) out of {embeddings.numel()}")
    outcome.forward = f"finite embeddings {tuple(embeddings.shape)} (encode of a fixed text)"
