"""The signed seal's statement (SPEC §7 "Signed seals"): what the seal signs, and how an audit checks it.

`SEAL/statement.json` names the campaign and the SHA-256 of `SEAL/SHA256SUMS` (which lists every member's
digest, the report's too) and of `SEAL/verification.json`; `SEAL/statement.json.sig` is its OpenSSH signature in
the namespace below, and `<archive>.sig` beside the archive the same key's signature over the archive's bytes.
Neither statement member is listed in SHA256SUMS (the statement holds SHA256SUMS's digest). Pure: the seal and
the audit hand the bytes in.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Callable

from . import sshsig
from .names import RECORD, SUMS

NAMESPACE = "itera-verify-seal@v1"
STATEMENT_TYPE = "itera-verify-seal/1"
STATEMENT_MAX = 1 << 20


def statement_bytes(*, campaign_id: str, sums: bytes, record: bytes | None, tool: str, version: str,
                    sealed_at: str, host: dict, signer: sshsig.PublicKey) -> bytes:
    statement = {
        "type": STATEMENT_TYPE, "campaign_id": campaign_id,
        "sha256": {SUMS: hashlib.sha256(sums).hexdigest(),
                   RECORD: hashlib.sha256(record).hexdigest() if record is not None else None},
        "tool": tool, "version": version, "sealed_at": sealed_at, "host": host,
        "signer": {"key": signer.openssh, "fingerprint": signer.fingerprint},
    }
    return (json.dumps(statement, indent=2, sort_keys=True, ensure_ascii=True) + "\n").encode("ascii")


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
            "content_problems": list(self.content), "allowed_signers": self.allowed_signers,
            "required_principal": self.principal, "principals": self.principals, "statement_facts": self.facts,
            **({"model_signing": self.model_signing} if self.model_signing is not None else {}),
        }


def _short(value) -> str | None:
    return value[:200] if isinstance(value, str) else None


def check_seal(*, statement: bytes | None, statement_sig: bytes | None, archive_sig: bytes | None,
               archive_digest: Callable[[str], bytes], sums: bytes | None, record: bytes | None, top: str | None,
               allowed: list[sshsig.AllowedSigner] | None = None, principal: str | None = None,
               now: float = 0.0) -> SealSignatures:
    """The statement's signature, its content against this archive's SEAL/SHA256SUMS and report, the archive's
    own signature, and (with `allowed`) whether the allowed signers admit the signer."""
    result = SealSignatures(check_signature(statement_sig, statement or b""),
                            check_signature(archive_sig, digest=archive_digest),
                            statement_present=statement is not None, required=allowed is not None,
                            principal=principal)
    if statement_sig is not None and statement is None:
        result.content.append("SEAL/statement.json.sig is there but SEAL/statement.json is missing")
    if statement is not None and result.statement.state == "valid":
        result.content += _content_problems(statement, sums, record, top, result.facts)
    keys = {c.key.blob for c in (result.statement, result.archive) if c.state == "valid"}
    result.two_keys = len(keys) > 1
    signer = result.signer
    if allowed is not None and signer is not None:
        result.principals = sshsig.allowed_principals(allowed, signer, NAMESPACE, now, principal)
    return result


def _content_problems(statement: bytes, sums: bytes | None, record: bytes | None, top: str | None,
                      facts: dict) -> list[str]:
    try:
        parsed = json.loads(statement) if len(statement) <= STATEMENT_MAX else None
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict) or parsed.get("type") != STATEMENT_TYPE or \
            not isinstance(parsed.get("sha256"), dict):
        return ["the signed statement is not an itera-verify seal statement"]
    facts.update({k: _short(parsed.get(k)) for k in ("sealed_at", "version", "campaign_id")})
    host = parsed.get("host") if isinstance(parsed.get("host"), dict) else {}
    facts["host"] = {k: _short(v) for k, v in list(host.items())[:8] if isinstance(k, str) and _short(v)}
    problems = []
    if parsed.get("campaign_id") != top:
        problems.append(f"the statement is for campaign {_short(parsed.get('campaign_id'))!r}, the archive holds "
                        f"{top!r}")
    for name, data in ((SUMS, sums), (RECORD, record)):
        signed = parsed["sha256"].get(name)
        if data is None:
            problems.append(f"{name} is missing: the statement signs sha256 {_short(signed)}")
        elif signed != hashlib.sha256(data).hexdigest():
            problems.append(f"{name} is not the one signed (sha256 {hashlib.sha256(data).hexdigest()[:12]}…, "
                            f"signed {str(_short(signed))[:12]}…)")
    return problems
