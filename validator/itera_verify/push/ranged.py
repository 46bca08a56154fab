"""Reading an object back in parallel ranges, in order: the push's read-back and the audit from a bucket.

Several ranges are in flight at once (the store serves each on its own connection) and are handed out in
order, so a SHA-256 or the archive reader consumes one sequential stream. Every range is asked for with
If-Match on the ETag seen first, and its answer must name that ETag and that range: an object replaced while it
is read fails (ObjectChanged) instead of mixing two versions. A range is read with the length asked for and no
more (answers.py bounds the body; here it must be exactly that long): a store that answers more or fewer bytes is
its own one-line error, never retried. Memory: at most `jobs * 2 + 1` ranges of RANGE_BYTES.
"""
from __future__ import annotations

import re
from collections import deque
from concurrent.futures import ThreadPoolExecutor

from .answers import AnswerRefused, printable
from .store import PushError, error_code, explain, is_connection_error

RANGE_BYTES = 8 << 20
ATTEMPTS = 3  # a body cut short (the connection dropped mid-range) is asked for again, this many times in all


class ObjectChanged(PushError):
    """The object's ETag changed while it was read."""


def _etag(value) -> str:
    return str(value or "").removeprefix("W/").strip('"')


class RangedReader:
    """A read-only, sequential file object over `s3://bucket/key` (`read(n)`, `close()`), fetched ahead. `what`
    names the reading in errors; `resume`: a push's read-back (an audit is never told to resume)."""

    def __init__(self, s3, bucket: str, key: str, size: int, etag: str | None, *, jobs: int = 4,
                 range_bytes: int = RANGE_BYTES, version_id: str | None = None, what: str = "reading it back",
                 resume: bool = True):
        self.s3, self.bucket, self.key, self.size, self.etag = s3, bucket, key, size, etag
        self.version_id, self.what, self.resume = version_id, what, resume
        self.range_bytes = range_bytes
        self._pool = ThreadPoolExecutor(max_workers=max(1, jobs), thread_name_prefix="range-read")
        self._ahead = max(2, jobs * 2)
        self._next_offset = 0
        self._pending: deque = deque()
        self._buffer = memoryview(b"")
        self._closed = False

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.key}"

    def _fetch(self, start: int, end: int) -> bytearray:
        arguments = {"Bucket": self.bucket, "Key": self.key, "Range": f"bytes={start}-{end - 1}"}
        if self.etag:
            arguments["IfMatch"] = self.etag
        if self.version_id:
            arguments["VersionId"] = self.version_id
        for attempt in range(ATTEMPTS):
            try:
                response = self.s3.get_object(**arguments)  # botocore has retried what it retries
            except Exception as exc:  # noqa: BLE001 - every store error becomes one line below
                if error_code(exc) in ("PreconditionFailed", "412"):
                    raise self._changed() from None
                raise explain(exc, self.what, self.url, resume=self.resume) from None
            body = response["Body"]
            try:
                self._same_range(response, start, end)
                return _read_exactly(body, end - start)
            except _CutShort as cut:
                if attempt + 1 < ATTEMPTS:
                    continue
                raise PushError(f"{self.url}: the store answered {cut.got} bytes for a range of {end - start} "
                                f"while {self.what} (its answer stopped {ATTEMPTS} times: {cut.why})") from None
            except AnswerRefused as exc:
                raise explain(exc, self.what, self.url) from None
            finally:
                body.close()
        raise AssertionError("unreachable")

    def _changed(self) -> ObjectChanged:
        return ObjectChanged(f"{self.url}: the object changed while it was read (its ETag is no longer the one "
                             "seen first)")

    def _same_range(self, response: dict, start: int, end: int) -> None:
        """The answer is of the object first seen (its ETag) and of the range asked for (Content-Length,
        Content-Range), before any byte of its body is read."""
        if self.etag and response.get("ETag") and _etag(response["ETag"]) != _etag(self.etag):
            raise self._changed()
        length = response.get("ContentLength")
        if isinstance(length, int) and length != end - start:
            raise AnswerRefused(f"the store answered {length} bytes for a range of {end - start}")
        content_range = response.get("ContentRange")
        if content_range is not None and _content_range(content_range) != (start, end - 1, self.size):
            raise AnswerRefused(f"the store answered the range {str(content_range)[:80]!r} for bytes "
                                f"{start}-{end - 1}/{self.size}")

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
                     version_id: str | None = None, algorithm: str = "sha256", what: str = "reading it back",
                     resume: bool = True) -> tuple[str, int]:
    """(hex digest, bytes read) of the object, read in parallel ranges (`algorithm`: a hashlib name)."""
    import hashlib

    digest, total = hashlib.new(algorithm), 0
    with RangedReader(s3, bucket, key, size, etag, jobs=jobs, version_id=version_id, what=what,
                      resume=resume) as reader:
        while piece := reader.read(RANGE_BYTES):
            digest.update(piece)
            total += len(piece)
    return digest.hexdigest(), total


class _CutShort(Exception):
    """The body ended before the range did: the connection dropped (asked for again) or the store stopped."""

    def __init__(self, got: int, why: str):
        super().__init__(why)
        self.got, self.why = got, why


def _read_exactly(body, length: int) -> bytearray:
    """`length` bytes of a GetObject body, then the proof that there are no more (AnswerRefused otherwise)."""
    from botocore.exceptions import IncompleteReadError

    data = bytearray(length)
    got = 0
    with memoryview(data) as view:
        while got < length:
            try:
                count = body.readinto(view[got:])
            except Exception as exc:  # noqa: BLE001 - a dropped connection, a read timeout, a short body
                if not (is_connection_error(exc) or isinstance(exc, IncompleteReadError)):
                    raise
                raise _CutShort(got, printable(str(exc) or type(exc).__name__)) from None
            if count == 0:
                raise AnswerRefused(f"the store answered {got} bytes for a range of {length}")
            got += count
    if body.read(1):
        raise AnswerRefused(f"the store answered more than {length} bytes for a range of {length}")
    return data


def _content_range(value) -> tuple[int, int, int] | None:
    match = re.fullmatch(r"bytes (\d+)-(\d+)/(\d+)", str(value).strip())
    return tuple(int(g) for g in match.groups()) if match else None


def read_start(s3, bucket: str, key: str, limit: int) -> bytes:
    """The first `limit` + 1 bytes of a small object at most (a sidecar: its `.sha256`, `.sig`, receipt), so a
    caller sees one that is too large. Store errors are the caller's to explain."""
    body = s3.get_object(Bucket=bucket, Key=key, Range=f"bytes=0-{limit}")["Body"]
    data = bytearray()
    try:  # a bounded body (answers.py) hands out one socket read at a time: read on to the end or the limit
        while len(data) <= limit and (piece := body.read(min(1 << 20, limit + 1 - len(data)))):
            data += piece
    finally:
        body.close()
    return bytes(data)
