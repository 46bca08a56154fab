"""Which installed torch may unpickle a stranger's file: the one place for the version and the advisories.

Every pickle is scanned before torch sees it (package/pickles), and torch's `weights_only=True` unpickler is the
second lock. Below 2.10 that lock has a published hole: CVE-2026-24747, memory corruption through SETITEM in the
`weights_only` unpickler (below 2.6 also CVE-2025-32434, `weights_only=True` bypassed outright). So `audit
--reload` of an archive (hostile input by definition) refuses to run on such a torch, and `verify` (the sender's
own files) warns. The version is read once, at the entry point, into runtime/environment.py's Environment, so a
test hands in a real old version string without touching torch.
"""
from __future__ import annotations

import functools
import re

SAFE_TORCH = (2, 10)  # the first release with CVE-2026-24747 fixed
ADVISORIES = (
    ((2, 6), "CVE-2025-32434 (torch.load with weights_only=True runs code)"),
    ((2, 10), "CVE-2026-24747 (memory corruption through SETITEM in the weights_only unpickler)"),
)
_RELEASE = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?([^+]*)")


def release(version: str) -> tuple[int, int, int, bool] | None:
    """(major, minor, micro, pre-release) of a torch version string ("2.9.1+cu128", "2.10.0a0+git…",
    "2.10.0.dev20251201"); None when it is not one."""
    match = _RELEASE.match(version.strip())
    if match is None:
        return None
    major, minor, micro, suffix = match.groups()
    return int(major), int(minor), int(micro or 0), bool(suffix.strip("."))


def advisory(version: str | None) -> str | None:
    """One line naming the version and the advisories it is open to; None for a fixed torch or no torch.

    A pre-release of the fixing version (2.10.0a0, a nightly) is not counted as fixed: which fixes it holds
    depends on its date. A version string that does not parse is not trusted either."""
    if version is None:
        return None
    parsed = release(version)
    if parsed is not None and (parsed[:2] > SAFE_TORCH or (parsed[:2] == SAFE_TORCH and not parsed[3])):
        return None
    open_to = [text for fixed, text in ADVISORIES if parsed is None or parsed[:2] < fixed
               or (parsed[:2] == fixed and parsed[3])]
    return (f"torch {version} is open to {'; '.join(open_to)}: its weights_only unpickler is not a safe second "
            f"lock for an untrusted file (install torch>={SAFE_TORCH[0]}.{SAFE_TORCH[1]})")


@functools.cache
def installed_torch() -> str | None:
    """The installed torch's version from its package metadata (torch itself is not imported); None without it.
    Read once a process: every Environment.read() asks, and the metadata's parse is ~0.5 ms each time."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torch")
    except PackageNotFoundError:
        return None


__all__ = ["ADVISORIES", "SAFE_TORCH", "advisory", "installed_torch", "release"]
