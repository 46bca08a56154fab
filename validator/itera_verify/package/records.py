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
import pickletools
import zipfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from ..format import facts as table
from ..format.layouts import CHECKPOINT_FOLDER
from ..format.safetensors import Header
from .files import open_binary, read_safetensors_header
from .jsonread import read_json_file
from .pickles.zips import AmbiguousZip, open_checked

MAX_RECORD_JSON = 64 << 20  # a tokenizer.json of 250,000 tokens is ~20 MB; a trainer_state.json a few MB
MAX_ARGS_PICKLE = 8 << 20  # a pickled TrainingArguments is ~4 KB, ~100 KB with a DeepSpeed configuration
MAX_OPCODES = 500_000
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


# ---------------------------------------------------------------------------------------------- training_args.bin

class _Global(str):
    """An imported name, `module name`: a label, never imported."""


@dataclass
class _Object:
    cls: Any
    state: Any = None


def _pop_mark(stack: list, marks: list[int]) -> list:
    start = marks.pop()
    items = stack[start:]
    del stack[start:]
    return items


PLAIN = (str, int, float, bool, type(None))
DICT_CLASSES = ("collections OrderedDict", "builtins dict")


def _plain(value: Any) -> Any:
    """A value of the state as JSON would hold it: scalars, lists of scalars; anything else is left out."""
    if isinstance(value, PLAIN):
        return value
    if isinstance(value, (list, tuple)) and all(isinstance(v, PLAIN) for v in value):
        return list(value)
    return _Object


def object_state(data: bytes) -> dict[str, Any] | None:
    """The plain fields of the object a pickle builds (a dataclass such as TrainingArguments: NEWOBJ, then BUILD
    with a dict), read by walking its opcodes with a symbolic stack. An enum member (`REDUCE` of a class with
    one plain argument) reads as that argument: `SchedulerType('linear')` is 'linear'. None when the pickle is
    not one such object."""
    stack: list = []
    marks: list[int] = []
    memo: dict = {}
    try:
        for count, (opcode, arg, _pos) in enumerate(pickletools.genops(data)):
            if count > MAX_OPCODES:
                return None
            name = opcode.name
            if name == "STOP":
                break
            if name == "MARK":
                marks.append(len(stack))
            elif name in ("PUT", "BINPUT", "LONG_BINPUT"):
                memo[arg] = stack[-1]
            elif name == "MEMOIZE":
                memo[len(memo)] = stack[-1]
            elif name in ("GET", "BINGET", "LONG_BINGET"):
                stack.append(memo[arg])
            elif name in ("NONE", "NEWTRUE", "NEWFALSE"):
                stack.append({"NONE": None, "NEWTRUE": True, "NEWFALSE": False}[name])
            elif opcode.stack_after == [pickletools.pyunicode] or opcode.stack_after == [pickletools.pystring] \
                    or opcode.stack_after in ([pickletools.pyint], [pickletools.pylong], [pickletools.pyfloat],
                                              [pickletools.pybool], [pickletools.pyinteger_or_bool]):
                stack.append(arg)
            elif name == "EMPTY_DICT":
                stack.append({})
            elif name == "DICT":
                items = _pop_mark(stack, marks)
                stack.append(dict(zip(items[0::2], items[1::2])))
            elif name == "SETITEM":
                key, value = stack[-2], stack[-1]
                del stack[-2:]
                if isinstance(stack[-1], dict):
                    stack[-1][key] = value
            elif name == "SETITEMS":
                items = _pop_mark(stack, marks)
                if isinstance(stack[-1], dict):
                    stack[-1].update(zip(items[0::2], items[1::2]))
            elif name == "EMPTY_LIST":
                stack.append([])
            elif name == "APPEND":
                item = stack.pop()
                if isinstance(stack[-1], list):
                    stack[-1].append(item)
            elif name == "APPENDS":
                items = _pop_mark(stack, marks)
                if isinstance(stack[-1], list):
                    stack[-1].extend(items)
            elif name == "LIST":
                stack.append(_pop_mark(stack, marks))
            elif name == "EMPTY_TUPLE":
                stack.append(())
            elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
                size = int(name[-1])
                items = tuple(stack[-size:])
                del stack[-size:]
                stack.append(items)
            elif name == "TUPLE":
                stack.append(tuple(_pop_mark(stack, marks)))
            elif name == "GLOBAL":
                stack.append(_Global(arg))
            elif name == "STACK_GLOBAL":
                module, attribute = stack[-2], stack[-1]
                del stack[-2:]
                stack.append(_Global(f"{module} {attribute}"))
            elif name == "REDUCE":
                callable_, args = stack[-2], stack[-1]
                del stack[-2:]
                plain = isinstance(args, tuple) and len(args) == 1 and isinstance(args[0], PLAIN)
                if callable_ in DICT_CLASSES:
                    stack.append({})  # OrderedDict(), then SETITEMS
                else:
                    stack.append(args[0] if plain and isinstance(callable_, _Global) else _Object(callable_))
            elif name in ("NEWOBJ", "NEWOBJ_EX"):
                size = 2 if name == "NEWOBJ" else 3
                cls = stack[-size]
                del stack[-size:]
                stack.append(_Object(cls))
            elif name == "BUILD":
                state = stack.pop()
                if isinstance(stack[-1], _Object):
                    stack[-1].state = state
            else:
                _generic(opcode, stack, marks)
    except (ValueError, IndexError, KeyError, TypeError, AttributeError):
        return None
    built = stack[-1] if stack else None
    state = built.state if isinstance(built, _Object) else None
    if isinstance(state, tuple) and state and isinstance(state[0], dict):
        state = state[0]  # (dict, slots)
    if not isinstance(state, dict):
        return None
    values = {key: _plain(value) for key, value in state.items() if isinstance(key, str)}
    return {key: value for key, value in values.items() if value is not _Object}


def _generic(opcode, stack: list, marks: list[int]) -> None:
    """Any other opcode by its declared stack effect: what it consumes goes, opaque placeholders come."""
    before = opcode.stack_before
    if pickletools.markobject in before:
        _pop_mark(stack, marks)
        count = before.index(pickletools.markobject)
    else:
        count = len(before)
    if count:
        if count > len(stack):
            raise IndexError("stack underflow")
        del stack[-count:]
    stack.extend([_Object(None)] * len(opcode.stack_after))


def training_args(fh: BinaryIO) -> dict[str, Any] | None:
    """The plain fields of the TrainingArguments a Trainer pickled into training_args.bin (a zip-format
    torch.save file), from its data.pkl's opcodes; None when the file is not that."""
    try:
        size = os.fstat(fh.fileno()).st_size
        with open_checked(fh, size) as archive:
            members = [info for info in archive.infolist() if info.filename.endswith("/data.pkl")
                       and info.filename.count("/") == 1]
            if len(members) != 1 or members[0].file_size > MAX_ARGS_PICKLE:
                return None
            data = archive.read(members[0])
    except (OSError, AmbiguousZip, zipfile.BadZipFile, ValueError, EOFError, RuntimeError, NotImplementedError):
        return None
    return object_state(data)


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


__all__ = ["DiskFolder", "Folder", "Tokenizer", "Weights", "chat_template", "object_state", "read_records",
           "read_tokenizer", "read_weights", "training_args", "weight_files"]
