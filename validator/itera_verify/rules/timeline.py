"""IV612: times out of order. Nothing of a campaign happens before it was created, and a run ends after it starts.
IV613: at no moment do the runs in progress need more GPUs than the lots hold.

Only readable times are compared (an unreadable one is a schema finding); times are compared to the second, so
a stop written a fraction of a second after an `ended_at` rounded down is not out of order.
"""
from __future__ import annotations

from datetime import datetime
from typing import Iterator

from ..model import Finding, Rule, Severity
from ..package import MANIFEST, STOPS, RunContext, facts, pointer_of
from ..package.campaign import (indexed_runs, is_number, listed, parse_time, recorded_world_size, section, shown,
                                stop_records)

RULES = [
    Rule("IV612", Severity.ERROR, "times out of order",
         explain="A run's `ended_at` comes after its `started_at`, and every run, stop and decision time comes "
                 "after the campaign's `created_at`. A time out of order is a typo, a clock in another time zone "
                 "written without its offset, or a record copied from another campaign: the reviewer cannot "
                 "tell which runs happened in this campaign or how long they took. Write each time with its "
                 "offset (RFC 3339) as the clock showed it.",
         bad='"created_at": "2026-11-20T08:00:00Z", "runs": [{"started_at": "2026-11-20T21:00:00Z", '
             '"ended_at": "2026-11-20T09:00:00Z"}]',
         good='"created_at": "2026-11-20T08:00:00Z", "runs": [{"started_at": "2026-11-20T09:00:00Z", '
              '"ended_at": "2026-11-20T21:00:00Z"}]'),
    Rule("IV613", Severity.ERROR, "runs in progress need more GPUs than the lots hold",
         explain="Each run holds its GPUs from `started_at` to `ended_at`: its `world_size` or `gpus` (in the run "
                 "entry, else its params' `world_size`; 1 by default). At no moment may the runs in progress need "
                 "more GPUs than the plan's lots hold (each lot's `gpus`, 1 by default). Two steps on the same GPU "
                 "do not become parallel because they have two lines in a table: runs that overlap on one GPU "
                 "were either run one after the other (fix their times) or on a machine the plan does not pay "
                 "for (add the lot). When the runs say which lot they ran on (`runs[].lot`), each lot's runs are "
                 "judged against that lot's GPUs alone: two machines do not pool their GPUs.",
         bad='lots: [{"gpu": "RTX 4090", "gpus": 1, ...}]; control 09:00-21:00 and lora-r16 10:00-14:00',
         good='lots: [{"gpu": "RTX 4090", "gpus": 1, ...}]; control 09:00-21:00 and lora-r16 21:00-23:00'),
]


def to_second(moment: datetime | None) -> datetime | None:
    return moment.replace(microsecond=0) if moment is not None else None


def check(ctx: RunContext) -> Iterator[Finding]:
    manifest = ctx.documents.manifest
    if not manifest:
        return  # missing or unparsable manifest: IV101/IV104 say so
    created = to_second(parse_time(manifest.get("created_at")))
    yield from _runs_in_order(ctx, created)
    yield from _gpus_in_use(ctx)
    if created is None:
        return
    for index, record in stop_records(ctx):
        at = to_second(parse_time(record.get("at")))
        if at is not None and at < created:
            yield Finding("IV612", STOPS, pointer=pointer_of(["stops", index, "at"]),
                          run=record.get("run") if isinstance(record.get("run"), str) else None,
                          message=f"stop record {index} (run {shown(record.get('run'))}) is dated {record['at']}, "
                                  f"before the campaign was created ({manifest['created_at']}): a stop cannot "
                                  f"precede its campaign; write the time the rule fired, with its offset")
    for index, decision in enumerate(listed(section(manifest, "timeline"), "decisions")):
        at = to_second(parse_time(decision.get("at"))) if isinstance(decision, dict) else None
        if at is not None and at < created:
            yield Finding("IV612", MANIFEST, pointer=pointer_of(["timeline", "decisions", index, "at"]),
                          message=f"timeline decision {index} is dated {decision['at']}, before the campaign was "
                                  f"created ({manifest['created_at']}): write when it was decided, with its offset")


def _runs_in_order(ctx: RunContext, created: datetime | None) -> Iterator[Finding]:
    created_text = ctx.documents.manifest.get("created_at")
    for index, run, run_id in indexed_runs(ctx):
        name = run_id or f"#{index}"
        started = to_second(parse_time(run.get("started_at")))
        ended = to_second(parse_time(run.get("ended_at")))
        if started is not None and ended is not None and ended < started:
            hours = (started - ended).total_seconds() / 3600
            yield Finding("IV612", MANIFEST, pointer=pointer_of(["runs", index, "ended_at"]), run=run_id,
                          message=f"run {name} ended at {run['ended_at']}, {hours:.4g} h before it started "
                                  f"({run['started_at']}): fix the time that is wrong (a missing offset, a day "
                                  f"off)")
        if created is None:
            continue
        first_key, first = ("started_at", started) if started is not None else ("ended_at", ended)
        if first is not None and first < created:
            yield Finding("IV612", MANIFEST, pointer=pointer_of(["runs", index, first_key]), run=run_id,
                          message=f"run {name} {first_key.replace('_at', '')} at {run[first_key]}, before the "
                                  f"campaign was created ({created_text}): a run of this campaign cannot precede "
                                  f"it; fix the time, or created_at")


def _count(value) -> int | None:
    return int(value) if is_number(value) and not isinstance(value, bool) and value >= 1 else None


def run_gpus(ctx: RunContext, run: dict, run_id: str | None) -> int:
    """The GPUs a run holds: its entry's world_size or gpus, else its params' world_size, else 1."""
    return _count(run.get("world_size")) or _count(run.get("gpus")) or recorded_world_size(ctx, run_id) or 1


def _gpus_in_use(ctx: RunContext) -> Iterator[Finding]:
    lots = [lot for lot in listed(section(ctx.documents.manifest, "plan"), "lots") if isinstance(lot, dict)]
    if not lots:
        return  # no plan: the budget rules say so
    used = facts.lots_used(ctx)
    if not used:  # one machine, or lots that do not say which runs they held: every GPU bought, together
        yield from _gpus_on(ctx, None, sum(_count(lot.get("gpus")) or 1 for lot in lots), "the lots hold")
        return
    for lot in used:  # each machine's GPUs hold its own runs (a run on no declared lot is IV616)
        if lot.runs:
            yield from _gpus_on(ctx, set(lot.runs), lot.gpus, f"lot {lot.id} holds")


def _gpus_on(ctx: RunContext, runs: set[int] | None, held: int, holder: str) -> Iterator[Finding]:
    events = []  # (moment, 0 = an end before a start at the same second, run index, gpus)
    for index, run, run_id in indexed_runs(ctx):
        if runs is not None and index not in runs:
            continue
        started = to_second(parse_time(run.get("started_at")))
        ended = to_second(parse_time(run.get("ended_at")))
        if started is None or ended is None or ended <= started:
            continue  # a run still in progress, or its times are IV612's
        gpus = run_gpus(ctx, run, run_id)
        events += [(started, 1, index, gpus), (ended, 0, index, gpus)]
    running: dict[int, int] = {}
    reported: set[frozenset] = set()
    for moment, starting, index, gpus in sorted(events):
        if not starting:
            running.pop(index, None)
            continue
        running[index] = gpus
        together = frozenset(running)
        if sum(running.values()) > held and together not in reported:
            reported.add(together)
            runs = listed(ctx.documents.manifest, "runs")
            names = ", ".join(f"{shown(runs[i].get('id'), f'#{i}')} ({running[i]})" for i in sorted(running))
            yield Finding("IV613", MANIFEST, pointer=pointer_of(["runs", index, "started_at"]),
                          run=runs[index].get("id") if isinstance(runs[index].get("id"), str) else None,
                          message=f"at {moment.strftime('%Y-%m-%dT%H:%M:%SZ')} the runs in progress need "
                                  f"{sum(running.values())} GPUs ({names}), but {holder} {held}: runs on one "
                                  f"GPU do not overlap; fix their times, or add the lot that ran them")
