"""The reload phase: every artifact reloaded for real, each in a fresh child process, on the chosen device."""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from ..model import UsageError
from .confine import MODES as CONFINE_MODES, check_mode as check_confinement
from .runner import prestart, run_reloads
from .warm import warm_zygotes

DEVICES = ("auto", "cuda", "cpu")


def resolve_device(requested: str) -> str:
    """'cuda' or 'cpu'. auto = CUDA when torch sees a GPU; --device cuda without one is a usage error (exit 2).
    A torch built for the CPU alone sees none: `auto` then says so without importing torch here (2 s of this
    process that the reloads' own zygote imports anyway)."""
    if requested not in DEVICES:
        raise UsageError(f"--device {requested}: choose one of {', '.join(DEVICES)}")
    if requested == "cpu" or (requested == "auto" and torch_build() == "cpu"):
        return "cpu"
    import torch

    if torch.cuda.is_available():
        return "cuda"
    if requested == "auto":
        return "cpu"
    why = (f"this torch ({torch.__version__}) is built without CUDA" if torch.version.cuda is None
           else "torch sees no GPU (check nvidia-smi and CUDA_VISIBLE_DEVICES)")
    raise UsageError(f"--device cuda: no CUDA GPU available: {why}; use --device cpu or auto")


# torch/version.py's `cuda` and `hip` lines: None in a build for the CPU alone (then no GPU is ever visible).
_BUILT_FOR = re.compile(r"^(cuda|hip)\b[^=\n]*=\s*(.+?)\s*$", re.M)


def torch_build() -> str | None:
    """"cpu" when the installed torch was built for the CPU alone (read from its version file, not imported);
    None when it has CUDA or ROCm, or the file cannot say."""
    try:
        spec = importlib.util.find_spec("torch")
        folder = list(spec.submodule_search_locations or [])[0] if spec is not None else None
        text = (Path(folder) / "version.py").read_text(encoding="utf-8") if folder else ""
    except (ImportError, ValueError, IndexError, OSError):
        return None
    return "cpu" if built_for_cpu_alone(text) else None


def built_for_cpu_alone(version_file: str) -> bool:
    found = dict(_BUILT_FOR.findall(version_file))
    return set(found) == {"cuda", "hip"} and set(found.values()) == {"None"}


__all__ = ["CONFINE_MODES", "check_confinement", "prestart", "resolve_device", "run_reloads", "warm_zygotes"]
