"""A lying S3 store on loopback: one object, served as S3 does (HEAD, ranged GET with If-Match, 404 for the rest)
until a test asks it to misbehave. Enough of S3 for boto3, no more; bound to 127.0.0.1, stopped by the test.

Misbehaviours (`LyingStore.lie`):
- "oversized": every range answered with `oversize` bytes, their length announced;
- "unannounced": every range answered with `oversize` bytes and no Content-Length (the body ends at close);
- "short": every range one byte short, its length announced;
- "cut": the right Content-Length, half the bytes, then the connection closed;
- "changed": the object replaced once its HEAD is answered (If-Match then fails: 412);
- "ignores-if-match": the object replaced once its HEAD is answered, served under its new ETag regardless;
- "redirect": every GET sent elsewhere (307 to `redirect_to`);
- "error-body": every GET refused with an XML error of `oversize` bytes, its length announced;
- "error-unannounced": the same error with no Content-Length (the body ends at close);
- "slow": the right Content-Length, then one byte every `trickle` seconds, forever;
- "stall": the right Content-Length, then nothing, forever;
- "many-headers": HEAD answered with 1,000 metadata headers.
"""
from __future__ import annotations

import hashlib
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

BLOCK = b"\x5a" * (1 << 20)  # the filler of oversized answers: sent again and again, never built whole


class LyingStore:
    def __init__(self, data: bytes, bucket: str = "reviews", key: str = "campaign.tar.zst", *,
                 lie: str | None = None, oversize: int = 0, trickle: float = 0.2, redirect_to: str = ""):
        self.objects = {(bucket, key): data}
        self.bucket, self.key = bucket, key
        self.lie, self.oversize, self.trickle, self.redirect_to = lie, oversize, trickle, redirect_to
        self.ranges_served = 0
        self.requests: list[str] = []
        self._stopped = threading.Event()
        store = self

        class Handler(_Handler):
            pass

        Handler.store = store
        self._server = _Server(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.key}"

    def etag(self) -> str:
        return '"' + hashlib.md5(self.objects[(self.bucket, self.key)]).hexdigest() + '"'

    def stop(self) -> None:
        self._stopped.set()
        self._server.shutdown()
        self._server.server_close()


class _Server(ThreadingHTTPServer):
    def handle_error(self, request, client_address) -> None:  # a client that hangs up is what the tests do
        pass


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    store: LyingStore

    def log_message(self, *args) -> None:  # quiet
        pass

    def _target(self):
        parts = urlsplit(self.path)
        bucket, _, key = unquote(parts.path).lstrip("/").partition("/")
        return bucket, key, parse_qs(parts.query, keep_blank_values=True)

    def _drain(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)

    def _error(self, status: int, code: str, body: bytes | None = None) -> None:
        body = body if body is not None else (f"<?xml version='1.0' encoding='UTF-8'?>\n<Error><Code>{code}</Code>"
                                              f"<Message>{code}</Message></Error>").encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_PUT(self) -> None:  # nothing is written to a lying store
        self._drain()
        self._error(403, "AccessDenied")

    def do_HEAD(self) -> None:
        store = self.store
        store.requests.append(f"HEAD {self.path}")
        bucket, key, _ = self._target()
        data = store.objects.get((bucket, key))
        if data is None:
            return self._error(404, "NoSuchKey")
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("ETag", store.etag())
        self.send_header("Last-Modified", "Mon, 07 Dec 2026 10:00:00 GMT")
        if store.lie == "many-headers":
            for n in range(1000):
                self.send_header(f"x-amz-meta-field{n}", "x" * 60)
        self.end_headers()
        if store.lie in ("changed", "ignores-if-match") and (bucket, key) == (store.bucket, store.key):
            store.objects[(bucket, key)] = bytes(b ^ 0xFF for b in data[:64]) + data[64:]

    def do_GET(self) -> None:
        store = self.store
        store.requests.append(f"GET {self.path}")
        bucket, key, query = self._target()
        data = store.objects.get((bucket, key))
        if "tagging" in query or data is None:
            return self._error(404, "NoSuchTagSet" if data is not None else "NoSuchKey")
        if store.lie == "redirect":
            self.send_response(307)
            self.send_header("Location", store.redirect_to + self.path)
            self.send_header("Content-Length", "0")
            return self.end_headers()
        if store.lie in ("error-body", "error-unannounced"):
            return self._huge_error(store.lie == "error-body")
        if store.lie == "changed" and self.headers.get("If-Match") not in (None, store.etag()):
            return self._error(412, "PreconditionFailed")
        start, end = _range(self.headers.get("Range"), len(data))
        store.ranges_served += 1
        body = data[start:end + 1]
        self.send_response(206)
        self.send_header("ETag", store.etag())
        self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
        if store.lie in ("oversized", "unannounced"):
            return self._oversized(store.lie == "oversized")
        if store.lie in ("slow", "stall"):
            return self._slow(len(body), store.lie == "slow")
        if store.lie == "short":
            body = body[:-1]
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if store.lie == "cut":
            self.wfile.write(body[:len(body) // 2])
            self.close_connection = True
            return
        self.wfile.write(body)

    def _oversized(self, announced: bool) -> None:
        if announced:
            self.send_header("Content-Length", str(self.store.oversize))
        else:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self._send_filler(self.store.oversize)

    def _huge_error(self, announced: bool) -> None:
        head = b"<?xml version='1.0' encoding='UTF-8'?>\n<Error><Code>AccessDenied</Code><Message>"
        tail = b"</Message></Error>"
        self.send_response(403)
        self.send_header("Content-Type", "application/xml")
        if announced:
            self.send_header("Content-Length", str(len(head) + self.store.oversize + len(tail)))
        else:
            self.send_header("Connection", "close")
        self.end_headers()
        try:
            self.wfile.write(head)
            self._send_filler(self.store.oversize)
            self.wfile.write(tail)
        except OSError:
            self.close_connection = True

    def _send_filler(self, count: int) -> None:
        try:
            while count > 0 and not self.store._stopped.is_set():
                piece = BLOCK[:count]
                self.wfile.write(piece)
                count -= len(piece)
        except OSError:  # the client stopped reading: what the test wants
            pass
        self.close_connection = True

    def _slow(self, length: int, trickle: bool) -> None:
        self.send_header("Content-Length", str(length))
        self.end_headers()
        try:
            while not self.store._stopped.wait(self.store.trickle):
                if trickle:
                    self.wfile.write(b"x")
                    self.wfile.flush()
        except OSError:
            pass
        self.close_connection = True


def _range(header: str | None, size: int) -> tuple[int, int]:
    if not header or not header.startswith("bytes="):
        return 0, size - 1
    first, _, last = header[len("bytes="):].partition("-")
    return int(first), min(int(last) if last else size - 1, size - 1)
