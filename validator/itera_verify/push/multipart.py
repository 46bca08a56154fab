"""The archive to S3: one multipart upload, parallel parts, resumable from its journal, checked by the store.

One sequential read of the archive feeds everything: the SHA-256 of the whole (compared with the `.sha256` the
seal wrote before the upload is completed), the full object's CRC64NVME, and each part's CRC64NVME. Parts go
to the store on `jobs` threads, at most `jobs` parts in memory. Every part carries a checksum the store checks (a
part changed in flight is refused and sent again): where the store takes flexible checksums, the part's
CRC64NVME (the upload is a CRC64NVME full-object upload and the store computes the whole object's CRC itself);
elsewhere Content-MD5, which every S3 store checks. MD5 is the slowest of the hashes here (about 0.5 GB/s a core
against 8 GB/s for CRC64NVME): it is computed only where it is the store's check, or to recognise a part the
store already lists on a resume (its ETag is the part's MD5).

Which checksum a store takes is found by asking: CreateMultipartUpload with CRC64NVME/FULL_OBJECT; a store that
refuses the headers, or accepts them without echoing the algorithm (it ignores them), gets Content-MD5 alone.
"""
from __future__ import annotations

import base64
import errno
import hashlib
import io
import mmap
import os
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

from ..archive.direct import ALIGN, aligned_buffer, clear_direct, open_direct, round_up
from ..format.push import CHECKSUM_CRC64NVME, CHECKSUM_MD5, MAX_PARTS, METADATA_SHA256, part_size_for
from ..runtime.progress import NULL_PROGRESS, Progress
from . import journal as journals
from .store import (CHECKSUM_REFUSED, DIGEST_MISMATCH, PushError, PushUnverified, S3Location, error_code, explain,
                    is_connection_error)

PART_ATTEMPTS = 3


def crc64nvme(data, previous: int = 0) -> int:
    from awscrt import checksums

    return checksums.crc64nvme(data, previous)


def crc_base64(value: int) -> str:
    return base64.b64encode(value.to_bytes(8, "big")).decode("ascii")


def crc_hex(value: int) -> str:
    return f"{value:016x}"


def _etag(value) -> str:
    return str(value or "").strip('"')


@dataclass
class Uploaded:
    etag: str
    version_id: str | None
    checksum: str  # CHECKSUM_CRC64NVME or CHECKSUM_MD5
    crc64nvme: int  # computed here, from the bytes sent
    store_crc64nvme: str | None  # what the store returned on completion (base64), None when it returned none
    parts: int
    parts_reused: int


class _ChecksumRefused(Exception):
    """The store refused a part's CRC64NVME header: start again with Content-MD5 only."""


class _UploadGone(Exception):
    """The store dropped the upload (rclone fails a whole upload once one part is refused): start a new one."""


RESTARTS = 2


def upload(s3, archive: Path, location: S3Location, *, sha256: str, endpoint: str | None, jobs: int,
           part_size: int, progress: Progress = NULL_PROGRESS, watch=None, overwrite: bool = False) -> Uploaded:
    """Upload (or resume uploading) `archive` to `location`. Raises PushError (exit 2) or PushUnverified (1),
    occupied.Occupied (1) where the key holds another archive and `overwrite` is off."""
    from .occupied import refuse_if_occupied

    where = location.url
    stat = archive.stat()
    size = stat.st_size
    part_size = part_size_for(size, part_size)
    journal_file = journals.journal_path(archive)
    part_size = _resumed_part_size(journals.load(journal_file), archive, stat, where, endpoint, sha256, part_size)
    wanted = journals.Journal(archive=archive.name, bytes=size, mtime_ns=stat.st_mtime_ns, destination=where,
                              endpoint=endpoint, upload_id="", part_size=part_size, checksum="", sha256=sha256,
                              started_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    journal, listed = _resume(s3, location, journal_file, wanted)
    _abort_strays(s3, location, keep=journal.upload_id if journal else None)
    if journal is None:  # nothing of this archive under way: maybe it was delivered whole already
        delivered = _delivered(s3, archive, location, size=size, sha256=sha256, progress=progress)
        if delivered is not None:
            return delivered
    refuse_if_occupied(s3, location, sha256, overwrite)  # before a part is sent; again at the completion
    modes, restarts = [CHECKSUM_CRC64NVME, CHECKSUM_MD5], 0
    while True:
        if journal is None:
            journal = _create(s3, location, wanted, modes[0])
            journals.save(journal_file, journal)
            listed = {}
        try:
            return _send(s3, archive, location, journal, journal_file, listed, jobs=jobs, progress=progress,
                         watch=watch, overwrite=overwrite)
        except _ChecksumRefused:
            _abort(s3, location, journal.upload_id)
            journals.remove(journal_file)
            journal, modes = None, [CHECKSUM_MD5]
        except _UploadGone:
            journals.remove(journal_file)
            journal, restarts = None, restarts + 1
            if restarts > RESTARTS:
                raise PushError(f"{where}: the store dropped the upload {restarts} times") from None


def _delivered(s3, archive: Path, location: S3Location, *, size: int, sha256: str,
               progress: Progress) -> Uploaded | None:
    """The object already at `location` when it is this archive: its size, its recorded SHA-256 (metadata or tag)
    and the store's CRC64NVME of the whole object equal the archive's (read here once, its SHA-256 also compared
    with its `.sha256`). A push run again after it succeeded then sends nothing and proves the object as a push
    does (finish_s3). None where any of it differs or is missing (a store without CRC64NVME: the push sends)."""
    from .remote import recorded_sha256

    try:
        head = s3.head_object(Bucket=location.bucket, Key=location.key, ChecksumMode="ENABLED")
    except Exception:  # noqa: BLE001 - absent, or not readable: the upload says why if it cannot go on
        return None
    stored = head.get("ChecksumCRC64NVME")
    if head.get("ContentLength") != size or not stored:
        return None
    in_metadata, tag = recorded_sha256(s3, location, head)
    if (in_metadata or tag) != sha256:
        return None
    progress.start("push", f"comparing {archive.name} with the object already at {location.url}", total=size,
                   unit="B")
    digest, crc = hashlib.sha256(), 0
    try:
        with open(archive, "rb") as source:
            while chunk := source.read(8 << 20):
                digest.update(chunk)
                crc = crc64nvme(chunk, crc)
                progress.advance("push", len(chunk))
    finally:
        progress.finish("push")
    if digest.hexdigest() != sha256 or crc_base64(crc) != stored:
        return None
    return Uploaded(etag=_etag(head.get("ETag")), version_id=head.get("VersionId"), checksum=CHECKSUM_CRC64NVME,
                    crc64nvme=crc, store_crc64nvme=stored, parts=0, parts_reused=0)


def _resumed_part_size(old, archive: Path, stat, where: str, endpoint, sha256: str, part_size: int) -> int:
    """A journal of this very archive to this place keeps its part size (the parts sent are reused whatever
    --part-size says now, e.g. after an overlapped push, push/follow.py, that sized its parts itself)."""
    if old is None or (old.archive, old.bytes, old.mtime_ns, old.destination, old.endpoint, old.sha256) != (
            archive.name, stat.st_size, stat.st_mtime_ns, where, endpoint, sha256):
        return part_size
    valid = isinstance(old.part_size, int) and part_size_for(stat.st_size, old.part_size) == old.part_size
    return old.part_size if valid else part_size


def _resume(s3, location: S3Location, journal_file: Path, wanted: journals.Journal):
    """The journal's upload and the parts the store still lists, when it is this archive's; otherwise the old
    upload is aborted and (None, {})."""
    old = journals.load(journal_file)
    if old is None:
        return None, {}
    if not old.same_upload(wanted):
        if old.destination == wanted.destination and old.endpoint == wanted.endpoint:
            _abort(s3, location, old.upload_id)
        journals.remove(journal_file)
        return None, {}
    listed: dict[int, tuple[str, int, str | None]] = {}
    try:
        for page in s3.get_paginator("list_parts").paginate(Bucket=location.bucket, Key=location.key,
                                                            UploadId=old.upload_id,
                                                            PaginationConfig={"MaxItems": MAX_PARTS}):
            parts = page.get("Parts") or []
            for part in parts[:MAX_PARTS]:
                number = part.get("PartNumber")
                if isinstance(number, int) and 1 <= number <= MAX_PARTS:
                    listed[number] = (_etag(part.get("ETag")), part.get("Size", -1),
                                      part.get("ChecksumCRC64NVME"))
            if not parts or len(listed) >= MAX_PARTS:  # a store that pages on and on: at most 10,000 pages
                break
    except Exception as exc:  # noqa: BLE001 - classified below
        if error_code(exc) in ("NoSuchUpload", "404"):  # completed or aborted meanwhile: start again
            journals.remove(journal_file)
            return None, {}
        raise explain(exc, "listing the parts already sent", location.url) from None
    return old, listed


def _abort(s3, location: S3Location, upload_id: str) -> None:
    try:
        s3.abort_multipart_upload(Bucket=location.bucket, Key=location.key, UploadId=upload_id)
    except Exception:  # noqa: BLE001 - an upload already gone needs no abort
        pass


def _abort_strays(s3, location: S3Location, keep: str | None) -> None:
    """Uploads of this key that no journal names (a push killed before it wrote its journal): aborted, so the
    store does not keep their parts."""
    try:
        uploads = s3.list_multipart_uploads(Bucket=location.bucket, Prefix=location.key).get("Uploads", [])
    except Exception as exc:  # noqa: BLE001 - the bucket's existence and our rights show here first
        if is_connection_error(exc) or error_code(exc) in ("NoSuchBucket", "AccessDenied", "InvalidAccessKeyId",
                                                            "SignatureDoesNotMatch"):
            raise explain(exc, "checking the bucket", location.url) from None
        return  # a store without ListMultipartUploads: nothing to clean
    for stray in uploads:
        if stray.get("Key") == location.key and stray.get("UploadId") != keep:
            _abort(s3, location, stray["UploadId"])


def _create(s3, location: S3Location, wanted: journals.Journal, mode: str) -> journals.Journal:
    # An upload that overlaps the seal starts before the SHA-256 exists: no metadata then (push/follow.py)
    arguments = {"Bucket": location.bucket, "Key": location.key, "ContentType": "application/zstd",
                 "Metadata": {METADATA_SHA256: wanted.sha256} if wanted.sha256 else {}}
    response = None
    if mode == CHECKSUM_CRC64NVME:
        try:
            response = s3.create_multipart_upload(**arguments, ChecksumAlgorithm="CRC64NVME",
                                                  ChecksumType="FULL_OBJECT")
        except Exception as exc:  # noqa: BLE001 - classified below
            if error_code(exc) not in CHECKSUM_REFUSED:
                raise explain(exc, "creating the upload", location.url) from None
        if response is not None and response.get("ChecksumAlgorithm") != "CRC64NVME":
            mode = CHECKSUM_MD5  # accepted and ignored: the store keeps no checksum
        elif response is None:
            mode = CHECKSUM_MD5
    if response is None:
        try:
            response = s3.create_multipart_upload(**arguments)
        except Exception as exc:  # noqa: BLE001
            raise explain(exc, "creating the upload", location.url) from None
    return journals.Journal(**{**wanted.__dict__, "upload_id": response["UploadId"], "checksum": mode,
                               "parts": {}})


def _read_part(fd: int, offset: int, length: int) -> bytes:
    data = os.pread(fd, length, offset)
    while len(data) < length:
        more = os.pread(fd, length - len(data), offset + len(data))
        if not more:
            raise PushError(f"the archive became shorter while it was read (at byte {offset + len(data)})")
        data += more
    return data


_REUSED = (bytearray, mmap.mmap)  # PartBuffers' own buffers (bytes: a part of its own)


class PartBuffers:
    """Whole parts are read into buffers used again and again, handed back when the store has taken the part: a
    part read into new memory costs the kernel a page fault per 4 KiB (a 1.85 GB archive: 470,000 faults and
    1.8 s of system time on the benchmark's machine, where boto3's upload_file took 20,000). At most `jobs + 1`
    exist: `jobs` parts in flight and the one being read. The last, shorter part gets bytes of its own.

    `direct`: `fd` was opened with O_DIRECT (archive/direct.open_direct): the parts go from the device into
    page-aligned buffers without filling the page cache, which on a VM costs like fresh memory (the archive
    the seal wrote past the cache, read through it, cost ~2 s of system time per GB here). A file system that
    refuses the first such read gets plain reads."""

    def __init__(self, size: int, direct: bool = False):
        self.size, self._free, self._lent = size, [], {}
        self.direct = direct and size % ALIGN == 0

    def read(self, fd: int, offset: int, length: int):
        if length != self.size and not self.direct:
            return _read_part(fd, offset, length)
        buffer = self._free.pop() if self._free else (aligned_buffer(self.size) if self.direct else
                                                      bytearray(self.size))
        try:
            got = self._fill(fd, buffer, offset, length)
        except BaseException:
            self._free.append(buffer)
            raise
        if got < length:
            self._free.append(buffer)
            raise PushError(f"the archive became shorter while it was read (at byte {offset + got})")
        if length != self.size:  # the last part (read whole blocks past its end: the file ends there)
            with memoryview(buffer) as view:
                data = bytes(view[:length])
            self._free.append(buffer)
            return data
        return buffer

    def _fill(self, fd: int, buffer, offset: int, length: int) -> int:
        want = round_up(length) if self.direct else length
        got = 0
        with memoryview(buffer) as view:
            while got < length:
                try:
                    count = os.preadv(fd, [view[got:want]], offset + got)
                except OSError as exc:
                    if not (self.direct and exc.errno == errno.EINVAL):
                        raise
                    self.direct = clear_direct(fd)  # refused: plain reads from now on
                    want = length
                    continue
                if count == 0:
                    break
                got += count
                if self.direct and got % ALIGN and got < length:  # a short read mid-file: go on plainly
                    self.direct, want = clear_direct(fd), length
        return got

    def lend(self, future, data) -> None:
        """`data` is in flight until `future` is done."""
        if isinstance(data, _REUSED):
            self._lent[future] = data

    def take_back(self, future=None, data=None) -> None:
        """The part of `future` is done (or `data` was never sent): its buffer can be read into again."""
        buffer = self._lent.pop(future, None) if future is not None else data
        if isinstance(buffer, _REUSED):
            self._free.append(buffer)


class _PartBody(io.RawIOBase):
    """A part's reused buffer as the request body, read in place. Given the buffer itself, botocore's signer
    copies it into a BytesIO (a bytearray is not shared as bytes are): a fresh copy of every part."""

    def __init__(self, buffer):
        super().__init__()
        self._view, self._position = memoryview(buffer).toreadonly(), 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:  # one copy of each chunk the sender asks for, not two
        end = len(self._view) if size is None or size < 0 else min(len(self._view), self._position + size)
        data = self._view[self._position:end].tobytes()
        self._position = max(self._position, end)
        return data

    def readinto(self, target) -> int:
        count = max(0, min(len(target), len(self._view) - self._position))
        target[:count] = self._view[self._position:self._position + count]
        self._position += count
        return count

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: len(self._view)}[whence]
        self._position = max(0, base + offset)
        return self._position

    def tell(self) -> int:
        return self._position

    def __len__(self) -> int:
        return len(self._view)


def _send(s3, archive: Path, location: S3Location, journal: journals.Journal, journal_file: Path,
          listed: dict, *, jobs: int, progress: Progress, watch=None, overwrite: bool = False) -> Uploaded:
    size, part_size = journal.bytes, journal.part_size
    count = max(1, -(-size // part_size))
    digest, full_crc, reused = hashlib.sha256(), 0, 0
    done: dict[int, str] = {}
    # bytes this run sends, and those acknowledged: the deadline's prediction (deadline.py)
    sent = {"todo": size, "acked": 0, "watch": watch}
    progress.start("push", f"pushing {archive.name}", total=size, unit="B")
    fd, direct = open_direct(archive, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    buffers = PartBuffers(part_size, direct)
    try:
        with ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="push-part") as pool:
            running: set = set()
            for number in range(1, count + 1):
                offset = (number - 1) * part_size
                data = buffers.read(fd, offset, min(part_size, size - offset))
                digest.update(data)
                full_crc = crc64nvme(data, full_crc)
                crc = crc64nvme(data)
                md5 = part_md5(journal, data) if number not in listed else hashlib.md5(data).hexdigest()
                if _already_there(listed.get(number), md5, crc, len(data)):
                    done[number] = listed[number][0]
                    journal.parts[str(number)] = {"etag": listed[number][0], "md5": md5, "crc64nvme": crc_hex(crc),
                                                  "bytes": len(data)}
                    reused += 1
                    sent["todo"] -= len(data)
                    progress.advance("push", len(data))
                    buffers.take_back(data=data)
                    continue
                if watch is not None:
                    watch.begin()
                while len(running) >= jobs:
                    _collect(wait(running, return_when=FIRST_COMPLETED).done, running, journal, journal_file,
                             done, progress, sent, buffers)
                future = pool.submit(_put_part, s3, location, journal, number, data, md5, crc)
                buffers.lend(future, data)
                running.add(future)
                del data
            while running:
                _collect(wait(running, return_when=FIRST_COMPLETED).done, running, journal, journal_file, done,
                         progress, sent, buffers)
    except BaseException:  # never "done" for parts that did not all reach the store; the journal keeps those that did
        progress.abandon("push", "stopped: the parts the store took are kept for the next run")
        raise
    finally:
        os.close(fd)
        progress.finish("push")  # a no-op once abandoned
    if digest.hexdigest() != journal.sha256:
        _abort(s3, location, journal.upload_id)
        journals.remove(journal_file)
        raise PushUnverified(f"{archive.name}: its bytes (sha256 {digest.hexdigest()}) are not those its "
                             f".sha256 names ({journal.sha256}); nothing was completed in the store")
    return _complete(s3, location, journal, journal_file, done, full_crc, reused, overwrite=overwrite)


def part_md5(journal: journals.Journal, data) -> str | None:
    """The part's MD5 where Content-MD5 is the store's check of the part (no CRC64NVME there); None otherwise."""
    return hashlib.md5(data).hexdigest() if journal.checksum != CHECKSUM_CRC64NVME else None


def _already_there(listed, md5: str, crc: int, length: int) -> bool:
    """A part the store lists with this size and, as its ETag, the MD5 of the bytes here (the usual ETag of a
    part), or, as its CRC64NVME, theirs: the store's word on the bytes it holds, never the journal's."""
    if listed is None or listed[1] != length:
        return False
    return listed[0] == md5 or (listed[2] is not None and listed[2] == crc_base64(crc))


def _collect(finished, running: set, journal, journal_file: Path, done: dict, progress: Progress,
             sent: dict | None = None, buffers: PartBuffers | None = None) -> None:
    for future in finished:
        running.discard(future)
        if buffers is not None:
            buffers.take_back(future)
        number, etag, record = future.result()  # a part's error stops the push here
        done[number] = etag
        journal.parts[str(number)] = record
        journals.save(journal_file, journal)
        progress.advance("push", record["bytes"])
        if sent is not None and sent["watch"] is not None:
            sent["acked"] += record["bytes"]
            sent["watch"].part_done(sent["acked"], sent["todo"] - sent["acked"])


def _put_part(s3, location: S3Location, journal: journals.Journal, number: int, data, md5: str | None,
              crc: int):
    """One part with the check the store makes of it: its CRC64NVME in a CRC64NVME upload, else Content-MD5
    (`md5`: part_md5's)."""
    arguments = {"Bucket": location.bucket, "Key": location.key, "UploadId": journal.upload_id,
                 "PartNumber": number}
    if journal.checksum == CHECKSUM_CRC64NVME:
        arguments["ChecksumCRC64NVME"] = crc_base64(crc)
    if md5 is not None:
        arguments["ContentMD5"] = base64.b64encode(bytes.fromhex(md5)).decode("ascii")
    elif journal.checksum != CHECKSUM_CRC64NVME:
        raise AssertionError("a part without CRC64NVME is sent with its Content-MD5")
    for attempt in range(PART_ATTEMPTS):
        try:
            response = s3.upload_part(**arguments, Body=_PartBody(data) if isinstance(data, _REUSED) else data)
        except Exception as exc:  # noqa: BLE001 - classified below
            code = error_code(exc)
            if code in DIGEST_MISMATCH and attempt + 1 < PART_ATTEMPTS:
                continue  # the store received other bytes than these: send them again
            if code in DIGEST_MISMATCH:
                raise PushUnverified(f"{location.url}: part {number} reached the store changed "
                                     f"{PART_ATTEMPTS} times ({code}); the connection corrupts data") from None
            if code in CHECKSUM_REFUSED and journal.checksum == CHECKSUM_CRC64NVME and number == 1:
                raise _ChecksumRefused() from None
            if code == "NoSuchUpload":
                raise _UploadGone() from None
            if is_connection_error(exc) and attempt + 1 < PART_ATTEMPTS:
                continue
            raise explain(exc, f"sending part {number}", location.url) from None
        returned = response.get("ChecksumCRC64NVME")
        if journal.checksum == CHECKSUM_CRC64NVME and returned is not None and returned != crc_base64(crc):
            raise PushUnverified(f"{location.url}: the store computed another CRC64NVME for part {number}")
        return number, _etag(response.get("ETag")), {"etag": _etag(response.get("ETag")), "md5": md5,
                                                     "crc64nvme": crc_hex(crc), "bytes": len(data)}
    raise AssertionError("unreachable")


def _complete(s3, location: S3Location, journal: journals.Journal, journal_file: Path, done: dict, full_crc: int,
              reused: int, *, overwrite: bool = False) -> Uploaded:
    """Complete the upload, never over another archive (occupied.py) unless `overwrite`."""
    from .occupied import Occupied, complete

    def drop() -> None:
        _abort(s3, location, journal.upload_id)
        journals.remove(journal_file)

    parts = [{"PartNumber": number, "ETag": f'"{done[number]}"'} for number in sorted(done)]
    arguments = {"Bucket": location.bucket, "Key": location.key, "UploadId": journal.upload_id,
                 "MultipartUpload": {"Parts": parts}}
    if journal.checksum == CHECKSUM_CRC64NVME:
        arguments.update(ChecksumCRC64NVME=crc_base64(full_crc), ChecksumType="FULL_OBJECT")
    try:
        response = complete(s3, arguments, location, journal.sha256, overwrite, drop)
    except Occupied:
        raise
    except Exception as exc:  # noqa: BLE001 - classified below
        if error_code(exc) in DIGEST_MISMATCH:
            _abort(s3, location, journal.upload_id)
            journals.remove(journal_file)
            raise PushUnverified(f"{location.url}: the store's CRC64NVME of the whole object is not the "
                                 f"archive's ({error_code(exc)}); the upload was aborted") from None
        raise explain(exc, "completing the upload", location.url) from None
    journals.remove(journal_file)  # the upload id is spent: the receipt takes over
    return Uploaded(etag=_etag(response.get("ETag")), version_id=response.get("VersionId"),
                    checksum=journal.checksum, crc64nvme=full_crc,
                    store_crc64nvme=response.get("ChecksumCRC64NVME"), parts=len(parts), parts_reused=reused)
