"""`itera-verify audit DIR/ | s3://BUCKET/PREFIX/ | @list.txt`: a batch of audits (flows/batch.py).

The audit command routes here when its argument is a folder, an s3:// prefix (ending in `/`) or `@list.txt`.
`--jobs` is then the number of archives audited at once (each audit's reloads run one at a time). `--format
jsonl` writes each archive's line as its audit ends; the other formats write the batch at the end. Exit codes:
0 every archive passed, 1 any failed (a damaged or unreadable archive is a failed row), 2 the batch could not run.
"""
from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import click

BATCH_OPTIONS = [
    click.option("--shard", default=None, metavar="I/N",
                 help="For a batch: audit only the I-th of N slices of the sorted keys (0 <= I < N), e.g. "
                      "$SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT."),
    click.option("--engine", type=click.Choice(["local", "ray"]), default="local",
                 help="For a batch: forked processes here (local), or Ray tasks (ray; RAY_ADDRESS names a "
                      "cluster, else a local Ray runs with the command)."),
    click.option("--results", default=None, metavar="DIR/|s3://BUCKET/PREFIX/",
                 help="For a batch: keep each archive's report there; a rerun reuses it and audits the rest."),
    click.option("--results-key", type=click.Path(path_type=Path, dir_okay=False), default=None, metavar="FILE",
                 help="The key that authenticates --results (default: $ITERA_RESULTS_KEY, else "
                      "~/.config/itera-verify/results.key, made on first use); shards on several machines share "
                      "one."),
]


def batch_options(function):
    for option in reversed(BATCH_OPTIONS):
        function = option(function)
    return function


def is_batch_target(archive: str, *, shard, results, engine, results_key=None) -> bool:
    """Whether `audit ARCHIVE` is a batch; the batch's options given for one archive are a usage error."""
    from ..flows.batch_sources import is_batch_target as batch_target

    if batch_target(archive):
        return True
    if shard or results or results_key or engine != "local":
        raise click.UsageError("--shard, --results, --results-key and --engine ray audit a folder, an s3:// prefix "
                               "ending in / or @list.txt, not one archive")
    return False


def run_batch(target: str, given: dict) -> None:
    """The audit command's options (`given`: its arguments by name) applied to every archive of `target`."""
    from ..flows.batch import audit_batch
    from ..flows.config import load_config, settle
    from ..model import UsageError
    from ..report import BATCH_FORMATS, batch_renderer
    from ..runtime.environment import Environment
    from . import _make_progress, _report_targets, _run, _selection, _write_report
    from ..package import shortened

    def action() -> int:
        environment = Environment.read()
        config = replace(load_config(explicit=given["config_path"], reviewer=True), environment=environment)
        fmt = given["fmt"] or "text"  # a batch has no GitHub annotations: text under Actions too
        targets = _report_targets(given["reports"], fmt)
        for name in [fmt, *(t[0] for t in targets)]:
            if name not in BATCH_FORMATS:
                raise UsageError(f"--format {name}: a batch is written as {', '.join(BATCH_FORMATS)}")
        options = settle(config, reviewer=True,
                         selection=_selection(config, given["select"], given["ignore"], given["strict"]),
                         reload=given["do_reload"], endpoint_url=given["endpoint_url"], max_size=given["max_size"],
                         device=given["device"], hf_cache=given["hf_cache"], timeout=given["timeout"], jobs=1,
                         isolation=given["isolation"], confine=given["confine"],
                         allowed_signers=given["allowed_signers"],
                         signer=given["signer"], oms_public_key=given["oms_public_key"], batch_jobs=given["jobs"],
                         shard=given["shard"], engine=given["engine"], results=given["results"],
                         results_key=given["results_key"])
        streaming = fmt == "jsonl" and not any(t[0] == "jsonl" for t in targets)
        stdout = sys.stdout  # the report's stream, whatever a library redirects meanwhile

        def on_row(row, batch) -> None:
            if streaming:  # one line per archive as it ends, flushed: a pipe reads it at once
                stdout.write(batch_renderer("jsonl")(_One(row), {}))
                stdout.flush()

        with _make_progress(given["quiet"], given["verbose"]) as progress:
            batch = audit_batch(target, options, progress=progress, on_row=on_row)
        for name, path in targets:
            try:
                _write_report(path, batch_renderer(name)(batch, {}))
            except OSError as exc:
                raise UsageError(f"--report {shortened(path)}: cannot write ({exc.strerror or exc})") from exc
        if not streaming and not any(t[0] == fmt for t in targets) or fmt == "text":
            click.echo(batch_renderer(fmt)(batch, {}), nl=False)
        elif streaming and fmt == "jsonl":
            click.echo(f"itera-verify: {_verdict(batch)}", err=True)
        return 1 if batch.verdict == "fail" else 0

    _run(action)


class _One:
    """A batch of one row, for the line written as that row's archive ends."""

    def __init__(self, row):
        self.rows = [row]


def _verdict(batch) -> str:
    from ..report.batch_format import verdict_line

    return verdict_line(batch)


__all__ = ["BATCH_OPTIONS", "batch_options", "is_batch_target", "run_batch"]
