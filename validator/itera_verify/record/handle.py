"""What the recorder's helpers need of a run and a run of its campaign, as small protocols: the helpers
(artifacts.py, checkpoints.py, proofs.py, resume.py) take a run through these and never import run.py, so the
recorder's modules form no circle (run.py imports the helpers, not the other way round)."""
from __future__ import annotations

from pathlib import Path
from typing import Protocol


class CampaignClock(Protocol):
    """What a run needs of its campaign: the package, whether this process writes it, the campaign's clock."""

    @property
    def root(self) -> Path: ...

    @property
    def writer(self) -> bool: ...

    lot: str | None  # the plan lot this machine is (runs[].lot), None on one machine

    def now(self) -> str: ...


class RunRecord(Protocol):
    """What a helper needs of a run: its id, its package, whether this process writes it, the campaign's clock,
    and the stop rules declared for it, and how it stops for a failed resume proof (record/run.py's Run is
    one)."""

    id: str

    @property
    def root(self) -> Path: ...

    @property
    def writer(self) -> bool: ...

    def now(self) -> str: ...

    def rules(self) -> list[dict]: ...

    def stop_pending(self) -> bool: ...
