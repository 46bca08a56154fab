"""Artifacts of a run: where they lie in the package, their kind, their reload.json entry, and for an adapter
the base model pinned to the commit it was really loaded from."""
from __future__ import annotations

import json
import os
from pathlib import Path

from ..format import loaders as loader_table
from ..format.loaders import KINDS
from .errors import RecordError
from .facts_check import refuse_stale_params
from .files import exists, read_bytes, write_json
from .lock import package_lock
from .hub import COMMIT, loaded_commit, resolve_commit
from .ids import check_id
from .store import EVAL_IDS, MANIFEST, RELOAD, transaction
from .handle import RunRecord


ID_SUFFIX = {"safetensors": "weights", "transformers-model": "model", "peft-adapter": "adapter",
             "diffusers-pipeline": "pipeline", "timm-model": "model", "sentence-transformers-model": "model",
             "gguf": "gguf", "onnx": "onnx"}


def package_path(root: Path, path) -> str:
    """`path` (absolute, or relative to the package root) as a package-relative "/" path; it must exist and
    lie inside the package (IV106, IV205)."""
    given = Path(path)
    absolute = given if given.is_absolute() else root / given
    try:
        rel = Path(os.path.realpath(absolute)).relative_to(os.path.realpath(root))
    except ValueError:
        raise RecordError(f"{path} lies outside the package {root}: save artifacts inside it "
                          "(e.g. output_dir=<package>/checkpoints/<run>)") from None
    if not absolute.exists():
        raise RecordError(f"artifact {path} does not exist")
    if str(rel) == ".":
        raise RecordError("an artifact cannot be the whole package")
    return rel.as_posix()


def resume_loader(folder: Path) -> str:
    if folder.is_dir() and (folder / "trainer_state.json").is_file():
        return "hf-trainer-checkpoint"
    if folder.is_file() and loader_table.file_loader_for(folder.suffix):
        return loader_table.file_loader_for(folder.suffix)
    raise RecordError(f"{folder}: a resume checkpoint is a Trainer checkpoint-N/ folder or a torch-resume .pt "
                      "file; pass loader= for another form")


def register(run: RunRecord, path, kind: str, artifact_id: str | None, loader: str | None, reload_fields: dict,
             base: dict | None = None) -> str:
    if kind not in KINDS:
        raise RecordError(f"artifact kind {kind!r}: one of {', '.join(KINDS)}")
    rel = package_path(run.root, path)
    if loader is None:
        loader = loader_table.recorder_default(kind) or resume_loader(run.root / rel)
    artifact_id = check_id("artifact id", artifact_id or f"{run.id}-{ID_SUFFIX.get(kind, Path(rel).name)}")
    if not run.writer:
        return artifact_id
    # The artifact's own records (training_args.bin, adapter_config.json, ...) against the run's params (IV514).
    refuse_stale_params(run.root, f"params/{run.id}.json", rel, kind)
    entry = {"id": artifact_id, "run": run.id, "kind": kind, "path": rel}
    if base is not None:
        entry["base"] = base
    with transaction(run.root) as tx:
        manifest = tx.get(MANIFEST)
        listed = manifest.setdefault("artifacts", [])
        for old in listed:
            if old.get("id") == artifact_id and old.get("run") != run.id:
                raise RecordError(f"artifact id {artifact_id!r} belongs to run {old.get('run')!r}")
        # Registering an id again replaces it (a model saved once more).
        listed[:] = [a for a in listed if a.get("id") != artifact_id] + [entry]
        tx.get(RELOAD)["artifacts"][artifact_id] = {"loader": loader, **reload_fields}
    return artifact_id


def forget_missing(run: RunRecord, kind: str) -> list[str]:
    """Drop the run's artifacts of `kind` whose files are gone (the Trainer's save_total_limit rotation)."""
    if not run.writer:
        return []
    with transaction(run.root) as tx:
        manifest = tx.get(MANIFEST)
        gone = [a["id"] for a in manifest.get("artifacts", []) if a.get("run") == run.id
                and a.get("kind") == kind and not (run.root / a["path"]).exists()]
        if gone:
            manifest["artifacts"] = [a for a in manifest["artifacts"] if a.get("id") not in gone]
            for artifact_id in gone:
                tx.get(RELOAD)["artifacts"].pop(artifact_id, None)
    return gone


def register_adapter(run: RunRecord, path, base: str, model, revision: str | None, cache_dir,
                     artifact_id: str | None, reload_fields: dict) -> str:
    rel = package_path(run.root, path)
    config_rel = f"{rel}/adapter_config.json"
    if not exists(run.root, config_rel):
        raise RecordError(f"{rel} holds no adapter_config.json: save the adapter (model.save_pretrained) first")
    commit = loaded_commit(model) if model is not None else None
    if commit is not None and revision is not None and COMMIT.fullmatch(revision) and revision != commit:
        raise RecordError(f"the base was loaded from commit {commit}, not {revision}")
    pinned = resolve_commit(base, commit or revision, cache_dir)
    if run.writer:
        with package_lock(run.root):  # every atomic write holds the lock (a reopen removes stale temporaries)
            config = json.loads(read_bytes(run.root, config_rel))  # as it is now, under the lock
            if config.get("base_model_name_or_path") != base or config.get("revision") != pinned:
                # PEFT writes revision null (and a local path when the base was loaded from one): IV501-IV503.
                config.update(base_model_name_or_path=base, revision=pinned)
                write_json(run.root, config_rel, config)
    return register(run, rel, "peft-adapter", artifact_id, "peft", reload_fields,
                    base={"name": base, "revision": pinned})


def missing_predictions(root: Path, rel: str) -> str | None:
    """What keeps a predictions file from covering the frozen eval ids exactly once, or None (IV303)."""
    frozen = set(read_bytes(root, EVAL_IDS).decode("utf-8").splitlines())
    try:
        written = read_bytes(root, rel)
    except FileNotFoundError:
        return f"no predictions written ({len(frozen)} eval ids)"
    seen: set[str] = set()
    for line in written.splitlines():
        if line.strip():
            try:
                seen.add(json.loads(line)["id"])
            except (ValueError, KeyError, TypeError):
                return f"{rel} holds a line that is no prediction record"
    missing = sorted(frozen - seen)
    if missing:
        return f"{len(missing)} eval ids have no prediction (first: {', '.join(missing[:3])})"
    return None
