"""The `assemble` workflow: one campaign from the parts its lots sealed (docs/record.md, "Two lots").

    audit each part as hostile input -> extract it again (the same bytes) -> compare and merge (assemble_merge.py)
    -> write DIR/<campaign_id>/ in one rename

Each part is audited as `itera-verify audit` would (flows/audit.py), re-checked as a part (`--part`), its
signatures required with `--allowed-signers`. Then it is extracted once more, through the same safe extraction,
into a private folder under DIR, and its SHA-256 must be the one audited: an object replaced in the bucket
meanwhile is refused. The package is built there from the parts' files as they hold them (moved, never
rewritten), the merged manifest.json, stops.json and reload.json, and `provenance/<lot>/` (each part's own
three documents and SEAL/ records, which bind its reload proof: flows/partproofs.py; and `assembled.json`, what
this assemble audited, authenticated with the reviewer's key: flows/assemble_record.py). Every folder is opened
without following a link and nothing is ever replaced, so nothing is written outside DIR whatever the parts'
links. Nothing is left under DIR when anything is refused.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import shutil
import stat
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..archive.extract import _Tree, safe_extract
from ..format.names import ID, MANIFEST, RELOAD, SEAL_DIR, STOPS
from ..format.parts import MERGED_DOCUMENTS, PART_SUFFIX, PROVENANCE, SEAL_RECORDS, lot_ids, lot_of_archive_name
from ..model import Finding, Severity, UsageError
from ..options import RunOptions
from ..package import shortened
from ..package.jsonread import read_json
from ..record.files import dumps
from ..report import Report
from ..runtime.progress import NULL_PROGRESS, Progress
from ..rules.archive import assembled_part_changed, assembled_unplaceable
from ..runtime.reviewer_key import reviewer_key
from ..seal.plan import SEAL_LAYOUT
from .assemble_merge import PartContent, merge
from .assemble_record import ASSEMBLED, assembled_record
from .audit import audit, default_max_size
from .config import settle
from .signatures import read_reviewer

@dataclass
class PartAudit:
    """One part as its audit found it."""

    source: str  # as given: a file, or s3://bucket/key
    name: str
    verdict: str = "fail"
    sha256: str | None = None
    signer: str | None = None  # the allowed principal, else the key's fingerprint; None: unsigned
    lot: str | None = None
    findings: list[Finding] = field(default_factory=list)  # the audit's blocking findings
    campaign_id: str | None = None

    def record(self) -> dict:
        """Its `manifest.parts[]` entry."""
        local = not self.source.startswith("s3://")
        return {"lot": self.lot, "archive": self.name if local else self.source, "sha256": self.sha256,
                "signer": self.signer}

    def to_json(self) -> dict:
        return {**self.record(), "source": self.source, "verdict": self.verdict,
                "findings": [f.to_json() for f in self.findings]}


@dataclass
class Assembly:
    output: Path
    parts: list[PartAudit] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)  # assemble's own refusals (IV615-IV617, IV701)
    campaign_id: str | None = None
    package: Path | None = None  # DIR/<campaign_id>, once written
    lots_without_part: list[str] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        return "pass" if self.package is not None else "fail"

    def report(self) -> Report:
        """The one report object every renderer reads (mode `assemble`): the refusals, each part's own with its
        archive's name before the path, and the parts in `audit.parts`."""
        report = Report(package=str(self.package or self.output), mode="assemble", reloaded=False)
        report.campaign_id = self.campaign_id
        for finding in self.findings:
            finding.severity = Severity.ERROR  # a refusal: no configuration makes two lots one campaign
        report.findings = list(self.findings) + [
            replace(f, path=f"{part.name}:{f.path}" if f.path else part.name) for part in self.parts
            for f in part.findings]
        report.audit = {"parts": [part.to_json() for part in self.parts], "output": str(self.output),
                        "lots_without_part": list(self.lots_without_part),
                        "assembled": str(self.package) if self.package else None}
        return report


def assemble(sources: list[str | os.PathLike], output: str | os.PathLike, options: RunOptions | None = None, *,
             progress: Progress | None = None) -> Assembly:
    """Join the parts (archives, folders holding `*.part.tar.zst`, `s3://` keys or prefixes) into
    `output/<campaign_id>/`. Raises UsageError (exit 2) when it cannot run; a refusal is an Assembly with
    findings and no package. `options`: the reviewer's (`settle(reviewer=True, allowed_signers=...)`)."""
    options = settle(reviewer=True) if options is None else options
    options = replace(options, part=True, reload=False)
    progress = NULL_PROGRESS if progress is None else progress
    read_reviewer(options.allowed_signers, options.signer)  # an unreadable file: exit 2 before any work
    key = reviewer_key(options.results_key, options.environment, create=True)  # so is an unusable key
    out = _output_folder(output)
    assembly = Assembly(out)
    for source in part_sources(sources, options.endpoint_url):
        report = audit(source, options, progress=progress, extracted_by_tar=False)
        assembly.parts.append(_audited(source, report))
    if any(part.verdict != "pass" for part in assembly.parts):
        return assembly
    for campaign_id in dict.fromkeys(part.campaign_id for part in assembly.parts):
        _refuse_existing(out, campaign_id)  # before any extraction (the parts' header says which, IV615 below)
    with _staging(out) as staging:
        contents = [_extract(part, staging / f"part-{index}", options, assembly)
                    for index, part in enumerate(assembly.parts)]
        if assembly.findings:
            return assembly
        for part, (content, _, _) in zip(assembly.parts, contents):
            part.lot = content.lot
        plan_lots = lot_ids(contents[0][0].documents[MANIFEST].get("plan"))
        order = sorted(range(len(contents)), key=lambda i: (_position(plan_lots, contents[i][0].lot),
                                                            contents[i][0].name))
        contents = [contents[i] for i in order]
        assembly.parts = [assembly.parts[i] for i in order]
        merged = merge([content for content, _, _ in contents])
        assembly.findings += merged.findings
        if merged.findings:
            return assembly
        manifest = merged.documents[MANIFEST]
        manifest["parts"] = [part.record() for part in assembly.parts]
        assembly.campaign_id = str(manifest.get("campaign_id"))
        assembly.lots_without_part = [lot for lot in plan_lots if lot not in {p.lot for p in assembly.parts}]
        target = _refuse_existing(out, assembly.campaign_id)
        tree = staging / assembly.campaign_id
        try:
            _build(tree, contents, merged, assembly.parts, key)
        except OSError as exc:  # the merge refuses what would collide: this is the last line of defence
            assembly.findings.append(assembled_unplaceable(str(exc.filename or assembly.campaign_id),
                                                           str(exc.strerror or exc)))
            return assembly
        os.rename(tree, target)
        assembly.package = target
    return assembly


def _refuse_existing(out: Path, campaign_id) -> Path:
    if not isinstance(campaign_id, str) or not ID.fullmatch(campaign_id):  # the audit's IV703 said so already
        raise UsageError(f"the parts' campaign_id {campaign_id!r} cannot name a folder")
    target = out / campaign_id
    if os.path.lexists(target):
        raise UsageError(f"{shortened(str(target))}: already exists; assemble writes a new folder (move the old "
                         "one away, or give another -o)")
    return target


def _position(plan_lots: list[str], lot: str | None) -> int:
    return plan_lots.index(lot) if lot in plan_lots else len(plan_lots)


def _output_folder(output) -> Path:
    if output is None:
        raise UsageError("assemble writes DIR/<campaign_id>/: give -o DIR")
    out = Path(output)
    if out.exists() and not out.is_dir():
        raise UsageError(f"-o {shortened(str(out))}: exists and is not a folder")
    if not out.exists() and not out.parent.is_dir():
        raise UsageError(f"-o {shortened(str(out))}: no such folder {shortened(str(out.parent))} (only the last "
                         "folder of -o is created)")
    return out


def part_sources(sources: list[str | os.PathLike], endpoint_url: str | None) -> list[str]:
    """Every part archive the arguments name, each once, in the order given (a folder's and a prefix's sorted)."""
    from ..push import is_s3

    found: list[str] = []
    for source in sources:
        text = os.fspath(source)
        if is_s3(text):
            if text.endswith(".tar.zst"):
                found.append(text)
                continue
            from ..push.listing import list_archives

            listed = list_archives(text if text.endswith("/") else text + "/", PART_SUFFIX, endpoint_url)
            if not listed:
                raise UsageError(f"{text}: no *{PART_SUFFIX} under this prefix")
            found += listed
        elif Path(text).is_dir():
            if (Path(text) / MANIFEST).exists():
                raise UsageError(f"{shortened(text)}: a package folder, not a part: seal it first "
                                 f"(itera-verify {shortened(text)} --part), then assemble the archive")
            listed = sorted(str(p) for p in Path(text).glob(f"*{PART_SUFFIX}") if p.is_file())
            if not listed:
                raise UsageError(f"{shortened(text)}: no *{PART_SUFFIX} in this folder")
            found += listed
        else:
            found.append(text)  # a file: the audit says when it is not one
    unique = list(dict.fromkeys(f if is_s3(f) else str(Path(f).resolve()) for f in found))
    if not unique:
        raise UsageError("assemble needs the parts: archives, folders holding them, or s3:// keys")
    return unique


def _audited(source: str, report) -> PartAudit:
    audit_facts = report.audit if isinstance(report.audit, dict) else {}
    signature = audit_facts.get("signature") if isinstance(audit_facts.get("signature"), dict) else {}
    principals = signature.get("principals") or []
    signer = principals[0] if principals else (signature.get("signer") if signature.get("signed") else None)
    name = source.rsplit("/", 1)[-1]
    return PartAudit(source, name, report.verdict, audit_facts.get("archive_sha256"), signer,
                     lot_of_archive_name(name, str(report.campaign_id)), report.blocking(), report.campaign_id)


@contextlib.contextmanager
def _staging(out: Path):
    """A private folder under DIR for the extraction and the build; removed whatever happens, with DIR itself
    when this call made it and nothing else is there."""
    made = not out.exists()
    if made:
        out.mkdir()
    staging = Path(tempfile.mkdtemp(prefix=".itera-assemble-", dir=out))
    try:
        yield staging
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if made:
            with contextlib.suppress(OSError):
                out.rmdir()  # only when empty: a package written there stays


def _extract(part: PartAudit, folder: Path, options: RunOptions, assembly: Assembly):
    """(its content, the extracted package folder, the extraction): the same bytes the audit passed; else a
    finding, and None."""
    from ..push import is_s3

    folder.mkdir()
    remote = None
    if is_s3(part.source):
        from ..push.remote import open_remote

        remote = open_remote(part.source, options.endpoint_url)
    size = remote.size if remote is not None else os.stat(part.source).st_size
    limit = options.max_size or default_max_size(size)
    with (remote.open() if remote is not None else open(part.source, "rb")) as source:
        extraction = safe_extract(source, str(folder), max_expanded=limit, reserved=SEAL_LAYOUT)
    if extraction.error is not None or extraction.refused or extraction.archive_sha256 != part.sha256 \
            or extraction.top is None:
        assembly.findings.append(assembled_part_changed(part.name, extraction.archive_sha256 or "", part.sha256 or ""))
        return None
    root = folder / extraction.top
    entries = {name: ("file", digest) for name, digest in extraction.files.items()
               if not name.startswith(SEAL_DIR + "/")}
    prefix = extraction.top + "/"
    for name, kind, _size, _mode, _mtime, linkname in extraction.headers:
        rel = name[len(prefix):].rstrip("/") if name.startswith(prefix) else ""
        if rel and not rel.startswith(SEAL_DIR + "/") and rel != SEAL_DIR and kind in ("symlink", "directory"):
            entries[rel] = (kind, linkname if kind == "symlink" else "")
    documents = {}
    for name in MERGED_DOCUMENTS:
        if name not in extraction.files:  # kept under provenance/<lot>/ as the part holds it: a file, never a link
            raise UsageError(f"{part.name}: {name} is not a file")
        try:
            documents[name] = read_json((root / name).read_bytes())
        except (OSError, ValueError) as exc:
            raise UsageError(f"{part.name}: {name} does not read ({str(exc)[:200]})") from None
        if not isinstance(documents[name], dict):
            raise UsageError(f"{part.name}: {name} is not a JSON object")
    return PartContent(part.name, documents, entries), root, extraction


def _build(tree: Path, contents, merged, parts: list[PartAudit], key: bytes) -> None:
    """The package: every file from the part that holds it (moved), the merged documents, the provenance (each
    part's records, and what this assemble recorded of it with the reviewer's key: flows/assemble_record.py).

    Every folder is opened through descriptors that never follow a link (archive/extract.py's tree), on the
    part's side and on the package's, and nothing is ever replaced: whatever the parts' links, nothing is
    written but beneath `tree` (the merge refused what one part would place beneath another's link)."""
    tree.mkdir()
    package = _Tree(str(tree))
    held = [_Tree(str(root)) for _, root, _ in contents]
    try:
        for rel, index in sorted(merged.sources.items()):
            kind, detail = contents[index][0].entries[rel]
            names = rel.split("/")
            if kind == "directory":
                package.folder(names, create=True)
            elif kind == "symlink":  # made again as the part holds it (its target resolved inside: merge)
                os.symlink(detail, names[-1], dir_fd=package.folder(names[:-1], create=True))
            else:
                _move(held[index].folder(names[:-1], create=False), names[-1],
                      package.folder(names[:-1], create=True))
        for name in (MANIFEST, STOPS, RELOAD):
            _write(package, [name], dumps(merged.documents[name]))
        campaign_id = str(merged.documents[MANIFEST].get("campaign_id"))
        for part, (_, _, extraction), source in zip(parts, contents, held):
            kept, digests = [PROVENANCE, str(part.lot)], {}
            for name in MERGED_DOCUMENTS:
                _move(source.folder([], create=False), name, package.folder(kept, create=True))
                digests[name] = extraction.files[name]
            for member, name in SEAL_RECORDS.items():
                if member in extraction.seal_files:
                    _write(package, [*kept, name], extraction.seal_files[member])
                    digests[name] = hashlib.sha256(extraction.seal_files[member]).hexdigest()
            _write(package, [*kept, ASSEMBLED], assembled_record(key, campaign_id, str(part.lot), part.record(),
                                                                 digests))
    finally:
        for opened in (package, *held):
            opened.close()
    for folder, dirs, _ in os.walk(tree):
        for name in dirs:
            path = os.path.join(folder, name)
            if not os.path.islink(path):
                os.chmod(path, stat.S_IRWXU | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)
    os.chmod(tree, 0o755)


def _move(source_folder: int, name: str, folder: int) -> None:
    """Move `name` between two folder descriptors; never over an entry already there."""
    try:
        os.stat(name, dir_fd=folder, follow_symlinks=False)
    except FileNotFoundError:
        os.rename(name, name, src_dir_fd=source_folder, dst_dir_fd=folder)
        return
    raise FileExistsError(errno.EEXIST, "already placed by another part", name)


def _write(package: _Tree, names: list[str], data: bytes) -> None:
    fd = package.create_file(names)  # O_EXCL | O_NOFOLLOW: a new file, never through a link
    try:
        with os.fdopen(fd, "wb", closefd=False) as handle:
            handle.write(data)
    finally:
        os.close(fd)
