"""Where the package's documents are: the fixed files and every path the manifest references.

Shared by the structure rules (missing, empty, unparsable) and the path rules (escaping references), so the
list of references is written once.
"""
from __future__ import annotations

from dataclasses import dataclass

from . import MANIFEST, RELOAD, STOPS, RunContext, pointer_of

FIXED_DOCUMENTS = {MANIFEST: "manifest", STOPS: "stops", RELOAD: "reload"}


@dataclass(frozen=True)
class Reference:
    pointer: str  # where the manifest names it
    value: str  # as written
    kind: str  # "params" | "metrics" | "predictions" | "eval_ids" | "analysis" | "artifact"
    required: bool  # the item itself is required (IV101 when not named; a named target that is absent is IV106)
    run: str | None = None

    @property
    def source(self) -> str:
        return MANIFEST


def references(ctx: RunContext) -> list[Reference]:
    """Every path the manifest references, with the JSON pointer that names it. Malformed entries are skipped."""
    manifest = ctx.documents.manifest
    refs: list[Reference] = []
    corpus = manifest.get("corpus")
    if isinstance(corpus, dict) and isinstance(corpus.get("eval_ids"), str):
        refs.append(Reference("/corpus/eval_ids", corpus["eval_ids"], "eval_ids", True))
    runs = manifest.get("runs")
    for index, run in enumerate(runs if isinstance(runs, list) else []):
        if not isinstance(run, dict):
            continue
        run_id = run.get("id") if isinstance(run.get("id"), str) else None
        for key in ("params", "metrics", "predictions"):
            value = run.get(key)
            if isinstance(value, str):
                required = key != "predictions" or run.get("status") == "completed"
                refs.append(Reference(pointer_of(["runs", index, key]), value, key, required, run_id))
    artifacts = manifest.get("artifacts")
    for index, artifact in enumerate(artifacts if isinstance(artifacts, list) else []):
        if isinstance(artifact, dict) and isinstance(artifact.get("path"), str):
            run_id = artifact.get("run") if isinstance(artifact.get("run"), str) else None
            refs.append(Reference(pointer_of(["artifacts", index, "path"]), artifact["path"], "artifact", False,
                                  run_id))
    decision = manifest.get("decision")
    if isinstance(decision, dict) and isinstance(decision.get("error_analysis"), str):
        refs.append(Reference("/decision/error_analysis", decision["error_analysis"], "analysis", False))
    return refs


def document_kinds(ctx: RunContext) -> dict[str, str]:
    """Package-relative path -> document kind, for every document of the format that exists in the package."""
    kinds = {rel: kind for rel, kind in FIXED_DOCUMENTS.items() if ctx.inventory.is_file(rel)}
    for ref in references(ctx):
        rel = ctx.inventory.normalise_ref(ref.value)
        if rel is not None and ctx.inventory.is_file(rel) and ref.kind != "artifact":
            kinds.setdefault(rel, ref.kind)
    return kinds
