"""Plain-text rule listing and explanation for `itera-verify rules`."""
from __future__ import annotations

import textwrap

from ..model import Rule


def list_rules(rules: dict[str, Rule]) -> str:
    """Each family once, in the order of its first code, its codes in order: a family whose codes are not
    contiguous (artifacts: IV501–IV503 and IV510–IV511) is not split around another's."""
    by_family: dict[str, list[Rule]] = {}
    for code in sorted(rules):
        by_family.setdefault(rules[code].family, []).append(rules[code])
    blocks = [f"[{family}]\n" + "\n".join(f"{r.code}  {r.severity.value:<7}  {r.title}" for r in members)
              for family, members in by_family.items()]
    return "\n\n".join(blocks) + "\n"


def explain_rule(rule: Rule) -> str:
    parts = [f"{rule.code} ({rule.severity.value}, {rule.family}): {rule.title}", "",
             textwrap.fill(" ".join(rule.explain.split()), 100)]
    if rule.bad:
        parts += ["", "Fails:", textwrap.indent(rule.bad, "    ")]
    if rule.good:
        parts += ["", "Passes:", textwrap.indent(rule.good, "    ")]
    return "\n".join(parts) + "\n"
