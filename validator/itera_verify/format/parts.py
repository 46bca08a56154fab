"""One campaign on several lots (docs/record.md, "Two lots"): the names a part and an assembled package use.

Each lot seals its part as `<campaign_id>.<lot>.part.tar.zst`; `itera-verify assemble` writes one package whose
`manifest.parts[]` names each part, and keeps each part's own records (its SEAL/ records and its three documents,
as sealed) under `provenance/<lot>/`. The recorder, the checks, the seal and assemble read these names here.
"""
from __future__ import annotations

from .names import ID, MANIFEST, RECORD, RELOAD, STATEMENT, STATEMENT_SIG, STOPS, SUMS

PART_SUFFIX = ".part.tar.zst"
PROVENANCE = "provenance"  # the assembled package's folder of the parts' own records (assemble writes it alone)
# A part's records kept under provenance/<lot>/: its seal's members (a SEAL/ member -> its name there), and the
# three documents assemble merges (the part's own bytes, which its SHA256SUMS lists).
SEAL_RECORDS = {member: member.split("/", 1)[1] for member in (SUMS, RECORD, STATEMENT, STATEMENT_SIG)}
MERGED_DOCUMENTS = (MANIFEST, STOPS, RELOAD)
# The header every lot declares alike (compared whole); the times in it are each machine's own, and the
# assembled package keeps the earliest of each.
HEADER_TIMES = (("created_at",), ("plan", "declared_at"), ("stop_rules", "declared_at"))
LOT_TIMES = ("started_at",)  # a lot's own, known on its own machine: the assembled plan takes it from that lot's part
# Per-lot sections of a part's manifest (merged, not compared), and what only the assembled campaign holds.
PER_LOT_KEYS = ("runs", "artifacts", "timeline")
WHOLE_CAMPAIGN_KEYS = ("decision", "parts")
# What the close writes over every lot's runs, and a part therefore lacks: (the object, its required key).
CLOSING_FIELDS = (("timeline", "observed_hours"),)


def part_archive_stem(campaign_id: str, lot: str | None) -> str:
    """`<campaign_id>.<lot>.part` (the archive adds .tar.zst); a part naming no lot is `<campaign_id>.part`."""
    return f"{campaign_id}.{lot}.part" if lot else f"{campaign_id}.part"


def is_part_archive(name: str) -> bool:
    return name.endswith(PART_SUFFIX)


def lot_of_archive_name(name: str, campaign_id: str) -> str | None:
    """The lot a part archive's name gives (`<campaign_id>.<lot>.part.tar.zst`), None when it names none."""
    prefix = f"{campaign_id}."
    if not (name.startswith(prefix) and name.endswith(PART_SUFFIX)):
        return None
    lot = name[len(prefix):-len(PART_SUFFIX)]
    return lot if ID.fullmatch(lot) else None


def lot_ids(plan) -> list[str]:
    """The ids the plan gives its lots, in order (lots without an id are not counted)."""
    lots = plan.get("lots") if isinstance(plan, dict) else None
    return [lot["id"] for lot in (lots if isinstance(lots, list) else [])
            if isinstance(lot, dict) and isinstance(lot.get("id"), str)]


def run_lot(run) -> str | None:
    return run.get("lot") if isinstance(run, dict) and isinstance(run.get("lot"), str) else None


def runs_lots(manifest) -> list[str]:
    """The distinct lots the manifest's runs name, in order of first mention."""
    runs = manifest.get("runs") if isinstance(manifest, dict) else None
    found: list[str] = []
    for run in runs if isinstance(runs, list) else []:
        lot = run_lot(run)
        if lot is not None and lot not in found:
            found.append(lot)
    return found


def part_lot(manifest) -> str | None:
    """The lot a part holds: the one lot its runs name; None when they name none or several."""
    lots = runs_lots(manifest)
    return lots[0] if len(lots) == 1 else None
