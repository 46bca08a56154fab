"""Reading an object back in parallel ranges, in order: the push's read-back and the audit from a bucket.

Several ranges are in flight at once (the store serves each on its own connection) and are handed out in
order, so a SHA-256 or the archive reader consumes one sequential stream. Every range is asked for with
If-Match on the ETag seen first: an object replaced while it is read fails (ObjectChanged) instead of mixing
two versions.
"""
from __future__ import annotations

from collections import deque
from concurrent.futures import ThreadPoolExecutor

from .store import PushError, error_code, explain, is_connection_error

RANGE_BYTES = 8 << 20
ATTEMPTS = 3


class ObjectChanged(PushError):
    """The object's ETag changed while it was read."""


class RangedReader:
    """A read-only, sequential file object over `s3://bucket/key` (`read(n)`, `close()`), fetched ahead."""

    def __init__(self, s3, bucket: str, key: str, size: int, etag: str | None, *, jobs: int = 4,
                 range_bytes: int = RANGE_BYTES, version_id: str | None = None):
        self.s3, self.bucket, self.key, self.size, self.etag = s3, bucket, key, size, etag
        self.version_id = version_id
        self.range_bytes = range_bytes
        self._pool = ThreadPoolExecutor(max_workers=max(1, jobs), thread_name_prefix="range-read")
        self._ahead = max(2, jobs * 2)
        self._next_offset = 0
        self._pending: deque = deque()
        self._buffer = memoryview(b"")
        self._closed = False

    def _fetch(self, start: int, end: int) -> bytes:
        arguments = {"Bucket": self.bucket, "Key": self.key, "Range": f"bytes={start}-{end - 1}"}
        if self.etag:
            arguments["IfMatch"] = self.etag
        if self.version_id:
            arguments["VersionId"] = self.version_id
        for attempt in range(ATTEMPTS):
            try:
                body = self.s3.get_object(**arguments)["Body"]
                try:
                    data = body.read()
                finally:
                    body.close()
                if len(data) != end - start:
                    raise ConnectionError(f"{len(data)} bytes for a range of {end - start}")
                return data
            except Exception as exc:  # noqa: BLE001 - every store error becomes one line below
                if error_code(exc) in ("PreconditionFailed", "412"):
                    raise ObjectChanged(f"s3://{self.bucket}/{self.key}: the object changed while it was read "
                                        "(its ETag is no longer the one seen first)") from None
                if is_connection_error(exc) and attempt + 1 < ATTEMPTS:
                    continue
                raise explain(exc, "reading it back", f"s3://{self.bucket}/{self.key}") from None
        raise AssertionError("unreachable")

    def _fill_window(self) -> None:
        while len(self._pending) < self._ahead and self._next_offset < self.size:
            start = self._next_offset
            end = min(self.size, start + self.range_bytes)
            self._pending.append(self._pool.submit(self._fetch, start, end))
            self._next_offset = end

    def read(self, n: int = -1) -> bytes:
        if self._closed:
            raise ValueError("read from a closed RangedReader")
        if not self._buffer:
            self._fill_window()
            if not self._pending:
                return b""
            self._buffer = memoryview(self._pending.popleft().result())
            self._fill_window()
        take = len(self._buffer) if n is None or n < 0 else min(n, len(self._buffer))
        piece, self._buffer = self._buffer[:take], self._buffer[take:]
        return bytes(piece)

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            for future in self._pending:
                future.cancel()
            self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_back_sha256(s3, bucket: str, key: str, size: int, etag: str | None, jobs: int,
                     version_id: str | None = None, algorithm: str = "sha256") -> tuple[str, int]:
    """(hex digest, bytes read) of the object, read in parallel ranges (`algorithm`: a hashlib name)."""
    import hashlib

    digest, total = hashlib.new(algorithm), 0
    with RangedReader(s3, bucket, key, size, etag, jobs=jobs, version_id=version_id) as reader:
        while piece := reader.read(RANGE_BYTES):
            digest.update(piece)
            total += len(piece)
    return digest.hexdigest(), total
