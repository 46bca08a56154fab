"""Run each artifact's reload in a fresh child process, with a timeout, and collect what it proved.

The child runs itera_verify.reload.child in its own session (process group, see runtime/launcher.py), offline, with the
job as JSON in and the facts as JSON out. It is forked by the zygote (zygote.py: one interpreter that imported
the libraries once) or, with --isolation spawn or where fork is missing or unsafe, a new interpreter
(`python -m itera_verify.reload.child`). A timeout kills the whole group; a signal or an exit without a result
is a crash, named; Ctrl-C or SIGTERM ends every child at once. Each child has a host memory limit (limits.py):
the child sets it on itself, the parent kills a child past it, and the report records it. Before any child
starts, an artifact holding a pickle the static scan refused is refused whole. CPU reloads may run side by side
(--jobs); GPU reloads run one per visible GPU.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

from ..package.jsonread import read_json_file
from ..runtime.environment import Environment, tool_first
from ..runtime.launcher import Exit, Launcher, termination_unwinds, wait_until
from ..format import loaders as loader_table
from ..model import ReloadResult
from ..package import RunContext
from . import preloads
from .confine import check_mode, recorded, scratch_variables
from .gpus import GpuPool, free_memory, needs_every_gpu, visible_gpus
from .jobs import plan, reload_entry
from .limits import base_folder, configured_limit, over_limit, pinned_base_folder, starved
from .placement import cap_from_environment
from .warm import obtain, release, start_zygote
from .zygote_client import ForkedChild, Zygote, can_fork

LOG_TAIL_LINES = 3
IMPORTS, IMPORTS_LIGHT = "torch, transformers, peft…", "torch…"  # what the zygote preloads (zygote.py)
ISOLATIONS = ("auto", "fork", "spawn")  # auto: fork through the zygote where that is possible and safe


def child_env(job: dict, work: str, environment: Environment) -> dict:
    """A reload child's variables: the run's environment (read once, runtime/environment.py), made offline."""
    env = environment.for_child()
    # Third-party scratch files and caches (torch inductor's, CUDA's, the hub's token and modules) land in the
    # reload's own folder, removed after it: the only folder the confined child may write (confine.py).
    env.update(scratch_variables(work, job.get("hf_cache")) if work else {}, TMPDIR=work)
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1",
               HF_HUB_DISABLE_PROGRESS_BARS="1", TRANSFORMERS_VERBOSITY="error", TOKENIZERS_PARALLELISM="false",
               PYTHONUNBUFFERED="1", PYTHONDONTWRITEBYTECODE="1")
    if job.get("hf_cache"):
        env["HF_HUB_CACHE"] = job["hf_cache"]
    else:
        env.pop("HF_HUB_CACHE", None)  # none given: the child reads no other (its own empty one)
    if job.get("threads"):
        env["OMP_NUM_THREADS"] = str(job["threads"])
    env["PYTHONPATH"] = tool_first(env.get("PYTHONPATH"))
    return env


def _log_tail(log: Path) -> str:
    try:
        lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    return " | ".join(lines[-LOG_TAIL_LINES:])


def _died(code: int | None, log: Path, job: dict) -> str:
    if code is None:  # forked: the zygote ended before it could report, and took the child with it
        return "the reload process ended with the zygote that forked it, without a result"
    if code < 0:
        name = signal.Signals(-code).name if -code in signal.valid_signals() else f"signal {-code}"
        why = " (the system may have run out of memory)" if -code == signal.SIGKILL else ""
        return f"the reload process was killed by {name}{why}"
    tail = _log_tail(log)
    # A C runtime aborts when a limit refuses a thread stack or a map: on the CPU, the child's own (limits.py).
    if starved(tail) and job.get("memory_limit") and job.get("device") == "cpu":
        return over_limit(job["memory_limit"], job.get("memory_limit_source") or "") + f": {tail}"
    hint = " (the process could not get memory: out of memory, or over a memory limit)" if starved(tail) else ""
    return f"the reload process exited with code {code} without a result{hint}" + (f": {tail}" if tail else "")


def model_folders(jobs, hf_cache: str | None) -> list[str]:
    """The folders whose model configurations the jobs load: each artifact's folder, its `config` folder, and
    the hub-cache snapshot of its base (an adapter's, the manifest's pinned one). Read here (the zygote opens no
    artifact) so that the zygote imports what they need (their modelling modules) and nothing they do not."""
    found: list[str] = []
    for job in jobs:
        path = job.get("path") or ""
        folder = path if os.path.isdir(path) else None
        bases = [base_folder(Path(folder), hf_cache) if folder else None, pinned_base_folder(job.get("base"), hf_cache)]
        for each in (folder, job.get("config"), *bases):
            if each is not None and str(each) not in found:
                found.append(str(each))
    return found


def model_types(jobs) -> list[str]:
    """The `model_type` of each model folder the jobs load (their configurations), so that the zygote imports
    those modelling modules once instead of every child importing them."""
    return list(preloads.plan([], model_folders(jobs, None)).model_types)


def zygote_preloads(jobs, hf_cache: str | None) -> preloads.Preloads:
    """What the zygote of these jobs imports and keeps out (preloads.py)."""
    return preloads.plan([job.get("loader") for job in jobs], model_folders(jobs, hf_cache))


def light(loaders) -> bool:
    """No loader of the run needs transformers or peft (format/loaders.py's `light` column; an empty run too:
    nothing to import them for). Such a run gets a light zygote."""
    return loader_table.light(loaders)


def zygote_env(environment: Environment) -> dict:
    """The zygote's environment: what every child shares (the libraries read it at import), plus fork safety.
    numpy's BLAS starts a worker thread at import, and a process with threads must not fork; numpy only reads
    RNG states here. The NVML check keeps torch.cuda.is_available() from initialising CUDA before a fork. No
    hub cache: its imports read none, and each forked child follows its own job's (zygote.py), so one zygote
    serves runs over different hub caches (warm.py). No thread count of the run's either: a forked child sets
    its job's own (child.py), so runs with different --jobs share one zygote (reload/shared.py); the user's
    OMP_NUM_THREADS, read at import, stays in."""
    env = child_env({}, "", environment)  # TMPDIR: the zygote's own
    env.update(OPENBLAS_NUM_THREADS="1", PYTORCH_NVML_BASED_CUDA_CHECK="1")
    return env


class _Child:
    """One reload child and its private folder. Gated: it imports its libraries, then waits for let_through()
    before it touches the device (see child.py); the timeout runs from there. With a zygote it is forked
    (already imported: never gated)."""

    def __init__(self, job: dict, children: Launcher, *, gated: bool = False, zygote: Zygote | None = None):
        self.job, self.children, self.gated = dict(job, gated=gated), children, gated
        self.work = Path(tempfile.mkdtemp(prefix="itera-reload-"))
        self.job_file, self.result_file, self.log = (self.work / "job.json", self.work / "result.json",
                                                     self.work / "child.log")
        self.started, self.launched_at = time.monotonic(), time.time()  # the parent's clock, before the child's
        self.proc, self.isolation = None, "spawn"
        if zygote is not None and zygote.client is not None:
            self.job["gated"] = self.gated = False
            self.job_file.write_text(json.dumps(self.job), encoding="utf-8")
            argv = [str(self.job_file), str(self.result_file)]
            forked = zygote.client.fork({"entry": "itera_verify.reload.child:forked", "argv": ["child", *argv],
                                         "work": str(self.work), "log": str(self.log),
                                         "env": {**scratch_variables(self.work, self.job.get("hf_cache")),
                                                 "TMPDIR": str(self.work)},
                                         "title": ["-m", "itera_verify.reload.child", *argv]})
            if isinstance(forked, ForkedChild):
                self.proc, self.isolation, self.zygote_seconds = forked, "fork", zygote.seconds
                return
            if children.stop.is_set():
                return
        self.job_file.write_text(json.dumps(self.job), encoding="utf-8")
        with open(self.log, "wb") as log_handle:  # the child keeps its own descriptor
            self.proc = children.spawn([sys.executable, "-m", "itera_verify.reload.child", str(self.job_file),
                                        str(self.result_file)],
                                       stdin=subprocess.PIPE if gated else subprocess.DEVNULL, stdout=log_handle,
                                       stderr=subprocess.STDOUT, cwd=self.work,
                                       env=child_env(self.job, str(self.work), children.environment))

    def let_through(self) -> None:
        if self.gated and self.proc is not None:
            try:
                self.proc.stdin.write(b"g")
                self.proc.stdin.close()
            except OSError:  # it died while importing: finish() reports how
                pass

    def finish(self, timeout: float) -> ReloadResult:
        """Wait (timeout from now), then what the child proved or how it failed; the folder is removed."""
        job = self.job
        result = ReloadResult(job["artifact"], job["loader"], kind=job["kind"], path=job["rel"], device=job["device"])
        try:
            limit = job.get("memory_limit")
            end = self.children.wait(self.proc, timeout, limit) if self.proc is not None else Exit(interrupted=True)
            result.seconds = time.monotonic() - self.started
            if end.usage is not None:  # the kernel's word, for a child that ends without a report
                result.host_peak_memory_bytes = end.usage.ru_maxrss * (1 if sys.platform == "darwin" else 1024)
                if job["device"] == "cpu":
                    result.peak_memory_bytes = result.host_peak_memory_bytes
            if end.interrupted:
                result.failure, result.error = "crash", "interrupted"
            elif end.over_limit:
                result.failure, result.error = "load", over_limit(limit, job.get("memory_limit_source") or "")
            elif end.timed_out:
                result.failure = "timeout"
                result.error = f"no result after {timeout:g} s; the reload process was stopped"
            elif end.code != 0 or not self.result_file.is_file():
                result.failure, result.error = "crash", _died(end.code, self.log, job)
            else:
                _merge(result, read_json_file(self.result_file))
                result.facts["isolation"], result.facts["launched_at"] = self.isolation, self.launched_at
                if self.isolation == "spawn" and self.children.fork_refused:
                    result.facts["fork_refused"] = self.children.fork_refused
                if self.isolation == "fork":
                    result.facts["zygote_import_seconds"] = self.zygote_seconds  # paid once per run, not per child
                result.facts["wall_seconds"] = round(result.seconds, 3)  # from its start to its end, waiting included
                result.seconds -= result.facts.get("gate_wait_seconds") or 0  # waiting for its turn is not its time
            result.confinement = recorded(self.work)  # said by the child as soon as it held, crash or not
            if limit:
                result.facts["memory_limit_bytes"] = limit
                result.facts["memory_limit"] = job.get("memory_limit_source")
        finally:
            self.discard()
        return result

    def discard(self) -> None:
        """End the child if it still runs (its group swept) and remove its folder; safe to repeat."""
        if self.proc is not None and self.proc.returncode is None:
            if self.gated and self.proc.stdin and not self.proc.stdin.closed:
                self.proc.stdin.close()
            self.children.wait(self.proc, 0)
        shutil.rmtree(self.work, ignore_errors=True)


def run_child(job: dict, timeout: float, children: Launcher, zygote: Zygote | None = None,
              pool: GpuPool | None = None) -> ReloadResult:
    """One reload; on the GPU, once the pool hands it its GPU (or every GPU, for a model too large for one)."""
    if pool is None:
        return _Child(job, children, zygote=zygote).finish(timeout)
    gpus = pool.take(bool(job.get("every_gpu")))
    try:
        if gpus:
            job = dict(job, device=f"cuda:{gpus[0]}", gpus=gpus)
        return _Child(job, children, zygote=zygote).finish(timeout)
    finally:
        pool.give(gpus)


def _one_at_a_time(jobs: list[dict], timeout: float, children: Launcher, began=None):
    """(index, result) in order, one reload at a time, the next child importing while the current one runs;
    began(job) when a job's reload begins."""
    waiting: _Child | None = None
    try:
        for position, job in enumerate(jobs):
            current = waiting or _Child(job, children, gated=True)
            waiting = None
            current.let_through()
            if began is not None:
                began(job)
            if position + 1 < len(jobs):
                waiting = _Child(jobs[position + 1], children, gated=True)
            yield position, current.finish(timeout)
    finally:
        if waiting is not None:
            waiting.discard()


def _merge(result: ReloadResult, reported: dict) -> None:
    result.ok = bool(reported.get("ok"))
    result.failure, result.error = reported.get("failure"), reported.get("error")
    result.forward, result.device = reported.get("forward"), reported.get("device") or result.device
    if result.peak_memory_bytes is None or result.device != "cpu":
        result.peak_memory_bytes = reported.get("peak_memory_bytes")
    result.devices = [str(d) for d in reported.get("devices") or [result.device]]
    if reported.get("host_peak_memory_bytes") is not None:
        # The child's VmHWM (child.rss_peak_bytes): ru_maxrss of a spawned child also counts the process it was
        # forked from before its exec, and its limit (limits.py) is judged on the child's own memory.
        result.host_peak_memory_bytes = reported["host_peak_memory_bytes"]
        if result.device == "cpu":
            result.peak_memory_bytes = result.host_peak_memory_bytes
    result.device_peak_memory_bytes = reported.get("device_peak_memory_bytes")
    facts = dict(reported.get("facts") or {})
    for key in ("startup_seconds", "gate_wait_seconds", "load_seconds", "peak_rss_bytes", "device_name", "started_at",
                "ended_at", "host_rss_before_load_bytes"):
        if reported.get(key) is not None:
            facts[key] = reported[key]
    if reported.get("problems"):
        facts["problems"] = reported["problems"]
    result.facts = facts


@dataclass
class Prestarted:
    """A zygote started before the static checks, so that its imports overlap them (flows/verify.py); or a warm
    one (warm.py). close() ends it, or gives it back to warm_zygotes; once."""

    children: Launcher
    zygote: Zygote
    isolation: str
    done: bool = False

    def close(self, failed: bool = False) -> None:
        if not self.done:
            self.done = True
            release(self.zygote, failed=failed)


def _parallel(device: str, jobs: int, gpus: list[int]) -> tuple[int, int]:
    """(children side by side, threads each): --jobs on the CPU, one per GPU."""
    parallel = max(1, jobs) if device == "cpu" else max(1, len(gpus))
    return parallel, max(1, (os.cpu_count() or 1) // parallel) if parallel > 1 else 0


def prestart(ctx: RunContext, *, isolation: str = "auto") -> Prestarted | None:
    """Start the run's zygote now; run_reloads(prestarted=...) uses it, close() ends it if it never is. The device
    and --jobs do not change it: each child sets its own threads."""
    if not can_fork(isolation) or not ctx.documents.artifacts():
        return None
    children = Launcher(ctx.environment)
    zygote = obtain(zygote_env(children.environment), package_preloads(ctx), children)
    return Prestarted(children, zygote, isolation)


def package_preloads(ctx: RunContext) -> preloads.Preloads:
    """What the zygote of this package's reloads imports and keeps out, read before any job is planned."""
    root = os.path.realpath(ctx.inventory.root)
    folders = []
    for artifact in ctx.documents.artifacts():
        rel = ctx.inventory.normalise_ref(artifact["path"]) if isinstance(artifact.get("path"), str) else None
        real = os.path.realpath(ctx.inventory.abspath(rel)) if rel is not None else ""
        if real.startswith(root + os.sep):
            base = artifact.get("base") if isinstance(artifact.get("base"), dict) else None
            folders.append({"path": real, "base": base, "loader": reload_entry(ctx, artifact)[1]})
    return zygote_preloads(folders, os.path.abspath(ctx.options.hf_cache) if ctx.options.hf_cache else None)


def run_reloads(ctx: RunContext, *, device: str, timeout: float, jobs: int, progress,
                only: set[str] | None = None, prefetch: bool | None = None,
                isolation: str = "auto", prestarted: Prestarted | None = None,
                memory_limit: int | None = None, confine: str = "auto") -> list[ReloadResult]:
    """Every manifest artifact (or those named in `only`), each in its own child; results in manifest order.
    isolation: "auto" forks the children from one zygote where fork is safe, "fork" insists on it (a usage
    error otherwise), "spawn" starts a new interpreter per child. prefetch (spawned children, default: on a
    GPU): one at a time, the next child importing its libraries while the current one runs; on a machine where
    importing torch and transformers takes 10-20 s, that is most of a small reload. prefetch=True alone asks
    for spawned children. memory_limit: the host memory limit of every child in bytes (default:
    ITERA_RELOAD_HOST_MEMORY, else each child's own, from its artifact's size: limits.py). The children start
    with the run's environment (ctx.environment: runtime/environment.py). confine: "auto" or "required"
    (confine.py: each child confines itself with Landlock; "required" on a machine without it is a usage error,
    before any child starts)."""
    check_mode(confine)
    gpus = visible_gpus() if device == "cuda" else []
    parallel, threads = _parallel(device, jobs, gpus)  # one reload per GPU at a time
    chosen = [a for a in ctx.documents.artifacts() if only is None or a.get("id") in only]
    children = prestarted.children if prestarted is not None else Launcher(ctx.environment)
    # One host memory limit for every child, else each its own.
    limit = memory_limit or configured_limit(children.environment)
    plans = [plan(ctx, artifact, device, threads, limit) for artifact in chosen]
    for job in plans:
        if isinstance(job, dict):
            job["confine"] = confine
    results: list[ReloadResult | None] = [p if isinstance(p, ReloadResult) else None for p in plans]
    progress.start("reload", "reloading artifacts", total=len(plans), unit="artifacts")
    for _ in (r for r in results if r is not None):
        progress.advance("reload")
    pending = {i: p for i, p in enumerate(plans) if isinstance(p, dict)}
    if gpus:  # largest first: the long reloads start at once, the small ones fill the gaps (results: manifest order)
        pending = dict(sorted(pending.items(), key=lambda item: -int(item[1].get("weight_bytes") or 0)))
    pool = GpuPool(gpus, children.stop) if gpus else None
    if gpus:
        free, cap = free_memory(len(gpus), children.environment), cap_from_environment(children.environment)
        for job in pending.values():
            job["every_gpu"], job["gpu_memory_cap"] = needs_every_gpu(job, free, cap), cap
    if prefetch is True and isolation == "auto":
        isolation = "spawn"  # asked for by name: prefetching overlaps spawned children's start-up (forked: none)
    if prefetch is None:
        prefetch = device != "cpu"
    zygote: Zygote | None = None
    failed = False
    with termination_unwinds(), ThreadPoolExecutor(max_workers=parallel) as workers:
        try:
            first = next(iter(pending.values()), {})
            wanted = zygote_preloads(pending.values(), first.get("hf_cache"))
            for job in pending.values():
                job["without"] = list(wanted.without)  # a spawned child keeps them out of its imports too
            started = None
            if prestarted is not None:
                started, prestarted.done = prestarted.zygote, True  # this run ends it, or gives it back
            if pending and can_fork(isolation) and (started is None or started.client is None):
                # the zygote's imports: 8-12 s where nothing else is said (none for a warm one, ready already)
                progress.waiting("reload", f"importing {IMPORTS_LIGHT if wanted.light else IMPORTS} once, for the "
                                           "reload processes")
            zygote = start_zygote(isolation, children, zygote_env(children.environment),
                                  bool(pending), started=started, preloads=wanted)
            progress.waiting("reload", None)
            if zygote is None and prefetch and parallel == 1 and len(gpus) <= 1:
                indexes = list(pending)
                for position, result in _one_at_a_time([pending[i] for i in indexes], timeout, children,
                                                       began=lambda job: progress.began("reload", job["artifact"])):
                    results[indexes[position]] = result
                    progress.ended("reload", result.artifact, result.ok)
                    progress.advance("reload")
            else:
                def reload_one(job: dict) -> ReloadResult:  # named when its reload begins, not when it is queued
                    progress.began("reload", job["artifact"])
                    return run_child(job, timeout, children, zygote, pool)

                futures = {workers.submit(reload_one, job): i for i, job in pending.items()}
                running = set(futures)

                def collect(pause: float) -> bool:  # the launcher's bounded waits: a signal's handler runs
                    nonlocal running
                    done, running = wait(running, timeout=pause, return_when=FIRST_COMPLETED)
                    for future in done:
                        results[futures[future]] = result = future.result()
                        progress.ended("reload", result.artifact, result.ok)
                        progress.advance("reload")
                    return not running

                wait_until(collect)
        except BaseException:
            children.stop_all()  # Ctrl-C or SIGTERM: end every child now, not after its timeout
            failed = True
            raise
        finally:
            if zygote is not None:
                release(zygote, failed=failed)
    progress.finish("reload")
    return [r for r in results if r is not None]
