"""A lot's own reload proof, for an artifact the assembling machine cannot reload (docs/record.md, "Two lots").

Each lot reloads its artifacts on its own GPU when it seals its part, and the part's signed statement binds that
record (`SEAL/verification.json`) and the digest of every file (`SEAL/SHA256SUMS`). `assemble` keeps both, with
the statement and its signature, under `provenance/<lot>/`, and records there what it audited, authenticated with
the reviewer's key (flows/assemble_record.py). When the whole campaign is verified again, an artifact whose reload
failed here for want of memory, where its size on disk explains the want (`_size_explains`), stands on the lot's
proof when:

- `provenance/<lot>/assembled.json` is this reviewer's (its key), names the part archive manifest.parts names,
  and every file kept beside it is the one it recorded: a package its sender assembled, or whose provenance was
  written by hand, proves nothing (any sender can sign its own claim);
- the statement's signature verifies (with `--allowed-signers`, by one of them) and binds both records;
- the record passed and reloaded that artifact, ok;
- every file of the artifact here is, byte for byte, what the lot's SHA256SUMS lists.

A timeout is never excused (an artifact can make itself endless), nor any other failure. A stand-in is not a
reload: it stays `ok: false`, with the failure here, and `facts.reloaded_on` names the lot, its device and its
signer; the rules accept it (rules/reload.py) and the report says which artifacts were reloaded where.
"""
from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass, field, replace

from ..archive import SumsError, parse_sums
from ..format import sshsig
from ..format.names import RECORD, STATEMENT, STATEMENT_SIG, SUMS
from ..format.parts import PROVENANCE, SEAL_RECORDS, run_lot
from ..format.statement import NAMESPACE, check_signature
from ..model import STANDS_ON, ReloadResult, UsageError
from ..package import RunContext
from ..package.campaign import listed
from ..package.jsonread import read_json
from ..reload.limits import configured_limit, disk_bytes, lacked_memory, memory_limit
from ..runtime.reviewer_key import reviewer_key
from .assemble_record import ASSEMBLED, ASSEMBLED_MAX, Assembled, checked_record

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
    try:  # read, never made: a verify that finds no key finds no package assembled here
        key = reviewer_key(ctx.options.results_key, ctx.options.environment, create=False)
    except UsageError as exc:
        key, unusable = None, str(exc)
    else:
        unusable = None
    records = {}
    for entry in listed(ctx.documents.manifest, "parts"):
        lot = entry.get("lot") if isinstance(entry, dict) else None
        if isinstance(lot, str) and lot not in records:
            record = PartRecord(lot)
            assembled = unusable or _assembled(ctx, key, lot, entry)
            if isinstance(assembled, str):
                record.problem = assembled
            else:
                record.archive = assembled.archive
                _checked(ctx, record, allowed)
            records[lot] = record
    return records


def _assembled(ctx: RunContext, key: bytes | None, lot: str, entry: dict) -> Assembled | str:
    """What this reviewer's assemble recorded of the lot's part (flows/assemble_record.py), or why nothing."""
    rel = f"{PROVENANCE}/{lot}/{ASSEMBLED}"
    entry_ = ctx.inventory.files.get(rel)
    try:
        value = read_json(ctx.documents.read_bytes(rel)) if entry_ is not None and entry_.size <= ASSEMBLED_MAX \
            else None
    except ValueError:
        value = None
    assembled = checked_record(key, value, ctx.documents.manifest.get("campaign_id"), lot, entry,
                               lambda name: ctx.documents.sha256(name) if name in ctx.inventory.files else None)
    if isinstance(assembled, Assembled):
        unbound = [name for name in SEAL_RECORDS.values() if name not in assembled.files
                   and ctx.inventory.exists(f"{PROVENANCE}/{lot}/{name}")]
        if unbound:
            return f"{PROVENANCE}/{lot}/{unbound[0]} was not kept there by assemble"
    return assembled


def _allowed(ctx: RunContext) -> list | None:
    if ctx.options.allowed_signers is None:
        return None
    from .signatures import read_reviewer

    return read_reviewer(ctx.options.allowed_signers, ctx.options.signer).allowed


def _read(ctx: RunContext, rel: str) -> bytes | None:
    entry = ctx.inventory.files.get(rel)
    return ctx.documents.read_bytes(rel) if entry is not None and entry.size <= RECORD_MAX else None


def _checked(ctx: RunContext, record: PartRecord, allowed: list | None) -> PartRecord:
    """The lot's signed statement and records under provenance/<lot>/, which assembled.json bound already."""
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


def _size_explains(ctx: RunContext, result: ReloadResult, artifact: dict) -> bool:
    """Failed here for want of memory alone, and the artifact's size on disk explains it: what the tool expects
    it to need (reload/limits.py: its bytes on disk and its base's, times WEIGHT_FACTOR, and the libraries) is
    more than this machine gives a reload (its memory, or ITERA_RELOAD_HOST_MEMORY when lower); for the GPU, its
    weights are more than the GPUs' free memory here. A small artifact that asks for more than its size never
    stands on anything: it is the artifact, not the machine."""
    problems = result.facts.get("problems") if isinstance(result.facts, dict) else None
    messages = [p.get("message") for p in problems if isinstance(p, dict)] if isinstance(problems, list) and \
        problems else [result.error]
    if result.failure == "timeout" or not messages or not all(lacked_memory(m) for m in messages):
        return False
    rel = ctx.inventory.normalise_ref(artifact.get("path")) if isinstance(artifact.get("path"), str) else None
    if not rel or not ctx.inventory.exists(rel):
        return False
    path = ctx.inventory.root / rel
    on_gpu = any("out of device memory on" in str(m) for m in messages)
    if on_gpu:
        return disk_bytes(path) > _gpu_memory(ctx)
    hf_cache = str(ctx.options.hf_cache) if ctx.options.hf_cache else None
    base = artifact.get("base") if isinstance(artifact.get("base"), dict) else None
    needed, _ = memory_limit(path, "cpu" if result.device.startswith("cpu") else "cuda", hf_cache, None, base)
    given = [amount for amount in (configured_limit(ctx.options.environment), _host_memory()) if amount]
    return bool(given) and needed > min(given)


def _host_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return None


def _gpu_memory(ctx: RunContext) -> float:
    """The free memory of every GPU here, summed (nvidia-smi); infinite when it cannot tell: nothing excused."""
    from ..reload.gpus import free_memory, visible_gpus

    free = free_memory(len(visible_gpus()), ctx.options.environment)
    return sum(free.values()) if free else float("inf")


def stand_in(ctx: RunContext, reloads: list[ReloadResult]) -> list[ReloadResult]:
    """The reloads, each failed one that a lot's proof covers (module docstring) marked as standing on it, still
    failed here; no other result carries that mark (a reload child's facts cannot claim it)."""
    reloads = [replace(r, facts={k: v for k, v in r.facts.items() if k != STANDS_ON})
               if isinstance(r.facts, dict) and STANDS_ON in r.facts else r for r in reloads]
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
        if result.ok or proof is None or proof.get("ok") is not True or not _size_explains(ctx, result, artifact) \
                or not _same_bytes(ctx, artifact.get("path"), record.sums):
            out.append(result)
            continue
        device = str(proof.get("device") or "?")[:40]
        out.append(replace(result, facts={STANDS_ON: {
            "lot": record.lot, "device": device, "signer": record.signer, "part": record.archive,
            "seconds": _count(proof.get("seconds")),  # the lot's measures; the result's own are this machine's
            "peak_memory_bytes": _count(proof.get("peak_memory_bytes")),
            "device_peak_memory_bytes": _count(proof.get("device_peak_memory_bytes")),
            "here": {"device": result.device, "error": result.error}}}))
    return out


def _count(value):
    """A non-negative number from the record (a sender's JSON: anything else is None)."""
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0 else None


def _same_bytes(ctx: RunContext, ref, sums: dict[str, str]) -> bool:
    """Every file of the artifact here is what the lot sealed (and the artifact has at least one file)."""
    rel = ctx.inventory.normalise_ref(ref) if isinstance(ref, str) else None
    files = ctx.inventory.files_under(rel) if rel else []
    return bool(files) and all(sums.get(name) == ctx.documents.sha256(name) for name in files)
