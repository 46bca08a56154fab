"""`--results DIR/|s3://…/`: each archive's report, kept so that a rerun audits only what is not there yet.

A result is named after what decides a verdict: the archive's SHA-256 (of its bytes, hashed here, never what a
sidecar or the store's metadata claims), the tool's version, and a digest of the options that change a verdict
(`options_digest`). Whoever can write the store can write anything there, so a result is authenticated with the
reviewer's key (runtime/reviewer_key.py): an HMAC-SHA256 over the envelope's canonical bytes, which no one
without the key can make. It is read as input all the same: at most push/listing.RESULT_MAX bytes, parsed by the
bounded JSON reader, its MAC checked first, then its envelope naming the same SHA-256, version and options, its
report valid against schemas/report.schema.json and naming that SHA-256 too. Anything else is not a result: the
archive is audited again (and its result written anew), and the row says why the stored one was not reused.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from ..model import UsageError
from ..options import RunOptions
from ..package.jsonread import read_json
from ..push.listing import RESULT_MAX
from ..runtime.reviewer_key import authentic_record, authenticated, reviewer_key
from ..version import __version__

RESULT_FORMAT = "itera-verify-result/2"  # /1 carried no MAC
NOT_AUTHENTIC = "not authenticated by this reviewer's key (--results-key)"


def options_digest(options: RunOptions) -> str:
    """What of the options can change an archive's verdict, as a digest: the rules and levels, the reloads and
    where they find their bases, the size limit, the signers required (the files' contents, not their names)."""
    selection = options.selection
    facts = {
        "select": list(selection.select), "ignore": list(selection.ignore), "strict": selection.strict,
        "levels": {code: level.value for code, level in sorted(selection.levels.items())},
        "tmp_patterns": list(options.tmp_patterns), "tariffs": options.tariffs,
        "reload": options.reload, "device": options.device, "timeout": options.timeout,
        "hf_cache": str(options.hf_cache) if options.hf_cache else None, "max_size": options.max_size,
        "allowed_signers": _file_digest(options.allowed_signers), "signer": options.signer,
        "oms_public_key": _file_digest(options.oms_public_key),
    }
    text = json.dumps(facts, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _file_digest(path: Path | None) -> str | None:
    if path is None:
        return None
    try:
        with open(path, "rb") as handle:
            return hashlib.file_digest(handle, "sha256").hexdigest()
    except OSError as exc:
        raise UsageError(f"{path}: cannot read ({exc.strerror or exc})") from None


class ResultStore:
    """A folder or an s3:// prefix of results, for one set of options."""

    def __init__(self, location: str, options: RunOptions):
        self.location, self.endpoint_url = location, options.endpoint_url
        self.digest = options_digest(options)
        # Read (or made) here, once: a Ray task gets the key with the store, whatever its machine holds.
        self.key = reviewer_key(options.results_key, options.environment, create=True)
        self.remote = location.startswith("s3://")
        if not self.remote:
            folder = Path(location)
            if not folder.is_dir():
                try:
                    folder.mkdir(parents=False)
                except OSError as exc:
                    raise UsageError(f"--results {location}: no such folder, and it cannot be made "
                                     f"({exc.strerror or exc})") from None

    def name(self, archive_sha256: str) -> str:
        return f"{archive_sha256}.{__version__}.{self.digest[:24]}.json"

    def where(self, archive_sha256: str) -> str:
        if self.remote:
            return self.location + self.name(archive_sha256)
        return os.path.join(self.location, self.name(archive_sha256))

    def get(self, archive_sha256: str) -> tuple[dict[str, Any] | None, str | None]:
        """(the stored report of the archive whose bytes hash to `archive_sha256`, None) when one is there and
        authentic; (None, why it is not reused) when something else is there; (None, None) when nothing is."""
        data = self._read(self.where(archive_sha256))
        if data is None:
            return None, None
        try:
            envelope = read_json(data)
        except ValueError:
            return None, "not readable as a result"
        envelope = authentic_record(self.key, RESULT_FORMAT, envelope)
        if envelope is None:
            return None, NOT_AUTHENTIC
        report = self.valid(envelope, archive_sha256)
        return (report, None) if report is not None else (None, "not a result of this archive and these options")

    def valid(self, envelope: Any, archive_sha256: str) -> dict[str, Any] | None:
        if not isinstance(envelope, dict) or envelope.get("format") != RESULT_FORMAT:
            return None
        if (envelope.get("archive_sha256"), envelope.get("version"), envelope.get("options")) != (
                archive_sha256, __version__, self.digest):
            return None
        report = envelope.get("report")
        if not isinstance(report, dict) or report.get("mode") != "audit" or report.get("version") != __version__:
            return None
        archive = report.get("archive")
        if not isinstance(archive, dict) or archive.get("sha256") != archive_sha256:
            return None
        from ..package.schemas import validator

        if not validator("report").is_valid(report):
            return None
        return report

    def put(self, report: dict[str, Any]) -> str | None:
        """Keep an audit's report under the SHA-256 it audited; the place written, or None when the report names
        no SHA-256 (the archive could not be read whole)."""
        archive_sha256 = (report.get("archive") or {}).get("sha256")
        if not isinstance(archive_sha256, str) or len(archive_sha256) != 64:
            return None
        envelope = {"format": RESULT_FORMAT, "archive_sha256": archive_sha256, "version": __version__,
                    "options": self.digest, "report": json.loads(json.dumps(report, allow_nan=False, default=str))}
        data = authenticated(self.key, RESULT_FORMAT, envelope)
        if len(data) > RESULT_MAX:
            return None  # read back it would not be one: the next run audits it again
        where = self.where(archive_sha256)
        if self.remote:
            from ..push.listing import write_object

            write_object(where, data, self.endpoint_url)
        else:
            partial = f"{where}.{os.getpid()}.partial"
            try:
                with open(partial, "wb") as handle:
                    handle.write(data)
                os.replace(partial, where)
            except OSError as exc:
                raise UsageError(f"--results {self.location}: cannot write ({exc.strerror or exc})") from None
            finally:
                if os.path.exists(partial):
                    os.unlink(partial)
        return where

    def _read(self, where: str) -> bytes | None:
        if self.remote:
            from ..push.listing import read_object

            return read_object(where, self.endpoint_url)
        try:
            with open(where, "rb") as handle:
                data = handle.read(RESULT_MAX + 1)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise UsageError(f"--results {self.location}: cannot read ({exc.strerror or exc})") from None
        return data if len(data) <= RESULT_MAX else None


__all__ = ["ResultStore", "options_digest"]
