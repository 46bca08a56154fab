"""IV519: a safetensors index that does not describe its shards exactly.

Static, headers only (no tensor is read), so the CI gate (`--no-reload`) sees it: every `*.safetensors.index.json`
of the package is compared with the headers of the shards beside it. A shard the index names that is missing is
IV507/IV504's (format/layouts.py: index_shard_requirement), not reported again here.
"""
from __future__ import annotations

from typing import Iterator

from ..format import facts as table
from ..model import Finding, Rule, Severity
from ..package import RunContext
from ._records import artifact_folders, bounded_json

RULES = [
    Rule("IV519", Severity.ERROR, "a safetensors index does not describe its shards",
         explain="A sharded model's `model.safetensors.index.json` maps every tensor to the shard that holds it "
                 "(`weight_map`) and states their total size (`metadata.total_size`). Loaders that trust it (vLLM "
                 "and sglang open only the shard the index names; transformers sizes its allocations from it) "
                 "fail, or load a model missing tensors, when it is wrong, while every file on its own loads: a "
                 "tensor mapped to a shard that does not hold it, a tensor the index maps that no shard holds, a "
                 "tensor a listed shard holds that the index does not map, a shard beside the index that it "
                 "does not list (a leftover of an earlier save; a `model.safetensors` beside an index is loaded "
                 "instead of the shards), a `total_size` other than the tensors' bytes. Checked from the "
                 "shards' headers alone. Save the model again with `save_pretrained(path, max_shard_size=...)` "
                 "into an empty folder, and never edit an index by hand.",
         bad='weight_map: {"lm_head.weight": "model-00001-of-00002.safetensors"}   (it is in the second shard)',
         good='weight_map: {"lm_head.weight": "model-00002-of-00002.safetensors"}   total_size = the tensors\' '
              'bytes', since="0.2.0"),
]

SHOWN = 3


def check(ctx: RunContext) -> Iterator[Finding]:
    for rel in sorted(ctx.inventory.files):
        if rel.endswith(table.INDEX_SUFFIX):
            yield from _index(ctx, rel)


def _index(ctx: RunContext, rel: str) -> Iterator[Finding]:
    index = bounded_json(ctx, rel)
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict):
        return  # unparsable or without a map: the structure rules and the reload say so
    folder, name = rel.rsplit("/", 1) if "/" in rel else ("", rel)
    prefix = name[: -len(table.INDEX_SUFFIX)]

    def at(shard: str) -> str:
        return f"{folder}/{shard}" if folder else shard

    listed = sorted({s for s in weight_map.values() if isinstance(s, str)})
    holds: dict[str, dict[str, int]] = {}  # shard -> tensor -> bytes, for every listed shard that can be read
    for shard in listed:
        header = ctx.documents.safetensors_header(at(shard)) \
            if "/" not in shard and ctx.inventory.is_file(at(shard)) else None
        if header is not None:
            holds[shard] = {entry.name: entry.nbytes for entry in header.entries.values()}
    missing = {s for s in listed if "/" not in s and not ctx.inventory.is_file(at(s))}  # IV507/IV504's
    owner = {tensor: shard for shard, tensors in holds.items() for tensor in tensors}
    wrong, nowhere = [], []
    for tensor, shard in weight_map.items():
        if not isinstance(shard, str) or shard in missing or shard in holds and tensor in holds[shard]:
            continue
        if shard in holds:
            (wrong if tensor in owner else nowhere).append((tensor, shard))
    owner_artifact = next((a for a in artifact_folders(ctx) if folder == a.rel or folder.startswith(a.rel + "/")),
                          None)
    where = dict(run=owner_artifact.run, artifact=owner_artifact.id) if owner_artifact else {}
    if wrong:
        shown = ", ".join(f"{t} -> {s} (held by {owner[t]})" for t, s in wrong[:SHOWN])
        yield Finding("IV519", rel, pointer="/weight_map", **where,
                      message=f"{rel} maps {len(wrong)} tensor(s) to a shard that does not hold them: {shown}"
                              f"{_more(wrong)}; a loader that opens the shard the index names does not find them")
    if nowhere:
        shown = ", ".join(f"{t} -> {s}" for t, s in nowhere[:SHOWN])
        yield Finding("IV519", rel, pointer="/weight_map", **where,
                      message=f"{rel} maps {len(nowhere)} tensor(s) that no shard holds: {shown}{_more(nowhere)}; "
                              "the model it describes cannot be loaded from these files")
    unmapped = sorted((tensor, shard) for shard, tensors in holds.items() for tensor in tensors
                      if tensor not in weight_map)
    if unmapped:
        shown = ", ".join(f"{t} (in {s})" for t, s in unmapped[:SHOWN])
        yield Finding("IV519", rel, pointer="/weight_map", **where,
                      message=f"{len(unmapped)} tensor(s) that the shards hold are not in {rel}'s weight_map: "
                              f"{shown}{_more(unmapped)}; a loader that trusts the index never loads them")
    beside = [f for f in ctx.inventory.files_under(folder) if "/" not in f[len(folder) + 1:]] if folder \
        else [f for f in ctx.inventory.files if "/" not in f]
    stray = [f for f in beside if f.rsplit("/", 1)[-1] not in listed and _is_shard(f.rsplit("/", 1)[-1], prefix)]
    if stray:
        yield Finding("IV519", stray[0], **where,
                      message=f"{', '.join(stray[:SHOWN])}{_more(stray)} lie(s) beside {rel}, which does not list "
                              "them: a leftover of another save (a loader reads either the index or the single "
                              "file, not both); deliver the files of one save")
    declared = index.get("metadata", {}).get("total_size") if isinstance(index.get("metadata"), dict) else None
    if _count(declared) and not missing and len(holds) == len(listed) and not (wrong or nowhere or unmapped):
        total = sum(sum(tensors.values()) for tensors in holds.values())
        if declared != total:
            yield Finding("IV519", rel, pointer="/metadata/total_size", **where,
                          message=f"{rel} declares metadata.total_size = {declared:,} bytes, but the tensors of "
                                  f"its {len(holds)} shard(s) hold {total:,}: loaders that size their allocations "
                                  "from it allocate wrong")


def _is_shard(name: str, prefix: str) -> bool:
    """A weights file of the same save: `<prefix>.safetensors` or `<prefix>-*.safetensors`."""
    return name == f"{prefix}.safetensors" or (name.startswith(f"{prefix}-") and name.endswith(".safetensors"))


def _more(items: list) -> str:
    return f" and {len(items) - SHOWN} more" if len(items) > SHOWN else ""


def _count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
