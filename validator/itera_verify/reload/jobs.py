"""What each reload child is asked to do: one job per artifact, planned from the package (its reload.json
entry, the run's params, the pickle scan), or the result already known when there is nothing to run (no
loader, a path leaving the package, a payload the static scan refused)."""
from __future__ import annotations

import os
from pathlib import Path

from ..model import ReloadResult
from ..package import RunContext
from ..package.artifact_identity import in_package
from ..package.campaign import fp16_run, recorded_world_size
from ..package.pickles import scan_package
from ..format import loaders as loader_table
from .loaders import LOADERS
from .limits import memory_limit
from .placement import weight_bytes


def _text(value) -> str | None:
    return value if isinstance(value, str) else None


def _config_folder(ctx: RunContext, entry: dict) -> str | None:
    """reload.json `config`: a model folder inside the package whose config.json builds the model (or None)."""
    rel = ctx.inventory.normalise_ref(entry["config"]) if isinstance(entry.get("config"), str) else None
    if rel is None:
        return None
    root, real = os.path.realpath(ctx.inventory.root), os.path.realpath(ctx.inventory.abspath(rel))
    return real if real.startswith(root + os.sep) and os.path.isdir(real) else None


def _refused_by_scan(ctx: RunContext, rel: str) -> str | None:
    """The first unsafe pickle inside the artifact: nothing is loaded from a folder that carries a payload."""
    for path, result in sorted(scan_package(ctx).items()):
        if (path == rel or path.startswith(rel.rstrip("/") + "/")) and result.unsafe:
            return f"refused: {path} names {', '.join(result.unsafe[:3])} (IV506); nothing of this artifact was loaded"
    return None


def _leaving_link(ctx: RunContext, rel: str) -> str | None:
    """A link inside the artifact that leaves the package: its data is not part of what is delivered."""
    for path, link in sorted(ctx.inventory.links.items()):
        if (path == rel or path.startswith(rel.rstrip("/") + "/")) and not link.inside:
            return (f"refused: {path} links outside the package ({link.target}); the artifact must reload from the "
                    "package alone")
    return None


def reload_entry(ctx: RunContext, artifact: dict) -> tuple[dict | None, str | None]:
    """The artifact's reload.json entry and the loader it names (None where either is missing)."""
    entries = ctx.documents.reload_spec.get("artifacts") if isinstance(ctx.documents.reload_spec, dict) else None
    entry = entries.get(_text(artifact.get("id")) or "?") if isinstance(entries, dict) else None
    return (entry, _text(entry.get("loader"))) if isinstance(entry, dict) else (None, None)


def plan(ctx: RunContext, artifact: dict, device: str, threads: int,
         configured_limit: int | None = None) -> dict | ReloadResult:
    """The child's job for one artifact, or the result already known when there is nothing to run.
    `configured_limit`: the host memory limit of every child (ITERA_RELOAD_HOST_MEMORY), else one from its size."""
    artifact_id = _text(artifact.get("id")) or "?"
    entry, loader = reload_entry(ctx, artifact)
    result = ReloadResult(artifact_id, loader or "", kind=_text(artifact.get("kind")) or "",
                          path=_text(artifact.get("path")) or "", device=device)
    if loader not in LOADERS:
        result.failure = "no-loader"  # IV510 reports it; nothing to run
        result.error = f"no usable reload.json loader ({loader!r})"
        return result
    rel = ctx.inventory.normalise_ref(result.path) if result.path else None
    root = os.path.realpath(ctx.inventory.root)
    real = os.path.realpath(ctx.inventory.abspath(rel)) if rel is not None else ""
    if rel is None or not (real == root or real.startswith(root + os.sep)):
        result.failure, result.error = "skipped", f"path {result.path!r} leaves the package; nothing loaded from it"
        return result
    if not os.path.exists(real):
        result.failure, result.error = "load", f"{rel} does not exist"
        return result
    identity = in_package(ctx, rel)
    if identity is not None and not identity.proven_by(loader):
        # IV510 names what the files are and the loader that proves them: a reload by this one would blame the
        # artifact for the declaration (IV504), or pass on a weaker check.
        result.failure = "no-loader"
        result.error = f"loader {loader!r} cannot prove {identity.what}: use {identity.loader!r} (IV510)"
        return result
    refusal = _refused_by_scan(ctx, rel) or _leaving_link(ctx, rel)
    if refusal:
        result.failure, result.error = "load", refusal
        return result
    hf_cache = os.path.abspath(ctx.options.hf_cache) if ctx.options.hf_cache else None
    pinned_base = artifact.get("base") if isinstance(artifact.get("base"), dict) else None
    loads_base = loader in loader_table.LOADERS and loader_table.LOADERS[loader].loads_pinned_base
    limit, limit_source = memory_limit(Path(real), device, hf_cache, configured_limit,
                                       pinned_base if loads_base else None)
    return {
        "artifact": artifact_id, "loader": loader, "kind": result.kind, "rel": rel, "path": real,
        "package_root": root, "device": device, "dtype": _text(entry.get("dtype")), "class": _text(entry.get("class")),
        "hf_cache": hf_cache,  # absolute: the child runs elsewhere
        "base": pinned_base,
        # The loader checks it: a task head's size (peft; docs/format.md, The fields of a `reload.json` entry).
        "num_labels": entry.get("num_labels"),
        "fp16": fp16_run(ctx, _text(artifact.get("run"))), "threads": threads,
        "config": _config_folder(ctx, entry), "config_ref": _text(entry.get("config")),
        "world_size": recorded_world_size(ctx, _text(artifact.get("run"))),
        "weight_bytes": weight_bytes(Path(real)),  # largest first; one GPU or all of them
        "memory_limit": limit, "memory_limit_source": limit_source,  # limits.py: the child's host memory bound
    }
