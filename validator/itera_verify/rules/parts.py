"""IV615–IV617: one campaign on several lots (docs/record.md, "Two lots"). Each lot seals its part; `itera-verify
assemble` joins them into one package. The parts must agree on everything they share, each run belongs to one
declared lot, and each lot delivers one part.

The package's own checks (a part under --part, an assembled campaign) are `check`; assemble's refusals, made
while it compares parts that are not yet one package, are built by the functions below it, so a code's words
live here once.
"""
from __future__ import annotations

import json
from typing import Iterator

from ..format.parts import PROVENANCE, WHOLE_CAMPAIGN_KEYS, lot_ids, run_lot
from ..model import Finding, Rule, Severity
from ..package import MANIFEST, RunContext, pointer_of
from ..package.campaign import indexed_runs, listed, section, shown

RULES = [
    Rule("IV615", Severity.ERROR, "parts of one campaign disagree",
         explain="Each lot of a campaign seals its part on its own machine; `itera-verify assemble` joins them. "
                 "Every part declares the same header: the question, the corpus and its eval ids, the plan and "
                 "the stop rules (only the times they were declared are each machine's own). A file both parts "
                 "hold (the frozen corpus) is byte for byte the same. What only the whole campaign holds (the "
                 "decision, `manifest.parts`, `provenance/`) is written on the assembling machine, never "
                 "carried in a part. Otherwise the runs of the two lots were not run on one campaign, and "
                 "comparing them proves nothing. The finding names the field and both values.",
         bad='lot-a: "revision": "v3"   lot-b: "revision": "v4"',
         good='lot-a: "revision": "v3"   lot-b: "revision": "v3"', since="0.2.0"),
    Rule("IV616", Severity.ERROR, "a run on two lots, or on a lot the plan does not name",
         explain="A run ran on one machine: `runs[].lot` names one of the plan's lots (`plan.lots[].id`). A run "
                 "id found in two parts, a run on a lot the plan does not buy, or a part holding the runs of two "
                 "lots cannot be costed or timed against its machine. With two lots or more, every run says "
                 "where it ran (`open_campaign(..., lot=\"lot-b\")` records it).",
         bad='"lots": [{"id": "lot-a", ...}, {"id": "lot-b", ...}]   run "lora-r64": {"lot": "lot-c"}',
         good='"lots": [{"id": "lot-a", ...}, {"id": "lot-b", ...}]   run "lora-r64": {"lot": "lot-b"}', since="0.2.0"),
    Rule("IV617", Severity.ERROR, "two parts sealed for one lot",
         explain="One lot is one machine: it seals one part, `<campaign_id>.<lot>.part.tar.zst`. Two parts of "
                 "one lot are a part sealed twice (an older seal left in the bucket) or another machine's part "
                 "under this lot's name: assemble cannot tell which runs are the lot's. Keep the last seal of "
                 "each lot.",
         bad="reviews.lot-b.part.tar.zst and reviews-old.lot-b.part.tar.zst, both for lot-b",
         good="reviews.lot-a.part.tar.zst and reviews.lot-b.part.tar.zst", since="0.2.0"),
]


def check(ctx: RunContext) -> Iterator[Finding]:
    manifest = ctx.documents.manifest
    if not manifest:
        return  # missing or unparsable manifest: IV101/IV104 say so
    yield from _lots_named(ctx)
    if ctx.options.part:
        yield from _one_lot_in_a_part(ctx)
    yield from _parts_recorded(ctx)


def _lots_named(ctx: RunContext) -> Iterator[Finding]:
    plan = section(ctx.documents.manifest, "plan")
    declared = lot_ids(plan)
    for lot in sorted({lot for lot in declared if declared.count(lot) > 1}):
        index = [i for i, entry in enumerate(listed(plan, "lots"))
                 if isinstance(entry, dict) and entry.get("id") == lot][1]
        yield Finding("IV616", MANIFEST, pointer=pointer_of(["plan", "lots", index, "id"]),
                      message=f"the plan names two lots {lot!r}: a run on it could have run on either; give each "
                              f"lot its own id")
    several = len(set(declared)) > 1
    for index, run, run_id in indexed_runs(ctx):
        lot = run_lot(run)
        if lot is not None and lot not in declared:
            yield unknown_lot(run_id or f"#{index}", lot, declared, MANIFEST,
                              pointer_of(["runs", index, "lot"]))
        elif lot is None and several:
            yield Finding("IV616", MANIFEST, pointer=pointer_of(["runs", index]), run=run_id,
                          message=f"run {run_id or f'#{index}'} does not say where it ran, and the plan has "
                                  f"{len(set(declared))} lots ({', '.join(declared)}): add its runs[].lot")


def _one_lot_in_a_part(ctx: RunContext) -> Iterator[Finding]:
    """A part holds the runs of one lot, and nothing only the assembled campaign holds."""
    manifest = ctx.documents.manifest
    lots: dict[str, list[str]] = {}
    for index, run, run_id in indexed_runs(ctx):
        lots.setdefault(run_lot(run) or "", []).append(run_id or f"#{index}")
    named = [lot for lot in lots if lot]
    if not named:
        yield Finding("IV616", MANIFEST, pointer="/runs",
                      message="a part holds the runs of one lot, and no run here names its lot: record them with "
                              "open_campaign(..., lot=\"lot-a\") (runs[].lot, one of plan.lots[].id)")
    elif len(lots) > 1:
        shown_lots = "; ".join(f"{lot or 'no lot'}: {', '.join(runs[:3])}" for lot, runs in lots.items())
        yield Finding("IV616", MANIFEST, pointer="/runs",
                      message=f"a part holds the runs of one lot, this one holds runs of several ({shown_lots}): "
                              f"each machine seals its own runs")
    lot = named[0] if len(named) == 1 else None
    for key in WHOLE_CAMPAIGN_KEYS:
        if key in manifest:
            yield part_holds(lot, f"manifest.{key}", MANIFEST, f"/{key}")
    if ctx.inventory.exists(PROVENANCE):
        yield part_holds(lot, f"{PROVENANCE}/", PROVENANCE, None)


def _parts_recorded(ctx: RunContext) -> Iterator[Finding]:
    """An assembled package's manifest.parts: one per lot, each a lot of the plan."""
    declared = lot_ids(section(ctx.documents.manifest, "plan"))
    seen: dict[str, str] = {}
    for index, entry in enumerate(listed(ctx.documents.manifest, "parts")):
        lot = entry.get("lot") if isinstance(entry, dict) else None
        if not isinstance(lot, str):
            continue  # the schema says what is missing
        archive = shown(entry.get("archive"))
        pointer = pointer_of(["parts", index, "lot"])
        if lot in seen:
            yield sealed_twice(lot, seen[lot], archive, MANIFEST, pointer)
        elif lot not in declared:
            yield part_of_unknown_lot(archive, lot, declared, MANIFEST, pointer)
        seen.setdefault(lot, archive)


# ---------------------------------------------------------------------------------------------- assemble's words

def header_differs(field: str, lot_a: str, value_a, lot_b: str, value_b, path: str = MANIFEST) -> Finding:
    return Finding("IV615", path, pointer="/" + field.replace(".", "/").replace("[", "/").replace("]", ""),
                   message=f"the parts disagree on {field}: {lot_a} has {_value(value_a)}, {lot_b} has "
                           f"{_value(value_b)}; every lot declares the same header (only its declaration times "
                           f"are its own)")


def file_differs(rel: str, lot_a: str, entry_a: tuple[str, str], lot_b: str, entry_b: tuple[str, str]) -> Finding:
    """`entry`: (file, its sha256), (symlink, its target) or (directory, ""), listed or implied by a path."""
    if entry_a[0] == entry_b[0] == "file":
        return Finding("IV615", rel, message=f"both parts hold {rel} and it differs (sha256 {entry_a[1][:12]}… on "
                                             f"{lot_a}, {entry_b[1][:12]}… on {lot_b}): a file both lots hold must "
                                             f"be byte for byte the same")
    return Finding("IV615", rel, message=f"both parts hold {rel} and it differs ({_entry(entry_a)} on {lot_a}, "
                                         f"{_entry(entry_b)} on {lot_b}): joined, one part's files would lie "
                                         f"beneath, or in place of, the other's")


def _entry(entry: tuple[str, str]) -> str:
    kind, detail = entry
    if kind == "symlink":
        return f"a link to {_value(detail)}"
    return "a folder" if kind == "directory" else f"a file (sha256 {detail[:12]}…)"


def part_holds(lot: str | None, what: str, path: str, pointer: str | None) -> Finding:
    return Finding("IV615", path, pointer=pointer,
                   message=f"the part{f' of {lot}' if lot else ''} holds {what}, which only the assembled campaign "
                           f"holds: close the campaign and record the provenance on the assembling machine "
                           f"(itera-verify assemble, then close)")


def run_on_two_lots(run_id: str, lot_a: str, lot_b: str) -> Finding:
    return Finding("IV616", MANIFEST, run=run_id,
                   message=f"run {run_id} is in the parts of {lot_a} and {lot_b}: a run ran on one machine; give "
                           f"the other its own id (a rerun is a new run)")


def artifact_on_two_lots(artifact_id: str, lot_a: str, lot_b: str) -> Finding:
    return Finding("IV616", MANIFEST, artifact=artifact_id,
                   message=f"artifact {artifact_id} is in the parts of {lot_a} and {lot_b}: an artifact belongs to "
                           f"one run, on one lot")


def unknown_lot(run_id: str, lot: str, declared: list[str], path: str = MANIFEST,
                pointer: str | None = None) -> Finding:
    return Finding("IV616", path, pointer=pointer, run=run_id,
                   message=f"run {run_id} ran on lot {lot!r}, which the plan does not name "
                           f"({', '.join(declared) or 'its lots have no id'}): name it in plan.lots[].id, or fix "
                           f"the run's lot")


def part_of_unknown_lot(archive: str, lot: str, declared: list[str], path: str,
                        pointer: str | None = None) -> Finding:
    return Finding("IV616", path, pointer=pointer,
                   message=f"part {archive} holds the runs of lot {lot!r}, which the plan does not name "
                           f"({', '.join(declared) or 'its lots have no id'})")


def named_for_another_lot(archive: str, named: str, lot: str) -> Finding:
    return Finding("IV616", archive, message=f"{archive} is named for lot {named} but its runs ran on {lot}: a "
                                             f"part is sealed under its own lot's name")


def sealed_twice(lot: str, first: str, second: str, path: str, pointer: str | None = None) -> Finding:
    return Finding("IV617", path, pointer=pointer,
                   message=f"two parts for lot {lot}: {first} and {second}; one lot seals one part (keep its last "
                           f"seal)")


def _value(value) -> str:
    text = json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)
    return text if len(text) <= 120 else text[:117] + "..."
