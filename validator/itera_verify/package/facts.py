"""The campaign's derived facts, computed in one place: what the budget adds up to, the cost per accepted run,
and the plan next to what happened. The budget and timeline rules (rules/budget.py) judge these facts and the
report (report/summary.py) words them; neither derives them again (docs/architecture.md).

Each is computed once per run context (the context's documents reader keeps it) from the manifest alone: the
report's "accepted runs that passed every check" adds the findings, which only the report has.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from ..format.money import cost_per_accepted, lots, other_expenses, rental_usd, total_usd, usd
from ..format.parts import run_lot
from ..format.values import is_number, listed
from .budget import lots_window_hours
from .campaign import accepted_declared, filled_text, first_run_start, indexed_runs, parse_time, runs_by_id, \
    section, stopped_by_record


@dataclass(frozen=True)
class Budget:
    """What was bought and what it cost: the lots' sum, the stated total, the included and excluded expenses,
    and the cost per run the decision accepts."""

    lots: tuple[tuple[int, dict], ...]
    rental: Decimal | None  # the sum of the lots' prices (None: no lot, or a price that cannot be read)
    rental_stated: Decimal | None  # plan.rental_total_usd
    total: Decimal | None  # rental (else the stated one) + included other expenses
    included: tuple[tuple[str, Decimal], ...]
    excluded: tuple[tuple[str, Decimal], ...]
    accepted_declared: tuple[str, ...]  # the distinct runs decision.accepted names, in order
    stopped: tuple[str, ...]  # runs stopped by their status or by a stop record

    @property
    def cost_per_declared(self) -> Decimal | None:
        """total / the runs the decision accepts (IV604's expectation); None when nothing is accepted."""
        return cost_per_accepted(self.total, len(self.accepted_declared))


@dataclass(frozen=True)
class Deviation:
    hours: float | None
    explanation: str | None


@dataclass(frozen=True)
class Hours:
    """The plan's hours next to what happened (plan.window_hours, reserved_hours; timeline.observed_hours)."""

    window: float | None
    reserved: float | None
    observed: float | None
    lots_window: tuple[float, dict] | None  # (hours, the longest lot): lots bought together run side by side
    deviations: tuple[Deviation, ...]
    declared_at: str | None  # plan.declared_at, as written
    first_run: tuple[datetime, str | None, int] | None  # the earliest readable start: (time, run id, index)

    @property
    def explained(self) -> float:
        """The signed hours of the deviations that carry an explanation."""
        return sum(d.hours for d in self.deviations if d.hours is not None and filled_text(d.explanation))

    @property
    def unexplained(self) -> float:
        return sum(d.hours for d in self.deviations if d.hours is not None and not filled_text(d.explanation))

    @property
    def gap(self) -> float | None:
        """observed - reserved: what the deviations must explain."""
        return self.observed - self.reserved if self.observed is not None and self.reserved is not None else None

    @property
    def declared(self) -> datetime | None:
        return parse_time(self.declared_at)


@dataclass(frozen=True)
class Lot:
    """One lot of the plan and what ran on it (runs[].lot names its id): a machine of its own, with its own
    window (days x 24 h from its started_at, else from its first run) and its own GPUs."""

    index: int
    id: str | None
    lot: dict
    runs: tuple[int, ...]  # indexes in manifest.runs
    started_at: datetime | None  # the lot's started_at, else its first run's start
    ended_at: datetime | None  # its last run's end (runs without an end are not counted)

    @property
    def window_hours(self) -> float | None:
        days = self.lot.get("days")
        return days * 24 if is_number(days) and days > 0 else None

    @property
    def gpus(self) -> int:
        count = self.lot.get("gpus")
        return count if isinstance(count, int) and not isinstance(count, bool) and count >= 1 else 1

    @property
    def observed_hours(self) -> float | None:
        """From the lot's start to its last run's end: the hours its machine was used."""
        if self.started_at is None or self.ended_at is None or self.ended_at < self.started_at:
            return None
        return round((self.ended_at - self.started_at).total_seconds() / 3600, 2)


def lots_used(ctx) -> tuple[Lot, ...]:
    """Each lot of the plan with its runs, when the campaign says where its runs ran (a lot id that a run
    names); () for a campaign on one machine as before (no run names a lot), whose hours and GPUs are the
    whole campaign's."""
    return ctx.documents.derived("lots", lambda: _lots_used(ctx))


def budget(ctx) -> Budget:
    return ctx.documents.derived("budget", lambda: _budget(ctx))


def hours(ctx) -> Hours:
    return ctx.documents.derived("hours", lambda: _hours(ctx))


def _budget(ctx) -> Budget:
    plan = section(ctx.documents.manifest, "plan")
    runs = runs_by_id(ctx)
    records = stopped_by_record(ctx)
    return Budget(
        lots=tuple(lots(plan)), rental=rental_usd(plan), rental_stated=usd(plan.get("rental_total_usd")),
        total=total_usd(plan), included=tuple(other_expenses(plan, True)), excluded=tuple(other_expenses(plan, False)),
        accepted_declared=tuple(accepted_declared(ctx)),
        stopped=tuple(run_id for run_id, run in runs.items() if run.get("status") == "stopped" or run_id in records))


def _number(container: dict, key: str) -> Any:
    return container.get(key) if is_number(container.get(key)) else None


def _hours(ctx) -> Hours:
    manifest = ctx.documents.manifest
    plan, timeline = section(manifest, "plan"), section(manifest, "timeline")
    deviations = tuple(Deviation(d.get("hours") if is_number(d.get("hours")) else None,
                                 d.get("explanation") if isinstance(d.get("explanation"), str) else None)
                       for d in listed(timeline, "deviations") if isinstance(d, dict))
    return Hours(window=_number(plan, "window_hours"), reserved=_number(plan, "reserved_hours"),
                 observed=_number(timeline, "observed_hours"), lots_window=lots_window_hours(plan),
                 deviations=deviations,
                 declared_at=plan.get("declared_at") if isinstance(plan.get("declared_at"), str) else None,
                 first_run=first_run_start(ctx))


def _lots_used(ctx) -> tuple[Lot, ...]:
    plan = section(ctx.documents.manifest, "plan")
    runs = list(indexed_runs(ctx))
    if not any(run_lot(run) for _, run, _ in runs):
        return ()
    out, only = [], len(lots(plan)) == 1  # one lot: a run that names none ran there all the same
    for index, lot in lots(plan):
        lot_id = lot.get("id") if isinstance(lot.get("id"), str) else None
        mine = tuple(i for i, run, _ in runs if (lot_id is not None and run_lot(run) == lot_id)
                     or (only and run_lot(run) is None))
        starts = [m for i, run, _ in runs if i in mine and (m := parse_time(run.get("started_at"))) is not None]
        ends = [m for i, run, _ in runs if i in mine and (m := parse_time(run.get("ended_at"))) is not None]
        start = parse_time(lot.get("started_at")) or (min(starts) if starts else None)
        out.append(Lot(index, lot_id, lot, mine, start, max(ends) if ends else None))
    return tuple(out)


__all__ = ["Budget", "Deviation", "Hours", "Lot", "budget", "hours", "lots_used"]
