"""`--engine ray` (extra `itera-verify[ray]`): the same audits as Ray tasks.

`RAY_ADDRESS` (read once, runtime/environment.py) names an existing cluster; without it a local Ray starts with
the command and stops with it: node address 127.0.0.1, no dashboard, no usage statistics, its folder private and
removed afterwards, and a token of its own (Ray's GCS listens on every interface, with no option to bind one).
Each archive is one task in a worker process of its own (`max_calls=1`: a worker never audits a second
archive), `num_gpus=1` under --reload (unless --device cpu, or --device auto on a cluster without GPUs), retried
when its worker is lost (`max_retries`). At most `batch_jobs` tasks are in flight; each is cancelled (its worker
killed) past the same time limit as a local audit (batch_local.audit_seconds). Rows come back in the order the
tasks end.

The archives must be readable where the tasks run: s3:// keys are, a local folder only on a shared filesystem.
"""
from __future__ import annotations

import contextlib
import importlib.util
import os
import secrets
import shutil
import socket
import sys
import time
from dataclasses import replace
from types import MappingProxyType

from ..model import UsageError
from ..runtime.environment import Environment
from ..options import RunOptions
from ..package.jsonread import read_json
from ..report.batch import AuditRow
from ..runtime.progress import Progress
from ..runtime.sockets import socket_folder
from .batch_entry import PROGRESS_KEY, audit_entry, failed_row
from .batch_local import ROW_MAX, audit_seconds
from .batch_results import ResultStore
from .batch_sources import Entry

MAX_RETRIES = 3  # a task whose worker died (a lost node, the memory monitor) runs again, this many times
POLL_SECONDS = 0.5
MISSING = "--engine ray needs Ray: pip install 'itera-verify[ray]'"
REACH_SECONDS = 20.0  # Ray's driver retries a cluster it cannot reach forever; the command waits this long, once


def require_ray() -> None:
    """UsageError (exit 2) in one line naming the extra when Ray is not installed. Ray is not imported here: it
    reads its settings as it is imported, and run_ray sets them first."""
    if importlib.util.find_spec("ray") is None:
        raise UsageError(MISSING)


def _reach(address: str) -> None:
    """UsageError (exit 2) in one line when RAY_ADDRESS's GCS does not accept a connection within REACH_SECONDS:
    Ray's own driver would retry it forever (and in C++, where no signal interrupts it). The address is probed as
    Ray will dial it: Ray turns a loopback host into this node's address first. A `ray://` client address,
    `auto` and `local` are left to Ray."""
    if "://" in address or address in ("auto", "local"):
        return
    dialled = address
    with contextlib.suppress(Exception):  # Ray's own reading where it has one (a private helper of Ray's)
        from ray._private.services import canonicalize_bootstrap_address

        dialled = canonicalize_bootstrap_address(address) or address
    host, colon, port = dialled.rpartition(":")
    if not colon or not port.isdigit():
        return
    deadline = time.monotonic() + REACH_SECONDS
    while True:
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=5):
                return
        except OSError as exc:
            if time.monotonic() >= deadline:
                raise UsageError(f"--engine ray: no Ray cluster answers at RAY_ADDRESS={address} "
                                 f"(dialled {dialled}: {exc.strerror or exc}; waited {REACH_SECONDS:.0f} s)") from None
            time.sleep(0.5)


def _import_ray():
    try:
        import ray
    except ImportError:
        raise UsageError(MISSING) from None
    return ray


@contextlib.contextmanager
def ray_cluster(options: RunOptions):
    """Ray, joined to RAY_ADDRESS's cluster or to a local one started here, for the block; then left (a local one
    stopped, its folder removed) and the environment as it was. UsageError (exit 2) in one line when Ray cannot
    be imported or does not start."""
    address = options.environment.ray_address
    local = address is None
    saved = {name: os.environ.get(name) for name in LOCAL_SETTINGS}
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # the tool never reports to anyone
    if local and "RAY_AUTH_MODE" not in os.environ and "ray" not in sys.modules:
        # Ray's GCS listens on every interface: a token of this run alone, held in the environment its processes
        # inherit (never written to ~/.ray), is what another process needs to reach it. Set before Ray's import.
        os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32))
    scratch = _scratch(options) if local else None
    # Ray's driver prints what its workers and raylets say ("a worker died...") to standard output, which holds
    # the report (`--format json`): everything Ray prints goes to standard error.
    with contextlib.redirect_stdout(sys.stderr):
        try:
            ray = _import_ray()
            if not local:
                _reach(address)
            try:
                if local:
                    ray.init(address="local", num_cpus=max(options.batch_jobs, 1), include_dashboard=False,
                             _node_ip_address="127.0.0.1", _temp_dir=scratch, log_to_driver=False,
                             configure_logging=False)
                else:
                    ray.init(address=address, log_to_driver=False, configure_logging=False)
            except Exception as exc:  # noqa: BLE001 - one line: an unreachable cluster, a local start that failed
                where = "" if local else f" at RAY_ADDRESS={address}"
                why = str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
                raise UsageError(f"--engine ray: Ray did not start{where} ({why})") from None
            try:
                yield ray
            finally:
                ray.shutdown()  # a local Ray stops; from an existing cluster this driver only leaves
        finally:
            if scratch is not None:
                shutil.rmtree(scratch, ignore_errors=True)
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


def run_ray(ray, entries: list[Entry], options: RunOptions, store: ResultStore | None, ended,
            progress: Progress) -> None:
    """Audit `entries` as tasks of the cluster `ray_cluster` joined; `ended(row, slowest)` as each ends."""
    _run(ray, entries, options, store, ended, progress)


LOCAL_SETTINGS = ("RAY_USAGE_STATS_ENABLED", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN")


# How long Ray's socket paths are inside this folder (its session folder, its socket names), measured: with this
# folder's own name, a temporary folder of at most 40 bytes leaves them room in a socket address.
RAY_SOCKET_NAMES = 39


def _scratch(options: RunOptions) -> str:
    """A private folder for the local Ray's sessions, sockets and logs, removed when it stops: under the temporary
    folder when its path leaves room for Ray's socket names, else under /tmp."""
    return socket_folder("itera-ray-", RAY_SOCKET_NAMES, options.environment.tmpdir)


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
                      retry_exceptions=False)(audit_entry_on_worker)
    # The driver's environment stays here (its credentials, its paths): a task gets the settings the tool reads.
    environment = options.environment
    options = replace(options, environment=Environment(MappingProxyType(environment.applied()),
                                                       environment.torch_version))
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


def audit_entry_on_worker(entry: Entry, options: RunOptions, store: ResultStore | None) -> bytes:
    """A Ray task: the audit reads the worker's own environment (its temporary folder, what its reload children
    start with), as a local audit reads this machine's."""
    return audit_entry(entry, replace(options, environment=Environment.read()), store)


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


__all__ = ["ray_cluster", "require_ray", "run_ray"]
