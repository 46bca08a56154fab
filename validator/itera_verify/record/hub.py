"""The 40-hex commit a base model was really loaded from, read from the local Hugging Face hub cache.

Layout (what huggingface_hub writes): `models--{org}--{name}/refs/{branch}` holds a commit, and
`snapshots/{commit}/` the files. A branch or tag is never a pin (IV501): it is resolved to its commit here."""
from __future__ import annotations

import os
import re
from pathlib import Path

from ..runtime.hfcache import resolve_hf_cache
from ..model import UsageError
from .errors import RecordError

COMMIT = re.compile(r"^[0-9a-f]{40}$")


def hub_cache_dir(cache_dir: str | os.PathLike | None = None) -> Path:
    """The hub cache, found as the checker finds it (SPEC §6 --hf-cache): `cache_dir` (a hub cache or an
    HF_HOME), else HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub."""
    try:
        return resolve_hf_cache(cache_dir)
    except UsageError as exc:
        raise RecordError(str(exc).replace("--hf-cache", "hub cache")) from None


def repo_folder(repo_id: str, cache_dir: str | os.PathLike | None = None) -> Path:
    return hub_cache_dir(cache_dir) / ("models--" + repo_id.replace("/", "--"))


def resolve_commit(repo_id: str, revision: str | None = None,
                   cache_dir: str | os.PathLike | None = None) -> str:
    """The commit of `repo_id` at `revision` (a commit, a branch or a tag; default `main`) in the local cache.

    Refused when the cache does not hold that snapshot: a reviewer could not reload the adapter either."""
    if not isinstance(repo_id, str) or not re.fullmatch(r"[\w.-]+(/[\w.-]+)?", repo_id):
        raise RecordError(f"base model {repo_id!r} is not a hub id (org/name): an adapter's base must be a "
                          "hub id at a pinned revision, never a local path (IV502)")
    repo = repo_folder(repo_id, cache_dir)
    revision = revision or "main"
    if COMMIT.match(revision):
        commit = revision
    else:
        ref = repo / "refs" / revision
        try:
            commit = ref.read_text(encoding="utf-8").strip()
        except OSError:
            raise RecordError(f"{repo_id}: the hub cache {hub_cache_dir(cache_dir)} has no ref {revision!r}; "
                              "load the base with cache_dir= pointing at the cache it came from, or pass its "
                              "40-hex commit") from None
        if not COMMIT.match(commit):
            raise RecordError(f"{ref} does not hold a 40-hex commit")
    if not (repo / "snapshots" / commit).is_dir():
        raise RecordError(f"{repo_id}@{commit}: no such snapshot in the hub cache {hub_cache_dir(cache_dir)}")
    return commit


def loaded_commit(model) -> str | None:
    """The commit transformers recorded when it loaded `model` (a PeftModel's base included), if any."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    commit = getattr(getattr(base, "config", None), "_commit_hash", None)
    return commit if isinstance(commit, str) and COMMIT.match(commit) else None
