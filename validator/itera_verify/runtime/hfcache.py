"""Where the local Hugging Face hub cache is (--hf-cache; docs/format.md)."""
from __future__ import annotations

import os
from pathlib import Path

from ..format.names import HUB_ID, PINNED_REVISION
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


def repo_folder(cache: Path, repo_id: str) -> Path:
    """Where huggingface_hub keeps `org/name` in a hub cache: `models--org--name/` (refs/, snapshots/, blobs/)."""
    return cache / ("models--" + repo_id.replace("/", "--"))


def snapshot_folder(cache: Path, repo_id: str, revision: str) -> Path | None:
    """The cached snapshot of `repo_id` at a commit, or at the commit a cached ref (branch, tag) names; None when
    the cache does not hold it (or the names are not a hub id and a revision)."""
    if not HUB_ID.fullmatch(repo_id) or "/" in revision or revision in ("", ".", ".."):
        return None
    repo = repo_folder(cache, repo_id)
    commit = revision
    if not PINNED_REVISION.fullmatch(revision):
        try:
            commit = (repo / "refs" / revision).read_text(encoding="utf-8").strip()
        except OSError:
            return None
        if not PINNED_REVISION.fullmatch(commit):
            return None
    folder = repo / "snapshots" / commit
    return folder if folder.is_dir() else None
