"""Artifacts of a run: where they lie in the package, their kind, their reload.json entry, and for an adapter
the base model pinned to the commit it was really loaded from."""
from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

from ..format import loaders as loader_table
from ..format.loaders import KINDS
from ..package.artifact_identity import on_disk
from .errors import RecordError
from .facts_check import refuse_stale_params
from .files import exists, read_bytes, write_json
from .lock import package_lock
from .hub import COMMIT, loaded_commit, resolve_commit
from .ids import check_id
from .snapshots import rewrite_snapshot_paths
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


def identified(root: Path, rel: str, kind: str | None, loader: str | None) -> tuple[str, str]:
    """(kind, loader) of the artifact at `rel`: what its files are (format/artifact_kinds.py, the reading IV510
    makes), checked against a kind or loader the caller named. Refused where they cannot prove the files, as
    the checker would refuse the package (IV510)."""
    identity = on_disk(root / rel, rel)
    if kind is None and identity is None:
        raise RecordError(f"{rel}: its files do not say what it is; pass kind= (one of {', '.join(KINDS)})")
    if kind is None:
        kind = identity.kind
    if kind not in KINDS:
        raise RecordError(f"artifact kind {kind!r}: one of {', '.join(KINDS)}")
    if loader is None:
        loader = identity.loader if identity is not None and identity.kind == kind else \
            loader_table.recorder_default(kind) or resume_loader(root / rel)
    if identity is not None and not identity.proven_by(loader):
        raise RecordError(f"{rel} is {identity.what}: loader {loader!r} (kind {kind!r}) cannot prove it; "
                          f"register it as kind {identity.kind!r}" + (f" at {identity.path}" if identity.path else "")
                          + f" (loader {identity.loader!r}), or leave kind= out (IV510)")
    return kind, loader


def register(run: RunRecord, path, kind: str | None, artifact_id: str | None, loader: str | None,
             reload_fields: dict, base: dict | None = None) -> str:
    rel = package_path(run.root, path)
    kind, loader = identified(run.root, rel, kind, loader)
    if kind == "diffusers-lora" and base is None:
        raise RecordError(f"{rel}: a diffusers LoRA is proven on its base pipeline; pass base={{'name': ORG/NAME, "
                          "'revision': COMMIT}} (or run.adapter(path, base=..., revision=...)) (IV505)")
    artifact_id = check_id("artifact id", artifact_id or f"{run.id}-{ID_SUFFIX.get(kind, Path(rel).name)}")
    if not run.writer:
        return artifact_id
    # The artifact's own records (training_args.bin, adapter_config.json, ...) against the run's params (IV514).
    refuse_stale_params(run.root, f"params/{run.id}.json", rel, kind)
    _, by_hand = rewrite_snapshot_paths(run.root, rel)
    if by_hand:
        warnings.warn(f"{by_hand[0]}: save_pretrained recorded a path of this machine; write the model's hub id "
                      f"there (IV201/IV202){f' ({len(by_hand) - 1} more)' if len(by_hand) > 1 else ''}",
                      stacklevel=3)
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


def pinned_base(base, revision: str | None = None, cache_dir=None) -> dict:
    """The manifest's `base` of an artifact that is proven on a base (a diffusers LoRA): the hub id at the
    40-hex commit of the local hub cache, where the checker reads it. `base` is a hub id or {"name", "revision"}."""
    if isinstance(base, dict):
        base, revision = base.get("name"), base.get("revision", revision)
    if not isinstance(base, str):
        raise RecordError(f"base {base!r}: give the base's hub id (org/name) and its revision")
    return {"name": base, "revision": resolve_commit(base, revision, cache_dir)}


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
    identity = on_disk(run.root / rel, rel)
    if identity is not None and identity.kind == "diffusers-lora":
        # A LoRA file of a diffusers pipeline: its base goes into the manifest, where the checker reads it.
        return register(run, rel, "diffusers-lora", artifact_id, None, reload_fields,
                        base=pinned_base(base, revision, cache_dir))
    config_rel = f"{rel}/adapter_config.json"
    if not (run.root / rel).is_dir() or not exists(run.root, config_rel):
        what = identity.what if identity is not None else "not a PEFT adapter folder"
        raise RecordError(f"{rel} holds no adapter_config.json ({what}): save the adapter with "
                          "model.save_pretrained(folder) first, or register it with run.artifact(path)")
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
