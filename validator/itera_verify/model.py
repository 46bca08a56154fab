"""The vocabulary shared by every layer: rules, findings, severities."""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class Severity(str, Enum):
    ERROR = "error"
    WARNING = "warning"
    INFO = "info"

    @property
    def rank(self) -> int:
        return {"error": 2, "warning": 1, "info": 0}[self.value]


@dataclass(frozen=True)
class Rule:
    """One rule code. Its explanation and examples are the user documentation (`itera-verify rules CODE`)."""

    code: str
    severity: Severity
    title: str
    explain: str
    bad: str = ""
    good: str = ""
    family: str = ""  # filled by the registry: the module that declares it
    since: str = "0.1.0"  # the tool version that introduced the code: an older record cannot have run it


@dataclass
class Finding:
    code: str
    path: str | None = None
    message: str = ""
    line: int | None = None
    column: int | None = None
    pointer: str | None = None
    severity: Severity | None = None  # set by the engine from the rule and the configuration
    run: str | None = None  # the run this finding disqualifies, when it concerns one
    artifact: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"code": self.code, "severity": (self.severity or Severity.ERROR).value}
        if self.path is not None:
            out["path"] = self.path
        for key in ("line", "column", "pointer", "run", "artifact"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        out["message"] = self.message
        return out


# A failed reload's fact, set by the verifying process alone (flows/partproofs.py), never a reload child: the lot's
# signed reload proof the artifact stands on in an assembled campaign. It is not a reload here: `ok` stays false.
STANDS_ON = "reloaded_on"


@dataclass
class ReloadResult:
    """Facts one reload child reported about one artifact. Rules turn these into findings."""

    artifact: str
    loader: str
    kind: str = ""
    path: str = ""
    device: str = "cpu"
    ok: bool = False
    seconds: float = 0.0
    peak_memory_bytes: int | None = None
    error: str | None = None
    # "load" | "base-unavailable" | "missing-component" | "inconsistent" | "crash" | "timeout"
    failure: str | None = None
    forward: str | None = None  # what the forward pass proved, or why none ran
    facts: dict[str, Any] = field(default_factory=dict)
    devices: list[str] = field(default_factory=list)  # where the weights went: one device, or several GPUs
    host_peak_memory_bytes: int | None = None  # the child's peak resident memory (ru_maxrss)
    device_peak_memory_bytes: int | None = None  # GPU memory at its peak, over every GPU used (None on the CPU)
    # What confined the child (reload/confine.py): "landlock ABI 7: fs, net", "none (why)"; None: no child ran.
    confinement: str | None = None

    @property
    def lot_proof(self) -> dict[str, Any] | None:
        """The lot's signed proof this failed reload stands on (STANDS_ON), or None."""
        proof = self.facts.get(STANDS_ON) if isinstance(self.facts, dict) and not self.ok else None
        return proof if isinstance(proof, dict) else None

    def to_json(self) -> dict[str, Any]:
        out = {
            "artifact": self.artifact, "loader": self.loader, "device": self.device, "ok": self.ok,
            "seconds": round(self.seconds, 3), "peak_memory_bytes": self.peak_memory_bytes,
        }
        for key in ("kind", "path", "error", "failure", "forward", "devices", "confinement"):
            value = getattr(self, key)
            if value:
                out[key] = value
        for key in ("host_peak_memory_bytes", "device_peak_memory_bytes"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.facts:
            out["facts"] = self.facts
        return out


class UsageError(Exception):
    """The tool could not run (exit code 2): bad arguments, unreadable input, missing device."""
