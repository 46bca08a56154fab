"""One self-contained HTML page for a reviewer: verdict, runs, curves, plan, budget, findings, reloads, archive.

No network and no script: inline CSS and SVG drawn here, and a Content-Security-Policy that forbids anything
else. The package is untrusted input, so every value from it goes through `esc()`.
"""
from __future__ import annotations

import html
import json
import os
from typing import Any

from ..model import Severity
from . import Report
from .lots import lot_line, part_words, where_words
from .words import confinement_line, signer_line
from .html_charts import comparison_chart, plan_bar
from .text_format import (clean, cost_per_accepted, findings_by_file, hours, human_bytes, location, memory_cell,
                          metric_value, plural, rejection_cause, run_metrics, run_stop, severity_of, usd, verdict_line)

CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
MAX_METRIC_COLUMNS = 6

CSS = """
:root{--fg:#1f2328;--muted:#59636e;--line:#d1d9e0;--bg:#f6f8fa;--ok:#1a7f37;--bad:#cf222e;--warn:#9a6700;
--info:#0969da;--accent:#0969da}
*{box-sizing:border-box}
body{margin:0;font:14px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;color:var(--fg);
background:#fff}
main{max-width:1180px;margin:0 auto;padding:24px 28px 48px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:18px;margin:36px 0 12px;padding-bottom:6px;
border-bottom:1px solid var(--line)}h3{font-size:15px;margin:18px 0 8px}
code,.mono{font-family:ui-monospace,SFMono-Regular,Menlo,"DejaVu Sans Mono",monospace;font-size:12.5px}
.muted{color:var(--muted)}.small{font-size:12px}
nav{display:flex;flex-wrap:wrap;gap:14px;margin:10px 0 0;font-size:13px}
nav a{color:var(--accent);text-decoration:none}
.verdict{display:flex;align-items:center;gap:16px;margin:18px 0;padding:14px 18px;border-radius:8px;
border:1px solid var(--line);background:var(--bg)}
.verdict .word{font-size:26px;font-weight:700;letter-spacing:.04em;padding:2px 14px;border-radius:6px;color:#fff}
.verdict.pass .word{background:var(--ok)}.verdict.fail .word{background:var(--bad)}
.cards{display:grid;grid-template-columns:repeat(auto-fit,minmax(160px,1fr));gap:10px}
.card{border:1px solid var(--line);border-radius:8px;padding:10px 12px}
.card .label{font-size:12px;color:var(--muted);text-transform:uppercase;letter-spacing:.04em}
.card .value{font-size:20px;font-weight:600}
.card.bad .value{color:var(--bad)}.card.warn .value{color:var(--warn)}.card.ok .value{color:var(--ok)}
table{border-collapse:collapse;width:100%;margin:6px 0 10px}
th,td{text-align:left;padding:6px 8px;border-bottom:1px solid var(--line);vertical-align:top}
th{background:var(--bg);font-weight:600;font-size:12.5px}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums}
.badge{display:inline-block;padding:0 7px;border-radius:10px;font-size:12px;font-weight:600;white-space:nowrap}
.b-error,.b-failed,.b-stopped{background:#ffebe9;color:var(--bad)}.b-warning{background:#fff8c5;color:var(--warn)}
.b-info{background:#ddf4ff;color:var(--info)}.b-ok,.b-completed,.b-accepted{background:#dafbe1;color:var(--ok)}
.b-other{background:var(--bg);color:var(--muted)}
.notice{padding:10px 14px;border-radius:8px;border:1px solid #d4a72c;background:#fff8c5;margin:8px 0}
.notice.bad{border-color:#ff8182;background:#ffebe9}
.file{border:1px solid var(--line);border-radius:8px;margin:10px 0;overflow:hidden}
.file h3{margin:0;padding:8px 12px;background:var(--bg);border-bottom:1px solid var(--line);font-size:13.5px}
.file table{margin:0;table-layout:fixed}.file td code{word-break:break-all}.file td{border-bottom-color:#eef1f4}
.charts{display:grid;grid-template-columns:repeat(auto-fill,minmax(360px,1fr));gap:12px}
.charts figure.wide{grid-column:1/-1}
figure{margin:0;border:1px solid var(--line);border-radius:8px;padding:8px 10px}
figcaption{font-size:12.5px}figcaption b{font-weight:600}
svg text{font-family:system-ui,"DejaVu Sans",sans-serif}
dl.kv{display:grid;grid-template-columns:max-content 1fr;gap:4px 16px;margin:6px 0}dl.kv dt{color:var(--muted)}
dl.kv dd{margin:0}
.big{font-size:18px;font-weight:600}
details summary{cursor:pointer;color:var(--accent)}
footer{margin-top:40px;color:var(--muted);font-size:12px}
@media print{nav{display:none}.charts{grid-template-columns:1fr 1fr}}
"""


def esc(value: Any) -> str:
    return html.escape(clean(value), quote=True)


def badge(word: Any, kind: str | None = None) -> str:
    kind = kind or str(word)
    css = kind if kind in ("error", "warning", "info", "ok", "failed", "completed", "stopped", "accepted") else "other"
    return f'<span class="badge b-{css}">{esc(word)}</span>'


def _dicts(items: Any) -> list[dict]:
    return [item for item in items if isinstance(item, dict)] if isinstance(items, list) else []


def _card(label: str, value: str, kind: str = "") -> str:
    return f'<div class="card {kind}"><div class="label">{label}</div><div class="value">{value}</div></div>'


# ----------------------------------------------------------------------------- sections

def _summary(report: Report) -> str:
    errors, warnings = report.count(Severity.ERROR), report.count(Severity.WARNING)
    budget = report.budget if isinstance(report.budget, dict) else {}
    ratio = cost_per_accepted(budget) if budget else "-"
    if not report.reloaded:
        reloads, reload_kind = "NOT reloaded", "warn"
    else:
        ok = sum(1 for r in report.reloads if r.ok)
        on_lots = sum(1 for r in report.reloads if r.lot_proof is not None)  # standing on their lot's proof
        reloads = f"{ok} / {len(report.reloads)}" + (f" (+{on_lots} on their lot)" if on_lots else "")
        reload_kind = "ok" if ok == len(report.reloads) else "warn" if ok + on_lots == len(report.reloads) else "bad"
    archive = "sealed" if report.sealed else ("audited" if report.mode == "audit" else "not sealed")
    cards = [
        _card("Errors", str(errors), "bad" if errors else "ok"),
        _card("Warnings", str(warnings), "warn" if warnings else ""),
        _card("Accepted runs", f"{esc(budget.get('accepted', '-'))} of {esc(budget.get('accepted_declared', '-'))}"),
        _card("Cost per accepted run", esc(ratio.split(":")[0]), "warn" if ratio.startswith("undefined") else ""),
        _card("Artifacts reloaded", reloads, reload_kind),
        _card("Archive", archive, "ok" if report.sealed else ""),
    ]
    word = "PASS" if report.verdict == "pass" else "FAIL"
    return (f'<div class="verdict {report.verdict}"><span class="word">{word}</span>'
            f'<span class="big">{esc(verdict_line(report))}</span></div><div class="cards">{"".join(cards)}</div>')


def _runs(report: Report) -> str:
    runs = _dicts(report.runs)
    if not runs:
        return '<p class="muted">No run could be read from the manifest.</p>'
    metric_names: list[str] = []
    for run in runs:
        for name in run_metrics(run):
            if name not in metric_names:
                metric_names.append(name)
    metric_names = metric_names[:MAX_METRIC_COLUMNS]
    head = "".join(f"<th>{h}</th>" for h in ("Run", "Role", "Category", "Status", "Accepted or stopped"))
    head += "".join(f'<th class="num">{esc(name)} <span class="muted small">(last)</span></th>'
                    for name in metric_names) + '<th class="num">Findings</th>'
    rows = []
    for run in runs:
        metrics = run_metrics(run)
        rule, reason = run_stop(run)
        if run.get("accepted"):
            outcome = badge("accepted")
        elif run.get("status") == "stopped" or rule:
            outcome = (f'stop rule <code>{esc(rule or "?")}</code>'
                       f'<div class="small">{esc(reason or "no reason given")}</div>')
        else:
            outcome = '<span class="muted">not accepted</span>'
        cells = [f"<td><b>{esc(run.get('id'))}</b></td>", f"<td>{esc(run.get('role'))}</td>",
                 f"<td>{esc(run.get('category'))}</td>", f"<td>{badge(run.get('status') or '?')}</td>",
                 f"<td>{outcome}</td>"]
        cells += [f'<td class="num">{esc(metric_value(metrics.get(n))) if n in metrics else "-"}</td>'
                  for n in metric_names]
        cells.append(f'<td class="num">{esc(run.get("findings", 0))}</td>')
        rows.append(f"<tr>{''.join(cells)}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def _curves(report: Report) -> str:
    """One chart per metric, the control and every variant overlaid, as the campaign's question compares them;
    the metrics the question and the stop rules name first."""
    curves = report.curves if isinstance(report.curves, dict) else {}
    runs = {str(r.get("id")): r for r in _dicts(report.runs)}
    order = sorted(curves, key=lambda run_id: (runs.get(str(run_id), {}).get("role") != "control", list(curves)
                                               .index(run_id)))
    by_metric: dict[str, list[dict]] = {}
    for run_id in order:
        metrics = curves[run_id]
        if not isinstance(metrics, dict):
            continue
        run = runs.get(str(run_id), {})
        stop = run.get("stop") if isinstance(run.get("stop"), dict) else None
        saves = (run.get("saves") or {}).get("saves") if isinstance(run.get("saves"), dict) else None
        marks = [{"step": s.get("step"), "failed": isinstance(s.get("proof"), dict) and s["proof"].get("ok") is False
                  and bool(s["proof"].get("codes"))} for s in _dicts(saves)]
        for metric, curve in metrics.items():
            by_metric.setdefault(str(metric), []).append(
                {"run": str(run_id), "role": run.get("role"), "curve": curve, "stop": stop, "saves": marks})
    if not by_metric:
        return '<p class="muted">No metric could be read.</p>'
    named = [m for m in (report.named_metrics or []) if m in by_metric]
    metrics = named + [m for m in by_metric if m not in named]
    return "".join(f'<h3>{esc(metric)}</h3><div class="charts">{comparison_chart(metric, by_metric[metric])}</div>'
                   for metric in metrics)


def _saves(report: Report) -> str:
    """Per run, what its saves cost (docs/record.md, Campaign time): what the guide asks to weigh when choosing
    the interval."""
    rows = []
    for run in _dicts(report.runs):
        saves = run.get("saves") if isinstance(run.get("saves"), dict) else None
        if saves is None:
            continue
        share = saves.get("saving_share")
        proof = {True: badge("passed"), False: '<span class="bad">FAILED</span>'}.get(saves.get("proof_ok"), "-")
        cell = lambda key, saves=saves: esc(saves.get(key)) if saves.get(key) is not None else "-"  # noqa: E731
        rows.append((f"<b>{esc(run.get('id'))}</b>", cell("count"),
                     f"{cell('interval_steps')} / {cell('interval_minutes')}", cell("write_seconds_mean"),
                     esc(human_bytes(saves.get("bytes_last"))), f"{cell('proof_seconds')} / {cell('reload_seconds')}",
                     f"{cell('at_risk_steps')} / {cell('at_risk_minutes')}",
                     "-" if share is None else esc(f"{100 * share:.1f} %"), proof))
    if not rows:
        return '<p class="muted">No save was recorded (runs[].checkpoints).</p>'
    return _table(("Run", "Saves", "Every (steps / min)", "Write s", "Size", "Restore s (proof / final)",
                   "Work at risk (steps / min)", "Share saving", "Early proof"), rows)


def _plan(report: Report) -> str:
    plan = report.plan if isinstance(report.plan, dict) else None
    if not plan:
        return '<p class="muted">No plan could be read.</p>'
    budget = report.budget if isinstance(report.budget, dict) else {}
    lots = ", ".join(f"{esc(lot.get('gpu'))} × {esc(lot.get('gpus'))} for {esc(lot.get('days'))} days"
                     for lot in _dicts(budget.get("lots"))) or "-"
    facts = [("Plan window", hours(plan.get("window_hours"))), ("Reserved", hours(plan.get("reserved_hours"))),
             ("Observed", hours(plan.get("observed_hours"))),
             ("Uncommitted margin", hours(plan.get("uncommitted_margin_hours"))), ("Lots", lots),
             ("Plan declared", plan.get("plan_declared_at") or plan.get("declared_at") or "-"),
             ("First run started", plan.get("first_run_started_at") or "-")]
    if plan.get("lots_window_hours") is not None:
        facts.insert(1, ("Lots' window", hours(plan.get("lots_window_hours"))))
    facts += [(f"Lot {lot.get('id')}", lot_line(lot)) for lot in _dicts(plan.get("lots"))]
    if isinstance(plan.get("part"), dict):
        facts.append(("Part", part_words(plan["part"])))
    rental = plan.get("rental") if isinstance(plan.get("rental"), dict) else None
    if rental:
        push = rental.get("push_estimate_seconds")
        facts += [("The rental ends", f"{rental.get('ends_at')} ({rental.get('source')})"),
                  ("Seal estimated", f"{rental.get('seal_estimate_seconds')} s"
                   + (f", push {push} s" if push is not None else "")
                   + (f" — WARNING: {rental['warning']}" if rental.get("warning") else ""))]
    out = [plan_bar(plan), '<dl class="kv">']
    out += [f"<dt>{k}</dt><dd>{v if k == 'Lots' else esc(v)}</dd>" for k, v in facts]
    out.append("</dl>")
    deviations = _dicts(plan.get("deviations"))
    out.append("<h3>Deviations</h3>" + (_table(("Hours", "Explanation"), [
        (esc(hours(d.get("hours"))), esc(d.get("explanation"))) for d in deviations])
        if deviations else '<p class="muted">None recorded.</p>'))
    decisions = _dicts(plan.get("decisions"))
    out.append("<h3>Decisions</h3>" + (_table(("At", "After", "Decision", "Note"), [
        (esc(d.get("at")), esc(d.get("after")), f"<b>{esc(d.get('decision'))}</b>", esc(d.get("note")))
        for d in decisions]) if decisions else '<p class="muted">None recorded.</p>'))
    return "".join(out)


def _table(headers: tuple[str, ...], rows: list[tuple[str, ...]], numeric: tuple[int, ...] = ()) -> str:
    """Cells must already be escaped."""
    head = "".join(f'<th class="num">{h}</th>' if i in numeric else f"<th>{h}</th>" for i, h in enumerate(headers))
    body = "".join("<tr>" + "".join(f'<td class="num">{c}</td>' if i in numeric else f"<td>{c}</td>"
                                    for i, c in enumerate(row)) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _budget(report: Report) -> str:
    budget = report.budget if isinstance(report.budget, dict) else None
    if not budget:
        return '<p class="muted">No budget could be read.</p>'
    ratio = cost_per_accepted(budget)
    lines = [(f"{esc(lot.get('gpu'))} × {esc(lot.get('gpus'))}, {esc(lot.get('days'))} days (rental lot)",
              esc(usd(lot.get("price_usd")))) for lot in _dicts(budget.get("lots"))]
    lines += [(f"{esc(e.get('label'))} (other expense, included)", esc(usd(e.get("usd"))))
              for e in _dicts(budget.get("other_expenses_included"))]
    lines.append(("<b>Total</b>", f"<b>{esc(usd(budget.get('total_usd')))}</b>"))
    out = [_table(("Item", "Cost"), lines, numeric=(1,))]
    excluded = _dicts(budget.get("other_expenses_excluded"))
    if excluded:
        out.append('<p class="small muted">Not included: ' + ", ".join(
            f"{esc(e.get('label'))} {esc(usd(e.get('usd')))}" for e in excluded) + "</p>")
    out.append(f'<dl class="kv"><dt>Rental</dt><dd>{esc(usd(budget.get("rental_usd")))}</dd>'
               f'<dt>Accepted runs (declared)</dt><dd>{esc(budget.get("accepted_declared", "-"))}</dd>'
               f'<dt>Accepted runs that passed every check</dt><dd>{esc(budget.get("accepted", "-"))}</dd>'
               f'<dt>Cost per accepted run</dt><dd class="big">{esc(ratio)}</dd></dl>')
    stopped = [r.get("run") if isinstance(r, dict) else r for r in budget.get("stopped_runs") or []]
    if stopped:
        out.append(f"<p>Stopped runs stay in the cost and never become deliverables: "
                   f"{', '.join(f'<code>{esc(s)}</code>' for s in stopped)}.</p>")
    rejected = _dicts(budget.get("rejected"))
    if rejected:
        out.append("<h3>Rejected</h3>" + _table(("Run", "Cause"), [
            (f"<code>{esc(r.get('run'))}</code>", esc(rejection_cause(r))) for r in rejected]))
    return "".join(out)


def _findings(report: Report) -> str:
    if not report.findings:
        return '<p><span class="badge b-ok">no findings</span> Every enabled rule passed.</p>'
    out = []
    for path, group in findings_by_file(report.findings):
        counts = ", ".join(plural(sum(1 for f in group if severity_of(f) == s), s) for s in ("error", "warning")
                           if any(severity_of(f) == s for f in group))
        rows = []
        for finding in group:
            title = (report.rules.get(finding.code) or {}).get("title", "") if isinstance(report.rules, dict) else ""
            rows.append(f'<tr><td>{badge(severity_of(finding), severity_of(finding))}</td>'
                        f'<td><code title="{esc(title)}">{esc(finding.code)}</code></td>'
                        f'<td><code>{esc(location(finding))}</code></td><td>{esc(finding.message)}</td></tr>')
        out.append(f'<div class="file"><h3><code>{esc(path)}</code> <span class="muted small">{counts}</span></h3>'
                   f'<table><thead><tr><th style="width:90px">Severity</th><th style="width:70px">Code</th>'
                   f'<th style="width:170px">Location</th><th>Message</th></tr></thead>'
                   f'<tbody>{"".join(rows)}</tbody></table></div>')
    return "".join(out)


def _reloads(report: Report) -> str:
    if not report.reloaded:
        why = "--no-reload" if report.mode == "verify" else "audit without --reload"
        return (f'<div class="notice">Artifacts NOT reloaded ({why}): nothing in this report proves that '
                f'they load.</div>')
    if not report.reloads:
        return '<p class="muted">No artifact to reload.</p>'
    rows = []
    for r in report.reloads:
        on_lot = where_words(r)  # not reloaded here: a lot's signed proof stands for it (report/lots.py)
        detail = on_lot or (r.error if not r.ok else r.forward)
        rows.append((f"<b>{esc(r.artifact)}</b><div class='small muted'>{esc(r.kind)} {esc(r.path)}</div>",
                     f"<code>{esc(r.loader)}</code>", esc(", ".join(r.devices) or r.device),
                     badge("ok") if r.ok else badge("on its lot", "warning") if on_lot else badge("failed"),
                     f"{r.seconds:.1f} s", esc(memory_cell(r)), esc(detail or "")))
    table = _table(("Artifact", "Loader", "Devices", "Result", "Time", "Peak memory (host / GPU)", "Detail"), rows,
                   numeric=(4, 5))
    confined = confinement_line(report.reloads)
    return table + (f'<p class="small muted">{esc(confined)}</p>' if confined else "")


def _archive(report: Report) -> str:
    archive = report.archive if isinstance(report.archive, dict) else None
    if archive:
        return (f'<dl class="kv"><dt>Archive</dt><dd><code>{esc(archive.get("path"))}</code></dd>'
                f'<dt>SHA-256</dt><dd><code>{esc(archive.get("sha256"))}</code></dd>'
                f'<dt>Size</dt><dd>{esc(human_bytes(archive.get("bytes")))}</dd>'
                + (f'<dt>Signature</dt><dd>{esc(signer_line(report))}</dd>' if signer_line(report) else "")
                + '</dl>')
    if report.sealed:
        name = f"{report.campaign_id}.tar.zst" if report.campaign_id else "the archive"
        return (f"<p>This report is sealed inside <code>{esc(name)}</code>. A file cannot hold its own archive's "
                f"checksum: it is in <code>{esc(name)}.sha256</code> beside the archive, and every member's "
                f"checksum is in <code>SEAL/SHA256SUMS</code>.</p>")
    return f'<div class="notice">Not sealed: {esc(report.seal_skipped or "no archive was written")}.</div>'


def _audit(report: Report) -> str:
    if not isinstance(report.audit, dict) or not report.audit:
        return ""
    return f'<h2 id="audit">Audit</h2>{_facts(report.audit)}'


def _facts(facts: dict) -> str:
    """Audit facts as a definition list; a nested table (e.g. the comparison with the recorded report) nests."""
    rows = []
    for key, value in facts.items():
        if isinstance(value, dict) and value:
            shown = _facts(value)
        elif isinstance(value, bool):
            shown = "yes" if value else "no"
        elif isinstance(value, list):
            shown = f"<code>{esc(_short_json(value))}</code>" if value else "none"
        else:
            shown = f"<code>{esc(_short_json(value))}</code>"
        rows.append(f"<dt>{esc(str(key).replace('_', ' '))}</dt><dd>{shown}</dd>")
    return f'<dl class="kv">{"".join(rows)}</dl>'


def _short_json(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str, ensure_ascii=False)
    return text if len(text) <= 400 else text[:400] + f"… ({len(text)} characters)"


def _rules(report: Report) -> str:
    rules = report.rules if isinstance(report.rules, dict) else {}
    if not rules:
        return ""
    rows = [(f"<code>{esc(code)}</code>", badge(info.get("severity", "")), esc(info.get("title", "")))
            for code, info in rules.items() if isinstance(info, dict)]
    return (f"<details><summary>{plural(len(rows), 'rule')} checked</summary>"
            f"{_table(('Code', 'Level', 'Rule'), rows)}</details>")


def render(report: Report, options: dict) -> str:
    title = f"itera-verify: {report.campaign_id or os.path.basename(str(report.package).rstrip('/'))}"
    sections = [("runs", "Runs", _runs(report)), ("curves", "Metric curves", _curves(report)),
                ("saves", "Saves and resume proofs", _saves(report)),
                ("plan", "Plan against actual", _plan(report)), ("budget", "Budget", _budget(report)),
                ("findings", f"Findings ({len(report.findings)})", _findings(report)),
                ("reloads", "Reloads", _reloads(report)), ("archive", "Archive", _archive(report))]
    nav = "".join(f'<a href="#{anchor}">{heading}</a>' for anchor, heading, _ in sections)
    body = "".join(f'<h2 id="{anchor}">{heading}</h2>{content}' for anchor, heading, content in sections)
    elapsed = f" in {report.elapsed_seconds:.1f} s" if report.elapsed_seconds is not None else ""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{CSP}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{esc(title)}</title><style>{CSS}</style></head>
<body><main>
<h1>{esc(report.campaign_id or "Campaign")} <span class="muted">· {esc(report.mode)} report</span></h1>
<div class="muted">Package <code>{esc(report.package)}</code></div>
<nav>{nav}</nav>
{_summary(report)}
{body}
{_audit(report)}
{_rules(report)}
<footer>{esc(report.tool)} {esc(report.version)} · {esc(report.mode)}{esc(elapsed)} · strict: {
    "yes" if report.strict else "no"}</footer>
</main></body></html>
"""
