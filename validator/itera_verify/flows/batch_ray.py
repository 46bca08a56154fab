"""`--engine ray` (extra `itera-verify[ray]`): the same audits as Ray tasks.

`RAY_ADDRESS` (read once, runtime/environment.py) names an existing cluster; without it a local Ray starts with
the command, bound to 127.0.0.1, with no dashboard and no usage statistics, and stops with it. Each archive is one
task in a worker process of its own (`max_calls=1`: a worker never audits a second archive), `num_gpus=1` under
--reload (unless --device cpu, or --device auto on a cluster without GPUs), retried when its worker is lost
(`max_retries`). At most `batch_jobs` tasks are in flight; each is cancelled (its worker killed) past the same
time limit as a local audit (batch_local.audit_seconds). Rows come back in the order the tasks end.

The archives must be readable where the tasks run: s3:// keys are, a local folder only on a shared filesystem.
"""
from __future__ import annotations

import os
import time

from ..model import UsageError
from ..options import RunOptions
from ..package.jsonread import read_json
from ..report.batch import AuditRow
from ..runtime.progress import Progress
from .batch import PROGRESS_KEY, audit_entry, failed_row
from .batch_local import ROW_MAX, audit_seconds
from .batch_results import ResultStore
from .batch_sources import Entry

MAX_RETRIES = 3  # a task whose worker died (a lost node, the memory monitor) runs again, this many times
POLL_SECONDS = 0.5
MISSING = "--engine ray needs Ray: pip install 'itera-verify[ray]'"


def require_ray():
    """The ray module, or UsageError (exit 2) in one line naming the extra."""
    try:
        import ray
    except ImportError:
        raise UsageError(MISSING) from None
    return ray


def run_ray(entries: list[Entry], options: RunOptions, store: ResultStore | None, ended, progress: Progress) -> None:
    ray = require_ray()
    address = options.environment.ray_address
    local = address is None
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # the tool never reports to anyone
    try:
        if local:
            ray.init(address="local", num_cpus=max(options.batch_jobs, 1), include_dashboard=False,
                     _node_ip_address="127.0.0.1", log_to_driver=False, configure_logging=False)
        else:
            ray.init(address=address, log_to_driver=False, configure_logging=False)
    except Exception as exc:  # noqa: BLE001 - one line: an unreachable cluster, a local start that failed
        raise UsageError(f"--engine ray: Ray did not start{'' if local else f' at RAY_ADDRESS={address}'} "
                         f"({str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__})") from None
    try:
        _run(ray, entries, options, store, ended, progress)
    finally:
        ray.shutdown()  # a local Ray stops; from an existing cluster this driver only leaves


def _gpus(ray, options: RunOptions) -> int:
    if not options.reload or options.device == "cpu":
        return 0
    have = ray.cluster_resources().get("GPU", 0)
    if have < 1:
        if options.device == "cuda":
            raise UsageError("--engine ray --reload --device cuda: the Ray cluster has no GPU")
        return 0  # --device auto reloads on the CPU, as it would here
    return 1


def _run(ray, entries, options, store, ended, progress) -> None:
    task = ray.remote(num_cpus=1, num_gpus=_gpus(ray, options), max_calls=1, max_retries=MAX_RETRIES,
                      retry_exceptions=False)(audit_entry)
    pending = list(reversed(entries))
    in_flight: dict = {}  # ref -> (entry, started, deadline)
    try:
        while pending or in_flight:
            while pending and len(in_flight) < options.batch_jobs:
                entry = pending.pop()
                now = time.monotonic()
                in_flight[task.remote(entry, options, store)] = (entry, now, now + audit_seconds(entry, options))
                progress.began(PROGRESS_KEY, entry.key)
            done, _ = ray.wait(list(in_flight), num_returns=1, timeout=POLL_SECONDS)
            for ref in done:
                entry, started, _ = in_flight.pop(ref)
                ended(_row(ray, ref, entry, started), _slowest(in_flight))
            now = time.monotonic()
            for ref, (entry, started, deadline) in list(in_flight.items()):
                if now > deadline:
                    ray.cancel(ref, force=True)
                    del in_flight[ref]
                    ended(failed_row(entry, f"the audit was stopped after {now - started:.0f} s, its limit for an "
                                     "archive of this size", now - started), _slowest(in_flight))
    finally:
        for ref in in_flight:
            ray.cancel(ref, force=True)


def _row(ray, ref, entry: Entry, started: float) -> AuditRow:
    seconds = time.monotonic() - started
    try:
        data = ray.get(ref)
        row = AuditRow.from_json(read_json(data, max_bytes=ROW_MAX))
    except ray.exceptions.RayError as exc:  # its worker lost more than MAX_RETRIES times, or the task raised
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return failed_row(entry, f"the audit task failed ({type(exc).__name__}: {first[:300]})", seconds)
    except (ValueError, TypeError) as exc:
        return failed_row(entry, f"the audit task returned no valid row ({str(exc)[:200]})", seconds)
    if (row.archive, row.key) != (entry.source, entry.key):
        return failed_row(entry, "the audit task returned the row of another archive", seconds)
    return row


def _slowest(in_flight: dict) -> tuple[str, float] | None:
    if not in_flight:
        return None
    entry, started, _ = min(in_flight.values(), key=lambda item: item[1])
    return entry.key, time.monotonic() - started


__all__ = ["require_ray", "run_ray"]
