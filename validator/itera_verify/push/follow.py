"""`itera-verify OUTDIR --push s3://...`: the upload overlaps the seal, part by part, so the end of a rental pays
for one pass over the archive, not two.

The seal (seal/Sealing) hands a SealFollower its partial archive as soon as the file exists. A thread here
creates the multipart upload, waits on the writer's count of final bytes (archive/output.WrittenBytes, never the
file's size, which O_DIRECT padding exceeds for a moment), reads each part from the file once its bytes are
final and sends it (parallel parts, each with its CRC64NVME where the store takes it, else Content-MD5, as
multipart.py does). The
last part goes when the seal has synced the file and knows its size. The seal's read-back, which already hashes
every byte for `.sha256`, also gives them to tap(): the CRC64NVME of the archive as verified, with no second read.

Nothing is completed before the seal has published the archive (its read-back verified it): result() then checks
that the bytes sent are those read back (size and CRC64NVME), completes the upload, proves the object equal
(the store's CRC64NVME, or a read-back) and sends `.sha256`, `.sig` and the receipt, as a plain push does. A
seal that fails, is refused or is interrupted calls abandon(): the upload is aborted and no receipt exists.

Resume: once the archive is published, the journal (`<archive>.push.json`, journal.py) names it with its size,
time and SHA-256 and every part acknowledged, so a later `itera-verify push ARCHIVE DEST` after a kill or a lost
connection sends only what is missing. Memory: at most `jobs + 1` parts, whatever the archive's size.
"""
from __future__ import annotations

import os
import threading
import time
from contextlib import contextmanager
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path

from ..archive.direct import open_direct
from ..format.push import CHECKSUM_CRC64NVME, CHECKSUM_MD5, FOLLOW_PART_SIZE, part_size_for
from ..runtime.launcher import join_thread
from ..runtime.progress import NULL_PROGRESS, Progress
from . import journal as journals
from .deadline import DeadlineWatch
from .multipart import PartBuffers
from .store import PushError, PushUnverified, S3Location, explain, s3_destination

WAIT_SECONDS = 0.5  # how often a waiting follower looks whether it was abandoned
ABANDON_SECONDS = 15  # an abandoned follower aborts its upload within this, or the next push's cleanup does


class _Abandoned(Exception):
    """The seal did not publish: stop following."""


class Follower:
    """What a seal's follower is, whatever its destination: the seal calls begin / tap / sealed / abandon, the
    caller result(). States: idle (never attached: the caller pushes after the seal instead), following, sealed
    (result() finishes it), abandoned. A subclass starts its thread with _follow() and lets go of what it holds
    in _release()."""

    def __init__(self, progress: Progress, deadline: float | None, warn) -> None:
        self.progress = progress
        self.watch = DeadlineWatch(deadline, warn or progress.log)
        self.state = "idle"
        self._abandoned = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._sealed: tuple[Path, str, int] | None = None

    def connect(self) -> None:
        """Reach what the destination needs before any part is sent (credentials, an endpoint): PushError (exit
        2) now, not after the seal. The workflow calls it once the checks' child is forked and before the seal's
        threads start (flows/verify.py); begin() calls it too. Idempotent."""

    def set_deadline(self, end) -> None:
        """The rental's end (a datetime with its zone, or None), once the workflow knows it (docs/integration.md,
        leaving the machine)."""
        self.watch.deadline = end.timestamp() if end is not None else None

    def abandon(self) -> None:
        """Nothing was sealed: stop (waits a bounded time), then let go (idempotent)."""
        if self.state != "following":
            return
        self.state = "abandoned"
        self._abandoned.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(ABANDON_SECONDS)
        self._release()

    def _follow(self) -> None:
        self.state = "following"
        self._thread = threading.Thread(target=self._run, name="push-follow", daemon=True)
        self._thread.start()

    def _finish_following(self) -> None:
        """Wait for the thread (bounded waits: Ctrl-C still reaches this one), let go, raise what it met."""
        try:
            join_thread(self._thread)
        finally:
            self._release()
        if self._error is not None:
            raise self._error

    @contextmanager
    def _shown(self, description: str):
        """The transfer's progress line: finished when it ends, said stopped (never "done") when the seal did not
        publish and the transfer raised _Abandoned."""
        self.progress.start("push", description, unit="B")
        try:
            yield
        except _Abandoned:
            self.progress.abandon("push", f"stopped, nothing sealed: {self.ABANDONED}")
            raise
        finally:
            self.progress.finish("push")  # a no-op once abandoned

    ABANDONED = ""  # what is undone when the seal does not publish, in words

    def _run(self) -> None:
        raise NotImplementedError

    def _release(self) -> None:
        raise NotImplementedError


class SealFollower(Follower):
    """Follows one seal's archive to `dest` (`s3://bucket/prefix/`)."""

    ABANDONED = "the upload is aborted"

    def __init__(self, dest: str, *, endpoint_url: str | None = None, read_back: bool = False, jobs: int = 4,
                 part_size: int | None = None, progress: Progress = NULL_PROGRESS,
                 deadline: float | None = None, warn=None, overwrite: bool = False):
        super().__init__(progress, deadline, warn)
        self.dest, self.endpoint_url, self.read_back, self.jobs = dest, endpoint_url, read_back, jobs
        self.overwrite = overwrite  # replace another archive under this name (occupied.py)
        self.wanted_part_size = part_size or FOLLOW_PART_SIZE
        self._lock = threading.RLock()  # sealed() also runs under it when an upload starts again
        self._fd: int | None = None
        self._crc = self._tapped = 0  # the read-back's CRC64NVME and byte count (tap)
        self._sent: tuple[int, int] | None = None  # (bytes, CRC64NVME) of everything sent
        self._done: dict[int, str] = {}
        self.s3 = self.journal = self.location = None

    # ---- the seal's side ---------------------------------------------------------------------------------
    def begin(self, partial: Path, written, name: str, bound: int, estimate=None) -> None:
        """The seal opened `partial` (to be published as `name`); `written` counts its final bytes; `bound` is
        at least the archive's size (it chooses the part size); `estimate()` guesses the final size meanwhile."""
        from .multipart import crc64nvme  # awscrt: missing is said before the seal (connect)

        self._crc64nvme = crc64nvme
        self.location = s3_destination(self.dest, name)
        self.part_size = part_size_for(bound, self.wanted_part_size)
        self.written, self.estimate, self.started, self.uploaded_at = written, estimate, time.monotonic(), _now()
        self.connect()  # made already by the workflow, before the seal's threads (connect)
        # kept open past the rename; past the page cache, as the seal writes it (multipart.PartBuffers)
        self._fd, self._direct = open_direct(partial, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        self._follow()

    def connect(self) -> None:
        from .store import client, require_awscrt

        if self.s3 is None:  # no boto3, no credentials, a bad endpoint: PushError, before anything is sent
            self.s3 = client(self.endpoint_url, self.jobs)
        require_awscrt()

    def tap(self, data) -> None:
        """Every byte of the archive, in order, as the seal's read-back hashes it."""
        self._crc = self._crc64nvme(data, self._crc)
        self._tapped += len(data)

    def sealed(self, path: Path, sha256: str, size: int) -> None:
        """The archive is verified and published: from now on the journal names it (resumable)."""
        with self._lock:
            self._sealed = (Path(path), sha256, size)
            self.state = "sealed"
            if self.journal is not None:
                stat = Path(path).stat()
                self.journal.bytes, self.journal.mtime_ns, self.journal.sha256 = size, stat.st_mtime_ns, sha256
                self._save_journal()

    # ---- the caller's side -------------------------------------------------------------------------------
    def result(self):
        """After sealed(): complete, verify, send the sidecars and the receipt. Returns push.PushResult; raises
        PushError (exit 2) or PushUnverified (exit 1), as push() does."""
        from . import archive_sidecars, finish_s3
        from .multipart import _abort, _complete

        if self.state != "sealed":
            raise PushError(f"{self.dest}: nothing was sealed, nothing pushed")
        self._finish_following()  # PushError or PushUnverified; the journal (when written) lets `push` resume
        archive, sha256, size = self._sealed
        sent_bytes, sent_crc = self._sent
        if (sent_bytes, sent_crc) != (size, self._crc) or self._tapped != size:
            _abort(self.s3, self.location, self.journal.upload_id)
            journals.remove(journals.journal_path(archive))
            raise PushUnverified(f"{self.location.url}: the bytes sent ({sent_bytes}, CRC64NVME {sent_crc:016x}) are "
                                 f"not those the seal read back ({self._tapped}, {self._crc:016x}); the upload was "
                                 "aborted")
        _, sidecars = archive_sidecars(archive)
        uploaded = _complete(self.s3, self.location, self.journal, journals.journal_path(archive), self._done,
                             sent_crc, 0, overwrite=self.overwrite)
        result = finish_s3(self.s3, archive, self.location, uploaded, sha256, sidecars, read_back=self.read_back,
                           jobs=self.jobs, started=self.started, uploaded_at=self.uploaded_at,
                           endpoint=self.s3.meta.endpoint_url, overlapped=True)
        result.deadline = self.watch.facts()
        return result

    # ---- the thread --------------------------------------------------------------------------------------
    def _run(self) -> None:
        from .multipart import RESTARTS, _abort, _abort_strays, _ChecksumRefused, _create, _UploadGone

        try:
            endpoint = self.s3.meta.endpoint_url  # connect() made the client before this thread started
            _abort_strays(self.s3, self.location, keep=None)
            modes, restarts = [CHECKSUM_CRC64NVME, CHECKSUM_MD5], 0
            while True:
                wanted = journals.Journal(archive=self.location.key.rsplit("/", 1)[-1], bytes=0, mtime_ns=0,
                                          destination=self.location.url, endpoint=endpoint, upload_id="",
                                          part_size=self.part_size, checksum="", sha256="",
                                          started_at=self.uploaded_at)
                with self._lock:
                    self.journal, self._done = _create(self.s3, self.location, wanted, modes[0]), {}
                    if self._sealed is not None:  # a restart after the seal published: resumable again
                        self.sealed(*self._sealed)
                try:
                    self._send_parts()
                    return
                except _ChecksumRefused:
                    _abort(self.s3, self.location, self.journal.upload_id)
                    modes = [CHECKSUM_MD5]
                except _UploadGone:
                    restarts += 1
                    if restarts > RESTARTS:
                        raise PushError(f"{self.location.url}: the store dropped the upload {restarts} times") \
                            from None
        except _Abandoned:
            pass
        except (PushError, PushUnverified) as exc:
            self._error = exc
        except Exception as exc:  # noqa: BLE001 - a store error becomes one line
            self._error = explain(exc, "sending the archive while it was sealed", self.dest)
        finally:
            if self._abandoned.is_set() and self.journal is not None:
                _abort(self.s3, self.location, self.journal.upload_id)

    def _send_parts(self) -> None:
        number, offset, crc, acked = 1, 0, 0, [0]
        self._buffers = PartBuffers(self.part_size, self._direct)
        with self._shown(f"pushing {self.location.key.rsplit('/', 1)[-1]} while sealing"):
            with ThreadPoolExecutor(max_workers=self.jobs, thread_name_prefix="push-part") as pool:
                running: set = set()
                while True:
                    available, final, failed = self.written.wait_for(offset + self.part_size, WAIT_SECONDS)
                    if failed or self._abandoned.is_set():
                        raise _Abandoned()
                    if final is None and available < offset + self.part_size:
                        continue
                    end = offset + self.part_size if final is None else min(offset + self.part_size, final)
                    data = self._buffers.read(self._fd, offset, end - offset)
                    crc = self._crc64nvme(data, crc)
                    while len(running) >= self.jobs:
                        self._collect(wait(running, return_when=FIRST_COMPLETED).done, running, acked)
                    self.watch.begin()
                    future = pool.submit(self._put, number, data)
                    self._buffers.lend(future, data)
                    running.add(future)
                    del data
                    number, offset = number + 1, end
                    if final is not None and offset >= final:
                        break
                while running:
                    self._collect(wait(running, return_when=FIRST_COMPLETED).done, running, acked)
        self._sent = (offset, crc)

    def _put(self, number: int, data):
        from .multipart import _put_part, part_md5

        if self._abandoned.is_set():
            raise _Abandoned()
        return _put_part(self.s3, self.location, self.journal, number, data, part_md5(self.journal, data),
                         self._crc64nvme(data))

    def _collect(self, finished, running: set, acked: list) -> None:
        """Record the parts the store took; a part's error stops the push, once the parts still in flight have
        ended and those the store took are recorded too (a later push resumes from them)."""
        failures = []
        for future in finished:
            running.discard(future)
            self._buffers.take_back(future)
            try:
                self._record(future.result(), acked)
            except BaseException as exc:  # noqa: BLE001 - raised below, after the others are recorded
                failures.append(exc)
        if failures:
            for future in list(running):
                running.discard(future)
                try:
                    self._record(future.result(), acked)
                except BaseException:  # noqa: BLE001 - the first failure is the one said
                    pass
            raise failures[0]

    def _record(self, done, acked: list) -> None:
        number, etag, record = done
        with self._lock:
            self._done[number] = etag
            self.journal.parts[str(number)] = record
            if self._sealed is not None:
                self._save_journal()
        self.progress.advance("push", record["bytes"])
        acked[0] += record["bytes"]
        final = self.written.final
        total = final if final is not None else (self.estimate() if self.estimate else self.written.available)
        self.watch.part_done(acked[0], max(total - acked[0], 0), estimated=final is None)

    def _save_journal(self) -> None:
        """Under the lock, once the archive has its name: a later `push ARCHIVE DEST` resumes from it."""
        try:
            journals.save(journals.journal_path(self._sealed[0]), self.journal)
        except OSError:  # the journal only saves work on a resume; the push itself goes on
            pass

    def _release(self) -> None:
        """The archive's descriptor is closed; an abandoned upload is aborted by its thread (or the next push)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


__all__ = ["SealFollower", "S3Location"]
