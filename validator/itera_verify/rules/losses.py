"""IV409–IV411: what a run's loss metrics show. A loss or gradient norm that went non-finite in a run nobody
stopped, the metric a `nonfinite_loss` rule watches missing from an accepted run, and a run every process of
which wrote its own values (and its own stop record).

Besides the run's metrics file, IV409 reads the `log_history` of the Trainer's own `trainer_state.json` files
under the run's artifacts: it keeps the NaN `grad_norm` even when a metrics file written from it leaves it out.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterator

from ..model import Finding, Rule, Severity
from ..package import RunContext, pointer_of
from ..package.campaign import accepted_entries, indexed_runs, runs_by_id, shown, stop_records, stopped_by_record
from ..package.campaign import metrics_of
from .stops import nonfinite_token, watched_metrics

RULES = [
    Rule("IV409", Severity.ERROR, "non-finite loss or gradient norm in a run that was not stopped",
         explain="A NaN or infinite `loss`, `*_loss` or `grad_norm` means the updates went wrong and the weights "
                 "may be garbage. The Trainer hides a NaN step loss by default (logging_nan_inf_filter=True logs "
                 "the window's average instead) while `grad_norm` still shows NaN: a finite loss beside a NaN "
                 "grad_norm is that masked NaN. The run's metrics file is read, and the `log_history` of every "
                 "trainer_state.json under the run's artifacts (where the Trainer keeps grad_norm even when the "
                 "metrics file leaves it out). Stop the run (status `stopped` and a stop record) or rerun it; "
                 "train with logging_nan_inf_filter=False to see the loss itself. The metric a `nonfinite_loss` "
                 "rule names is IV404's, not reported here again. Under fp16 mixed precision (params `fp16: "
                 "true` or `mixed_precision: fp16`) a non-finite grad_norm is the loss scaler skipping an "
                 "overflowing step, by design: it is reported only when the last logged grad_norm is still "
                 "non-finite (the run never recovered).",
         bad='{"step": 40, "name": "loss", "value": 0.0}  {"step": 40, "name": "grad_norm", "value": NaN}',
         good='{"step": 40, "name": "loss", "value": 0.41}  {"step": 40, "name": "grad_norm", "value": 1.7}'),
    Rule("IV410", Severity.ERROR, "accepted run never logs the nonfinite_loss metric",
         explain="A `nonfinite_loss` stop rule watches one metric. An accepted run whose metrics never log it "
                 "shows nothing that it stayed finite: the rule could not have fired. Log the metric under the "
                 "name the rule gives (the Trainer logs its step loss as `loss`), or name in the rule the "
                 "metric the runs log, before the first run.",
         bad='rule {"kind": "nonfinite_loss", "metric": "train_loss"}   metrics: {"name": "loss", ...} only',
         good='rule {"kind": "nonfinite_loss", "metric": "loss"}   '
              'metrics: {"step": 1, "name": "loss", "value": 2.31}'),
    Rule("IV411", Severity.ERROR, "every process of a multi-process run wrote its own record",
         explain="Under torchrun every rank runs the same script: unless only rank 0 writes, a loss-like metric "
                 "(`loss`, `*_loss`, `grad_norm`) appears twice at the same step, in place, each line with one "
                 "rank's own value, and a stopped run gets one stop record per rank. Nobody can tell which value "
                 "is the run's (the mean over ranks is what the Trainer logs). A resumed run that repeats a block "
                 "of steps once, after going back to its checkpoint's step, is not this: the repeated steps "
                 "follow a lower step, not the same one. Write from the main process only (the recorder and its "
                 "callbacks do: `RANK` 0 writes, the others check the rules), and log the value gathered over "
                 "ranks.",
         bad='{"step": 1, "name": "loss", "value": 2.31}  {"step": 1, "name": "loss", "value": 2.27}  '
             '{"step": 2, "name": "loss", "value": 2.12}  {"step": 2, "name": "loss", "value": 2.15}',
         good='{"step": 1, "name": "loss", "value": 2.29}  {"step": 2, "name": "loss", "value": 2.14}'),
]

# In-place repeats of one metric (the same step twice in a row, two values) a single resume cannot make: its
# replay starts below the step it crashed at, or at most repeats that one step.
EVERY_RANK_REPEATS = 2


def check(ctx: RunContext) -> Iterator[Finding]:
    if not ctx.documents.manifest:
        return  # missing or unparsable manifest: IV101/IV104 say so
    yield from _nonfinite_loss_like_in_unstopped_runs(ctx)
    yield from _accepted_runs_log_the_watched_metric(ctx)
    yield from _every_rank_wrote_metrics(ctx)
    yield from _every_rank_wrote_a_stop(ctx)


def _every_rank_wrote_metrics(ctx: RunContext) -> Iterator[Finding]:
    for index, run, run_id in indexed_runs(ctx):
        scan = metrics_of(ctx, run)
        found = []  # (line of the first repeat, metric, repeats, steps): the earliest is reported
        for metric in sorted(scan.series) if scan is not None else ():
            points = scan.series[metric]
            repeats = [(line, step, points[i - 1][1], value) for i, (step, value, line) in enumerate(points)
                       if i and step == points[i - 1][0] and not _same(value, points[i - 1][1])]
            if is_loss_like(metric) and len(repeats) >= EVERY_RANK_REPEATS:
                found.append((repeats[0], metric, len(repeats), len({p[0] for p in points})))
        if not found:
            continue  # one finding per run: the other metrics repeat the same mistake
        (line, step, before, value), metric, count, steps = min(found)
        yield Finding("IV411", scan.path, line=line, run=run_id,
                      message=f"run {run_id or f'#{index}'}: {metric} is logged twice in a row at {count} of its "
                              f"{steps} steps with two values (step {step}: {shown(before)} then {shown(value)}): "
                              "every process of the multi-process run wrote its own value; write from rank 0 "
                              "only, the value gathered over ranks")


def _same(one: float, other: float) -> bool:
    return one == other or (math.isnan(one) and math.isnan(other))


def _every_rank_wrote_a_stop(ctx: RunContext) -> Iterator[Finding]:
    first: dict[str, int] = {}
    for index, record in stop_records(ctx):
        run = record.get("run")
        if not isinstance(run, str):
            continue
        if run not in first:
            first[run] = index
            continue
        if first[run] < 0:
            continue  # reported once per run, however many ranks wrote
        yield Finding("IV411", "stops.json", pointer=pointer_of(["stops", index]), run=run,
                      message=f"stops.json holds a second stop record for run {run} (entries {first[run]} and "
                              f"{index}): every process of the multi-process run recorded the stop; one record "
                              "per run, written by rank 0")
        first[run] = -1


def _nonfinite_loss_like_in_unstopped_runs(ctx: RunContext) -> Iterator[Finding]:
    watched = {metric for _, metric in watched_metrics(ctx)}  # IV404 reports those, in the metrics file
    records = stopped_by_record(ctx)
    for index, run, run_id in indexed_runs(ctx):
        if run.get("status") == "stopped" or run_id in records:
            continue
        name = run_id or f"#{index}"
        fp16 = fp16_amp(ctx, run)
        scan = metrics_of(ctx, run)
        reported = {metric for metric in watched if scan is not None and scan.nonfinite(metric)}  # IV404's
        for metric in sorted(scan.series) if scan is not None else ():
            bad = scan.nonfinite(metric) if is_loss_like(metric) and metric not in watched else []
            if not bad or (fp16 and is_grad_norm(metric) and math.isfinite(scan.last(metric)[1])):
                continue
            reported.add(metric)
            step, value, line = bad[0]
            yield Finding("IV409", scan.path, line=line, run=run_id,
                          message=_nonfinite_message(name, metric, value, step, len(bad)))
        # The Trainer's own log keeps what a metrics file written from it may have left out (grad_norm).
        for logged in trainer_log_nonfinite(ctx, run_id) if run_id is not None else ():
            if logged.metric in reported or (fp16 and is_grad_norm(logged.metric) and logged.last_finite):
                continue
            reported.add(logged.metric)
            yield Finding("IV409", logged.path, pointer=logged.pointer, run=run_id,
                          message=_nonfinite_message(name, logged.metric, logged.value, shown(logged.step),
                                                     logged.count, source=f" in the Trainer's log ({logged.path})"))


def _nonfinite_message(run: str, metric: str, value: float, step, count: int, source: str = "") -> str:
    more = f" ({count} non-finite values in all)" if count > 1 else ""
    head = f"run {run}: {metric} is {nonfinite_token(value)} at step {step}{source}{more}, yet the run was not stopped"
    if is_grad_norm(metric):
        return (f"{head}: a non-finite gradient norm is how the Trainer's masked NaN shows (with "
                f"logging_nan_inf_filter=True, its default, a NaN step loss is logged as the window's average, so "
                f"the loss looks finite); the weights may be garbage: mark the run stopped with a stop record, or "
                f"rerun it (logging_nan_inf_filter=False logs the loss as it is)")
    return f"{head}: the weights may be garbage; mark the run stopped with a stop record, or rerun it"


def _accepted_runs_log_the_watched_metric(ctx: RunContext) -> Iterator[Finding]:
    watched = sorted(watched_metrics(ctx))
    if not watched:
        return
    runs = runs_by_id(ctx)
    for name in dict.fromkeys(name for _, name in accepted_entries(ctx)):
        run = runs.get(name)
        scan = metrics_of(ctx, run) if run is not None else None
        if scan is None or not scan.records:
            continue  # no readable metrics: IV101 / IV103 / IV104 say why
        for rule_id, metric in watched:
            if metric in scan.series:
                continue
            logged = [n for n in sorted(scan.series) if is_loss_like(n)]
            hint = (f" (it logs {', '.join(logged[:4])}: name the metric the runs log in the rule)" if logged
                    else "")
            yield Finding("IV410", scan.path, run=name,
                          message=f"accepted run {name} never logs {metric}, the metric stop rule {rule_id} "
                                  f"watches{hint}: nothing shows it stayed finite")


# ---------------------------------------------------------------------------------------------- readings

TRAINER_STATE = "trainer_state.json"


def is_loss_like(name: str) -> bool:
    """`loss`, `*_loss`, `grad_norm` (also under a logger's prefix: `train/loss`, `train/grad_norm`)."""
    base = name.rsplit("/", 1)[-1].lower()
    return base == "loss" or base.endswith("_loss") or is_grad_norm(base)


def is_grad_norm(name: str) -> bool:
    base = name.rsplit("/", 1)[-1].lower()
    return base == "grad_norm" or base.endswith("_grad_norm")


def fp16_amp(ctx: RunContext, run: dict) -> bool:
    """The run's params say fp16 mixed precision (docs/format.md: `"fp16": true` or `"mixed_precision": "fp16"`)."""
    ref = run.get("params")
    rel = ctx.inventory.normalise_ref(ref) if isinstance(ref, str) else None
    params = ctx.documents.json_value(rel) if rel and ctx.inventory.is_file(rel) else None
    return isinstance(params, dict) and (params.get("fp16") is True or params.get("mixed_precision") == "fp16")


@dataclass
class LoggedNonFinite:
    """The first non-finite value of one metric in one trainer_state.json's log_history."""

    path: str
    pointer: str
    metric: str
    step: object
    value: float
    count: int
    last_finite: bool  # the metric's last logged value is finite (an fp16 scaler skip recovered)


def trainer_log_nonfinite(ctx: RunContext, run_id: str) -> list[LoggedNonFinite]:
    """Non-finite loss-like values in the log_history of every trainer_state.json under the run's artifacts,
    one per metric (the first file in path order: each checkpoint repeats the history before it)."""
    found: dict[str, LoggedNonFinite] = {}
    for rel in _trainer_states(ctx, run_id):
        history = ctx.documents.json_value(rel)
        history = history.get("log_history") if isinstance(history, dict) else None
        if not isinstance(history, list):
            continue  # a malformed file is the structure rules' or the reload's to report
        for metric, facts in _nonfinite_in_history(rel, history).items():
            found.setdefault(metric, facts)
    return [found[metric] for metric in sorted(found)]


def _trainer_states(ctx: RunContext, run_id: str) -> list[str]:
    paths: set[str] = set()
    for artifact in ctx.documents.artifacts():
        ref = artifact.get("path")
        rel = ctx.inventory.normalise_ref(ref) if artifact.get("run") == run_id and isinstance(ref, str) else None
        if not rel:
            continue
        if rel.rsplit("/", 1)[-1] == TRAINER_STATE and ctx.inventory.is_file(rel):
            paths.add(rel)
        paths.update(p for p in ctx.inventory.files_under(rel) if p.rsplit("/", 1)[-1] == TRAINER_STATE)
    return sorted(paths)


def _nonfinite_in_history(rel: str, history: list) -> dict[str, LoggedNonFinite]:
    found: dict[str, LoggedNonFinite] = {}
    last: dict[str, float] = {}
    for index, entry in enumerate(history):
        if not isinstance(entry, dict):
            continue
        for key, value in entry.items():
            if not (isinstance(key, str) and isinstance(value, float) and is_loss_like(key)):
                continue
            last[key] = value
            if math.isfinite(value):
                continue
            if key in found:
                found[key].count += 1
            else:
                found[key] = LoggedNonFinite(rel, pointer_of(["log_history", index, key]), key, entry.get("step"),
                                             value, 1, False)
    for key, facts in found.items():
        facts.last_finite = math.isfinite(last[key])
    return found
