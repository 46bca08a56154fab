"""itera-verify: check, reload and seal the output folder of a GPU-rental training campaign."""
from __future__ import annotations

__version__ = "0.1.0"
FORMAT = "itera-output/1"


def verify(path, **options):
    """Check (and by default reload and seal) a package; returns the Report. See `itera_verify.verify_flow`."""
    from .verify_flow import verify as _verify

    return _verify(path, **options)


def audit(archive, **options):
    """Audit a sealed archive as hostile input; returns the Report. See `itera_verify.audit_flow`."""
    from .audit_flow import audit as _audit

    return _audit(archive, **options)


__all__ = ["__version__", "verify", "audit", "FORMAT"]
