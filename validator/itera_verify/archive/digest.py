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
    """Start hashing the file at `source` now. result() waits for (sha256 hex, bytes read) or raises the OSError
    met."""

    def __init__(self, source: str | os.PathLike):
        self.source = source
        self.bytes = 0
        self._sha256 = hashlib.sha256()
        self._error: OSError | None = None
        self._thread = threading.Thread(target=self._run, name="file-digest", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            fd = os.open(self.source, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            try:
                self._hash(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            self._error = exc

    def _hash(self, fd: int) -> None:
        while True:
            data = os.pread(fd, CHUNK, self.bytes)
            if not data:
                return
            self._sha256.update(data)
            self.bytes += len(data)

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def result(self) -> tuple[str, int]:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._sha256.hexdigest(), self.bytes
