"""Words every renderer shares: a value from the package made printable, numbers, money, hours, a finding's place.

Everything from a package or an archive is untrusted: `clean()` makes each value one printable line (the
text, HTML and JUnit formats and the progress lines use it; GitHub's format adds its percent-encoding on top,
github_format.py), and `plain_lines()` is the last step of every text the tool prints line by line.
"""
from __future__ import annotations

import math
import re
from typing import Any, Iterable

from ..model import Finding, Severity

_NAMED_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escaped(char: str) -> str:
    code = ord(char)
    named = _NAMED_ESCAPES.get(char)
    if named:
        return named
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def clean(value: Any, keep: str = "") -> str:
    """A value from the package as one printable line: every character that is not printable (newline, CR,
    ESC, the C1 controls, U+2028) becomes a visible escape (`\\n`, `\\x1b`, `\\u2028`), so a value never starts
    a line of its own nor reaches a terminal as a control sequence. `keep`: characters the caller's format
    escapes its own way (GitHub percent-encodes CR and LF)."""
    text = "" if value is None else str(value)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c in keep else _escaped(c) for c in text)


# A GitHub runner reads a workflow command (`::add-mask::…`, `::stop-commands::…`) on any line of standard
# output or error, after leading blanks, and the older `##[command]` anywhere in a line.
_COMMAND_AT_LINE_START = re.compile(r"^([ \t]*):(?=:)", re.M)


def plain_lines(text: str) -> str:
    """Text printed line by line (the text report, progress lines), with no line a CI runner reads as a
    command: the tool's own words never begin with `::` or hold `##[`, so only a value from the package does,
    and its first character is shown escaped (`\\x3a:add-mask::…`, `#\\x23[…`)."""
    return _COMMAND_AT_LINE_START.sub(r"\1\\x3a", text).replace("##[", "#\\x23[")


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


def memory_cell(reload) -> str:
    """Host peak beside device peak (a GPU reload); the one peak known otherwise."""
    host = reload.host_peak_memory_bytes
    if reload.device_peak_memory_bytes is not None:
        return f"{human_bytes(host)} / {human_bytes(reload.device_peak_memory_bytes)}"
    return human_bytes(host if host is not None else reload.peak_memory_bytes)


def confinement_line(reloads) -> str | None:
    """What confined the reload children (reload/confine.py), once when every child says the same:
    `confinement: landlock ABI 7: fs, net`; else grouped, `confinement: none (why) for a, b; landlock ... for c`.
    None when no child ran."""
    groups: dict[str, list[str]] = {}
    for reload in reloads:
        if reload.confinement is not None:
            groups.setdefault(clean(reload.confinement), []).append(clean(reload.artifact))
    if not groups:
        return None
    if len(groups) == 1:
        return f"confinement: {next(iter(groups))}"
    return "confinement: " + "; ".join(f"{held} for {', '.join(names)}" for held, names in groups.items())


def signer_line(report) -> str | None:
    """Who signed the seal, in one line every format shows: the sealer's key (verify), or what the audit found
    (`audit.signature`, flows/signatures.py); None when the report has nothing to say about signatures."""
    archive = report.archive if isinstance(report.archive, dict) else {}
    sealed = archive.get("signature") if isinstance(archive.get("signature"), dict) else None
    found = (report.audit or {}).get("signature") if isinstance(report.audit, dict) else None
    oms = archive.get("model_signing") if isinstance(archive.get("model_signing"), dict) else None
    if report.mode != "audit" and (sealed or oms):
        said = [f"signed by {clean(sealed.get('algorithm'))} key {clean(sealed.get('fingerprint'))} "
                f"({clean(sealed.get('source'))}); signature {clean(sealed.get('path'))}"] if sealed else []
        if oms:
            said.append(f"model-signing signature {clean(oms.get('path'))} by EC key {clean(oms.get('key'))} "
                        f"({clean(oms.get('source'))})")
        return "; ".join(said)
    if not isinstance(found, dict):
        return None
    oms_line = _model_signing_words(found.get("model_signing"))
    statement = found.get("statement") if isinstance(found.get("statement"), dict) else {}
    beside = found.get("archive_signature") if isinstance(found.get("archive_signature"), dict) else {}
    if not found.get("signed") and beside.get("state", "absent") == "absent":
        return ("not signed" if not oms_line else "no SSH signature") + (
            f" (required by {clean(found.get('allowed_signers'))})" if found.get("allowed_signers") else "") + oms_line
    who = (f"signed by {clean(found.get('algorithm'))} key {clean(found.get('signer'))}" if found.get("signer")
           else "signature present but no valid signer")
    line = f"{who}: statement {clean(statement.get('state', 'absent'))}, archive signature " \
           f"{clean(beside.get('state', 'absent'))}"
    principals = found.get("principals")
    if isinstance(principals, list):
        line += (f"; allowed as {', '.join(clean(p) for p in principals)} ({clean(found.get('allowed_signers'))})"
                 if principals else f"; not allowed by {clean(found.get('allowed_signers'))}")
    else:
        line += "; no allowed signers given (compare the fingerprint with the sender's key)"
    return line + oms_line


def _model_signing_words(oms) -> str:
    """The audit's words on SEAL/model.sig (seal/oms.py `check`), to follow the SSH signer's; "" when absent and
    not required."""
    if not isinstance(oms, dict) or (oms.get("state") == "absent" and not oms.get("required")):
        return ""
    state = clean(oms.get("state"))
    key = f" by EC key {clean(oms.get('key'))}" if oms.get("key") else ""
    why = f" ({clean(oms.get('problem'))})" if oms.get("problem") else ""
    return f"; model-signing signature {state}{key}{why}"


def saves_line(run: dict) -> str | None:
    """A run's saves in one sentence (report `runs[].saves`, summary.saves_summary), for the formats that have no
    table (JUnit, GitHub): what the guide asks to weigh when choosing the interval. None for a run without saves."""
    saves = run.get("saves") if isinstance(run, dict) else None
    if not isinstance(saves, dict) or not isinstance(saves.get("count"), int):
        return None

    def pair(steps: str, minutes: str) -> str:
        said = [f"{number(saves.get(steps), 0)} steps" if number(saves.get(steps), 0) else None,
                f"{number(saves.get(minutes))} min" if number(saves.get(minutes)) else None]
        return " / ".join(s for s in said if s) or "?"

    parts = [plural(saves["count"], "save")]
    if saves["count"] > 1:
        parts.append(f"every {pair('interval_steps', 'interval_minutes')}")
    if number(saves.get("write_seconds_mean")) is not None:
        parts.append(f"{number(saves['write_seconds_mean'])} s to write each ({human_bytes(saves.get('bytes_last'))})")
    share = saves.get("saving_share")
    if number(share, 4) is not None:
        parts.append(f"{100 * share:.1f} % of the run spent saving")
    parts.append(f"at risk {pair('at_risk_steps', 'at_risk_minutes')}")
    proof = {True: "passed", False: "FAILED"}.get(saves.get("proof_ok"), "not proven")
    seconds = number(saves.get("proof_seconds"))
    parts.append(f"early resume proof {proof}" + (f" ({seconds} s)" if seconds is not None else ""))
    if number(saves.get("reload_seconds")) is not None:
        parts.append(f"final reload {number(saves['reload_seconds'])} s")
    return f"{clean(run.get('id'))}: " + ", ".join(parts)
