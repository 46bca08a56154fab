"""The early resume proof (docs/record.md): a checkpoint reloaded, while the training goes on, by the very reload
`itera-verify` runs at the end (static scan, weights_only, every component), in a background process at the
lowest CPU and I/O priority, on the CPU unless told otherwise.

The proof process is `python -m itera_verify.flows.proof` (the recorder layer does not import the reload
engine: a process boundary keeps the training process free of it). A thread here waits for it and writes its
result into `runs[].checkpoints[].proof` under the package lock; the training thread never waits for it, except
in `run.complete()` (and at interpreter exit), which waits for a proof still running."""
from __future__ import annotations

import atexit
import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from ..runtime.environment import Environment, tool_first
from ..runtime.launcher import kill_tree
from .checkpoints import set_proof
from .errors import RecordError
from .files import read_bytes
from .lock import package_lock
from .store import EVAL_IDS, MANIFEST, RELOAD, STOPS
from .stoprules import Violation
from .handle import RunRecord


PROOF_MODULE = "itera_verify.flows.proof"
MODES = ("first", "every", False)
DEFAULT_TIMEOUT = 1800.0  # seconds for the whole proof: start-up, scan and reload
# Past its timeout the proof process is killed: its reload ended at the timeout, and writing the result takes
# seconds; one still alive then is hung (blocked on a file system, stopped) and must not hold run.complete().
KILL_GRACE = 10.0
LOG_TAIL = 400


def check_mode(mode) -> str | bool:
    if mode is True:
        return "first"
    if mode not in MODES:
        raise RecordError(f"prove_resume={mode!r}: 'first' (default), 'every' or False")
    return mode


@dataclass
class Proof:
    """One proof under way, or ended (`result` set)."""

    artifact: str
    step: int | None
    process: subprocess.Popen
    work: Path
    view: Path | None = None  # the snapshot the proof reads (removed with it)
    started: float = field(default_factory=time.monotonic)
    timeout: float = DEFAULT_TIMEOUT
    timed_out: bool = False  # killed by its watcher, past timeout + KILL_GRACE
    result: dict | None = None
    done: threading.Event = field(default_factory=threading.Event)

    @property
    def pid(self) -> int:
        return self.process.pid


def proof_env(device: str, environment: Environment) -> dict[str, str]:
    """The proof process's variables: the tool's settings and what its libraries need, never the training's
    secrets (runtime/environment.py `for_tool`)."""
    env = environment.for_tool()
    env["PYTHONPATH"] = tool_first(env.get("PYTHONPATH"))
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""  # the GPU is training: the proof never touches it
    return env


def conclusive_failure(proof: dict | None) -> bool:
    """A proof that judged the checkpoint and found it unusable (a finding with its code); a proof that could
    not run (killed, no result) judged nothing."""
    return isinstance(proof, dict) and proof.get("ok") is False and bool(proof.get("codes"))


class Proofs:
    """The proofs of one run's checkpoints."""

    def __init__(self, run: RunRecord):
        self.run = run
        self.started: dict[str, Proof] = {}
        self._lock = threading.Lock()
        self.pending: Violation | None = None  # a failed proof under a declared no_usable_resume rule
        self._warnings: list[str] = []  # said here, for the other ranks to say too (the callbacks hand them on)

    def start(self, artifact_id: str, step: int | None, *, device: str = "cpu", hf_cache=None,
              timeout: float = DEFAULT_TIMEOUT) -> Proof:
        work = Path(tempfile.mkdtemp(prefix="itera-proof-"))
        view = snapshot(self.run.root, artifact_id)
        argv = [sys.executable, "-m", PROOF_MODULE, str(view or self.run.root), artifact_id,
                str(work / "result.json"), "--device", device, "--timeout", str(timeout)]
        if hf_cache is not None:
            argv += ["--hf-cache", str(Path(hf_cache).absolute())]
        with open(work / "proof.log", "wb") as log:
            process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                       env=proof_env(device, Environment.read()), cwd=work)
        proof = Proof(artifact_id, step, process, work, view, timeout=timeout)
        with self._lock:
            self.started[artifact_id] = proof
        _LIVE.add(self)
        threading.Thread(target=self._watch, args=(proof,), name=f"itera-proof-{artifact_id}", daemon=True).start()
        return proof

    def _watch(self, proof: Proof) -> None:
        try:
            try:
                code = proof.process.wait(proof.timeout + KILL_GRACE)
            except subprocess.TimeoutExpired:
                proof.timed_out = True
                kill_tree(proof.process.pid)  # its reload child too, which runs in its own session
                code = proof.process.wait()
            result = _read_result(proof, code)
            result["at"] = self.run.now()
            result.setdefault("device", "cpu")
            set_proof(self.run, proof.artifact, result)
            proof.result = result
            if result.get("ok") is not True:
                self._failed(proof, result)
        except Exception as exc:  # noqa: BLE001  (a thread's exception is lost: say it where the user looks)
            print(f"itera-verify: the resume proof of {proof.artifact} could not be recorded: {exc}",
                  file=sys.stderr, flush=True)
            proof.result = proof.result or {"ok": False, "error": str(exc), "codes": []}
        finally:
            shutil.rmtree(proof.work, ignore_errors=True)
            if proof.view is not None:
                shutil.rmtree(proof.view, ignore_errors=True)
            proof.done.set()

    def _failed(self, proof: Proof, result: dict) -> None:
        finding = result.get("error") or "failed"
        if conclusive_failure(result):
            first = (result.get("findings") or [{}])[0]
            named = first.get("file") and first["file"] not in (first.get("message") or "")
            where = f" {first['file']}" if named else ""
            finding = f"{first.get('code') or result['codes'][0]}{where}: {first.get('message') or finding}"
        rule = self.no_usable_resume_rule()
        if conclusive_failure(result) and rule is not None:
            reason = (f"the resume proof of checkpoint {proof.artifact}"
                      + (f" (step {proof.step})" if proof.step is not None else "") + f" failed: {finding}")
            with self._lock:
                if self.pending is None:
                    self.pending = Violation(rule, proof.step or 0, "resume_proof", math.nan, reason)
            _UNSETTLED.add(self)
            return
        what = ("failed" if conclusive_failure(result) else "did not conclude")
        message = (f"the resume proof of {self.run.id}'s checkpoint {proof.artifact} {what}: {finding}"
                   + ("" if conclusive_failure(result) else "; the checkpoint is unproven, the run goes on"))
        with self._lock:
            self._warnings.append(message)
        warn(message)

    def drain_warnings(self) -> list[str]:
        with self._lock:
            said, self._warnings = self._warnings, []
        return said

    def no_usable_resume_rule(self) -> str | None:
        return next((r["id"] for r in self.run.rules() if r.get("kind") == "no_usable_resume"), None)

    def take_pending(self) -> Violation | None:
        with self._lock:
            pending, self.pending = self.pending, None
        _UNSETTLED.discard(self)
        return pending

    def running(self) -> list[Proof]:
        with self._lock:
            return [p for p in self.started.values() if not p.done.is_set()]

    def wait(self, timeout: float | None = None) -> None:
        """Wait for every proof still running (each is killed KILL_GRACE past its own timeout; `timeout` bounds
        the wait)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for proof in self.running():
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not proof.done.wait(left):
                return
        _LIVE.discard(self)


def snapshot(root: Path, artifact_id: str) -> Path | None:
    """The package as the proof must see it, fixed now: its documents and params copied, the checkpoint's files
    hard-linked (no bytes copied), in a hidden folder beside the package. The Trainer's save_total_limit may
    delete the checkpoint folder while the proof reads it; the links keep its files. None where links cannot be
    made (another file system): the proof then reads the package in place."""
    with package_lock(root):  # the documents and the registered files as one moment shows them
        manifest = json.loads(read_bytes(root, MANIFEST))
        listed = next((a for a in manifest.get("artifacts", []) if a.get("id") == artifact_id), {})
        rel = listed.get("path")
        if not isinstance(rel, str):
            return None
        try:
            view = Path(tempfile.mkdtemp(prefix=f".{root.name}.itera-proof-", dir=root.parent))
        except OSError:
            return None
        try:
            for name in (MANIFEST, RELOAD, STOPS, EVAL_IDS):
                with contextlib.suppress(FileNotFoundError):
                    (view / name).parent.mkdir(parents=True, exist_ok=True)
                    (view / name).write_bytes(read_bytes(root, name))
            for run in manifest.get("runs", []):
                params = run.get("params") if isinstance(run, dict) else None
                if isinstance(params, str) and params.startswith("params/") and ".." not in params:
                    with contextlib.suppress(FileNotFoundError):
                        (view / params).parent.mkdir(parents=True, exist_ok=True)
                        (view / params).write_bytes(read_bytes(root, params))
            _link_tree(root / rel, view / rel)
        except (OSError, RecordError):
            shutil.rmtree(view, ignore_errors=True)
            return None
    return view


def _link_tree(source: Path, target: Path) -> None:
    """Hard links of every regular file under `source` (links in it are not followed, nor kept)."""
    if source.is_file() and not source.is_symlink():
        target.parent.mkdir(parents=True, exist_ok=True)
        os.link(source, target)
        return
    for folder, _, names in os.walk(source):
        here = target / os.path.relpath(folder, source)
        here.mkdir(parents=True, exist_ok=True)
        for name in names:
            path = os.path.join(folder, name)
            if os.path.isfile(path) and not os.path.islink(path):
                os.link(path, here / name)


def warn(message: str, stacklevel: int = 3) -> None:
    """Loud: a warning and a framed line on stderr, which a training log's noise does not bury."""
    line = f"itera-verify: WARNING: {message}"
    print(f"\n{'!' * 80}\n{line}\n{'!' * 80}", file=sys.stderr, flush=True)
    warnings.warn(message, stacklevel=stacklevel)


def _read_result(proof: Proof, code: int) -> dict:
    seconds = round(time.monotonic() - proof.started, 3)
    result_file = proof.work / "result.json"
    if code == 0 and result_file.is_file():
        try:
            result = json.loads(result_file.read_text(encoding="utf-8"))
        except ValueError as exc:
            result = {"ok": False, "error": f"the proof's result is not JSON ({exc})", "codes": []}
        result.setdefault("proof_seconds", seconds)
        return result
    if proof.timed_out:
        why = (f"the proof process did not end within its timeout of {proof.timeout:g} s (hung or blocked): "
               "killed")
        tail = _tail(proof.work / "proof.log")
        return {"ok": False, "error": why + (f": {tail}" if tail else ""), "codes": [], "timed_out": True,
                "proof_seconds": seconds}
    if code < 0:
        name = signal.Signals(-code).name if -code in signal.valid_signals() else f"signal {-code}"
        why = f"the proof process was killed by {name}"
    else:
        why = f"the proof process exited with code {code} without a result"
    tail = _tail(proof.work / "proof.log")
    return {"ok": False, "error": why + (f": {tail}" if tail else ""), "codes": [], "proof_seconds": seconds}


def _tail(log: Path) -> str:
    try:
        lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    return " | ".join(lines[-3:])[-LOG_TAIL:]


# Proofs still running when the script ends are waited for, so their result is recorded (each proof is bounded
# by its timeout).
_LIVE: set[Proofs] = set()
_UNSETTLED: set[Proofs] = set()  # a failed proof under the rule waits here until its run stops for it


@atexit.register
def _wait_at_exit() -> None:
    for proofs in list(_LIVE | _UNSETTLED):
        if proofs.running():
            print(f"itera-verify: waiting for the resume proof of {proofs.run.id}", file=sys.stderr, flush=True)
        proofs.wait()
        try:
            proofs.run.stop_pending()  # a failed proof nobody took: the run's stop record, not a lost finding
        except Exception as exc:  # noqa: BLE001 - at exit, one line where the user looks
            print(f"itera-verify: the stop of {proofs.run.id} for its failed resume proof could not be recorded: "
                  f"{exc}", file=sys.stderr, flush=True)
