"""The `verify` workflow: discover -> check -> reload -> check reload facts -> summarise -> seal -> report."""
from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path

from ..model import Finding, Severity, UsageError
from ..options import RunOptions
from ..package import RunContext, discover
from ..package.jsonpos import locate
from ..report import Report, renderer, summary
from ..rules import all_rules, severity_of
from ..runtime.progress import NULL_PROGRESS, Progress
from .checks import StartedChecks, run_checks
from .config import settle


def default_archive_path(ctx: RunContext, campaign_id: str, output: str | os.PathLike | None) -> Path:
    """-o FILE.tar.zst, -o FOLDER/ (created), or `<campaign_id>.tar.zst` beside the package (seal/destination.py);
    a lot's part (--part) is named `<campaign_id>.<lot>.part.tar.zst` (format/parts.py)."""
    from ..format.parts import part_archive_stem, part_lot
    from ..seal.destination import archive_destination

    name = part_archive_stem(campaign_id, part_lot(ctx.documents.manifest)) if ctx.options.part else campaign_id
    return archive_destination(ctx.inventory.root, name, output, create=True)


PARALLEL_MIN_FILES = 1000
PARALLEL_MIN_BYTES = 64 << 20


def check_processes(ctx: RunContext) -> int:
    """Processes for the static checks: one per core, up to the number of families worth a share (three), on a
    package big enough that a fork (milliseconds) is noise beside the checks (seconds on 20,000 files). The
    callers use it where nothing else keeps the cores busy (not beside a seal)."""
    from ..archive import worker_count

    cores = worker_count(0)  # every core this process may use
    scanned = sum(entry.size for rel, entry in ctx.inventory.files.items() if not rel.endswith(".safetensors"))
    big = len(ctx.inventory.files) >= PARALLEL_MIN_FILES or scanned >= PARALLEL_MIN_BYTES
    return min(cores, 3) if big else 1


def check_package(ctx: RunContext, *, device: str | None, progress: Progress, processes: int = 1,
                  started: StartedChecks | None = None, prestarted=None) -> tuple[RunContext, list[Finding]]:
    """Static checks (in `processes` processes, or those `started` already), then, when the options say so, the
    reloads on `device` (resolved) and the rules over their facts. Returns the context the later phases read
    (with the reloads) and every finding."""
    selection = ctx.options.selection
    findings = started.result() if started is not None else run_checks(ctx, selection, "static",
                                                                       processes=processes)
    if ctx.options.reload:
        from ..reload import run_reloads
        from .partproofs import stand_in

        options = ctx.options
        reloads = run_reloads(ctx, device=device or "cpu", timeout=options.timeout, jobs=options.jobs,
                              progress=progress, isolation=options.isolation, prestarted=prestarted,
                              confine=options.confine)
        # An assembled campaign: a lot's signed proof for what this machine lacks the memory to reload.
        ctx = replace(ctx, reloads=stand_in(ctx, reloads))
        findings += run_checks(ctx, selection, "reload")
    return ctx, findings


def build_report(ctx: RunContext, findings: list[Finding], *, mode: str, device: str | None,
                 rental: dict | None = None) -> Report:
    """The report of a checked context: its findings, its reloads, and the campaign's facts as the package
    derives them (package/facts.py; the report words them, it does not compute them again)."""
    selection = ctx.options.selection
    reloaded = ctx.reloads is not None
    locate(ctx.documents, findings)  # a pointer's line, for every format that points at lines (SARIF)
    report = Report(package=str(ctx.inventory.root), mode=mode, findings=findings, reloads=list(ctx.reloads or ()),
                    reloaded=reloaded, strict=selection.strict, device=device)
    campaign_id = ctx.documents.manifest.get("campaign_id")
    report.campaign_id = campaign_id if isinstance(campaign_id, str) else None
    report.rules = {code: {"severity": severity_of(selection, code).value, "title": rule.title,
                           "family": rule.family}
                    for code, rule in all_rules().items() if selection.enabled(code)}
    blocking = [f for f in findings if selection.blocks(f)]
    report.budget = summary.budget_summary(ctx, blocking)
    report.plan = summary.plan_summary(ctx, rental=rental)
    report.runs = summary.runs_summary(ctx, findings)
    report.curves = summary.metric_curves(ctx)
    report.named_metrics = summary.named_metrics(ctx)
    report.configuration = dict(ctx.options.configuration)
    report.cap_findings()  # after the summaries, which count every finding
    return report


def verify(path: str | os.PathLike, options: RunOptions | None = None, *, progress: Progress | None = None,
           push=None) -> Report:
    """Check a package, reload its artifacts and seal it when nothing blocks. Raises UsageError (exit 2).

    `options`: from `settle(config, **overrides)` (flows/config.py); None applies the configuration file the
    command line would, with every default. `push`: a push/follow.SealFollower that uploads the archive while
    the seal writes it (the command line's `--push`; the caller completes it with push.result() when it was
    attached, pushes otherwise). When the rental's end is known (`--deadline`, the lots' started_at + days),
    the seal (and the push, `options.pushing`) is estimated before it starts, and a warning is said at once when
    they may not finish in time."""
    options = settle() if options is None else options
    progress = NULL_PROGRESS if progress is None else progress
    started = time.monotonic()
    if options.reload and options.environment.torch_advisory:  # the sender's own files: a warning, not a refusal
        progress.log(f"WARNING: {options.environment.torch_advisory}")
    resolved_device = None
    if options.reload:
        from ..reload import check_confinement, resolve_device

        check_confinement(options.confine)  # --confine required on a machine without Landlock: before any work
        resolved_device = resolve_device(options.device)  # so does --device cuda without a GPU
    ctx = RunContext(discover(path), options)
    rental = _rental(ctx, progress)
    if push is not None:  # the overlapped upload measures its first parts against the same end
        push.set_deadline(summary.rental_end(ctx)[0])
    from ..seal import termination_unwinds

    if options.seal:  # an -o that cannot work is exit 2 before any check (seal/destination.py)
        from ..seal.destination import read_output

        read_output(ctx.inventory.root, options.output)
    with termination_unwinds():  # SIGTERM unwinds like Ctrl-C: a seal begun beside the checks is removed
        static_checks, sealing, prestarted, signer = None, None, None, None
        try:
            if options.sign:  # a key the agent does not hold stops the command before any work
                from ..seal.sign import open_signer

                signer = open_signer(options.sign, ctx)
            if options.seal:
                # Beside a seal the checks run in one child process, forked before the seal's threads start:
                # both cores are busy already, and the seal's threads then have this interpreter to themselves.
                static_checks = StartedChecks(ctx, options.selection, "static", detached=True)
            if options.reload:  # the reload zygote imports its libraries while the static checks run
                from ..reload import prestart

                prestarted = prestart(ctx, isolation=options.isolation)
            if push is not None:
                # The store's client (boto3's import, the credentials, the endpoint) while the checks' child runs
                # on the other core, before the seal's threads: PushError (exit 2) now, not after the checks, and
                # the first part leaves as soon as the seal has written it.
                push.connect()
            if options.seal:
                sealing = start_sealing(ctx, progress, follower=push)
            ctx, findings = check_package(ctx, device=resolved_device, progress=progress,
                                          processes=1 if static_checks is not None else check_processes(ctx),
                                          started=static_checks, prestarted=prestarted)
            report = build_report(ctx, findings, mode="verify", device=resolved_device, rental=rental)
            if not options.seal:
                report.seal_skipped = "--no-seal"
            elif report.blocking():
                report.seal_skipped = ("findings at error level"
                                       + (" (or warnings with --strict)" if options.selection.strict else ""))
            else:
                seal_report(ctx, report, progress, sealing=sealing, signer=signer)
        finally:
            if signer is not None:
                signer.close()
            if prestarted is not None:
                prestarted.close()
            if static_checks is not None:
                static_checks.cancel()
            if sealing is not None:
                sealing.cancel()  # nothing to undo once published; otherwise the partial archive goes
    report.elapsed_seconds = time.monotonic() - started
    return report


def _rental(ctx: RunContext, progress: Progress) -> dict | None:
    """When the rental's end is known: the seal's rate measured here, once, at the seal's settings, and the
    estimate against the end (a result for the report); its warning is said now, before the checks and the
    seal, while there is time to act."""
    if summary.rental_end(ctx)[0] is None:
        return None
    from ..seal.rate import measure_package

    measured = measure_package(ctx, level=ctx.options.level, threads=ctx.options.threads)
    rental = summary.rental_summary(ctx, measured=measured)
    if rental is not None and rental.get("warning"):
        progress.log(f"WARNING: {rental['warning']}")
    return rental


def start_sealing(ctx: RunContext, progress: Progress, *, follower=None):
    """Begin the seal before the checks, on its own threads: reading, hashing and compressing the package
    overlaps the checks (which mostly run on one core), and the result is thrown away unless they pass. None
    when the seal cannot start this early (no campaign id yet, a destination or an entry that would refuse):
    seal_report then seals after the checks, and reports such a problem the way it always has."""
    from ..seal import SealRefused, Sealing

    campaign_id = ctx.documents.manifest.get("campaign_id")
    if not isinstance(campaign_id, str):
        return None
    options = ctx.options
    try:
        sealing = Sealing(ctx, campaign_id, default_archive_path(ctx, campaign_id, options.output),
                          overwrite=options.overwrite, level=options.level, threads=options.threads,
                          progress=progress, follower=follower)
        return sealing.start()
    except (UsageError, SealRefused, OSError, ValueError):
        return None


def seal_report(ctx: RunContext, report: Report, progress: Progress, *, sealing=None, signer=None) -> None:
    """Seal the package with the report inside; a file changed since the check turns into IV704 findings.
    `sealing`: a seal started beside the checks, finished here with the report; None seals now."""
    from ..rules.archive import seal_findings
    from ..seal import SealRefused, seal_package

    options = ctx.options
    campaign_id = report.campaign_id or ctx.inventory.root.resolve().name
    destination = default_archive_path(ctx, campaign_id, options.output)
    if sealing is not None and (sealing.campaign_id, sealing.destination) != (campaign_id, destination):
        sealing.cancel()
        sealing = None
    report.sealed = True  # what the sealed verification.json says: this package was sealed after these checks
    members = {
        "SEAL/verification.json": renderer("json")(report, {}).encode("utf-8"),
        "SEAL/report.html": renderer("html")(report, {}).encode("utf-8"),
    }
    try:
        if sealing is not None:
            report.archive = sealing.finish(members, signer)
        else:
            report.archive = seal_package(ctx, campaign_id, members, destination, overwrite=options.overwrite,
                                          level=options.level, threads=options.threads, progress=progress,
                                          signer=signer)
    except SealRefused as refused:
        report.sealed = False
        report.seal_refused = True
        findings = seal_findings(refused.problems)
        for finding in findings:
            # A seal that did not happen is never a pass: `levels` and `ignore` cannot lower these.
            finding.severity = Severity.ERROR
        report.findings.extend(findings)
        report.seal_skipped = str(refused)


__all__ = ["verify", "UsageError"]
