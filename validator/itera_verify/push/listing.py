"""The objects under an `s3://bucket/prefix/` (`audit s3://bucket/prefix/`; the parts `assemble` reads), and a
batch's stored reports (`--results s3://…/`).

A listing is the store's answer, so it is bounded like every other (answers.py bounds each page's bytes): at most
MAX_PAGES pages and MAX_KEYS keys, each key at most MAX_KEY_BYTES (S3's own limit), every key under the prefix
asked for, a continuation token that changes from page to page. Past a bound the listing stops with one line
(PushError, exit 2): a batch never audits a listing it could not read whole.
"""
from __future__ import annotations

from dataclasses import dataclass

from .answers import printable
from .ranged import read_start
from .store import PushError, client, error_code, explain, parse_s3

MAX_PAGES = 10_000  # pages of up to 1,000 keys
MAX_KEYS = 1_000_000
MAX_KEY_BYTES = 1024  # S3 refuses longer keys
MAX_OBJECT_SIZE = 5 << 40  # S3's largest object
RESULT_MAX = 64 << 20  # a stored report: a package of 20,000 files with findings stays far below
LISTING = "listing the prefix"


@dataclass(frozen=True)
class Listed:
    key: str
    size: int


def list_prefix(url: str, endpoint_url: str | None = None) -> list[Listed]:
    """Every object under `s3://bucket/prefix/`, sorted by key. PushError (exit 2) when the store cannot be read
    or answers past the bounds."""
    location = parse_s3(url)
    s3 = client(endpoint_url, 1)
    found: list[Listed] = []
    token, seen_tokens = None, set()
    for _page in range(MAX_PAGES):
        arguments = {"Bucket": location.bucket, "Prefix": location.key, "MaxKeys": 1000}
        if token:
            arguments["ContinuationToken"] = token
        try:
            answer = s3.list_objects_v2(**arguments)
        except Exception as exc:  # noqa: BLE001 - one line
            if error_code(exc) == "NoSuchBucket":
                raise PushError(f"{url}: no such bucket") from None
            raise explain(exc, LISTING, url, resume=False) from None
        for entry in answer.get("Contents") or []:
            found.append(_listed(entry, location.key, url))
            if len(found) > MAX_KEYS:
                raise PushError(f"{url}: more than {MAX_KEYS:,} objects under the prefix (list fewer: a longer "
                                "prefix, or @list.txt)")
        if not answer.get("IsTruncated"):
            return sorted(found, key=lambda listed: listed.key)
        token = answer.get("NextContinuationToken")
        if not isinstance(token, str) or not token or token in seen_tokens or len(token) > 4096:
            raise PushError(f"{url}: the store's listing does not move on (continuation token "
                            f"{printable(token, 60)!r}) while {LISTING}")
        seen_tokens.add(token)
    raise PushError(f"{url}: the listing did not end within {MAX_PAGES:,} pages")


def _listed(entry, prefix: str, url: str) -> Listed:
    key, size = entry.get("Key") if isinstance(entry, dict) else None, entry.get("Size") if isinstance(
        entry, dict) else None
    if not isinstance(key, str) or not key.startswith(prefix) or len(key.encode("utf-8", "replace")) > MAX_KEY_BYTES:
        raise PushError(f"{url}: the store listed a key outside the prefix or longer than {MAX_KEY_BYTES} bytes "
                        f"({printable(key, 80)!r})")
    if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= MAX_OBJECT_SIZE:
        raise PushError(f"{url}: the store listed {printable(key, 80)!r} with a size of {printable(size, 40)}")
    return Listed(key, size)


def list_archives(url: str, suffix: str, endpoint_url: str | None = None) -> list[str]:
    """The `s3://` URLs of the objects under the prefix `url` names whose key ends with `suffix`, sorted: what
    `assemble` reads a campaign's parts from (each lot pushed its part there)."""
    bucket = parse_s3(url).bucket
    return [f"s3://{bucket}/{listed.key}" for listed in list_prefix(url, endpoint_url) if listed.key.endswith(suffix)]


def read_object(url: str, endpoint_url: str | None = None, limit: int = RESULT_MAX) -> bytes | None:
    """A small object (a stored report): at most `limit` bytes, or None when there is none or it is larger (a
    result is the reviewer's own earlier output: one that is not what was written is audited again)."""
    location = parse_s3(url)
    s3 = client(endpoint_url, 1)
    try:
        data = read_start(s3, location.bucket, location.key, limit)
    except Exception as exc:  # noqa: BLE001 - a missing result is no error; the rest is one line
        if error_code(exc) in ("NoSuchKey", "404", "InvalidRange"):
            return None
        raise explain(exc, "reading a stored result", url, resume=False) from None
    return data if data is not None and len(data) <= limit else None


def write_object(url: str, data: bytes, endpoint_url: str | None = None) -> None:
    """Store `data` at `url` (a report under --results s3://…/). PushError (exit 2) when the store refuses."""
    location = parse_s3(url)
    s3 = client(endpoint_url, 1)
    try:
        s3.put_object(Bucket=location.bucket, Key=location.key, Body=data, ContentType="application/json")
    except Exception as exc:  # noqa: BLE001 - one line
        raise explain(exc, "storing a result", url, resume=False) from None


__all__ = ["Listed", "MAX_KEYS", "RESULT_MAX", "list_archives", "list_prefix", "read_object", "write_object"]
