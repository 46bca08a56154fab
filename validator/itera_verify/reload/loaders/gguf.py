"""Loader `gguf`: one `.gguf` file as llama.cpp writes it, read with the `gguf` package (no llama.cpp build).

Proves: the header, key-values and tensor table parse and every tensor's data lies inside the file; every tensor
is dequantized, in slices of rows, and is finite (an F16 conversion that overflowed to infinity shows here); a
tokenizer is present (llama.cpp cannot run a model without one); where reload.json `config` names the source HF
model folder in the package, the architecture's sizes agree with its config.json; where transformers supports the
architecture (llama, mistral, qwen2, …), a real load with `gguf_file=` (transformers dequantizes every tensor into
its own model: names, shapes and the q/k permutation it expects) and one forward pass with finite logits.
"""
from __future__ import annotations

import os
from math import prod
from pathlib import Path

from ...format.gguf import HeaderProblem, walk
from ...package.jsonread import read_json_file
from ..common import LOAD, Outcome, Stop, forward_pass, nonfinite_count, require, short

# Rows dequantized at a time: a slice's float32 copy stays small whatever the tensor's size.
ROWS_PER_SLICE = 4096
TOKENS, TOKENIZER_MODEL, ARCHITECTURE = "tokenizer.ggml.tokens", "tokenizer.ggml.model", "general.architecture"
# The GGUF key (after `<architecture>.`) and the config.json fields that hold the same size.
SIZES = {"block_count": ("num_hidden_layers", "n_layer"), "embedding_length": ("hidden_size", "n_embd"),
         "feed_forward_length": ("intermediate_size", "n_inner"),
         "attention.head_count": ("num_attention_heads", "n_head")}
# What transformers' GGUF load holds at its peak, per parameter: the dequantized float32 state dict and the
# float32 model it is copied into; and the libraries' own memory in a CPU child (limits.py measured under 0.6 GiB).
LOAD_BYTES_PER_PARAMETER = 8
LIBRARIES_PEAK = 1 << 30


def open_reader(path: Path, outcome: Outcome):
    gguf = require(outcome.job)
    if not path.is_file():
        raise Stop(LOAD, f"{outcome.rel(path)} is not a file", path)
    size = path.stat().st_size
    check_header(path, size, outcome)
    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as exc:  # the reader fails with reshape or index errors on a short file
        raise Stop(LOAD, f"{outcome.rel(path)} does not read as GGUF ({size:,} bytes; truncated or not GGUF): "
                         f"{short(exc)}", path) from exc
    return gguf, reader, size


def check_header(path: Path, size: int, outcome: Outcome) -> None:
    """The header walked with limits (format/gguf.py) before gguf.GGUFReader builds a view per value: a count or
    length out of bounds, or more values than the reader can hold within this reload's memory limit, stops the
    reload naming the key, in milliseconds instead of a child killed at its limit."""
    try:
        with open(path, "rb") as fh:
            header = walk(lambda offset, n: os.pread(fh.fileno(), n, offset), size)
    except HeaderProblem as exc:
        raise Stop(LOAD, f"{outcome.rel(path)}: {exc} (refused before the gguf package reads it)", path) from exc
    except OSError as exc:
        raise Stop(LOAD, f"{outcome.rel(path)} cannot be read: {short(exc)}", path) from exc
    limit = outcome.job.get("memory_limit")
    if isinstance(limit, int) and header.reader_bytes > limit - LIBRARIES_PEAK:
        raise Stop(LOAD, f"{outcome.rel(path)}: {header.largest_array}: the key-values hold {header.elements:,} array "
                         f"elements; the gguf package would need about {header.reader_bytes >> 20:,} MiB to read them, "
                         f"more than the {(limit - LIBRARIES_PEAK) >> 20:,} MiB this reload's memory limit "
                         f"({limit >> 20:,} MiB) leaves beside the libraries", path)


def field_value(reader, key: str):
    """A scalar or string key-value as Python; None when absent."""
    field = reader.get_field(key)
    if field is None:
        return None
    try:
        return field.contents()
    except Exception:  # noqa: BLE001 - a malformed value is reported as absent by the callers that need it
        return None


def check_table(reader, size: int, path: Path, outcome: Outcome) -> None:
    """The tensor table is what the header says, and each tensor's bytes lie inside the file without overlap."""
    declared = field_value(reader, "GGUF.tensor_count")
    if declared is not None and declared != len(reader.tensors):
        outcome.fail(LOAD, f"the header declares {declared} tensors, the table holds {len(reader.tensors)}", path)
    spans = []
    for tensor in reader.tensors:
        if tensor.n_elements != prod(int(d) for d in tensor.shape):
            outcome.fail(LOAD, f"tensor {tensor.name}: {tensor.n_elements} elements for shape "
                               f"{list(map(int, tensor.shape))}", path)
        end = int(tensor.data_offset) + int(tensor.n_bytes)
        if end > size:
            outcome.fail(LOAD, f"tensor {tensor.name} ends at byte {end:,}, past the end of the file "
                               f"({size:,} bytes): truncated", path)
        spans.append((int(tensor.data_offset), end, tensor.name))
    spans.sort()
    for (_, end, name), (start, _, other) in zip(spans, spans[1:]):
        if start < end:
            outcome.fail(LOAD, f"tensors {name} and {other} overlap in the file", path)
    if not reader.tensors:
        outcome.fail(LOAD, "the file holds no tensor", path)
    if outcome.problems:
        raise Stop.recorded()


def nonfinite_in(gguf, tensor, device) -> int:
    """Non-finite values of one tensor, dequantized ROWS_PER_SLICE rows at a time and counted on the reload's
    device (integer tensors: none)."""
    import torch

    kind = tensor.tensor_type
    if kind.name.startswith("I"):  # I8, I16, I32, I64: integers, finite by nature
        return 0
    data = tensor.data
    rows = data.reshape(-1, data.shape[-1]) if data.ndim > 1 else data.reshape(1, -1)
    bad = 0
    for start in range(0, rows.shape[0], ROWS_PER_SLICE):
        values = gguf.dequantize(rows[start:start + ROWS_PER_SLICE], kind)
        bad += nonfinite_count(torch.from_numpy(values).to(device))
    return bad


def check_values(gguf, reader, device, path: Path, outcome: Outcome) -> None:
    by_type: dict[str, int] = {}
    for tensor in reader.tensors:
        by_type[tensor.tensor_type.name] = by_type.get(tensor.tensor_type.name, 0) + 1
        try:
            bad = nonfinite_in(gguf, tensor, device)
        except Exception as exc:  # noqa: BLE001 - a type the package cannot dequantize is still not proven
            outcome.fail(LOAD, f"tensor {tensor.name} ({tensor.tensor_type.name}) does not dequantize: "
                               f"{short(exc)}", path)
            continue
        if bad:
            outcome.fail(LOAD, f"tensor {tensor.name} ({tensor.tensor_type.name}) holds {bad} non-finite "
                               "value(s) (NaN or Inf) once dequantized", path)
    outcome.facts["tensors"] = len(reader.tensors)
    outcome.facts["parameters"] = sum(int(t.n_elements) for t in reader.tensors)
    outcome.facts["tensor_types"] = by_type


def check_tokenizer(reader, path: Path, outcome: Outcome) -> None:
    model = field_value(reader, TOKENIZER_MODEL)
    tokens = reader.get_field(TOKENS)
    count = len(tokens.data) if tokens is not None else 0
    if not model or not count:
        outcome.fail(LOAD, f"no tokenizer: {TOKENIZER_MODEL if not model else TOKENS} is "
                           f"{'absent' if (tokens is None or not model) else 'empty'} (llama.cpp cannot run it)", path)
        return
    outcome.facts["tokenizer"] = f"{model}, {count} tokens"


def check_source(reader, job: dict, path: Path, outcome: Outcome) -> None:
    """reload.json `config`: the HF model folder the file was converted from; its sizes must be the file's."""
    folder = job.get("config")
    if not folder:
        return
    try:
        config = read_json_file(Path(folder) / "config.json")
    except (OSError, ValueError) as exc:
        raise Stop(LOAD, f"reload.json config {job.get('config_ref')}: config.json does not read: {short(exc)}") \
            from exc
    arch = field_value(reader, ARCHITECTURE)
    for key, names in SIZES.items():
        stored = field_value(reader, f"{arch}.{key}")
        declared = next((config[n] for n in names if isinstance(config.get(n), int)), None)
        if isinstance(stored, int) and declared is not None and stored != declared:
            outcome.fail(LOAD, f"{arch}.{key} is {stored}, but {job.get('config_ref')}/config.json says "
                               f"{declared}: not converted from that model", path)
    tokens = reader.get_field(TOKENS)
    vocab = config.get("vocab_size")
    if tokens is not None and isinstance(vocab, int) and len(tokens.data) > vocab:
        outcome.fail(LOAD, f"the tokenizer holds {len(tokens.data)} tokens, more than the source model's "
                           f"vocab_size {vocab}", path)


def reload(job: dict, device, outcome: Outcome) -> None:
    path = Path(job["path"])
    gguf, reader, size = open_reader(path, outcome)
    outcome.facts["architecture"] = field_value(reader, ARCHITECTURE)
    if not outcome.facts["architecture"]:
        outcome.fail(LOAD, f"{ARCHITECTURE} is absent: no program knows what model this is", path)
    check_table(reader, size, path, outcome)
    check_values(gguf, reader, device, path, outcome)
    check_tokenizer(reader, path, outcome)
    check_source(reader, job, path, outcome)
    if outcome.problems:
        raise Stop.recorded()  # a file already shown broken is not loaded again
    outcome.forward = transformers_forward(path, job, device, outcome)


def transformers_forward(path: Path, job: dict, device, outcome: Outcome) -> str:
    """from_pretrained(gguf_file=) and one forward pass, where transformers knows the architecture and, on the CPU,
    the dequantized model fits this reload's memory limit (limits.py); otherwise says why it was not run."""
    architecture = outcome.facts.get("architecture")
    read_only = "read and dequantized with the gguf package"
    try:
        from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES
    except ImportError:  # a transformers without GGUF support
        return f"not run: {read_only}; this transformers does not load GGUF files"
    if architecture not in GGUF_SUPPORTED_ARCHITECTURES:
        return f"not run: {read_only}; transformers does not load {architecture} GGUF files (llama.cpp runs it)"
    need = outcome.facts.get("parameters", 0) * LOAD_BYTES_PER_PARAMETER
    limit = job.get("memory_limit")
    if device.type == "cpu" and isinstance(limit, int) and need > limit - LIBRARIES_PEAK:  # the child's RLIMIT_DATA
        return (f"not run: {read_only}; transformers would dequantize it to {need >> 20:,} MiB, more than this "
                f"reload's memory limit ({limit >> 20:,} MiB)")
    from transformers import AutoModelForCausalLM

    from ._hf_config import refuse_adapter
    from .transformers import check_loading_info, read_config

    # from_pretrained reads the folder beside the file too: an adapter_config.json there would be attached (or,
    # without a config.json, its base loaded), and a config.json's steering keys are the sender's.
    refuse_adapter(path.parent, outcome)
    if (path.parent / "config.json").is_file():
        read_config(path.parent, outcome)
    try:
        model, info = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                           local_files_only=True, trust_remote_code=False,
                                                           output_loading_info=True)
    except Exception as exc:  # noqa: BLE001 - any refusal by transformers is a file it cannot load
        raise Stop(LOAD, f"transformers does not load it (gguf_file=): {short(exc)}", path) from exc
    check_loading_info(model, info, "transformers does not load it (gguf_file=)")
    model.to(device).eval()
    outcome.facts["class"] = type(model).__name__
    return forward_pass(model, device) + " (transformers, gguf_file=)"
