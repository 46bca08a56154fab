"""`--format sarif`: SARIF 2.1.0 for GitHub code scanning (`github/codeql-action/upload-sarif`).

One run. The tool's driver lists one `reportingDescriptor` per rule the reports name, from the rule registry: its
title (short description), explanation (full description) and the explanation with its bad and good examples
(help). A result's `level` is its finding's severity (info is `note`). Each result is located at its file's path
in the package (a batch: under the campaign's folder, `<campaign_id>/<path>`, as the archive extracts), its
`region.startLine` the finding's line (a JSON pointer's line: flows/verify.py resolves it) or 1. A finding of
no file is located at the archive (an audit) or the manifest. `partialFingerprints` hash what names the problem
(campaign, code, file, pointer or line, run, artifact), never the message's numbers, and count repeats: the same
package gives the same fingerprints on every run.

GitHub's limits on an upload (docs.github.com, "SARIF results exceed limit"): at most 25,000 results per run,
of which it shows 5,000, and 10 MB of gzip. The most severe MAX_RESULTS are kept, and a notification in the run's
invocation says how many were left out; messages are cut at MAX_MESSAGE characters.
"""
from __future__ import annotations

import gzip
import hashlib
import json
from typing import Any, Iterable
from urllib.parse import quote

from ..version import __version__
from . import Report
from .json_format import finite

SCHEMA = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"
LEVELS = {"error": "error", "warning": "warning", "info": "note"}
RANK = {"error": 0, "warning": 1, "info": 2}
MAX_RESULTS = 5_000  # what GitHub shows of a run (it refuses a run of more than 25,000)
MAX_GZIP_BYTES = 10 * 1000 * 1000  # GitHub refuses an upload larger than this, compressed
MAX_MESSAGE = 1_000
FINGERPRINT = "itera-verify/v1"


def render(report: Report, options: dict) -> str:
    return dumps(sarif_log([Scope(report.to_json())], mode=report.mode))


def render_batch(batch, options: dict) -> str:
    scopes = [Scope(row.report, archive=row.archive, nested=True, error=row.error) for row in batch.rows]
    return dumps(sarif_log(scopes, mode="audit"))


class Scope:
    """One report's findings and where their paths start: the package (one report) or its campaign folder (a
    batch). `error`: why a batch's archive has no report."""

    def __init__(self, report: dict | None, *, archive: str | None = None, nested: bool = False,
                 error: str | None = None):
        self.report = report if isinstance(report, dict) else {}
        self.error = error
        self.archive = archive or _text((self.report.get("archive") or {}).get("path")) or None
        self.mode = _text(self.report.get("mode")) or "audit"
        campaign = _text(self.report.get("campaign_id"))
        self.name = campaign or _basename(self.archive or _text(self.report.get("package")))
        self.prefix = f"{campaign}/" if nested and campaign else ""

    def findings(self) -> list[dict]:
        found = self.report.get("findings")
        return [f for f in found if isinstance(f, dict) and isinstance(f.get("code"), str)] \
            if isinstance(found, list) else []

    def uri(self, path: Any) -> str:
        if isinstance(path, str) and path:
            return quote(self.prefix + path.lstrip("/"), safe="/")
        if self.archive and self.mode == "audit":
            return quote(_basename(self.archive), safe="/")
        return quote(self.prefix + "manifest.json", safe="/")


def sarif_log(scopes: list[Scope], *, mode: str) -> dict:
    from ..rules import all_rules

    registry = all_rules()
    codes = sorted({code for scope in scopes for code in _codes(scope) if code in registry})
    index = {code: position for position, code in enumerate(codes)}
    results, notifications = [], []
    for scope in scopes:
        if scope.error:
            notifications.append(_notification("error", f"{scope.archive}: not audited: {scope.error}"))
        results += list(_results(scope, index))
    results.sort(key=lambda result: RANK.get(result["properties"]["severity"], 3))  # stable: order kept
    kept = MAX_RESULTS
    while True:
        run = _run(registry, codes, results[:kept], notifications, len(results) - min(kept, len(results)), mode)
        log = {"$schema": SCHEMA, "version": "2.1.0", "runs": [run]}
        if kept == 0 or len(gzip.compress(dumps(log).encode("utf-8"))) <= MAX_GZIP_BYTES:
            return log
        kept = min(kept, len(results)) // 2


def _codes(scope: Scope) -> Iterable[str]:
    rules = scope.report.get("rules")
    yield from (rules if isinstance(rules, dict) else {})
    yield from (f["code"] for f in scope.findings())


def _run(registry, codes: list[str], results: list[dict], notifications: list[dict], left_out: int,
         mode: str) -> dict:
    notes = list(notifications)
    if left_out:
        notes.append(_notification("warning", f"{left_out} results left out: GitHub code scanning shows at most "
                                              f"{MAX_RESULTS:,} per run; the most severe are kept"))
    invocation: dict[str, Any] = {"executionSuccessful": not any(n["level"] == "error" for n in notifications)}
    if notes:
        invocation["toolExecutionNotifications"] = notes
    return {
        "tool": {"driver": {"name": "itera-verify", "version": __version__, "semanticVersion": __version__,
                            "rules": [_descriptor(registry[code]) for code in codes]}},
        "automationDetails": {"id": f"itera-verify/{mode}/"},
        "invocations": [invocation],
        "results": results,
    }


def _descriptor(rule) -> dict:
    examples = "".join(f"\n\n{label}: {text}" for label, text in (("Bad", rule.bad), ("Good", rule.good)) if text)
    markdown = rule.explain + "".join(f"\n\n**{label}:**\n\n```\n{text}\n```" for label, text in
                                      (("Bad", rule.bad), ("Good", rule.good)) if text)
    tags = ["itera-verify"] + ([rule.family] if rule.family else [])
    return {"id": rule.code, "name": rule.code,
            "shortDescription": {"text": rule.title}, "fullDescription": {"text": rule.explain or rule.title},
            "help": {"text": (rule.explain or rule.title) + examples, "markdown": markdown or rule.title},
            "defaultConfiguration": {"level": LEVELS.get(rule.severity.value, "error")},
            "properties": {"tags": tags}}


def _results(scope: Scope, index: dict[str, int]) -> Iterable[dict]:
    seen: dict[str, int] = {}
    for finding in scope.findings():
        code = finding["code"]
        if code not in index:
            continue
        severity = finding.get("severity") if finding.get("severity") in LEVELS else "error"
        uri = scope.uri(finding.get("path"))
        line, column = _positive(finding.get("line")) or 1, _positive(finding.get("column"))
        region = {"startLine": line, **({"startColumn": column} if column else {})}
        pointer = _text(finding.get("pointer"))
        message = _text(finding.get("message")) or code
        if pointer and finding.get("line") is None:
            message += f" (at {pointer})"
        identity = "\0".join([scope.name, code, uri, pointer if pointer else f"line {line}",
                              _text(finding.get("run")), _text(finding.get("artifact"))])
        digest = hashlib.sha256(identity.encode("utf-8", "replace")).hexdigest()
        seen[digest] = seen.get(digest, 0) + 1
        properties = {"severity": severity, "campaign": scope.name}
        for key in ("pointer", "run", "artifact"):
            if _text(finding.get(key)):
                properties[key] = _text(finding.get(key))
        if scope.archive:
            properties["archive"] = scope.archive
        yield {"ruleId": code, "ruleIndex": index[code], "level": LEVELS[severity],
               "message": {"text": message[:MAX_MESSAGE]},
               "locations": [{"physicalLocation": {"artifactLocation": {"uri": uri}, "region": region}}],
               "partialFingerprints": {FINGERPRINT: f"{digest}:{seen[digest]}",
                                       "primaryLocationLineHash": f"{digest[:16]}:{seen[digest]}"},
               "properties": properties}


def _notification(level: str, text: str) -> dict:
    return {"level": level, "message": {"text": text[:MAX_MESSAGE]}}


def _positive(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else None


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _basename(value: str) -> str:
    return value.rstrip("/").rsplit("/", 1)[-1] if value else ""


def dumps(log: dict) -> str:
    return json.dumps(finite(log), indent=1, allow_nan=False, default=str) + "\n"


__all__ = ["MAX_RESULTS", "render", "render_batch", "sarif_log"]
