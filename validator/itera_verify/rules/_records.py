"""An artifact folder of the package as package/records.py reads one: through ctx.documents, within bounds.

The families that compare declared facts with what artifacts record (declared_facts, tokenizer_fit,
run_history) read each artifact through this one view, so a file is named, sized and parsed one way.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, BinaryIO, Iterator

from ..format.safetensors import Header
from ..package import RunContext
from ..package.campaign import indexed_runs
from ..package.records import MAX_RECORD_JSON


def file_size(ctx: RunContext, rel: str) -> int | None:
    entry = ctx.inventory.files.get(rel)
    if entry is not None:
        return entry.size
    try:
        return os.stat(ctx.documents.path(rel)).st_size  # a link inside the package
    except OSError:
        return None


def bounded_json(ctx: RunContext, rel: str) -> Any:
    """The parsed JSON document at `rel`, or None when it is missing, unparsable or larger than a record can be
    (read whole only within MAX_RECORD_JSON bytes)."""
    size = file_size(ctx, rel) if ctx.inventory.is_file(rel) else None
    if size is None or size > MAX_RECORD_JSON:
        return None
    return ctx.documents.json_value(rel)


class PackageFolder:
    """A folder of the package (package-relative `rel`), read only through ctx.documents."""

    def __init__(self, ctx: RunContext, rel: str):
        self.ctx, self.rel = ctx, rel
        self.name = rel.rsplit("/", 1)[-1]

    def path(self, name: str) -> str:
        return f"{self.rel}/{name}"

    def is_file(self, name: str) -> bool:
        return self.ctx.inventory.is_file(self.path(name))

    def json(self, name: str) -> Any:
        return bounded_json(self.ctx, self.path(name))

    def open(self, name: str) -> BinaryIO:
        return self.ctx.documents.open(self.path(name))

    def header(self, name: str) -> Header | None:
        return self.ctx.documents.safetensors_header(self.path(name))


@dataclass(frozen=True)
class ArtifactFolder:
    """An artifact of the manifest that is a folder of the package."""

    run: str | None
    id: str | None
    kind: str | None
    rel: str
    index: int  # in manifest.artifacts

    @property
    def label(self) -> str:
        return self.id or self.rel


def artifact_folders(ctx: RunContext) -> list[ArtifactFolder]:
    """Every artifact listed in the manifest whose path is a folder of the package, in manifest order."""
    found = []
    listed = ctx.documents.manifest.get("artifacts")
    for index, artifact in enumerate(listed if isinstance(listed, list) else ()):
        if not isinstance(artifact, dict) or not isinstance(artifact.get("path"), str):
            continue
        rel = ctx.inventory.normalise_ref(artifact["path"])
        if not rel or rel not in ctx.inventory.dirs:
            continue
        text = {key: artifact.get(key) if isinstance(artifact.get(key), str) else None for key in ("run", "id", "kind")}
        found.append(ArtifactFolder(text["run"], text["id"], text["kind"], rel, index))
    return found


def run_params(ctx: RunContext) -> Iterator[tuple[int, str, str, dict]]:
    """(index in manifest.runs, run id, params path, params) for every run whose params file is a JSON object."""
    for index, run, run_id in indexed_runs(ctx):
        ref = run.get("params")
        rel = ctx.inventory.normalise_ref(ref) if isinstance(ref, str) and run_id else None
        if not rel or not ctx.inventory.is_file(rel):
            continue
        params = bounded_json(ctx, rel)
        if isinstance(params, dict):
            yield index, run_id, rel, params
