"""The text report's two tables, runs and reloads: one line per row, never wrapped at the report's width.

A reviewer reads them in a terminal or a CI log of 120 columns: the runs table shows first the metrics that the
question and the stop rules name, and what does not fit a cell (a long stop reason, a reload's error) is printed
whole below its table. Written to a file or a pipe (no terminal), a table is never cut: where its columns do
not fit the report's width (long run or artifact ids), it takes the width they need.
"""
from __future__ import annotations

from typing import Iterable

from rich import box
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from . import Report
from .lots import where_words
from .words import (clean, confinement_line, human_bytes, memory_cell, metric_value, plural, run_metrics,
                    run_stop)


def _table(title: str) -> Table:
    return Table(title=title, title_justify="left", title_style="bold", box=box.SIMPLE_HEAD, pad_edge=False,
                 show_edge=False)


MAX_METRIC_COLUMNS = 6
COLUMN_GAP = 3  # what _table's box puts between two columns: padding, divider, padding
MIN_STOP_WIDTH = 16
UNCUT = 100_000  # where no terminal bounds a table, it is measured at this width: its own


def _print(console: Console, table: Table) -> None:
    """A table at its full width where no terminal bounds it (rich would shrink its columns to `…`)."""
    if console.is_terminal:
        console.print(table)
        return
    needed = Measurement.get(console, console.options.update(width=UNCUT), table).maximum
    width = console.width
    console.width = max(width, needed)
    try:
        console.print(table)
    finally:
        console.width = width


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


def runs_table(console: Console, report: Report) -> None:
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
                     min(stop_natural, max(MIN_STOP_WIDTH, len(stop_header))))  # its header is never cut
    table = _table("Runs")
    for header in headers:
        table.add_column(header, no_wrap=True)
    table.add_column(stop_header, no_wrap=True, overflow="ellipsis", max_width=stop_width)
    for name, _ in columns:
        table.add_column(clean(name), no_wrap=True, overflow="ellipsis")
    for run, row, stop in zip(runs, rows, stops):
        metrics = run_metrics(run)
        accepted = Text("yes", style="green") if run.get("accepted") else Text("no")
        table.add_row(*row[:4], accepted, stop, *(metric_value(metrics.get(name)) for name, _ in columns))
    _print(console, table)
    for row, stop in zip(rows, stops):
        if len(stop) > stop_width:
            console.print(Text(f"  {row[0]} stopped by {stop}"), soft_wrap=True)
    shown = {name for name, _ in columns}
    hidden = len({n for run in runs for n in run_metrics(run)} - shown)
    if hidden:
        console.print(Text(f"  {plural(hidden, 'more metric')} not shown (the JSON and HTML reports hold every one)",
                           style="dim"))
    console.print()


def reloads_table(console: Console, report: Report, verbose: bool) -> None:
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
    table = _table("Reloads")
    for column in ("artifact", "loader", "devices", "ok", "seconds", "peak memory (host / GPU)"):
        table.add_column(column, no_wrap=True, overflow="ellipsis")
    details = []
    for reload in report.reloads:
        on_lot = where_words(reload)  # not reloaded here: a lot's signed proof stands for it (report/lots.py)
        ok = Text("ok", style="green") if reload.ok else Text("on its lot", style="yellow") if on_lot else \
            Text("FAILED", style="bold red")
        detail = clean(on_lot or (reload.error if not reload.ok else (reload.forward if verbose else "")))
        if detail:
            details.append(Text(f"  {clean(reload.artifact)}: {detail}",
                                style="" if reload.ok else "yellow" if on_lot else "red"))
        table.add_row(clean(reload.artifact), clean(reload.loader), clean(", ".join(reload.devices) or reload.device),
                      ok, f"{reload.seconds:.1f}", memory_cell(reload))
    _print(console, table)
    confined = confinement_line(report.reloads)
    if confined:
        unconfined = any((r.confinement or "").startswith("none") for r in report.reloads)
        console.print(Text(confined, style="yellow" if unconfined else ""), soft_wrap=True)
    for line in details:
        console.print(line, soft_wrap=True)


def _cell(value, unit: str = "", digits: int = 1) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "-"
    return f"{value:.{digits}f}{unit}" if isinstance(value, float) else f"{value}{unit}"


def saves_table(console: Console, report: Report) -> None:
    """What each run's saves cost (docs/record.md), what the guide asks to weigh: how often, how long each write, how
    long a restore, how much work a crash loses, the share of the run spent saving."""
    runs = [r for r in (report.runs or []) if isinstance(r, dict) and isinstance(r.get("saves"), dict)]
    if not runs:
        return
    table = _table("Saves")
    for column in ("run", "saves", "every (steps / min)", "write s", "size", "restore s (proof / final)",
                   "at risk (steps / min)", "saving share", "early proof"):
        table.add_column(column, no_wrap=True, overflow="ellipsis")
    for run in runs:
        saves = run["saves"]
        proof = "-" if saves.get("proof_ok") is None else ("passed" if saves["proof_ok"] else "FAILED")
        share = saves.get("saving_share")
        table.add_row(clean(run.get("id")), _cell(saves.get("count")),
                      f"{_cell(saves.get('interval_steps'), digits=0)} / {_cell(saves.get('interval_minutes'))}",
                      _cell(saves.get("write_seconds_mean"), digits=2), human_bytes(saves.get("bytes_last")),
                      f"{_cell(saves.get('proof_seconds'))} / {_cell(saves.get('reload_seconds'))}",
                      f"{_cell(saves.get('at_risk_steps'), digits=0)} / {_cell(saves.get('at_risk_minutes'))}",
                      "-" if share is None else f"{100 * share:.1f} %",
                      Text(proof, style="green" if proof == "passed" else "bold red" if proof == "FAILED" else ""))
    _print(console, table)
    console.print()
