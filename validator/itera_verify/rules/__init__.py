"""The rule registry: every module in this package declares `RULES` and a `check(ctx)` generator.

The registry finds the families and their codes; it schedules nothing (flows/checks.py runs them). A rule
receives the run context (package.RunContext): `ctx.inventory` (what discovery found, immutable),
`ctx.documents` (the one reader of the package's bytes), `ctx.options` (the run's settled options) and, in the
reload phase, `ctx.reloads`.
Adding a family is adding a module; nothing else lists codes. A module with `PHASE = "reload"` runs after the
reloads, over the facts they reported (`ctx.reloads`). A family whose codes are proved partly without loading
and partly by the reloads declares both, `PHASE = ("static", "reload")`, and is called `check(ctx, phase=...)`
in each phase (rules/reload.py: a missing optimizer.pt is seen statically, a misfitting one only by the reload).
"""
from __future__ import annotations

import importlib
import pkgutil
from dataclasses import replace
from functools import lru_cache
from types import ModuleType
from typing import Iterable

from ..model import Rule, Severity
from ..options import Selection


@lru_cache(maxsize=1)
def families() -> tuple[ModuleType, ...]:
    modules = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        if hasattr(module, "RULES") and hasattr(module, "check"):
            modules.append(module)
    return tuple(modules)


@lru_cache(maxsize=1)
def all_rules() -> dict[str, Rule]:
    rules: dict[str, Rule] = {}
    for module in families():
        family = module.__name__.rsplit(".", 1)[-1]
        for rule in module.RULES:
            if rule.code in rules:
                raise RuntimeError(f"rule {rule.code} declared twice")
            rules[rule.code] = replace(rule, family=family)
    return dict(sorted(rules.items()))


def phases_of(module: ModuleType) -> tuple[str, ...]:
    phase = getattr(module, "PHASE", "static")
    return (phase,) if isinstance(phase, str) else tuple(phase)


def severity_of(selection: Selection, code: str) -> Severity:
    """The level `code` runs at: the selection's, else the rule's own (an unknown code is an error)."""
    rule = all_rules().get(code)
    return selection.level(code, rule.severity if rule else Severity.ERROR)


def unknown_codes(patterns: Iterable[str]) -> list[str]:
    """Patterns that match no rule code: a typo in --select or a config file is an error, not a silent no-op."""
    codes = all_rules()
    return [p for p in patterns if not any(c.startswith(p) for c in codes)]


__all__ = ["Selection", "all_rules", "families", "phases_of", "severity_of", "unknown_codes"]
