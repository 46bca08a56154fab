"""IV401–IV410: stop rules. Declared before the first run, applied as declared, and never overruled later."""
from __future__ import annotations

import math
from typing import Iterator

from .. import readers
from ..model import Finding, Rule, Severity
from ..package import MANIFEST, STOPS, Package, pointer_of
from ._campaign import (accepted_entries, filled_text, first_run_start, indexed_runs, is_number, listed,
                        parse_time, runs_by_id, section, shown, stop_records, stopped_by_record)
from . import _losses
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
    Rule("IV405", Severity.ERROR, "accepted run under a declared threshold",
         explain="A `below_threshold` stop rule sets a floor for a metric. An accepted run whose last value of "
                 "that metric (at its highest step) is under the floor, or that has no value of it at all, "
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
                 "(to the second), and a `below_threshold` stop is one the metrics show: the rule's metric at "
                 "that step (or the last value logged before it) is under the threshold. A record that "
                 "contradicts the run was written from memory or copied from another run: write what happened.",
         bad='{"run": "lora-r64", "rule": "f1-floor", "step": 2, ...}   metrics: {"step": 2, "name": '
             '"eval_macro_f1", "value": 0.71}   (floor 0.6)',
         good='{"run": "lora-r64", "rule": "f1-floor", "step": 2, ...}   metrics: {"step": 2, "name": '
              '"eval_macro_f1", "value": 0.38}   (floor 0.6)'),
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
         good='rule {"kind": "nonfinite_loss", "metric": "loss"}   metrics: {"step": 1, "name": "loss", "value": 2.31}'),
]


def check(package: Package) -> Iterator[Finding]:
    if not package.manifest:
        return  # missing or unparsable manifest: IV101/IV104 say so
    yield from _declared_in_time(package)
    yield from _stop_records_complete(package)
    yield from _stopped_not_accepted(package)
    yield from _nonfinite_in_unstopped_runs(package)
    yield from _accepted_above_thresholds(package)
    yield from _stops_under_declared_rules(package)
    yield from _status_agrees_with_stops(package)
    yield from _stops_agree_with_runs(package)
    yield from _nonfinite_loss_like_in_unstopped_runs(package)
    yield from _accepted_runs_log_the_watched_metric(package)


def declared_rules(package: Package) -> list[dict]:
    return [r for r in listed(section(package.manifest, "stop_rules"), "rules") if isinstance(r, dict)]


def metrics_of(package: Package, run: dict) -> readers.MetricsScan | None:
    ref = run.get("metrics")
    rel = package.normalise_ref(ref) if isinstance(ref, str) else None
    return readers.scan_metrics(package, rel) if rel else None


def _declared_in_time(package: Package) -> Iterator[Finding]:
    stop_rules = package.manifest.get("stop_rules")
    if stop_rules is None and any(True for _ in indexed_runs(package)):
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
    first = first_run_start(package)
    if first is not None and declared > first[0]:
        late = (declared - first[0]).total_seconds() / 3600
        yield Finding("IV401", MANIFEST, pointer="/stop_rules/declared_at",
                      message=f"the stop rules were declared at {stop_rules['declared_at']}, {late:.4g} h after "
                              f"run {first[1] or first[2]} started: rules written after the fact can be bent to "
                              f"fit what happened; declare them before the first run")


def _stop_records_complete(package: Package) -> Iterator[Finding]:
    for index, record in stop_records(package):
        who = record.get("run") if isinstance(record.get("run"), str) else f"#{index}"
        for key, what in (("rule", "the id of the declared rule that fired"),
                          ("reason", "what was observed, in words")):
            if filled_text(record.get(key)) is None:
                state = "missing" if key not in record else "blank"
                yield Finding("IV402", STOPS, pointer=pointer_of(["stops", index, key] if key in record
                                                                 else ["stops", index]),
                              message=f"stop record for run {who}: {key} is {state}: give {what}")


def _stopped_not_accepted(package: Package) -> Iterator[Finding]:
    runs = runs_by_id(package)
    records = stopped_by_record(package)
    for index, name in accepted_entries(package):
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


def watched_metrics(package: Package) -> set[tuple[str, str]]:
    """(rule id, metric) of every `nonfinite_loss` rule that names a metric."""
    return {(shown(r.get("id")), r["metric"]) for r in declared_rules(package)
            if r.get("kind") == "nonfinite_loss" and isinstance(r.get("metric"), str)}


def _nonfinite_in_unstopped_runs(package: Package) -> Iterator[Finding]:
    metrics = watched_metrics(package)
    records = stopped_by_record(package)
    for index, run, run_id in indexed_runs(package):
        if run.get("status") == "stopped" or run_id in records:
            continue
        scan = metrics_of(package, run)
        if scan is None:
            continue
        for rule_id, metric in sorted(metrics):
            bad = scan.nonfinite(metric)
            if not bad:
                continue
            step, value, line = bad[0]
            more = f" ({len(bad)} non-finite values in all)" if len(bad) > 1 else ""
            yield Finding("IV404", scan.path, line=line, run=run_id,
                          message=f"run {run_id or index}: {metric} is {_token(value)} at step {step}{more}, yet "
                                  f"the run was not stopped: stop rule {rule_id} should have fired; mark the run "
                                  f"stopped with a stop record, or rerun it")


def _token(value: float) -> str:
    return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")


def _accepted_above_thresholds(package: Package) -> Iterator[Finding]:
    floors = [r for r in declared_rules(package) if r.get("kind") == "below_threshold"
              and isinstance(r.get("metric"), str) and is_number(r.get("threshold"))]
    if not floors:
        return
    runs = runs_by_id(package)
    for name in dict.fromkeys(name for _, name in accepted_entries(package)):
        run = runs.get(name)
        if run is None or not isinstance(run.get("metrics"), str):
            continue  # IV305 / the schema say why
        scan = metrics_of(package, run)
        for rule in floors:
            metric, floor = rule["metric"], rule["threshold"]
            last = scan.last(metric) if scan is not None else None
            if last is None:
                where = scan.path if scan is not None else run["metrics"]
                yield Finding("IV405", where if scan is not None else MANIFEST, run=name,
                              pointer=None if scan is not None else _run_pointer(package, name, "metrics"),
                              message=f"accepted run {name} has no value of {metric} in {where}: nothing shows it "
                                      f"passed the floor {floor:g} of stop rule {shown(rule.get('id'))}")
            elif not math.isfinite(last[1]) or last[1] < floor:
                yield Finding("IV405", scan.path, line=last[2], run=name,
                              message=f"accepted run {name}: last {metric} (step {last[0]}) is {last[1]:g}, under "
                                      f"the floor {floor:g} of stop rule {shown(rule.get('id'))}: remove it from "
                                      f"decision.accepted")


def _run_pointer(package: Package, run_id: str, key: str) -> str | None:
    for index, _, candidate in indexed_runs(package):
        if candidate == run_id:
            return pointer_of(["runs", index, key])
    return None


def _stops_under_declared_rules(package: Package) -> Iterator[Finding]:
    declared = [r["id"] for r in declared_rules(package) if isinstance(r.get("id"), str)]
    for index, record in stop_records(package):
        rule = filled_text(record.get("rule"))
        if rule is not None and rule not in declared:  # a blank rule is IV402
            known = ", ".join(declared) if declared else "none"
            yield Finding("IV406", STOPS, pointer=pointer_of(["stops", index, "rule"]),
                          message=f"stop record {index} names rule {rule!r}, which is not a declared stop rule "
                                  f"(declared: {known}): a stop decided after the fact; say so in the decision")


def _status_agrees_with_stops(package: Package) -> Iterator[Finding]:
    records = stopped_by_record(package)
    for index, run, run_id in indexed_runs(package):
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


def _stops_agree_with_runs(package: Package) -> Iterator[Finding]:
    runs = runs_by_id(package)
    rules = {r["id"]: r for r in declared_rules(package) if isinstance(r.get("id"), str)}
    for index, record in stop_records(package):
        run_id = record.get("run")
        run = runs.get(run_id) if isinstance(run_id, str) else None
        if run is None:
            continue  # IV305 / IV402 say why
        who = f"stop record {index} (run {run_id})"
        step = record.get("step") if isinstance(record.get("step"), int) and not isinstance(record.get("step"), bool) \
            else None
        scan = metrics_of(package, run)
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
        rule = rules.get(record.get("rule"))
        if inside and rule is not None and rule.get("kind") == "below_threshold" \
                and isinstance(rule.get("metric"), str) and is_number(rule.get("threshold")):
            yield from _floor_crossed(index, who, scan, step, rule, run_id)


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


def _floor_crossed(index: int, who: str, scan: readers.MetricsScan, step: int, rule: dict,
                   run_id: str) -> Iterator[Finding]:
    metric, floor = rule["metric"], rule["threshold"]
    earlier = [point for point in scan.series.get(metric, ()) if point[0] <= step]
    if not earlier:
        yield Finding("IV408", STOPS, pointer=pointer_of(["stops", index, "rule"]), run=run_id,
                      message=f"{who} says stop rule {rule['id']} ({metric} under {floor:g}) fired at step {step}, "
                              f"but {scan.path} logs no {metric} at or before that step: nothing shows the floor "
                              f"was crossed")
        return
    at_step, value, line = max(earlier, key=lambda p: (p[0], p[2]))
    if math.isfinite(value) and value >= floor:
        shown_step = f"at step {step}" if at_step == step else f"at step {at_step}, the last value before step {step}"
        yield Finding("IV408", STOPS, pointer=pointer_of(["stops", index, "rule"]), run=run_id,
                      message=f"{who} says stop rule {rule['id']} fired at step {step}, but {metric} is {value:g} "
                              f"{shown_step} ({scan.path} line {line}), not under the floor {floor:g}: the metrics "
                              f"deny the stop; give the rule and step that really stopped the run")


def _nonfinite_loss_like_in_unstopped_runs(package: Package) -> Iterator[Finding]:
    watched = {metric for _, metric in watched_metrics(package)}  # IV404 reports those, in the metrics file
    records = stopped_by_record(package)
    for index, run, run_id in indexed_runs(package):
        if run.get("status") == "stopped" or run_id in records:
            continue
        name = run_id or f"#{index}"
        fp16 = _losses.fp16_amp(package, run)
        scan = metrics_of(package, run)
        reported = {metric for metric in watched if scan is not None and scan.nonfinite(metric)}  # IV404's
        for metric in sorted(scan.series) if scan is not None else ():
            bad = scan.nonfinite(metric) if _losses.is_loss_like(metric) and metric not in watched else []
            if not bad or (fp16 and _losses.is_grad_norm(metric) and math.isfinite(scan.last(metric)[1])):
                continue
            reported.add(metric)
            step, value, line = bad[0]
            yield Finding("IV409", scan.path, line=line, run=run_id,
                          message=_nonfinite_message(name, metric, value, step, len(bad)))
        # The Trainer's own log keeps what a metrics file written from it may have left out (grad_norm).
        for logged in _losses.trainer_log_nonfinite(package, run_id) if run_id is not None else ():
            if logged.metric in reported or (fp16 and _losses.is_grad_norm(logged.metric) and logged.last_finite):
                continue
            reported.add(logged.metric)
            yield Finding("IV409", logged.path, pointer=logged.pointer, run=run_id,
                          message=_nonfinite_message(name, logged.metric, logged.value, shown(logged.step),
                                                     logged.count, source=f" in the Trainer's log ({logged.path})"))


def _nonfinite_message(run: str, metric: str, value: float, step, count: int, source: str = "") -> str:
    more = f" ({count} non-finite values in all)" if count > 1 else ""
    head = f"run {run}: {metric} is {_token(value)} at step {step}{source}{more}, yet the run was not stopped"
    if _losses.is_grad_norm(metric):
        return (f"{head}: a non-finite gradient norm is how the Trainer's masked NaN shows (with "
                f"logging_nan_inf_filter=True, its default, a NaN step loss is logged as the window's average, so "
                f"the loss looks finite); the weights may be garbage: mark the run stopped with a stop record, or "
                f"rerun it (logging_nan_inf_filter=False logs the loss as it is)")
    return f"{head}: the weights may be garbage; mark the run stopped with a stop record, or rerun it"


def _accepted_runs_log_the_watched_metric(package: Package) -> Iterator[Finding]:
    watched = sorted(watched_metrics(package))
    if not watched:
        return
    runs = runs_by_id(package)
    for name in dict.fromkeys(name for _, name in accepted_entries(package)):
        run = runs.get(name)
        scan = metrics_of(package, run) if run is not None else None
        if scan is None or not scan.records:
            continue  # no readable metrics: IV101 / IV103 / IV104 say why
        for rule_id, metric in watched:
            if metric in scan.series:
                continue
            logged = [n for n in sorted(scan.series) if _losses.is_loss_like(n)]
            hint = (f" (it logs {', '.join(logged[:4])}: name the metric the runs log in the rule)" if logged
                    else "")
            yield Finding("IV410", scan.path, run=name,
                          message=f"accepted run {name} never logs {metric}, the metric stop rule {rule_id} "
                                  f"watches{hint}: nothing shows it stayed finite")
