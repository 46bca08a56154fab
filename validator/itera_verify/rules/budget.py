"""IV601–IV611, IV614: the budget and the timeline. What was bought, what it cost per accepted run, what was decided.

The arithmetic is exact to the cent (decimal, not float): 47.14 + 1.50 over 2 accepted runs is 24.32.
"""
from __future__ import annotations

from decimal import Decimal
from typing import Iterator

from ..model import Finding, Rule, Severity
from ..package import MANIFEST, RunContext, facts, pointer_of
from ..format.money import fmt_usd, lots, to_cent, usd
from ..package.budget import catalog_price, longer_lot, lot_name, tariffs
from ..package.campaign import (accepted_entries, filled_text, fmt_hours,
                                is_number, listed, runs_by_id, section, shown)

RULES = [
    Rule("IV601", Severity.ERROR, "rental total is not the sum of the lots",
         explain="`plan.rental_total_usd` is the sum of the lots' `price_usd`, to the cent. A lot's price already "
                 "covers all of its GPUs: multiplying a 2-GPU lot's price by 2 counts the GPUs twice.",
         bad='"lots": [{"gpu": "RTX 4090", "days": 3, "gpus": 2, "price_usd": 94.28}], "rental_total_usd": 188.56',
         good='"lots": [{"gpu": "RTX 4090", "days": 3, "gpus": 2, "price_usd": 94.28}], "rental_total_usd": 94.28'),
    Rule("IV602", Severity.WARNING, "lot price differs from the catalog",
         explain="The lot's price differs from the tariff catalog (RTX 4090: 47.14 USD for 3 days, 110 for 7, 390 "
                 "for 30). Either the offer changed (update the catalog with [tool.itera-verify.tariffs]) or the "
                 "price was copied wrong.",
         bad='{"gpu": "RTX 4090", "days": 3, "gpus": 1, "price_usd": 41.47}',
         good='{"gpu": "RTX 4090", "days": 3, "gpus": 1, "price_usd": 47.14}'),
    Rule("IV603", Severity.ERROR, "observed hours exceed the lots' window",
         explain="Lots bought together run side by side: the window is the longest lot, days x 24 hours. "
                 "`timeline.observed_hours` (wall clock from preparation to retrieval of the results) beyond it "
                 "means the machine was gone before the work ended, or more was spent than planned. Buy the "
                 "next lot (the finding names it) or reduce the protocol. When the runs say which lot they ran "
                 "on (`runs[].lot`), each lot is judged on its own: from its `started_at` (else its first run) "
                 "to its last run's end, against its own days.",
         bad='"lots": [{"days": 3, ...}], "timeline": {"observed_hours": 78}',
         good='"lots": [{"days": 7, "price_usd": 110, ...}], "timeline": {"observed_hours": 78}'),
    Rule("IV604", Severity.ERROR, "wrong cost per accepted run",
         explain="`decision.cost_per_accepted_usd` = (rental + included other expenses) / number of accepted "
                 "runs, to the cent. With nothing accepted the ratio is undefined: state the cost incurred and "
                 "why nothing was accepted, never a cost per run, and never a cost of zero.",
         bad='47.14 + 1.50 included, 2 accepted: "cost_per_accepted_usd": 23.57',
         good='47.14 + 1.50 included, 2 accepted: "cost_per_accepted_usd": 24.32'),
    Rule("IV605", Severity.WARNING, "hours differ without an explained deviation",
         explain="When observed and reserved hours differ, `timeline.deviations` explains the difference: the "
                 "signed hours of explained deviations add up to observed - reserved (within 0.1 h). That is "
                 "what the next campaign's plan learns from. The recorder writes one with "
                 "`campaign.deviation(hours, explanation)`.",
         bad='"reserved_hours": 48, "observed_hours": 52.5, "deviations": []',
         good='"reserved_hours": 48, "observed_hours": 52.5, "deviations": [{"hours": 4.5, "explanation": '
              '"eval on long inputs took longer than the pilot suggested"}]'),
    Rule("IV606", Severity.ERROR, "reserved hours exceed the window",
         explain="`plan.reserved_hours` is the part of the window the plan commits; it cannot exceed "
                 "`plan.window_hours`, which itself cannot exceed the lots' window (the longest lot, days x 24). "
                 "Keep a margin: window - reserved is what absorbs the unexpected.",
         bad='"window_hours": 72, "reserved_hours": 80', good='"window_hours": 72, "reserved_hours": 48'),
    Rule("IV607", Severity.ERROR, "no decision",
         explain="A campaign closes with a decision: `decision.outcome` (positive, negative or inconclusive) and "
                 "a `decision.summary` in words. A negative or inconclusive result is a valid deliverable; no "
                 "decision is not.",
         bad='"decision": {"accepted": ["control"]}',
         good='"decision": {"outcome": "negative", "summary": "lora-r16 stays under 0.80 macro-F1", "accepted": []}'),
    Rule("IV608", Severity.WARNING, "no error analysis",
         explain="The decision rests on an error analysis (`decision.error_analysis`, a file or folder in the "
                 "package): which examples fail, and why. Scores alone do not say whether a variant fails "
                 "differently from the control.",
         bad='"decision": {"outcome": "positive", "summary": "..."}',
         good='"decision": {"outcome": "positive", "summary": "...", "error_analysis": "analysis/errors.md"}'),
    Rule("IV609", Severity.ERROR, "accepted run named twice or repeated",
         explain="Each accepted run counts once, and two accepted runs with the same `config_sha256` are one "
                 "configuration replayed on the same corpus: a repeat does not make another deliverable, and "
                 "counting it halves the cost per accepted run.",
         bad='"accepted": ["control", "lora-r16", "lora-r16"]', good='"accepted": ["control", "lora-r16"]'),
    Rule("IV610", Severity.WARNING, "plan declared after the first run started",
         explain="`plan.declared_at` is when the plan (window, reserved hours, lots) was fixed. A plan written "
                 "after the first run can be made to fit what happened; plan and actual are compared, the plan "
                 "is never rewritten.",
         bad='"plan": {"declared_at": "2026-11-21T10:00:00Z"}   (first run started 2026-11-20T09:00:00Z)',
         good='"plan": {"declared_at": "2026-11-20T08:00:00Z"}'),
    Rule("IV611", Severity.WARNING, "no decision after the pilot",
         explain="The pilot is where the plan meets reality: after it, decide to continue, reduce or stop, and "
                 "record it in `timeline.decisions` with `\"after\": \"pilot\"`.",
         bad='"timeline": {"observed_hours": 52.5, "decisions": []}',
         good='"decisions": [{"at": "2026-11-20T12:00:00Z", "after": "pilot", "decision": "reduce", '
              '"note": "dropped the r=64 sweep"}]'),
    Rule("IV614", Severity.INFO, "lot not in the catalog",
         explain="IV602 compares a lot's price with the tariff catalog; a lot the catalog does not price (another "
                 "GPU, another number of GPUs, another length) is not compared, and the report says so rather "
                 "than pass it in silence. Add the offer to the configuration's tariffs "
                 "([tool.itera-verify.tariffs], \"GPU\" = { \"DAYS\" = USD }, \"2x GPU\" for a 2-GPU lot) and the "
                 "lot is checked like a catalog lot.",
         bad='{"gpu": "B200", "days": 3, "gpus": 1, "price_usd": 500}   (no B200 in the catalog)',
         good='[tool.itera-verify.tariffs]\n"B200" = { "3" = 500 }'),
]

DEVIATION_TOLERANCE_HOURS = 0.1


# ---------------------------------------------------------------------------------------------- checks

def check(ctx: RunContext) -> Iterator[Finding]:
    manifest = ctx.documents.manifest
    if not manifest:
        return  # missing or unparsable manifest: IV101/IV104 say so
    plan, spent, hours = section(manifest, "plan"), facts.budget(ctx), facts.hours(ctx)
    yield from _rental_total(spent)
    yield from _catalog_prices(plan, tariffs(ctx))
    used = facts.lots_used(ctx)
    if used:  # runs say which lot they ran on: each lot against its own window, not the campaign's hours
        yield from _lots_within_their_windows(used, tariffs(ctx))
    else:
        yield from _observed_within_window(hours, tariffs(ctx))
    yield from _deviations_explained(hours, "deviations" in section(manifest, "timeline"))
    yield from _reserved_within_window(hours)
    yield from _accepted_once(ctx)
    yield from _plan_declared_first(hours)
    if ctx.options.part:
        return  # a lot's part: the decision, its cost per run and the pilot's are the assembled campaign's
    yield from _cost_per_accepted(ctx, spent)
    yield from _decision_recorded(ctx)
    yield from _error_analysis(ctx)
    yield from _pilot_decision(ctx)


def _rental_total(spent: facts.Budget) -> Iterator[Finding]:
    stated, summed = spent.rental_stated, spent.rental
    if stated is None or summed is None or to_cent(stated) == to_cent(summed):
        return
    multiplied = sum((usd(lot["price_usd"]) * (usd(lot.get("gpus")) or 1) for _, lot in spent.lots), Decimal(0))
    hint = ""
    if to_cent(multiplied) == to_cent(stated):
        hint = " (the lot prices look multiplied by their GPUs: a lot's price already covers all of its GPUs)"
    yield Finding("IV601", MANIFEST, pointer="/plan/rental_total_usd",
                  message=f"rental_total_usd is {fmt_usd(stated)} but the lots add up to {fmt_usd(summed)}{hint}: "
                          f"state the sum of the lot prices")


def _catalog_prices(plan: dict, catalog: dict) -> Iterator[Finding]:
    for index, lot in lots(plan):
        stated, listed_price = usd(lot.get("price_usd")), catalog_price(catalog, lot)
        if stated is not None and listed_price is None:
            yield _unpriced(index, lot, stated, catalog)
        if stated is None or listed_price is None or to_cent(stated) == to_cent(listed_price):
            continue
        yield Finding("IV602", MANIFEST, pointer=pointer_of(["plan", "lots", index, "price_usd"]),
                      message=f"lot {index} ({lot_name(lot)}, {shown(lot.get('days'))} days) costs {fmt_usd(stated)} "
                              "but "
                              f"the catalog says {fmt_usd(listed_price)}: check the offer, or update the catalog "
                              f"([tool.itera-verify.tariffs]) if the price changed")


def _unpriced(index: int, lot: dict, stated: Decimal, catalog: dict) -> Finding:
    name, days = lot_name(lot), shown(lot.get("days"))
    lengths = catalog.get(name)
    known = (f"the catalog prices {name} for {', '.join(sorted(lengths, key=_length))} days only"
             if isinstance(lengths, dict) and lengths else f"the catalog has no {name} lot")
    return Finding("IV614", MANIFEST, pointer=pointer_of(["plan", "lots", index]),
                   message=f"lot {index} ({name}, {days} days, {fmt_usd(stated)}) is not compared with any tariff: "
                           f"{known}; add it to the configuration's tariffs ([tool.itera-verify.tariffs] "
                           f"\"{name}\" = {{ \"{days}\" = {stated} }}) to check its price")


def _length(days: str) -> float:
    try:
        return float(days)
    except ValueError:
        return float("inf")


def _observed_within_window(hours: facts.Hours, catalog: dict) -> Iterator[Finding]:
    observed, window = hours.observed, hours.lots_window
    if observed is None or window is None or observed <= window[0]:
        return
    hours, longest = window
    longer = longer_lot(catalog, longest, observed)
    remedy = (f"consider the {longer[0]:g}-day lot ({_price(longer[1])})" if longer else "consider a longer lot") \
        + " or a reduced protocol"
    yield Finding("IV603", MANIFEST, pointer="/timeline/observed_hours",
                  message=f"observed {fmt_hours(observed)} exceeds the {longest['days']:g}-day lot window "
                          f"({fmt_hours(hours)}) by {fmt_hours(round(observed - hours, 2))}: {remedy}")


def _lots_within_their_windows(used: tuple[facts.Lot, ...], catalog: dict) -> Iterator[Finding]:
    """Lots that say which runs ran on them: each lot's machine from its start to its last run's end, against
    its own days (lots bought at different moments: the campaign's hours span them all)."""
    for lot in used:
        observed, window = lot.observed_hours, lot.window_hours
        if observed is None or window is None or observed <= window:
            continue
        longer = longer_lot(catalog, lot.lot, observed)
        remedy = (f"consider the {longer[0]:g}-day lot ({_price(longer[1])})" if longer else
                  "consider a longer lot") + " or a reduced protocol"
        yield Finding("IV603", MANIFEST, pointer=pointer_of(["plan", "lots", lot.index]),
                      message=f"lot {lot.id} ran {fmt_hours(observed)} (from {lot.started_at:%Y-%m-%dT%H:%M:%SZ} "
                              f"to its last run's end), beyond its {lot.lot['days']:g}-day window "
                              f"({fmt_hours(window)}) by {fmt_hours(round(observed - window, 2))}: {remedy}")


def _price(amount: Decimal) -> str:
    """110 USD, 47.14 USD: catalog prices as people quote them."""
    return f"{amount:.0f} USD" if amount == amount.to_integral_value() else fmt_usd(amount)


def _cost_per_accepted(ctx: RunContext, spent: facts.Budget) -> Iterator[Finding]:
    decision = section(ctx.documents.manifest, "decision")
    stated = decision.get("cost_per_accepted_usd")
    if stated is None or not is_number(stated):
        return  # optional; a wrong type is a schema finding
    pointer = "/decision/cost_per_accepted_usd"
    accepted, total = spent.accepted_declared, spent.total
    if not accepted:
        incurred = f" (cost incurred: {fmt_usd(total)})" if total is not None else ""
        yield Finding("IV604", MANIFEST, pointer=pointer,
                      message=f"cost_per_accepted_usd is {fmt_usd(stated)} but nothing was accepted: the ratio is "
                              f"undefined; remove it and report the cost incurred{incurred} and why nothing was "
                              f"accepted")
    elif usd(stated) == 0 and spent.cost_per_declared != 0:  # a total under half a cent per run
        yield Finding("IV604", MANIFEST, pointer=pointer,
                      message="cost_per_accepted_usd is 0: a campaign is never free; state (rental + included "
                              "other expenses) / accepted runs")
    elif usd(stated) is None:
        yield Finding("IV604", MANIFEST, pointer=pointer,
                      message=f"cost_per_accepted_usd is {stated!r}: not a usable amount in USD; state (rental + "
                              f"included other expenses) / accepted runs")
    elif total is not None:
        expected = spent.cost_per_declared
        if to_cent(usd(stated)) != expected:
            yield Finding("IV604", MANIFEST, pointer=pointer,
                          message=f"cost_per_accepted_usd is {fmt_usd(stated)} but {fmt_usd(total)} (rental + "
                                  f"included other expenses) / {len(accepted)} accepted runs is "
                                  f"{fmt_usd(expected)}")


def _deviations_explained(hours: facts.Hours, listed_deviations: bool) -> Iterator[Finding]:
    gap, observed, reserved = hours.gap, hours.observed, hours.reserved
    if gap is None:
        return
    explained, unexplained = hours.explained, hours.unexplained
    if abs(gap - explained) <= DEVIATION_TOLERANCE_HOURS:
        return
    extra = f" ({unexplained:g} h more listed without an explanation)" if unexplained else ""
    yield Finding("IV605", MANIFEST, pointer="/timeline/deviations" if listed_deviations else "/timeline",
                  message=f"observed {fmt_hours(observed)} vs reserved {fmt_hours(reserved)}: "
                          f"{round(gap, 2):+g} h to explain, explained deviations add up to {round(explained, 2):+g} h"
                          f"{extra}: record it with campaign.deviation({round(gap - explained, 2):g}, \"why\") "
                          f"(or add {{\"hours\": {round(gap - explained, 2):g}, \"explanation\": \"why\"}} to "
                          f"timeline.deviations)")


def _reserved_within_window(hours: facts.Hours) -> Iterator[Finding]:
    window, reserved = hours.window, hours.reserved
    if window is not None and reserved is not None and reserved > window:
        yield Finding("IV606", MANIFEST, pointer="/plan/reserved_hours",
                      message=f"reserved {fmt_hours(reserved)} exceeds the window of {fmt_hours(window)} by "
                              f"{fmt_hours(round(reserved - window, 2))}: reserve at most the window, and keep a "
                              f"margin")
    lots_window = hours.lots_window
    if window is not None and lots_window is not None and window > lots_window[0]:
        yield Finding("IV606", MANIFEST, pointer="/plan/window_hours",
                      message=f"window_hours {fmt_hours(window)} exceeds what the lots provide (the "
                              f"{lots_window[1]['days']:g}-day lot: {fmt_hours(lots_window[0])}): buy a longer lot "
                              f"or plan within it")


def _decision_recorded(ctx: RunContext) -> Iterator[Finding]:
    decision = ctx.documents.manifest.get("decision")
    if decision is None:
        yield Finding("IV607", MANIFEST, pointer="",
                      message="no decision: add decision.outcome (positive, negative or inconclusive) and "
                              "decision.summary; a negative result is a valid deliverable")
        return
    if not isinstance(decision, dict):
        return  # a wrong type is a schema finding
    for key, what in (("outcome", "positive, negative or inconclusive"), ("summary", "the conclusion in words")):
        if filled_text(decision.get(key)) is None:
            yield Finding("IV607", MANIFEST, pointer=f"/decision/{key}" if key in decision else "/decision",
                          message=f"the decision has no {key}: give {what}")


def _error_analysis(ctx: RunContext) -> Iterator[Finding]:
    decision = ctx.documents.manifest.get("decision")
    if not isinstance(decision, dict):
        return  # IV607 already says there is no decision
    ref = decision.get("error_analysis")
    if filled_text(ref) is None:
        yield Finding("IV608", MANIFEST, pointer="/decision/error_analysis" if "error_analysis" in decision
                      else "/decision", message="no error analysis for the decision: write one (e.g. "
                                                "analysis/errors.md) and name it in decision.error_analysis")
        return
    rel = ctx.inventory.normalise_ref(ref)
    if rel is None:
        return  # IV205 reports an escaping path
    if not ctx.inventory.exists(rel):
        yield Finding("IV608", MANIFEST, pointer="/decision/error_analysis",
                      message=f"the error analysis {ref} is not in the package: deliver it")
    elif rel in ctx.inventory.dirs and not ctx.inventory.files_under(rel):
        yield Finding("IV608", MANIFEST, pointer="/decision/error_analysis",
                      message=f"the error analysis folder {ref} holds no file")


def _accepted_once(ctx: RunContext) -> Iterator[Finding]:
    runs = runs_by_id(ctx)
    first_by_name: dict[str, int] = {}
    first_by_config: dict[str, str] = {}
    for index, name in accepted_entries(ctx):
        pointer = pointer_of(["decision", "accepted", index])
        if name in first_by_name:
            yield Finding("IV609", MANIFEST, pointer=pointer,
                          message=f"decision.accepted names run {name} twice (entries {first_by_name[name]} and "
                                  f"{index}): each run counts once")
            continue
        first_by_name[name] = index
        config = filled_text(runs.get(name, {}).get("config_sha256"))
        if config is None:
            continue
        config = config.lower()
        if config in first_by_config:
            yield Finding("IV609", MANIFEST, pointer=pointer, run=name,
                          message=f"accepted runs {first_by_config[config]} and {name} have the same "
                                  f"config_sha256: replaying the same corpus and configuration does not make "
                                  f"another deliverable; accept one of them")
        else:
            first_by_config[config] = name


def _plan_declared_first(hours: facts.Hours) -> Iterator[Finding]:
    declared, first = hours.declared, hours.first_run
    if declared is None or first is None or declared <= first[0]:
        return
    late = (declared - first[0]).total_seconds() / 3600
    yield Finding("IV610", MANIFEST, pointer="/plan/declared_at",
                  message=f"the plan was declared at {hours.declared_at}, {late:.4g} h after run "
                          f"{first[1] or first[2]} started: plan and actual are compared as they are; declare the "
                          f"plan before the first run next time, and never rewrite it")


def _pilot_decision(ctx: RunContext) -> Iterator[Finding]:
    timeline = ctx.documents.manifest.get("timeline")
    if timeline is not None and not isinstance(timeline, dict):
        return  # a wrong type is a schema finding
    decisions = listed(timeline or {}, "decisions")
    for entry in decisions:
        if isinstance(entry, dict) and isinstance(entry.get("after"), str) \
                and entry["after"].strip().lower() == "pilot" and filled_text(entry.get("decision")):
            return
    pointer = "/timeline/decisions" if isinstance(timeline, dict) and "decisions" in timeline else \
        ("/timeline" if timeline is not None else "")
    yield Finding("IV611", MANIFEST, pointer=pointer,
                  message='no decision recorded after the pilot: add {"at": ..., "after": "pilot", "decision": '
                          '"continue | reduce | stop", "note": ...} to timeline.decisions')
