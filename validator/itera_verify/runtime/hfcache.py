"""Where the local Hugging Face hub cache is (--hf-cache; docs/format.md)."""
from __future__ import annotations

import os
from pathlib import Path

from ..model import UsageError
from .environment import Environment


def resolve_hf_cache(given: str | os.PathLike | None, environment: Environment) -> Path:
    """The hub cache folder (the one holding `models--org--name/`).

    A folder with a `hub/` subfolder is taken as an HF_HOME. Default: HF_HUB_CACHE, else HF_HOME/hub,
    else ~/.cache/huggingface/hub (of `environment`, the run's, read at its entry point). An explicit folder that
    does not exist is a usage error.
    """
    if given is not None:
        path = Path(given).expanduser().absolute()  # reload children run elsewhere: no relative paths
        if not path.is_dir():
            raise UsageError(f"--hf-cache {given}: no such folder")
        return path / "hub" if (path / "hub").is_dir() and not any(path.glob("models--*")) else path
    return environment.hub_cache
