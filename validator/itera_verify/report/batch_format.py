"""A batch of audits for people and machines: text and HTML with one summary table (campaign, verdict, signer,
runs accepted, cost per accepted run, codes, seconds), JSON as a list of rows. They read only the BatchReport
(report/batch.py); every value from an archive goes through `clean()` (text) or `esc()` (HTML)."""
from __future__ import annotations

import json
from typing import Any

from .batch import PASS, AuditRow, BatchReport
from .html_format import CSP, CSS, badge, esc
from .json_format import finite
from .words import clean, plain_lines, plural, usd

COLUMNS = ("archive", "campaign", "verdict", "signer", "runs accepted", "cost per accepted run", "codes", "seconds")
MAX_CODES = 6
NUMERIC = ("runs accepted", "cost per accepted run", "seconds")


def summary_row(row: AuditRow) -> dict[str, str]:
    """The table's cells for one archive, in words."""
    report = row.report or {}
    budget = report.get("budget") if isinstance(report.get("budget"), dict) else {}
    findings = report.get("findings") if isinstance(report.get("findings"), list) else []
    strict = report.get("strict") is True
    blocking = sorted({f.get("code") for f in findings if isinstance(f, dict) and isinstance(f.get("code"), str)
                       and (f.get("severity") == "error" or (strict and f.get("severity") == "warning"))})
    codes = ", ".join(blocking[:MAX_CODES]) + (", …" if len(blocking) > MAX_CODES else "")
    accepted = budget.get("accepted")
    ratio = budget.get("cost_per_accepted_usd")
    return {
        "archive": clean(row.key),
        "campaign": clean(report.get("campaign_id") or "-"),
        "verdict": row.verdict.upper() + (" (reused)" if row.reused else ""),
        "signer": _signer(report),
        "runs accepted": str(accepted) if isinstance(accepted, int) and not isinstance(accepted, bool) else "-",
        "cost per accepted run": usd(ratio) if isinstance(ratio, (int, float)) and not isinstance(ratio, bool)
        and ratio > 0 else "-",
        "codes": codes or ("not audited" if row.error else "-"),
        "seconds": f"{row.seconds:.1f}",
    }


def _signer(report: dict) -> str:
    audit = report.get("audit") if isinstance(report.get("audit"), dict) else {}
    found = audit.get("signature") if isinstance(audit.get("signature"), dict) else None
    if not found:
        return "-"
    principals = found.get("principals")
    if isinstance(principals, list) and principals:
        return clean(principals[0])
    if found.get("signer"):
        return clean(found.get("signer"))[:40]
    return "not signed" if not found.get("signed") else "no valid signer"


def _entries(count: int) -> str:
    return f"{count} entry" if count == 1 else f"{count} entries"


def verdict_line(batch: BatchReport) -> str:
    """`FAIL: 12 archives: 10 pass, 2 fail (1 not audited); 3 reused, 9 audited; 4 entries skipped`"""
    counts = batch.counts()
    said = f"{plural(counts['archives'], 'archive')}: {counts['pass']} pass, {counts['fail']} fail"
    if counts["unreadable"]:
        said += f" ({counts['unreadable']} not audited)"
    if batch.results:
        said += f"; {counts['reused']} reused, {counts['audited']} audited"
    if counts["skipped"]:
        said += f"; {_entries(counts['skipped'])} skipped (not *.tar.zst)"
    return f"{batch.verdict.upper()}: {said}"


def heading(batch: BatchReport) -> str:
    shard = (f" (shard {batch.shard[0]}/{batch.shard[1]}: {batch.selected} of {batch.found})"
             if batch.shard else "")
    return (f"{batch.tool} {batch.version} · audit of {plural(batch.found, 'archive')} in {clean(batch.source)}"
            f"{shard} · engine {batch.engine}, {batch.jobs} at a time")


def render_text(batch: BatchReport, options: dict) -> str:
    lines = [heading(batch)]
    if batch.skipped_count:
        lines.append(f"skipped {_entries(batch.skipped_count)}, not *.tar.zst archives: "
                     + ", ".join(clean(name) for name in batch.skipped[:10])
                     + (", …" if batch.skipped_count > 10 else ""))
    lines += [clean(note) for note in batch.notes]
    lines.append("")
    cells = [summary_row(row) for row in batch.rows]
    widths = {column: max([len(column)] + [len(cell[column]) for cell in cells]) for column in COLUMNS}
    lines.append("   ".join(column.ljust(widths[column]) for column in COLUMNS).rstrip())
    lines.append("─" * (sum(widths.values()) + 3 * (len(COLUMNS) - 1)))
    for cell in cells:
        lines.append("   ".join(cell[column].ljust(widths[column]) for column in COLUMNS).rstrip())
    failed = [row for row in batch.rows if row.error]
    if failed:
        lines += ["", "Not audited"]
        lines += [f"  {clean(row.key)}: {clean(row.error)}" for row in failed]
    lines += ["", verdict_line(batch)]
    return plain_lines("\n".join(lines)) + "\n"


def render_json(batch: BatchReport, options: dict) -> str:
    return json.dumps(finite([row.to_json() for row in batch.rows]), indent=2, allow_nan=False, default=str) + "\n"


def render_html(batch: BatchReport, options: dict) -> str:
    rows = []
    for row, cell in ((row, summary_row(row)) for row in batch.rows):
        verdict = badge(cell["verdict"], "ok" if row.verdict == PASS else "error")
        rows.append("<tr>" + "".join(
            f"<td>{verdict}</td>" if column == "verdict" else
            f'<td class="num">{esc(cell[column])}</td>' if column in NUMERIC else
            f"<td><code>{esc(cell[column])}</code></td>" if column in ("archive", "campaign") else
            f"<td>{esc(cell[column])}</td>" for column in COLUMNS) + "</tr>")
    head = "".join(f'<th class="num">{esc(c)}</th>' if c in NUMERIC else f"<th>{esc(c)}</th>" for c in COLUMNS)
    failed = "".join(f"<li><code>{esc(row.key)}</code>: {esc(row.error)}</li>" for row in batch.rows if row.error)
    skipped = (f'<p class="muted">Skipped {esc(_entries(batch.skipped_count))}, not *.tar.zst '
               f"archives: {esc(', '.join(batch.skipped[:10]))}</p>" if batch.skipped_count else "")
    notes = "".join(f'<p class="muted">{esc(note)}</p>' for note in batch.notes)
    kind = "pass" if batch.verdict == PASS else "fail"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{CSP}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>itera-verify: audit of {esc(batch.source)}</title><style>{CSS}</style></head>
<body><main>
<h1>Audit of {esc(plural(batch.found, "archive"))} <span class="muted">· {esc(batch.source)}</span></h1>
<div class="muted">{esc(heading(batch))}</div>
<div class="verdict {kind}"><span class="word">{kind.upper()}</span><span>{esc(verdict_line(batch))}</span></div>
{skipped}{notes}
<h2 id="archives">Archives</h2>
<table><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>
{f'<h2 id="not-audited">Not audited</h2><ul>{failed}</ul>' if failed else ""}
<footer>{esc(batch.tool)} {esc(batch.version)}</footer>
</main></body></html>
"""


def _jsonl(batch: BatchReport, options: dict) -> str:
    from .jsonl_format import render_batch

    return render_batch(batch, options)


def _sarif(batch: BatchReport, options: dict) -> str:
    from .sarif_format import render_batch

    return render_batch(batch, options)


RENDERERS: dict[str, Any] = {"text": render_text, "json": render_json, "html": render_html, "jsonl": _jsonl,
                             "sarif": _sarif}

__all__ = ["RENDERERS", "render_html", "render_json", "render_text", "summary_row", "verdict_line"]
