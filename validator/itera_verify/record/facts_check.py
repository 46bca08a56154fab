"""What the recorder checks so that it writes nothing the checker would find untrue (IV514, IV516).

Before an artifact is registered, the run's params file is compared with the artifact's own records, read as
the rules read them (package/records.py) and compared by the same table (format/facts.py): a params file that
says another learning rate, seed or LoRA rank than the run that made the artifact is refused, before the
manifest names the artifact. The callbacks also use it at train begin: a value the user declared that the
training arguments override is written as the Trainer ran it, and said; two keys declaring one fact with two
values are refused before the first step. Plain arguments only (paths, dicts): no Run here.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..format import facts as table
from ..package.jsonread import read_json_file
from ..package.records import DiskFolder, MAX_RECORD_JSON, read_records
from .errors import RecordError

CHECKPOINT = "resume-checkpoint"


def stale_params(params: dict, folder: str | os.PathLike, *, checkpoint: bool) -> list[str]:
    """One sentence per fact the params declare that the artifact folder records otherwise."""
    folder = Path(folder)
    if not folder.is_dir() or not isinstance(params, dict):
        return []
    records = read_records(DiskFolder(folder), checkpoint=checkpoint)
    return [f"declares {d.key} = {table.shown(d.declared)}, but {folder.name}/{d.record.file} records "
            f"{d.record.field} = {table.shown(d.recorded)}"
            for d in table.disagreements(params, records, table.PARAMS_FACTS)]


def refuse_stale_params(root: str | os.PathLike, params_rel: str, artifact_rel: str, kind: str) -> None:
    """RecordError when the params file at `params_rel` disagrees with what the artifact at `artifact_rel` (both
    relative to the package `root`) records of the run that made it."""
    root = Path(root)
    try:
        params = read_json_file(root / params_rel, max_bytes=MAX_RECORD_JSON)
    except (OSError, ValueError):
        return  # no params written yet (a run registered before it started): nothing declared to compare
    found = stale_params(params, root / artifact_rel, checkpoint=kind == CHECKPOINT)
    if found:
        more = f" (and {len(found) - 1} more: {'; '.join(found[1:3])})" if len(found) > 1 else ""
        raise RecordError(f"{params_rel} {found[0]}{more}: the params are not those of the run that made "
                          f"{artifact_rel}; record that run under its own id with the params it used "
                          "(campaign.run(..., params=...)), or save the artifact of this run")


def conflicting_declarations(params: dict) -> list[str]:
    """Facts two keys of one params file declare with two values (`lora_r` 16 and `peft.default.r` 8)."""
    found = []
    for row in table.PARAMS_FACTS:
        values = table.declared_values(params, row)
        for key, value in values[1:]:
            if not table.same_declaration(row, values[0][1], value):
                found.append(f"{values[0][0]} = {table.shown(values[0][1])} and {key} = {table.shown(value)} "
                             f"(the {row.name})")
    return found


def overridden(given: dict, recorded: dict) -> list[str]:
    """Keys the user gave whose value the training arguments replace: what the params will say instead."""
    changed = []
    for key, value in given.items():
        if key in recorded and recorded[key] is not None and value is not None and not _same(key, value,
                                                                                              recorded[key]):
            changed.append(f"{key} {table.shown(value)} -> {table.shown(recorded[key])}")
    return changed


def _same(key: str, one: Any, other: Any) -> bool:
    row = next((r for r in table.PARAMS_FACTS if key in r.keys), None)
    return table.same_declaration(row, one, other) if row is not None else one == other


def base_vocab_size(repo_id: str, revision: str | None, cache_dir: str | os.PathLike | None) -> int | None:
    """The base's vocabulary (its config.json `vocab_size`) from the local hub cache, when it holds it."""
    from .hub import repo_folder, resolve_commit

    try:
        commit = resolve_commit(repo_id, revision, cache_dir)
        config = read_json_file(repo_folder(repo_id, cache_dir) / "snapshots" / commit / table.CONFIG,
                                max_bytes=MAX_RECORD_JSON)
    except (RecordError, OSError, ValueError):
        return None
    vocab = next((value for _, value in table.declared_values(config, table.fact("vocabulary size"))), None)
    return vocab if isinstance(vocab, int) and not isinstance(vocab, bool) and vocab > 0 else None
