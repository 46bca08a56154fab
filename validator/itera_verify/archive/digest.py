"""The SHA-256 of a whole file, computed on a thread of its own.

Why a thread: hashing releases the interpreter lock, so the digest of a 1.4 GB archive (about a second of one
core) costs no wall time when it runs beside work that uses one core only, such as the audit's re-check.
"""
from __future__ import annotations

import hashlib
import os
import threading

CHUNK = 4 << 20


class FileDigest:
    """Start hashing `path` now; result() waits for (sha256 hex, bytes read) or raises the OSError met."""

    def __init__(self, path: str | os.PathLike):
        self.path = path
        self._sha256 = hashlib.sha256()
        self._bytes = 0
        self._error: OSError | None = None
        self._thread = threading.Thread(target=self._run, name="file-digest", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            with open(self.path, "rb", buffering=0) as source:
                while chunk := source.read(CHUNK):
                    self._sha256.update(chunk)
                    self._bytes += len(chunk)
        except OSError as exc:
            self._error = exc

    def result(self) -> tuple[str, int]:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._sha256.hexdigest(), self._bytes
