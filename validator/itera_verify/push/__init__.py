"""Leaving the machine (docs/integration.md): push a sealed archive to S3 or a folder, verified, with a receipt.

The archive goes first (multipart.py: resumable, parallel parts, checked by the store), is proven equal to the
local bytes (the store's CRC64NVME of the whole object, or the object read back and hashed when the store keeps
no checksum or `--read-back` asks), then its `.sha256` and `.sig` when there is one, and the receipt last. The
receipt is written only once the copy is proven equal: never for a copy that was not verified.

Errors: PushError (exit 2, the push could not run or finish: credentials, reachability, access, a full store)
and PushUnverified (exit 1, the remote copy differs or could not be proven equal). This is the only code that
knows S3; the journal's and the receipt's names are in format/push.py.
"""
from __future__ import annotations

import base64
import hashlib
import json
import re
import stat as stat_module
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from ..format.push import (CHECKSUM_FILE_MAX, CHECKSUM_LOCAL, CHECKSUM_SUFFIX, DEFAULT_PART_SIZE, METADATA_SHA256,
                           PROBE_TAG, RECEIPT_FORMAT, SIGNATURE_SUFFIX, VERIFIED_BY_READ_BACK, VERIFIED_BY_STORE_CRC,
                           receipt_name)
from ..format.sshsig import MAX_SIGNATURE_FILE
from ..runtime.progress import NULL_PROGRESS, Progress
from .store import PushError, PushUnverified, S3Location, is_s3

__all__ = ["PushError", "PushResult", "PushUnverified", "check_destination", "is_s3", "push", "seal_follower"]


@dataclass
class PushResult:
    receipt: dict
    receipt_path: Path
    parts: int = 1
    parts_reused: int = 0
    overlapped: bool = False  # sent while the seal wrote the archive (push/follow.py)
    sha256_tagged: bool | None = None  # overlapped: the SHA-256 went into the object's tag (False: no tags there)
    deadline: dict | None = None  # what the first parts predicted against the rental's end (push/deadline.py)

    def to_json(self) -> dict:
        extra = {"overlapped_with_seal": self.overlapped} if self.overlapped else {}
        if self.sha256_tagged is not None:
            extra["sha256_tagged"] = self.sha256_tagged
        if self.deadline is not None:
            extra["deadline"] = self.deadline
        return {**self.receipt, "receipt_path": str(self.receipt_path), "parts": self.parts,
                "parts_reused": self.parts_reused, **extra}


def push(archive, dest, *, endpoint_url: str | None = None, read_back: bool = False, jobs: int = 4,
         part_size: int = DEFAULT_PART_SIZE, progress: Progress = NULL_PROGRESS, deadline: float | None = None,
         warn=None, overwrite: bool = False) -> PushResult:
    """Send `archive` (with its sidecars, the receipt last) to `dest`: `s3://bucket/prefix/` or a folder.
    `deadline` (seconds since the epoch, the rental's end): the first parts' throughput predicts the end of the
    upload, and `warn` (default: progress.log) hears at once when it falls after the deadline. Another archive
    already under the same name is never replaced unless `overwrite` (occupied.py: exit 1 otherwise)."""
    from .deadline import DeadlineWatch

    started, uploaded_at = time.monotonic(), _now()
    archive = Path(archive)
    _check_archive(archive)
    sha256, sidecars = archive_sidecars(archive)
    if is_s3(str(dest)):
        watch = DeadlineWatch(deadline, warn or progress.log)
        result = _push_s3(archive, str(dest), sha256, sidecars, endpoint_url=endpoint_url, read_back=read_back,
                          jobs=jobs, part_size=part_size, progress=progress, started=started,
                          uploaded_at=uploaded_at, watch=watch, overwrite=overwrite)
        result.deadline = watch.facts()
        return result
    return _push_folder(archive, dest, sha256, sidecars, progress=progress, started=started,
                        uploaded_at=uploaded_at, overwrite=overwrite)


def seal_follower(dest, **options):
    """For `OUTDIR --push DEST`: a follower that uploads the archive while the seal writes it (follow.py), or
    copies it into a folder while the seal writes it (local.FolderFollower)."""
    if not is_s3(str(dest)):
        from .local import FolderFollower

        return FolderFollower(dest, **options)
    from .follow import SealFollower

    return SealFollower(str(dest), **options)


def check_destination(dest) -> None:
    """Before anything else, what costs nothing to check: a folder that is not there, an s3:// address that cannot
    be one. The libraries, the credentials and the endpoint are the follower's connect(), once the checks' child is
    forked (making a client imports boto3 and reads the S3 service model, ~0.35 s that the checks then overlap)."""
    from .store import folder_destination, parse_s3

    if is_s3(str(dest)):
        parse_s3(str(dest))
    else:
        folder_destination(dest)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def archive_sidecars(archive: Path) -> tuple[str, list[tuple[str, bytes]]]:
    """The archive's SHA-256 (its `.sha256`) and what goes beside it: `.sha256`, then `.sig` when signed."""
    sha256, checksum_text = _archive_sha256(archive)
    sidecars = [(archive.name + CHECKSUM_SUFFIX, checksum_text)]
    signature = _read_beside(archive.with_name(archive.name + SIGNATURE_SUFFIX), MAX_SIGNATURE_FILE,
                             "an OpenSSH signature")
    if signature is not None:
        sidecars.append((archive.name + SIGNATURE_SUFFIX, signature))
    return sha256, sidecars


def _read_beside(path: Path, limit: int, what: str) -> bytes | None:
    from .beside import NotSmallFile, read_beside

    try:
        return read_beside(path, limit)
    except NotSmallFile as exc:
        raise PushError(f"{path}: not {what} ({exc.strerror})") from None
    except OSError as exc:
        raise PushError(f"{path}: cannot read ({exc.strerror or exc})") from None


def _check_archive(archive: Path) -> None:
    try:
        mode = archive.stat().st_mode
    except FileNotFoundError:
        raise PushError(f"{archive}: no such file") from None
    except OSError as exc:
        raise PushError(f"{archive}: cannot read ({exc.strerror or exc})") from None
    if not stat_module.S_ISREG(mode):
        raise PushError(f"{archive}: not a regular file (give the sealed .tar.zst archive)")


_CHECKSUM_LINE = re.compile(r"\\?([0-9a-fA-F]{64}) [ *](.+)\n?")


def _archive_sha256(archive: Path) -> tuple[str, bytes]:
    """The SHA-256 the seal wrote beside the archive (the upload compares the bytes it sends with it before the
    object exists), or, without `.sha256`, one computed now."""
    beside = archive.with_name(archive.name + CHECKSUM_SUFFIX)
    text = _read_beside(beside, CHECKSUM_FILE_MAX, f"`<sha256>  {archive.name}`")
    if text is None:
        with open(archive, "rb") as reader:
            digest = hashlib.file_digest(reader, "sha256").hexdigest()
        return digest, f"{digest}  {archive.name}\n".encode()
    match = _CHECKSUM_LINE.fullmatch(text.decode("utf-8", "replace"))
    if match is None or match.group(2) != archive.name:
        raise PushError(f"{beside}: not `<sha256>  {archive.name}` (the seal writes it so)")
    return match.group(1).lower(), text


def _receipt(destination: str, key: str, *, version_id, etag, size: int, sha256: str, crc: int | None, checksum: str,
             uploaded_at: str, started: float, verified_by: str, sidecars: list, endpoint: str | None) -> dict:
    from .multipart import crc_base64

    return {"format": RECEIPT_FORMAT, "destination": destination, "endpoint": endpoint, "key": key,
            "version_id": version_id, "etag": etag, "bytes": size, "sha256": sha256,
            "crc64nvme": None if crc is None else crc_base64(crc),
            "checksum": checksum, "uploaded_at": uploaded_at, "seconds": round(time.monotonic() - started, 3),
            "verified_by": verified_by, "sidecars": [name for name, _ in sidecars]}


def _write_receipt_here(archive: Path, receipt: dict) -> tuple[Path, bytes]:
    """The receipt beside the archive, written anew from this push's facts (whatever was there before is never
    read: nothing of an old receipt steers a push)."""
    from .beside import write_beside

    path = archive.with_name(receipt_name(archive.name))
    data = (json.dumps(receipt, indent=2) + "\n").encode("utf-8")
    try:
        write_beside(path, data)
    except OSError as exc:
        raise PushError(f"{path}: cannot write the receipt ({exc.strerror or exc})") from None
    return path, data


# ---- a folder ------------------------------------------------------------------------------------------
def _push_folder(archive: Path, dest, sha256: str, sidecars: list, *, progress: Progress, started: float,
                 uploaded_at: str, overwrite: bool = False) -> PushResult:
    from .local import copy_verified
    from .store import folder_destination

    folder = folder_destination(dest)
    _, size, crc = copy_verified(archive, folder, expected_sha256=sha256, progress=progress, overwrite=overwrite)
    return finish_folder(archive, folder, sha256, sidecars, size=size, crc=crc, started=started,
                         uploaded_at=uploaded_at)


def finish_folder(archive: Path, folder: Path, sha256: str, sidecars: list, *, size: int, crc: int | None,
                  started: float, uploaded_at: str, overlapped: bool = False) -> PushResult:
    """After the copy took its name (verified): the sidecars, then the receipt (last)."""
    from .local import write_small

    for name, data in sidecars:
        write_small(folder, name, data)
    receipt = _receipt(str(folder.resolve()), archive.name, version_id=None, etag=None, size=size, sha256=sha256,
                       crc=crc, checksum=CHECKSUM_LOCAL, uploaded_at=uploaded_at, started=started,
                       verified_by=VERIFIED_BY_READ_BACK, sidecars=sidecars, endpoint=None)
    path, data = _write_receipt_here(archive, receipt)
    write_small(folder, path.name, data)
    return PushResult(receipt, path, overlapped=overlapped)


# ---- S3 ------------------------------------------------------------------------------------------------
def _push_s3(archive: Path, dest: str, sha256: str, sidecars: list, *, endpoint_url, read_back: bool, jobs: int,
             part_size: int, progress: Progress, started: float, uploaded_at: str, watch,
             overwrite: bool = False) -> PushResult:
    from . import multipart
    from .store import client, s3_destination

    location = s3_destination(dest, archive.name)
    s3 = client(endpoint_url, jobs)
    endpoint = s3.meta.endpoint_url
    uploaded = multipart.upload(s3, archive, location, sha256=sha256, endpoint=endpoint, jobs=jobs,
                                part_size=part_size, progress=progress, watch=watch, overwrite=overwrite)
    return finish_s3(s3, archive, location, uploaded, sha256, sidecars, read_back=read_back, jobs=jobs,
                     started=started, uploaded_at=uploaded_at, endpoint=endpoint)


def finish_s3(s3, archive: Path, location: S3Location, uploaded, sha256: str, sidecars: list, *, read_back: bool,
              jobs: int, started: float, uploaded_at: str, endpoint: str | None,
              overlapped: bool = False) -> PushResult:
    """After the upload completed: prove the object equal, send the sidecars, then the receipt (last). An
    upload that overlapped the seal (or resumes one) began before the SHA-256 was known: once the object is
    proven equal it goes into a tag instead of the metadata, where the store keeps tags apart from the bytes
    (tried on `.sha256` first; a store without such tags keeps it only in `.sha256` and the receipt), and the
    object's size, and CRC64NVME where the store returns one, are checked again after the tagging."""
    size = archive.stat().st_size
    prefix = location.key[:-len(archive.name)]
    verified_by, in_metadata = _verify_object(s3, location, size=size, sha256=sha256, crc=uploaded.crc64nvme,
                                              returned_crc=uploaded.store_crc64nvme, etag=uploaded.etag,
                                              version_id=uploaded.version_id, read_back=read_back, jobs=jobs)
    tagged, to_send = None, sidecars
    if not in_metadata:  # `.sha256` (it always leads the sidecars) first: the store's tagging is tried on it
        name, data = sidecars[0]
        checksum_file = S3Location(location.bucket, prefix + name)
        _put_small(s3, checksum_file, data)
        to_send = sidecars[1:]
        tagged = _tags_kept_apart(s3, checksum_file, data, sha256) and \
            _tag_sha256(s3, location, sha256, uploaded.version_id)
        if tagged:
            _still_equal(s3, location, size=size, crc=uploaded.crc64nvme, version_id=uploaded.version_id)
    if to_send:
        with ThreadPoolExecutor(max_workers=2, thread_name_prefix="push-sidecar") as pool:  # side by side
            for future in [pool.submit(_put_small, s3, S3Location(location.bucket, prefix + name), data)
                           for name, data in to_send]:
                future.result()
    receipt = _receipt(f"s3://{location.bucket}/{prefix}", location.key,
                       version_id=uploaded.version_id, etag=uploaded.etag, size=size, sha256=sha256,
                       crc=uploaded.crc64nvme, checksum=uploaded.checksum, uploaded_at=uploaded_at, started=started,
                       verified_by=verified_by, sidecars=sidecars, endpoint=endpoint)
    path, data = _write_receipt_here(archive, receipt)
    _put_small(s3, S3Location(location.bucket, prefix + path.name), data)
    return PushResult(receipt, path, parts=uploaded.parts, parts_reused=uploaded.parts_reused,
                      overlapped=overlapped, sha256_tagged=tagged)


def _tags_kept_apart(s3, sidecar: S3Location, data: bytes, sha256: str) -> bool:
    """Whether the store keeps a tag apart from the object's bytes, tried on the `.sha256` sidecar just sent:
    `rclone serve s3` stores a PutObjectTagging request's XML as the object itself, and tagging the archive there
    would replace it with 191 bytes. The sidecar is sent again when the tagging changed it."""
    from .store import explain

    tagging = {"TagSet": [{"Key": PROBE_TAG, "Value": sha256}]}
    try:
        s3.put_object_tagging(Bucket=sidecar.bucket, Key=sidecar.key, Tagging=tagging)
        accepted = True
    except Exception:  # noqa: BLE001 - a store without tags: the .sha256 and the receipt carry the SHA-256
        accepted = False
    try:
        unchanged = _read_small(s3, sidecar, data) == data
    except Exception as exc:  # noqa: BLE001 - one line
        raise explain(exc, f"reading {sidecar.key.rsplit('/', 1)[-1]} back", sidecar.url) from None
    if not unchanged:
        _put_small(s3, sidecar, data)
    return accepted and unchanged


def _tag_sha256(s3, location: S3Location, sha256: str, version_id: str | None) -> bool:
    """The archive's SHA-256 as the object's tag (tags, unlike metadata, can be set after the upload); False
    where the store refuses it."""
    arguments = {"Bucket": location.bucket, "Key": location.key,
                 "Tagging": {"TagSet": [{"Key": METADATA_SHA256, "Value": sha256}]}}
    if version_id:
        arguments["VersionId"] = version_id
    try:
        s3.put_object_tagging(**arguments)
    except Exception:  # noqa: BLE001 - optional: the .sha256 and the receipt carry it anyway
        return False
    return True


def _head(s3, location: S3Location, version_id: str | None, what: str) -> dict:
    """The object's HEAD with its checksum (ChecksumMode), of `version_id` when the store versions it."""
    from .store import explain

    arguments = {"Bucket": location.bucket, "Key": location.key, "ChecksumMode": "ENABLED"}
    if version_id:
        arguments["VersionId"] = version_id
    try:
        return s3.head_object(**arguments)
    except Exception as exc:  # noqa: BLE001 - one line
        raise explain(exc, what, location.url) from None


def _still_equal(s3, location: S3Location, *, size: int, crc: int, version_id: str | None) -> None:
    """After the tagging: the object still has the archive's size, and its CRC64NVME where the store returns one
    (a store that took the tag into the bytes would not); PushUnverified otherwise."""
    from .multipart import crc_base64

    head = _head(s3, location, version_id, "checking the tagged object")
    stored = head.get("ChecksumCRC64NVME")
    if head.get("ContentLength") != size or (stored and stored != crc_base64(crc)):
        raise PushUnverified(f"{location.url}: the object changed when its sha256 tag was set "
                             f"({head.get('ContentLength')} bytes, CRC64NVME {stored or 'none'})")


def _verify_object(s3, location: S3Location, *, size: int, sha256: str, crc: int, returned_crc: str | None,
                   etag: str, version_id: str | None, read_back: bool, jobs: int) -> tuple[str, bool]:
    """How the object was proven equal to the archive, and whether its metadata holds the SHA-256;
    PushUnverified when it is not equal."""
    from .multipart import crc_base64
    from .ranged import read_back_sha256

    head = _head(s3, location, version_id, "checking the uploaded object")
    if head.get("ContentLength") != size:
        raise PushUnverified(f"{location.url}: the store holds {head.get('ContentLength')} bytes, the archive "
                             f"has {size}")
    metadata = {k.lower(): v for k, v in (head.get("Metadata") or {}).items()}
    if metadata.get(METADATA_SHA256, sha256) != sha256:
        raise PushUnverified(f"{location.url}: the object's sha256 metadata is not the archive's")
    stored_crcs = {c for c in (returned_crc, head.get("ChecksumCRC64NVME")) if c}
    if stored_crcs and stored_crcs != {crc_base64(crc)}:
        raise PushUnverified(f"{location.url}: the store's CRC64NVME ({', '.join(sorted(stored_crcs))}) is not "
                             f"the archive's ({crc_base64(crc)})")
    ways = [VERIFIED_BY_STORE_CRC] if stored_crcs else []
    if read_back or not stored_crcs:  # never trust the store's silence
        got, count = read_back_sha256(s3, location.bucket, location.key, size, head.get("ETag") or etag, jobs,
                                      version_id=version_id)
        if (got, count) != (sha256, size):
            raise PushUnverified(f"{location.url}: the object reads back as sha256 {got} ({count} bytes), the "
                                 f"archive is {sha256} ({size} bytes)")
        ways.append(VERIFIED_BY_READ_BACK)
    return "; ".join(ways), METADATA_SHA256 in metadata


def _read_small(s3, location: S3Location, data: bytes) -> bytes:
    """A sidecar just sent, read back: at most one byte more than `data` (store errors are the caller's)."""
    from .ranged import read_start

    return read_start(s3, location.bucket, location.key, len(data))


def _put_small(s3, location: S3Location, data: bytes) -> None:
    """A sidecar: one PUT with Content-MD5, then read back whole and compared."""
    from .store import explain

    from .store import DIGEST_MISMATCH, error_code

    md5 = base64.b64encode(hashlib.md5(data).digest()).decode("ascii")
    for attempt in range(3):
        try:
            s3.put_object(Bucket=location.bucket, Key=location.key, Body=data, ContentMD5=md5)
            back = _read_small(s3, location, data)
        except Exception as exc:  # noqa: BLE001 - one line
            if error_code(exc) in DIGEST_MISMATCH and attempt < 2:
                continue  # changed in flight and refused by the store: send it again
            raise explain(exc, f"sending {location.key.rsplit('/', 1)[-1]}", location.url) from None
        if back == data:
            return
    raise PushUnverified(f"{location.url}: reads back changed")
