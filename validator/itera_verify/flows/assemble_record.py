"""What `assemble` records of each part it audited, for the reviewer's later verify (flows/partproofs.py).

A lot's signed reload proof may stand for an artifact the assembling machine cannot reload, but only in a package
this reviewer's own `assemble` wrote: a sender can write `manifest.parts` and `provenance/<lot>/` by hand and sign
them with its own key. So `assemble` writes, beside each part's kept records, `provenance/<lot>/assembled.json`:
the campaign, the lot, the part archive it audited (name, SHA-256, signer) and the SHA-256 of every file it kept
there, authenticated with the reviewer's key (runtime/reviewer_key.py). Only the holder of the key makes one that
verifies; a record missing, edited, or bound to other files proves nothing, and the lot's proof then stands for
nothing.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..format.parts import PROVENANCE
from ..runtime.reviewer_key import authentic_record, authenticated

ASSEMBLED = "assembled.json"  # in provenance/<lot>/, beside the part's own records (format/parts.py SEAL_RECORDS)
ASSEMBLED_FORMAT = "itera-verify-assembled/1"
ASSEMBLED_MAX = 1 << 20  # a handful of names and digests


def assembled_record(key: bytes, campaign_id: str, lot: str, part: dict, kept: dict[str, str]) -> bytes:
    """The record of one part: `part` its manifest.parts entry (lot, archive, sha256, signer), `kept` the files
    written under provenance/<lot>/ (name -> sha256)."""
    return authenticated(key, ASSEMBLED_FORMAT, {
        "format": ASSEMBLED_FORMAT, "campaign_id": campaign_id, "lot": lot,
        "archive": part.get("archive"), "archive_sha256": part.get("sha256"), "signer": part.get("signer"),
        "files": dict(sorted(kept.items()))})


@dataclass(frozen=True)
class Assembled:
    """A part as this reviewer's assemble recorded it."""

    archive: str | None
    archive_sha256: str
    signer: str | None
    files: dict[str, str]  # name under provenance/<lot>/ -> sha256


def checked_record(key: bytes | None, value, campaign_id, lot: str, entry: dict, digest_of) -> Assembled | str:
    """The record read back (`value`, parsed), or why it proves nothing: not this key's, of another campaign,
    lot or part archive than manifest.parts' `entry` says, or a kept file not the one recorded (`digest_of(rel)`:
    the package file's SHA-256, None when it is not there)."""
    folder = f"{PROVENANCE}/{lot}"
    record = authentic_record(key, ASSEMBLED_FORMAT, value)
    if record is None:
        return (f"{folder}/{ASSEMBLED} is missing or not authenticated by this reviewer's key: this package was not "
                "assembled here, and its lots' proofs are their senders' word")
    if record.get("format") != ASSEMBLED_FORMAT or record.get("campaign_id") != campaign_id or \
            record.get("lot") != lot:
        return f"{folder}/{ASSEMBLED} records another campaign or lot"
    if record.get("archive_sha256") != entry.get("sha256") or not isinstance(record.get("archive_sha256"), str):
        return f"manifest.parts names another part archive for {lot} than the one assemble audited"
    files = record.get("files")
    if not isinstance(files, dict) or not files:
        return f"{folder}/{ASSEMBLED} lists no file"
    for name, digest in files.items():
        if digest_of(f"{folder}/{name}") != digest:
            return f"{folder}/{name} is not the file assemble kept there"
    signer = record.get("signer")
    return Assembled(record.get("archive") if isinstance(record.get("archive"), str) else None,
                     record["archive_sha256"], signer if isinstance(signer, str) else None, dict(files))
