"""itera-verify: check, reload and seal the output folder of a GPU-rental training campaign."""
from __future__ import annotations

from .version import FORMAT, __version__


def verify(path, **options):
    """Check (and by default reload and seal) a package; returns the Report. See `itera_verify.flows.verify`."""
    from .flows.verify import verify as _verify

    return _verify(path, **options)


def audit(archive, **options):
    """Audit a sealed archive as hostile input; returns the Report. See `itera_verify.flows.audit`."""
    from .flows.audit import audit as _audit

    return _audit(archive, **options)


__all__ = ["__version__", "verify", "audit", "FORMAT"]
