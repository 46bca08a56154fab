"""A batch of audits (`itera-verify audit DIR/|s3://…/|@list.txt`): one row per archive and what the batch did.

A row holds the archive's report as its JSON shape (schemas/report.schema.json): an archive is audited in its
own process (or a Ray task, or read back from --results), and what comes back is that JSON. The batch renderers
(batch_format.py, sarif_format.py) read only this object.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..version import __version__

PASS, FAIL = "pass", "fail"


@dataclass
class AuditRow:
    """One archive of the batch: its report, or why there is none (`error`: it could not be read, its process
    died, it ran past its limit)."""

    archive: str  # what was audited: a path or s3://bucket/key
    key: str  # its name in the listing: what is sorted and sharded
    verdict: str = FAIL
    seconds: float = 0.0
    sha256: str | None = None
    reused: bool = False  # read back from --results, not audited again
    error: str | None = None
    report: dict[str, Any] | None = None
    not_reused: str | None = None  # why a result found in --results was not reused (forged, of another archive)

    def to_json(self) -> dict[str, Any]:
        return {"archive": self.archive, "key": self.key, "verdict": self.verdict, "sha256": self.sha256,
                "seconds": round(self.seconds, 3), "reused": self.reused, "error": self.error,
                "report": self.report, **({"not_reused": self.not_reused} if self.not_reused else {})}

    @classmethod
    def from_json(cls, data: Any) -> "AuditRow":
        """A row as a child process wrote it; ValueError when it is not one."""
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        texts = {name: data.get(name) for name in ("archive", "key", "sha256", "error", "not_reused")}
        if not isinstance(texts["archive"], str) or not isinstance(texts["key"], str) or any(
                value is not None and not isinstance(value, str) for value in texts.values()):
            raise ValueError("archive, key, sha256, error and not_reused are strings")
        if data.get("verdict") not in (PASS, FAIL):
            raise ValueError("verdict is pass or fail")
        seconds, report = data.get("seconds"), data.get("report")
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
            raise ValueError("seconds is a number")
        if report is not None and not isinstance(report, dict):
            raise ValueError("report is an object")
        return cls(texts["archive"], texts["key"], data["verdict"], float(seconds), texts["sha256"],
                   data.get("reused") is True, texts["error"], report, texts["not_reused"])


@dataclass
class BatchReport:
    source: str  # the folder, s3:// prefix or @list as given
    rows: list[AuditRow] = field(default_factory=list)  # in the order the audits ended
    found: int = 0  # archives listed, every shard together
    selected: int = 0  # archives of this shard
    shard: tuple[int, int] | None = None
    skipped: list[str] = field(default_factory=list)  # entries that are not archives (the first few)
    skipped_count: int = 0
    engine: str = "local"
    jobs: int = 1
    results: str | None = None
    strict: bool = False
    elapsed_seconds: float | None = None
    notes: list[str] = field(default_factory=list)  # what the batch says beside its rows
    tool: str = "itera-verify"
    version: str = __version__

    @property
    def verdict(self) -> str:
        return FAIL if any(row.verdict != PASS for row in self.rows) else PASS

    @property
    def reused(self) -> int:
        return sum(1 for row in self.rows if row.reused)

    @property
    def audited(self) -> int:
        return len(self.rows) - self.reused

    def counts(self) -> dict[str, int]:
        return {"archives": len(self.rows), "pass": sum(1 for row in self.rows if row.verdict == PASS),
                "fail": sum(1 for row in self.rows if row.verdict != PASS), "reused": self.reused,
                "audited": self.audited, "unreadable": sum(1 for row in self.rows if row.error),
                "skipped": self.skipped_count, "found": self.found}


__all__ = ["AuditRow", "BatchReport", "FAIL", "PASS"]
