"""One report object; every output format is a renderer that reads only this object."""
from __future__ import annotations

import importlib
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

from ..version import __version__
from ..model import Finding, ReloadResult, Severity


FINDINGS_PER_CODE = 1000  # a report keeps the first 1,000 findings of each code: no input can make it huge
_RANK = {Severity.INFO: 0, Severity.WARNING: 1, Severity.ERROR: 2, None: 2}  # None: an error (Finding.to_json)


@dataclass
class OmittedFindings(Finding):
    """Stands for the findings of one code past FINDINGS_PER_CODE, said once; at the highest level among them, so
    leaving them out never changes the verdict."""


@dataclass
class Report:
    package: str
    mode: str = "verify"  # "verify" | "audit"
    findings: list[Finding] = field(default_factory=list)
    reloads: list[ReloadResult] = field(default_factory=list)
    reloaded: bool = True  # False when reloads were skipped (--no-reload): never read as "verified"
    budget: dict[str, Any] | None = None
    plan: dict[str, Any] | None = None
    runs: list[dict[str, Any]] = field(default_factory=list)  # per-run summary for people (role, status, metrics)
    curves: dict[str, Any] = field(default_factory=dict)  # run -> metric -> [[step, value], ...] (downsampled)
    named_metrics: list[str] = field(default_factory=list)  # the question's and the stop rules' metrics, shown first
    archive: dict[str, Any] | None = None
    audit: dict[str, Any] | None = None  # audit-only facts (members, comparison with the recorded report)
    strict: bool = False
    sealed: bool = False
    seal_skipped: str | None = None  # why nothing was sealed, in words
    seal_refused: bool = False  # a seal was due and refused (IV704...): a failing verdict whatever the levels
    device: str | None = None
    campaign_id: str | None = None
    elapsed_seconds: float | None = None
    rules: dict[str, dict[str, str]] = field(default_factory=dict)  # code -> {severity, title} of rules that ran
    configuration: dict[str, Any] | None = None  # {"applied": the file or None, "not_applied": [{path, why}]}
    findings_omitted: dict[str, int] = field(default_factory=dict)  # code -> findings past FINDINGS_PER_CODE
    tool: str = "itera-verify"
    version: str = __version__

    def blocking(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == Severity.ERROR
                or (self.strict and f.severity == Severity.WARNING)]

    @property
    def verdict(self) -> str:
        return "fail" if self.blocking() or self.seal_refused else "pass"

    def cap_findings(self, per_code: int = FINDINGS_PER_CODE) -> None:
        """Keep the first `per_code` findings of each code; the rest are counted in `findings_omitted` and said by
        one OmittedFindings of that code. Call it again after adding findings: what it left out stays counted."""
        notes = {f.code: f for f in self.findings if isinstance(f, OmittedFindings)}
        kept: list[Finding] = []
        seen: Counter[str] = Counter()
        for finding in self.findings:
            if isinstance(finding, OmittedFindings):
                continue
            seen[finding.code] += 1
            if seen[finding.code] <= per_code:
                kept.append(finding)
                continue
            self.findings_omitted[finding.code] = self.findings_omitted.get(finding.code, 0) + 1
            note = notes.setdefault(finding.code, OmittedFindings(finding.code, severity=finding.severity))
            if _RANK[finding.severity] > _RANK[note.severity]:
                note.severity = finding.severity
        for code, note in notes.items():
            note.message = (f"and {self.findings_omitted[code]:,} more {code} findings, not listed (a report keeps "
                            f"the first {per_code:,} of each code)")
        self.findings = kept + list(notes.values())

    def count(self, severity: Severity) -> int:
        return sum(1 for f in self.findings if f.severity == severity)

    def to_json(self) -> dict[str, Any]:
        """The stable JSON shape of docs/integration.md (schemas/report.schema.json)."""
        return {
            "tool": self.tool, "version": self.version, "mode": self.mode, "package": self.package,
            "campaign_id": self.campaign_id, "verdict": self.verdict, "strict": self.strict,
            "summary": {s.value: self.count(s) for s in Severity},
            "findings": [f.to_json() for f in self.findings],
            "reloaded": self.reloaded, "device": self.device,
            "reloads": [r.to_json() for r in self.reloads],
            "budget": self.budget, "plan": self.plan, "runs": self.runs,
            "archive": self.archive, "sealed": self.sealed, "seal_skipped": self.seal_skipped,
            "audit": self.audit, "rules": self.rules, "configuration": self.configuration,
            "elapsed_seconds": None if self.elapsed_seconds is None else round(self.elapsed_seconds, 3),
            **({"findings_omitted": dict(self.findings_omitted)} if self.findings_omitted else {}),
        }


Renderer = Callable[[Report, dict], str]
FORMATS = ("text", "json", "jsonl", "junit", "github", "html", "sarif")
# A batch of audits (report/batch.py BatchReport): its formats, each `render_batch(batch, options)` of
# `report/batch_format.py`, or of the format's own module where it has one (sarif).
BATCH_FORMATS = ("text", "json", "jsonl", "html", "sarif")


def renderer(name: str) -> Renderer:
    """The renderer of a format: module `report/<name>_format.py`, function `render(report, options)`."""
    if name not in FORMATS:
        raise KeyError(name)
    module = importlib.import_module(f"{__name__}.{name}_format")
    return module.render


def batch_renderer(name: str) -> Callable[[Any, dict], str]:
    """The renderer of a format for a batch of audits."""
    if name not in BATCH_FORMATS:
        raise KeyError(name)
    module = importlib.import_module(f"{__name__}.{name}_format")
    if hasattr(module, "render_batch"):
        return module.render_batch
    from .batch_format import RENDERERS

    return RENDERERS[name]
