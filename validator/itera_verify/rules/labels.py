"""IV310: the runs of one campaign name the frozen corpus's labels the same way.

A classifier's prediction is an index into its own label map. Two runs trained on the same corpus with label
maps built in another order (a `sorted(set(...))` on one machine, the dataset's order on another) predict
`2` for different classes: their predictions, and every score compared between them, mean nothing. The map is
read from each run's artifacts as the libraries save it: transformers' config.json `id2label` (or `label2id`),
timm's config.json `label_names`, a `classes.json` file beside the weights.
"""
from __future__ import annotations

import re
from typing import Iterator

from ..model import Finding, Rule, Severity
from ..package import RunContext

RULES = [
    Rule("IV310", Severity.ERROR, "runs map the corpus's labels differently",
         explain="Every run of a campaign is scored on the same frozen corpus, so every classifier must number "
                 "its labels the same way: index 0 is the same class in the control and in each variant. A "
                 "label map built from an unordered set, or from a reshuffled dataset, numbers them differently, "
                 "and the runs' predictions cannot be compared. The map is read from config.json (`id2label`, "
                 "`label2id`; timm's `label_names`) or a `classes.json` in the run's artifacts. Build the map "
                 "once, from a sorted list frozen with the corpus, and pass it to every run.",
         bad='control config.json: {"id2label": {"0": "cat", "1": "dog"}}   lora config.json: {"id2label": '
             '{"0": "dog", "1": "cat"}}',
         good='every run: {"id2label": {"0": "cat", "1": "dog"}}',
         since="0.2.0"),
]

CLASSES_FILES = ("classes.json", "labels.json", "class_names.json")
DEFAULT_LABEL = re.compile(r"LABEL_\d+")  # transformers' own names when none were given: no map to compare
SHOWN = 3


def _as_map(value, *, inverted: bool = False) -> dict[int, str] | None:
    """index -> label from a list, an {index: label} object (or {label: index} with `inverted`)."""
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return dict(enumerate(value))
    if not isinstance(value, dict) or not value:
        return None
    pairs = [(v, k) for k, v in value.items()] if inverted else list(value.items())
    out = {}
    for index, label in pairs:
        if isinstance(index, str) and index.isdigit():
            index = int(index)
        if not isinstance(index, int) or isinstance(index, bool) or not isinstance(label, str):
            return None
        out[index] = label
    return out


def _from_config(config) -> dict[int, str] | None:
    if not isinstance(config, dict):
        return None
    found = _as_map(config.get("id2label")) or _as_map(config.get("label2id"), inverted=True) \
        or _as_map(config.get("label_names"))
    if found is None:
        pretrained = config.get("pretrained_cfg")
        found = _as_map(pretrained.get("label_names")) if isinstance(pretrained, dict) else None
    if found and all(DEFAULT_LABEL.fullmatch(label) for label in found.values()):
        return None  # unnamed labels: nothing says which class an index is
    return found


def _from_classes_file(value) -> dict[int, str] | None:
    if isinstance(value, dict) and value and all(isinstance(v, int) for v in value.values()):
        return _as_map(value, inverted=True)
    return _as_map(value)


def run_label_maps(ctx: RunContext) -> dict[str, tuple[str, dict[int, str]]]:
    """run -> (the file that holds its label map, the map): the first map among the run's artifacts."""
    found: dict[str, tuple[str, dict[int, str]]] = {}
    for artifact in ctx.documents.artifacts():
        run, path = artifact.get("run"), artifact.get("path")
        rel = ctx.inventory.normalise_ref(path) if isinstance(path, str) else None
        if not isinstance(run, str) or run in found or rel is None or rel not in ctx.inventory.dirs:
            continue
        config = f"{rel}/config.json"
        label_map = _from_config(ctx.documents.json_value(config)) if ctx.inventory.is_file(config) else None
        if label_map:
            found[run] = (config, label_map)
            continue
        for name in CLASSES_FILES:
            rel_file = f"{rel}/{name}"
            if ctx.inventory.is_file(rel_file):
                label_map = _from_classes_file(ctx.documents.json_value(rel_file))
                if label_map:
                    found[run] = (rel_file, label_map)
                    break
    return found


def _difference(ours: dict[int, str], theirs: dict[int, str]) -> str:
    differing = [i for i in sorted(set(ours) | set(theirs)) if ours.get(i) != theirs.get(i)]
    shown = ", ".join(f"{i}: {theirs.get(i)!r} here, {ours.get(i)!r} there" for i in differing[:SHOWN])
    return shown + (f" and {len(differing) - SHOWN} more" if len(differing) > SHOWN else "")


def check(ctx: RunContext) -> Iterator[Finding]:
    maps = run_label_maps(ctx)
    if len(maps) < 2:
        return
    control = next((r.get("id") for r in ctx.documents.runs() if r.get("role") == "control" and r.get("id") in maps),
                   None)
    reference = control or next(iter(maps))
    where, expected = maps[reference]
    for run, (rel, label_map) in maps.items():
        if run == reference or label_map == expected:
            continue
        yield Finding("IV310", rel, run=run,
                      message=f"run {run!r} numbers the labels unlike run {reference!r} ({where}): "
                              f"{_difference(expected, label_map)}; their predictions on the frozen corpus "
                              "cannot be compared")
