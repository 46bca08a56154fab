"""itera-verify: check, reload and seal the output folder of a GPU-rental training campaign.

    from itera_verify import settle, verify, audit
    report = verify("outdir/", settle(reload=False))
    report.verdict  # "pass" or "fail"

`settle(config=None, **overrides)` makes the one frozen `RunOptions` a run reads (its fields are the overrides'
names); `verify` and `audit` return a `Report` whose `findings` are `Finding`s with a `Severity`.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING

from .model import Finding, Severity
from .options import RunOptions, Selection
from .version import FORMAT, __version__

if TYPE_CHECKING:
    from .report import Report
    from .runtime.progress import Progress


def verify(path: str | os.PathLike, options: RunOptions | None = None, *,
           progress: Progress | None = None) -> Report:
    """Check (and, as `options` say, reload and seal) the package folder at `path`; returns the Report. Raises
    UsageError when it cannot run. `options` None: `settle()`, the configuration file found from the current
    folder upward, every default."""
    from .flows.verify import verify as _verify

    return _verify(path, options, progress=progress)


def audit(archive: str | os.PathLike, options: RunOptions | None = None, *,
          progress: Progress | None = None) -> Report:
    """Audit a sealed archive (a file, or s3://bucket/key.tar.zst) as hostile input; returns the Report.
    `options` None: `settle(reviewer=True)`, the reviewer's configuration (never one inside an extracted
    package), no reloads unless asked."""
    from .flows.audit import audit as _audit

    return _audit(archive, options, progress=progress)


def assemble(parts, output: str | os.PathLike, options: RunOptions | None = None, *, progress: Progress | None = None):
    """Join the parts the lots sealed (archives, folders of them, s3:// keys or prefixes) into
    `output/<campaign_id>/`, each audited as hostile input first; returns the Assembly (`verdict`, `package`,
    `parts`, `findings`, `report()`). `options` None: `settle(reviewer=True)`. docs/record.md, "Two lots"."""
    from .flows.assemble import assemble as _assemble

    return _assemble(list(parts), output, options, progress=progress)


def settle(config=None, *, reviewer: bool = False, **overrides) -> RunOptions:
    """The options of one run (flows/config.py): the configuration file's settings, then `overrides` (the
    names of RunOptions' fields), validated. `config`: a flows.config.Config, None for the file the command line
    would find, `Config()` for none."""
    from .flows.config import settle as _settle

    return _settle(config, reviewer=reviewer, **overrides)


def __getattr__(name: str):
    if name == "Report":  # the report layer imports the rules: loaded when asked for, not at `import itera_verify`
        from .report import Report

        return Report
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["FORMAT", "Finding", "Report", "RunOptions", "Selection", "Severity", "__version__", "assemble", "audit",
           "settle", "verify"]
