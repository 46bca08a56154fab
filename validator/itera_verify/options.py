"""What one run is told: the frozen, typed options every stage reads (`RunOptions`), and which rules run at which
level (`Selection`).

`flows/config.py` `settle(config, **overrides)` is the one constructor of `RunOptions`: it applies the
configuration file, then the caller's explicit values, validates them, and reads the environment once. The
command line, `verify`, `audit`, the resume proof and the recorder's helpers all get theirs from it; nothing
below the entry points reads a setting from anywhere else (docs/architecture.md).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Iterable, Mapping

from .model import Finding, Severity
from .runtime.environment import Environment

DEVICES = ("auto", "cuda", "cpu")
ISOLATIONS = ("auto", "fork", "spawn")
CONFINEMENTS = ("auto", "required")  # reload/confine.py
ENGINES = ("local", "ray")  # what runs a batch of audits: forked processes here, or Ray tasks
DEFAULT_DEVICE, DEFAULT_TIMEOUT, DEFAULT_LEVEL = "auto", 600.0, 3


def _matches(code: str, patterns: Iterable[str]) -> bool:
    return any(code.startswith(p) for p in patterns)


@dataclass(frozen=True)
class Selection:
    """Which rules run and at what level: --select/--ignore (codes or prefixes), per-rule levels, --strict.
    A rule's own default level lives with the rule (rules/<family>.py); `level` is told it."""

    select: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    levels: Mapping[str, Severity] = field(default_factory=dict)  # code or prefix -> severity
    strict: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "select", tuple(self.select))
        object.__setattr__(self, "ignore", tuple(self.ignore))
        object.__setattr__(self, "levels", MappingProxyType(dict(self.levels)))

    def enabled(self, code: str) -> bool:
        if self.select and not _matches(code, self.select):
            return False
        return not _matches(code, self.ignore)

    def level(self, code: str, default: Severity) -> Severity:
        """The level this run gives `code`: an exact entry, else the first prefix entry, else the rule's own."""
        if code in self.levels:
            return self.levels[code]
        for prefix, level in self.levels.items():
            if code.startswith(prefix):
                return level
        return default

    def blocks(self, finding: Finding) -> bool:
        return finding.severity == Severity.ERROR or (self.strict and finding.severity == Severity.WARNING)

    def __reduce__(self):  # a read-only view does not pickle: a Ray task receives the levels as a dict
        return (Selection, (self.select, self.ignore, dict(self.levels), self.strict))


_SETTLED = object()  # held by settle() alone: RunOptions is built there, validated, and nowhere else


@dataclass(frozen=True)
class RunOptions:
    """Everything a run of `verify` or `audit` is told, settled once at the entry point (flows/config.py
    `settle`). Frozen: no stage changes what another was told."""

    environment: Environment  # the environment variables at the entry point (runtime/environment.py)
    # what is checked
    selection: Selection = Selection()
    tmp_patterns: tuple[str, ...] = ()  # more temporary-folder prefixes for IV201
    tariffs: Mapping[str, Mapping[str, float]] | None = None  # GPU -> {days: USD}, over the shipped catalog
    scan_budget: int | None = None  # the pickle scan's work units (an audit: --max-size); None: the package's size
    deadline: str | None = None  # --deadline: when the rental ends (RFC 3339)
    pushing: bool = False  # a push follows the seal: the rental's estimate counts it
    # --part: one lot's part of a campaign (docs/record.md, "Two lots"): what only the whole campaign can hold (the
    # decision, exactly one control, the cost per accepted run) is left to the assembled package; sealed as
    # <campaign_id>.<lot>.part.tar.zst
    part: bool = False
    # the reloads
    reload: bool = True
    device: str = DEFAULT_DEVICE  # auto, cuda or cpu, as asked (reload.resolve_device says which it is)
    hf_cache: Path | None = None  # the hub cache holding the pinned bases, resolved (runtime/hfcache.py)
    timeout: float = DEFAULT_TIMEOUT  # seconds per reload
    jobs: int = 1  # reloads side by side on the CPU
    isolation: str = "auto"  # how reload children start: forked from one preloaded process, or spawned
    confine: str = "auto"  # reload children confine themselves with Landlock; "required": exit 2 without it
    # the seal
    seal: bool = True
    output: str | os.PathLike | None = None  # -o: the archive file or its folder
    overwrite: bool = False
    level: int = DEFAULT_LEVEL  # zstd level
    threads: int = 0  # zstd threads (0: every core)
    sign: tuple[str, ...] = ()  # ssh:KEY.pub, ssh:KEY, model-signing:KEY.pem
    # the audit
    max_size: int | None = None  # bytes the archive may expand to (None: audit.default_max_size)
    endpoint_url: str | None = None  # an S3-compatible store's endpoint, for s3:// archives
    allowed_signers: Path | None = None
    signer: str | None = None
    oms_public_key: Path | None = None
    # a batch of audits (flows/batch.py): a folder, an s3:// prefix or a list of archives
    batch_jobs: int = 1  # archives audited at once, each in its own process
    shard: tuple[int, int] | None = None  # (I, N): audit only the I-th of N slices of the sorted keys (0 <= I < N)
    engine: str = "local"  # local: forked processes; ray: Ray tasks
    results: str | None = None  # a folder or s3:// prefix keeping each archive's report for a rerun
    # the reviewer's key file (runtime/reviewer_key.py): --results-key, else ITERA_RESULTS_KEY; None: the default
    # one under the reviewer's config folder. It authenticates the stored results and what assemble records.
    results_key: Path | None = None
    # where these came from (the report's `configuration`)
    configuration: Mapping[str, Any] = field(default_factory=dict)
    _settled: object = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self._settled is not _SETTLED:
            raise TypeError("RunOptions are made by itera_verify.settle(config, **overrides), which validates them")
        object.__setattr__(self, "configuration", MappingProxyType(dict(self.configuration)))

    def __reduce__(self):
        """Settled options cross to another process (a Ray task) by value, as settled: the read-only views go
        as dicts and come back as views."""
        fields = {name: getattr(self, name) for name in option_names()}
        fields["configuration"] = dict(self.configuration)
        return (_rebuild, (fields,))


def _rebuild(fields: dict[str, Any]) -> "RunOptions":
    return RunOptions(**fields, _settled=_SETTLED)


def option_names() -> tuple[str, ...]:
    """The names settle() takes as overrides: every field but the token."""
    return tuple(name for name in RunOptions.__dataclass_fields__ if not name.startswith("_"))


def make_options(**fields: Any) -> RunOptions:
    """The constructor settle() calls once it has validated `fields`."""
    return RunOptions(**fields, _settled=_SETTLED)


__all__ = ["DEVICES", "ENGINES", "ISOLATIONS", "RunOptions", "Selection", "make_options", "option_names"]
