"""Read-modify-write of the package's shared documents (manifest.json, stops.json, reload.json) under the
package lock: each change starts from what is on disk now, so two processes never lose each other's update."""
from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .errors import RecordError
from .files import dumps, read_bytes, write_atomic
from .lock import package_lock

from ..format.names import EVAL_IDS, MANIFEST, RELOAD, STOPS  # noqa: F401  (the recorder's modules read them here)
EMPTY = {STOPS: {"stops": []}, RELOAD: {"artifacts": {}}}
# Written last: the manifest names what the other two hold.
WRITE_ORDER = (STOPS, RELOAD, MANIFEST)


def now() -> str:
    """RFC 3339 UTC to the second: what the checker compares (IV401, IV408, IV612)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str) -> datetime:
    return datetime.fromisoformat(text)  # Python 3.11 reads the Z


class Transaction:
    def __init__(self, root: Path):
        self.root = root
        self._docs: dict[str, Any] = {}
        self._original: dict[str, bytes | None] = {}

    def get(self, name: str) -> Any:
        if name not in self._docs:
            try:
                raw = read_bytes(self.root, name)
            except FileNotFoundError:
                self._original[name] = None
                self._docs[name] = json.loads(json.dumps(EMPTY.get(name))) if name in EMPTY else None
            else:
                self._original[name] = raw
                try:
                    self._docs[name] = json.loads(raw)
                except ValueError as exc:
                    raise RecordError(f"{self.root / name} is not JSON ({exc}): it was edited by hand; repair it "
                                      "before recording more") from None
        return self._docs[name]

    def set(self, name: str, value: Any) -> None:
        self.get(name)
        self._docs[name] = value

    def commit(self) -> None:
        for name in WRITE_ORDER:
            if name in self._docs and self._docs[name] is not None:
                data = dumps(self._docs[name])
                if data != self._original[name]:
                    write_atomic(self.root, name, data)


@contextlib.contextmanager
def transaction(root: Path) -> Iterator[Transaction]:
    with package_lock(root):
        tx = Transaction(root)
        yield tx
        tx.commit()  # not on an exception: a refused step changes nothing


def run_entry(manifest: dict, run_id: str) -> dict:
    """The manifest's entry of run `run_id`, to change in place within a transaction."""
    for run in manifest.get("runs", []):
        if run.get("id") == run_id:
            return run
    raise RecordError(f"run {run_id!r} is not in the manifest")


def read(root: Path, name: str) -> Any:
    """A document as it is now (atomic writes: never half-written), without taking the lock."""
    return Transaction(root).get(name)
