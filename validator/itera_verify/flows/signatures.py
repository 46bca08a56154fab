"""The audit's step for a signed seal (docs/format.md, Signatures): read the reviewer's allowed_signers file
and `<archive>.sig`, check them with the pure verifier (format/statement.py, format/sshsig.py), hand the facts
to rules/signatures.py.
An OpenSSF model-signing signature (SEAL/model.sig) is checked with the model-signing library and the reviewer's
--oms-public-key (seal/oms.py); without that key it is reported unchecked, never passed.

Reading happens before the archive is: an allowed_signers file or a public key that cannot be read, or that holds
no key this verifier can use, is exit 2 with nothing audited.
"""
from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass
from pathlib import Path

from ..archive import SumsError, parse_sums
from ..archive.canonical import member_listing
from ..archive.extract import Extraction
from ..format import sshsig
from ..format.names import ARCHIVE_SIG_SUFFIX, OMS_SIGNATURE, RECORD, STATEMENT, STATEMENT_SIG, SUMS
from ..format.statement import SealedContent, SealSignatures, SignatureCheck, check_seal
from ..model import UsageError
from ..push.beside import NotSmallFile, read_beside

ALLOWED_SIGNERS_MAX = 16 << 20


@dataclass
class Reviewer:
    """What the reviewer requires: the allowed signers (None: any valid signature is shown, none required)."""

    allowed: list[sshsig.AllowedSigner] | None = None
    name: str | None = None
    principal: str | None = None
    unreadable_lines: tuple = ()
    oms_public_key: Path | None = None  # requires SEAL/model.sig, verified with it


def read_reviewer(allowed_signers: str | os.PathLike | None, principal: str | None,
                  oms_public_key: str | os.PathLike | None = None) -> Reviewer:
    oms_key = None
    if oms_public_key is not None:
        from ..seal.oms import read_public_key

        oms_key = Path(oms_public_key)
        read_public_key(oms_key)
    reviewer = _read_allowed_signers(allowed_signers, principal)
    reviewer.oms_public_key = oms_key
    return reviewer


def _read_allowed_signers(allowed_signers: str | os.PathLike | None, principal: str | None) -> Reviewer:
    if allowed_signers is None:
        if principal is not None:
            raise UsageError("--signer names a principal of the allowed signers: give --allowed-signers FILE too")
        return Reviewer()
    path = Path(allowed_signers)
    try:
        with open(path, "rb") as fh:
            data = fh.read(ALLOWED_SIGNERS_MAX + 1)
    except OSError as exc:
        raise UsageError(f"--allowed-signers {path}: cannot read ({exc.strerror or exc})") from None
    if len(data) > ALLOWED_SIGNERS_MAX:
        raise UsageError(f"--allowed-signers {path}: larger than {ALLOWED_SIGNERS_MAX} bytes")
    entries, problems = sshsig.parse_allowed_signers(data.decode("utf-8", "replace"))
    if not any(entry.key is not None for entry in entries):
        why = f" (line {problems[0][0]}: {problems[0][1]})" if problems else ""
        raise UsageError(f"--allowed-signers {path}: no allowed signer this tool can use{why}; each line is "
                         "`PRINCIPALS [OPTIONS] KEYTYPE BASE64-KEY` (ssh-keygen(1), ALLOWED SIGNERS)")
    return Reviewer(entries, path.name, principal, tuple(problems))


def _archive_signature(archive: Path) -> tuple[bytes | None, str | None]:
    """`<archive>.sig`, read as every file beside an archive is (push/beside.py: no link followed, no fifo waited
    on, at most its limit): (its bytes or None, why it was not read)."""
    beside = archive.with_name(archive.name + ARCHIVE_SIG_SUFFIX)
    try:
        return read_beside(beside, sshsig.MAX_SIGNATURE_FILE), None
    except NotSmallFile as exc:
        return None, f"{exc.strerror}: not read (a regular file of at most {sshsig.MAX_SIGNATURE_FILE} bytes is)"
    except OSError as exc:
        raise UsageError(f"{beside}: cannot read ({exc.strerror or exc})") from None


def check_signatures(archive: Path, fd: int | None, extraction: Extraction, reviewer: Reviewer,
                     remote=None, unread: list[dict] | None = None) -> SealSignatures | None:
    """The seal's signatures checked against this archive; None when its stream could not be read whole.
    `remote` (push/remote.RemoteArchive): the archive is an object in a bucket, `.sig` the object beside it.
    A `.sig` that is not a small regular file (a fifo, a huge file) is not read: `unread` gets a note, and when
    the reviewer requires signers it is an archive signature that does not verify (IV802)."""
    if extraction.error is not None:
        return None

    def digest(name: str) -> bytes:
        if name == "sha256" and extraction.archive_sha256:
            return bytes.fromhex(extraction.archive_sha256)
        if remote is not None:  # a signature made with sha512: the object read again, in ranges
            return bytes.fromhex(remote.sha256(name))
        with os.fdopen(os.dup(fd), "rb") as source:  # a signature made with sha512: read the archive again
            source.seek(0)
            return hashlib.file_digest(source, name).digest()

    seal = extraction.seal_files
    signature, not_read = (_archive_signature(archive) if remote is None
                           else (remote.sidecar(ARCHIVE_SIG_SUFFIX, sshsig.MAX_SIGNATURE_FILE), None))
    model_signing = None
    if OMS_SIGNATURE in seal or reviewer.oms_public_key is not None:
        from ..seal.oms import check

        model_signing = check(seal.get(OMS_SIGNATURE), reviewer.oms_public_key, extraction.files)
    result = check_seal(statement=seal.get(STATEMENT), statement_sig=seal.get(STATEMENT_SIG),
                        archive_sig=signature, archive_digest=digest, content=sealed_content(extraction),
                        allowed=reviewer.allowed, principal=reviewer.principal, now=time.time(),
                        model_signature_verified=(model_signing or {}).get("state") == "valid")
    if not_read is not None:
        if unread is not None:
            unread.append({"path": archive.name + ARCHIVE_SIG_SUFFIX, "why": not_read})
        if result.required:
            result.archive = SignatureCheck("invalid", problem=f"{archive.name}{ARCHIVE_SIG_SUFFIX} is {not_read}")
    result.allowed_signers = reviewer.name
    result.unreadable_lines = list(reviewer.unreadable_lines)
    result.model_signing = model_signing
    return result


def sealed_content(extraction: Extraction) -> SealedContent:
    """What the statement is compared with: the SEAL/ records, every file's digest, SHA256SUMS parsed, the listing
    of every header but the statement pair's, the members that are not files, the skippable frames."""
    top, seal = extraction.top, extraction.seal_files
    try:
        listed = parse_sums(seal[SUMS]) if SUMS in seal else None
    except SumsError:
        listed = None  # IV701 (rules/archive.py)
    pair = {f"{top}/{STATEMENT}", f"{top}/{STATEMENT_SIG}"}
    headers = [h for h in extraction.headers if not (h[1] == "file" and h[0] in pair)]
    others = [(name[len(top) + 1:].rstrip("/"), kind) for name, kind, *_ in extraction.headers
              if kind != "file" and (name == f"{top}/" or name.startswith(f"{top}/"))]
    return SealedContent(top, seal.get(SUMS), seal.get(RECORD), seal.get(OMS_SIGNATURE), dict(extraction.files),
                         listed, member_listing(headers), others,
                         (extraction.skippable.frames, extraction.skippable.bytes, extraction.skippable.first))
