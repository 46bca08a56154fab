"""The hub-cache snapshot path diffusers' (and transformers') save_pretrained writes into each component's
config.json as `_name_or_path` when the base was loaded from the hub: on a rented box, under /tmp or the
renter's home (IV201, IV202). The recorder writes the hub id in its place when it registers the artifact."""
from __future__ import annotations

import json
import os
from pathlib import Path

from ..format.names import NAME_OR_PATH, snapshot_repo
from .errors import RecordError
from .files import read_bytes, write_json
from .lock import package_lock

# The documents save_pretrained writes a `_name_or_path` into: a model's config.json, a pipeline's
# model_index.json, a scheduler's or processor's *_config.json, sentence-transformers' own.
CONFIG_NAMES = ("config.json", "model_index.json", "config_sentence_transformers.json")
MAX_CONFIGS = 256  # a pipeline has a handful of components; a folder with more configs is not one model
MAX_DEPTH = 3  # component/config.json, sentence-transformers' 0_Transformer/config.json


def _configs(root: Path, rel: str) -> list[str]:
    folder = root / rel
    if not folder.is_dir() or folder.is_symlink():
        return []
    found = []
    for here, dirs, names in os.walk(folder):
        depth = len(Path(here).relative_to(folder).parts)
        dirs[:] = [] if depth >= MAX_DEPTH else [d for d in sorted(dirs) if not os.path.islink(os.path.join(here, d))]
        for name in sorted(names):
            if name in CONFIG_NAMES or name.endswith("_config.json"):
                found.append(Path(here, name).relative_to(root).as_posix())
        if len(found) >= MAX_CONFIGS:
            break
    return found[:MAX_CONFIGS]


def rewrite_snapshot_paths(root: Path, rel: str, writer: bool = True) -> tuple[list[str], list[str]]:
    """In every config of the artifact folder `rel`: a `_name_or_path` that is a hub-cache snapshot path becomes
    its hub id. Returns (the configs rewritten, what remains to fix by hand: an absolute `_name_or_path` of no
    snapshot, named with the file)."""
    rewritten, by_hand = [], []
    for config_rel in _configs(root, rel):
        with package_lock(root):
            try:
                value = json.loads(read_bytes(root, config_rel))
            except (OSError, ValueError, RecordError):
                continue  # not a readable JSON object: the checker says what it is
            recorded = value.get(NAME_OR_PATH) if isinstance(value, dict) else None
            if not isinstance(recorded, str) or not os.path.isabs(recorded):
                continue
            snapshot = snapshot_repo(recorded)
            if snapshot is None:
                by_hand.append(f"{config_rel}: {NAME_OR_PATH} {recorded!r}")
                continue
            value[NAME_OR_PATH] = snapshot[0]
            if writer:
                write_json(root, config_rel, value)
            rewritten.append(config_rel)
    return rewritten, by_hand
