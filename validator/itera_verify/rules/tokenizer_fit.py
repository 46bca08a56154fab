"""IV516–IV518: the tokenizer and the token ids a model is delivered with fit the model.

Static: the tokenizer files are read as JSON (tokenizer.json, tokenizer_config.json) or as text (vocab.txt), the
embeddings' rows from the safetensors headers. Which keys declare what, and how they compare, is
format/facts.py's table; reading a folder's tokenizer and weights is package/records.py's. IV513 (rules/
tokenizer.py) says when a delivered model lacks its tokenizer; these say when the one it has does not fit.
"""
from __future__ import annotations

from typing import Any, Iterator

from ..format import facts as table
from ..model import Finding, Rule, Severity
from ..package import RunContext, pointer_of
from ..package.jsonread import read_json_file
from ..package.records import Tokenizer, Weights, chat_template, read_tokenizer, read_weights
from ..runtime.hfcache import snapshot_folder
from ._records import ArtifactFolder, PackageFolder, artifact_folders, run_params

RULES = [
    Rule("IV516", Severity.ERROR, "the tokenizer does not fit the model's embeddings",
         explain="Every id a tokenizer produces indexes a row of the model's input embeddings. A tokenizer with "
                 "added tokens (a chat format's <|im_start|>, a new pad token) needs "
                 "`model.resize_token_embeddings(len(tokenizer))`, and the resized rows must be delivered: a "
                 "model folder whose embeddings have fewer rows than the tokenizer's largest id + 1 fails on the "
                 "first new token (an index error on the GPU, a silent wrong row elsewhere). An adapter carries "
                 "resized embeddings only when they are saved with it (`modules_to_save` naming the embeddings, "
                 "or `save_pretrained(..., save_embedding_layers=True)`; PEFT's default \"auto\" checks the base "
                 "on the hub and, offline, assumes nothing was resized): its base's rows are the run's params "
                 "`base_vocab_size` (the recorder writes it), and a run whose params record a `vocab_size` above "
                 "that resized them. Also reported: a config.json whose `vocab_size` is not its embeddings' row "
                 "count, and a special token tokenizer_config.json names that the vocabulary does not hold. "
                 "Resize, train and save the embeddings with the tokenizer that goes with them.",
         bad="tokenizer.json: 130 ids (added <|im_start|>, <|im_end|>)   model.safetensors: transformer.wte.weight "
             "[128, 32]",
         good="model.resize_token_embeddings(len(tokenizer)); trainer.save_model(path)   ->   wte.weight [130, 32]",
         since="0.2.0"),
    Rule("IV517", Severity.ERROR, "a run declares a chat format but its model carries no chat template",
         explain="A run whose params declare a chat format (`chat_template`, `chat_format`) was trained on "
                 "conversations rendered by that template; a delivered model or adapter whose tokenizer carries "
                 "no chat template (tokenizer_config.json `chat_template`, chat_template.jinja) is prompted by "
                 "its users in another format than it learnt, and a template other than the declared one "
                 "renders other prompts. Save the tokenizer with the template the run used "
                 "(`tokenizer.chat_template = ...; tokenizer.save_pretrained(path)`).",
         bad='params: {"chat_format": "chatml"}   artifacts/chat-model/tokenizer_config.json: no chat_template',
         good='artifacts/chat-model/chat_template.jinja: "{% for message in messages %}<|im_start|>..."',
         since="0.2.0"),
    Rule("IV518", Severity.ERROR, "a generation config names token ids the model does not have",
         explain="generation_config.json (and config.json) name the ids generation starts with, stops at and "
                 "pads with (`bos_token_id`, `eos_token_id`, `pad_token_id`, `decoder_start_token_id`). An id at "
                 "or past the model's vocabulary (its embeddings' rows) is one the model never produces: "
                 "generation never stops, or indexes past the embeddings when it pads. It is what a config "
                 "copied from the base (GPT-2's 50256) onto a model with another vocabulary looks like. Set the "
                 "ids from the tokenizer the model is delivered with.",
         bad='generation_config.json: {"eos_token_id": 50256}   the model: 128 token ids',
         good='generation_config.json: {"eos_token_id": 0}   tokenizer: eos_token "<eos>" = id 0', since="0.2.0"),
]

DELIVERED = ("transformers-model", "peft-adapter")
WITH_TOKENIZER = (*DELIVERED, "resume-checkpoint")
SPECIAL = table.fact("special tokens")
GENERATION = (table.fact("generation token ids"), table.fact("model token ids"))
CHAT = table.fact("chat template")
VOCABULARY = table.fact("tokenizer vocabulary")
TRAINED = table.fact("trained vocabulary")
BASE_VOCAB, RUN_VOCAB = "base_vocab_size", "vocab_size"  # params: the base's rows, the run's (after a resize)


def check(ctx: RunContext) -> Iterator[Finding]:
    if not ctx.documents.manifest:
        return  # missing or unparsable manifest: IV101/IV104 say so
    params = {run_id: values for _, run_id, _, values in run_params(ctx)}
    for folder in artifact_folders(ctx):
        if folder.kind not in WITH_TOKENIZER:
            continue
        view = PackageFolder(ctx, folder.rel)
        weights = read_weights(view)
        config = view.json(table.CONFIG)
        config = config if isinstance(config, dict) else {}
        tokenizer = read_tokenizer(view)
        rows = _rows(weights, config)
        yield from _config_vocab(folder, config, weights)
        if view.is_file(table.ADAPTER_CONFIG):
            yield from _adapter(folder, weights, tokenizer, params.get(folder.run) or {},
                                _cached_base_rows(ctx, view.json(table.ADAPTER_CONFIG)))
        elif tokenizer is not None and rows is not None and not table.agree(VOCABULARY, tokenizer.size, rows[0]):
            yield _too_small(folder, tokenizer, rows)
        if tokenizer is not None:
            yield from _special_tokens(folder, view, tokenizer)
        if rows is not None:
            for name in (table.GENERATION_CONFIG, table.CONFIG):
                yield from _generation_ids(folder, view, name, rows)
        if folder.kind in DELIVERED and tokenizer is not None:
            yield from _chat_template(folder, view, params.get(folder.run) or {})


def _rows(weights: Weights | None, config: dict) -> tuple[int, str] | None:
    """(the model's token ids, what says so): its embeddings' rows, else config.json's vocab_size."""
    rows = weights.embedding_rows() if weights is not None else None
    if rows:
        return rows, "the rows of its input embeddings"
    vocab = next((value for _, value in table.declared_values(config, table.fact("vocabulary size"))), None)
    return (vocab, f"{table.CONFIG} vocab_size") if _count(vocab) and vocab > 0 else None


def _config_vocab(folder: ArtifactFolder, config: dict, weights: Weights | None) -> Iterator[Finding]:
    rows = weights.embedding_rows() if weights is not None else None
    row = table.fact("vocabulary size")
    declared = next(iter(table.declared_values(config, row)), None)
    if rows is None or declared is None or not _count(declared[1]) or table.agree(row, declared[1], rows):
        return
    yield Finding("IV516", f"{folder.rel}/{table.CONFIG}", pointer=pointer_of(declared[0].split(".")),
                  run=folder.run, artifact=folder.id,
                  message=f"{folder.rel}/{table.CONFIG} declares {declared[0]} = {declared[1]}, but its input "
                          f"embeddings have {rows} rows: the config describes another vocabulary than the weights "
                          "hold (resize_token_embeddings updates both; save them together)")


def _too_small(folder: ArtifactFolder, tokenizer: Tokenizer, rows: tuple[int, str]) -> Finding:
    beyond = [content for token_id, content in tokenizer.added if token_id >= rows[0]]
    named = f" (added tokens {', '.join(repr(t) for t in beyond[:3])}{', …' if len(beyond) > 3 else ''})" \
        if beyond else ""
    return Finding("IV516", f"{folder.rel}/{tokenizer.source}", run=folder.run, artifact=folder.id,
                   message=f"{folder.label}'s tokenizer produces ids up to {tokenizer.size - 1}{named}, but the "
                           f"model has {rows[0]} token ids ({rows[1]}): those ids index no embedding row; "
                           "resize the embeddings to the tokenizer (model.resize_token_embeddings(len(tokenizer))), "
                           "train, and save them with it")


def _cached_base_rows(ctx: RunContext, adapter_config: Any) -> int | None:
    """The vocabulary of the base an adapter names, from its config.json in the run's hub cache (the reviewer's
    own, --hf-cache): what base + adapter has when the adapter saves no embeddings."""
    if not isinstance(adapter_config, dict):
        return None
    name, revision = adapter_config.get("base_model_name_or_path"), adapter_config.get("revision")
    if not isinstance(name, str) or not (revision is None or isinstance(revision, str)):
        return None
    snapshot = snapshot_folder(ctx.options.hf_cache, name, revision or "main")
    try:
        config = read_json_file(snapshot / table.CONFIG) if snapshot is not None else None
    except (OSError, ValueError):
        return None
    vocab = next((value for _, value in table.declared_values(config, table.fact("vocabulary size"))), None) \
        if isinstance(config, dict) else None
    return vocab if _count(vocab) and vocab > 0 else None


def _adapter(folder: ArtifactFolder, weights: Weights | None, tokenizer: Tokenizer | None,
             params: dict, cached_base: int | None = None) -> Iterator[Finding]:
    """An adapter's model has the rows its saved embeddings have, else its base's: params base_vocab_size, or
    the base's config.json in the hub cache."""
    saved = weights.embedding_rows() if weights is not None else None
    base, trained = params.get(BASE_VOCAB), params.get(RUN_VOCAB)
    base_source = f"params {BASE_VOCAB}"
    if not (_count(base) and base > 0) and cached_base is not None:
        base, base_source = cached_base, f"its base's {table.CONFIG} in the hub cache"
    rows = saved or (base if _count(base) and base > 0 else None)
    if saved is None and _count(base) and _count(trained) and not table.agree(TRAINED, trained, base):
        yield Finding("IV516", f"{folder.rel}/{table.ADAPTER_CONFIG}", run=folder.run, artifact=folder.id,
                      message=f"run {folder.run} trained with {trained} token ids (params {RUN_VOCAB}) on a base "
                              f"of {base} ({base_source}), but {folder.label} saves no embeddings: the "
                              "resized rows were never saved, and base + adapter has the base's vocabulary; save "
                              "them (modules_to_save with the embeddings, or save_pretrained(..., "
                              "save_embedding_layers=True))")
        return
    if tokenizer is not None and rows is not None and not table.agree(VOCABULARY, tokenizer.size, rows):
        source = "the rows of the embeddings it saves" if saved else f"its base's rows, {base_source}"
        yield _too_small(folder, tokenizer, (rows, source))


def _special_tokens(folder: ArtifactFolder, view: PackageFolder, tokenizer: Tokenizer) -> Iterator[Finding]:
    config = view.json(table.TOKENIZER_CONFIG)
    if not isinstance(config, dict):
        return
    missing = []
    for key, value in table.declared_values(config, SPECIAL):
        tokens = value if isinstance(value, list) else list(value.values()) if isinstance(value, dict) \
            and "content" not in value else [value]  # extra_special_tokens may map names to tokens
        for token in tokens:
            content = token.get("content") if isinstance(token, dict) else token
            if isinstance(content, str) and content and content not in tokenizer.tokens:
                missing.append((key, content))
    if missing:
        key, content = missing[0]
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        yield Finding("IV516", f"{folder.rel}/{table.TOKENIZER_CONFIG}", pointer=pointer_of([key]), run=folder.run,
                      artifact=folder.id,
                      message=f"{folder.rel}/{table.TOKENIZER_CONFIG} names {key} {content!r}{more}, which "
                              f"{folder.rel}/{tokenizer.source} does not hold: the tokenizer cannot produce it; "
                              "add it (tokenizer.add_special_tokens) and resize the embeddings")


def _generation_ids(folder: ArtifactFolder, view: PackageFolder, name: str,
                    rows: tuple[int, str]) -> Iterator[Finding]:
    document = view.json(name)
    if not isinstance(document, dict):
        return
    row = GENERATION[0] if name == table.GENERATION_CONFIG else GENERATION[1]
    for key, value in table.declared_values(document, row):
        ids = value if isinstance(value, list) else [value]
        outside = [token for token in ids if _count(token) and not table.agree(row, token, rows[0])]
        if outside:
            yield Finding("IV518", f"{folder.rel}/{name}", pointer=pointer_of([key]), run=folder.run,
                          artifact=folder.id,
                          message=f"{folder.rel}/{name} names {key} {table.shown(value)}, but the model has "
                                  f"{rows[0]} token ids ({rows[1]}): id {outside[0]} is none of them; set it from "
                                  "the tokenizer the model is delivered with")
            return  # the first wrong id of a file: the others come from the same copy


def _chat_template(folder: ArtifactFolder, view: PackageFolder, params: dict) -> Iterator[Finding]:
    declared = next(((key, value) for key, value in table.declared_values(params, CHAT) if value), None)
    if declared is None:
        return
    key, value = declared
    saved = chat_template(view)
    if not saved:
        yield Finding("IV517", folder.rel, run=folder.run, artifact=folder.id,
                      message=f"run {folder.run} declares {key} = {table.shown(value)} in its params, but "
                              f"{folder.label}'s tokenizer carries no chat template (no {table.TOKENIZER_CONFIG} "
                              "chat_template, no chat_template.jinja): its users will prompt it in another format "
                              "than it learnt; save the tokenizer with its template")
    elif _is_template(value) and value.strip() != saved.strip():
        yield Finding("IV517", folder.rel, run=folder.run, artifact=folder.id,
                      message=f"{folder.label}'s chat template is not the one run {folder.run}'s params declare "
                              f"({key}): the model learnt one format and is delivered with another; save the "
                              "tokenizer with the template the run used")


def _is_template(value: Any) -> bool:
    return isinstance(value, str) and ("{%" in value or "{{" in value)


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
