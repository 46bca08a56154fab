"""Tensors of safetensors weights, read from the header alone, and digests of their payload bytes, lazily.

No torch: a safetensors header says each tensor's dtype, shape and byte range, so two weight sets can be told
apart (different names or shapes) without reading a byte of data, and compared tensor by tensor when they look
alike. A digest is computed once per tensor of a file and only when a comparison needs it; a comparison stops at
the first tensor that differs, so weights that were trained cost a few small reads. A model saved in another
float format than the base's (an fp32 base loaded in bf16 and saved untouched) is compared with the base's
values converted as torch converts them (round to nearest even), a chunk at a time, with numpy.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from ..archive.links import real_path
from ..package.files import open_binary, read_safetensors_header

READ_CHUNK = 1 << 20


@dataclass(frozen=True)
class Tensor:
    file: str  # absolute, fully resolved
    dtype: str
    shape: tuple[int, ...]
    start: int  # absolute offset in the file
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start


@dataclass
class WeightSet:
    """The tensors of one model: one safetensors file or the shards an index names."""

    label: str  # what a message calls it: an artifact id, or base ORG/NAME@REV
    where: str  # the file a finding points at (package-relative for artifacts)
    tensors: dict[str, Tensor]
    run: str | None = None
    artifact: str | None = None
    step: int | None = None  # a checkpoint's step, where known
    signature: frozenset = field(init=False)

    def __post_init__(self):
        self.signature = frozenset((name, t.dtype, t.shape) for name, t in self.tensors.items())
        self.layout = frozenset((name, t.shape) for name, t in self.tensors.items())


# The float formats a conversion is recognised between (safetensors' names), and their item sizes.
FLOATS = {"F32": 4, "F16": 2, "BF16": 2}
BF16_NAN = 0x7FC0  # what torch writes for any NaN converted to bfloat16


def converted_to(model: WeightSet, base: WeightSet) -> str | None:
    """The one float format `model` holds where `base` holds another (every other tensor's dtype equal, the
    same names and shapes): the model may be the base converted to it. None otherwise."""
    if model.layout != base.layout or model.signature == base.signature:
        return None
    targets = set()
    for name, tensor in model.tensors.items():
        source = base.tensors[name].dtype
        if tensor.dtype != source:
            if tensor.dtype not in FLOATS or source not in FLOATS:
                return None
            targets.add(tensor.dtype)
    return targets.pop() if len(targets) == 1 else None


def _decode(raw: bytes, dtype: str):
    """Float bytes as float32 values, exactly (every F16 and BF16 value is a float32 value)."""
    import numpy as np

    if dtype == "F32":
        return np.frombuffer(raw, "<f4")
    if dtype == "F16":
        return np.frombuffer(raw, "<f2").astype(np.float32)
    return (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32)


def encode(values, dtype: str) -> bytes:
    """float32 values in `dtype` as torch's `.to(dtype)` writes them: round to nearest, ties to even."""
    import numpy as np

    if dtype == "F32":
        return values.astype("<f4").tobytes()
    if dtype == "F16":
        with np.errstate(over="ignore"):  # past 65504: infinity, as torch
            return values.astype("<f2").tobytes()
    bits = values.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype("<u2")
    rounded[np.isnan(values)] = BF16_NAN
    return rounded.tobytes()


def read_header(path: str) -> dict[str, Tensor] | None:
    """name -> Tensor from a safetensors header (the one reader, format/safetensors.py); None when the file is
    not a readable safetensors file (the reload reports a damaged one, IV504)."""
    header = read_safetensors_header(path)
    if header is None:
        return None
    resolved = real_path(path)
    return {name: Tensor(resolved, e.dtype, e.shape, e.begin, e.end) for name, e in header.entries.items()}


def read_weights(paths: list[str]) -> dict[str, Tensor] | None:
    """The tensors of several shards together; None when one of them cannot be read or a name repeats."""
    merged: dict[str, Tensor] = {}
    for path in paths:
        tensors = read_header(path)
        if tensors is None or merged.keys() & tensors.keys():
            return None
        merged.update(tensors)
    return merged


def all_zero(tensor: Tensor) -> bool:
    """Every payload byte is 0 (+0.0 in any float format, 0 in any integer one)."""
    with open_binary(tensor.file) as fh:
        fh.seek(tensor.start)
        left = tensor.size
        while left > 0:
            chunk = fh.read(min(READ_CHUNK, left))
            if not chunk or chunk.count(0) != len(chunk):
                return False
            left -= len(chunk)
    return True


class Digests:
    """sha256 of each tensor's payload, computed at most once per (file, byte range) in one check."""

    def __init__(self):
        self._known: dict[tuple[str, int, int, str | None], str] = {}

    def of(self, tensor: Tensor, as_dtype: str | None = None) -> str:
        """The digest of the tensor's bytes, or of its values converted to `as_dtype` (a float format)."""
        target = as_dtype if as_dtype not in (None, tensor.dtype) else None
        key = (tensor.file, tensor.start, tensor.end, target)
        if key not in self._known:
            digest = hashlib.sha256()
            with open_binary(tensor.file) as fh:
                fh.seek(tensor.start)
                left = tensor.size
                while left > 0:
                    chunk = fh.read(min(READ_CHUNK, left))  # a whole number of items: READ_CHUNK is 4-aligned
                    if not chunk or (target and len(chunk) % FLOATS[tensor.dtype]):
                        break  # a file cut short since its header was read: its digest differs, nothing equal
                    digest.update(encode(_decode(chunk, tensor.dtype), target) if target else chunk)
                    left -= len(chunk)
            self._known[key] = digest.hexdigest()
        return self._known[key]

    def equal(self, one: WeightSet, other: WeightSet, converted: bool = False) -> bool:
        """Every tensor of `one` has the bytes of `other`'s tensor of that name (their signatures are equal),
        or, `converted` (see converted_to), the bytes of its values converted to `one`'s format. Smallest first:
        norms and biases change in any full fine-tune and cost almost nothing to read."""
        if not one.tensors or (one.layout != other.layout if converted else one.signature != other.signature):
            return False
        for name in sorted(one.tensors, key=lambda n: (one.tensors[n].size, n)):
            a, b = one.tensors[name], other.tensors[name]
            if (a.file, a.start) == (b.file, b.start):
                continue  # the same bytes on disk (a folder delivered twice, a link)
            if self.of(a) != self.of(b, a.dtype):  # b's bytes, or b converted to a's format
                return False
        return True
