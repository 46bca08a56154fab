"""What the report shows besides findings: the budget, the plan against the actual, the runs, the curves.

Every function tolerates a partial or malformed manifest: it returns what can be computed and None where it
cannot. Nothing here judges (the rules do); the budget only counts what the findings already decided.
"""
from __future__ import annotations

import math
import re
from decimal import Decimal
from typing import Any

from ..model import Finding, Severity
from ..package.campaign import (accepted_declared, filled_text, first_run_start, indexed_runs, is_number,
                                listed, parse_time, runs_by_id, section, stopped_by_record, metrics_of)
from ..format.money import cost_per_accepted, fmt_usd, lots, money, other_expenses, rental_usd, total_usd
from ..package.budget import lots_window_hours


# ---------------------------------------------------------------------------------------------- budget

def budget_summary(package, blocking_findings: list[Finding]) -> dict[str, Any]:
    """SPEC §4 `budget`: the committed plan, the included expenses apart from the rental, and the cost per
    accepted run that passed every check — undefined (never zero) when none did."""
    plan = section(package.manifest, "plan")
    runs = runs_by_id(package)
    total = total_usd(plan)
    blocked: dict[str, list[str]] = {}
    for finding in blocking_findings:
        if finding.run is not None:
            blocked.setdefault(finding.run, []).append(f"{finding.code}: {finding.message}")
    stop_records = stopped_by_record(package)
    stopped = [run_id for run_id, run in runs.items() if run.get("status") == "stopped" or run_id in stop_records]

    declared = accepted_declared(package)
    accepted, rejected = [], []
    for name in declared:
        causes = []
        if name not in runs:
            causes.append("not a run of the manifest")
        elif name in stopped:
            causes.append("stopped: a stopped run never becomes a deliverable")
        causes += blocked.get(name, [])
        if causes:
            rejected.append({"run": name, "causes": causes})
        else:
            accepted.append(name)

    window = lots_window_hours(plan)
    summary: dict[str, Any] = {
        "currency": "USD",
        "total_usd": money(total),
        "rental_usd": money(rental_usd(plan)),
        "rental_total_stated_usd": plan.get("rental_total_usd") if is_number(plan.get("rental_total_usd")) else None,
        "lots": [_lot(lot) for _, lot in lots(plan)],
        "lots_window_hours": window[0] if window else None,
        "window_hours": plan.get("window_hours") if is_number(plan.get("window_hours")) else None,
        "other_expenses_included": [{"label": label, "usd": money(amount)}
                                    for label, amount in other_expenses(plan, True)],
        "other_expenses_excluded": [{"label": label, "usd": money(amount)}
                                    for label, amount in other_expenses(plan, False)],
        "accepted_declared": len(declared),
        "accepted_declared_runs": declared,
        "accepted": len(accepted),
        "accepted_runs": accepted,
        "cost_per_accepted_usd": money(cost_per_accepted(total, len(accepted))),
        "stopped_runs": stopped,
        "rejected": rejected,
    }
    if not accepted:
        summary["cost_incurred_usd"] = money(total)
        summary["undefined_reason"] = _undefined_reason(declared, rejected, total)
    return summary


def scalar(value: Any) -> Any:
    """A manifest value copied into the report: strings, booleans and finite numbers as they are; anything
    else (NaN, Infinity, 10**400, nested objects) as null, so the report stays strict, small JSON."""
    if value is None or isinstance(value, (str, bool)):
        return value
    return value if is_number(value) else None


def _lot(lot: dict) -> dict[str, Any]:
    return {key: scalar(lot.get(key)) for key in ("gpu", "days", "gpus", "price_usd") if key in lot}


def _undefined_reason(declared: list[str], rejected: list[dict], total: Decimal | None) -> str:
    incurred = f"{fmt_usd(total)} incurred" if total is not None else "the cost incurred is unknown"
    if not declared:
        why = "the decision accepts no run"
    else:
        why = "no accepted run passed every check (" + "; ".join(
            f"{r['run']}: {r['causes'][0]}" for r in rejected) + ")"
    return f"cost per accepted run is undefined: {why}; {incurred}"


# ---------------------------------------------------------------------------------------------- plan

def plan_summary(package) -> dict[str, Any]:
    """The plan as declared, next to what happened; the plan itself is never rewritten."""
    manifest = package.manifest
    plan, timeline = section(manifest, "plan"), section(manifest, "timeline")
    number = lambda container, key: container.get(key) if is_number(container.get(key)) else None  # noqa: E731
    window, reserved, observed = number(plan, "window_hours"), number(plan, "reserved_hours"), \
        number(timeline, "observed_hours")
    deviations = [{"hours": d.get("hours") if is_number(d.get("hours")) else None,
                   "explanation": d.get("explanation") if isinstance(d.get("explanation"), str) else None}
                  for d in listed(timeline, "deviations") if isinstance(d, dict)]
    explained = sum(d["hours"] for d in deviations if d["hours"] is not None and filled_text(d["explanation"]))
    decisions = [{key: scalar(d.get(key)) for key in ("at", "after", "decision", "note") if key in d}
                 for d in listed(timeline, "decisions") if isinstance(d, dict)]
    first = first_run_start(package)
    declared_at = plan.get("declared_at") if isinstance(plan.get("declared_at"), str) else None
    declared = parse_time(declared_at)
    lots_window = lots_window_hours(plan)
    return {
        "declared_at": declared_at,
        "first_run_started_at": listed(manifest, "runs")[first[2]].get("started_at") if first else None,
        "first_run": first[1] if first else None,
        "declared_before_first_run": (declared <= first[0]) if declared is not None and first else None,
        "window_hours": window,
        "lots_window_hours": lots_window[0] if lots_window else None,
        "reserved_hours": reserved,
        "observed_hours": observed,
        "uncommitted_margin_hours": _hours(window - reserved) if window is not None and reserved is not None else None,
        "observed_minus_reserved_hours": _hours(observed - reserved) if observed is not None and reserved is not None
        else None,
        "deviations": deviations,
        "explained_deviation_hours": _hours(explained),
        "decisions": decisions,
        "decisions_after_pilot": [d for d in decisions if isinstance(d.get("after"), str)
                                  and d["after"].strip().lower() == "pilot"],
    }


def _hours(value: float) -> float:
    return round(value, 3)


# ---------------------------------------------------------------------------------------------- runs

def runs_summary(package, findings: list[Finding]) -> list[dict[str, Any]]:
    """One line per run for people: what it was, how it ended, whether it is delivered, its last values."""
    declared = set(accepted_declared(package))
    records = stopped_by_record(package)
    per_run: dict[str, list[Finding]] = {}
    for finding in findings:
        if finding.run is not None:
            per_run.setdefault(finding.run, []).append(finding)
    out = []
    for _index, run, run_id in indexed_runs(package):
        own = per_run.get(run_id, []) if run_id is not None else []
        errors = [f for f in own if (f.severity or Severity.ERROR) == Severity.ERROR]
        stopped = run.get("status") == "stopped" or run_id in records
        entry: dict[str, Any] = {
            "id": run_id,
            "role": run.get("role") if isinstance(run.get("role"), str) else None,
            "category": run.get("category") if isinstance(run.get("category"), str) else None,
            "status": run.get("status") if isinstance(run.get("status"), str) else None,
            "accepted_declared": run_id in declared,
            "accepted": run_id in declared and not stopped and not errors,
            "findings": len(own),
            "last_values": _last_values(package, run),
        }
        if run_id in records:
            record = records[run_id][1]
            entry["stop"] = {key: scalar(record.get(key)) for key in ("rule", "reason", "step", "at")}
        out.append(entry)
    return out


METRIC_PREFIXES = ("eval_", "train_", "val_", "valid_", "test_")


def _tokens(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def named_metrics(package) -> list[str]:
    """The metrics a reader looks for first: those the question names ("macro-F1" names eval_macro_f1, "train
    loss" train_loss), then those the stop rules name, each once, among the metrics the runs log. A name matches
    one to three consecutive words of the question, with or without its eval_/train_/... prefix."""
    logged: list[str] = []
    for _index, run, _run_id in indexed_runs(package):
        scan = metrics_of(package, run)
        logged += [name for name in (scan.series if scan is not None else ()) if name not in logged]
    question = package.manifest.get("question")
    words = _tokens(question) if isinstance(question, str) else []
    phrases = {"".join(words[i:i + n]) for n in (1, 2, 3) for i in range(len(words) - n + 1)}
    named = []
    for name in logged:
        bare = next((name[len(p):] for p in METRIC_PREFIXES if name.startswith(p)), name)
        if {"".join(_tokens(name)), "".join(_tokens(bare))} & phrases:
            named.append(name)
    for rule in listed(section(package.manifest, "stop_rules"), "rules"):
        metric = rule.get("metric") if isinstance(rule, dict) else None
        if isinstance(metric, str) and metric in logged and metric not in named:
            named.append(metric)
    return named


def _last_values(package, run: dict) -> dict[str, dict[str, Any]]:
    scan = metrics_of(package, run)
    if scan is None:
        return {}
    values = {}
    for name in scan.series:
        step, value, _ = scan.last(name)
        finite = math.isfinite(value)
        values[name] = {"step": step, "value": value if finite else None}
        if not finite:
            values[name]["nonfinite"] = _token(value)
    return values


def _token(value: float) -> str:
    return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")


# ---------------------------------------------------------------------------------------------- curves

def metric_curves(package, max_points: int = 400) -> dict[str, dict[str, dict[str, Any]]]:
    """run -> metric -> points to draw, [[step, value or null when non-finite], ...] by step. Long series are
    thinned evenly, keeping the first, the last and every non-finite point; `total_points` is always the
    full count, so a thinned curve never passes for the whole series."""
    curves: dict[str, dict[str, dict[str, Any]]] = {}
    for _, run, run_id in indexed_runs(package):
        scan = metrics_of(package, run) if run_id is not None else None
        if scan is None or not scan.series or run_id in curves:
            continue
        curves[run_id] = {name: _curve(points, max_points) for name, points in scan.series.items()}
    return curves


def _curve(points: list[tuple[int, float, int]], max_points: int) -> dict[str, Any]:
    ordered = sorted(points, key=lambda p: (p[0], p[2]))
    total = len(ordered)
    nonfinite = [i for i, p in enumerate(ordered) if not math.isfinite(p[1])]
    if total <= max_points:
        keep = range(total)
    else:
        stride = (total - 1) / max(max_points - 1, 1)
        chosen = {round(k * stride) for k in range(max_points)} | {0, total - 1}
        keep = sorted(chosen | set(nonfinite))
    return {
        "points": [[ordered[i][0], ordered[i][1] if math.isfinite(ordered[i][1]) else None] for i in keep],
        "nonfinite_steps": [ordered[i][0] for i in nonfinite],
        "total_points": total,
        "downsampled": total > max_points,
    }


__all__ = ["budget_summary", "plan_summary", "runs_summary", "metric_curves"]
