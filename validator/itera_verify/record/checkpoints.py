"""What each save cost (docs/record.md, manifest `runs[].checkpoints`): its artifact, step, time, write seconds measured
around the save and bytes on disk; the proof of its resume once it ends; and the time the rental has left.

The guide asks the user to choose the checkpoint interval by weighing the work a crash loses against the cost of
the operation: both need the cost measured, save by save, where the campaign runs."""
from __future__ import annotations

import os
import stat
import sys
from datetime import datetime, timedelta
from pathlib import Path

from ..format.values import spoken_duration
from .store import MANIFEST, parse_time, read, run_entry, transaction
from .handle import RunRecord



def bytes_on_disk(path: Path) -> int:
    """The size of a saved file, or of every regular file under a saved folder (links not followed)."""
    try:
        info = os.lstat(path)
    except OSError:
        return 0
    if not stat.S_ISDIR(info.st_mode):
        return info.st_size if stat.S_ISREG(info.st_mode) else 0
    total = 0
    for folder, _, names in os.walk(path):
        for name in names:
            try:
                entry = os.lstat(os.path.join(folder, name))
            except OSError:
                continue
            if stat.S_ISREG(entry.st_mode):
                total += entry.st_size
    return total


def rental_end(plan: dict | None) -> datetime | None:
    """When the rental ends: the earliest `started_at + days` of the lots that record their start (docs/record.md)."""
    ends = []
    for lot in (plan or {}).get("lots") or []:
        if not isinstance(lot, dict) or not isinstance(lot.get("started_at"), str):
            continue
        days = lot.get("days")
        if isinstance(days, bool) or not isinstance(days, (int, float)):
            continue
        try:
            ends.append(parse_time(lot["started_at"]) + timedelta(days=days))
        except ValueError:
            continue
    return min(ends) if ends else None


def record_save(run: RunRecord, artifact_id: str, path: Path, step: int, write_seconds: float | None) -> dict:
    """The save's entry in `runs[].checkpoints` (replacing one of the same artifact, a save repeated), written
    under the package lock; prints the save's cost and the time the rental has left. Returns the entry."""
    entry = {"artifact": artifact_id, "step": step, "saved_at": run.now(), "bytes": bytes_on_disk(path)}
    if write_seconds is not None:
        entry["write_seconds"] = round(max(0.0, write_seconds), 3)
    with transaction(run.root) as tx:
        manifest = tx.get(MANIFEST)
        listed = run_entry(manifest, run.id).setdefault("checkpoints", [])
        old = next((c for c in listed if c.get("artifact") == artifact_id), None)
        if old is not None and old.get("proof") is not None and old.get("step") == step:
            entry["proof"] = old["proof"]  # registered again (the Trainer's end), not saved again
        listed[:] = [c for c in listed if c.get("artifact") != artifact_id] + [entry]
        end = rental_end(manifest.get("plan"))
    print(f"itera-verify: {run.id} saved {artifact_id} at step {step}: {_mib(entry['bytes'])}"
          + (f" in {entry['write_seconds']:.2f} s" if "write_seconds" in entry else "") + _time_left(run, end),
          file=sys.stderr, flush=True)
    return entry


def _mib(size: int) -> str:
    return f"{size / 2**20:.1f} MiB" if size >= 2**20 else f"{size} bytes"


def _time_left(run: RunRecord, end: datetime | None) -> str:
    if end is None:
        return "; the rental's end is unknown (declare_plan(lots=[{..., 'started_at': ...}]))"
    left = (end - parse_time(run.now())).total_seconds()
    when = end.strftime("%Y-%m-%dT%H:%M:%SZ")
    if left <= 0:
        return f"; the rental ended at {when}, {spoken_duration(-left)} ago"
    return f"; the rental ends at {when}, in {spoken_duration(left)}"


def set_proof(run: RunRecord, artifact_id: str, proof: dict) -> None:
    """The proof of a save's resume, written under the package lock when it ends (a save the recorder did not
    price, a hand-written registration, gets its entry here)."""
    with transaction(run.root) as tx:
        listed = run_entry(tx.get(MANIFEST), run.id).setdefault("checkpoints", [])
        entry = next((c for c in listed if c.get("artifact") == artifact_id), None)
        if entry is None:
            artifact = next((a for a in tx.get(MANIFEST).get("artifacts", []) if a.get("id") == artifact_id), {})
            entry = {"artifact": artifact_id}
            if isinstance(artifact.get("path"), str):
                entry["bytes"] = bytes_on_disk(run.root / artifact["path"])
            listed.append(entry)
        entry["proof"] = proof


def recorded(run: RunRecord) -> list[dict]:
    """The run's checkpoints as the package holds them now."""
    entry = next((r for r in read(run.root, MANIFEST).get("runs", []) if r.get("id") == run.id), None) or {}
    return [c for c in entry.get("checkpoints") or [] if isinstance(c, dict)]
