"""One campaign on several lots (docs/record.md, "Two lots"): each machine opens its own folder with
`open_campaign(..., lot="lot-b")`, declares the same plan (whose lots carry ids), and records its own runs, each
with `runs[].lot`. Here: what the recorder refuses about lots, said before anything is written."""
from __future__ import annotations

from ..format.parts import lot_ids, run_lot, runs_lots
from .errors import RecordError
from .ids import check_id


def check_lot(lot: str | None) -> str | None:
    return None if lot is None else check_id("lot", lot)


def check_reopen(manifest: dict, lot: str | None, root) -> None:
    """A folder records one lot's runs: reopening it as another lot is refused (its runs ran elsewhere)."""
    if lot is None:
        return
    others = [other for other in runs_lots(manifest) if other != lot]
    if others:
        raise RecordError(f"{root} holds the runs of lot {others[0]!r}, not {lot!r}: each lot records its part in "
                          "its own folder (assemble joins them)")


def check_plan_lots(lots: list[dict], lot: str | None) -> None:
    """Lot ids: safe names, each once; the lot this machine is must be one of them."""
    ids = [check_id("a lot's id", entry["id"]) for entry in lots if "id" in entry]
    twice = sorted({i for i in ids if ids.count(i) > 1})
    if twice:
        raise RecordError(f"plan lots: two lots named {twice[0]!r}; give each lot its own id")
    if lot is not None and lot not in ids:
        raise RecordError(f"this campaign was opened as lot {lot!r}, which the plan's lots do not name "
                          f"({', '.join(ids) or 'no lot has an id'}): give the lots their ids ({{\"id\": "
                          f"{lot!r}, \"gpu\": ...}})")


def lot_of_new_run(manifest: dict, lot: str | None, run_id: str) -> str | None:
    """The lot a run starting here ran on; with several lots in the plan the machine must say which it is."""
    declared = lot_ids(manifest.get("plan"))
    if lot is None:
        if len(set(declared)) > 1:
            raise RecordError(f"run {run_id!r}: the plan has {len(set(declared))} lots ({', '.join(declared)}); "
                              "say which one this machine is: open_campaign(..., lot=\"lot-a\")")
        return None
    if lot not in declared:
        raise RecordError(f"run {run_id!r}: this machine is lot {lot!r}, which the plan's lots do not name "
                          f"({', '.join(declared) or 'no lot has an id'})")
    return lot


def check_continued(old: dict, lot: str | None, run_id: str) -> None:
    """A run continued after a reopen stays on the lot it started on."""
    if lot is not None and run_lot(old) not in (None, lot):
        raise RecordError(f"run {run_id!r} was started on lot {run_lot(old)!r}, not {lot!r}")
