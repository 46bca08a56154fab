"""Per-rank files and the world size (docs/format.md, Multi-GPU training outputs).

Rank files must be exactly ranks 0 … world_size-1; without a recorded size, contiguous from 0. The world size
comes from the run's params (`world_size`) and from what the files record (DeepSpeed's dp_world_size); a missing
rank file is a missing component (IV507), files for more ranks than a recorded size, or two recorded sizes that
differ, are an inconsistency (IV508).
"""
from __future__ import annotations

import re
from pathlib import Path

from ...format import layouts
from ..common import INCONSISTENT, MISSING, Outcome



def rank_files(folder: Path, pattern: re.Pattern) -> dict[int, Path]:
    """rank -> file for every file of `folder` whose name matches `pattern` (group 1: the rank)."""
    found = {}
    for path in sorted(folder.iterdir()) if folder.is_dir() else []:
        match = pattern.fullmatch(path.name)
        if match and path.is_file():
            found[int(match.group(1) or 0)] = path
    return found


def settle_world_size(sources: dict[str, int | None], outcome: Outcome, file: Path | None = None) -> int | None:
    """The world size the recorded sources agree on (None when none records one); IV508 when they differ."""
    known = {what: size for what, size in sources.items() if isinstance(size, int)}
    if len(set(known.values())) > 1:
        shown = ", ".join(f"{what} {size}" for what, size in known.items())
        outcome.fail(INCONSISTENT, f"the world size disagrees: {shown}", file)
    return next(iter(known.values()), None)


def check_ranks(ranks: dict[int, Path], world_size: int | None, what: str, outcome: Outcome, folder: Path,
                source: str = "the recorded world size") -> None:
    """Ranks exactly 0 … world_size-1 (contiguous from 0 without a size): missing ones IV507, extra ones IV508."""
    outcome.facts.setdefault("ranks", {})[what] = sorted(ranks)
    if not ranks:
        return  # the caller reports a component that is missing whole
    expected, missing, extra = layouts.rank_gaps(ranks, world_size)
    if missing:
        outcome.fail(MISSING, f"{outcome.rel(folder)}: no {what} for rank(s) {', '.join(map(str, missing))} of "
                              f"{expected}: those processes cannot resume", folder)
    if extra:
        outcome.fail(INCONSISTENT, f"{outcome.rel(folder)}: {what} for rank(s) {', '.join(map(str, extra))}, but "
                                   f"{source} is {world_size}: the world size disagrees", ranks[extra[0]])
