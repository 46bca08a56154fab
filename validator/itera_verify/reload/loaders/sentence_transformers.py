"""Loader `sentence-transformers`: a `SentenceTransformer.save` folder (`modules.json` + one folder per module).

Proves: every module modules.json lists is one of sentence-transformers' own classes (a module type names code
to import: anything else would be custom code) and its folder is there; each Transformer module's model loads as
the `transformers` loader loads one (no missing or unexpected key, finite); the whole model loads with local files
only and no remote code, every weight finite (Dense, …); the tokenizer is there and holds more than its special
tokens (without its files sentence-transformers silently builds one of five); `encode` of a fixed text gives
finite embeddings.
"""
from __future__ import annotations

import gc
from pathlib import Path

from ..common import (LOAD, MISSING, Outcome, Stop, check_parameters, nonfinite_count, read_json_document, require,
                      scan_folder, short)
from .transformers import load_model

MODULES = "modules.json"
OWN_CODE = "sentence_transformers."
TEXT = "The reviewer reloads what was delivered."
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "spiece.model", "sentencepiece.bpe.model",
                   "tokenizer.model")


def read_modules(folder: Path, outcome: Outcome) -> list[dict]:
    path = folder / MODULES
    modules = read_json_document(path, outcome, MISSING, ": not a SentenceTransformer.save folder")
    if not isinstance(modules, list) or not modules or not all(isinstance(m, dict) for m in modules):
        raise Stop(LOAD, f"{outcome.rel(path)} lists no module", path)
    for module in modules:
        kind, sub = str(module.get("type")), str(module.get("path", ""))
        if not kind.startswith(OWN_CODE):
            outcome.fail(LOAD, f"module {module.get('name')!r} is of type {kind!r}, not a sentence-transformers "
                               "class: custom code is never imported", path)
        elif ".." in Path(sub).parts or Path(sub).is_absolute() or not (folder / sub).is_dir():
            outcome.fail(MISSING, f"module {module.get('name')!r} ({kind.rsplit('.', 1)[-1]}): its folder "
                                  f"{sub!r} is missing", folder / sub)
    if outcome.problems:
        raise Stop.recorded()
    return modules


def check_transformer_modules(folder: Path, modules: list[dict], device, outcome: Outcome) -> None:
    """The Transformer modules' models, loaded and checked as the `transformers` loader does: sentence-transformers
    itself only warns about a missing key (a weight left random) and would pass."""
    for module in modules:
        if str(module.get("type")).rsplit(".", 1)[-1] != "Transformer":
            continue
        sub = folder / str(module.get("path", ""))
        model = load_model(sub, {**outcome.job, "class": None}, device, outcome)
        del model
        gc.collect()


def check_tokenizer(folder: Path, modules: list[dict], model, outcome: Outcome) -> None:
    for module in modules:
        if str(module.get("type")).rsplit(".", 1)[-1] != "Transformer":
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
    modules = read_modules(folder, outcome)
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
            embeddings = model.encode([TEXT], convert_to_tensor=True, show_progress_bar=False)
    except Exception as exc:  # noqa: BLE001 - any failure of encode is a model that does not run
        raise Stop(LOAD, f"encode failed: {short(exc)}") from exc
    bad = nonfinite_count(embeddings)
    if bad:
        raise Stop(LOAD, f"encode gave {bad} non-finite value(s) out of {embeddings.numel()}")
    outcome.forward = f"finite embeddings {tuple(embeddings.shape)} (encode of a fixed text)"
