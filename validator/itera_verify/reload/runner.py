"""Run each artifact's reload in a fresh child process, with a timeout, and collect what it proved.

The child is `python -m itera_verify.reload.child` in its own session (process group, see process.py), offline,
with the job as JSON in and the facts as JSON out. A timeout kills the whole group; a signal or an exit without
a result is a crash, named; Ctrl-C or SIGTERM ends every child at once. Before any child starts, an artifact
holding a pickle the static scan refused is refused whole. CPU reloads may run side by side (--jobs); GPU
reloads run one at a time.
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
from pathlib import Path

from ..forked import SIGNAL_POLL_SECONDS
from ..model import ReloadResult
from ..package import Package
from ..pickles import scan_package
from .loaders import LOADERS
from .process import ChildProcesses, Exit, sigterm_interrupts

VALIDATOR_DIR = str(Path(__file__).resolve().parents[2])  # the folder holding the itera_verify package
LOG_TAIL_LINES = 3


def _text(value) -> str | None:
    return value if isinstance(value, str) else None


def fp16_run(package: Package, run_id: str | None) -> bool:
    """Mixed precision per the run's params file: `"fp16": true` or `"mixed_precision": "fp16"` (SPEC §6)."""
    for run in package.runs():
        if run.get("id") == run_id and isinstance(run.get("params"), str):
            rel = package.normalise_ref(run["params"])
            params = package.json_value(rel) if rel else None
            if isinstance(params, dict):
                return params.get("fp16") is True or params.get("mixed_precision") == "fp16"
    return False


def _refused_by_scan(package: Package, rel: str) -> str | None:
    """The first unsafe pickle inside the artifact: nothing is loaded from a folder that carries a payload."""
    for path, result in sorted(scan_package(package).items()):
        if (path == rel or path.startswith(rel.rstrip("/") + "/")) and result.unsafe:
            return f"refused: {path} names {', '.join(result.unsafe[:3])} (IV506); nothing of this artifact was loaded"
    return None


def _leaving_link(package: Package, rel: str) -> str | None:
    """A link inside the artifact that leaves the package: its data is not part of what is delivered."""
    for path, link in sorted(package.links.items()):
        if (path == rel or path.startswith(rel.rstrip("/") + "/")) and not link.inside:
            return f"refused: {path} links outside the package ({link.target}); the artifact must reload from the package alone"
    return None


def plan(package: Package, artifact: dict, device: str, threads: int) -> dict | ReloadResult:
    """The child's job for one artifact, or the result already known when there is nothing to run."""
    artifact_id = _text(artifact.get("id")) or "?"
    entries = package.reload_spec.get("artifacts")
    entry = entries.get(artifact_id) if isinstance(entries, dict) else None
    loader = _text(entry.get("loader")) if isinstance(entry, dict) else None
    result = ReloadResult(artifact_id, loader or "", kind=_text(artifact.get("kind")) or "",
                          path=_text(artifact.get("path")) or "", device=device)
    if loader not in LOADERS:
        result.failure = "no-loader"  # IV510 reports it; nothing to run
        result.error = f"no usable reload.json loader ({loader!r})"
        return result
    rel = package.normalise_ref(result.path) if result.path else None
    root = os.path.realpath(package.root)
    real = os.path.realpath(package.abspath(rel)) if rel is not None else ""
    if rel is None or not (real == root or real.startswith(root + os.sep)):
        result.failure, result.error = "skipped", f"path {result.path!r} leaves the package; nothing loaded from it"
        return result
    if not os.path.exists(real):
        result.failure, result.error = "load", f"{rel} does not exist"
        return result
    refusal = _refused_by_scan(package, rel) or _leaving_link(package, rel)
    if refusal:
        result.failure, result.error = "load", refusal
        return result
    return {
        "artifact": artifact_id, "loader": loader, "kind": result.kind, "rel": rel, "path": real,
        "package_root": root, "device": device, "dtype": _text(entry.get("dtype")), "class": _text(entry.get("class")),
        "hf_cache": os.path.abspath(package.hf_cache) if package.hf_cache else None,  # the child runs elsewhere
        "base": artifact.get("base") if isinstance(artifact.get("base"), dict) else None,
        "num_labels": entry.get("num_labels"),  # the loader checks it: a task head's size (peft, SPEC reload.json)
        "fp16": fp16_run(package, _text(artifact.get("run"))), "threads": threads,
    }


def child_env(job: dict, work: str) -> dict:
    env = dict(os.environ)
    # Third-party scratch files (torch inductor's cache, ...) land in the reload's own folder, removed after it.
    env["TMPDIR"] = work
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1",
               HF_HUB_DISABLE_PROGRESS_BARS="1", TRANSFORMERS_VERBOSITY="error", TOKENIZERS_PARALLELISM="false",
               PYTHONUNBUFFERED="1", PYTHONDONTWRITEBYTECODE="1")
    if job.get("hf_cache"):
        env["HF_HUB_CACHE"] = job["hf_cache"]
    if job.get("threads"):
        env["OMP_NUM_THREADS"] = str(job["threads"])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (VALIDATOR_DIR, env.get("PYTHONPATH", "")) if p)
    return env


def _log_tail(log: Path) -> str:
    try:
        lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    return " | ".join(lines[-LOG_TAIL_LINES:])


def _died(code: int | None, log: Path) -> str:
    if code < 0:
        name = signal.Signals(-code).name if -code in signal.valid_signals() else f"signal {-code}"
        why = " (the system may have run out of memory)" if -code == signal.SIGKILL else ""
        return f"the reload process was killed by {name}{why}"
    tail = _log_tail(log)
    return f"the reload process exited with code {code} without a result" + (f": {tail}" if tail else "")


class _Child:
    """One reload child and its private folder. Gated: it imports its libraries, then waits for let_through()
    before it touches the device (see child.py); the timeout runs from there."""

    def __init__(self, job: dict, children: ChildProcesses, *, gated: bool = False):
        self.job, self.children, self.gated = dict(job, gated=gated), children, gated
        self.work = Path(tempfile.mkdtemp(prefix="itera-reload-"))
        self.job_file, self.result_file, self.log = (self.work / "job.json", self.work / "result.json",
                                                     self.work / "child.log")
        self.job_file.write_text(json.dumps(self.job), encoding="utf-8")
        self.started = time.monotonic()
        with open(self.log, "wb") as log_handle:  # the child keeps its own descriptor
            self.proc = children.spawn([sys.executable, "-m", "itera_verify.reload.child", str(self.job_file),
                                        str(self.result_file)],
                                       stdin=subprocess.PIPE if gated else subprocess.DEVNULL, stdout=log_handle,
                                       stderr=subprocess.STDOUT, cwd=self.work, env=child_env(self.job, str(self.work)))

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
            end = self.children.wait(self.proc, timeout) if self.proc is not None else Exit(interrupted=True)
            result.seconds = time.monotonic() - self.started
            if end.usage is not None and job["device"] == "cpu":
                result.peak_memory_bytes = end.usage.ru_maxrss * (1 if sys.platform == "darwin" else 1024)
            if end.interrupted:
                result.failure, result.error = "crash", "interrupted"
            elif end.timed_out:
                result.failure = "timeout"
                result.error = f"no result after {timeout:g} s; the reload process was stopped"
            elif end.code != 0 or not self.result_file.is_file():
                result.failure, result.error = "crash", _died(end.code, self.log)
            else:
                _merge(result, json.loads(self.result_file.read_text(encoding="utf-8")))
                result.facts["wall_seconds"] = round(result.seconds, 3)  # from its start to its end, waiting included
                result.seconds -= result.facts.get("gate_wait_seconds") or 0  # waiting for its turn is not its time
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


def run_child(job: dict, timeout: float, children: ChildProcesses) -> ReloadResult:
    return _Child(job, children).finish(timeout)


def _one_at_a_time(jobs: list[dict], timeout: float, children: ChildProcesses):
    """(index, result) in order, one reload at a time, the next child importing while the current one runs."""
    waiting: _Child | None = None
    try:
        for position, job in enumerate(jobs):
            current = waiting or _Child(job, children, gated=True)
            waiting = None
            current.let_through()
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
    facts = dict(reported.get("facts") or {})
    for key in ("startup_seconds", "gate_wait_seconds", "load_seconds", "peak_rss_bytes", "device_name", "started_at",
                "ended_at"):
        if reported.get(key) is not None:
            facts[key] = reported[key]
    if reported.get("problems"):
        facts["problems"] = reported["problems"]
    result.facts = facts


def run_reloads(package: Package, *, device: str, timeout: float, jobs: int, progress,
                only: set[str] | None = None, prefetch: bool | None = None) -> list[ReloadResult]:
    """Every manifest artifact (or those named in `only`), each in its own child; results in manifest order.
    prefetch (default: on a GPU): one at a time, the next child importing its libraries while the current one
    runs; on a machine where importing torch and transformers takes 10-20 s, that is most of a small reload."""
    parallel = max(1, jobs) if device == "cpu" else 1  # one GPU, one reload at a time
    threads = max(1, (os.cpu_count() or 1) // parallel) if parallel > 1 else 0
    chosen = [a for a in package.artifacts() if only is None or a.get("id") in only]
    plans = [plan(package, artifact, device, threads) for artifact in chosen]
    results: list[ReloadResult | None] = [p if isinstance(p, ReloadResult) else None for p in plans]
    progress.start("reload", "reloading artifacts", total=len(plans), unit="artifacts")
    for _ in (r for r in results if r is not None):
        progress.advance("reload")
    pending = {i: p for i, p in enumerate(plans) if isinstance(p, dict)}
    children = ChildProcesses()
    if prefetch is None:
        prefetch = device != "cpu"
    with sigterm_interrupts(), ThreadPoolExecutor(max_workers=parallel) as pool:
        try:
            if prefetch and parallel == 1:
                indexes = list(pending)
                for position, result in _one_at_a_time([pending[i] for i in indexes], timeout, children):
                    results[indexes[position]] = result
                    progress.advance("reload")
            else:
                futures = {pool.submit(run_child, job, timeout, children): i for i, job in pending.items()}
                running = set(futures)
                while running:
                    # Bounded waits: a SIGTERM or Ctrl-C the kernel hands to a worker thread runs its Python
                    # handler only when this thread wakes, and a stopped child may never complete its future.
                    done, running = wait(running, timeout=SIGNAL_POLL_SECONDS, return_when=FIRST_COMPLETED)
                    for future in done:
                        results[futures[future]] = future.result()
                        progress.advance("reload")
        except BaseException:
            children.stop_all()  # Ctrl-C or SIGTERM: end every child now, not after its timeout
            raise
    progress.finish("reload")
    return [r for r in results if r is not None]
