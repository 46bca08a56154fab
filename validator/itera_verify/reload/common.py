"""What every loader shares, inside the reload child: the outcome it reports, safe torch.load, tensor checks.

Loaders know their library and report facts; the reload rules turn facts into findings.
"""
from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

from ..format import loaders as loader_table
from ..package.jsonread import read_json_file
from ..package.pickles import has_pickle_extension, scan_file, sniff

# Failure kinds, mapped to codes by rules/reload.py.
LOAD, BASE_UNAVAILABLE, MISSING, INCONSISTENT = "load", "base-unavailable", "missing-component", "inconsistent"
MISSING_LIBRARY = "missing-library"  # the loader's library is not installed here: nothing about the artifact

DTYPES = loader_table.DTYPES  # reload.json's dtype names (format/loaders.py)


class Stop(Exception):
    """A failure after which this loader cannot go on."""

    def __init__(self, failure: str | None, message: str, file: str | Path | None = None):
        super().__init__(message)
        self.failure, self.message, self.file = failure, message, file

    @classmethod
    def recorded(cls) -> "Stop":
        """Stop after problems already recorded on the outcome."""
        return cls(None, "")


class Outcome:
    """What one reload proved: its problems (each a failure kind and a message), facts, the forward pass."""

    def __init__(self, job: dict):
        self.job = job
        self.problems: list[dict] = []
        self.facts: dict[str, Any] = {}
        self.forward: str | None = None

    def fail(self, failure: str, message: str, file: str | Path | None = None, requirement: str | None = None) -> None:
        """`requirement`: the id of a format/layouts.py requirement this problem is (the static checks report the
        same id, and the rules say it once)."""
        problem = {"failure": failure, "message": message, "file": self.rel(file) if file else None}
        if requirement is not None:
            problem["requirement"] = requirement
        self.problems.append(problem)

    def unmet(self, need, folder: Path) -> None:
        """One unmet format/layouts.py requirement of the checkpoint in `folder`."""
        failure = MISSING if need.code == "IV507" else INCONSISTENT
        self.fail(failure, need.message, folder / need.file if need.file else folder, requirement=need.id)

    def rel(self, path: str | Path) -> str:
        """A path as the user knows it: relative to the package when it lies inside."""
        root = Path(self.job.get("package_root", "/")).resolve()
        try:
            return Path(path).resolve().relative_to(root).as_posix()
        except ValueError:
            return str(path)

    @property
    def ok(self) -> bool:
        return not self.problems


def require(job: dict, *modules: str, extra: str | None = None):
    """Import the loader's own libraries (format/loaders.py's row: `libraries`, or `modules`) in the reload child.
    One that cannot be imported stops the reload as MISSING_LIBRARY, naming the extra that installs it (the row's,
    or `extra`): a library missing on the reviewer's machine says nothing about the artifact (never IV504)."""
    import importlib

    from ..format.loaders import LOADERS

    row = LOADERS.get(job.get("loader"))
    names = modules or (row.libraries if row else ())
    imported = []
    for name in names:
        try:
            imported.append(importlib.import_module(name))
        except ImportError as exc:
            extra = extra or (row.extra if row and row.extra else name)
            raise Stop(MISSING_LIBRARY, f"the `{job.get('loader')}` loader needs {extra}, which is not installed "
                                        f"here ({exc.name or name} cannot be imported): "
                                        f"pip install 'itera-verify[{extra}]'") from None
    return imported[0] if len(imported) == 1 else imported


def torch_dtype(job: dict):
    """reload.json's `dtype` as a torch dtype; None keeps the stored one ('auto' or absent)."""
    import torch

    name = job.get("dtype")
    if name in (None, "", "auto"):
        return None
    if str(name).removeprefix("torch.") not in DTYPES:
        raise Stop(LOAD, f"reload.json dtype {name!r} is not one of {', '.join(sorted(set(DTYPES.values())))}")
    return getattr(torch, DTYPES[str(name).removeprefix("torch.")])


def numpy_rng_globals() -> list:
    """Exactly the numpy globals RNG states need (docs/format.md, Loaders: rng_state*.pth), under both numpy 1
    and numpy 2 names."""
    import numpy as np

    core = getattr(np, "_core", None) or np.core
    reconstruct = core.multiarray._reconstruct
    dtype_classes = [cls for name in dir(np.dtypes) if name.endswith("DType")
                     and isinstance(cls := getattr(np.dtypes, name), type)]
    return [reconstruct, (reconstruct, "numpy.core.multiarray._reconstruct"),
            (reconstruct, "numpy._core.multiarray._reconstruct"), np.ndarray, np.dtype, *dtype_classes]


def scan_or_refuse(path: Path, outcome: Outcome):
    """Scan a pickle right before it is loaded; refuse anything unsafe, unscannable or not a pickle."""
    result = scan_file(path)
    if not result.loadable:
        raise Stop(LOAD, f"refused to load {outcome.rel(path)}: it {result.refusal()}"
                   + (" (IV506)" if result.unsafe else ""), path)
    return result


def safe_torch_load(path: Path, outcome: Outcome, device):
    """torch.load after a clean scan, always weights_only=True; numpy globals only when the file names them."""
    import contextlib

    import torch

    result = scan_or_refuse(path, outcome)
    registered = record_globals(result.globals)
    context = torch.serialization.safe_globals(registered) if registered else contextlib.nullcontext()
    try:
        with context:
            return torch.load(path, map_location=device, weights_only=True)
    except Exception as exc:  # torch raises many types for damaged files
        raise Stop(LOAD, f"{outcome.rel(path)} does not load: {short(exc)}", path) from exc


def record_globals(names) -> list:
    """What torch's weights_only unpickler must admit beyond its own: the numpy globals of RNG states and the
    DeepSpeed records (as inert stand-ins), only when the scanned file names them."""
    from .records import deepspeed_globals

    registered = []
    if any(name.startswith("numpy.") for name in names):
        registered += numpy_rng_globals()
    if any(name.startswith("deepspeed.") for name in names):
        registered += deepspeed_globals()
    return registered


def scan_folder(folder: Path, outcome: Outcome) -> None:
    """Before a library loads from a folder (transformers reads pytorch_model.bin itself), scan its pickles."""
    for path in sorted(p for p in Path(folder).rglob("*") if p.is_file()):
        if path.name == "training_args.bin":
            continue  # never loaded by anyone here; the static IV506 scan judges it
        if has_pickle_extension(path) or sniff(path) in ("pickle", "zip"):
            result = scan_file(path)
            if result.is_pickle and not result.loadable:
                raise Stop(LOAD, f"refused to load {outcome.rel(path)}: it {result.refusal()}", path)


def read_json_document(path: Path, outcome: "Outcome", missing_failure: str = LOAD, missing_why: str = "") -> Any:
    """A JSON document of the artifact (the one bounded reader), or Stop: missing (`missing_failure`, the
    message ending in `missing_why`) or not parsing (LOAD). The caller judges the value's shape."""
    try:
        return read_json_file(path)
    except FileNotFoundError:
        raise Stop(missing_failure, f"{outcome.rel(path)} is missing{missing_why}", path) from None
    except (OSError, ValueError) as exc:
        raise Stop(LOAD, f"{outcome.rel(path)} does not parse: {short(exc)}", path) from exc


def short(exc: BaseException, limit: int = 400) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[:limit] + "…"


# The 8-bit and 4-bit float formats, judged by their bit patterns (torch.isfinite is not implemented for most
# of them, and for float8_e8m0fnu it answers True on its NaN byte 0xFF): dtype name -> (mask, value) such that
# a byte is NaN or infinite exactly when byte & mask == value. None: the format has no NaN and no infinity.
SMALL_FLOAT_NONFINITE = {
    "float8_e4m3fn": (0x7F, 0x7F),  # NaN: S.1111.111 (no infinity)
    "float8_e5m2": (0x7C, 0x7C),  # exponent all ones: infinity (mantissa 0) or NaN
    "float8_e8m0fnu": (0xFF, 0xFF),  # NaN: 0xFF (an exponent only: no sign, no zero, no infinity)
    "float8_e4m3fnuz": (0xFF, 0x80),  # NaN: the negative zero pattern, the only one
    "float8_e5m2fnuz": (0xFF, 0x80),
    "float4_e2m1fn_x2": None,  # two 4-bit values per byte, every pattern a finite number
}


# Elements per slice of the exact count: its boolean mask stays at 16 MiB, whatever the tensor's size.
COUNT_SLICE = 1 << 24


def nonfinite_count(tensor) -> int:
    import torch

    if not (tensor.is_floating_point() or tensor.is_complex()) or tensor.numel() == 0:
        return 0
    name = str(tensor.dtype).removeprefix("torch.")
    if name in SMALL_FLOAT_NONFINITE:
        pattern = SMALL_FLOAT_NONFINITE[name]
        if pattern is None:
            return 0
        mask, value = pattern
        return sum(int(((part.view(torch.uint8) & mask) == value).sum()) for part in _slices(tensor))
    if tensor.dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        # A NaN or an infinity makes the sum non-finite, and a finite sum needs every term finite: one summing
        # pass proves a clean tensor. Summed in its own dtype, which allocates nothing (`dtype=float32` copies a
        # bf16 tensor whole: 128 MiB more host peak for a 32k x 1k embedding) and is 10x faster; a sum that
        # overflows (fp16 past 65504) only sends the tensor to the exact count below.
        if bool(torch.isfinite(tensor.sum())):
            return 0
    try:
        return sum(int((~torch.isfinite(part)).sum()) for part in _slices(tensor))
    except (NotImplementedError, RuntimeError):  # another narrow type: widen first, a NaN stays a NaN
        return sum(int((~torch.isfinite(part.float())).sum()) for part in _slices(tensor))


def _slices(tensor):
    """The tensor's elements in slices of COUNT_SLICE, so no temporary is ever as large as the tensor."""
    flat = tensor.contiguous().view(-1)
    return flat.split(COUNT_SLICE)


def check_parameters(model, outcome: Outcome, label: str) -> None:
    """Every parameter and buffer materialised (not on the meta device) and finite."""
    bad, meta, count = [], [], 0
    for name, tensor in list(model.named_parameters()) + list(model.named_buffers()):
        count += 1
        if tensor.device.type == "meta":
            meta.append(name)
        elif nonfinite_count(tensor):
            bad.append(f"{name} ({nonfinite_count(tensor)} non-finite)")
    outcome.facts[f"{label}_tensors"] = count
    if meta:
        raise Stop(LOAD, f"{label}: {len(meta)} tensor(s) never materialised: {', '.join(meta[:5])}")
    if bad:
        raise Stop(LOAD, f"{label}: non-finite weights in {', '.join(bad[:5])}"
                   + (f" and {len(bad) - 5} more" if len(bad) > 5 else ""))


def forward_pass(model, device) -> str:
    """One forward pass on a few token ids; the logits must be finite. Models without token input say so."""
    import torch

    config = getattr(model, "config", None)
    vocab = getattr(config, "vocab_size", None)
    try:
        accepts_ids = "input_ids" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        accepts_ids = False
    if not accepts_ids or not isinstance(vocab, int) or vocab < 1:
        return f"not run: {type(model).__name__} takes no token ids"
    ids = (torch.arange(8, device=device) % vocab).unsqueeze(0)
    inputs = {"input_ids": ids}
    if getattr(config, "is_encoder_decoder", False):
        inputs["decoder_input_ids"] = ids
    try:
        with torch.no_grad():
            output = model(**inputs)
    except Exception as exc:
        raise Stop(LOAD, f"forward pass failed: {short(exc)}") from exc
    values = getattr(output, "logits", None)
    if values is None:
        values = getattr(output, "last_hidden_state", None)
    if values is None and isinstance(output, (tuple, list)) and output:
        values = output[0]
    if not torch.is_tensor(values):
        return "ran, no tensor output to check"
    bad = nonfinite_count(values)
    if bad:
        raise Stop(LOAD, f"forward pass gave {bad} non-finite value(s) out of {values.numel()}")
    return f"finite output {tuple(values.shape)} {str(values.dtype).removeprefix('torch.')}"
