"""Text output for people: findings by file, runs, reloads, budget, plan, archive, and always a verdict line.

Everything from the package is untrusted: it goes through `Text` objects (never rich markup) and `clean()`,
so a message cannot inject terminal escape sequences or markup.
"""
from __future__ import annotations

import io
import math
import os
import re
import shutil
from typing import Any, Iterable

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..model import Finding, Severity
from . import Report

SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}
PLAIN_WIDTH = 120  # wide enough that a CI log keeps one finding per line


# ----------------------------------------------------------------------------- words shared by every renderer

def clean(value: Any, keep: str = "\n\t") -> str:
    """A value from the package as one printable string: control characters become visible escapes."""
    text = "" if value is None else str(value)
    return "".join(c if c.isprintable() or c in keep else f"\\x{ord(c):02x}" for c in text)


def plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def human_bytes(size: Any) -> str:
    if not isinstance(size, (int, float)) or isinstance(size, bool) or size < 0:
        return "-"
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"


def number(value: Any, digits: int = 2) -> str | None:
    """A finite number as text, or None for anything else (a malformed package may hold strings or NaN)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    if float(value).is_integer():
        return str(int(value))
    return f"{value:.{digits}f}".rstrip("0").rstrip(".")


def usd(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return "?"
    return f"{value:,.2f} USD"


def hours(value: Any) -> str:
    text = number(value, 3)
    return "?" if text is None else f"{text} h"


def metric_value(value: Any) -> str:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if not math.isfinite(value):
            return str(value)
        return f"{value:.4g}"
    return clean(value) if value is not None else "-"


def location(finding: Finding) -> str:
    """line:col when the finding has a line, else the JSON pointer, else nothing."""
    if finding.line is not None:
        return f"{finding.line}:{finding.column}" if finding.column is not None else str(finding.line)
    return clean(finding.pointer) if finding.pointer else ""


def severity_of(finding: Finding) -> str:
    return (finding.severity or Severity.ERROR).value


def findings_by_file(findings: Iterable[Finding]) -> list[tuple[str, list[Finding]]]:
    """Findings grouped by file, files in first-seen order, each group most severe first."""
    groups: dict[str, list[Finding]] = {}
    for finding in findings:
        groups.setdefault(finding.path or "(package)", []).append(finding)
    rank = {"error": 0, "warning": 1, "info": 2}
    return [(path, sorted(group, key=lambda f: (rank.get(severity_of(f), 3), f.line or 0, f.code)))
            for path, group in groups.items()]


def _counts(report: Report) -> str:
    blocking = {id(f) for f in report.blocking()}
    parts = []
    for severity, word in ((Severity.ERROR, "error"), (Severity.WARNING, "warning"), (Severity.INFO, "info")):
        found = [f for f in report.findings if (f.severity or Severity.ERROR) == severity]
        if severity == Severity.INFO and not found:
            continue
        text = f"{len(found)} info" if severity == Severity.INFO else plural(len(found), word)
        codes = sorted({f.code for f in found if id(f) in blocking})
        if codes:
            text += " (" + ", ".join(codes[:6]) + (", …" if len(codes) > 6 else "") + ")"
        parts.append(text)
    return ", ".join(parts)


def _reload_clause(report: Report) -> str:
    if not report.reloaded:
        why = "--no-reload" if report.mode == "verify" else "audit without --reload"
        return f"artifacts NOT reloaded ({why})"
    total = len(report.reloads)
    ok = sum(1 for r in report.reloads if r.ok)
    devices = report.device or ", ".join(sorted({clean(r.device) for r in report.reloads})) or "?"
    if total == ok:
        return f"{plural(total, 'artifact')} reloaded on {devices}"
    return f"{ok} of {plural(total, 'artifact')} reloaded on {devices}, {total - ok} failed"


def _seal_clause(report: Report) -> str:
    name = os.path.basename(clean((report.archive or {}).get("path")))
    if report.mode == "audit":
        return f"audited {name or 'the archive'}"
    if report.sealed:  # the copy sealed inside the archive is written before the archive has a path
        return f"sealed {name or (clean(report.campaign_id) + '.tar.zst' if report.campaign_id else 'the archive')}"
    if report.seal_skipped == "--no-seal":
        return "not sealed (--no-seal)"
    return "nothing sealed"


def verdict_line(report: Report) -> str:
    """`PASS: 0 errors, 1 warning; 4 artifacts reloaded on cpu; sealed reviews-lora-2026-11.tar.zst`"""
    head = "PASS" if report.verdict == "pass" else "FAIL"
    return f"{head}: " + "; ".join([_counts(report), _reload_clause(report), _seal_clause(report)])


def cost_per_accepted(budget: dict) -> str:
    """The ratio, or why it is undefined: never a cost of zero (SPEC §2 budget summary)."""
    ratio = budget.get("cost_per_accepted_usd")
    if isinstance(ratio, (int, float)) and not isinstance(ratio, bool) and ratio > 0:
        return usd(ratio)
    reason = clean(budget.get("undefined_reason")) or "no accepted run passed every check"
    # summary.py words the reason as a whole sentence; keep only its cause, the incurred cost is added here
    reason = re.sub(r"^cost per accepted run is undefined:\s*", "", reason)
    reason = re.sub(r";[^;]*incurred\s*$", "", reason)
    incurred = budget.get("cost_incurred_usd", budget.get("total_usd"))
    return f"undefined: {reason}, cost incurred {usd(incurred)}"


def run_metrics(run: dict) -> dict[str, Any]:
    """Last value per metric: `metrics` {name: value} or summary's `last_values` {name: {value, nonfinite}}."""
    if isinstance(run.get("metrics"), dict):
        return run["metrics"]
    values = run.get("last_values") if isinstance(run.get("last_values"), dict) else {}
    return {name: (v.get("value") if v.get("value") is not None else v.get("nonfinite")) if isinstance(v, dict) else v
            for name, v in values.items()}


def run_stop(run: dict) -> tuple[Any, Any]:
    """(stop rule, reason) from `stop_rule`/`stop_reason` or a `stop` record."""
    stop = run.get("stop") if isinstance(run.get("stop"), dict) else {}
    return run.get("stop_rule") or stop.get("rule"), run.get("stop_reason") or stop.get("reason")


def rejection_cause(rejected: dict) -> str:
    causes = rejected.get("causes")
    if isinstance(causes, list) and causes:
        return "; ".join(clean(c) for c in causes)
    return clean(rejected.get("cause")) or "?"


# ----------------------------------------------------------------------------- sections

def _header(report: Report) -> Text:
    text = Text(f"{report.tool} {report.version}", style="bold")
    text.append(f" · {report.mode} · package {clean(report.package)}")
    if report.campaign_id:
        text.append(" · campaign ")
        text.append(clean(report.campaign_id), style="bold")
    return text


def _findings(console: Console, report: Report) -> None:
    if not report.findings:
        console.print(Text("No findings.", style="green"))
        return
    for path, group in findings_by_file(report.findings):
        console.print(Text(clean(path), style="bold underline"), soft_wrap=True)
        width = max(len(location(f)) for f in group)
        for finding in group:
            severity = severity_of(finding)
            line = Text("  ")
            line.append(location(finding).ljust(width), style="dim")
            line.append("  ")
            line.append(severity.ljust(7), style=SEVERITY_STYLE.get(severity, ""))
            line.append(" ")
            line.append(finding.code, style="bold")
            line.append("  " + clean(finding.message))
            console.print(line, soft_wrap=True)


def _table(title: str, *columns: str) -> Table:
    table = Table(title=title, title_justify="left", title_style="bold", box=box.SIMPLE_HEAD, pad_edge=False,
                  show_edge=False)
    for column in columns:
        table.add_column(column, overflow="fold")
    return table


MAX_METRIC_COLUMNS = 6
COLUMN_GAP = 3  # what _table's box puts between two columns: padding, divider, padding
MIN_STOP_WIDTH = 16


def _row_width(widths: Iterable[int]) -> int:
    widths = list(widths)
    return sum(widths) + COLUMN_GAP * max(len(widths) - 1, 0)


def _metric_columns(runs: list[dict], named: list[str], fixed: int, stop: int, width: int) -> list[tuple[str, int]]:
    """(metric, column width): the question's and the stop rules' metrics first, then others while the row fits
    the width with the stop column whole; named ones are dropped last, from the end."""
    logged: list[str] = []
    for run in runs:
        logged += [n for n in run_metrics(run) if n not in logged]

    def column(name: str) -> tuple[str, int]:
        return name, max([len(clean(name))] + [len(metric_value(run_metrics(r).get(name))) for r in runs])

    first = [column(n) for n in named if n in logged][:MAX_METRIC_COLUMNS]
    chosen = list(first)
    for name in (n for n in logged if n not in named):
        candidate = column(name)
        fits = _row_width([fixed, stop, *(w for _, w in chosen), candidate[1]]) <= width
        if len(chosen) < MAX_METRIC_COLUMNS and fits:
            chosen.append(candidate)
    while chosen and _row_width([fixed, min(stop, MIN_STOP_WIDTH), *(w for _, w in chosen)]) > width:
        chosen.pop()
    return chosen


def _runs(console: Console, report: Report) -> None:
    """One line per run, never wrapped: the metrics that the question and the stop rules name come first; a stop
    reason too long for its column is cut there and printed whole below the table."""
    runs = [r for r in (report.runs or []) if isinstance(r, dict)]
    if not runs:
        return
    headers = ("run", "role", "category", "status", "accepted")
    rows = [(clean(run.get("id")), clean(run.get("role")), clean(run.get("category")), clean(run.get("status")),
             "yes" if run.get("accepted") else "no") for run in runs]
    stops = [": ".join(clean(part) for part in run_stop(run) if part) for run in runs]
    stop_header = "stop rule: reason"
    fixed = _row_width(max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(headers))
    stop_natural = max(len(stop_header), *(len(s) for s in stops))
    columns = _metric_columns(runs, list(report.named_metrics or []), fixed, stop_natural, console.width)
    stop_width = max(min(stop_natural, console.width - _row_width([fixed, *(w for _, w in columns)]) - COLUMN_GAP),
                     min(stop_natural, MIN_STOP_WIDTH))
    table = Table(title="Runs", title_justify="left", title_style="bold", box=box.SIMPLE_HEAD, pad_edge=False,
                  show_edge=False)
    for header in headers:
        table.add_column(header, no_wrap=True)
    table.add_column(stop_header, no_wrap=True, overflow="ellipsis", max_width=stop_width)
    for name, _ in columns:
        table.add_column(clean(name), no_wrap=True, overflow="ellipsis")
    for run, row, stop in zip(runs, rows, stops):
        metrics = run_metrics(run)
        accepted = Text("yes", style="green") if run.get("accepted") else Text("no")
        table.add_row(*row[:4], accepted, stop, *(metric_value(metrics.get(name)) for name, _ in columns))
    console.print(table)
    for row, stop in zip(rows, stops):
        if len(stop) > stop_width:
            console.print(Text(f"  {row[0]} stopped by {stop}"), soft_wrap=True)
    shown = {name for name, _ in columns}
    hidden = len({n for run in runs for n in run_metrics(run)} - shown)
    if hidden:
        console.print(Text(f"  {plural(hidden, 'more metric')} not shown (the JSON and HTML reports hold every one)",
                           style="dim"))
    console.print()


def _reloads(console: Console, report: Report, verbose: bool) -> None:
    if not report.reloaded:
        why = "--no-reload" if report.mode == "verify" else "audit without --reload"
        console.print(Text(f"Reloads: artifacts NOT reloaded ({why}); nothing here proves they load.",
                           style="bold yellow"))
        return
    if not report.reloads:
        console.print(Text("Reloads: no artifact to reload.", style="yellow"))
        return
    # One line per artifact, never wrapped; what went wrong (or, with -v, what the forward pass proved) follows
    # the table in full, one line per artifact, where a long message stays readable.
    table = Table(title="Reloads", title_justify="left", title_style="bold", box=box.SIMPLE_HEAD, pad_edge=False,
                  show_edge=False)
    for column in ("artifact", "loader", "devices", "ok", "seconds", "peak memory (host / GPU)"):
        table.add_column(column, no_wrap=True, overflow="ellipsis")
    details = []
    for reload in report.reloads:
        ok = Text("ok", style="green") if reload.ok else Text("FAILED", style="bold red")
        detail = clean(reload.error if not reload.ok else (reload.forward if verbose else ""))
        if detail:
            details.append(Text(f"  {clean(reload.artifact)}: {detail}", style="" if reload.ok else "red"))
        table.add_row(clean(reload.artifact), clean(reload.loader), clean(", ".join(reload.devices) or reload.device),
                      ok, f"{reload.seconds:.1f}", memory_cell(reload))
    console.print(table)
    for line in details:
        console.print(line, soft_wrap=True)


def memory_cell(reload) -> str:
    """Host peak beside device peak (a GPU reload); the one peak known otherwise."""
    host = reload.host_peak_memory_bytes
    if reload.device_peak_memory_bytes is not None:
        return f"{human_bytes(host)} / {human_bytes(reload.device_peak_memory_bytes)}"
    return human_bytes(host if host is not None else reload.peak_memory_bytes)


def _budget(console: Console, budget: dict | None) -> None:
    if not isinstance(budget, dict) or not budget:
        return
    console.print(Text("Budget", style="bold"))
    lots = [lot for lot in budget.get("lots") or [] if isinstance(lot, dict)]
    lot_words = "; ".join(f"{clean(lot.get('gpu'))} × {clean(lot.get('gpus'))}, {clean(lot.get('days'))} days, "
                          f"{usd(lot.get('price_usd'))}" for lot in lots)
    console.print(f"  rental {usd(budget.get('rental_usd'))}" + (f" ({lot_words})" if lot_words else ""),
                  soft_wrap=True)
    for label, key in (("included", "other_expenses_included"), ("excluded", "other_expenses_excluded")):
        for expense in budget.get(key) or []:
            if isinstance(expense, dict):
                console.print(f"  other expense ({label}): {clean(expense.get('label'))} {usd(expense.get('usd'))}",
                              soft_wrap=True)
    console.print(f"  total {usd(budget.get('total_usd'))}; accepted runs that passed every check: "
                  f"{clean(budget.get('accepted'))} (declared {clean(budget.get('accepted_declared'))})",
                  soft_wrap=True)
    ratio = cost_per_accepted(budget)
    console.print(Text("  cost per accepted run: ").append(ratio, style="bold" if ratio[0].isdigit() else "yellow"),
                  soft_wrap=True)
    stopped = [clean(r.get("run") if isinstance(r, dict) else r) for r in budget.get("stopped_runs") or []]
    if stopped:
        console.print(f"  stopped (cost kept, never a deliverable): {', '.join(stopped)}", soft_wrap=True)
    for rejected in budget.get("rejected") or []:
        if isinstance(rejected, dict):
            console.print(f"  rejected {clean(rejected.get('run'))}: {rejection_cause(rejected)}", soft_wrap=True)


def _plan(console: Console, plan: dict | None) -> None:
    if not isinstance(plan, dict) or not plan:
        return
    console.print(Text("Plan vs actual", style="bold"))
    console.print(f"  window {hours(plan.get('window_hours'))} · reserved {hours(plan.get('reserved_hours'))} · "
                  f"observed {hours(plan.get('observed_hours'))} · uncommitted margin "
                  f"{hours(plan.get('uncommitted_margin_hours'))}", soft_wrap=True)
    for deviation in plan.get("deviations") or []:
        if isinstance(deviation, dict):
            console.print(f"  deviation {hours(deviation.get('hours'))}: {clean(deviation.get('explanation'))}",
                          soft_wrap=True)
    for decision in plan.get("decisions") or []:
        if isinstance(decision, dict):
            console.print(f"  decision {clean(decision.get('at'))} after {clean(decision.get('after'))}: "
                          f"{clean(decision.get('decision'))} — {clean(decision.get('note'))}", soft_wrap=True)


def _archive(console: Console, report: Report) -> None:
    archive = report.archive if isinstance(report.archive, dict) else None
    if archive:
        console.print(Text("Archive", style="bold"))
        console.print(f"  {clean(archive.get('path'))} ({human_bytes(archive.get('bytes'))})", soft_wrap=True)
        console.print(f"  sha256 {clean(archive.get('sha256'))}", soft_wrap=True)
    elif report.seal_skipped:
        console.print(Text(f"Archive: not sealed ({clean(report.seal_skipped)})", style="yellow"), soft_wrap=True)


def _record(console: Console, report: Report) -> None:
    """Audit: what the sender's record says next to the re-check, and what a configuration difference explains."""
    comparison = (report.audit or {}).get("comparison") if isinstance(report.audit, dict) else None
    if not isinstance(comparison, dict) or not comparison.get("recorded"):
        return
    console.print(Text("Sender's record", style="bold"))
    console.print(f"  recorded verdict {clean(comparison.get('recorded_verdict'))} by itera-verify "
                  f"{clean(comparison.get('recorded_version'))}; re-check now {clean(comparison.get('verdict'))} "
                  f"under the reviewer's configuration", soft_wrap=True)
    differences = comparison.get("configuration_differences") or []
    if differences:
        shown = ", ".join(f"{clean(d.get('code'))} {clean(d.get('sender'))}→{clean(d.get('reviewer'))}"
                          for d in differences[:8] if isinstance(d, dict))
        more = f" and {len(differences) - 8} more" if len(differences) > 8 else ""
        console.print(f"  rules configured differently (sender→reviewer): {shown}{more}", soft_wrap=True)
    explained = comparison.get("explained_by_configuration") or []
    if explained:
        console.print(f"  {', '.join(clean(c) for c in explained)}: failing now, not run at error level by the "
                      "sender (a configuration or version difference, not a change of content)", soft_wrap=True)


def render(report: Report, options: dict) -> str:
    color = bool(options.get("color"))
    width = shutil.get_terminal_size((PLAIN_WIDTH, 24)).columns if color else PLAIN_WIDTH
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=color, color_system="standard" if color else None, width=width,
                      highlight=False, emoji=False, markup=False, legacy_windows=False)
    if not options.get("quiet"):
        console.print(_header(report), soft_wrap=True)
        console.print()
    _findings(console, report)
    if not options.get("quiet"):
        console.print()
        _runs(console, report)
        _reloads(console, report, bool(options.get("verbose")))
        console.print()
        _budget(console, report.budget)
        _plan(console, report.plan)
        _archive(console, report)
        _record(console, report)
        if options.get("verbose") and report.elapsed_seconds is not None:
            console.print(f"elapsed {report.elapsed_seconds:.1f} s")
        console.print()
    style = "bold green" if report.verdict == "pass" else "bold red"
    console.print(Text(verdict_line(report), style=style), soft_wrap=True)
    # rich pads table lines to the console width; trailing blanks are noise in logs and diffs
    return "\n".join(line.rstrip() for line in buffer.getvalue().splitlines()) + "\n"
