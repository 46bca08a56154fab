"""Assemble's comparison and merge of the parts' documents (flows/assemble.py reads and writes; this decides).

Each part holds the campaign's header (compared whole, its declaration times aside), one lot's runs, artifacts
and timeline entries, its stop records and reload entries. The merge keeps every entry as the part holds it,
the earliest of each declaration time, and refuses (rules/parts.py words) what cannot be one campaign.

The files of the parts become one tree. A path two parts hold, listed or implied by a deeper path (a part need
not list its folders), is the same file, link or folder in both, so nothing of one part lies beneath another's
link (IV615). Then every link of the joined tree is resolved there, through every part's links: one that leaves
the campaign folder, loops or chains past what a path resolves is refused (IV703, rules/archive.py words).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..format.names import ID, MANIFEST, RELOAD, STOPS
from ..format.parts import HEADER_TIMES, LOT_TIMES, MERGED_DOCUMENTS, PER_LOT_KEYS, PROVENANCE, \
    WHOLE_CAMPAIGN_KEYS, lot_ids, lot_of_archive_name, part_lot
from ..model import Finding
from ..package.campaign import parse_time
from ..rules import parts as words
from ..rules.archive import assembled_link_refused as link_refused


@dataclass
class PartContent:
    """One audited part, extracted: its name, its documents and what its files are."""

    name: str  # the archive's name (or the key's last component)
    documents: dict[str, Any]  # manifest.json, stops.json, reload.json as the part holds them
    entries: dict[str, tuple[str, str]]  # every other path -> (kind: file | symlink, sha256 or link target)

    @property
    def lot(self) -> str | None:
        return part_lot(self.documents[MANIFEST])


@dataclass
class Merged:
    documents: dict[str, Any] = field(default_factory=dict)
    sources: dict[str, int] = field(default_factory=dict)  # path -> the part that provides it (first holder)
    findings: list[Finding] = field(default_factory=list)


def merge(parts: list[PartContent]) -> Merged:
    """The assembled documents, or the findings that refuse them (then `documents` is empty)."""
    merged = Merged()
    first = parts[0]
    merged.findings += _lots(parts)
    for part in parts[1:]:
        merged.findings += _header(first, part)
    merged.findings += _ids(parts, "runs", words.run_on_two_lots)
    merged.findings += _ids(parts, "artifacts", words.artifact_on_two_lots)
    merged.findings += _reload_entries(parts)
    merged.findings += _files(parts, merged.sources)
    # One refusal said once (an artifact is in the manifest and in reload.json of both parts).
    merged.findings = list({(f.code, f.path, f.message): f for f in merged.findings}.values())
    if not merged.findings:
        merged.documents = {MANIFEST: _manifest(parts), STOPS: _stops(parts), RELOAD: _reload(parts)}
    return merged


def _lots(parts: list[PartContent]) -> list[Finding]:
    """Each part is one lot of the plan, named after it, and no lot has two."""
    findings, seen = [], {}
    declared = lot_ids(parts[0].documents[MANIFEST].get("plan"))
    for part in parts:
        manifest, lot = part.documents[MANIFEST], part.lot
        for key in WHOLE_CAMPAIGN_KEYS:
            if key in manifest:
                findings.append(words.part_holds(lot, f"manifest.{key}", part.name, None))
        if any(rel == PROVENANCE or rel.startswith(PROVENANCE + "/") for rel in part.entries):
            findings.append(words.part_holds(lot, f"{PROVENANCE}/", part.name, None))
        if lot is None:
            continue  # the part's own audit (IV616) said its runs name no lot, or several
        if not ID.fullmatch(lot):  # it names a folder (provenance/<lot>/), whatever the reviewer's configuration
            findings.append(words.part_of_unknown_lot(part.name, lot, declared, part.name))
            continue
        named = lot_of_archive_name(part.name, str(manifest.get("campaign_id")))
        if named is not None and named != lot:
            findings.append(words.named_for_another_lot(part.name, named, lot))
        if lot not in declared:
            findings.append(words.part_of_unknown_lot(part.name, lot, declared, part.name))
        if lot in seen:
            findings.append(words.sealed_twice(lot, seen[lot], part.name, part.name))
        seen.setdefault(lot, part.name)
    return findings


def _without_times(manifest: dict) -> dict:
    header = {k: v for k, v in manifest.items() if k not in PER_LOT_KEYS + WHOLE_CAMPAIGN_KEYS}
    for path in HEADER_TIMES:
        if len(path) == 1:
            header.pop(path[0], None)
        elif isinstance(header.get(path[0]), dict):
            header[path[0]] = {k: v for k, v in header[path[0]].items() if k != path[1]}
    plan = header.get("plan")
    if isinstance(plan, dict) and isinstance(plan.get("lots"), list):
        plan["lots"] = [{k: v for k, v in lot.items() if k not in LOT_TIMES} if isinstance(lot, dict) else lot
                        for lot in plan["lots"]]
    timeline = manifest.get("timeline")
    if isinstance(timeline, dict):  # besides its per-lot lists: what only the close writes, compared
        header["timeline"] = {k: v for k, v in timeline.items() if k not in ("decisions", "deviations")}
    return header


def _header(first: PartContent, other: PartContent) -> list[Finding]:
    findings = []
    for document, pick in ((MANIFEST, _without_times), (STOPS, lambda d: {k: v for k, v in d.items() if k != "stops"}),
                           (RELOAD, lambda d: {k: v for k, v in d.items() if k != "artifacts"})):
        difference = _difference(pick(first.documents[document]), pick(other.documents[document]))
        if difference is not None:
            where, a, b = difference
            findings.append(words.header_differs(where, first.lot or first.name, a, other.lot or other.name, b,
                                                 document))
    return findings


MISSING = object()


def _difference(a: Any, b: Any, where: str = "") -> tuple[str, Any, Any] | None:
    """The first place two values differ (a dotted path, [i] for a list index) and both values there."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            found = _difference(a.get(key, MISSING), b.get(key, MISSING), f"{where}.{key}" if where else str(key))
            if found is not None:
                return found
        return None
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for index, (x, y) in enumerate(zip(a, b)):
            found = _difference(x, y, f"{where}[{index}]")
            if found is not None:
                return found
        return None
    if type(a) is type(b) and a == b:
        return None
    return where or "(the document)", None if a is MISSING else a, None if b is MISSING else b


def _ids(parts: list[PartContent], key: str, refusal) -> list[Finding]:
    findings, owner = [], {}
    for part in parts:
        for entry in part.documents[MANIFEST].get(key) or []:
            name = entry.get("id") if isinstance(entry, dict) else None
            if not isinstance(name, str):
                continue
            if name in owner and owner[name] is not part and owner[name].lot != part.lot:  # one lot twice: IV617
                findings.append(refusal(name, owner[name].lot or owner[name].name, part.lot or part.name))
            owner.setdefault(name, part)
    return findings


def _reload_entries(parts: list[PartContent]) -> list[Finding]:
    findings, owner = [], {}
    for part in parts:
        for name in part.documents[RELOAD].get("artifacts") or {}:
            if name in owner and owner[name] != (part.lot or part.name):
                findings.append(words.artifact_on_two_lots(name, owner[name], part.lot or part.name))
            owner.setdefault(name, part.lot or part.name)
    return findings


def with_folders(entries: dict[str, tuple[str, str]]) -> dict[str, tuple[str, str]]:
    """The entries and every folder their paths imply: a part need not list its folders (SHA256SUMS lists
    files), yet each is a folder in the joined tree, and never another part's link."""
    tree = {}
    for rel in entries:
        for depth in range(1, rel.count("/") + 1):
            tree.setdefault(rel.rsplit("/", depth)[0], FOLDER)
    for rel, entry in entries.items():
        tree[rel] = FOLDER if entry[0] == "directory" else entry
    return tree


FOLDER = ("directory", "")


def _files(parts: list[PartContent], sources: dict[str, int]) -> list[Finding]:
    """A path two parts hold, listed or implied, is the same file, link or folder in both (so nothing of one
    part lies beneath a link of another); each listed path comes from its first holder."""
    findings, held = [], {}
    for index, part in enumerate(parts):
        tree = with_folders(part.entries)
        for rel, entry in sorted(tree.items()):
            if rel in MERGED_DOCUMENTS:
                continue
            if rel in held and held[rel][1] != entry:
                other = parts[held[rel][0]]
                findings.append(words.file_differs(rel, other.lot or other.name, held[rel][1],
                                                   part.lot or part.name, entry))
            held.setdefault(rel, (index, entry))
            if rel in part.entries:
                sources.setdefault(rel, index)
    if not findings:
        findings += _links(parts, {rel: entry for rel, (_, entry) in held.items()},
                           {rel: index for rel, (index, _) in held.items()})
    return findings


MAX_LINKS_FOLLOWED = 40  # what Linux follows in one path before ELOOP


def _links(parts: list[PartContent], tree: dict[str, tuple[str, str]], owner: dict[str, int]) -> list[Finding]:
    """Each link of the joined tree resolved in it, through the links of every part: one that leaves the
    campaign folder, loops or runs too deep is refused (each part's own audit saw only its own links)."""
    resolved: dict[str, list[str] | str] = {}  # link -> where it leads (components), or why it is refused
    depth: dict[str, int] = {}  # link -> links followed to resolve it

    def follow(rel: str, level: int) -> list[str] | str:
        if rel in resolved:
            if isinstance(resolved[rel], list) and level + depth[rel] >= MAX_LINKS_FOLLOWED:
                return f"a chain of more than {MAX_LINKS_FOLLOWED} links"
            return resolved[rel]
        if level >= MAX_LINKS_FOLLOWED:  # `level` links followed before this one
            return f"a chain of more than {MAX_LINKS_FOLLOWED} links"
        resolved[rel] = "a loop of links"  # until resolved: met again on the way, it is a loop
        target = tree[rel][1]
        where: list[str] | str = rel.split("/")[:-1]
        deepest = 0
        if target.startswith("/"):
            where = "an absolute path"
        for name in target.split("/") if isinstance(where, list) else ():
            if name in ("", "."):
                continue
            if name == "..":
                if not where:
                    where = "a place above the campaign folder"
                    break
                where.pop()
                continue
            where.append(name)
            here = "/".join(where)
            if tree.get(here, FOLDER)[0] == "symlink":
                inner = follow(here, level + 1)
                if isinstance(inner, str):
                    where = inner
                    break
                where, deepest = list(inner), max(deepest, depth[here] + 1)
        resolved[rel], depth[rel] = where, deepest
        return where

    findings = []
    for rel, entry in sorted(tree.items()):
        if entry[0] == "symlink":
            why = follow(rel, 0)
            if isinstance(why, str):
                part = parts[owner[rel]]
                findings.append(link_refused(rel, entry[1], part.lot or part.name, why))
    return findings


def _earliest(values: list[Any]) -> Any:
    timed = [(parse_time(v), v) for v in values if parse_time(v) is not None]
    return min(timed, key=lambda t: t[0])[1] if timed else values[0]


def _manifest(parts: list[PartContent]) -> dict:
    manifests = [p.documents[MANIFEST] for p in parts]
    merged = dict(manifests[0])
    for path in HEADER_TIMES:  # every machine declared at its own moment: the campaign keeps the earliest
        if len(path) == 1:
            values = [m.get(path[0]) for m in manifests if path[0] in m]
            if values:
                merged[path[0]] = _earliest(values)
        else:
            values = [m[path[0]][path[1]] for m in manifests
                      if isinstance(m.get(path[0]), dict) and path[1] in m[path[0]]]
            if values and isinstance(merged.get(path[0]), dict):
                merged[path[0]] = {**merged[path[0]], path[1]: _earliest(values)}
    plan = merged.get("plan")
    if isinstance(plan, dict) and isinstance(plan.get("lots"), list):
        merged["plan"] = {**plan, "lots": [_lot_times(lot, parts) if isinstance(lot, dict) else lot
                                           for lot in plan["lots"]]}
    merged["runs"] = [run for m in manifests for run in m.get("runs") or []]
    merged["artifacts"] = [artifact for m in manifests for artifact in m.get("artifacts") or []]
    timeline = dict(manifests[0].get("timeline") or {})
    decisions = [d for m in manifests for d in (m.get("timeline") or {}).get("decisions") or []]
    # In time order (stable: a decision without a readable time keeps its place after the timed ones).
    timeline["decisions"] = sorted(decisions, key=lambda d: (parse_time(d.get("at")) is None,
                                                             parse_time(d.get("at")) or 0) if isinstance(d, dict)
                                   else (True, 0))
    timeline["deviations"] = [d for m in manifests for d in (m.get("timeline") or {}).get("deviations") or []]
    merged["timeline"] = timeline
    return merged


def _lot_times(lot: dict, parts: list[PartContent]) -> dict:
    """A lot's own times, from its own part (its machine knew them), else from the first part that says."""
    own = [p for p in parts if p.lot == lot.get("id")] + parts
    for key in LOT_TIMES:
        values = [entry.get(key) for p in own for entry in (p.documents[MANIFEST].get("plan") or {}).get("lots") or []
                  if isinstance(entry, dict) and entry.get("id") == lot.get("id") and key in entry]
        lot = {**{k: v for k, v in lot.items() if k != key}, **({key: values[0]} if values else {})}
    return lot


def _stops(parts: list[PartContent]) -> dict:
    merged = dict(parts[0].documents[STOPS])
    merged["stops"] = [s for p in parts for s in p.documents[STOPS].get("stops") or []]
    return merged


def _reload(parts: list[PartContent]) -> dict:
    merged = dict(parts[0].documents[RELOAD])
    merged["artifacts"] = {k: v for p in parts for k, v in (p.documents[RELOAD].get("artifacts") or {}).items()}
    return merged
