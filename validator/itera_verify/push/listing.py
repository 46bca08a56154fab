"""The archives under an `s3://bucket/prefix/`: what `assemble` reads a campaign's parts from (each lot pushed
its part there). Listed page by page, bounded; a store error is one line (PushError, exit 2)."""
from __future__ import annotations

from .store import PushError, client, explain, parse_s3

MAX_KEYS = 10_000  # parts of one campaign, or archives of one prefix: far fewer in any real bucket


def list_archives(url: str, suffix: str, endpoint_url: str | None = None) -> list[str]:
    """The `s3://` URLs of the objects under the prefix `url` names whose key ends with `suffix`, sorted."""
    location = parse_s3(url)
    s3 = client(endpoint_url, 1)
    found: list[str] = []
    arguments = {"Bucket": location.bucket, "Prefix": location.key}
    try:
        while True:
            page = s3.list_objects_v2(**arguments)
            for entry in page.get("Contents") or []:
                key = entry.get("Key") if isinstance(entry, dict) else None
                if isinstance(key, str) and key.endswith(suffix):
                    found.append(f"s3://{location.bucket}/{key}")
            if len(found) > MAX_KEYS:
                raise PushError(f"{url}: more than {MAX_KEYS} archives under this prefix; name a narrower one")
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not isinstance(token, str):
                return sorted(found)
            arguments["ContinuationToken"] = token
    except PushError:
        raise
    except Exception as exc:  # noqa: BLE001 - one line
        raise explain(exc, "listing the prefix", url, resume=False) from None
