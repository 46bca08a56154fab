"""The report's words for a campaign on several lots (docs/record.md, "Two lots"): a line per lot (its runs, its
hours against its window, its part), what a part leaves to the assembled campaign, and where each artifact was
reloaded. The facts are package/facts.py's (`lots_used`) and the reloads' (flows/partproofs.py); nothing here
judges them."""
from __future__ import annotations

from typing import Any

from ..format.parts import part_lot
from ..model import ReloadResult
from ..package import facts
from ..package.campaign import listed
from .words import clean

LEFT_TO_THE_CAMPAIGN = ("the decision", "exactly one control", "the cost per accepted run")


def _iso(moment) -> str | None:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ") if moment is not None else None


def _scalar(value: Any) -> Any:
    return value if isinstance(value, (str, int, float)) and not isinstance(value, bool) else None


def lots_summary(ctx) -> list[dict[str, Any]]:
    """One line per lot when the runs say where they ran: [] for a campaign on one machine."""
    runs = listed(ctx.documents.manifest, "runs")
    parts = {p.get("lot"): p for p in listed(ctx.documents.manifest, "parts") if isinstance(p, dict)}
    lot_of_artifact = {}
    for lot in facts.lots_used(ctx):
        mine = {runs[i].get("id") for i in lot.runs}
        lot_of_artifact.update({a.get("id"): lot.id for a in ctx.documents.artifacts() if a.get("run") in mine})
    reloads = list(ctx.reloads or [])
    out = []
    for lot in facts.lots_used(ctx):
        part = parts.get(lot.id)
        on_lot = [r.artifact for r in reloads if lot_of_artifact.get(r.artifact) == lot.id and reloaded_on(r)]
        here = [r.artifact for r in reloads if lot_of_artifact.get(r.artifact) == lot.id and r.ok
                and not reloaded_on(r)]
        out.append({
            "id": lot.id, "gpu": _scalar(lot.lot.get("gpu")), "gpus": lot.gpus, "days": _scalar(lot.lot.get("days")),
            "price_usd": _scalar(lot.lot.get("price_usd")), "window_hours": lot.window_hours,
            "started_at": _iso(lot.started_at), "last_run_ended_at": _iso(lot.ended_at),
            "observed_hours": lot.observed_hours,
            "runs": [runs[i].get("id") for i in lot.runs if isinstance(runs[i].get("id"), str)],
            "part": None if part is None else {k: _scalar(part.get(k)) for k in ("archive", "sha256", "signer")},
            "reloaded_here": here, "reloaded_on_the_lot": on_lot})
    return out


def part_summary(ctx) -> dict[str, Any] | None:
    """A lot's part (--part): which lot, and what its checks leave to the assembled campaign."""
    if not ctx.options.part:
        return None
    return {"lot": part_lot(ctx.documents.manifest), "left_to_the_assembled_campaign": list(LEFT_TO_THE_CAMPAIGN)}


def reloaded_on(reload: ReloadResult) -> dict | None:
    """The lot's signed proof an artifact stands on (flows/partproofs.py), None when it was not needed."""
    return reload.lot_proof


def where_words(reload: ReloadResult) -> str:
    """`not reloaded here (cpu: <why>); stands on lot-b's signed proof: reloaded there on cuda:0, signed by …`,
    or ""."""
    where = reloaded_on(reload)
    if where is None:
        return ""
    here = where.get("here") if isinstance(where.get("here"), dict) else {}
    return (f"not reloaded here ({clean(here.get('device'))}: {clean(here.get('error'))}); stands on "
            f"{clean(where.get('lot'))}'s signed proof: reloaded there on {clean(where.get('device'))}, its part "
            f"signed by {clean(where.get('signer'))}")


def part_words(part: dict) -> str:
    left = ", ".join(clean(w) for w in part.get("left_to_the_assembled_campaign") or [])
    return f"a part of lot {clean(part.get('lot')) or '?'}: {left} are checked on the assembled campaign"


def lot_line(lot: dict) -> str:
    """`lot-b: RTX 4090 × 1, 3 days, 47.14 USD; runs lora-r8, lora-r16; 5.2 h of its 72 h; part ... signed by ...`"""
    hours = lot.get("observed_hours")
    part = lot.get("part") if isinstance(lot.get("part"), dict) else None
    runs = ", ".join(clean(r) for r in lot.get("runs") or []) or "none"
    words = (f"{clean(lot.get('id'))}: {clean(lot.get('gpu'))} × {clean(lot.get('gpus'))}, {clean(lot.get('days'))} "
             f"days; runs {runs}; "
             + (f"{hours:g} h of its {clean(lot.get('window_hours'))} h" if isinstance(hours, (int, float))
                else "hours unknown"))
    if part is not None:
        words += (f"; part {clean(part.get('archive'))}, signed by {clean(part.get('signer'))}"
                  if part.get("signer") else f"; part {clean(part.get('archive'))}, unsigned")
    on_lot = lot.get("reloaded_on_the_lot") or []
    if on_lot:
        words += f"; reloaded on the lot only: {', '.join(clean(a) for a in on_lot)}"
    return words
