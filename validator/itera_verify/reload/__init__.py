"""The reload phase: every artifact reloaded for real, each in a fresh child process, on the chosen device."""
from __future__ import annotations

from ..model import UsageError
from .confine import MODES as CONFINE_MODES, check_mode as check_confinement
from .runner import prestart, run_reloads
from .warm import warm_zygotes

DEVICES = ("auto", "cuda", "cpu")


def resolve_device(requested: str) -> str:
    """'cuda' or 'cpu'. auto = CUDA when torch sees a GPU; --device cuda without one is a usage error (exit 2)."""
    if requested not in DEVICES:
        raise UsageError(f"--device {requested}: choose one of {', '.join(DEVICES)}")
    if requested == "cpu":
        return "cpu"
    import torch

    if torch.cuda.is_available():
        return "cuda"
    if requested == "auto":
        return "cpu"
    why = (f"this torch ({torch.__version__}) is built without CUDA" if torch.version.cuda is None
           else "torch sees no GPU (check nvidia-smi and CUDA_VISIBLE_DEVICES)")
    raise UsageError(f"--device cuda: no CUDA GPU available: {why}; use --device cpu or auto")


__all__ = ["CONFINE_MODES", "check_confinement", "prestart", "resolve_device", "run_reloads", "warm_zygotes"]
