"""IV401–IV408, IV412: stop rules. Declared before the first run, applied as declared, and never overruled later."""
from __future__ import annotations

import math
from typing import Iterator

from ..package import readers
from ..format.names import inputs_metric
from ..model import Finding, Rule, Severity
from ..package import MANIFEST, STOPS, RunContext, pointer_of
from ..package.campaign import (accepted_entries, filled_text, first_run_start, indexed_runs, is_number, listed,
                                parse_time, runs_by_id, section, shown, stop_records, stopped_by_record, metrics_of)
from .timeline import to_second

RULES = [
    Rule("IV401", Severity.ERROR, "stop rules declared late or undated",
         explain="Stop rules decide when a run is abandoned (NaN loss, a metric under a floor, truncated inputs, "
                 "no usable resume). Declared after the first run started, they can be bent to fit what "
                 "happened. Write them, with `stop_rules.declared_at`, before the first run starts.",
         bad='"stop_rules": {"declared_at": "2026-11-20T10:00:00Z", ...}   (first run started 09:00)',
         good='"stop_rules": {"declared_at": "2026-11-20T08:30:00Z", ...}   (first run started 09:00)'),
    Rule("IV402", Severity.ERROR, "stop record without rule or reason",
         explain="Each stop record in stops.json names the declared rule that fired and says why, in words "
                 "(what was observed, at which step). A stop without either cannot be told from a run dropped "
                 "because it looked bad.",
         bad='{"run": "lora-r64", "rule": "", "at": "2026-11-20T09:40:00Z", "step": 3}',
         good='{"run": "lora-r64", "rule": "nonfinite-loss", "at": "2026-11-20T09:40:00Z", "step": 3, '
              '"reason": "train_loss became NaN at step 3"}'),
    Rule("IV403", Severity.ERROR, "stopped run listed as accepted",
         explain="A stopped run stays in the cost and never becomes a deliverable. Remove it from "
                 "`decision.accepted`; rerun it under a new id if it is needed.",
         bad='"accepted": ["control", "lora-r64"]   (lora-r64 was stopped on NaN loss)',
         good='"accepted": ["control", "lora-r16"]'),
    Rule("IV404", Severity.ERROR, "non-finite loss in a run that was not stopped",
         explain="A `nonfinite_loss` stop rule names a metric (usually the training loss). A NaN or infinite "
                 "value of it in a run that was not stopped means the rule did not fire as declared: the run's "
                 "weights may be garbage. Stop the run (status `stopped` and a stop record) or rerun it. Other "
                 "loss-like metrics and `grad_norm` are IV409's.",
         bad='metrics/control.jsonl: {"step": 3, "name": "train_loss", "value": NaN}   (control completed)',
         good='metrics/control.jsonl: {"step": 3, "name": "train_loss", "value": 2.31}'),
    Rule("IV405", Severity.ERROR, "accepted run past a declared threshold",
         explain="A `below_threshold` stop rule sets a floor for a metric, an `above_threshold` rule a ceiling "
                 "(eval loss above 6: the run diverged). An accepted run whose last value of that metric (at its "
                 "highest step) is under the floor or above the ceiling, or that has no value of it at all, "
                 "shows nothing that lets it pass. Remove it from `decision.accepted` or deliver the "
                 "measurements.",
         bad='{"step": 400, "name": "eval_macro_f1", "value": 0.41}   (floor 0.6, run accepted)',
         good='{"step": 400, "name": "eval_macro_f1", "value": 0.81}'),
    Rule("IV406", Severity.ERROR, "stop record names an undeclared rule",
         explain="A run may only be stopped by a rule declared in `stop_rules.rules` before the first run. A "
                 "stop under an undeclared rule is a decision made after the fact: declare it next time, and "
                 "for this campaign say so in the decision.",
         bad='{"run": "lora-r64", "rule": "too-slow", ...}   (declared: nonfinite-loss, f1-floor)',
         good='{"run": "lora-r64", "rule": "nonfinite-loss", ...}'),
    Rule("IV407", Severity.ERROR, "run status disagrees with stops.json",
         explain="A run with status `stopped` has a stop record in stops.json, and a run with a stop record "
                 "has status `stopped`. One without the other leaves the reviewer to guess which is true.",
         bad='{"id": "lora-r64", "status": "stopped"}   and stops.json: {"stops": []}',
         good='{"id": "lora-r64", "status": "stopped"}   and stops.json: {"stops": [{"run": "lora-r64", ...}]}'),
    Rule("IV408", Severity.ERROR, "stop record contradicts its run",
         explain="A stop record says when (`at`), at which step, and under which rule a run was stopped. Its step "
                 "lies within the steps the run's metrics log, its time within the run's `started_at`–`ended_at` "
                 "(to the second), and a `below_threshold` (`above_threshold`) stop is one the metrics show: the "
                 "rule's metric at that step (or the last value logged before it) is under (above) the threshold. "
                 "A record that contradicts the run was written from memory or copied from another run: write what "
                 "happened.",
         bad='{"run": "lora-r64", "rule": "f1-floor", "step": 2, ...}   metrics: {"step": 2, "name": '
             '"eval_macro_f1", "value": 0.71}   (floor 0.6)',
         good='{"run": "lora-r64", "rule": "f1-floor", "step": 2, ...}   metrics: {"step": 2, "name": '
              '"eval_macro_f1", "value": 0.38}   (floor 0.6)'),
    Rule("IV412", Severity.ERROR, "accepted run broke or never measured a truncated_input rule",
         explain="A `truncated_input` stop rule (`split`, default eval; `max_truncated`, default 0) says how many "
                 "inputs the tokenizer may cut short before the run is abandoned: an evaluation on truncated "
                 "texts measures something else than the question. The run records its counts with "
                 "`run.inputs(split, total, truncated)` (the metric lines `inputs_total/<split>` and "
                 "`inputs_truncated/<split>`; `itera_verify.integrations.count_truncated` counts them for a "
                 "Hugging Face tokenizer). An accepted run whose count is over the limit broke the rule; one that "
                 "never recorded its counts shows nothing that lets it pass.",
         bad='{"step": 0, "name": "inputs_truncated/eval", "value": 12}   (max_truncated 0, run accepted)',
         good='{"step": 0, "name": "inputs_total/eval", "value": 400}, '
              '{"step": 0, "name": "inputs_truncated/eval", "value": 0}'),
]


def check(ctx: RunContext) -> Iterator[Finding]:
    if not ctx.documents.manifest:
        return  # missing or unparsable manifest: IV101/IV104 say so
    yield from _declared_in_time(ctx)
    yield from _stop_records_complete(ctx)
    yield from _stopped_not_accepted(ctx)
    yield from _nonfinite_in_unstopped_runs(ctx)
    yield from _accepted_above_thresholds(ctx)
    yield from _accepted_truncated_inputs(ctx)
    yield from _stops_under_declared_rules(ctx)
    yield from _status_agrees_with_stops(ctx)
    yield from _stops_agree_with_runs(ctx)


def declared_rules(ctx: RunContext) -> list[dict]:
    return [r for r in listed(section(ctx.documents.manifest, "stop_rules"), "rules") if isinstance(r, dict)]


def _declared_in_time(ctx: RunContext) -> Iterator[Finding]:
    stop_rules = ctx.documents.manifest.get("stop_rules")
    if stop_rules is None and any(True for _ in indexed_runs(ctx)):
        yield Finding("IV401", MANIFEST, pointer="",
                      message="no stop rules declared: write stop_rules (with declared_at) before the first run "
                              "starts")
    if not isinstance(stop_rules, dict):
        return  # a wrong type is a schema finding
    declared = parse_time(stop_rules.get("declared_at"))
    if declared is None:
        yield Finding("IV401", MANIFEST,
                      pointer="/stop_rules/declared_at" if "declared_at" in stop_rules else "/stop_rules",
                      message="the stop rules have no declaration time: set stop_rules.declared_at (RFC 3339) "
                              "to when they were written, before the first run started")
        return
    first = first_run_start(ctx)
    if first is not None and declared > first[0]:
        late = (declared - first[0]).total_seconds() / 3600
        yield Finding("IV401", MANIFEST, pointer="/stop_rules/declared_at",
                      message=f"the stop rules were declared at {stop_rules['declared_at']}, {late:.4g} h after "
                              f"run {first[1] or first[2]} started: rules written after the fact can be bent to "
                              f"fit what happened; declare them before the first run")


def _stop_records_complete(ctx: RunContext) -> Iterator[Finding]:
    for index, record in stop_records(ctx):
        who = record.get("run") if isinstance(record.get("run"), str) else f"#{index}"
        for key, what in (("rule", "the id of the declared rule that fired"),
                          ("reason", "what was observed, in words")):
            if filled_text(record.get(key)) is None:
                state = "missing" if key not in record else "blank"
                yield Finding("IV402", STOPS, pointer=pointer_of(["stops", index, key] if key in record
                                                                 else ["stops", index]),
                              message=f"stop record for run {who}: {key} is {state}: give {what}")


def _stopped_not_accepted(ctx: RunContext) -> Iterator[Finding]:
    runs = runs_by_id(ctx)
    records = stopped_by_record(ctx)
    for index, name in accepted_entries(ctx):
        run = runs.get(name)
        if run is not None and run.get("status") == "stopped":
            why = ""
            if name in records:
                reason = filled_text(records[name][1].get("reason"))
                why = f" ({reason})" if reason else ""
            yield Finding("IV403", MANIFEST, pointer=pointer_of(["decision", "accepted", index]), run=name,
                          message=f"run {name} was stopped{why} but is listed as accepted: a stopped run stays in "
                                  f"the cost and never becomes a deliverable; remove it from decision.accepted")
        elif name in records:
            yield Finding("IV403", MANIFEST, pointer=pointer_of(["decision", "accepted", index]), run=name,
                          message=f"run {name} has a stop record in stops.json but is listed as accepted: a "
                                  f"stopped run never becomes a deliverable")


def watched_metrics(ctx: RunContext) -> set[tuple[str, str]]:
    """(rule id, metric) of every `nonfinite_loss` rule that names a metric."""
    return {(shown(r.get("id")), r["metric"]) for r in declared_rules(ctx)
            if r.get("kind") == "nonfinite_loss" and isinstance(r.get("metric"), str)}


def _nonfinite_in_unstopped_runs(ctx: RunContext) -> Iterator[Finding]:
    metrics = watched_metrics(ctx)
    records = stopped_by_record(ctx)
    for index, run, run_id in indexed_runs(ctx):
        if run.get("status") == "stopped" or run_id in records:
            continue
        scan = metrics_of(ctx, run)
        if scan is None:
            continue
        for rule_id, metric in sorted(metrics):
            bad = scan.nonfinite(metric)
            if not bad:
                continue
            step, value, line = bad[0]
            more = f" ({len(bad)} non-finite values in all)" if len(bad) > 1 else ""
            yield Finding("IV404", scan.path, line=line, run=run_id,
                          message=f"run {run_id or index}: {metric} is {nonfinite_token(value)} at step {step}{more}, "
                                  "yet "
                                  f"the run was not stopped: stop rule {rule_id} should have fired; mark the run "
                                  f"stopped with a stop record, or rerun it")


def nonfinite_token(value: float) -> str:
    return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")


THRESHOLD_KINDS = ("below_threshold", "above_threshold")


def is_threshold_rule(rule: dict) -> bool:
    """A floor or a ceiling on a named metric, with a numeric threshold."""
    return rule.get("kind") in THRESHOLD_KINDS and isinstance(rule.get("metric"), str) \
        and is_number(rule.get("threshold"))


def crosses(rule: dict, value: float) -> bool:
    """`value` breaks the floor or the ceiling (a non-finite value breaks either)."""
    if not math.isfinite(value):
        return True
    return value < rule["threshold"] if rule["kind"] == "below_threshold" else value > rule["threshold"]


def limit(rule: dict) -> str:
    """'under the floor 0.6' or 'above the ceiling 6'."""
    return (f"under the floor {rule['threshold']:g}" if rule["kind"] == "below_threshold"
            else f"above the ceiling {rule['threshold']:g}")


def _accepted_above_thresholds(ctx: RunContext) -> Iterator[Finding]:
    floors = [r for r in declared_rules(ctx) if is_threshold_rule(r)]
    if not floors:
        return
    runs = runs_by_id(ctx)
    for name in dict.fromkeys(name for _, name in accepted_entries(ctx)):
        run = runs.get(name)
        if run is None or not isinstance(run.get("metrics"), str):
            continue  # IV305 / the schema say why
        scan = metrics_of(ctx, run)
        for rule in floors:
            metric, floor = rule["metric"], rule["threshold"]
            last = scan.last(metric) if scan is not None else None
            if last is None:
                where = scan.path if scan is not None else run["metrics"]
                yield Finding("IV405", where if scan is not None else MANIFEST, run=name,
                              pointer=None if scan is not None else _run_pointer(ctx, name, "metrics"),
                              message=f"accepted run {name} has no value of {metric} in {where}: nothing shows it "
                                      f"passed the {_bound(rule)} {floor:g} of stop rule {shown(rule.get('id'))}")
            elif crosses(rule, last[1]):
                yield Finding("IV405", scan.path, line=last[2], run=name,
                              message=f"accepted run {name}: last {metric} (step {last[0]}) is {last[1]:g}, "
                                      f"{limit(rule)} of stop rule {shown(rule.get('id'))}: remove it from "
                                      f"decision.accepted")


def _accepted_truncated_inputs(ctx: RunContext) -> Iterator[Finding]:
    rules = [r for r in declared_rules(ctx) if r.get("kind") == "truncated_input"]
    runs = runs_by_id(ctx)
    for name in dict.fromkeys(name for _, name in accepted_entries(ctx)) if rules else ():
        run = runs.get(name)
        if run is None or not isinstance(run.get("metrics"), str):
            continue  # IV305 / the schema say why
        scan = metrics_of(ctx, run)
        for rule in rules:
            split = rule.get("split") if isinstance(rule.get("split"), str) else "eval"
            most = rule.get("max_truncated") if is_number(rule.get("max_truncated")) else 0
            counted = scan.series.get(inputs_metric("truncated", split)) if scan is not None else None
            if not counted:
                yield Finding("IV412", scan.path if scan is not None else MANIFEST, run=name,
                              pointer=None if scan is not None else _run_pointer(ctx, name, "metrics"),
                              message=f"accepted run {name} never recorded its {split} inputs "
                                      f"({inputs_metric('truncated', split)}): nothing shows stop rule "
                                      f"{shown(rule.get('id'))} held; record run.inputs({split!r}, total, "
                                      f"truncated)")
                continue
            step, value, line = max(counted, key=lambda p: (not math.isfinite(p[1]), p[1]))
            if not math.isfinite(value) or value > most:
                yield Finding("IV412", scan.path, line=line, run=name,
                              message=f"accepted run {name}: {value:g} {split} input(s) truncated (step {step}), "
                                      f"over the limit of {most:g} of stop rule {shown(rule.get('id'))}: the "
                                      f"rule should have stopped it; remove it from decision.accepted")


def _bound(rule: dict) -> str:
    return "floor" if rule["kind"] == "below_threshold" else "ceiling"


def _run_pointer(ctx: RunContext, run_id: str, key: str) -> str | None:
    for index, _, candidate in indexed_runs(ctx):
        if candidate == run_id:
            return pointer_of(["runs", index, key])
    return None


def _stops_under_declared_rules(ctx: RunContext) -> Iterator[Finding]:
    declared = [r["id"] for r in declared_rules(ctx) if isinstance(r.get("id"), str)]
    for index, record in stop_records(ctx):
        rule = filled_text(record.get("rule"))
        if rule is not None and rule not in declared:  # a blank rule is IV402
            known = ", ".join(declared) if declared else "none"
            yield Finding("IV406", STOPS, pointer=pointer_of(["stops", index, "rule"]),
                          message=f"stop record {index} names rule {rule!r}, which is not a declared stop rule "
                                  f"(declared: {known}): a stop decided after the fact; say so in the decision")


def _status_agrees_with_stops(ctx: RunContext) -> Iterator[Finding]:
    records = stopped_by_record(ctx)
    for index, run, run_id in indexed_runs(ctx):
        if run_id is None:
            continue
        status = run.get("status")
        if status == "stopped" and run_id not in records:
            yield Finding("IV407", MANIFEST, pointer=pointer_of(["runs", index, "status"]), run=run_id,
                          message=f"run {run_id} is stopped but stops.json has no record for it: add "
                                  f'{{"run": "{run_id}", "rule", "at", "step", "reason"}} to stops.json')
        elif status == "completed" and run_id in records:
            record_index = records[run_id][0]
            yield Finding("IV407", STOPS, pointer=pointer_of(["stops", record_index, "run"]), run=run_id,
                          message=f"stops.json records a stop of run {run_id}, whose status is completed: a "
                                  f"stopped run has status stopped (and is not accepted); remove the record if "
                                  f"the run was not stopped")


def _stops_agree_with_runs(ctx: RunContext) -> Iterator[Finding]:
    runs = runs_by_id(ctx)
    rules = {r["id"]: r for r in declared_rules(ctx) if isinstance(r.get("id"), str)}
    for index, record in stop_records(ctx):
        run_id = record.get("run")
        run = runs.get(run_id) if isinstance(run_id, str) else None
        if run is None:
            continue  # IV305 / IV402 say why
        who = f"stop record {index} (run {run_id})"
        step = record.get("step") if isinstance(record.get("step"), int) and not isinstance(record.get("step"), bool) \
            else None
        scan = metrics_of(ctx, run)
        first = last = None
        if scan is not None and scan.series:
            first = min(point[0] for series in scan.series.values() for point in series)
            last = max(point[0] for series in scan.series.values() for point in series)
        inside = step is not None and first is not None and first <= step <= last
        if step is not None and first is not None and not inside:
            yield Finding("IV408", STOPS, pointer=pointer_of(["stops", index, "step"]), run=run_id,
                          message=f"{who} is at step {step}, outside the steps {scan.path} logs "
                                  f"({first}–{last}): give the step at which the rule fired")
        yield from _stop_time_in_run(index, who, record, run, run_id)
        rule_id = record.get("rule")
        rule = rules.get(rule_id) if isinstance(rule_id, str) else None  # IV105 says a non-text one is wrong
        if rule is None or not is_threshold_rule(rule) or scan is None or not scan.series:
            continue
        if inside:
            yield from _floor_crossed(index, who, scan, step, rule, run_id)
        elif step is None:
            yield from _floor_ever_crossed(index, who, scan, rule, run_id)


def _stop_time_in_run(index: int, who: str, record: dict, run: dict, run_id: str) -> Iterator[Finding]:
    at = to_second(parse_time(record.get("at")))
    if at is None:
        return
    started = to_second(parse_time(run.get("started_at")))
    ended = to_second(parse_time(run.get("ended_at")))
    if started is not None and at < started:
        where = f"before the run started ({run['started_at']})"
    elif ended is not None and at > ended:
        where = f"after the run ended ({run['ended_at']})"
    else:
        return
    yield Finding("IV408", STOPS, pointer=pointer_of(["stops", index, "at"]), run=run_id,
                  message=f"{who} is dated {record['at']}, {where}: a stop happens while its run runs; write the "
                          f"time the rule fired, or correct the run's times")


def _floor_ever_crossed(index: int, who: str, scan: readers.MetricsScan, rule: dict,
                        run_id: str) -> Iterator[Finding]:
    """A threshold stop without a step: some logged value at least must cross it (or not be finite)."""
    metric = rule["metric"]
    points = scan.series.get(metric, ())
    if any(crosses(rule, p[1]) for p in points):
        return
    floor = rule["kind"] == "below_threshold"
    extreme = (f"its {'lowest' if floor else 'highest'} is {(min if floor else max)(p[1] for p in points):g}"
               if points else f"it logs no {metric}")
    yield Finding("IV408", STOPS, pointer=pointer_of(["stops", index, "rule"]), run=run_id,
                  message=f"{who} says stop rule {rule['id']} ({metric} {limit(rule)}) fired, but no {metric} "
                          f"in {scan.path} is {limit(rule).split(' ', 1)[0]} the {_bound(rule)} ({extreme}): the "
                          f"metrics deny the stop; give the rule and step that really stopped the run")


def _floor_crossed(index: int, who: str, scan: readers.MetricsScan, step: int, rule: dict,
                   run_id: str) -> Iterator[Finding]:
    metric = rule["metric"]
    earlier = [point for point in scan.series.get(metric, ()) if point[0] <= step]
    if not earlier:
        yield Finding("IV408", STOPS, pointer=pointer_of(["stops", index, "rule"]), run=run_id,
                      message=f"{who} says stop rule {rule['id']} ({metric} {limit(rule)}) fired at step {step}, "
                              f"but {scan.path} logs no {metric} at or before that step: nothing shows the "
                              f"{_bound(rule)} was crossed")
        return
    at_step, value, line = max(earlier, key=lambda p: (p[0], p[2]))
    if not crosses(rule, value):
        shown_step = f"at step {step}" if at_step == step else f"at step {at_step}, the last value before step {step}"
        yield Finding("IV408", STOPS, pointer=pointer_of(["stops", index, "rule"]), run=run_id,
                      message=f"{who} says stop rule {rule['id']} fired at step {step}, but {metric} is {value:g} "
                              f"{shown_step} ({scan.path} line {line}), not {limit(rule)}: the metrics "
                              f"deny the stop; give the rule and step that really stopped the run")
