"""Running the rule families (rules/__init__.py finds them): in this process, or split over forked processes
beside a seal. The scheduler is here, the registry there: rules know their codes, not how they are run."""
from __future__ import annotations

from functools import partial
from types import ModuleType

from ..model import Finding
from ..options import Selection
from ..package import RunContext
from ..rules import families, phases_of, severity_of
from ..runtime.launcher import ChildLost, Forked, can_fork


def run_checks(ctx: RunContext, selection: Selection, phase: str = "static", *, processes: int = 1) -> list[Finding]:
    """Every enabled finding of every family of this phase, with its severity set; all of them, not the first.

    processes > 1 runs the families in that many processes (forked: rules are pure functions over the context,
    so a child needs nothing but its share), balanced by each family's COST; the findings and their order are
    the same as in one process. Digests a child computed come back to `ctx.documents.digests` (the seal compares
    them); a share that cannot be forked, or whose child dies without a result, runs here."""
    checks = StartedChecks(ctx, selection, phase, processes=processes)
    try:
        return checks.result()
    finally:
        checks.cancel()


class StartedChecks:
    """run_checks in two steps: the constructor forks the children, result() runs this process's share and
    collects theirs. `detached`: every share runs in a child, none here: the caller's threads (a seal) then
    have this process, and its interpreter lock, to themselves while the checks run. Fork the children before
    starting such threads: a child must not inherit a lock another thread held."""

    def __init__(self, ctx: RunContext, selection: Selection, phase: str = "static", *, processes: int = 1,
                 detached: bool = False):
        self.ctx, self.selection = ctx, selection
        # A family with no enabled code is not run at all (--select IV201 runs the path rules alone).
        self.modules = [m for m in families() if phase in phases_of(m)
                        and any(selection.enabled(rule.code) for rule in m.RULES)]
        self.phase = phase
        forking = can_fork() and (processes > 1 or detached)
        shares = _balanced(self.modules, processes) if forking else [[(m, None) for m in self.modules]]
        self.parts = {module.__name__: part[1] for share in shares for module, part in share if part is not None}
        here, children = ([], shares) if forking and detached else (list(shares[0]), shares[1:])
        self.here, self.children = here, [share for share in children if share]
        self._forked: list[tuple[Forked, list[Unit]]] = []
        try:
            for share in self.children:
                try:
                    self._forked.append((Forked(partial(_run_share, ctx, selection, share, phase)), share))
                except OSError:  # no fork now (a process or memory limit): this share runs here
                    self.here += share
        except BaseException:
            self.cancel()
            raise

    def result(self) -> list[Finding]:
        by_unit: dict[tuple[str, int], list[Finding]] = {}
        by_unit.update(_run_share(self.ctx, self.selection, self.here, self.phase)[0])
        for child, share in self._forked:
            try:
                findings, learned = child.result()
            except ChildLost:
                findings, learned = _run_share(self.ctx, self.selection, share, self.phase)
            by_unit.update(findings)
            _adopt(self.ctx, learned)
        return [finding for module in self.modules for index in range(self.parts.get(module.__name__, 1))
                for finding in by_unit.get((module.__name__, index), [])]

    def cancel(self) -> None:
        for child, _ in self._forked:
            child.cancel()  # a no-op once reaped; otherwise an interrupted run leaves no child behind


# A family, or one part of a family that declares SPLIT: (module, (index, count)), its findings then being
# check(ctx, part=(index, count)); the parts' findings, concatenated in order, are check(ctx)'s.
Unit = tuple[ModuleType, "tuple[int, int] | None"]


def _run_share(ctx: RunContext, selection: Selection, units: list[Unit], phase: str = "static") -> tuple[dict, dict]:
    by_unit: dict[tuple[str, int], list[Finding]] = {}
    for module, part in units:
        findings = by_unit[module.__name__, part[0] if part else 0] = []
        # A family of several phases is told which one this is.
        options = ({"part": part} if part is not None else {}) | (
            {"phase": phase} if len(phases_of(module)) > 1 else {})
        for finding in module.check(ctx, **options):
            if not selection.enabled(finding.code):
                continue
            finding.severity = severity_of(selection, finding.code)
            findings.append(finding)
    return by_unit, _learned(ctx)


def _learned(ctx: RunContext) -> dict:
    """What a share's checks computed that the parent uses after them: the digests (the seal compares them),
    the pickle scan (the reloads refuse what it refused) and the parsed run files (the report's runs table and
    curves), so the parent never reads or scans a file a second time."""
    return ctx.documents.export_caches()


def _adopt(ctx: RunContext, learned: dict) -> None:
    ctx.documents.merge_caches(learned)


def _balanced(modules: list[ModuleType], processes: int) -> list[list[Unit]]:
    """Longest first, each to the lightest share: a family's COST is its relative CPU time on a package of many
    files (1 when it does not say); a family that declares SPLIT comes in `processes` parts of equal cost (it
    balances its files over them). Empty shares are dropped."""
    units: list[tuple[float, Unit]] = []
    for module in modules:
        cost = getattr(module, "COST", 1)
        if getattr(module, "SPLIT", False) and processes > 1:
            units += [(cost / processes, (module, (index, processes))) for index in range(processes)]
        else:
            units.append((cost, (module, None)))
    shares: list[list[Unit]] = [[] for _ in range(processes)]
    loads = [0.0] * processes
    for cost, unit in sorted(units, key=lambda item: -item[0]):
        lightest = loads.index(min(loads))
        shares[lightest].append(unit)
        loads[lightest] += cost
    # The parent takes the lightest share: it has the other work of the run.
    ordered = sorted(range(processes), key=lambda i: loads[i])
    return [shares[i] for i in ordered if shares[i]] or [[]]
