"""IV311–IV312: one story per run. A run's metrics, its checkpoints' own log (trainer_state.json log_history and
global_step) and the other runs' records are read together, never assumed.

A correct crash-and-resume is one story: the metrics go back to the step after the checkpoint the run resumed
from and repeat a few steps, and the later checkpoint's log continues the earlier one's. A restart from scratch
under the same id (the metrics start over at the first step) is two stories under one id (IV311); a checkpoint
whose log is another run's, a resume from another run's checkpoint, metrics copied from another run are records
that belong to another run (IV312). Which values are compared, and within what tolerance, is format/facts.py's.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

from ..format import facts as table
from ..format.layouts import TRAINER_STATE
from ..model import Finding, Rule, Severity
from ..package import RunContext, pointer_of
from ..package.campaign import indexed_runs, metrics_of
from ._records import artifact_folders, bounded_json, run_params
from .losses import is_loss_like

RULES = [
    Rule("IV311", Severity.ERROR, "a run restarted from scratch under the same id",
         explain="A run id names one training: one initialisation, one history. A run that crashed and resumed "
                 "from its own checkpoint is still one run (its metrics go back to the step after that checkpoint "
                 "and repeat a few steps: that passes). A run started again from the beginning under the same id "
                 "is two trainings under one name: its metrics start over at the first step after reaching a "
                 "later one, or two of its checkpoints log different values for the same step. Which attempt "
                 "the delivered model, the predictions and the scores come from cannot be told. Give a new "
                 "attempt its own run id, or resume from the run's checkpoint "
                 "(`trainer.train(resume_from_checkpoint=...)`).",
         bad='metrics/control.jsonl: {"step": 1, "name": "loss", ...} ... {"step": 40, ...} {"step": 1, "name": '
             '"loss", ...}',
         good='metrics/control.jsonl: ... {"step": 40, ...} {"step": 31, ...} (resumed from checkpoint-30)',
         since="0.2.0"),
    Rule("IV312", Severity.ERROR, "a checkpoint or metrics that belong to another run",
         explain="The Trainer keeps its own log in every checkpoint (trainer_state.json log_history: loss, "
                 "grad_norm, learning rate at each logged step); a resumed run's checkpoint continues the log of "
                 "the checkpoint it resumed from. A run's checkpoint whose log disagrees with the run's metrics, "
                 "or equals another run's log, is not this run's: a resume from another run's checkpoint (its "
                 "log continues that run's history; declare it in the params with `init_from` / "
                 "`resume_from_checkpoint` naming that checkpoint when it was the plan), a checkpoint copied "
                 "from another run, or metrics written from another run's log. So are two runs whose metrics "
                 "hold the same values at every common step although their params declare different seeds, "
                 "learning rates or LoRA ranks: no two such trainings log the same losses. Deliver each run's own "
                 "records.",
         bad='checkpoints/lora/checkpoint-8/trainer_state.json: log_history steps 1-4 equal control\'s, the run '
             'logs from step 5 on',
         good='each run\'s checkpoints log what its own metrics log, from its own first step', since="0.2.0"),
]

ROW = table.fact("logged values")
RESUMING_FOLLOWS = 3  # copied series must agree on at least this many steps before two runs are said to share one


@dataclass
class History:
    """One trainer_state.json of a run: its log by metric and step, and where its steps went back, if ever."""

    path: str
    log: dict[str, dict[int, float]] = field(default_factory=dict)
    rewind: tuple[int, int] | None = None  # (index in log_history, the step it went back to)


@dataclass
class RunRecords:
    index: int
    run: str
    params: dict
    metrics_path: str | None
    series: dict[str, list[tuple[int, float, int]]]  # metric -> (step, value, line) in file order
    metrics: dict[str, dict[int, list[float]]]  # metric -> step -> values in file order
    histories: list[History]
    saved_steps: set[int]

    def values(self) -> dict[str, dict[int, set[float]]]:
        """Everything this run's records logged, by metric and step (metrics and every checkpoint's log)."""
        out: dict[str, dict[int, set[float]]] = {}
        for name, steps in self.metrics.items():
            for step, values in steps.items():
                out.setdefault(name, {}).setdefault(step, set()).update(values)
        for history in self.histories:
            for name, steps in history.log.items():
                for step, value in steps.items():
                    out.setdefault(name, {}).setdefault(step, set()).add(value)
        return out


def check(ctx: RunContext) -> Iterator[Finding]:
    if not ctx.documents.manifest:
        return  # missing or unparsable manifest: IV101/IV104 say so
    runs = _records(ctx)
    for record in runs:
        restart = _metrics_restart(record) or _history_restart(record)
        if restart is not None:
            yield restart
        others = [other for other in runs if other is not record]
        found = _checkpoint_stories(record, others) or _foreign_start(record, others) \
            or _copied_metrics(record, [other for other in runs if other.index < record.index])
        if found is not None:
            yield found


def _records(ctx: RunContext) -> list[RunRecords]:
    params = {run_id: values for _, run_id, _, values in run_params(ctx)}
    folders = artifact_folders(ctx)
    out = []
    for index, run, run_id in indexed_runs(ctx):
        if run_id is None:
            continue
        scan = metrics_of(ctx, run)
        series = {name: points for name, points in (scan.series.items() if scan is not None else ())
                  if name in ROW.keys or is_loss_like(name)}
        metrics: dict[str, dict[int, list[float]]] = {}
        for name, points in series.items():
            for step, value, _line in points:
                metrics.setdefault(name, {}).setdefault(step, []).append(value)
        states = sorted({f"{f.rel}/{TRAINER_STATE}" for f in folders if f.run == run_id
                         and ctx.inventory.is_file(f"{f.rel}/{TRAINER_STATE}")})
        histories, saved = [], set()
        for rel in states:
            state = bounded_json(ctx, rel)
            if isinstance(state, dict):
                histories.append(_history(rel, state.get("log_history")))
                if _count(state.get("global_step")):
                    saved.add(state["global_step"])
        for save in run.get("checkpoints") if isinstance(run.get("checkpoints"), list) else ():
            if isinstance(save, dict) and _count(save.get("step")):
                saved.add(save["step"])
        out.append(RunRecords(index, run_id, params.get(run_id) or {}, scan.path if scan is not None else None,
                              series, metrics, histories, saved))
    return out


def _history(rel: str, log_history) -> History:
    history = History(rel)
    first = last = None
    for index, entry in enumerate(log_history if isinstance(log_history, list) else ()):
        step = entry.get("step") if isinstance(entry, dict) else None
        if not _count(step):
            continue
        if first is None:
            first = step
        elif history.rewind is None and step < last and step <= first:
            history.rewind = (index, step)
        last = step
        for name in ROW.keys:
            value = table.as_float(entry.get(name))
            if value is not None:
                history.log.setdefault(name, {}).setdefault(step, value)
    return history


# ---------------------------------------------------------------------------------------------- IV311

def _metrics_restart(record: RunRecords) -> Finding | None:
    """A loss-like series that goes back to its first step (or before) after a later one, with no checkpoint
    saved before that step to resume from: the run started over."""
    found = []
    for name, points in sorted(record.series.items()):
        if not is_loss_like(name) or len(points) < 2:
            continue
        first, previous = points[0][0], points[0][0]
        for step, _value, line in points[1:]:
            if step < previous and step <= first and not any(saved < step for saved in record.saved_steps):
                found.append((line, name, previous, step))
                break
            previous = max(previous, step)
    if not found:
        return None
    line, name, reached, back = min(found)
    return Finding("IV311", record.metrics_path, line=line, run=record.run,
                   message=f"run {record.run}: {name} starts over at step {back} after reaching step {reached} "
                           f"({record.metrics_path} line {line}), and the run saved no checkpoint before step "
                           f"{back} to resume from: it was trained again from scratch under the same id; give the new "
                           "attempt its own run id (or resume from the run's checkpoint)")


def _history_restart(record: RunRecords) -> Finding | None:
    for history in record.histories:
        if history.rewind is not None:
            index, step = history.rewind
            return Finding("IV311", history.path, pointer=pointer_of(["log_history", index, "step"]), run=record.run,
                           message=f"run {record.run}: {history.path}'s log_history starts over at step {step}: "
                                   "two trainings' logs under one run; give each attempt its own run id")
    return None


# ---------------------------------------------------------------------------------------------- IV312

def _close(one: float, other: float, tolerance: float) -> bool:
    return table.close(one, other, tolerance)


def _mismatches(log: dict[str, dict[int, float]], values: dict[str, dict[int, float | list[float] | set[float]]],
                tolerance: float) -> list[tuple[str, int, float, list[float]]]:
    """(metric, step, logged value, the other record's values) where the other record logged the step too and
    none of its values is this one."""
    out = []
    for name in sorted(log):
        for step in sorted(log[name]):
            theirs = values.get(name, {}).get(step)
            theirs = theirs if isinstance(theirs, (list, set)) or theirs is None else [theirs]
            if theirs and not any(_close(log[name][step], value, tolerance) for value in theirs):
                out.append((name, step, log[name][step], sorted(theirs)))
    return out


def _owner(log: dict[str, dict[int, float]], others: list[RunRecords]) -> RunRecords | None:
    """The other run whose records hold every value of `log` they share, exactly, on enough steps."""
    for other in others:
        values = other.values()
        shared = [(name, step) for name in log for step in log[name] if step in values.get(name, {})]
        if len({step for _, step in shared}) >= 2 and not _mismatches(log, values, table.COPIED_TOLERANCE):
            return other
    return None


def _declared_origin(record: RunRecords, other: RunRecords) -> bool:
    """The run's params say it started from the other run's checkpoint (`init_from` naming it, or its run)."""
    return any(isinstance(record.params.get(key), str) and other.run in record.params[key]
               for key in table.RESUME_DECLARATIONS)


def _metrics_log(record: RunRecords) -> dict[str, dict[int, float]]:
    """The run's metrics as one value per step (the later line of a repeated step: a resumed block's)."""
    return {name: {step: values[-1] for step, values in steps.items()} for name, steps in record.metrics.items()}


def _checkpoint_stories(record: RunRecords, others: list[RunRecords]) -> Finding | None:
    """A checkpoint whose log disagrees with the run's metrics or with another checkpoint of the run."""
    for history in record.histories:
        wrong = _mismatches(history.log, record.metrics, ROW.tolerance)
        if wrong:
            name, step, logged, metric_values = wrong[0]
            owner = _owner(history.log, [o for o in others if not _declared_origin(record, o)])
            if owner is not None:
                return _foreign_checkpoint(record, history, owner, f"{name} {logged:g} at step {step}, where "
                                           f"{record.metrics_path} logs {_values(metric_values)}")
            metrics_owner = _owner(_metrics_log(record), others)
            if metrics_owner is not None:
                return Finding("IV312", record.metrics_path, run=record.run,
                               message=f"run {record.run}: {record.metrics_path} logs {name} "
                                       f"{_values(metric_values)} at step {step}, where the run's own checkpoint log "
                                       f"{history.path} has {logged:g}; the metrics are run {metrics_owner.run}'s "
                                       "(its records hold the same values): write the run's own metrics")
            return Finding("IV312", history.path, run=record.run,
                           message=f"run {record.run}: {history.path} logs {name} {logged:g} at step {step}, but "
                                   f"{record.metrics_path} logs {_values(metric_values)} there ({len(wrong)} step(s) "
                                   "disagree): the checkpoint and the metrics are not one run's records; deliver "
                                   "the run's own")
        for earlier in record.histories:
            if earlier is history or earlier.path > history.path:
                continue
            wrong = _mismatches(history.log, earlier.log, ROW.tolerance)
            if wrong:
                name, step, logged, theirs = wrong[0]
                owner = _owner(history.log, [o for o in others if not _declared_origin(record, o)])
                if owner is not None:
                    return _foreign_checkpoint(record, history, owner, f"{name} {logged:g} at step {step}, where "
                                               f"{earlier.path} logs {_values(theirs)}")
                return Finding("IV311", history.path, run=record.run,
                               message=f"run {record.run}: {history.path} logs {name} {logged:g} at step {step}, "
                                       f"{earlier.path} logs {_values(theirs)}: two trainings' checkpoints under "
                                       "one run id (a restart from scratch); give each attempt its own run id")
    return None


def _foreign_checkpoint(record: RunRecords, history: History, owner: RunRecords, detail: str) -> Finding:
    return Finding("IV312", history.path, run=record.run,
                   message=f"run {record.run}: {history.path} logs {detail}; its log is run {owner.run}'s (every "
                           f"value they share is equal): the checkpoint continues another run's training; deliver "
                           f"the run's own checkpoint, or declare its origin (params init_from naming run "
                           f"{owner.run}'s checkpoint)")


def _foreign_start(record: RunRecords, others: list[RunRecords]) -> Finding | None:
    """A checkpoint whose log, at the steps before the run's own metrics begin, is another run's: the run
    resumed from that run's checkpoint."""
    for history in record.histories:
        before = {}
        for name, steps in history.log.items():
            logged = record.metrics.get(name)
            start = min(logged) if logged else None
            early = {step: value for step, value in steps.items() if start is None or step < start}
            if early:
                before[name] = early
        if not before or not record.metrics:
            continue
        owner = _owner(before, [o for o in others if not _declared_origin(record, o)])
        if owner is not None:
            steps = sorted({step for values in before.values() for step in values})
            return Finding("IV312", history.path, run=record.run,
                           message=f"run {record.run}: {history.path} logs steps {steps[0]}-{steps[-1]}, before the "
                                   f"run's own metrics ({record.metrics_path}) begin, with run {owner.run}'s values: "
                                   f"run {record.run} resumed from run {owner.run}'s checkpoint; deliver a run of its "
                                   f"own, or declare its origin (params init_from naming run {owner.run}'s checkpoint)")
    return None


def _copied_metrics(record: RunRecords, earlier: list[RunRecords]) -> Finding | None:
    """Metrics equal, at every common step, to an earlier run's, although the two runs declare different values
    of a fact that shapes training (seed, learning rate, LoRA rank, ...)."""
    mine = _metrics_log(record)
    for other in earlier:
        differs = _shaping_difference(record.params, other.params)
        if differs is None:
            continue
        theirs = _metrics_log(other)
        for name in sorted(mine, key=lambda n: (n != "loss", n)):
            common = sorted(set(mine[name]) & set(theirs.get(name, {})))
            if len(common) >= RESUMING_FOLLOWS and all(
                    table.close(mine[name][s], theirs[name][s], table.COPIED_TOLERANCE) for s in common):
                return Finding("IV312", record.metrics_path, run=record.run,
                               message=f"run {record.run}: {record.metrics_path} logs the same {name} as run "
                                       f"{other.run} at all {len(common)} common steps ({common[0]}-{common[-1]}), "
                                       f"though their params declare different {differs}: no two such trainings "
                                       "log the same values; the metrics are a copy; write the run's own")
    return None


def _shaping_difference(one: dict, other: dict) -> str | None:
    for row in table.PARAMS_FACTS:
        if not row.shapes_training:
            continue
        mine, theirs = dict(table.declared_values(one, row)), dict(table.declared_values(other, row))
        for key in mine.keys() & theirs.keys():
            if not table.same_declaration(row, mine[key], theirs[key]):
                return f"{key} ({table.shown(mine[key])} and {table.shown(theirs[key])})"
    return None


def _values(values) -> str:
    shown = [f"{v:g}" for v in list(values)[:3]]
    return " or ".join(shown) if shown else "nothing"


def _count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
