"""Nothing in the bucket (or the folder) is overwritten by another archive: two seals of one campaign share a
name, and a push of the second must not silently replace the first.

A key (a file) that holds a different object refuses the push (exit 1, both SHA-256s named) unless
`--overwrite`. On S3 the refusal is checked before the first part is sent, and made atomic at the completion:
`If-None-Match: *` on CompleteMultipartUpload (and on a single PUT) where the store takes it, so a push that
raced another one fails there instead of replacing it; a store that refuses the header is checked again just
before the completion instead. In a folder the copy takes its name with a hard link, which never replaces a file.
"""
from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

from ..archive.publish import publish
from ..format.push import CHECKSUM_SUFFIX
from .store import PushUnverified, S3Location, error_code, explain

# What stores answer to a header they do not implement (the request is then made without it).
CONDITION_UNSUPPORTED = ("NotImplemented", "501", "InvalidArgument", "InvalidRequest", "NotSupported")
CONDITION_FAILED = ("PreconditionFailed", "412", "ConditionalRequestConflict", "409")
SIDECAR_READ = 4096


class Occupied(PushUnverified):
    """The destination already holds another archive under this name (exit 1)."""


def refusal(where: str, theirs: str, ours: str) -> Occupied:
    return Occupied(f"{where} already holds another archive (sha256 {theirs}); this archive is sha256 {ours}: "
                    "refused, nothing was replaced (another seal of the same campaign?); pass --overwrite to "
                    "replace it, or push to another prefix")


# ---- S3 ------------------------------------------------------------------------------------------------
def s3_occupant(s3, location: S3Location, sha256: str) -> str | None:
    """The SHA-256 (or what is known of it) of the object at `location` when it is not this archive; None when
    the key is free or holds this very archive (its recorded SHA-256 is this one)."""
    from .remote import recorded_sha256

    try:
        head = s3.head_object(Bucket=location.bucket, Key=location.key)
    except Exception as exc:  # noqa: BLE001 - classified below
        if error_code(exc) in ("404", "NoSuchKey", "NotFound"):
            return None
        raise explain(exc, "checking the destination key", location.url) from None
    in_metadata, tag = recorded_sha256(s3, location, head)
    recorded = (in_metadata or tag or _s3_sidecar_sha256(s3, location) or "").lower()
    if recorded == sha256:
        return None
    return recorded or f"not recorded ({head.get('ContentLength')} bytes)"


def _s3_sidecar_sha256(s3, location: S3Location) -> str | None:
    from .ranged import read_start

    try:
        text = read_start(s3, location.bucket, location.key + CHECKSUM_SUFFIX, SIDECAR_READ)
    except Exception:  # noqa: BLE001 - no sidecar: the SHA-256 is not recorded
        return None
    match = re.match(rb"\\?([0-9a-fA-F]{64})", text or b"")
    return match.group(1).decode() if match else None


def refuse_if_occupied(s3, location: S3Location, sha256: str, overwrite: bool) -> bool:
    """Before anything is sent: Occupied when the key holds another archive and `overwrite` is off. Returns
    whether the completion may ask for If-None-Match (the key is free now)."""
    if overwrite:
        return False
    theirs = s3_occupant(s3, location, sha256)
    if theirs is not None:
        raise refusal(location.url, theirs, sha256)
    return _key_free(s3, location)


def _key_free(s3, location: S3Location) -> bool:
    try:
        s3.head_object(Bucket=location.bucket, Key=location.key)
    except Exception:  # noqa: BLE001 - absent (or unreadable: the completion says why)
        return True
    return False  # this very archive is there already: completing replaces it with the same bytes


def complete(s3, arguments: dict, location: S3Location, sha256: str, overwrite: bool, abort) -> dict:
    """CompleteMultipartUpload, never replacing another archive: refused before (checked now) and, where the store
    takes If-None-Match, atomically; `abort()` drops the upload when refused."""
    try:
        conditional = refuse_if_occupied(s3, location, sha256, overwrite)
    except Occupied:
        abort()
        raise
    if conditional:
        try:
            return s3.complete_multipart_upload(**arguments, IfNoneMatch="*")
        except Exception as exc:  # noqa: BLE001 - classified below
            code = error_code(exc)
            if code in CONDITION_FAILED:  # another push took the key since the check: nothing replaced
                abort()
                theirs = s3_occupant(s3, location, sha256) or "unknown"
                raise refusal(location.url, theirs, sha256) from None
            if code not in CONDITION_UNSUPPORTED:
                raise
    return s3.complete_multipart_upload(**arguments)


# ---- a folder ------------------------------------------------------------------------------------------
def file_sha256(path: Path) -> str:
    with open(path, "rb") as reader:
        return hashlib.file_digest(reader, "sha256").hexdigest()


def take_name(partial: Path, destination: Path, sha256: str, overwrite: bool) -> None:
    """`partial` (verified) becomes `destination` (archive/publish.py: a hard link, which fails rather than
    replace a file another push put there meanwhile); a name already holding this very archive is taken over."""
    try:
        publish(partial, destination, overwrite)
    except FileExistsError:
        theirs = file_sha256(destination) if destination.is_file() else "not a file"
        if theirs != sha256:
            raise refusal(str(destination), theirs, sha256) from None
        os.replace(partial, destination)  # the same bytes: a push run again


def refuse_folder_if_occupied(destination: Path, sha256: str, overwrite: bool) -> None:
    """Before the copy: the name holds a file of other bytes (its size differs, or its SHA-256)."""
    if overwrite or not os.path.lexists(destination):
        return
    theirs = file_sha256(destination) if destination.is_file() else "not a file"
    if theirs != sha256:
        raise refusal(str(destination), theirs, sha256)
