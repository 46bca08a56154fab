"""One run of a campaign: its params and config_sha256, metrics appended line by line, predictions streamed
against the frozen ids, its end (a declared stop rule, or completion) and its artifacts."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import numbers
import time
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from . import artifacts, resume
from .checkpoints import record_save, recorded
from .errors import RecordError
from .handle import CampaignClock
from .files import append_lines, cut_partial_line, dumps, json_line, read_bytes, write_atomic
from .ids import check_id
from .lock import package_lock
from .lots import check_continued, lot_of_new_run
from .proofs import DEFAULT_TIMEOUT, Proof, Proofs, check_mode, warn
from .stoprules import Violation, check, check_inputs, inputs_metrics
from .store import EVAL_IDS, MANIFEST, STOPS, read, run_entry, transaction

def _number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise RecordError(f"metric {name!r}: value {value!r} is not a number")
    return value if isinstance(value, int) else float(value)  # a numpy scalar is not JSON


class Run:
    def __init__(self, campaign: CampaignClock, run_id: str, role: str, category: str, params: dict):
        self.campaign, self.id, self.role, self.category = campaign, run_id, role, category
        self.params = params
        self.started = False
        self._rules: list[dict] = []
        self._appending: set[str] = set()  # files whose partial tail (a crash) was already cut
        self._stopped = False
        self._early_inputs: dict[str, float] = {}
        self.step = 0  # the last step a value was logged at: where run.inputs() records its counts
        self.proofs = Proofs(self)

    @property
    def root(self) -> Path:
        return self.campaign.root

    @property
    def writer(self) -> bool:
        return self.campaign.writer

    @property
    def metrics_path(self) -> str:
        return f"metrics/{self.id}.jsonl"

    @property
    def predictions_path(self) -> str:
        return f"predictions/{self.id}.jsonl"

    def entry(self) -> dict | None:
        return next((r for r in read(self.root, MANIFEST).get("runs", []) if r.get("id") == self.id), None)

    # ---- start --------------------------------------------------------------------------------------
    def start(self, params: dict | None = None) -> Run:
        """Write params/<run>.json and the run's manifest entry. `params` adds to those given to the handle;
        they must hold an integer `seed`. Starting again with the same params continues the run (a reopened
        campaign); with other params it is refused: a changed configuration needs a new run id (IV304)."""
        merged = {**self.params, **(params or {})}
        seed = merged.get("seed")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise RecordError(f"run {self.id!r}: params need an integer seed (got {seed!r}), so the run can be "
                              "replayed")
        try:
            json.dumps(merged, allow_nan=False)  # NaN is no JSON: a strict reader of the params would fail
            data = dumps(merged)
        except (TypeError, ValueError) as exc:
            raise RecordError(f"run {self.id!r}: params must be JSON ({exc})") from None
        if not self.writer:
            self.params, self.started = merged, True
            return self
        digest = hashlib.sha256(data).hexdigest()
        params_rel = f"params/{self.id}.json"
        with transaction(self.root) as tx:
            manifest = tx.get(MANIFEST)
            if "plan" not in manifest:
                raise RecordError("declare the plan before the first run starts (IV610): campaign.declare_plan(...)")
            if "stop_rules" not in manifest:
                raise RecordError("declare the stop rules before the first run starts (IV401): "
                                  "campaign.declare_stop_rules([...])")
            self._rules = manifest["stop_rules"]["rules"]
            old = next((r for r in manifest["runs"] if r.get("id") == self.id), None)
            if old is not None:
                check_continued(old, getattr(self.campaign, "lot", None), self.id)
                if old.get("config_sha256") != digest:
                    raise RecordError(
                        f"run {self.id!r} was started with another configuration (config_sha256 "
                        f"{str(old.get('config_sha256'))[:12]}…, now {digest[:12]}…): a changed configuration "
                        "needs a new run id")
                if (old.get("role"), old.get("category")) != (self.role, self.category):
                    raise RecordError(f"run {self.id!r} was started as {old.get('role')}/{old.get('category')}")
                self._stopped = old.get("status") == "stopped"
                self.params, self.started = merged, True
                return self  # continued after a reopen: params and started_at stay as recorded
            if self.role == "control" and any(r.get("role") == "control" for r in manifest["runs"]):
                raise RecordError(f"run {self.id!r}: the campaign already has its control (IV302); "
                                  "start it as a variant")
            lot = lot_of_new_run(manifest, getattr(self.campaign, "lot", None), self.id)
            write_atomic(self.root, params_rel, data)
            manifest["runs"].append({
                "id": self.id, "role": self.role, "category": self.category, "status": "running",
                "started_at": self.campaign.now(), "params": params_rel, "config_sha256": digest,
                "metrics": self.metrics_path, "predictions": self.predictions_path, **({"lot": lot} if lot else {})})
        self.params, self.started = merged, True  # only once recorded: a refused start logs nothing
        return self

    def _require_started(self) -> None:
        if not self.started:
            raise RecordError(f"run {self.id!r} has not started: call run.start() first")

    def _append(self, rel: str, data: bytes) -> None:
        if rel not in self._appending:
            dropped = cut_partial_line(self.root, rel)
            if dropped:
                warnings.warn(f"{rel}: dropped {dropped} bytes of a line an interrupted write left unfinished",
                              stacklevel=3)
            self._appending.add(rel)
        append_lines(self.root, rel, data)

    # ---- metrics ------------------------------------------------------------------------------------
    def log(self, step: int, name: str, value: float) -> Violation | None:
        return self.log_dict(step, {name: value})

    def log_dict(self, step: int, values: dict[str, float]) -> Violation | None:
        """Append one `{"step", "name", "value"}` line per value (one write, fsynced) and return the first
        declared stop rule they break, if any: the caller stops the run with `run.stop_for(violation)`."""
        self._require_started()
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise RecordError(f"metric step {step!r} must be a non-negative integer")
        values = {str(n): _number(n, v) for n, v in values.items()}
        lines = b"".join(json_line({"step": step, "name": n, "value": v}) for n, v in values.items())
        if self.writer and lines:
            self._append(self.metrics_path, lines)
        self.step = max(self.step, step)
        return self.check(step, values) or self.pending_stop(step)

    def rules(self) -> list[dict]:
        if not self._rules:
            # A process that writes nothing (a DDP rank) reads the rules the main process declared.
            self._rules = ((read(self.root, MANIFEST) or {}).get("stop_rules") or {}).get("rules", [])
        return self._rules

    def check(self, step: int, values: dict[str, float]) -> Violation | None:
        """The first declared stop rule these values break, writing nothing (what another rank decides)."""
        for name, value in values.items():
            violation = check(self.rules(), step, str(name), float(value))
            if violation:
                return violation
        return None

    def pending_stop(self, step: int | None = None) -> Violation | None:
        """A stop decided outside the logged values, taken once: a failed resume proof under a declared
        `no_usable_resume` rule (the callbacks ask at each step; a hand-written loop gets it from its next
        run.log). `step`: where the run stops (its next step)."""
        pending = self.proofs.take_pending()
        if pending is not None and step is not None:
            pending = dataclasses.replace(pending, step=step)
        return pending

    def inputs(self, split: str, total: int, truncated: int, step: int | None = None) -> Violation | None:
        """How many `split` inputs the run fed and how many of them the tokenizer truncated (docs/record.md): the metric
        lines `inputs_total/<split>` and `inputs_truncated/<split>` at `step` (default: the last logged step),
        and the declared `truncated_input` rule they break, if any. Every rank may call it; only rank 0 writes.
        Before the run starts, the counts wait for its start (the callbacks start it at train begin and stop it
        there when the rule is broken)."""
        values = inputs_metrics(split, total, truncated)
        if not self.started:
            self._early_inputs.update(values)
            return check_inputs(self.rules(), step or 0, values)
        return self.log_dict(self.step if step is None else step, values)

    def early_inputs(self) -> Violation | None:
        """Record the inputs given before the run started (at step 0) and the rule they break, once."""
        values, self._early_inputs = self._early_inputs, {}
        return self.log_dict(0, values) if values else None

    # ---- predictions --------------------------------------------------------------------------------
    def predictions(self) -> PredictionStream:
        self._require_started()
        return PredictionStream(self)

    def write_predictions(self, records: Iterable[dict]) -> None:
        """Each record {"id", "prediction", ...}, streamed (bounded by the number of ids, not of records)."""
        with self.predictions() as stream:
            for record in records:
                stream.write(**record)

    # ---- end ----------------------------------------------------------------------------------------
    def stop_for(self, violation: Violation) -> None:
        self.stop(violation.rule, violation.step, violation.reason)

    @property
    def stopped(self) -> bool:
        """A declared rule stopped the run: the same on every rank. The writing process (rank 0) decides and
        records it; another rank knows it when it took the decision itself (its `stop` writes nothing) or, else,
        reads it from the package: the run's status, under the lock, as rank 0 last wrote it."""
        if self._stopped or self.writer or not self.started:
            return self._stopped
        with package_lock(self.root):
            entry = self.entry()
        self._stopped = isinstance(entry, dict) and entry.get("status") == "stopped"
        return self._stopped

    def stop(self, rule: str, step: int | None, reason: str) -> None:
        """Stop the run by a declared rule: the stop record (rule, time, step, reason) in stops.json and the
        run's status `stopped`. A stopped run is never accepted (IV403) and keeps no predictions."""
        self._require_started()
        if not isinstance(reason, str) or not reason.strip():
            raise RecordError("a stop needs its reason (IV402)")
        if not self.writer:
            self._stopped = True
            return
        with transaction(self.root) as tx:
            manifest = tx.get(MANIFEST)
            if rule not in {r.get("id") for r in manifest["stop_rules"]["rules"]}:
                raise RecordError(f"stop rule {rule!r} was not declared (IV406): declared rules are "
                                  + ", ".join(r["id"] for r in manifest["stop_rules"]["rules"]))
            run = run_entry(manifest, self.id)
            if run["status"] != "running":
                raise RecordError(f"run {self.id!r} is already {run['status']}")
            stops = tx.get(STOPS)["stops"]
            # stops.json is written before the manifest: after a crash between the two, the record is there.
            record = next((s for s in stops if s.get("run") == self.id), None)
            if record is None:
                record = {"run": self.id, "rule": rule, "at": self.campaign.now(), "reason": reason}
                if step is not None:
                    record["step"] = step
                stops.append(record)
            run.update(status="stopped", ended_at=record["at"], predictions=None)
        self._stopped = True

    def complete(self) -> bool:
        """The run finished: its predictions must cover every frozen eval id exactly once (IV303). A resume proof
        still running is waited for. One that failed under a declared `no_usable_resume` rule becomes the run's
        stop record (the checkpoint and the finding, status `stopped`), said on a framed warning: the run is not
        completed, and the campaign goes on to its next run. Returns whether the run completed."""
        self._require_started()
        if not self.writer:
            return not self.stopped
        self.proofs.wait()
        if self.stop_pending():
            return False
        missing = artifacts.missing_predictions(self.root, self.predictions_path)
        if missing:
            raise RecordError(f"run {self.id!r} cannot complete: {missing}")
        with transaction(self.root) as tx:
            run = run_entry(tx.get(MANIFEST), self.id)
            if run["status"] != "running":
                raise RecordError(f"run {self.id!r} is already {run['status']}")
            run.update(status="completed", ended_at=self.campaign.now())
        return True

    def stop_pending(self) -> bool:
        """A failed resume proof the run has not stopped for yet (its result came after the last step: a short
        run, the first save at the end, a slow disk) stops it now, at its last logged step; said on a framed
        warning. False when there was none, or the run ended already."""
        pending = self.proofs.take_pending()
        if pending is None or not self.writer:
            return False
        entry = self.entry()
        if not isinstance(entry, dict) or entry.get("status") != "running":
            return False
        step = self.step or pending.step
        self.stop(pending.rule, step, pending.reason)
        warn(f"run {self.id!r} did not complete: {pending.reason}. It is recorded as stopped by the declared "
             f"rule {pending.rule!r} (stops.json); the campaign goes on", stacklevel=3)
        return True

    def now(self) -> str:
        """The campaign's clock (RFC 3339 UTC to the second)."""
        return self.campaign.now()

    # ---- artifacts ----------------------------------------------------------------------------------
    def artifact(self, path, kind: str | None = None, id: str | None = None, loader: str | None = None, *,
                 base=None, revision: str | None = None, cache_dir=None, **reload_fields) -> str:
        """Register a file or folder inside the package (`path`: absolute, or relative to the package root)
        and its reload.json entry; returns its artifact id. Without `kind`, its files say what it is (a
        diffusers pipeline, a timm or sentence-transformers folder, a LoRA, a .gguf or .onnx file, ...); a
        kind or loader that cannot prove them is refused. `base` (a hub id, or {"name", "revision"}) for a
        diffusers LoRA: pinned to the commit of the local hub cache, in the manifest."""
        self._require_started()
        pinned = artifacts.pinned_base(base, revision, cache_dir) if base is not None else None
        return artifacts.register(self, path, kind, id, loader, reload_fields, base=pinned)

    def adapter(self, path, base: str, model=None, revision: str | None = None, cache_dir=None,
                id: str | None = None, **reload_fields) -> str:
        """Register a PEFT adapter on the hub model `base`, pinned to the 40-hex commit it was loaded from
        (`model`'s own record of it, else `revision` resolved in the local hub cache), and write that pin into
        adapter_config.json (PEFT leaves `revision: null` unless told). A diffusers LoRA file (or its folder) is
        registered as a `diffusers-lora` on the base pipeline `base`, pinned likewise in the manifest."""
        self._require_started()
        return artifacts.register_adapter(self, path, base, model, revision, cache_dir, id, reload_fields)


    def resume_file(self, path, *, model, optimizer, scheduler, step: int, data_state, scaler=None,
                    trainable_only: bool = True, id: str | None = None, prove_resume: str | bool = "first",
                    **reload_fields) -> str:
        """Write a hand-written loop's resume file (`path`, a .pt inside the package) holding exactly what the
        torch-resume reload proves: `model` (a module's trainable parameters, or its whole state dict with
        trainable_only=False), the optimizer, scheduler and (fp16) scaler states, every RNG state, `step` and
        `data_state`; atomically, by the writing rank only. Registered as the run's resume artifact, the save
        priced (`runs[].checkpoints`) and, by `prove_resume` ("first": the run's first save; "every"; False),
        its resume proven in the background."""
        self._require_started()
        check_mode(prove_resume)
        artifact_id = check_id("artifact id", id or f"{self.id}-resume")
        target = resume.resume_target(self, path)
        if not self.writer:  # another rank: the same refusals, no copy of the weights, nothing written
            resume.check_position(step, data_state)
            return artifact_id
        began = time.monotonic()
        state = resume.resume_state(model=model, optimizer=optimizer, scheduler=scheduler, step=step,
                                    data_state=data_state, scaler=scaler, trainable_only=trainable_only)
        resume.save_resume(self, target, state)
        write_seconds = time.monotonic() - began
        if scaler is not None:
            reload_fields.setdefault("fp16", True)
        artifacts.register(self, target, "resume-checkpoint", artifact_id, "torch-resume", reload_fields)
        self.saved(artifact_id, step, write_seconds, prove_resume=prove_resume)
        return artifact_id

    # ---- saves and their proofs ----------------------------------------------------------------------
    def saved(self, artifact_id: str, step: int, write_seconds: float | None = None, *,
              prove_resume: str | bool = False, device: str = "cpu", hf_cache=None,
              timeout: float = DEFAULT_TIMEOUT) -> None:
        """Price a save of the registered artifact `artifact_id` (its step, time, `write_seconds` measured around
        the save, bytes on disk) in `runs[].checkpoints`, and print the time the rental has left; with
        `prove_resume` "first" (the run's first save) or "every", prove its resume in the background."""
        self._require_started()
        mode = check_mode(prove_resume)
        if not self.writer:
            return
        listed = next((a for a in read(self.root, MANIFEST).get("artifacts", []) if a.get("id") == artifact_id), None)
        if listed is None:
            raise RecordError(f"artifact {artifact_id!r} is not registered: run.artifact(...) first")
        first = not self.proofs.started and not any(c.get("proof") for c in recorded(self))
        record_save(self, artifact_id, self.root / listed["path"], step, write_seconds)
        if mode == "every" or (mode == "first" and first):
            self.prove_resume(artifact_id, step=step, device=device, hf_cache=hf_cache, timeout=timeout)

    def prove_resume(self, artifact_id: str, *, step: int | None = None, device: str = "cpu", hf_cache=None,
                     timeout: float = DEFAULT_TIMEOUT) -> Proof | None:
        """Reload the checkpoint `artifact_id` in a background process at the lowest priority, by the reload
        `itera-verify` runs, on `device` (the CPU by default: the GPU is training); its result goes into
        `runs[].checkpoints[].proof` when it ends. Never waits for it (run.complete() does). A failed proof
        stops the run at its next step under a declared `no_usable_resume` rule, else warns loudly."""
        self._require_started()
        if not self.writer:
            return None
        if not any(a.get("id") == artifact_id for a in read(self.root, MANIFEST).get("artifacts", [])):
            raise RecordError(f"artifact {artifact_id!r} is not registered: run.artifact(...) first")
        return self.proofs.start(artifact_id, step, device=device, hf_cache=hf_cache, timeout=timeout)


class PredictionStream:
    """Appends predictions one line at a time; an id outside the frozen corpus, or one already written, is
    refused before anything is written. Reopened after a crash, it continues after the last whole line."""

    def __init__(self, run: Run):
        self.run = run
        self.frozen = set(read_bytes(run.root, EVAL_IDS).decode("utf-8").splitlines())
        self.seen: set[str] = set()
        if run.writer:
            cut_partial_line(run.root, run.predictions_path)  # refuses a linked file before anything is written
            run._appending.add(run.predictions_path)
            try:
                written = read_bytes(run.root, run.predictions_path)
            except FileNotFoundError:
                written = b""
            self.seen = {json.loads(line)["id"] for line in written.splitlines() if line.strip()}

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        return None

    def write(self, id: str, prediction: Any, **extra) -> None:
        if id not in self.frozen:
            raise RecordError(f"prediction for id {id!r}, which is not among the frozen eval ids")
        if id in self.seen:
            raise RecordError(f"a prediction for id {id!r} was already written")
        record = {"id": id, "prediction": prediction, **extra}
        line = json_line(record)
        self.seen.add(id)
        if self.run.writer:
            self.run._append(self.run.predictions_path, line)
