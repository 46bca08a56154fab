"""IV701–IV706: the sealed archive, every finding of them made here. IV706 is the one static check (a package
holding `SEAL/` is refused before any work); the rest turn facts into findings, as rules/reload.py does for the
reloads: what the seal refused (SealRefused.problems, seal/plan.py and seal/changes.py) and what the audit found
(AuditFacts, filled by flows/audit.py from the extraction, archive/extract.py)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterator

from ..format.names import RECORD, REPORT_PAGE, SEAL_DIR, SIGNATURE_MEMBERS, SUMS
from ..model import Finding, Rule, Severity
from ..package import RunContext

if TYPE_CHECKING:
    from ..archive.extract import Extraction
    from ..package.pickles import ScanResult

RULES = [
    Rule("IV701", Severity.ERROR, "audit: a member's checksum does not match SEAL/SHA256SUMS",
         explain="The bytes of a member are not the bytes that were sealed: the archive was altered, damaged in "
                 "transfer, or is not a sealed archive at all. Also reported for a corrupt zstd stream, a file "
                 "that is not zstd, an archive whose SHA-256 differs from the `.sha256` file beside it, and a "
                 "recorded verdict of pass in SEAL/verification.json that the re-check contradicts. Ask the "
                 "sender for the archive again and compare its `.sha256` before anything else.",
         bad="params/control.json: sha256 9f2c… but SEAL/SHA256SUMS lists 41ab…",
         good="cd reviews-lora-2026-11 && sha256sum -c SEAL/SHA256SUMS   # every line OK"),
    Rule("IV702", Severity.ERROR, "audit: a member is missing from the archive, or present but not listed",
         explain="SEAL/SHA256SUMS and the archive must name the same files. A missing member means something "
                 "sealed is not delivered (a truncated archive reads this way: everything after the cut is "
                 "missing); an unlisted one was added after the seal and nothing vouches for it. SEAL/ holds "
                 "what the seal wrote (SHA256SUMS, verification.json, report.html, statement.json with its "
                 ".sig and model.sig when signed) and nothing else: any other "
                 "member there is refused even when SHA256SUMS lists it; every file there, the seal's own "
                 "included, is scanned, and a pickle there is named (IV506 besides, when it names a global "
                 "outside the allowlist). Audited from a bucket, what the push receipt lists beside the archive "
                 "(its .sha256, its .sig) must be there too: a signature deleted after the push would otherwise "
                 "read as an unsigned delivery. "
                 "SEAL/report.html must be a page the tool's renderer writes: only its "
                 "elements and attributes, no script, event handler, comment or external link, its "
                 "Content-Security-Policy, and the verdict verification.json records; anything else is named "
                 "here, since a reviewer opens that page in a browser.",
         bad="predictions/extra.jsonl in the archive, not in SEAL/SHA256SUMS",
         good="the same set of file names on both sides"),
    Rule("IV703", Severity.ERROR, "audit: an unsafe member",
         explain="A member with an absolute name or `..`, outside the package folder, a symbolic or hard link "
                 "leaving the package, a device node, a fifo or an unknown member type could write outside "
                 "the folder it is extracted into, or shadow another file. It is never extracted. Every header "
                 "must be the one the seal writes for its member (docs/format.md): modes 0644/0755 for files, "
                 "0755 for folders, 0777 for links, owner 0 and no owner names, no hard link; a setuid bit, a "
                 "foreign owner or a world-writable folder is refused before anything is written for it. The "
                 "archive starts with its top folder, the manifest's campaign_id (never `.local`, `.ssh`, "
                 "`.git`...), or nothing is extracted. A header outside the tar profile the seal writes (GNU long "
                 "names, global or sparse headers, unknown PAX keys, a file named like a folder) refuses the "
                 "whole archive, since GNU tar may extract other members than the audit reads. A skippable zstd "
                 "frame holding bytes (which zstd and tar pass over unread) is refused as well. The seal refuses "
                 "to produce such members too (a fifo or device inside the package, a link that leaves it or is "
                 "broken).",
         bad="../../home/reviewer/.bashrc  or  artifacts/base -> /etc  or  .local/lib/python3.11/site-packages/x.pth",
         good="reviews-lora-2026-11/artifacts/latest -> checkpoint-400"),
    Rule("IV704", Severity.ERROR, "seal: a file changed between check and seal",
         explain="The seal reads each file once and compares its size, modification time and inode with what "
                 "discovery recorded, and its SHA-256 with any digest a check computed (config_sha256, "
                 "eval_ids_sha256). A file that differs was modified while the tool ran (a training process "
                 "still writing, a sync tool), so what was checked is not what would be sealed: nothing is "
                 "sealed. Stop the writer and run the command again.",
         bad="metrics/control.jsonl grew while the package was sealed",
         good="every process writing into the package has exited before `itera-verify OUTDIR`"),
    Rule("IV705", Severity.ERROR, "audit: the archive expands beyond the size limit",
         explain="The audit stops reading once the expanded size passes --max-size (default: 20 times the "
                 "archive's size, at least 1 GiB), so a decompression bomb costs a bounded amount of time and "
                 "disk. A real package expands about 1.3× (weights) to 10× (text). It stops as well past one "
                 "member per 32 KiB of --max-size (32,768 at 1 GiB, at least 4,096): each member costs an "
                 "inode and its facts in memory, so an archive of empty files is a bomb too. If the archive is "
                 "genuine, raise --max-size.",
         bad="a 40 KiB archive that expands to 50 GiB of zeros",
         good="itera-verify audit big.tar.zst --max-size 200000000000"),
    Rule("IV706", Severity.ERROR, "seal: the package already holds SEAL/",
         explain="`SEAL/` is where the archive keeps SHA256SUMS and verification.json; a package that already "
                 "has one (often an extracted archive being sealed again) would mix an old seal record with the "
                 "new one. Remove or rename the folder; the tool never writes inside the package itself.",
         bad="outdir/SEAL/SHA256SUMS", good="outdir/ without SEAL/"),
]


SEAL_FOLDER = SEAL_DIR


def _reserved_seal_folder() -> Finding:
    return Finding("IV706", SEAL_FOLDER, message="the package holds SEAL/, a name the sealed archive reserves")


def check(ctx: RunContext) -> Iterator[Finding]:
    names = (*ctx.inventory.dirs, *ctx.inventory.files, *ctx.inventory.links, *ctx.inventory.specials)
    if SEAL_FOLDER in names:
        yield _reserved_seal_folder()


# ---- the seal's refusals ------------------------------------------------------------------------------------
def seal_findings(problems: list[tuple[str, str, str]]) -> list[Finding]:
    """(kind, package path, detail) from the seal (seal/plan.py, seal/changes.py): what cannot be sealed, or what
    changed while it was."""
    findings = []
    for kind, rel, detail in problems:
        if kind == "seal-folder":
            findings.append(_reserved_seal_folder())
        elif kind == "special":
            findings.append(Finding("IV703", rel, message=f"a {detail} cannot be sealed"))
        elif kind == "broken-link":  # IV204 (rules/paths.py) says it too when enabled; the seal's refusal is this
            findings.append(Finding("IV703", rel, message=f"a broken link ({detail}) cannot be sealed"))
        elif kind == "leaving-link":  # likewise IV203
            findings.append(Finding("IV703", rel, message=f"a link leaving the package ({detail}) cannot be sealed"))
        elif kind == "changed":
            findings.append(Finding("IV704", rel, message=f"{detail}; nothing was sealed"))
        else:
            raise ValueError(f"unknown seal problem {kind!r}")
    return findings


def assembled_link_refused(rel: str, target: str, lot: str, why: str) -> Finding:
    """assemble (flows/assemble_merge.py): a part's link that, joined with the other parts' links, leads nowhere
    safe; each part's audit resolved only its own."""
    shown = target if len(target) <= 120 else target[:117] + "..."
    return Finding("IV703", rel, message=f"the link {rel} -> {shown} of {lot}, joined with the other parts' links, "
                                         f"resolves to {why}: nothing is assembled")


def assembled_unplaceable(rel: str, why: str) -> Finding:
    """assemble: the last line of defence, an entry the merge let through that the O_NOFOLLOW build refuses."""
    return Finding("IV703", rel, message=f"cannot be placed safely ({why}: a link or another part's entry in its "
                                         "way); nothing is assembled")


def assembled_part_changed(part: str, now: str, audited: str) -> Finding:
    """assemble: the part archive read again is not the one its audit passed (replaced between the two reads)."""
    return Finding("IV701", part, message=(
        f"{part} is not the archive its audit passed (sha256 now {now[:12] or '?'}…, audited {audited[:12] or '?'}…): "
        "it changed while assembling; assemble again"))


# ---- the audit ---------------------------------------------------------------------------------------------
STREAM_CODES = {"truncated": "IV702", "too-large": "IV705", "too-many": "IV705", "not-zstd": "IV701",
                "corrupt": "IV701", "profile": "IV703", "canonical": "IV703"}


@dataclass
class AuditFacts:
    archive_name: str
    limit: int  # --max-size
    extraction: "Extraction"
    seal_scans: dict[str, "ScanResult"] = field(default_factory=dict)  # every SEAL/ file, written aside, scanned
    detached: tuple[str, bool] | None = None  # (<archive>.sha256, whether it names this archive's bytes)
    missing_sidecars: tuple[str, ...] = ()  # from a bucket: what the push receipt lists beside it, not there
    unwalkable: str | None = None  # why the extracted package could not be walked
    record_contradicted: bool = False  # the recorded verdict is pass, the re-check fails
    contradicting_codes: tuple[str, ...] = ()  # the blocking codes that no configuration difference explains
    record_unreadable: str | None = None  # why SEAL/verification.json is not a report (a pickle, not JSON...)
    rechecked: bool = False  # the extracted package was checked again: its manifest was read
    campaign_id: str | None = None  # the manifest's campaign_id, which the top folder must be
    # (folder, what is there): places a reviewer extracts in (the current folder, HOME, the archive's folder)
    # that already hold an entry named as the top folder, which is not an earlier extraction of this campaign.
    collisions: tuple[tuple[str, str], ...] = ()
    # What SEAL/report.html holds that the tool's HTML renderer never writes (report/html_allowlist.py), and a
    # verdict other than the record's: the README sends reviewers to that page.
    page: list[str] = field(default_factory=list)


def audit_findings(facts: AuditFacts) -> list[Finding]:
    extraction = facts.extraction
    findings = [Finding("IV703", name, message=f"unsafe member: {why}; not extracted")
                for name, why in extraction.refused]
    findings += _seal_extra_findings(facts)
    error = extraction.error
    if error is not None:
        what = {"too-large": f"the archive expands beyond {facts.limit} bytes (--max-size); stopped there",
                "too-many": f"the archive holds {error}; stopped there, nothing re-checked (raise --max-size if "
                            "it is genuine)",
                "truncated": f"the archive is truncated: {error}; the members after that point are missing",
                "not-zstd": f"not a sealed archive: {error}",
                "profile": f"outside the tar profile the seal writes: {error}; GNU tar may extract other "
                           "members than the audit reads, so the whole archive is refused and nothing re-checked",
                "canonical": f"{error}; tar would write it where the reviewer extracts the archive, so nothing is "
                             "extracted or re-checked"
                }.get(error.kind, f"the archive is corrupt: {error}")
        findings.append(Finding(STREAM_CODES[error.kind], getattr(error, "member", "") or facts.archive_name,
                                message=what))
        return findings
    if facts.rechecked and facts.campaign_id != extraction.top:
        findings.append(Finding("IV703", f"{extraction.top}/", message=(
            f"the archive's top folder is not the manifest's campaign_id ({facts.campaign_id!r}): the seal "
            "writes the package under <campaign_id>/" if facts.campaign_id is not None else
            "the manifest names no campaign_id: the seal writes the package under <campaign_id>/")))
    for folder, what in facts.collisions:
        findings.append(Finding("IV703", f"{extraction.top}/", message=(
            f"{folder} already holds {extraction.top}/ ({what}): `tar --zstd -xf` there would write the "
            f"archive's files into it (a campaign_id can name any folder, such as miniconda3 or bin); extract "
            f"into a new, empty folder instead (mkdir review && tar --zstd -xf {facts.archive_name} -C review)")))
    if facts.unwalkable:
        findings.append(Finding("IV703", extraction.top, message=f"the extracted package cannot be walked "
                                                                 f"({facts.unwalkable}): unsafe member names"))
    if facts.detached is not None and not facts.detached[1]:
        findings.append(Finding("IV701", facts.archive_name,
                                message=f"the archive's SHA-256 does not match {facts.detached[0]}"))
    for name in facts.missing_sidecars:
        findings.append(Finding("IV702", name, message=f"the push receipt beside the archive lists {name}, and the "
                                                       "bucket does not hold it: what was delivered beside the "
                                                       "archive is incomplete"
                                + (" (its signature was removed)" if name.endswith(".sig") else "")))
    findings += _sums_findings(extraction)
    skipped = extraction.skippable
    if skipped.frames:
        findings.append(Finding("IV703", facts.archive_name, message=(
            f"{skipped.frames} skippable zstd frame(s) holding {skipped.bytes} bytes, the first at offset "
            f"{skipped.first}: the seal writes none; zstd and tar pass over them unread, so whatever they carry (a "
            "second file format, a payload) travels with the archive unchecked")))
    for problem in facts.page:
        findings.append(Finding("IV702", f"{extraction.top}/{REPORT_PAGE}", message=(
            f"SEAL/report.html is not the page the tool writes: {problem}; do not open it, read the report of "
            "this audit instead")))
    if facts.record_unreadable:
        findings.append(Finding("IV702", f"{extraction.top}/{RECORD}",
                                message=f"SEAL/verification.json is {facts.record_unreadable}: no record of what "
                                        "was verified"))
    if facts.record_contradicted:
        findings.append(Finding("IV701", f"{extraction.top}/{RECORD}",
                                message="the recorded verdict is pass but the re-check fails"
                                        + (f" ({', '.join(facts.contradicting_codes)}, errors by the tool's own "
                                           "rule levels)" if facts.contradicting_codes else "")
                                        + ": the record does not describe this content (the sender's record of "
                                          "its own configuration is never taken as the reason)"))
    return findings


def _seal_extra_findings(facts: AuditFacts) -> list[Finding]:
    """IV702 for a SEAL/ member the seal never writes (never trusted, whatever SHA256SUMS lists), and for a
    pickle found in a SEAL/ file."""
    top = facts.extraction.top
    findings = [Finding("IV702", name, message=f"SEAL/ holds {what}: only SHA256SUMS, verification.json, "
                                               "report.html, model.sig and the signed statement are the seal's; "
                                               "not trusted")
                for name, what in facts.extraction.seal_extras]
    for rel, scan in sorted(facts.seal_scans.items()):
        if scan.is_pickle:
            findings.append(Finding("IV702", f"{top}/{rel}", message=f"a pickle inside SEAL/, which {scan.refusal()}"
                                    if scan.unsafe or scan.error else "a pickle inside SEAL/, where the seal "
                                    "writes none"))
    return findings


def _sums_findings(extraction: "Extraction") -> list[Finding]:
    """IV701 per member whose digest differs from SHA256SUMS; IV702 per name in one set and not the other."""
    from ..archive.sums import SumsError, parse_sums  # not at the top: every check loads the rules

    top = extraction.top
    if SUMS not in extraction.seal_files:
        return [Finding("IV702", f"{top}/{SUMS}", message="SEAL/SHA256SUMS is missing: nothing in the archive "
                                                          "can be verified")]
    try:
        listed = parse_sums(extraction.seal_files[SUMS])
    except SumsError as exc:
        return [Finding("IV701", f"{top}/{SUMS}", line=exc.line, message=f"SEAL/SHA256SUMS is malformed: {exc}")]
    refused = {name.split("/", 1)[-1] for name, _ in extraction.refused}
    extras = {name.split("/", 1)[-1] for name, _ in extraction.seal_extras}  # IV702 already, listed or not
    # The signed statement holds SHA256SUMS's digest, so SHA256SUMS cannot list it (rules/signatures.py checks it).
    present = {name: digest for name, digest in extraction.files.items()
               if name != SUMS and name not in extras and name not in SIGNATURE_MEMBERS}
    findings = []
    for name in sorted(listed):
        if name in present:
            if present[name] != listed[name]:
                findings.append(Finding("IV701", f"{top}/{name}", message=(
                    f"content differs from SEAL/SHA256SUMS (sha256 {present[name][:12]}…, "
                    f"listed {listed[name][:12]}…)")))
        elif name not in refused and name not in extras:
            findings.append(Finding("IV702", f"{top}/{name}",
                                    message="listed in SEAL/SHA256SUMS but missing from the archive"))
    for name in sorted(set(present) - set(listed)):
        findings.append(Finding("IV702", f"{top}/{name}", message="in the archive but not listed in SEAL/SHA256SUMS"))
    if RECORD not in extraction.seal_files and RECORD not in listed:
        findings.append(Finding("IV702", f"{top}/{RECORD}", message="SEAL/verification.json is missing"))
    return findings
