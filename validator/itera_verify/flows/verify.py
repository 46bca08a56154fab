"""The `verify` workflow: discover -> check -> reload -> check reload facts -> summarise -> seal -> report."""
from __future__ import annotations

import os
import time
from pathlib import Path

from ..runtime.hfcache import resolve_hf_cache
from ..model import Finding, Severity, UsageError
from ..package import RunContext, discover
from ..runtime.progress import NULL_PROGRESS, Progress
from ..report import Report, renderer
from .config import Config, settle
from ..rules import Selection, StartedChecks, all_rules, run_checks
from ..report import summary


def default_archive_path(ctx: RunContext, campaign_id: str, output: str | os.PathLike | None) -> Path:
    """-o FILE.tar.zst, -o FOLDER/ (created), or `<campaign_id>.tar.zst` beside the package (seal/destination.py)."""
    from ..seal.destination import archive_destination

    return archive_destination(ctx.inventory.root, campaign_id, output, create=True)


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


def check_package(ctx: RunContext, selection: Selection, *, reload: bool, device: str, timeout: float,
                  jobs: int, progress: Progress, processes: int = 1,
                  started: StartedChecks | None = None, isolation: str = "auto",
                  prestarted=None, environment=None, confine: str = "auto") -> tuple[list[Finding], list]:
    """Static checks (in `processes` processes, or those `started` already), then (optionally) the reloads and
    the rules over their facts."""
    findings = started.result() if started is not None else run_checks(ctx, selection, "static",
                                                                       processes=processes)
    reloads: list = []
    if reload:
        from ..reload import run_reloads

        reloads = run_reloads(ctx, device=device, timeout=timeout, jobs=jobs, progress=progress,
                              isolation=isolation, prestarted=prestarted, environment=environment,
                              confine=confine)
        ctx.reloads = reloads
        findings += run_checks(ctx, selection, "reload")
    return findings, reloads


def build_report(ctx: RunContext, findings: list[Finding], reloads: list, selection: Selection, *,
                 mode: str, reloaded: bool, device: str | None) -> Report:
    report = Report(package=str(ctx.inventory.root), mode=mode, findings=findings, reloads=reloads,
                    reloaded=reloaded, strict=selection.strict, device=device)
    campaign_id = ctx.documents.manifest.get("campaign_id")
    report.campaign_id = campaign_id if isinstance(campaign_id, str) else None
    report.rules = {code: {"severity": selection.severity(code).value, "title": rule.title, "family": rule.family}
                    for code, rule in all_rules().items() if selection.enabled(code)}
    blocking = [f for f in findings if selection.blocks(f)]
    report.budget = summary.budget_summary(ctx, blocking)
    report.plan = summary.plan_summary(ctx)
    report.runs = summary.runs_summary(ctx, findings)
    report.curves = summary.metric_curves(ctx)
    report.named_metrics = summary.named_metrics(ctx)
    return report


def verify(path, *, config: Config | None = None, device: str | None = None, reload: bool = True,
           seal: bool = True, output=None, overwrite: bool = False, selection: Selection | None = None,
           hf_cache=None, timeout: float | None = None, jobs: int = 1, level: int = 3, threads: int = 0,
           tmp_patterns: tuple[str, ...] | None = None, tariffs: dict | None = None,
           progress: Progress = NULL_PROGRESS, isolation: str = "auto", sign: str | None = None,
           push=None, deadline: str | None = None, pushing: bool = False, confine: str = "auto") -> Report:
    """Check a package, reload its artifacts and seal it when nothing blocks. Raises UsageError (exit 2).
    `config` None applies the configuration file the command line would (flows/config.py), `Config()` none;
    the other arguments, when given, override it. The report names the file applied. `sign`: `ssh:KEY.pub` or
    `ssh:KEY` (seal/sign.py), opened before any work. `push`: a push/follow.SealFollower that uploads the archive
    while the seal writes it (the caller completes it with push.result() when it was attached, pushes otherwise).
    `deadline` (RFC 3339, --deadline): when the rental ends, over the lots' started_at + days; before the seal the
    report estimates it (and the push, `pushing`) and warns at once when they may not finish in time.
    `confine` ("auto", "required"): how the reload children confine themselves (reload/confine.py); "required" on
    a machine without Landlock is a UsageError before any work."""
    if sign is not None and not seal:
        raise UsageError("--sign signs the seal: it cannot be used with --no-seal")
    started = time.monotonic()
    options = settle(config, selection=selection, device=device, timeout=timeout, tmp_patterns=tmp_patterns,
                     tariffs=tariffs)
    selection, device, timeout = options.selection, options.device, options.timeout
    tmp_patterns, tariffs = options.tmp_patterns, options.tariffs
    resolved_device = None
    if reload:
        from ..reload import check_confinement, resolve_device

        check_confinement(confine)  # --confine required on a machine without Landlock fails before any work
        resolved_device = resolve_device(device)  # so does --device cuda without a GPU
    ctx = RunContext(discover(path), environment=options.environment)
    if deadline is not None:
        ctx.settings["deadline"] = deadline
    ctx.settings["push"] = pushing
    rental_end = summary.rental_end(ctx)[0]
    if rental_end is not None:  # the seal's rate, measured here once, at its settings
        from ..seal.rate import measure_package

        ctx.settings["seal_rate"] = measure_package(ctx, level=level, threads=threads)
    rental = summary.rental_summary(ctx, push=ctx.settings["push"])
    if rental is not None and rental.get("warning"):
        progress.log(f"WARNING: {rental['warning']}")  # now, before the checks and the seal: time to act
    if push is not None:  # the overlapped upload measures its first parts against the same end
        push.set_deadline(rental_end)
    ctx.hf_cache = resolve_hf_cache(hf_cache, options.environment)
    ctx.tmp_patterns = tuple(tmp_patterns)
    if tariffs is not None:
        ctx.settings["tariffs"] = tariffs
    from ..seal import termination_unwinds

    if seal:  # an -o that cannot work is exit 2 before any check (seal/destination.py)
        from ..seal.destination import read_output

        read_output(ctx.inventory.root, output)
    seal_options = dict(output=output, overwrite=overwrite, level=level, threads=threads, progress=progress)
    with termination_unwinds():  # SIGTERM unwinds like Ctrl-C: a seal begun beside the checks is removed
        static_checks, sealing, prestarted, signer = None, None, None, None
        try:
            if sign is not None:  # a key the agent does not hold stops the command before any work
                from ..seal.sign import open_signer

                signer = open_signer(sign, ctx)
            if seal:
                # Beside a seal the checks run in one child process, forked before the seal's threads start:
                # both cores are busy already, and the seal's threads then have this interpreter to themselves.
                static_checks = StartedChecks(ctx, selection, "static", detached=True)
            if reload:  # the reload zygote imports its libraries while the static checks run (reload/runner.py)
                from ..reload import prestart

                prestarted = prestart(ctx, device=resolved_device, jobs=jobs, isolation=isolation,
                                      environment=options.environment)
            if push is not None:
                # The store's client (boto3's import, the credentials, the endpoint) while the checks' child runs
                # on the other core, before the seal's threads: PushError (exit 2) now, not after the checks, and
                # the first part leaves as soon as the seal has written it.
                push.connect()
            if seal:
                sealing = start_sealing(ctx, follower=push, **seal_options)
            findings, reloads = check_package(ctx, selection, reload=reload, device=resolved_device or "cpu",
                                              timeout=timeout, jobs=jobs, progress=progress,
                                              processes=1 if static_checks is not None else check_processes(ctx),
                                              started=static_checks, isolation=isolation,
                                              prestarted=prestarted, environment=options.environment,
                                              confine=confine)
            report = build_report(ctx, findings, reloads, selection, mode="verify", reloaded=reload,
                                  device=resolved_device)
            report.configuration = options.configuration
            if not seal:
                report.seal_skipped = "--no-seal"
            elif report.blocking():
                report.seal_skipped = ("findings at error level"
                                       + (" (or warnings with --strict)" if selection.strict else ""))
            else:
                seal_report(ctx, report, selection, sealing=sealing, signer=signer, **seal_options)
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


def start_sealing(ctx: RunContext, *, output, overwrite: bool, level: int, threads: int, progress: Progress,
                  follower=None):
    """Begin the seal before the checks, on its own threads: reading, hashing and compressing the package
    overlaps the checks (which mostly run on one core), and the result is thrown away unless they pass. None
    when the seal cannot start this early (no campaign id yet, a destination or an entry that would refuse):
    seal_report then seals after the checks, and reports such a problem the way it always has."""
    from ..seal import SealRefused, Sealing

    campaign_id = ctx.documents.manifest.get("campaign_id")
    if not isinstance(campaign_id, str):
        return None
    try:
        sealing = Sealing(ctx, campaign_id, default_archive_path(ctx, campaign_id, output),
                          overwrite=overwrite, level=level, threads=threads, progress=progress, follower=follower)
        return sealing.start()
    except (UsageError, SealRefused, OSError, ValueError):
        return None


def seal_report(ctx: RunContext, report: Report, selection: Selection, *, output, overwrite: bool, level: int,
                threads: int, progress: Progress, sealing=None, signer=None) -> None:
    """Seal the package with the report inside; a file changed since the check turns into IV704 findings.
    `sealing`: a seal started beside the checks, finished here with the report; None seals now."""
    from ..rules.archive import seal_findings
    from ..seal import SealRefused, seal_package

    campaign_id = report.campaign_id or ctx.inventory.root.resolve().name
    destination = default_archive_path(ctx, campaign_id, output)
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
            report.archive = seal_package(ctx, campaign_id, members, destination, overwrite=overwrite,
                                          level=level, threads=threads, progress=progress, signer=signer)
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
