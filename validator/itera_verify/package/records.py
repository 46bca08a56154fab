"""What an artifact's own files record about the run that made it, read statically and within bounds.

The rows of format/facts.py name the files and fields; this module reads them from one artifact folder:
JSON documents (trainer_state.json, adapter_config.json, config.json, generation_config.json, the tokenizer
files) by key path, the Trainer's training_args.bin from its pickle opcodes (a symbolic walk: nothing is
imported, called or unpickled), the weights from their safetensors headers alone (no tensor is read). The folder
is given as a `Folder`: the rules hand one that reads through ctx.documents, the recorder one over the disk
(`DiskFolder`), so both read an artifact the same way.
"""
from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from ..format import facts as table
from ..format.layouts import CHECKPOINT_FOLDER
from ..format.safetensors import Header
from .files import open_binary, read_safetensors_header
from .jsonread import read_json_file
from .pickle_state import training_args

MAX_RECORD_JSON = 64 << 20  # a tokenizer.json of 250,000 tokens is ~20 MB; a trainer_state.json a few MB
WEIGHTS_FILE, WEIGHTS_INDEX = "model.safetensors", "model.safetensors.index.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
# An input embedding's tensor, by the name the common architectures give it (GPT-2, Llama and most decoders,
# BERT, GPT-NeoX, T5's shared matrix); PEFT saves a resized one under the same name behind its prefix.
EMBEDDING_SUFFIXES = (".wte.weight", ".embed_tokens.weight", ".word_embeddings.weight", ".embed_in.weight",
                      ".tok_embeddings.weight", ".shared.weight")


class Folder(Protocol):
    """One artifact folder, read by name. `json` is None for a missing, unparsable or oversized document."""

    name: str

    def is_file(self, name: str) -> bool: ...
    def json(self, name: str) -> Any: ...
    def open(self, name: str) -> BinaryIO: ...
    def header(self, name: str) -> Header | None: ...


class DiskFolder:
    """A folder on disk (the recorder's view of what it is registering)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.name = self.path.name

    def is_file(self, name: str) -> bool:
        return (self.path / name).is_file()

    def json(self, name: str) -> Any:
        try:
            return read_json_file(self.path / name, max_bytes=MAX_RECORD_JSON)
        except (OSError, ValueError):
            return None

    def open(self, name: str) -> BinaryIO:
        return open_binary(self.path / name)

    def header(self, name: str) -> Header | None:
        return read_safetensors_header(self.path / name)


# ---------------------------------------------------------------------------------------------- weights

@dataclass
class Weights:
    """The tensors of a folder's weights, from their headers: name -> (dtype, shape, bytes)."""

    files: list[str] = field(default_factory=list)
    tensors: dict[str, tuple[str, tuple[int, ...], int]] = field(default_factory=dict)

    def stored_dtype(self) -> str | None:
        """The float format most float elements are stored in (float32, float16, bfloat16, ...)."""
        counts: Counter = Counter()
        for dtype, shape, _size in self.tensors.values():
            if dtype in table.FLOAT_DTYPES:
                elements = 1
                for dim in shape:
                    elements *= dim
                counts[dtype] += elements
        if not counts:
            return None
        return table.dtype_name(counts.most_common(1)[0][0])

    def embedding_rows(self) -> int | None:
        """The rows of the input embedding matrix (the largest, when several carry an embedding's name)."""
        rows = [shape[0] for name, (_d, shape, _s) in self.tensors.items()
                if len(shape) == 2 and (f".{name}").endswith(EMBEDDING_SUFFIXES)]
        return max(rows) if rows else None


def weight_files(folder: Folder) -> list[str]:
    """The safetensors weights of a folder: the shards its index names, model.safetensors, or an adapter's."""
    if folder.is_file(WEIGHTS_INDEX):
        index = folder.json(WEIGHTS_INDEX)
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if isinstance(weight_map, dict):
            return sorted({shard for shard in weight_map.values() if isinstance(shard, str) and "/" not in shard
                           and folder.is_file(shard)})
        return []
    return [name for name in (WEIGHTS_FILE, ADAPTER_WEIGHTS) if folder.is_file(name)][:1]


def read_weights(folder: Folder) -> Weights | None:
    files = weight_files(folder)
    weights = Weights(files)
    for name in files:
        header = folder.header(name)
        if header is None:
            return None  # a damaged file is the reload's IV504
        for entry in header.entries.values():
            weights.tensors[entry.name] = (entry.dtype, entry.shape, entry.nbytes)
    return weights if weights.tensors else None


# ---------------------------------------------------------------------------------------------- tokenizer

TOKENIZER_JSON, VOCAB_JSON, VOCAB_TXT, ADDED_TOKENS = "tokenizer.json", "vocab.json", "vocab.txt", "added_tokens.json"


@dataclass
class Tokenizer:
    """What a folder's tokenizer files hold: the ids and tokens of its vocabulary and added tokens."""

    size: int  # the largest id + 1
    tokens: set[str]
    added: list[tuple[int, str]]  # (id, content) of the added tokens, in id order
    source: str


def read_tokenizer(folder: Folder) -> Tokenizer | None:
    """The tokenizer saved in a folder (tokenizer.json; else vocab.json or vocab.txt), with the added tokens
    tokenizer_config.json and added_tokens.json list; None when there is none to read."""
    ids: dict[str, int] = {}
    added: dict[int, str] = {}
    source = None
    value = folder.json(TOKENIZER_JSON) if folder.is_file(TOKENIZER_JSON) else None
    if isinstance(value, dict):
        source = TOKENIZER_JSON
        vocab = value.get("model", {}).get("vocab") if isinstance(value.get("model"), dict) else None
        if isinstance(vocab, dict):
            ids.update({k: v for k, v in vocab.items() if isinstance(k, str) and _count(v)})
        elif isinstance(vocab, list):  # Unigram: [token, score] pairs, the id is the position
            ids.update({item[0]: index for index, item in enumerate(vocab)
                        if isinstance(item, list) and item and isinstance(item[0], str)})
        for token in value.get("added_tokens") or ():
            if isinstance(token, dict) and isinstance(token.get("content"), str) and _count(token.get("id")):
                added[token["id"]] = token["content"]
    elif folder.is_file(VOCAB_JSON) and isinstance(vocab := folder.json(VOCAB_JSON), dict):
        source = VOCAB_JSON
        ids.update({k: v for k, v in vocab.items() if isinstance(k, str) and _count(v)})
    elif folder.is_file(VOCAB_TXT):
        source = VOCAB_TXT
        ids.update(_vocab_lines(folder))
    if source is None:
        return None
    for extra in (folder.json(ADDED_TOKENS) if folder.is_file(ADDED_TOKENS) else None,):
        if isinstance(extra, dict):
            added.update({v: k for k, v in extra.items() if isinstance(k, str) and _count(v)})
    config = folder.json(table.TOKENIZER_CONFIG) if folder.is_file(table.TOKENIZER_CONFIG) else None
    decoder = config.get("added_tokens_decoder") if isinstance(config, dict) else None
    for key, token in decoder.items() if isinstance(decoder, dict) else ():
        content = token.get("content") if isinstance(token, dict) else None
        if isinstance(key, str) and key.isdigit() and isinstance(content, str):
            added[int(key)] = content
    every = set(ids.values()) | set(added)
    if not every:
        return None
    return Tokenizer(max(every) + 1, set(ids) | set(added.values()), sorted(added.items()), source)


def _vocab_lines(folder: Folder) -> dict[str, int]:
    """WordPiece's vocab.txt: one token per line, the id its line number (bounded like a JSON record)."""
    with folder.open(VOCAB_TXT) as fh:
        data = fh.read(MAX_RECORD_JSON + 1)
    if len(data) > MAX_RECORD_JSON:
        return {}
    lines = data.decode("utf-8", errors="replace").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return {token.rstrip("\r"): index for index, token in enumerate(lines)}


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def chat_template(folder: Folder) -> str | None:
    """The chat template a folder's tokenizer carries (tokenizer_config.json or its own file), or None."""
    config = folder.json(table.TOKENIZER_CONFIG) if folder.is_file(table.TOKENIZER_CONFIG) else None
    template = config.get("chat_template") if isinstance(config, dict) else None
    if isinstance(template, list):  # several named templates
        template = next((t.get("template") for t in template if isinstance(t, dict) and t.get("template")), None)
    if isinstance(template, str) and template.strip():
        return template
    for name in table.CHAT_TEMPLATE_FILES:
        if folder.is_file(name):
            if name.endswith(".json"):
                value = folder.json(name)
                template = value.get("chat_template") if isinstance(value, dict) else None
                return template if isinstance(template, str) else ""
            with folder.open(name) as fh:
                return fh.read(MAX_RECORD_JSON).decode("utf-8", errors="replace")
    return None


# ---------------------------------------------------------------------------------------------- records

def read_records(folder: Folder, *, checkpoint: bool = False) -> dict[tuple[str, str], Any]:
    """(file, field) -> value for every record of the facts table this folder holds. `checkpoint`: a Trainer
    resume checkpoint (its weights' dtype records the training precision)."""
    records: dict[tuple[str, str], Any] = {}
    wanted = {(record.file, record.field) for row in table.PARAMS_FACTS + table.CHECKPOINT_FACTS
              for record in row.records}
    if folder.is_file(table.TRAINING_ARGS):
        with folder.open(table.TRAINING_ARGS) as fh:
            args = training_args(fh)
        for file, name in wanted:
            if file == table.TRAINING_ARGS and args is not None and name in args:
                records[file, name] = args[name]
    for file in {file for file, _ in wanted if file.endswith(".json")}:
        value = folder.json(file) if folder.is_file(file) else None
        if isinstance(value, dict):
            for wanted_file, name in wanted:
                if wanted_file == file and name in value:
                    records[file, name] = value[name]
    named = CHECKPOINT_FOLDER.fullmatch(folder.name)
    if named:
        records[table.FOLDER_NAME, "N of checkpoint-<N>"] = int(named.group(1))
    weights = read_weights(folder)
    if weights is not None:
        if checkpoint:
            records[table.WEIGHTS, table.STORED_DTYPE] = weights.stored_dtype()
        records[table.WEIGHTS, table.EMBEDDING_ROWS] = weights.embedding_rows()
    return records


__all__ = ["DiskFolder", "Folder", "Tokenizer", "Weights", "chat_template", "read_records", "read_tokenizer",
           "read_weights", "weight_files"]
