"""Plain-text rule listing and explanation for `itera-verify rules`."""
from __future__ import annotations

import textwrap

from ..model import Rule


def list_rules(rules: dict[str, Rule]) -> str:
    lines = []
    family = None
    for code, rule in rules.items():
        if rule.family != family:
            family = rule.family
            lines.append(f"\n[{family}]" if lines else f"[{family}]")
        lines.append(f"{code}  {rule.severity.value:<7}  {rule.title}")
    return "\n".join(lines) + "\n"


def explain_rule(rule: Rule) -> str:
    parts = [f"{rule.code} ({rule.severity.value}, {rule.family}): {rule.title}", "",
             textwrap.fill(" ".join(rule.explain.split()), 100)]
    if rule.bad:
        parts += ["", "Fails:", textwrap.indent(rule.bad, "    ")]
    if rule.good:
        parts += ["", "Passes:", textwrap.indent(rule.good, "    ")]
    return "\n".join(parts) + "\n"


def markdown_table(rules: dict[str, Rule]) -> str:
    """The README's rule table, generated from the registry so the two never drift."""
    lines = ["| code | severity | finding |", "|---|---|---|"]
    for code, rule in rules.items():
        lines.append(f"| {code} | {rule.severity.value} | {rule.title} |")
    return "\n".join(lines) + "\n"
