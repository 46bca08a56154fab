"""IV801–IV803: whose package it is. The audit checks a signed seal's signatures (flows/signatures.py, with the
pure verifier of format/sshsig.py) and hands the facts here (format/statement.py SealSignatures); this module
alone turns them into findings, as rules/archive.py does for the archive's own facts. Nothing is checked on a
package folder: `check` yields nothing."""
from __future__ import annotations

from typing import Iterator

from ..format.names import ARCHIVE_SIG_SUFFIX, OMS_SIGNATURE, STATEMENT, STATEMENT_SIG
from ..format.statement import NAMESPACE, SealSignatures
from ..model import Finding, Rule, Severity
from ..package import RunContext

_VERIFY = (f"ssh-keygen -Y verify -f allowed_signers -I alice@example.com -n {NAMESPACE} "
           "-s reviews-lora-2026-11.tar.zst.sig < reviews-lora-2026-11.tar.zst")

RULES = [
    Rule("IV801", Severity.ERROR, "audit: a signature is required and the archive carries none",
         explain="With --allowed-signers the reviewer requires the package to be signed by one of them: the seal "
                 f"writes {STATEMENT} (the campaign id and the SHA-256 of SEAL/SHA256SUMS and of the report) and "
                 f"{STATEMENT_SIG}, its OpenSSH signature, when the sender runs `itera-verify OUTDIR --sign "
                 "ssh:~/.ssh/id_ed25519.pub` (the key in ssh-agent). An archive without them may come from anyone "
                 "who could touch it on its way. Ask the sender to seal again with --sign. With --oms-public-key "
                 f"the reviewer requires {OMS_SIGNATURE}, an OpenSSF model-signing signature (--sign "
                 "model-signing:KEY.pem), in the same way.",
         bad="itera-verify audit x.tar.zst --allowed-signers signers   # x sealed without --sign",
         good="itera-verify OUTDIR --sign ssh:~/.ssh/id_ed25519.pub   # then the audit names the signer"),
    Rule("IV802", Severity.ERROR, "audit: a signature does not verify, or covers other content",
         explain="A signature present in the archive or beside it must verify (OpenSSH's SSHSIG format, namespace "
                 f"{NAMESPACE}) and the signed statement must name this archive's SEAL/SHA256SUMS and "
                 "SEAL/verification.json by their SHA-256, and its campaign. A changed member with a recomputed "
                 "SHA256SUMS (a re-sealed archive), a swapped statement or report, a damaged signature, "
                 f"`<archive>{ARCHIVE_SIG_SUFFIX}` for other bytes, or two different keys for the statement and the "
                 "archive are reported here, with or without --allowed-signers; so is a statement without its "
                 "signature. The statement also binds SEAL/model.sig and the listing of every member's header "
                 "(name, type, size, mode, time, link target): a member added, removed or renamed, a folder, link, "
                 "mode or time changed is reported here too. With --allowed-signers every member must be covered "
                 "by what the allowed signer signed, with or without the archive's .sig: a skippable zstd frame "
                 "holding bytes, and, in an archive sealed by an older version (whose statement binds the files "
                 "SHA256SUMS lists only), an unlisted file, a link, a folder holding no listed file or a "
                 f"{OMS_SIGNATURE} not verified with --oms-public-key, is IV802. So is an OpenSSF model-signing "
                 f"signature ({OMS_SIGNATURE}) that is not a JSON Sigstore bundle, that the reviewer's "
                 "--oms-public-key does not verify, or whose signed file digests differ from the archive's files. "
                 "Ask the sender for the archive and its .sig again.",
         bad="SEAL/SHA256SUMS is not the one signed (a member was changed and the sums recomputed)",
         good=_VERIFY + "   # Good \"itera-verify-seal@v1\" signature"),
    Rule("IV803", Severity.ERROR, "audit: the signer is not an allowed signer",
         explain="The signature is valid, but its key is not in the reviewer's allowed_signers file (OpenSSH "
                 "format: `PRINCIPALS [namespaces=\"...\",valid-after=...,valid-before=...] KEYTYPE KEY`), or not "
                 "for the principal --signer names, or the line's namespaces or validity exclude it now. The "
                 "archive was sealed by someone else's key: whoever holds it could have changed anything. Compare "
                 "the signer's fingerprint shown in the report with the key you registered for the sender.",
         bad="signed by SHA256:Xb… which no line of allowed_signers holds",
         good="alice@example.com namespaces=\"itera-verify-seal@v1\" ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAA…"),
]


def check(ctx: RunContext) -> Iterator[Finding]:
    return iter(())


def signature_findings(facts: SealSignatures, top: str | None, archive_name: str) -> list[Finding]:
    findings = []
    statement_path = f"{top}/{STATEMENT_SIG}"
    sig_name = archive_name + ARCHIVE_SIG_SUFFIX
    if facts.required and facts.statement.state == "absent":
        beside = f" ({sig_name} beside it does not replace the signed statement)" if facts.archive.state != "absent" \
            else ""
        findings.append(Finding("IV801", f"{top}/{STATEMENT}", message=(
            f"the archive carries no signed statement and the reviewer requires a signer (--allowed-signers "
            f"{facts.allowed_signers}){beside}")))
    for check, path, what in ((facts.statement, statement_path, f"the signature of {STATEMENT}"),
                              (facts.archive, sig_name, f"the archive's signature {sig_name}")):
        if check.state == "invalid":
            claimed = f" (it names the key {check.key.fingerprint})" if check.key is not None else ""
            findings.append(Finding("IV802", path, message=f"{what} does not verify: {check.problem}{claimed}"))
    for problem in facts.content:
        findings.append(Finding("IV802", f"{top}/{STATEMENT}",
                                message=f"the signed statement does not cover this archive: {problem}"))
    for path, problem in facts.uncovered:
        findings.append(Finding("IV802", path or archive_name, message=(
            f"not covered by what the allowed signer signed (--allowed-signers {facts.allowed_signers}): "
            f"{problem}")))
    if facts.two_keys:
        findings.append(Finding("IV802", sig_name, message=(
            f"the statement is signed by {facts.statement.key.fingerprint} and the archive by "
            f"{facts.archive.key.fingerprint}: one seal, one key")))
    oms = facts.model_signing or {}
    oms_path = f"{top}/{OMS_SIGNATURE}"
    if oms.get("state") == "absent" and oms.get("required"):
        findings.append(Finding("IV801", oms_path, message=(
            "the archive carries no model-signing signature and the reviewer requires one (--oms-public-key)")))
    elif oms.get("state") == "invalid":
        findings.append(Finding("IV802", oms_path, message=(
            f"the model-signing signature does not verify: {oms.get('problem')}")))
    signer = facts.signer
    if facts.required and signer is not None and not facts.principals:
        wanted = f" for {facts.principal!r}" if facts.principal else ""
        findings.append(Finding("IV803", statement_path if facts.statement.state == "valid" else sig_name, message=(
            f"signed by {signer.algorithm} key {signer.fingerprint}, which {facts.allowed_signers} does not "
            f"allow{wanted} in namespace {NAMESPACE}")))
    for finding in findings:
        finding.severity = Severity.ERROR  # the reviewer's requirement; no configuration lowers it
    return findings
