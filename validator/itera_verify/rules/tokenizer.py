"""IV513: a delivered model without the tokenizer or processor its run's checkpoints carry.

Static, from the file names alone: the Trainer saves its `processing_class` into every checkpoint, and a model
saved with `model.save_pretrained(...)` alone leaves it out, so the reviewer holds the weights and the frozen
eval inputs but not what turns one into the ids the other takes.
"""
from __future__ import annotations

from typing import Iterator

from ..model import Finding, Rule, Severity
from ..package import RunContext
from ..runtime.hfcache import snapshot_folder
from .untrained import _text

RULES = [
    Rule("IV513", Severity.WARNING, "delivered model without its tokenizer or processor",
         explain="The Trainer saves its tokenizer or processor (`processing_class`) into every checkpoint, but "
                 "`model.save_pretrained(...)` saves weights and config only: a delivered model whose run's "
                 "checkpoints carry tokenizer or processor files and which carries none leaves the reviewer "
                 "with no way to turn the frozen eval inputs into the ids the model takes (a tokenizer with "
                 "added tokens or another padding side is not the base's). An adapter is reported only when its "
                 "base in the hub cache has no tokenizer either. Save it beside the model: "
                 "`trainer.save_model(path)` (it saves the processing_class), `tokenizer.save_pretrained(path)`, "
                 "or `RecordCallback(save_model_to=...)`, which does both.",
         bad="artifacts/control-model/: config.json, model.safetensors   "
             "checkpoints/control/checkpoint-60/: ..., tokenizer.json, tokenizer_config.json",
         good="artifacts/control-model/: config.json, model.safetensors, tokenizer.json, tokenizer_config.json"),
]

# What tokenizers, feature extractors and processors save (save_pretrained): any one of them is enough.
TOKENIZER_FILES = frozenset({
    "tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt", "merges.txt",
    "spiece.model", "sentencepiece.bpe.model", "special_tokens_map.json", "preprocessor_config.json",
    "processor_config.json", "feature_extractor_config.json", "image_processor_config.json", "chat_template.jinja",
})
DELIVERED = ("transformers-model", "peft-adapter")


def _tokenizer_files(ctx: RunContext, rel: str) -> list[str]:
    return sorted(name for name in TOKENIZER_FILES if ctx.inventory.is_file(f"{rel}/{name}"))


def _checkpoints_with_tokenizer(ctx: RunContext) -> dict[str, tuple[str, list[str]]]:
    """run -> (the first checkpoint folder of it carrying tokenizer files, those files)."""
    found: dict[str, tuple[str, list[str]]] = {}
    for artifact in ctx.documents.artifacts():
        run, path = _text(artifact.get("run")), _text(artifact.get("path"))
        rel = ctx.inventory.normalise_ref(path) if path and artifact.get("kind") == "resume-checkpoint" else None
        files = _tokenizer_files(ctx, rel) if rel and run and run not in found else []
        if files:
            found[run] = (rel, files)
    return found


def _base_has_tokenizer(ctx: RunContext, rel: str) -> bool:
    """The adapter's base (adapter_config.json) in the hub cache carries a tokenizer: the reviewer has one."""
    config = ctx.documents.json_value(f"{rel}/adapter_config.json") \
        if ctx.inventory.is_file(f"{rel}/adapter_config.json") else None
    name = _text(config.get("base_model_name_or_path")) if isinstance(config, dict) else None
    revision = _text(config.get("revision")) if isinstance(config, dict) else None
    snapshot = snapshot_folder(ctx.options.hf_cache, name, revision or "main") if name else None
    return snapshot is None or any((snapshot / file).is_file() for file in TOKENIZER_FILES)


def check(ctx: RunContext) -> Iterator[Finding]:
    carried = _checkpoints_with_tokenizer(ctx)
    if not carried:
        return
    for artifact in ctx.documents.artifacts():
        run, path = _text(artifact.get("run")), _text(artifact.get("path"))
        rel = ctx.inventory.normalise_ref(path) if path and artifact.get("kind") in DELIVERED else None
        if not rel or run not in carried or not ctx.inventory.exists(rel) or ctx.inventory.is_file(rel):
            continue
        if _tokenizer_files(ctx, rel):
            continue
        if artifact["kind"] == "peft-adapter" and _base_has_tokenizer(ctx, rel):
            continue  # no base in the cache is IV505's; a base with its tokenizer gives the reviewer one
        checkpoint, files = carried[run]
        yield Finding("IV513", rel, run=run, artifact=_text(artifact.get("id")),
                      message=f"{_text(artifact.get('id')) or rel} has no tokenizer or processor files, though "
                              f"its run's checkpoint {checkpoint} carries {', '.join(files[:3])}: a reviewer "
                              "cannot turn the frozen eval inputs into ids; save it beside the model "
                              "(trainer.save_model(path) or tokenizer.save_pretrained(path))")
