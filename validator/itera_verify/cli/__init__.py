"""Command line: argument parsing, configuration, presentation and exit codes. No checks live here."""
from __future__ import annotations

import math
import os
import shlex
import sys
from dataclasses import replace
from pathlib import Path

import click

from ..version import FORMAT, __version__
from ..runtime.allocator import keep_freed_buffers
from ..runtime.ending import end_program
from ..flows.config import Config, load_config, settle
from ..runtime.environment import Environment
from ..model import UsageError
from ..package import inside_package, shortened
from ..report import FORMATS, Report, renderer
from ..report.words import clean, plain_lines
from ..rules import Selection, all_rules, unknown_codes
from .batch import batch_options, is_batch_target, run_batch

EXTENSION_FORMATS = {".json": "json", ".xml": "junit", ".html": "html", ".htm": "html", ".txt": "text",
                     ".log": "github", ".jsonl": "jsonl", ".sarif": "sarif"}


def _codes(value: str | None) -> tuple[str, ...]:
    codes = tuple(c.strip().upper() for c in (value or "").split(",") if c.strip())
    bad = unknown_codes(codes)
    if bad:
        raise click.BadParameter(f"unknown rule code {bad[0]!r} (see `itera-verify rules`)")
    return codes


def _finite_seconds(ctx, param, value):
    """NaN passes every range comparison and would let a hung reload hold the machine forever."""
    if value is not None and not math.isfinite(value):
        raise click.BadParameter(f"{value} is not a number of seconds")
    return value


def _report_targets(values: tuple[str, ...], default_format: str) -> list[tuple[str, Path]]:
    """--report PATH or --report FORMAT=PATH (repeatable)."""
    targets = []
    for value in values:
        fmt, sep, path = value.partition("=")
        if sep and fmt in FORMATS:
            targets.append((fmt, Path(path)))
        elif sep and fmt and "/" not in fmt:
            raise click.BadParameter(f"unknown format {fmt!r} in --report {value} ({', '.join(FORMATS)})")
        else:
            targets.append((EXTENSION_FORMATS.get(Path(value).suffix.lower(), default_format), Path(value)))
    return targets


def _selection(config: Config, select: str | None, ignore: str | None, strict: bool) -> Selection:
    return Selection(select=_codes(select) or config.select, ignore=config.ignore + _codes(ignore),
                     levels=dict(config.levels), strict=strict)


def _choose_format(fmt: str | None, environment: Environment) -> str:
    if fmt:
        return fmt
    return "github" if environment.github_actions else "text"


def _refuse_reports_inside(targets: list[tuple[str, Path]], folder: Path, what: str) -> None:
    """Before any work: a report file inside the package would overwrite what is being checked (the same guard
    as the archive's), so it is refused with nothing written."""
    for _, path in targets:
        if inside_package(folder, path):
            raise UsageError(f"--report {shortened(path)}: would write into the {what} being checked "
                             f"({shortened(folder)}); the tool never writes there (give a path outside it)")


def _write_report(path: Path, text: str) -> None:
    """Write at the resolved path; a regular file is replaced (a new file, renamed over it), so that a hard
    link to a package file outside the package never becomes a way to write into the package. Anything else
    that exists (/dev/stdout, a fifo) is written as it is."""
    if path.exists() and not path.is_file():  # /dev/stdout resolves to a pipe's name, which cannot be opened
        path.write_text(text, encoding="utf-8")
        return
    target = Path(os.path.realpath(path))
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    try:
        partial.write_text(text, encoding="utf-8")
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)


def _emit(report: Report, fmt: str, targets: list[tuple[str, Path]], quiet: bool, verbose: bool,
          environment: Environment) -> None:
    color = sys.stdout.isatty() and not environment.no_color
    options = {"color": color, "verbose": verbose, "quiet": quiet, "workspace": environment.github_workspace}
    for target_format, path in targets:
        text = renderer(target_format)(report, {**options, "color": False})
        try:
            _write_report(path, text)
        except OSError as exc:
            raise UsageError(f"--report {shortened(path)}: cannot write ({exc.strerror or exc})") from exc
    # `--format json --report PATH` sends the JSON to the file only, so stdout stays clean for a pipe.
    if not any(t[0] == fmt for t in targets) or fmt == "text":
        click.echo(renderer(fmt)(report, options), nl=False)


def _exit_code(report: Report) -> int:
    return 1 if report.verdict == "fail" else 0


def _make_progress(quiet: bool, verbose: bool):
    from .progress import make_progress

    return make_progress(quiet=quiet, verbose=verbose)


def _run(action) -> None:
    """Exit 2 with one line for a usage problem; never a traceback for a user mistake."""
    try:
        code = action()
    except UsageError as exc:  # one line, whatever a name it quotes holds
        click.echo(plain_lines(clean(f"itera-verify: error: {exc}")), err=True)
        sys.exit(2)
    except OSError as exc:  # what no layer named: still the system refusing a path (too long, read-only, full)
        where = f"{shortened(exc.filename)}: " if exc.filename else ""
        click.echo(plain_lines(clean(f"itera-verify: error: {where}{exc.strerror or exc}")), err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        click.echo("itera-verify: interrupted", err=True)
        sys.exit(130)
    sys.exit(code)


class DefaultCommandGroup(click.Group):
    """`itera-verify OUTDIR` runs `verify`; `audit`, `init` and `rules` are subcommands. A folder named like a
    subcommand (`rules/`, `audit/`) is read as that subcommand: `itera-verify verify OUTDIR` is the unambiguous
    form."""

    def parse_args(self, ctx, args):
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h", "--version"):
            args = ["verify", *args]
        return super().parse_args(ctx, args)


def run() -> None:
    """The `itera-verify` program (its console script, `python -m itera_verify`): `main`, then the process ends as
    the interpreter ends one, without its teardown of every module (runtime/ending.py). Call `main` to run the
    command line inside another program."""
    end_program(main)


@click.group(cls=DefaultCommandGroup, context_settings={"help_option_names": ["-h", "--help"]})
# The tool's version and the package format it writes and reads: a reviewer can tell whether it can audit an archive.
@click.version_option(__version__, prog_name="itera-verify",
                      message=f"%(prog)s %(version)s (package format: writes {FORMAT}, reads {FORMAT})")
def main() -> None:
    """Check a campaign output folder, reload every artifact, and seal it into a checksummed archive.

    \b
      itera-verify OUTDIR [options]     check, reload and seal (see `itera-verify verify --help`)
      itera-verify verify OUTDIR        the same; say `verify` when OUTDIR is named like a subcommand
      itera-verify audit ARCHIVE        audit a delivered archive as hostile input
      itera-verify push ARCHIVE DEST    send it to s3://bucket/prefix/ or a folder, verified, with a receipt
      itera-verify assemble PART... -o DIR   join the lots' parts into one campaign
      itera-verify init OUTDIR          write a template package to start a campaign from
      itera-verify rules [CODE]         list the rules, or explain one
    """


# How reload children start: forked from one preloaded zygote (auto: where fork is safe) or a new interpreter each.
_isolation_option = click.option("--isolation", type=click.Choice(["auto", "fork", "spawn"]), default="auto",
                                 help="Reload children forked from one preloaded process (auto, fork) or each a "
                                      "new interpreter (spawn).")
# How each reload child confines itself (Landlock and seccomp, reload/confine.py): as far as the kernel can, or exit 2.
_confine_option = click.option("--confine", type=click.Choice(["auto", "required"]), default="auto",
                               help="Reload children confined by Linux Landlock and seccomp (read-only package, hub "
                                    "cache and libraries, writes only in their scratch folder, no TCP, no new "
                                    "socket): auto confines as far as the kernel allows and reports it; required "
                                    "exits 2 where it cannot.")
_format_option = click.option("--format", "fmt", type=click.Choice(FORMATS), default=None,
                              help="Output format on stdout (default text; github under GitHub Actions).")
_report_option = click.option("--report", "reports", multiple=True, metavar="[FORMAT=]PATH",
                              help="Also write a report file; repeatable (e.g. --report html=out.html).")
_quiet = click.option("-q", "--quiet", is_flag=True, help="Only the verdict and findings.")
_verbose = click.option("-v", "--verbose", is_flag=True, help="More detail (passing reloads, timings).")


def _byte_count(ctx, param, value):
    """--part-size 64M, 64MiB or 67108864."""
    if value is None:
        return None
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = value.strip().upper().removesuffix("IB").removesuffix("B")
    digits = text.rstrip("KMG")
    if not digits.isdigit() or text[len(digits):] not in units:
        raise click.BadParameter(f"{value!r} is not a number of bytes (e.g. 67108864, 64M)")
    from ..format.push import MAX_PART_SIZE, MIN_PART_SIZE

    count = int(digits) * units[text[len(digits):]]
    if count < MIN_PART_SIZE:
        raise click.BadParameter(f"{value} is below 5 MiB, the smallest part S3 accepts")
    if count > MAX_PART_SIZE:
        raise click.BadParameter(f"{value} is above 5 GiB, the largest part S3 accepts")
    return count


def _warn(message: str) -> None:
    """A warning that cannot wait for the verdict (the push will not finish before the rental ends)."""
    click.echo(plain_lines(clean(f"itera-verify: warning: {message}")), err=True)


def _push_archive(archive, dest, *, endpoint_url, read_back, jobs, part_size, quiet, verbose, follower=None,
                  deadline=None, overwrite=False):
    """The push shared by `push` and `verify --push`: (result, None) or (None, (exit code, one line, whether
    pushing the same archive to the same DEST later can succeed)). `follower`: the upload that overlapped the seal,
    completed here when it followed this archive."""
    from ..format.push import DEFAULT_PART_SIZE
    from ..push import PushError, PushUnverified, push
    from ..push.occupied import Occupied
    from ..push.store import DestinationRefused

    try:
        if follower is not None and follower.state == "sealed":
            return follower.result(), None
        with _make_progress(quiet, verbose) as progress:
            return push(archive, dest, endpoint_url=endpoint_url, read_back=read_back, jobs=jobs,
                        part_size=part_size or DEFAULT_PART_SIZE, progress=progress, deadline=deadline,
                        warn=_warn, overwrite=overwrite), None
    except Occupied as exc:  # another archive under this name: only --overwrite sends this one there
        return None, (1, f"itera-verify: push refused: {exc}", False)
    except PushUnverified as exc:
        return None, (1, f"itera-verify: push not verified: {exc}", True)
    except PushError as exc:  # a destination refused as given: pushing the archive there again cannot help
        return None, (2, f"itera-verify: error: {exc}", not isinstance(exc, DestinationRefused))


def push_line(result) -> str:
    receipt = result.receipt
    where = receipt["destination"].rstrip("/") + "/" + receipt["key"].rsplit("/", 1)[-1]
    resumed = (f"; resumed ({result.parts_reused} of {result.parts} parts were already there)"
               if result.parts_reused else "; it was there already, nothing sent" if result.parts == 0 else "")
    return (f"pushed to {where} ({receipt['bytes']} bytes, verified: {receipt['verified_by']}; "
            f"checksum {receipt['checksum']}){resumed}; receipt {result.receipt_path}")


_push_options = [
    click.option("--endpoint-url", default=None, help="An S3-compatible store's endpoint (default: the AWS "
                                                      "environment and config files)."),
    click.option("--read-back", is_flag=True, help="Also read the object back and hash it."),
    click.option("--part-size", default=None, callback=_byte_count, help="Bytes per part (default 32M)."),
]


def _with_push_options(function):
    for option in reversed(_push_options):
        function = option(function)
    return function


def _rfc3339(ctx, param, value):
    """--deadline: an RFC 3339 time with its zone; a bad one is a usage error (exit 2)."""
    from datetime import datetime

    if value is None:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        parsed = None
    if parsed is None or parsed.tzinfo is None:
        raise click.BadParameter(f"{value!r}: an RFC 3339 time with its zone, e.g. 2026-11-23T08:00:00Z")
    return value


@main.command("verify")
@click.argument("outdir", type=click.Path(path_type=Path))
@click.option("--device", type=click.Choice(["auto", "cuda", "cpu"]), default=None, help="Where reloads run.")
@click.option("--no-reload", is_flag=True, help="Skip the reloads (the report says nothing was reloaded).")
@click.option("--no-seal", is_flag=True, help="Run every check but do not write the archive.")
@click.option("--part", is_flag=True, help="OUTDIR is one lot's part of a campaign: seal it as "
                                           "CAMPAIGN.LOT.part.tar.zst for `assemble` (docs/record.md).")
@click.option("-o", "--output", type=click.Path(),  # a str: Path() would drop the trailing / that means a folder
              help="Archive file (NAME.tar.zst) or folder (DIR/, created if its parent exists).")
@click.option("--overwrite", is_flag=True, help="Replace an existing archive of the same name (with --push, "
                                                "also the one at DEST).")
@_format_option
@_report_option
@click.option("--strict", is_flag=True, help="Warnings fail too.")
@click.option("--select", help="Only these codes or prefixes (comma-separated, e.g. IV1,IV303).")
@click.option("--ignore", help="Skip these codes or prefixes.")
@click.option("--hf-cache", type=click.Path(path_type=Path), help="Hugging Face hub cache holding the base models.")
@click.option("--timeout", type=click.FloatRange(min=1, max=7 * 86400), default=None, callback=_finite_seconds,
              help="Seconds per reload (default 600).")
@click.option("--jobs", type=click.IntRange(min=1), default=1, help="Parallel CPU reloads.")
@_isolation_option
@_confine_option
@click.option("--level", type=click.IntRange(1, 19), default=3, help="zstd level (default 3).")
@click.option("--threads", type=click.IntRange(min=0), default=0, help="zstd threads (0 = all cores).")
@click.option("--config", "config_path", type=click.Path(path_type=Path, dir_okay=False),
              help="Configuration file (default: itera-verify.toml or pyproject.toml, searched upward).")
@click.option("--sign", "sign", metavar="ssh:KEY", multiple=True,
              help="Sign the seal with an SSH key: ssh:KEY.pub (its private half in ssh-agent) or ssh:KEY (a "
                   "private key file); writes SEAL/statement.json(.sig) and ARCHIVE.sig. Also (or instead) "
                   "model-signing:KEY.pem: an OpenSSF model-signing signature, SEAL/model.sig.")
@_quiet
@click.option("--push", "push_dest", metavar="DEST", default=None,
              help="After a successful seal, push the archive to s3://bucket/prefix/ or a folder (as `push`).")
@_with_push_options
@click.option("--deadline", metavar="TIME", default=None, callback=_rfc3339,
              help="When the rental ends (RFC 3339, e.g. 2026-11-23T08:00:00Z): overrides the lots' started_at + "
                   "days; the seal (and push) are estimated against it.")
@_verbose
def verify_command(outdir, device, no_reload, no_seal, part, output, overwrite, fmt, reports, strict, select, ignore,
                   hf_cache, timeout, jobs, isolation, confine, level, threads, config_path, sign,
                   push_dest, endpoint_url, read_back, part_size, deadline, quiet, verbose):
    """Check OUTDIR, reload every artifact and seal it (exit 0 pass, 1 findings, 2 could not run); with --push,
    then push the archive (exit 1 when the copy is not verified, 2 when the push could not run)."""
    from ..flows.verify import verify

    def action() -> int:
        environment = Environment.read()  # once, for the whole command (runtime/environment.py)
        config = replace(load_config(explicit=config_path), environment=environment)
        fmt_chosen = _choose_format(fmt, environment)
        targets = _report_targets(reports, fmt_chosen)
        _refuse_reports_inside(targets, outdir, "package")
        options = settle(config, selection=_selection(config, select, ignore, strict), device=device,
                         reload=not no_reload, seal=not no_seal, output=output, overwrite=overwrite,
                         hf_cache=hf_cache, timeout=timeout, jobs=jobs, level=level, threads=threads,
                         isolation=isolation, confine=confine, sign=sign, deadline=deadline, pushing=bool(push_dest),
                         part=part)
        follower = None
        if push_dest:  # no such folder, no s3:// address: said now (credentials: before the seal, follow.connect)
            from ..push import check_destination

            check_destination(push_dest)
        with _make_progress(quiet, verbose) as progress:
            if push_dest:  # an S3 upload overlaps the seal (push/follow.py)
                from ..push import seal_follower

                follower = seal_follower(push_dest, endpoint_url=endpoint_url, read_back=read_back, jobs=4,
                                         part_size=part_size, progress=progress, warn=_warn, overwrite=overwrite)
            report = verify(outdir, options, progress=progress, push=follower)
            push_options = dict(endpoint_url=endpoint_url, read_back=read_back, part_size=part_size,
                                quiet=quiet or fmt_chosen != "text", verbose=verbose, overwrite=overwrite)
            streamed = follower is not None and follower.state == "sealed"
            if streamed:  # completed under the same progress bars its parts were sent under
                failure = _push_sealed(report, push_dest, follower=follower, **push_options)
        if not streamed:
            failure = _push_sealed(report, push_dest, deadline=follower.watch.deadline if follower else None,
                                   **push_options)
        _emit(report, fmt_chosen, targets, quiet, verbose, environment)
        if failure is not None:
            click.echo(plain_lines(clean(failure[1])), err=True)
            return failure[0]
        return _exit_code(report)

    _run(action)


def _push_sealed(report: Report, dest, **options):
    """--push: the sealed archive, once sealed; the receipt (or the error) goes into the report's archive."""
    if not dest or not report.sealed or not isinstance(report.archive, dict) or not report.archive.get("path"):
        return None
    from ..push.store import RESUME

    archive = Path(report.archive["path"])
    result, failure = _push_archive(archive, dest, jobs=4, **options)
    if failure is not None and failure[2]:  # the seal stands: the same command would refuse it, `push` sends it
        code, line, _ = failure
        again = ["itera-verify", "push", str(archive), str(dest)]
        if options.get("endpoint_url"):
            again += ["--endpoint-url", options["endpoint_url"]]
        if options.get("read_back"):
            again.append("--read-back")
        failure = (code, line.removesuffix(f"; {RESUME}") + f"; the archive is sealed: `{shlex.join(again)}` sends "
                                                            "it", True)
    report.archive["push"] = result.to_json() if result else {"destination": dest, "error": failure[1]}
    return failure


@main.command("audit")
@click.argument("archive", type=click.Path())  # a file, s3://bucket/key.tar.zst, or a batch (cli/batch.py)
@click.option("--reload", "do_reload", is_flag=True, help="Also reload every artifact.")
@click.option("--endpoint-url", default=None,
              help="For s3://bucket/key.tar.zst: an S3-compatible store's endpoint (default: the AWS environment).")
@click.option("--max-size", type=click.IntRange(min=1), default=None,
              help="Refuse to expand beyond this many bytes (default: 20 × the archive size, at least 1 GiB).")
@click.option("--device", type=click.Choice(["auto", "cuda", "cpu"]), default=None,
              help="Where --reload runs (default: the configuration's device, else auto).")
@click.option("--hf-cache", type=click.Path(path_type=Path))
@click.option("--timeout", type=click.FloatRange(min=1, max=7 * 86400), default=None, callback=_finite_seconds,
              help="Seconds per reload (default: the configuration's timeout, else 600).")
@click.option("--jobs", type=click.IntRange(min=1), default=1,
              help="Parallel CPU reloads; for a folder, prefix or list: archives audited at once.")
@_isolation_option
@_confine_option
@_format_option
@_report_option
@click.option("--strict", is_flag=True)
@click.option("--select", help="Only these codes or prefixes in the re-check (comma-separated).")
@click.option("--ignore", help="Skip these codes or prefixes in the re-check (comma-separated).")
@click.option("--config", "config_path", type=click.Path(path_type=Path, dir_okay=False),
              help="The reviewer's configuration (default: itera-verify.toml or pyproject.toml, searched upward "
                   "from the current folder; never one inside the archive or in a folder holding an extracted "
                   "package: manifest.json or SEAL/).")
@click.option("--allowed-signers", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Require a seal signed by one of these keys (OpenSSH allowed_signers format).")
@click.option("--signer", default=None, metavar="IDENTITY",
              help="Require this principal of --allowed-signers (as ssh-keygen -Y verify -I).")
@click.option("--oms-public-key", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Require SEAL/model.sig, an OpenSSF model-signing signature, made by this EC key (PEM).")
@_quiet
@_verbose
@batch_options
def audit_command(archive, do_reload, endpoint_url,
                  max_size, device, hf_cache, timeout, jobs, isolation, confine, fmt, reports, strict,
                  select, ignore, config_path, allowed_signers, signer, oms_public_key, quiet, verbose,
                  shard, engine, results, results_key):
    """Audit a sealed ARCHIVE without trusting it: members, checksums, then every check again. ARCHIVE may be a
    folder, an s3://BUCKET/PREFIX/ or @list.txt: every *.tar.zst there, each in its own process (exit 0 all
    pass, 1 any fails, 2 the batch could not run)."""
    from ..flows.audit import audit

    keep_freed_buffers()
    if is_batch_target(archive, shard=shard, results=results, engine=engine, results_key=results_key):
        return run_batch(archive, locals())

    def action() -> int:
        # The reviewer's configuration, never the sender's (not one in an extracted package, where the README
        # sends the reviewer next): the sender's is shown beside it from the record.
        environment = Environment.read()  # once, for the whole command (runtime/environment.py)
        config = replace(load_config(explicit=config_path, reviewer=True), environment=environment)
        fmt_chosen = _choose_format(fmt, environment)
        targets = _report_targets(reports, fmt_chosen)
        from ..push import is_s3

        if not is_s3(archive):
            _refuse_reports_inside(targets, Path(archive), "archive")
        options = settle(config, reviewer=True, selection=_selection(config, select, ignore, strict),
                         reload=do_reload, endpoint_url=endpoint_url, max_size=max_size, device=device,
                         hf_cache=hf_cache, timeout=timeout, jobs=jobs, isolation=isolation, confine=confine,
                         allowed_signers=allowed_signers, signer=signer, oms_public_key=oms_public_key)
        with _make_progress(quiet, verbose) as progress:
            source = archive if is_s3(archive) else Path(archive)
            report = audit(source, options, progress=progress)
        _emit(report, fmt_chosen, targets, quiet, verbose, environment)
        return _exit_code(report)

    _run(action)


@main.command("push")
@click.argument("archive", type=click.Path(path_type=Path))
@click.argument("dest")
@_with_push_options
@click.option("--jobs", type=click.IntRange(min=1, max=64), default=4, help="Parts sent at once (default 4).")
@click.option("--deadline", metavar="TIME", default=None, callback=_rfc3339,
              help="When the rental ends (RFC 3339): the first parts' throughput predicts the end of the upload, "
                   "and a push that will not finish in time says so at once.")
@click.option("--overwrite", is_flag=True, help="Replace another archive already stored under the same name "
                                                "(refused otherwise, exit 1).")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text")
@_quiet
@_verbose
def push_command(archive, dest, endpoint_url, read_back, part_size, jobs, deadline, overwrite, fmt, quiet, verbose):
    """Send a sealed ARCHIVE to DEST (s3://bucket/prefix/ or a folder), resumable and verified, with a receipt
    (exit 0 verified, 1 differs or unverified, 2 could not run)."""
    import json

    def action() -> int:
        from datetime import datetime

        result, failure = _push_archive(archive, dest, endpoint_url=endpoint_url, read_back=read_back, jobs=jobs,
                                        part_size=part_size, quiet=quiet or fmt == "json", verbose=verbose,
                                        deadline=datetime.fromisoformat(deadline).timestamp() if deadline else None,
                                        overwrite=overwrite)
        if fmt == "json":
            click.echo(json.dumps({"tool": "itera-verify", "version": __version__, "mode": "push",
                                   "archive": str(archive), "verdict": "pass" if failure is None else "fail",
                                   "push": result.to_json() if result else None,
                                   "error": failure[1] if failure else None}, indent=2))
        if failure is not None:
            click.echo(plain_lines(clean(failure[1])), err=True)
            return failure[0]
        if fmt == "text":
            click.echo(plain_lines(clean(f"PUSHED: {archive.name} {push_line(result)}")))
        return 0

    _run(action)


@main.command("init")
@click.argument("outdir", type=click.Path(path_type=Path))
@click.option("--campaign-id", default=None, help="Campaign id (default: the folder name).")
def init_command(outdir, campaign_id):
    """Write a filled-in template package to start a campaign from (never overwrites)."""
    from ..package.template import write_template

    def action() -> int:
        written = write_template(outdir, campaign_id=campaign_id)
        click.echo(f"wrote a template package in {outdir} ({len(written)} files)")
        click.echo(f"next: fill in what `itera-verify {outdir} --no-reload --no-seal` reports, "
                   "and declare the stop rules before the first run starts")
        return 0

    _run(action)


@main.command("rules")
@click.argument("code", required=False)
def rules_command(code):
    """List every rule, or explain one (e.g. `itera-verify rules IV303`)."""
    from ..report.rules_format import explain_rule, list_rules

    def action() -> int:
        rules = all_rules()
        if code is None:
            click.echo(list_rules(rules), nl=False)
            if Path("rules").is_dir():
                click.echo("note: this lists the rules; to check the folder rules/, run "
                           "`itera-verify verify rules`", err=True)
            return 0
        rule = rules.get(code.upper())
        if rule is None:
            raise UsageError(f"unknown rule code {code!r} (see `itera-verify rules`)")
        click.echo(explain_rule(rule), nl=False)
        return 0

    _run(action)


from . import assemble as _assemble  # noqa: E402,F401  (registers `assemble` on the group)

if __name__ == "__main__":
    run()
