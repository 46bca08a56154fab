"""What the report shows besides findings: the budget, the plan against the actual, the runs, the curves.

Every function tolerates a partial or malformed manifest: it returns what can be computed and None where it
cannot. Nothing here judges (the rules do); the budget only counts what the findings already decided.
"""
from __future__ import annotations

import math
import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from ..model import Finding, Severity
from ..package import facts
from ..package.campaign import (accepted_declared, indexed_runs, is_number,
                                listed, parse_time, runs_by_id, section, stopped_by_record, metrics_of)
from ..format.values import spoken_duration
from ..format.money import cost_per_accepted, fmt_usd, money
from ..seal.rate import Measured
from .lots import lots_summary, part_summary


# ---------------------------------------------------------------------------------------------- budget

def budget_summary(ctx, blocking_findings: list[Finding]) -> dict[str, Any]:
    """docs/integration.md `budget`: the committed plan, the included expenses apart from the rental, and the cost per
    accepted run that passed every check — undefined (never zero) when none did."""
    plan = section(ctx.documents.manifest, "plan")
    spent, runs = facts.budget(ctx), runs_by_id(ctx)
    total, stopped, declared = spent.total, list(spent.stopped), list(spent.accepted_declared)
    blocked: dict[str, list[str]] = {}
    for finding in blocking_findings:
        if finding.run is not None:
            blocked.setdefault(finding.run, []).append(f"{finding.code}: {finding.message}")
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

    hours = facts.hours(ctx)
    window = hours.lots_window
    summary: dict[str, Any] = {
        "currency": "USD",
        "total_usd": money(total),
        "rental_usd": money(spent.rental),
        "rental_total_stated_usd": plan.get("rental_total_usd") if is_number(plan.get("rental_total_usd")) else None,
        "lots": [_lot(lot) for _, lot in spent.lots],
        "lots_window_hours": window[0] if window else None,
        "window_hours": hours.window,
        "other_expenses_included": [{"label": label, "usd": money(amount)} for label, amount in spent.included],
        "other_expenses_excluded": [{"label": label, "usd": money(amount)} for label, amount in spent.excluded],
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
    return {key: scalar(lot.get(key)) for key in ("id", "gpu", "days", "gpus", "price_usd") if key in lot}


def _undefined_reason(declared: list[str], rejected: list[dict], total: Decimal | None) -> str:
    incurred = f"{fmt_usd(total)} incurred" if total is not None else "the cost incurred is unknown"
    if not declared:
        why = "the decision accepts no run"
    else:
        why = "no accepted run passed every check (" + "; ".join(
            f"{r['run']}: {r['causes'][0]}" for r in rejected) + ")"
    return f"cost per accepted run is undefined: {why}; {incurred}"


# ---------------------------------------------------------------------------------------------- plan

def plan_summary(ctx, rental: dict[str, Any] | None = None) -> dict[str, Any]:
    """The plan as declared, next to what happened; the plan itself is never rewritten. `rental`: the estimate
    against the rental's end the workflow made before the seal (rental_summary), kept as it was said."""
    manifest = ctx.documents.manifest
    hours = facts.hours(ctx)
    window, reserved, observed, first, declared = hours.window, hours.reserved, hours.observed, hours.first_run, \
        hours.declared
    decisions = [{key: scalar(d.get(key)) for key in ("at", "after", "decision", "note") if key in d}
                 for d in listed(section(manifest, "timeline"), "decisions") if isinstance(d, dict)]
    lots_window = hours.lots_window
    return {
        "declared_at": hours.declared_at,
        "first_run_started_at": listed(manifest, "runs")[first[2]].get("started_at") if first else None,
        "first_run": first[1] if first else None,
        "declared_before_first_run": (declared <= first[0]) if declared is not None and first else None,
        "window_hours": window,
        "lots_window_hours": lots_window[0] if lots_window else None,
        "reserved_hours": reserved,
        "observed_hours": observed,
        "uncommitted_margin_hours": _hours(window - reserved) if window is not None and reserved is not None else None,
        "observed_minus_reserved_hours": _hours(hours.gap) if hours.gap is not None else None,
        "deviations": [{"hours": d.hours, "explanation": d.explanation} for d in hours.deviations],
        "explained_deviation_hours": _hours(hours.explained),
        "decisions": decisions,
        "decisions_after_pilot": [d for d in decisions if isinstance(d.get("after"), str)
                                  and d["after"].strip().lower() == "pilot"],
        "rental": rental,
        "lots": lots_summary(ctx),  # a line per lot, when the runs say where they ran (report/lots.py)
        "part": part_summary(ctx),
    }


def _hours(value: float) -> float:
    return round(value, 3)


# ---------------------------------------------------------------------------------------------- runs

def runs_summary(ctx, findings: list[Finding]) -> list[dict[str, Any]]:
    """One line per run for people: what it was, how it ended, whether it is delivered, its last values."""
    declared = set(accepted_declared(ctx))
    records = stopped_by_record(ctx)
    per_run: dict[str, list[Finding]] = {}
    for finding in findings:
        if finding.run is not None:
            per_run.setdefault(finding.run, []).append(finding)
    out = []
    for _index, run, run_id in indexed_runs(ctx):
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
            "last_values": _last_values(ctx, run),
        }
        if run_id in records:
            record = records[run_id][1]
            entry["stop"] = {key: scalar(record.get(key)) for key in ("rule", "reason", "step", "at")}
        saves = saves_summary(ctx, run)
        if saves is not None:
            entry["saves"] = saves
        out.append(entry)
    return out


# ---------------------------------------------------------------------------------------------- saves

def _seconds(value: Any) -> float | None:
    return float(value) if is_number(value) and math.isfinite(value) and value >= 0 else None


def _step(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def saves_summary(ctx, run: dict) -> dict[str, Any] | None:
    """What the guide asks the user to weigh (docs/record.md): the run's saves (`runs[].checkpoints`), the interval
    between two in steps and minutes, write and restore seconds (the early proof's and the final reload's), the
    work at risk (the longest stretch a crash would lose: from the start to the first save, or between two) and
    the share of the run's time spent saving. None for a run that recorded no save."""
    entries = [c for c in listed(run, "checkpoints") if isinstance(c, dict)]
    if not entries:
        return None
    final = {r.artifact: r for r in (getattr(ctx, "reloads", None) or [])}
    saves = []
    for entry in sorted(entries, key=lambda c: (_step(c.get("step")) or -1)):
        proof = entry.get("proof") if isinstance(entry.get("proof"), dict) else None
        reload = final.get(entry.get("artifact"))
        saves.append({
            "artifact": scalar(entry.get("artifact")), "step": _step(entry.get("step")),
            "saved_at": entry.get("saved_at") if isinstance(entry.get("saved_at"), str) else None,
            "write_seconds": _seconds(entry.get("write_seconds")),
            "bytes": _step(entry.get("bytes")),
            "proof": None if proof is None else {
                "ok": proof.get("ok") if isinstance(proof.get("ok"), bool) else None,
                "seconds": _seconds(proof.get("seconds")),
                "codes": [c for c in listed(proof, "codes") if isinstance(c, str)],
                "error": proof.get("error") if isinstance(proof.get("error"), str) else None},
            "reload_seconds": round(reload.seconds, 3) if reload is not None and reload.ok else None,
        })
    started, ended = parse_time(run.get("started_at")), parse_time(run.get("ended_at"))
    moments = [parse_time(s["saved_at"]) for s in saves]
    steps = [s["step"] for s in saves]
    step_gaps = [b - a for a, b in zip([0] + steps, steps) if a is not None and b is not None]
    times = [started] + moments if started is not None else moments
    minute_gaps = [(b - a).total_seconds() / 60 for a, b in zip(times, times[1:]) if a is not None and b is not None]
    between = minute_gaps[1:] if started is not None else minute_gaps
    written = [s["write_seconds"] for s in saves if s["write_seconds"] is not None]
    duration = (ended - started).total_seconds() if started is not None and ended is not None else None
    proofs = [s["proof"] for s in saves if s["proof"] is not None]
    return {
        "count": len(saves),
        "saves": saves,
        "interval_steps": _median(step_gaps[1:]) if len(step_gaps) > 1 else (step_gaps[0] if step_gaps else None),
        "interval_minutes": _round(_median(between)) if between else None,
        "write_seconds_mean": _round(sum(written) / len(written)) if written else None,
        "write_seconds_total": _round(sum(written)) if written else None,
        "bytes_last": saves[-1]["bytes"],
        "proof_seconds": next((p["seconds"] for p in proofs if p["seconds"] is not None), None),
        "proof_ok": proofs[0]["ok"] if proofs else None,
        "reload_seconds": next((s["reload_seconds"] for s in reversed(saves) if s["reload_seconds"] is not None),
                               None),
        "at_risk_steps": max(step_gaps) if step_gaps else None,
        "at_risk_minutes": _round(max(minute_gaps)) if minute_gaps else None,
        "saving_share": round(sum(written) / duration, 4) if written and duration else None,
    }


def _median(values: list[float]) -> float | None:
    ordered = sorted(values)
    if not ordered:
        return None
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


# ---------------------------------------------------------------------------------------------- the rental's end

# The seal's rate is measured on this machine (seal/rate.py); this prior serves only when nothing could be read:
# the whole verify --no-reload on a 1.93 GiB package of 20,035 files took 7.18 s on 2 cores
# (benchmarks/results/seal-2026-11-30-session5.txt), about 270 MiB/s, taken lower. The push cannot be measured
# before it sends its first parts (push/deadline.py measures those, and warns then): until then a prior, 68 MB
# in 2.82 s to a store on loopback (push-2026-12-02.txt) taken down to a modest 25 MiB/s for a real uplink.
SEAL_BYTES_PER_SECOND = 200 * 2**20
PUSH_BYTES_PER_SECOND = 25 * 2**20
COMPRESSED_SHARE = 0.7  # archive bytes / package bytes (checkpoints compress little)
MARGIN = 1.5  # an estimate is an estimate: warn when 1.5x it would not fit
PUSH_PRIOR_WORDS = "a prior until the push measures its first parts"


def rental_end(ctx) -> tuple[datetime | None, str | None]:
    """When the rental ends and what says so: `--deadline` (the run's options), else the earliest lot's
    started_at + days."""
    deadline = parse_time(ctx.options.deadline)
    if deadline is not None:
        return deadline, "--deadline"
    ends = []
    for lot in listed(section(ctx.documents.manifest, "plan"), "lots"):
        start = parse_time(lot.get("started_at")) if isinstance(lot, dict) else None
        if start is not None and is_number(lot.get("days")) and lot["days"] > 0:
            ends.append(start + timedelta(days=lot["days"]))
    return (min(ends), "plan.lots[].started_at + days") if ends else (None, None)


def rental_summary(ctx, *, now: datetime | None = None, measured: Measured | None = None) -> dict[str, Any] | None:
    """The rental's end and whether the seal (and the push, when the options say one follows) fit before it,
    from the package's size and the seal's rate the workflow measured here (`measured`: flows/verify.py, with
    seal/rate.measure_package), else the prior; None when nothing says when the rental ends. Reads nothing."""
    end, source = rental_end(ctx)
    if end is None:
        return None
    now = now or datetime.now(UTC)
    size = sum(entry.size for entry in ctx.inventory.files.values())
    push = ctx.options.pushing
    rate = measured.bytes_per_second if measured is not None else SEAL_BYTES_PER_SECOND
    rate_words = measured.words() if measured is not None else "a prior: nothing here could be read to measure it"
    seal = size / rate
    upload = size * COMPRESSED_SHARE / PUSH_BYTES_PER_SECOND if push else 0.0
    left = (end - now).total_seconds()
    needed = seal + upload
    summary: dict[str, Any] = {
        "ends_at": end.strftime("%Y-%m-%dT%H:%M:%SZ"), "source": source, "seconds_left": round(left, 1),
        "package_bytes": size, "seal_estimate_seconds": round(seal, 1),
        "push_estimate_seconds": round(upload, 1) if push else None,
        "rates": {"seal_bytes_per_second": round(rate), "seal_rate_source": rate_words,
                  "push_bytes_per_second": PUSH_BYTES_PER_SECOND if push else None,
                  "push_rate_source": PUSH_PRIOR_WORDS if push else None},
        "fits": left >= needed * MARGIN,
    }
    if left <= 0:
        summary["warning"] = (f"the rental ended at {summary['ends_at']} ({_spoken(-left)} ago): whatever is not "
                              "already off the machine may be gone")
    elif not summary["fits"]:
        what = "the seal and the push" if push else "the seal"
        summary["warning"] = (f"the rental ends at {summary['ends_at']}, in {_spoken(left)}; {what} of "
                              f"{size / 2**30:.2f} GiB should take about {_spoken(needed)} at "
                              f"{rate / 2**20:.0f} MiB/s ({rate_words})"
                              + (f", the push at {PUSH_BYTES_PER_SECOND / 2**20:.0f} MiB/s ({PUSH_PRIOR_WORDS})"
                                 if push else "")
                              + ": they may not finish in time; seal and push now, reloads after (--no-reload)")
    return summary


def _spoken(seconds: float) -> str:
    return spoken_duration(seconds, seconds_with_minutes=True)  # a warning a minute from the end keeps its seconds


METRIC_PREFIXES = ("eval_", "train_", "val_", "valid_", "test_")


def _tokens(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def named_metrics(ctx) -> list[str]:
    """The metrics a reader looks for first: those the question names ("macro-F1" names eval_macro_f1, "train
    loss" train_loss), then those the stop rules name, each once, among the metrics the runs log. A name matches
    one to three consecutive words of the question, with or without its eval_/train_/... prefix."""
    logged: list[str] = []
    for _index, run, _run_id in indexed_runs(ctx):
        scan = metrics_of(ctx, run)
        logged += [name for name in (scan.series if scan is not None else ()) if name not in logged]
    question = ctx.documents.manifest.get("question")
    words = _tokens(question) if isinstance(question, str) else []
    phrases = {"".join(words[i:i + n]) for n in (1, 2, 3) for i in range(len(words) - n + 1)}
    named = []
    for name in logged:
        bare = next((name[len(p):] for p in METRIC_PREFIXES if name.startswith(p)), name)
        if {"".join(_tokens(name)), "".join(_tokens(bare))} & phrases:
            named.append(name)
    for rule in listed(section(ctx.documents.manifest, "stop_rules"), "rules"):
        metric = rule.get("metric") if isinstance(rule, dict) else None
        if isinstance(metric, str) and metric in logged and metric not in named:
            named.append(metric)
    return named


def _last_values(ctx, run: dict) -> dict[str, dict[str, Any]]:
    scan = metrics_of(ctx, run)
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

def metric_curves(ctx, max_points: int = 400) -> dict[str, dict[str, dict[str, Any]]]:
    """run -> metric -> points to draw, [[step, value or null when non-finite], ...] by step. Long series are
    thinned evenly, keeping the first, the last and every non-finite point; `total_points` is always the
    full count, so a thinned curve never passes for the whole series."""
    curves: dict[str, dict[str, dict[str, Any]]] = {}
    for _, run, run_id in indexed_runs(ctx):
        scan = metrics_of(ctx, run) if run_id is not None else None
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
