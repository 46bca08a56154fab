"""The `audit` workflow: a delivered archive is hostile input until proven otherwise.

One streaming pass extracts the archive safely into a private temporary folder (0700, removed afterwards),
hashing every member; then the members are compared with `SEAL/SHA256SUMS` (IV701 content, IV702 names),
unsafe members are reported (IV703), every check runs again on the extracted package (and the reloads with
--reload), and the result is compared with the recorded `SEAL/verification.json`.

How a broken archive reads: a stream cut short is IV702 (the sealed members after the cut are missing); a
corrupt stream, or a file that is not zstd at all, is IV701 (its bytes are not what was sealed); a header
outside the tar profile the seal writes (archive/profile.py: GNU tar could read other members than the audit
does) is IV703, named after its member; expanding past --max-size is IV705. None of them is a traceback, and
after any of them nothing is re-checked (a partial package would only produce noise). SEAL/ holds what the
seal wrote and nothing else: any other member there is IV702, and every file there, the seal's own records,
statement pair and model.sig included, is scanned for a pickle (IV506). Default --max-size: 20 × the archive's
size, at least 1 GiB — weight shards expand about 1.3×, JSONL and text 5-10×, so a real package stays far below,
while a bomb (thousands to one) is stopped after a bounded amount of work and disk.
"""
from __future__ import annotations

import hashlib
import os
import re
import stat
from dataclasses import replace
from pathlib import Path

from ..version import __version__
from ..archive.extract import Extraction, safe_extract
from ..format.names import REPORT_PAGE
from ..format.parts import is_part_archive
from ..format.push import CHECKSUM_FILE_MAX, CHECKSUM_SUFFIX
from ..push.beside import NotSmallFile, read_beside
from ..model import Severity, UsageError
from ..package import RunContext, discover
from ..package.jsonread import read_json
from ..runtime.progress import NULL_PROGRESS, Progress
from ..report import Report
from ..report.html_allowlist import PAGE_MAX, check_page
from ..options import RunOptions
from ..rules import all_rules
from ..rules.archive import RECORD, AuditFacts, audit_findings
from ..rules.pickles import seal_findings as pickle_findings
from ..rules.reload import MACHINE_CODES
from ..seal import termination_unwinds
from ..seal.plan import SEAL_LAYOUT
from .config import settle
from .scratch import extraction_folders, scratch_folder
from .signatures import check_signatures, read_reviewer
from ..rules.signatures import signature_findings
from .verify import build_report, check_package, check_processes

GiB = 1 << 30


def default_max_size(archive_bytes: int) -> int:
    return max(GiB, 20 * archive_bytes)


def audit(archive: str | os.PathLike, options: RunOptions | None = None, *,
          progress: Progress | None = None, extracted_by_tar: bool = True) -> Report:
    """Audit a sealed archive. Raises UsageError (exit 2) when it cannot be read at all.

    `options`: the reviewer's (flows/config.py `settle(config, reviewer=True, **overrides)`; None: the file the
    command line would apply, never one in an extracted package). The re-check applies them, and the sender's
    configuration (as its record shows it) is compared beside it. The archive's own findings (IV701-IV706) are
    always errors: no configuration makes bytes that differ from their checksums pass. `allowed_signers` (an
    OpenSSH allowed_signers file) requires a signed seal, by `signer` when given (flows/signatures.py,
    IV801-IV803); without it a signature present is still checked and its signer shown. `oms_public_key` (PEM)
    requires SEAL/model.sig, an OpenSSF model-signing signature, and verifies it. `archive` may be
    `s3://bucket/key.tar.zst` (push/remote.py): streamed from the store, never copied here; its signatures are
    checked as a file's, the `.sig` read from beside the object. `extracted_by_tar` False: the caller extracts
    the archive itself (assemble), so where GNU tar would collide with an existing folder is not asked."""
    options = settle(reviewer=True) if options is None else options
    progress = NULL_PROGRESS if progress is None else progress
    reviewer = read_reviewer(options.allowed_signers, options.signer, options.oms_public_key)
    endpoint_url = options.endpoint_url
    if options.reload and options.environment.torch_advisory:  # before any work: the reloads would unpickle
        raise UsageError(f"audit --reload: {options.environment.torch_advisory}; an archive is untrusted input")
    remote = _open_remote(archive, endpoint_url)
    path = Path(archive) if remote is None else Path(remote.name)
    if is_part_archive(path.name):  # one lot's part (format/parts.py): re-checked as `--part` sealed it
        options = replace(options, part=True)
    resolved_device = None
    if options.reload:
        from ..reload import check_confinement, resolve_device

        check_confinement(options.confine)  # before the archive is even opened
        resolved_device = resolve_device(options.device)
    fd = open_archive(path) if remote is None else None
    try:
        size = os.fstat(fd).st_size if remote is None else remote.size
        limit = options.max_size or default_max_size(size)
        with termination_unwinds():
            folder = scratch_folder(path, fd, options.environment) if remote is None else None
            with extraction_folders(folder) as (workdir, seal_side):  # SEAL/ files go aside, outside the tree
                # Every member is written whole: IV512 compares tensor payloads without --reload too.
                extraction = _extract(path, fd, workdir, limit, progress, seal_side, remote=remote)
                # The pickle scan's work is bounded by what the archive may expand to.
                report, unwalkable = _recheck(path, size, workdir, extraction, replace(options, scan_budget=limit),
                                              device=resolved_device, progress=progress)
                detached, unread = _detached_checksum(path, extraction, remote)
                facts = AuditFacts(path.name, limit, extraction, seal_scans=_scan_seal_files(extraction),
                                   detached=None if detached is NOT_COMPARED else detached, unwalkable=unwalkable,
                                   missing_sidecars=remote.missing_sidecars() if remote is not None else (),
                                   page=_check_report_page(extraction))
                # The top folder is the manifest's campaign_id (the seal names it so): compared once re-checked.
                facts.rechecked, facts.campaign_id = bool(report.audit.get("rechecked")), report.campaign_id
                facts.collisions = extraction_collisions(path, extraction.top) if extracted_by_tar else ()
        signatures = check_signatures(path, fd, extraction, reviewer, remote=remote, unread=unread)
        if extraction.error is not None or not extraction.archive_sha256:
            # The stream failed before its end, so the reader hashed part of it: the whole file's digest all the same.
            extraction.archive_sha256 = _file_sha256(path, fd) if remote is None else remote.sha256()
    finally:
        if fd is not None:
            os.close(fd)
    archive_sha256 = extraction.archive_sha256
    report.archive = {"path": str(path) if remote is None else remote.url, "sha256": archive_sha256, "bytes": size}
    if remote is not None:  # the object, never its name alone
        report.package = report.audit["archive"] = remote.url
    report.audit["archive_sha256"] = archive_sha256
    # What beside the archive (`.sha256`; from a bucket also the object's metadata or tag and the receipt) names its
    # SHA-256: a reviewer sees when nothing does, and must then compare it with what the sender published.
    if detached is not NOT_COMPARED:  # an archive that could not be read whole is reported on its own
        report.audit["sha256_named_by"] = {"by": detached[0], "equal": detached[1]} if detached is not None else None
    if unread:  # a `.sha256` or `.sig` beside it that is not a small regular file: named, never read
        report.audit["sidecars_unread"] = unread
    comparison = _compare_record(extraction, report)
    report.audit["comparison"] = comparison
    # A pass recorded for content the re-check fails is a contradiction unless the tool's own rule levels say a
    # stricter reviewer explains every failing code (_configurations): the sender's record is never the reason.
    facts.record_contradicted = (comparison.get("recorded_verdict") == "pass" and comparison.get("verdict") == "fail"
                                 and bool(comparison.get("unexplained_blocking", True)))
    facts.contradicting_codes = tuple(comparison.get("unexplained_blocking") or ())
    facts.record_unreadable = comparison.get("error")
    archive_findings = audit_findings(facts) + pickle_findings(extraction.top, facts.seal_scans)
    for finding in archive_findings:
        finding.severity = Severity.ERROR
    if signatures is not None:
        report.audit["signature"] = signatures.to_json()
        archive_findings += signature_findings(signatures, extraction.top, path.name)
    report.findings[:0] = archive_findings
    report.cap_findings()
    return report


def extraction_collisions(archive: Path, top: str | None) -> tuple[tuple[str, str], ...]:
    """Where a reviewer would run `tar --zstd -xf` (the current folder, HOME, the archive's own folder), an
    existing entry named as the archive's top folder: GNU tar would write into it (a .pth into an existing
    ~/miniconda3/lib/.../site-packages, an executable into ~/bin). An earlier extraction of the same campaign (a
    folder whose manifest.json names this campaign_id) is not one."""
    if not top:
        return ()
    found: list[tuple[str, str]] = []
    folders = [Path.cwd(), Path(os.path.expanduser("~")), archive.resolve().parent]
    for folder in dict.fromkeys(f.resolve() for f in folders if f.is_absolute()):
        entry = folder / top
        if not os.path.lexists(entry) or _earlier_extraction(entry, top):
            continue
        what = ("a link" if entry.is_symlink() else "a folder" if entry.is_dir() else "a file")
        found.append((str(folder), what))
    return tuple(found)


def _earlier_extraction(entry: Path, top: str) -> bool:
    try:
        if entry.is_symlink() or not (entry / "SEAL").is_dir():
            return False
        manifest = read_json((entry / "manifest.json").read_bytes())
    except (OSError, ValueError):
        return False
    return isinstance(manifest, dict) and manifest.get("campaign_id") == top


def open_archive(path: Path) -> int:
    """The archive, opened once for the whole audit: a regular file, or UsageError (exit 2). O_NONBLOCK, so a
    fifo cannot block the open itself; the type is checked on the open descriptor (no swap in between)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise UsageError(f"{path}: no such file") from None
    except PermissionError:
        raise UsageError(f"{path}: permission denied") from None
    except OSError as exc:
        raise UsageError(f"{path}: cannot read ({exc.strerror or exc})") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        what = ("is a folder (give the sealed .tar.zst archive)" if stat.S_ISDIR(mode) else
                f"is {_FILE_TYPES.get(stat.S_IFMT(mode), 'not a regular file')}, not a sealed .tar.zst archive")
        raise UsageError(f"{path}: {what}")
    os.set_blocking(fd, True)
    return fd


_FILE_TYPES = {stat.S_IFIFO: "a fifo", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
               stat.S_IFSOCK: "a socket"}


def _file_sha256(path: Path, fd: int) -> str:
    try:
        with os.fdopen(os.dup(fd), "rb") as source:
            source.seek(0)
            return hashlib.file_digest(source, "sha256").hexdigest()
    except OSError as exc:
        raise UsageError(f"{path}: cannot read ({exc.strerror or exc})") from exc


def _open_remote(archive, endpoint_url: str | None):
    """`s3://...`: the object in the store (push/remote.py); None for a file here."""
    from ..push import is_s3

    if not is_s3(str(archive)):
        return None
    from ..push.remote import open_remote

    return open_remote(str(archive), endpoint_url)


def _extract(path: Path, fd: int | None, workdir: str, limit: int, progress: Progress, seal_side: str,
             remote=None) -> Extraction:
    progress.start("audit", f"reading {path.name}", total=None, unit="B")
    try:
        # From a bucket: one ordered stream (a file object), its frames decompressed one after another.
        with os.fdopen(os.dup(fd), "rb", buffering=0) if remote is None else remote.open() as source:
            if remote is None:
                source.seek(0)
            return safe_extract(source, workdir, max_expanded=limit, seal_side=seal_side, reserved=SEAL_LAYOUT,
                                on_bytes=lambda n: progress.advance("audit", n))
    except PermissionError as exc:
        raise UsageError(f"{path}: permission denied") from exc
    except OSError as exc:
        raise UsageError(f"{path}: cannot read ({exc.strerror or exc})") from exc
    finally:
        progress.finish("audit")


def _recheck(path: Path, size: int, workdir: str, extraction: Extraction, options: RunOptions, *,
             device: str | None, progress: Progress) -> tuple[Report, str | None]:
    """Every check again on the extracted package; skipped when the stream itself failed. Returns the report
    and, when the extracted package cannot even be walked, why."""
    facts = {"archive": str(path), "archive_bytes": size,
             "archive_sha256": None,  # audit() fills it in
             "expanded_bytes": extraction.expanded_bytes, "members": extraction.members,
             "files": sum(1 for name in extraction.files if not name.startswith("SEAL/")),
             "top_folder": extraction.top, "stream": "ok" if extraction.error is None else extraction.error.kind,
             "refused_members": len(extraction.refused), "rechecked": False}
    package_root = Path(workdir) / (extraction.top or "")
    ctx, unwalkable = None, None
    try:
        if extraction.error is None and extraction.top is not None and not package_root.is_symlink() \
                and package_root.is_dir():
            ctx = RunContext(discover(package_root), options)
    except (OSError, UsageError) as exc:  # e.g. names nested past PATH_MAX: hostile, not checkable
        unwalkable = str(exc)[:300]
    if ctx is None:
        report = Report(package=str(path), mode="audit", reloaded=False, strict=options.selection.strict)
        report.configuration = dict(options.configuration)
        report.audit = facts
        return report, unwalkable
    ctx, findings = check_package(ctx, device=device, progress=progress, processes=check_processes(ctx))
    report = build_report(ctx, findings, mode="audit", device=device)
    report.package = str(path)  # the archive, never the temporary folder
    report.audit = {**facts, "rechecked": True}
    return report, None


def _scan_seal_files(extraction: Extraction) -> dict:
    """Every SEAL/ file, written aside by the extraction (the records and signatures also kept in memory):
    scanned like every file of the package."""
    from ..package.pickles import scan_file

    return {rel: scan_file(side) for rel, side in extraction.seal_side.items()}


NOT_COMPARED = ("", False)  # _detached_checksum: the archive was not read whole, or `.sha256` not at all


def _detached_checksum(path: Path, extraction: Extraction, remote=None) -> tuple[tuple[str, bool] | None, list[dict]]:
    """`<archive>.sha256` beside the archive, when there is one: whether it names this archive's bytes. From a
    bucket: the object's sha256 metadata, `.sha256` and receipt there (push/remote.py). None when nothing beside
    names a SHA-256; NOT_COMPARED when the comparison could not be made (no finding comes of it). Besides, the
    sidecars not read: a `.sha256` that is not a regular file of at most CHECKSUM_FILE_MAX bytes (a fifo would
    block the audit, a sparse 40 GB file exhaust its memory) names nothing, and the report says why."""
    if extraction.error is not None:  # a failed stream is reported on its own
        return NOT_COMPARED, []
    if remote is not None:
        return remote.detached(extraction.archive_sha256), []
    beside = path.with_name(path.name + CHECKSUM_SUFFIX)
    try:
        data = read_beside(beside, CHECKSUM_FILE_MAX)
    except NotSmallFile as exc:
        return None, [unread_sidecar(beside, exc, CHECKSUM_FILE_MAX)]
    except OSError:
        return NOT_COMPARED, []
    if data is None:
        return None, []
    recorded = data.decode("utf-8", errors="replace").split()[:1]
    return (beside.name, bool(recorded) and recorded[0].lower().lstrip("\\") == extraction.archive_sha256), []


def unread_sidecar(path: Path, exc: NotSmallFile, limit: int) -> dict:
    return {"path": path.name, "why": f"{exc.strerror}: not read (a regular file of at most {limit} bytes is)"}


def _check_report_page(extraction: Extraction) -> list[str]:
    """SEAL/report.html held to what the tool's renderer writes (report/html_allowlist.py): what it holds that the
    renderer never writes, and a verdict other than the record's. Read from where the extraction wrote it aside."""
    side = extraction.seal_side.get(REPORT_PAGE)
    if side is None:
        return []
    try:
        with open(side, "rb") as page:
            data = page.read(PAGE_MAX + 1)
    except OSError as exc:
        return [f"cannot be read ({exc.strerror or exc})"]
    checked = check_page(data)
    problems = list(checked.problems)
    recorded = _recorded_verdict(extraction)
    if not problems and recorded is not None and checked.verdict != recorded:
        problems.append(f"its verdict is {checked.verdict}, SEAL/verification.json records {recorded}")
    return problems


def _recorded_verdict(extraction: Extraction) -> str | None:
    try:
        recorded = read_json(extraction.seal_files.get(RECORD) or b"")
    except ValueError:
        return None
    return recorded.get("verdict") if isinstance(recorded, dict) and recorded.get("verdict") in ("pass", "fail") \
        else None


def _compare_record(extraction: Extraction, report: Report) -> dict:
    """What the archive says was verified, next to what the re-check finds now (before archive findings).
    The record is read with the bounded JSON reader, and only short strings and booleans are copied from it:
    a value nested 900 levels deep would otherwise break every renderer that copies it."""
    comparison: dict = {"verdict": report.verdict if report.audit.get("rechecked") else None,
                        "version": __version__}
    raw = extraction.seal_files.get(RECORD)
    if raw is None:
        return {**comparison, "recorded": False}
    try:
        recorded = read_json(raw)
        if not isinstance(recorded, dict):
            raise ValueError("not a JSON object")
    except ValueError as exc:  # JSONLimitError, JSONDecodeError, UnicodeDecodeError
        return {**comparison, "recorded": False, "error": f"not a readable report ({str(exc)[:200]})"}
    findings = recorded.get("findings") if isinstance(recorded.get("findings"), list) else []
    # A hostile record may hold anything where a code should be: only rule codes count.
    recorded_codes = sorted({f["code"] for f in findings if isinstance(f, dict) and _is_code(f.get("code"))})
    current_codes = sorted({f.code for f in report.findings})
    reloaded = recorded.get("reloaded")
    comparison.update({
        "recorded": True, "recorded_verdict": _recorded_text(recorded.get("verdict")),
        "recorded_version": _recorded_text(recorded.get("version")),
        "recorded_campaign_id": _recorded_text(recorded.get("campaign_id")),
        "recorded_reloaded": reloaded if isinstance(reloaded, bool) else None,
        "codes_only_recorded": [c for c in recorded_codes if c not in current_codes],
        "codes_only_now": [c for c in current_codes if c not in recorded_codes] if report.audit.get("rechecked")
        else [],
    })
    comparison["matches"] = bool(report.audit.get("rechecked")) and comparison["recorded_verdict"] == \
        comparison["verdict"] and not comparison["codes_only_recorded"] and not comparison["codes_only_now"]
    comparison.update(_configurations(recorded, report))
    return comparison


RULE_CODE = re.compile(r"IV[0-9]{3}")
RECORDED_TEXT_MAX = 200
LEVELS = {s.value for s in Severity}


def _is_code(value) -> bool:
    return isinstance(value, str) and RULE_CODE.fullmatch(value) is not None


def _recorded_text(value) -> str | None:
    """A string the record holds, cut to a line's worth; anything else (a list, a deep object) is None."""
    return value[:RECORDED_TEXT_MAX] if isinstance(value, str) else None


def _configurations(recorded: dict, report: Report) -> dict:
    """The audit applies the reviewer's configuration; the sender's, as its record shows it (each rule that ran
    and its level), is shown beside it.

    A blocking finding now is explained by a configuration difference only when the tool's own knowledge says
    the code could have passed without any change of content: its level in this tool's rule registry is below
    error (so it blocks now only because the reviewer raised it, or --strict), and the sender's record does not
    say it ran it at error level. The record alone never explains a failure: a sender whose record says
    "IV506: warning", or that it did not run IV506, is not believed (`not_believed`), because the record is the
    sender's own writing. A code this tool's registry says was introduced after the sender's recorded version
    (`Rule.since`) is explained by the version (`explained_by_version`): the sender's tool could not run it, so
    a pass recorded without it is no contradiction. It still fails the audit: the content is what it is."""
    rules = recorded.get("rules") if isinstance(recorded.get("rules"), dict) else {}
    sender = {code: (entry["severity"] if isinstance(entry, dict) and entry.get("severity") in LEVELS
                     else "unknown") for code, entry in rules.items() if _is_code(code)}
    reviewer = {code: entry["severity"] for code, entry in (report.rules or {}).items()}
    differences = [{"code": code, "sender": sender.get(code, "not run"), "reviewer": reviewer.get(code, "not run")}
                   for code in sorted(set(sender) | set(reviewer)) if sender.get(code) != reviewer.get(code)]
    registry = all_rules()
    blocking = sorted({f.code for f in report.blocking()})
    explained = [code for code in blocking if sender.get(code) != "error"
                 and code in registry and registry[code].severity != Severity.ERROR]
    recorded_version = _version(_recorded_text(recorded.get("version")))
    # What this machine could not do (a base not in the reviewer's hub cache) says nothing of the content.
    machine = [code for code in blocking if code in MACHINE_CODES]
    newer = [code for code in blocking if code not in explained and code not in machine and code in registry
             and recorded_version is not None and _version(registry[code].since) > recorded_version]
    unexplained = [code for code in blocking if code not in explained and code not in machine and code not in newer]
    return {"sender_rules": len(sender), "configuration_differences": differences,
            "explained_by_configuration": explained, "explained_by_this_machine": machine,
            "explained_by_version": newer,
            "not_believed": [{"code": code, "sender": sender.get(code, "not run")} for code in unexplained
                             if sender.get(code) != "error"],
            "unexplained_blocking": unexplained}


VERSION = re.compile(r"(\d+)\.(\d+)\.(\d+)")


def _version(text: str | None) -> tuple[int, int, int] | None:
    """0.2.0 -> (0, 2, 0); None for anything else (a record's version is the sender's text)."""
    match = VERSION.fullmatch(text or "")
    return tuple(int(part) for part in match.groups()) if match else None


__all__ = ["audit", "default_max_size"]
