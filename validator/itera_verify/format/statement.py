"""The signed seal's statement (docs/format.md, signatures): what the seal signs, and how an audit checks
it.

`SEAL/statement.json` names the campaign and binds every other member of the archive: the SHA-256 of
`SEAL/SHA256SUMS` (which lists every file's digest, the report's too) and of `SEAL/verification.json`, of
`SEAL/model.sig` (null when the seal wrote none), and the digest of the member listing (archive/canonical.py
`member_listing`: every header but the statement pair's, so every folder, link, mode and time).
`SEAL/statement.json.sig` is its OpenSSH signature in the namespace below, and `<archive>.sig` beside the archive
the same key's signature over the archive's bytes. Neither statement member is listed in SHA256SUMS or in the
member listing (the statement holds their digests). Pure: the seal and the audit hand the bytes in.

A statement written before the member listing and model.sig's digest were added (itera-verify 0.1, type
`itera-verify-seal/1` without `members`) binds the files SHA256SUMS lists and nothing else: with required signers,
a link, a folder holding no listed file, or a `SEAL/model.sig` that the reviewer's --oms-public-key does not verify
is not covered in such an archive (docs/format.md).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Callable

from . import sshsig
from .names import OMS_SIGNATURE, RECORD, STATEMENT, STATEMENT_SIG, SUMS

NAMESPACE = "itera-verify-seal@v1"
STATEMENT_TYPE = "itera-verify-seal/1"  # unchanged by the added fields: older audits still read new statements
STATEMENT_MAX = 1 << 20
MEMBERS = "members"  # the statement's key for the member listing: {"count": int, "sha256": hex}
SHOWN = 5  # names shown in one finding's message


def statement_bytes(*, campaign_id: str, sums: bytes, record: bytes | None, model_signature: bytes | None,
                    members: tuple[int, str], tool: str, version: str, sealed_at: str, host: dict,
                    signer: sshsig.PublicKey) -> bytes:
    """`members`: archive/canonical.member_listing of every member the archive will hold but the statement pair."""
    def digest(data: bytes | None) -> str | None:
        return hashlib.sha256(data).hexdigest() if data is not None else None

    statement = {
        "type": STATEMENT_TYPE, "campaign_id": campaign_id,
        "sha256": {SUMS: digest(sums), RECORD: digest(record), OMS_SIGNATURE: digest(model_signature)},
        MEMBERS: {"count": members[0], "sha256": members[1]},
        "tool": tool, "version": version, "sealed_at": sealed_at, "host": host,
        "signer": {"key": signer.openssh, "fingerprint": signer.fingerprint},
    }
    return (json.dumps(statement, indent=2, sort_keys=True, ensure_ascii=True) + "\n").encode("ascii")


@dataclass
class SealedContent:
    """What the audit read from the archive, for the statement to be compared with (flows/signatures.py)."""

    top: str | None
    sums: bytes | None = None  # the SEAL/ members' bytes, None when absent
    record: bytes | None = None
    model_signature: bytes | None = None
    files: dict[str, str] = field(default_factory=dict)  # every regular file under the top folder -> sha256
    listed: dict[str, str] | None = None  # SEAL/SHA256SUMS parsed (None: absent or malformed, IV701/IV702)
    members: tuple[int, str] = (0, "")  # member_listing of every header but the statement pair's
    others: list[tuple[str, str]] = field(default_factory=list)  # (name under the top folder, kind): not files
    skippable: tuple[int, int, int | None] = (0, 0, None)  # skippable zstd frames with bytes: count, bytes, first


@dataclass
class SignatureCheck:
    """One signature file: absent, valid (its key), or invalid (why)."""

    state: str = "absent"  # absent | valid | invalid
    key: sshsig.PublicKey | None = None
    problem: str | None = None

    def to_json(self) -> dict:
        out: dict = {"state": self.state}
        if self.key is not None:
            out.update(fingerprint=self.key.fingerprint, algorithm=self.key.algorithm)
        if self.problem:
            out["problem"] = self.problem
        return out


def check_signature(data: bytes | None, message: bytes | None = None,
                    digest: Callable[[str], bytes] | None = None) -> SignatureCheck:
    if data is None:
        return SignatureCheck()
    try:
        return SignatureCheck("valid", sshsig.verify(data, NAMESPACE, message, digest).key)
    except sshsig.SshSigError as exc:
        key = None
        try:  # who claims to have signed, for the report, when the blob can be read at all
            key = sshsig.parse_signature(data).key
        except sshsig.SshSigError:
            pass
        return SignatureCheck("invalid", key, str(exc))


@dataclass
class SealSignatures:
    """What an audit found about a seal's signatures; rules/signatures.py turns it into IV801-IV803."""

    statement: SignatureCheck  # SEAL/statement.json.sig over SEAL/statement.json
    archive: SignatureCheck  # <archive>.sig over the archive's bytes
    statement_present: bool = False
    content: list[str] = field(default_factory=list)  # how the statement disagrees with this archive
    two_keys: bool = False  # the statement and the archive are signed by different keys
    required: bool = False  # the reviewer gave allowed signers
    allowed_signers: str | None = None  # its name, for the report
    unreadable_lines: list[tuple[int, str]] = field(default_factory=list)
    principal: str | None = None  # --signer
    principals: list[str] | None = None  # the allowed signers' principals admitting the signer (None: not asked)
    facts: dict = field(default_factory=dict)  # the statement's sealed_at, host, version (short strings)
    model_signing: dict | None = None  # SEAL/model.sig as the audit checked it (flows/signatures.py, seal/oms.py)
    # With required signers: (path shown, why) for what the allowed signer's statement does not cover; path "" is
    # the archive itself (a skippable frame).
    uncovered: list[tuple[str, str]] = field(default_factory=list)

    @property
    def signer(self) -> sshsig.PublicKey | None:
        for check in (self.statement, self.archive):
            if check.state == "valid":
                return check.key
        return None

    def to_json(self) -> dict:
        signer = self.signer
        return {
            "signed": self.statement.state != "absent", "signer": signer.fingerprint if signer else None,
            "algorithm": signer.algorithm if signer else None,
            "statement": self.statement.to_json(), "archive_signature": self.archive.to_json(),
            "content_problems": list(self.content), "uncovered": [why for _, why in self.uncovered],
            "allowed_signers": self.allowed_signers,
            "required_principal": self.principal, "principals": self.principals, "statement_facts": self.facts,
            **({"model_signing": self.model_signing} if self.model_signing is not None else {}),
        }


def _short(value) -> str | None:
    return value[:200] if isinstance(value, str) else None


def check_seal(*, statement: bytes | None, statement_sig: bytes | None, archive_sig: bytes | None,
               archive_digest: Callable[[str], bytes], content: SealedContent,
               allowed: list[sshsig.AllowedSigner] | None = None, principal: str | None = None,
               now: float = 0.0, model_signature_verified: bool = False) -> SealSignatures:
    """The statement's signature, its content against this archive, the archive's own signature, and (with
    `allowed`) whether the allowed signers admit the signer and whether the statement covers every member.
    `model_signature_verified`: SEAL/model.sig verified with the reviewer's --oms-public-key (what covers it in
    an archive whose older statement does not name it)."""
    result = SealSignatures(check_signature(statement_sig, statement or b""),
                            check_signature(archive_sig, digest=archive_digest),
                            statement_present=statement is not None, required=allowed is not None,
                            principal=principal)
    if statement_sig is not None and statement is None:
        result.content.append(f"{STATEMENT_SIG} is there but {STATEMENT} is missing")
    if statement is not None and statement_sig is None:
        result.content.append(f"{STATEMENT} is there but {STATEMENT_SIG} is missing: nothing signed that statement, "
                              "so it vouches for nothing")
    if allowed is not None:  # whatever the statement says: no signature of the seal covers these bytes
        frames, size, first = content.skippable
        if frames:
            result.uncovered = [("", f"{frames} skippable zstd frame(s) holding {size} bytes, the first at offset "
                                     f"{first}: zstd and tar pass over them unread, and no signature of the seal "
                                     "covers them")]
    if statement is not None and result.statement.state == "valid":
        parsed = _parsed(statement)
        if parsed is None:
            result.content.append("the signed statement is not an itera-verify seal statement")
        else:
            result.content += _content_problems(parsed, content, result.facts)
            if allowed is not None and not result.content:
                result.uncovered += _uncovered(parsed, content, model_signature_verified)
    keys = {c.key.blob for c in (result.statement, result.archive) if c.state == "valid"}
    result.two_keys = len(keys) > 1
    signer = result.signer
    if allowed is not None and signer is not None:
        result.principals = sshsig.allowed_principals(allowed, signer, NAMESPACE, now, principal)
    return result


def _parsed(statement: bytes) -> dict | None:
    try:
        parsed = json.loads(statement) if len(statement) <= STATEMENT_MAX else None
    except (ValueError, RecursionError):
        return None
    if not isinstance(parsed, dict) or parsed.get("type") != STATEMENT_TYPE or \
            not isinstance(parsed.get("sha256"), dict):
        return None
    return parsed


def _content_problems(parsed: dict, content: SealedContent, facts: dict) -> list[str]:
    facts.update({k: _short(parsed.get(k)) for k in ("sealed_at", "version", "campaign_id")})
    host = parsed.get("host") if isinstance(parsed.get("host"), dict) else {}
    facts["host"] = {k: _short(v) for k, v in list(host.items())[:8] if isinstance(k, str) and _short(v)}
    problems = []
    if parsed.get("campaign_id") != content.top:
        problems.append(f"the statement is for campaign {_short(parsed.get('campaign_id'))!r}, the archive holds "
                        f"{content.top!r}")
    bound = [(SUMS, content.sums), (RECORD, content.record)]
    if OMS_SIGNATURE in parsed["sha256"]:  # an older statement names none (module docstring)
        bound.append((OMS_SIGNATURE, content.model_signature))
    for name, data in bound:
        signed = parsed["sha256"].get(name)
        if data is None and signed is not None:
            problems.append(f"{name} is missing: the statement signs sha256 {_short(signed)}")
        elif data is not None and signed is None and name == OMS_SIGNATURE:
            problems.append(f"{name} is in the archive but the statement signs none: it was added after the seal")
        elif data is not None and signed != hashlib.sha256(data).hexdigest():
            problems.append(f"{name} is not the one signed (sha256 {hashlib.sha256(data).hexdigest()[:12]}…, "
                            f"signed {str(_short(signed))[:12]}…)")
    if MEMBERS in parsed:
        problems += _listing_problems(parsed[MEMBERS], content)
    return problems


def _listing_problems(signed, content: SealedContent) -> list[str]:
    if not (isinstance(signed, dict) and type(signed.get("count")) is int and isinstance(signed.get("sha256"), str)):
        return [f"the statement's {MEMBERS} entry is not {{\"count\": N, \"sha256\": hex}}"]
    count, digest = content.members
    if (signed["count"], signed["sha256"]) == (count, digest):
        return []
    unlisted = _unlisted(content)
    named = f"; not in the signed SHA256SUMS: {_names(unlisted)}" if unlisted else ""
    return [f"the archive's members are not the ones signed ({signed['count']} signed, {count} here: a member "
            f"added, removed or renamed, or a folder, link, mode or time changed){named}"]


def _unlisted(content: SealedContent) -> list[str]:
    """Files SHA256SUMS does not list, besides the SEAL/ members the statement binds by their own digest."""
    listed = content.listed or {}
    return sorted(rel for rel in content.files if rel not in listed and rel not in
                  (SUMS, OMS_SIGNATURE, STATEMENT, STATEMENT_SIG))


def _names(names: list[str]) -> str:
    more = f" and {len(names) - SHOWN} more" if len(names) > SHOWN else ""
    return ", ".join(names[:SHOWN]) + more


def _uncovered(parsed: dict, content: SealedContent, model_signature_verified: bool) -> list[tuple[str, str]]:
    """What the reviewer's required signer did not sign, the statement's content being this archive's, in an
    archive with an older statement: a SEAL/model.sig not verified with --oms-public-key, a file SHA256SUMS does
    not list, a link, and a folder holding no covered file."""
    top = content.top
    found: list[tuple[str, str]] = []
    older_model = content.model_signature is not None and OMS_SIGNATURE not in parsed["sha256"]
    if older_model and not model_signature_verified:
        found.append((f"{top}/{OMS_SIGNATURE}", f"{OMS_SIGNATURE} is not covered by the signed statement (a "
                                                "statement of an older seal names no model.sig) and was not "
                                                "verified with --oms-public-key"))
    if MEMBERS in parsed:
        return found  # the listing binds every header, compared in _content_problems
    found += [(f"{top}/{rel}", f"{rel} is not listed in the signed SHA256SUMS") for rel in _unlisted(content)]
    covered = [rel for rel in content.files if rel in (content.listed or {}) or rel == SUMS]
    for rel, kind in content.others:
        if kind == "directory" and any(f.startswith(rel + "/" if rel else "") for f in covered):
            continue  # tar creates it for the covered files beneath it anyway
        what = "a symbolic link" if kind == "symlink" else f"a {kind} holding no listed file"
        found.append((f"{top}/{rel}" if rel else f"{top}/", f"{what}: a statement of an older seal binds the files "
                      "SHA256SUMS lists and nothing else (seal again with this version to bind every member)"))
    return found
