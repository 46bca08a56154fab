"""A lot's own reload proof, for an artifact the assembling machine cannot reload (docs/record.md, "Two lots").

Each lot reloads its artifacts on its own GPU when it seals its part, and the part's signed statement binds that
record (`SEAL/verification.json`) and the digest of every file (`SEAL/SHA256SUMS`). `assemble` keeps both, with
the statement and its signature, under `provenance/<lot>/`. When the whole campaign is verified on another
machine, an artifact whose reload there failed for want of memory only (reload/limits.py `lacked_memory`: no GPU
of that size), or timed out on the CPU where the lot had reloaded it on a GPU, stands on the lot's proof when:

- the statement's signature verifies (with `--allowed-signers`, by one of them) and binds both records;
- the record passed and reloaded that artifact, ok;
- every file of the artifact here is, byte for byte, what the lot's SHA256SUMS lists.

Any other failure is never excused, and the report says which artifacts were reloaded where
(`facts.reloaded_on` of the reload).
"""
from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field, replace

from ..archive import SumsError, parse_sums
from ..format import sshsig
from ..format.names import RECORD, STATEMENT, STATEMENT_SIG, SUMS
from ..format.parts import PROVENANCE, SEAL_RECORDS, run_lot
from ..format.statement import NAMESPACE, check_signature
from ..model import ReloadResult
from ..package import RunContext
from ..package.campaign import listed
from ..package.jsonread import read_json
from ..reload.limits import lacked_memory

RECORD_MAX = 64 << 20  # a part's records: a report and a checksum list, never this large


@dataclass
class PartRecord:
    """What provenance/<lot>/ proves, once checked: `problem` None when the lot's statement stands."""

    lot: str
    archive: str | None = None
    signer: str | None = None  # the principal, else the key's fingerprint
    problem: str | None = None
    reloads: dict[str, dict] = field(default_factory=dict)  # artifact id -> the lot's reload entry
    sums: dict[str, str] = field(default_factory=dict)


def part_records(ctx: RunContext) -> dict[str, PartRecord]:
    """Each part manifest.parts names, with its provenance checked (once per run context)."""
    return ctx.documents.derived("part-records", lambda: _part_records(ctx))


def _part_records(ctx: RunContext) -> dict[str, PartRecord]:
    allowed = _allowed(ctx)
    records = {}
    for entry in listed(ctx.documents.manifest, "parts"):
        lot = entry.get("lot") if isinstance(entry, dict) else None
        if isinstance(lot, str) and lot not in records:
            archive = entry.get("archive") if isinstance(entry.get("archive"), str) else None
            records[lot] = _checked(ctx, PartRecord(lot, archive), allowed)
    return records


def _allowed(ctx: RunContext) -> list | None:
    if ctx.options.allowed_signers is None:
        return None
    from .signatures import read_reviewer

    return read_reviewer(ctx.options.allowed_signers, ctx.options.signer).allowed


def _read(ctx: RunContext, rel: str) -> bytes | None:
    entry = ctx.inventory.files.get(rel)
    return ctx.documents.read_bytes(rel) if entry is not None and entry.size <= RECORD_MAX else None


def _checked(ctx: RunContext, record: PartRecord, allowed: list | None) -> PartRecord:
    folder = f"{PROVENANCE}/{record.lot}"
    statement, signature, sums, report = (_read(ctx, f"{folder}/{SEAL_RECORDS[member]}")
                                          for member in (STATEMENT, STATEMENT_SIG, SUMS, RECORD))
    if statement is None or signature is None:
        record.problem = "the part was not signed: its reload record is the lot's word alone"
        return record
    if sums is None or report is None:
        record.problem = f"{folder}/ lacks the part's SHA256SUMS or verification.json"
        return record
    checked = check_signature(signature, statement)
    if checked.state != "valid":
        record.problem = f"the part's statement signature does not verify ({checked.problem})"
        return record
    record.signer = checked.key.fingerprint
    if allowed is not None:
        principals = sshsig.allowed_principals(allowed, checked.key, NAMESPACE, time.time(), ctx.options.signer)
        if not principals:
            record.problem = f"the part was signed by {checked.key.fingerprint}, not an allowed signer"
            return record
        record.signer = principals[0]
    try:
        bound = read_json(statement).get("sha256") or {}
        verification = read_json(report)
        record.sums = parse_sums(sums)
    except (ValueError, AttributeError, SumsError) as exc:
        record.problem = f"the part's records do not read ({str(exc)[:120]})"
        return record
    if bound.get(SUMS) != hashlib.sha256(sums).hexdigest() or \
            bound.get(RECORD) != hashlib.sha256(report).hexdigest():
        record.problem = "the signed statement does not bind the part's SHA256SUMS and verification.json kept here"
        return record
    if not isinstance(verification, dict) or verification.get("verdict") != "pass":
        record.problem = "the part's record is not a passing verification"
        return record
    for reload in listed(verification, "reloads"):
        if isinstance(reload, dict) and isinstance(reload.get("artifact"), str):
            record.reloads.setdefault(reload["artifact"], reload)
    return record


def _could_not_here(result: ReloadResult, proof: dict) -> bool:
    """Failed here for want of memory alone, or timed out on the CPU where the lot reloaded it on a GPU."""
    problems = result.facts.get("problems") if isinstance(result.facts, dict) else None
    messages = [p.get("message") for p in problems if isinstance(p, dict)] if isinstance(problems, list) and \
        problems else [result.error]
    if messages and all(lacked_memory(m) for m in messages):
        return True
    return result.failure == "timeout" and result.device.startswith("cpu") and \
        str(proof.get("device", "")).startswith("cuda")


def stand_in(ctx: RunContext, reloads: list[ReloadResult]) -> list[ReloadResult]:
    """The reloads, each failed one that a lot's proof covers (module docstring) replaced by that proof."""
    if not listed(ctx.documents.manifest, "parts") or all(r.ok for r in reloads):
        return reloads
    records = part_records(ctx)
    runs = {run.get("id"): run for run in listed(ctx.documents.manifest, "runs") if isinstance(run, dict)}
    artifacts = {a.get("id"): a for a in ctx.documents.artifacts() if isinstance(a.get("id"), str)}
    out = []
    for result in reloads:
        artifact = artifacts.get(result.artifact) or {}
        record = records.get(run_lot(runs.get(artifact.get("run"))) or "")
        proof = record.reloads.get(result.artifact) if record is not None and record.problem is None else None
        if result.ok or proof is None or proof.get("ok") is not True or not _could_not_here(result, proof) \
                or not _same_bytes(ctx, artifact.get("path"), record.sums):
            out.append(result)
            continue
        device = str(proof.get("device") or "?")[:40]
        out.append(replace(result, ok=True, device=device, failure=None, error=None, forward=None, devices=[device],
                           seconds=float(_count(proof.get("seconds")) or 0),  # the lot's measures, not this one's
                           peak_memory_bytes=_count(proof.get("peak_memory_bytes")),
                           host_peak_memory_bytes=_count(proof.get("host_peak_memory_bytes")),
                           device_peak_memory_bytes=_count(proof.get("device_peak_memory_bytes")),
                           facts={"reloaded_on": {
                               "lot": record.lot, "device": device, "signer": record.signer,
                               "part": record.archive, "here": {"device": result.device, "error": result.error}}}))
    return out


def _count(value):
    """A non-negative number from the record (a sender's JSON: anything else is None)."""
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0 else None


def _same_bytes(ctx: RunContext, ref, sums: dict[str, str]) -> bool:
    """Every file of the artifact here is what the lot sealed (and the artifact has at least one file)."""
    rel = ctx.inventory.normalise_ref(ref) if isinstance(ref, str) else None
    files = ctx.inventory.files_under(rel) if rel else []
    return bool(files) and all(sums.get(name) == ctx.documents.sha256(name) for name in files)
