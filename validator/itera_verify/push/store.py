"""The S3 side: where DEST points, a boto3 client configured for it, and every store error in one line.

boto3 finds the credentials and the endpoint the standard way (environment, ~/.aws/config and credentials,
AWS_ENDPOINT_URL); `--endpoint-url` overrides the endpoint. Its default flexible checksums are switched to
"when required": this code sends the checksums itself (Content-MD5 on every part, CRC64NVME where the store
takes it), because the SDK's default trailing CRC32 breaks several S3-compatible stores.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..model import UsageError
from .answers import LIMITS, AnswerRefused, StoreLimits, bound_answers, printable


class PushError(UsageError):
    """The push could not run or could not finish (exit 2): no credentials, an unreachable store, access denied."""


class DestinationRefused(PushError):
    """DEST cannot take this archive as given (the archive's own folder): pushing again there cannot help."""


class PushUnverified(Exception):
    """The remote copy differs from the archive, or could not be proven equal (exit 1). No receipt is written."""


@dataclass(frozen=True)
class S3Location:
    bucket: str
    key: str  # for a destination: the prefix ("" or ending in "/")

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.key}"


def parse_s3(url: str) -> S3Location:
    """`s3://bucket[/prefix/...]`: the bucket and the rest, as given."""
    rest = url[len("s3://"):]
    bucket, _, key = rest.partition("/")
    if not bucket or any(c in bucket for c in " \\?#") or "\n" in key:
        raise PushError(f"{url}: not an s3://bucket/prefix/ destination")
    return S3Location(bucket, key)


def is_s3(value) -> bool:
    return isinstance(value, str) and value.startswith("s3://")


def s3_destination(url: str, archive_name: str) -> S3Location:
    """DEST is a folder in the bucket: the archive keeps its name under the prefix."""
    location = parse_s3(url)
    prefix = location.key if not location.key or location.key.endswith("/") else location.key + "/"
    return S3Location(location.bucket, prefix + archive_name)


def folder_destination(dest: str | os.PathLike) -> Path:
    folder = Path(dest)
    if not folder.is_dir():
        raise PushError(f"{dest}: no such folder (DEST is s3://bucket/prefix/ or an existing folder)")
    return folder


_CLIENTS: dict = {}  # one client per endpoint, pool size and AWS environment, for the life of the process
# A forked child (an audit of a batch) makes its own: a pool's sockets shared with the parent would mix answers.
os.register_at_fork(after_in_child=_CLIENTS.clear)


def client(endpoint_url: str | None, connections: int, limits: StoreLimits = LIMITS):
    """A boto3 S3 client whose every answer is bounded (answers.py), or PushError when boto3 is missing or no
    credentials are found. Made once per process for the same endpoint, pool, limits and AWS environment
    (thread-safe): making one loads the S3 service model, about 0.15 s of CPU, which `--push` otherwise paid twice
    (checking the destination, then the upload beside the seal)."""
    pool = max(10, connections + 2)
    key = (endpoint_url, pool, limits, tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("AWS_"))))
    if key not in _CLIENTS:
        _CLIENTS[key] = _new_client(endpoint_url, pool, limits)
    return _CLIENTS[key]


def _new_client(endpoint_url: str | None, pool: int, limits: StoreLimits):
    try:
        import boto3
        from botocore.config import Config
    except ImportError:
        raise PushError("pushing to S3 needs boto3: pip install 'itera-verify[push]'") from None
    session = boto3.session.Session()
    if session.get_credentials() is None:
        raise PushError("no AWS credentials found (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE or "
                        "~/.aws/credentials)")
    config = Config(request_checksum_calculation="when_required", response_checksum_validation="when_required",
                    retries={"mode": "standard", "max_attempts": limits.attempts},
                    connect_timeout=limits.connect_seconds, read_timeout=limits.silence_seconds,
                    max_pool_connections=pool,
                    # An S3-compatible endpoint (MinIO, SeaweedFS, a bare IP) rarely resolves bucket subdomains.
                    s3={"addressing_style": "path"} if endpoint_url or _endpoint_from_environment() else None)
    try:
        s3 = session.client("s3", endpoint_url=endpoint_url or None, config=config,
                            region_name=session.region_name or "us-east-1")
    except ValueError as exc:  # botocore: "Invalid endpoint: ..."
        source = (f"--endpoint-url {endpoint_url}" if endpoint_url else
                  "the endpoint from the AWS environment or config (AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, "
                  "endpoint_url)")
        raise PushError(f"{source}: {exc}") from None
    try:
        bound_answers(s3, limits)
    except RuntimeError as exc:
        raise PushError(f"botocore {_botocore_version()}: {exc}") from None
    return s3


def _botocore_version() -> str:
    import botocore

    return botocore.__version__


def require_awscrt() -> None:
    """awscrt computes every part's CRC64NVME and the archive's as the seal reads it back: PushError when it is
    missing or does not import (botocore has imported a sound one by the time a client exists)."""
    try:
        import awscrt.checksums  # noqa: F401
    except ImportError:
        raise PushError("pushing to S3 needs awscrt: pip install 'itera-verify[push]'") from None


def _endpoint_from_environment() -> bool:
    return bool(os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL"))


# Codes a store answers when it does not take the flexible checksum headers (x-amz-checksum-*, x-amz-sdk-...).
CHECKSUM_REFUSED = {"InvalidArgument", "NotImplemented", "InvalidRequest", "BadRequest", "UnsupportedOperation",
                    "XNotImplemented", "MalformedXML", "InvalidChecksum"}
# The bytes the store received are not the bytes sent (a part changed in flight): send it again.
DIGEST_MISMATCH = {"BadDigest", "InvalidDigest", "XAmzContentChecksumMismatch", "ContentMD5Mismatch",
                   "InvalidPartChecksum"}
DENIED = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "AllAccessDisabled", "AccountProblem",
          "ExpiredToken", "InvalidToken", "Forbidden", "403"}
FULL = {"QuotaExceeded", "EntityTooLarge", "InsufficientStorage", "StorageFull", "507"}


RESUME = "run the same command again to resume"  # what `push` says after a lost connection


def error_code(exc) -> str:
    response = getattr(exc, "response", None) or {}
    return printable((response.get("Error") or {}).get("Code") or "", 100)


def is_client_error(exc) -> bool:
    from botocore.exceptions import ClientError

    return isinstance(exc, ClientError)


def is_connection_error(exc) -> bool:
    from botocore.exceptions import ConnectionError as BotoConnectionError
    from botocore.exceptions import HTTPClientError

    return isinstance(exc, (BotoConnectionError, HTTPClientError, ConnectionError, TimeoutError))


def explain(exc, what: str, where: str, *, resume: bool = True) -> PushError:
    """One line for a store error that stops the push or the audit (exit 2). `resume`: a push, which the same
    command resumes after a lost connection (never said of an audit)."""
    from botocore.exceptions import BotoCoreError, NoCredentialsError, PartialCredentialsError

    if isinstance(exc, AnswerRefused):  # the store answered, wrongly: nothing to resume
        return PushError(f"{where}: {exc} while {what}")
    code = error_code(exc)
    if isinstance(exc, (NoCredentialsError, PartialCredentialsError)):
        return PushError(f"{where}: no usable AWS credentials ({exc})")
    if code in DENIED:
        return PushError(f"{where}: access denied while {what} ({code}); check the credentials and the "
                         "bucket's policy")
    if code in ("NoSuchBucket", "404") and what.startswith(("creating", "checking")):
        return PushError(f"{where}: no such bucket")
    if code in FULL:
        return PushError(f"{where}: the store refused the data while {what} ({code}: it is full or over quota)")
    if is_connection_error(exc):
        return PushError(f"{where}: the store cannot be reached while {what} ({_first_line(exc)})"
                         + (f"; {RESUME}" if resume else ""))
    if code:
        message = printable((getattr(exc, "response", {}).get("Error") or {}).get("Message") or "")
        return PushError(f"{where}: the store answered {code} while {what}" + (f" ({message})" if message else ""))
    if isinstance(exc, BotoCoreError):
        return PushError(f"{where}: {what} failed ({_first_line(exc)})")
    return PushError(f"{where}: {what} failed ({_first_line(exc)})")


def _first_line(exc) -> str:
    text = str(exc).strip().splitlines()
    return printable(text[0] if text else type(exc).__name__, 300)
