"""GitHub Actions workflow commands: one `::error file=…,line=…,col=…,title=IV303::message` per finding.

Escaping follows the runner's rules (actions/toolkit `command.ts`): in the message `%`, CR and LF are
percent-encoded; in property values `:` and `,` as well, since they delimit the properties.
"""
from __future__ import annotations

import os
import posixpath

from ..model import Finding
from . import Report
from .words import saves_line, signer_line
from .text_format import clean, severity_of, verdict_line

COMMAND = {"error": "error", "warning": "warning", "info": "notice"}


def escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def repository_path(package: str, path: str, workspace: str | None = None) -> str:
    """The finding's file relative to the workspace (GITHUB_WORKSPACE, handed over by the command line in the
    options, else the current folder), so the annotation lands on the file in the pull request."""
    joined = os.path.normpath(os.path.join(package, path))
    workspace = workspace or os.getcwd()
    if os.path.isabs(joined):
        relative = os.path.relpath(joined, workspace)
        joined = joined if relative.startswith("..") else relative
    return joined.replace(os.sep, posixpath.sep)


def annotation(report: Report, finding: Finding, workspace: str | None = None) -> str:
    properties = []
    if finding.path:
        properties.append(f"file={escape_property(clean(repository_path(report.package, finding.path, workspace)))}")
        if finding.line is not None:
            properties.append(f"line={finding.line}")
            if finding.column is not None:
                properties.append(f"col={finding.column}")
    properties.append(f"title={escape_property(finding.code)}")
    message = clean(finding.message, keep="\r\n\t")  # CR and LF are percent-encoded below, not dropped
    if finding.pointer and finding.line is None:
        message += f" (at {clean(finding.pointer)})"
    if not finding.path:
        message = f"{message} [{clean(report.package)}]"
    return f"::{COMMAND.get(severity_of(finding), 'error')} {','.join(properties)}::{escape_data(message)}"


def render(report: Report, options: dict) -> str:
    lines = [annotation(report, finding, options.get("workspace")) for finding in report.findings]
    for run in report.runs or []:  # each run's saves (docs/record.md): a notice the workflow's summary lists
        line = saves_line(run) if isinstance(run, dict) else None
        if line:
            title = escape_property(f"itera-verify saves of {clean(run.get('id'))}")
            lines.append(f"::notice title={title}::{escape_data(line)}")
    if signer_line(report):
        lines.append(f"::notice title=itera-verify signature::{escape_data(signer_line(report))}")
    summary = "error" if report.verdict == "fail" else "notice"
    lines.append(f"::{summary} title=itera-verify::{escape_data(verdict_line(report))}")
    return "\n".join(lines) + "\n"
