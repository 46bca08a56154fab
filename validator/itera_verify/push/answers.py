"""A store's answers are hostile input: each is bounded in bytes and in time before botocore reads it.

botocore reads an answer's body whole in two places: every answer it does not stream (HEAD, the listings, the
tags, the multipart calls) in URLLib3Session.send, and every error answer (status 300 and up, GetObject's too) in
endpoint.convert_to_response_dict; a GetObject body is read by the caller, as much as the caller asks. So the
client sends each request itself, from botocore's `before-send` event (the hook botocore offers to answer a
request in its place), through botocore's own connection pool, and hands botocore an answer already bounded:
- an error answer: at most ERROR_MAX bytes; a document (what botocore parses): at most DOCUMENT_MAX bytes;
- a GetObject body: never more bytes than its Range asks for (refused on its Content-Length before any byte is
  read, or at the first byte past it), read one socket read at a time;
- every body within answer_seconds(its length): the store's silence is bounded by the read timeout, a trickle by
  this deadline;
- headers: http.client's own limits (at most 100 lines of at most 64 KiB); past them the answer is refused.
A refused answer raises AnswerRefused (one line, never retried: the store answered, wrongly).

Limits (StoreLimits): connect 10 s; 60 s of silence at most on an open connection; a body's deadline 60 s plus
its length at 32 KiB/s (an 8 MiB range: 316 s); botocore makes at most 3 attempts of a request.
"""
from __future__ import annotations

import http.client
import re
import time
from dataclasses import dataclass

DOCUMENT_MAX = 4 << 20  # a ListParts page of 1,000 parts is about 250 KB
ERROR_MAX = 64 << 10  # an S3 error document is well under 1 KiB
READ_PIECE = 1 << 20


@dataclass(frozen=True)
class StoreLimits:
    connect_seconds: float = 10
    silence_seconds: float = 60  # the longest a socket read may wait (botocore's read_timeout)
    slowest_rate: int = 32 << 10  # bytes per second a body must average, beyond silence_seconds of grace
    attempts: int = 3  # botocore's attempts at one request (standard retry mode)

    def answer_seconds(self, length: int) -> float:
        return self.silence_seconds + length / self.slowest_rate


LIMITS = StoreLimits()


class AnswerRefused(Exception):
    """The store answered what no store may: more bytes than asked for, a huge error, a body that never ends."""


def printable(text, limit: int = 200) -> str:
    """A store's words (an error's code or message) as one short line of plain characters."""
    return re.sub(r"[^\x20-\x7e]+", " ", str(text)).strip()[:limit]


def bound_answers(s3, limits: StoreLimits = LIMITS) -> None:
    """Make every answer `s3` (a botocore S3 client) receives bounded, as this module's docstring says."""
    sender = getattr(getattr(s3, "_endpoint", None), "http_session", None)  # botocore's pool, proxies and TLS
    if sender is None or not hasattr(sender, "send"):
        raise RuntimeError("this botocore keeps no http_session on its endpoint: the store's answers cannot be "
                           "bounded")

    def send(request, event_name: str = "", **_):
        streamed = request.stream_output
        request.stream_output = True  # botocore's sender leaves the body unread: it is read here, bounded
        try:
            answer = _send(sender, request)
        finally:
            request.stream_output = streamed
        operation = event_name.rsplit(".", 1)[-1]
        if request.method == "HEAD":  # no body; its Content-Length is the object's
            return answer
        if answer.status_code >= 300:
            return _whole(answer, ERROR_MAX, limits, f"an error answer to {operation} (HTTP {answer.status_code})")
        if not streamed:
            return _whole(answer, DOCUMENT_MAX, limits, f"an answer to {operation}")
        asked = range_length(request.headers.get("Range"))
        declared = _content_length(answer.headers)
        if asked is None:
            asked = DOCUMENT_MAX  # an object read whole: only small ones are (none, today)
        elif declared is not None and declared > asked:
            answer.raw.close()
            raise AnswerRefused(f"the store answered {declared} bytes for a range of {asked}")
        answer.raw = BoundedBody(answer.raw, asked, limits)
        return answer

    s3.meta.events.register_first("before-send.s3", send)


def _send(sender, request):
    from botocore.exceptions import ConnectionClosedError

    try:
        return sender.send(request)
    except ConnectionClosedError as exc:  # urllib3's ProtocolError: a dropped connection, or an answer not HTTP
        inner = getattr(exc, "kwargs", {}).get("error")
        cause = inner.args[-1] if inner is not None and inner.args else None
        if isinstance(cause, http.client.HTTPException) and not isinstance(
                cause, (http.client.RemoteDisconnected, http.client.IncompleteRead)):
            raise AnswerRefused(f"the store's answer is not one HTTP allows ({printable(cause)})") from None
        raise


def range_length(header) -> int | None:
    """The bytes a `Range: bytes=FIRST-LAST` header asks for; None for any other form."""
    if isinstance(header, bytes):  # botocore's prepared headers hold bytes
        header = header.decode("latin-1")
    match = re.fullmatch(r"bytes=(\d+)-(\d+)", (header or "").strip())
    if match is None or int(match.group(2)) < int(match.group(1)):
        return None
    return int(match.group(2)) - int(match.group(1)) + 1


def _content_length(headers) -> int | None:
    value = headers.get("content-length")
    return int(value) if value is not None and str(value).strip().isdigit() else None


def _whole(answer, limit: int, limits: StoreLimits, what: str):
    """The answer with its body read here, at most `limit` bytes, or AnswerRefused."""
    from botocore.awsrequest import AWSResponse

    declared = _content_length(answer.headers)
    if declared is not None and declared > limit:
        answer.raw.close()
        raise AnswerRefused(f"the store sent {what} of {declared} bytes (at most {limit} are read)")
    body = BoundedBody(answer.raw, limit, limits, what=what)
    data = bytearray()
    while piece := body.read(READ_PIECE):
        data += piece
    return AWSResponse(answer.url, answer.status_code, answer.headers, _Read(bytes(data)))


class BoundedBody:
    """An answer's raw body (urllib3's response) that yields at most `limit` bytes within
    limits.answer_seconds(limit), one socket read at a time (a read of n bytes never waits for n: a trickle meets
    the deadline between two reads). `what`: the document or error it is; none for a range of `limit` bytes."""

    def __init__(self, raw, limit: int, limits: StoreLimits, what: str = ""):
        self._raw, self._limit, self._limits, self._what = raw, limit, limits, what
        self._started = time.monotonic()
        self._deadline = self._started + limits.answer_seconds(limit)
        self.got = 0

    def read(self, amt: int | None = None) -> bytes:
        from botocore.exceptions import ReadTimeoutError, ResponseStreamingError
        from urllib3.exceptions import ProtocolError, ReadTimeoutError as Urllib3ReadTimeout

        if amt is None or amt < 0:
            data = bytearray()
            while piece := self.read(READ_PIECE):
                data += piece
            return bytes(data)
        if amt == 0:
            return b""
        if time.monotonic() > self._deadline:
            sent = f"{self._what}: {self.got} bytes" if self._what else f"{self.got} of {self._limit} bytes"
            self._refuse(f"the store sent {sent} in {time.monotonic() - self._started:.0f} s (slower than "
                         f"{self._limits.slowest_rate} bytes/s after {self._limits.silence_seconds:.0f} s)")
        try:  # one byte past the limit is asked for, so that a longer body shows
            chunk = self._raw.read1(min(amt, self._limit - self.got + 1))
        except Urllib3ReadTimeout as exc:
            raise ReadTimeoutError(endpoint_url="the store", error=exc) from None
        except ProtocolError as exc:
            raise ResponseStreamingError(error=exc) from None
        self.got += len(chunk)
        if self.got > self._limit:
            self._refuse(f"the store sent {self._what} of more than {self._limit} bytes" if self._what else
                         f"the store answered more than {self._limit} bytes for a range of {self._limit}")
        return chunk

    def _refuse(self, message: str):
        self.close()
        raise AnswerRefused(message)

    def readinto(self, target) -> int:
        chunk = self.read(len(target))
        target[:len(chunk)] = chunk
        return len(chunk)

    def stream(self, amt: int = READ_PIECE):
        while chunk := self.read(amt):
            yield chunk

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        self._raw.close()

    @property
    def closed(self) -> bool:
        return bool(getattr(self._raw, "closed", False))


class _Read:
    """A body read already, as botocore's AWSResponse reads one (`stream()`)."""

    def __init__(self, data: bytes):
        self._data = data

    def stream(self, *_args, **_kwargs):
        if self._data:
            yield self._data

    def read(self, *_args) -> bytes:
        data, self._data = self._data, b""
        return data

    def close(self) -> None:
        pass
