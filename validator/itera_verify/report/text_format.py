"""Text output for people: findings by file, runs, reloads, budget, plan, archive, and always a verdict line.

Everything from the package is untrusted: it goes through `Text` objects (never rich markup) and `clean()`,
so a message cannot inject terminal escape sequences, markup or a line of its own, and the whole text through
`plain_lines()`, so no line of it is a CI runner's workflow command.
"""
from __future__ import annotations

import io
import os
import re
import shutil

from rich.console import Console
from rich.text import Text

from ..model import Severity
from . import Report
from .lots import lot_line, part_words, reloaded_on
from .words import signer_line
from .text_tables import reloads_table, runs_table, saves_table
# The shared words, imported from here by the other renderers.
from .words import (clean, findings_by_file, hours, human_bytes, location, memory_cell, metric_value,  # noqa: F401
                    number, plain_lines, plural, rejection_cause, run_metrics, run_stop, severity_of, usd)

SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}
PLAIN_WIDTH = 120  # wide enough that a CI log keeps one finding per line


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
    # An assembled campaign: a lot's signed proof stands for what this machine could not reload; not a reload.
    on_lots = sum(1 for r in report.reloads if reloaded_on(r))
    lots = f", {on_lots} not reloaded here (each stands on its lot's signed proof)" if on_lots else ""
    failed = total - ok - on_lots
    if total == ok:
        return f"{plural(total, 'artifact')} reloaded on {devices}"
    return f"{ok} of {plural(total, 'artifact')} reloaded on {devices}{lots}" + (f", {failed} failed" if failed else "")


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
    clauses = [_counts(report), _reload_clause(report), _seal_clause(report)]
    pushed = (report.archive or {}).get("push") if isinstance(report.archive, dict) else None
    if isinstance(pushed, dict):  # --push: the receipt, or why there is none
        clauses.append(f"NOT pushed to {clean(pushed.get('destination'))}" if pushed.get("error") else
                       f"pushed to {clean(pushed.get('destination')).rstrip('/')}/"
                       f"{clean(pushed.get('key')).rsplit('/', 1)[-1]}"
                       f" (verified: {clean(pushed.get('verified_by'))})")
    return f"{head}: " + "; ".join(clauses)


def cost_per_accepted(budget: dict) -> str:
    """The ratio, or why it is undefined: never a cost of zero (docs/format.md budget summary)."""
    ratio = budget.get("cost_per_accepted_usd")
    if isinstance(ratio, (int, float)) and not isinstance(ratio, bool) and ratio > 0:
        return usd(ratio)
    reason = clean(budget.get("undefined_reason")) or "no accepted run passed every check"
    # summary.py words the reason as a whole sentence; keep only its cause, the incurred cost is added here
    reason = re.sub(r"^cost per accepted run is undefined:\s*", "", reason)
    reason = re.sub(r";[^;]*incurred\s*$", "", reason)
    incurred = budget.get("cost_incurred_usd", budget.get("total_usd"))
    return f"undefined: {reason}, cost incurred {usd(incurred)}"


# ----------------------------------------------------------------------------- sections

def _header(report: Report) -> Text:
    text = Text(f"{report.tool} {report.version}", style="bold")
    text.append(f" · {report.mode} · package {clean(report.package)}")
    if report.campaign_id:
        text.append(" · campaign ")
        text.append(clean(report.campaign_id), style="bold")
    return text


def _configuration(console: Console, report: Report) -> None:
    """Which configuration file the options came from, and any passed over (an audit never applies the sender's)."""
    configuration = report.configuration if isinstance(report.configuration, dict) else None
    if configuration is None:
        return
    applied = configuration.get("applied")
    console.print(f"configuration {clean(applied)}" if applied else "configuration: none (every rule at its own "
                  "level)", soft_wrap=True)
    for passed in configuration.get("not_applied") or []:
        if isinstance(passed, dict):
            console.print(f"  not applied: {clean(passed.get('path'))} ({clean(passed.get('why'))})", soft_wrap=True)
    torch = configuration.get("torch")
    if isinstance(torch, dict) and torch.get("advisory"):  # runtime/torchsafety.py: the reloads' second lock is weak
        console.print(f"warning: {clean(torch['advisory'])}", style="yellow", soft_wrap=True)


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


def _budget(console: Console, budget: dict | None) -> None:
    if not isinstance(budget, dict) or not budget:
        return
    console.print(Text("Budget", style="bold"))
    lots = [lot for lot in budget.get("lots") or [] if isinstance(lot, dict)]
    lot_words = "; ".join(("" if lot.get("id") is None else f"{clean(lot.get('id'))}: ")
                          + f"{clean(lot.get('gpu'))} × {clean(lot.get('gpus'))}, {clean(lot.get('days'))} days, "
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
    for lot in plan.get("lots") or []:
        if isinstance(lot, dict):
            console.print(f"  lot {lot_line(lot)}", soft_wrap=True)
    if isinstance(plan.get("part"), dict):
        console.print(f"  {part_words(plan['part'])}", soft_wrap=True)
    for deviation in plan.get("deviations") or []:
        if isinstance(deviation, dict):
            console.print(f"  deviation {hours(deviation.get('hours'))}: {clean(deviation.get('explanation'))}",
                          soft_wrap=True)
    for decision in plan.get("decisions") or []:
        if isinstance(decision, dict):
            console.print(f"  decision {clean(decision.get('at'))} after {clean(decision.get('after'))}: "
                          f"{clean(decision.get('decision'))} — {clean(decision.get('note'))}", soft_wrap=True)
    _rental(console, plan.get("rental"))


def _rental(console: Console, rental) -> None:
    if not isinstance(rental, dict):
        return
    push = rental.get("push_estimate_seconds")
    console.print(f"  the rental ends at {clean(rental.get('ends_at'))} ({clean(rental.get('source'))}); "
                  f"{clean(round(rental.get('seconds_left', 0) / 3600, 2))} h left; seal of "
                  f"{human_bytes(rental.get('package_bytes'))} estimated {clean(rental.get('seal_estimate_seconds'))} s"
                  + _seal_rate(rental.get("rates")) + (f", push {clean(push)} s" if push is not None else ""),
                  soft_wrap=True)
    if rental.get("warning"):
        console.print(Text(f"  WARNING: {clean(rental['warning'])}", style="bold yellow"), soft_wrap=True)


def _seal_rate(rates) -> str:
    """The rate the seal's estimate used and whether it was measured here (summary.rental_summary)."""
    rate = rates.get("seal_bytes_per_second") if isinstance(rates, dict) else None
    if not isinstance(rate, (int, float)) or isinstance(rate, bool) or rate <= 0:
        return ""
    measured = str(rates.get("seal_rate_source") or "").startswith("measured here")
    return f" at {rate / 2**20:.0f} MiB/s ({'measured here' if measured else 'a prior'})"


def _named_by(report: Report) -> str:
    """Audit: what beside the archive names this SHA-256 (flows/audit.py), or that nothing does."""
    audit = report.audit if isinstance(report.audit, dict) else {}
    if "sha256_named_by" not in audit:
        return ""  # not an audit, or one that could not read the archive
    named = audit["sha256_named_by"]
    if not isinstance(named, dict):
        return " (nothing beside the archive names it: compare it with the SHA-256 the sender published)"
    if named.get("equal") is True:
        return f" (named by {clean(named.get('by'))})"
    return f" (NOT the one named by {clean(named.get('by'))})"


def _archive(console: Console, report: Report) -> None:
    archive = report.archive if isinstance(report.archive, dict) else None
    if archive:
        console.print(Text("Archive", style="bold"))
        console.print(f"  {clean(archive.get('path'))} ({human_bytes(archive.get('bytes'))})", soft_wrap=True)
        console.print(f"  sha256 {clean(archive.get('sha256'))}{_named_by(report)}", soft_wrap=True)
        for unread in (report.audit or {}).get("sidecars_unread") or () if isinstance(report.audit, dict) else ():
            if isinstance(unread, dict):
                console.print(f"  {clean(unread.get('path'))}: {clean(unread.get('why'))}", soft_wrap=True)
        if signer_line(report):
            console.print(f"  {signer_line(report)}", soft_wrap=True)
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
        console.print(f"  {', '.join(clean(c) for c in explained)}: failing now at the reviewer's level, below "
                      "error by the tool's default and in the sender's record (a configuration difference, not a "
                      "change of content)", soft_wrap=True)
    newer = comparison.get("explained_by_version") or []
    if newer:
        console.print(f"  {', '.join(clean(c) for c in newer)}: failing now; rules added after the sender's "
                      f"itera-verify {clean(comparison.get('recorded_version'))} (a newer tool checks more, not a "
                      "change of content)", soft_wrap=True)
    machine = comparison.get("explained_by_this_machine") or []
    if machine:
        console.print(f"  {', '.join(clean(c) for c in machine)}: what this machine could not verify (a base not in "
                      "its hub cache, a library not installed), not a change of content", soft_wrap=True)
    for claim in comparison.get("not_believed") or []:
        if isinstance(claim, dict):
            console.print(f"  {clean(claim.get('code'))}: failing now; the sender's record says "
                          f"{clean(claim.get('sender'))}, not taken as the reason (an error at the tool's own "
                          "level: only the tool's rule levels and the reviewer's configuration explain a failure)",
                          soft_wrap=True)


def render(report: Report, options: dict) -> str:
    color = bool(options.get("color"))
    width = shutil.get_terminal_size((PLAIN_WIDTH, 24)).columns if color else PLAIN_WIDTH
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=color, color_system="standard" if color else None, width=width,
                      highlight=False, emoji=False, markup=False, legacy_windows=False)
    if not options.get("quiet"):
        console.print(_header(report), soft_wrap=True)
        _configuration(console, report)
        console.print()
    _findings(console, report)
    if not options.get("quiet"):
        console.print()
        runs_table(console, report)
        saves_table(console, report)
        reloads_table(console, report, bool(options.get("verbose")))
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
    return plain_lines("\n".join(line.rstrip() for line in buffer.getvalue().splitlines()) + "\n")
