"""IV504, IV505, IV507–IV509: what the reloads proved, turned into findings, and the resume facts that need no load.

Two phases. Static: what a resume checkpoint lacks or contradicts that its files show (rules/_resume_files.py),
so `--no-reload` sees it. After the reloads: what they proved; a missing component the static phase reported
already is not reported a second time.
"""
from __future__ import annotations

from typing import Iterator

from ..model import Finding, ReloadResult, Rule, Severity
from ..package import MANIFEST, RunContext, pointer_of
from ._resume_files import resume_facts

PHASE = ("static", "reload")

RULES = [
    Rule("IV504", Severity.ERROR, "artifact failed to reload",
         explain=(
             "Every artifact is reloaded for real, in a fresh process, on the chosen device: the header and every "
             "tensor of a safetensors file, every shard named by an index, from_pretrained with local files only, "
             "the adapter on its base, one forward pass with finite output. A load error, a missing shard, a "
             "shape mismatch, missing or unexpected keys, NaN or Inf in weights or output, a crash, an "
             "out-of-memory kill or a timeout means the artifact cannot be used as delivered. The message says "
             "which, and which file; re-export the artifact from the training run."),
         bad="artifacts/control-model/model.safetensors cut short by an interrupted upload",
         good="model.save_pretrained('artifacts/control-model', safe_serialization=True) and a complete copy"),
    Rule("IV505", Severity.ERROR, "pinned base model not available offline",
         explain=(
             "An adapter can only be verified on its base. The reload looks for the base named in "
             "adapter_config.json, at its pinned revision, in the local Hugging Face cache (--hf-cache, never the "
             "network). When it is not there the adapter is unverified, and unverified is not verified. Download "
             "the base at that revision into a cache (huggingface-cli download ORG/NAME --revision SHA) and "
             "run again with --hf-cache DIR naming it. A reviewer's audit --reload says the same: the archive is "
             "not at fault, and its record is not contradicted by what this machine could not do. Likewise "
             "when the library an artifact's loader needs (diffusers, timm, "
             "sentence-transformers, gguf, onnx) is not installed on the verifying machine: nothing is said "
             "about the artifact, it is not verified; one finding per library names the extra to install "
             "(pip install 'itera-verify[diffusers]') and the artifacts waiting for it."),
         bad="adapter_config.json pins 3f1c…a5b4, the cache holds only snapshots/9e8d…0c1b",
         good="HF cache: models--org--base-model/snapshots/3f1c…a5b4/ with config.json and the weights"),
    Rule("IV507", Severity.ERROR, "resume checkpoint lacks a component",
         explain=(
             "A resume needs the weights, the optimizer state, the LR scheduler state, the RNG states, the step "
             "reached (trainer_state.json / `step`), the position in the data (`data_state`) and, with fp16 mixed "
             "precision, the gradient scaler. The Trainer silently restarts the optimizer or scheduler from "
             "scratch when their file is missing, so the loss of exactness goes unnoticed. Save the full "
             "checkpoint (Trainer: save_only_model=False). Written by several processes, every rank's file "
             "must be there (rng_state_<rank>.pth, random_states_<rank>.pkl, one DeepSpeed optimizer shard per "
             "data-parallel rank), and DeepSpeed's `latest` must name a global_step folder that exists "
             "(DeepSpeed only warns and resumes nothing). A Lightning checkpoint saved with "
             "save_weights_only=True has no optimizer or scheduler state and cannot resume. A file missing from "
             "a Trainer checkpoint-N/ (or a shard its index names) is reported without loading anything, so "
             "--no-reload sees it; the reload then proves that what is there loads."),
         bad=("checkpoint-400/ with model.safetensors, optimizer.pt, trainer_state.json"
              "   # no scheduler.pt, no rng_state.pth"),
         good="checkpoint-400/ with model.safetensors, optimizer.pt, scheduler.pt, rng_state.pth, trainer_state.json"),
    Rule("IV508", Severity.ERROR, "resume checkpoint is inconsistent",
         explain=(
             "The optimizer state must belong to this model at this point of training: no more parameters than "
             "the model trains, each state shaped like one of them (tied weights such as lm_head count once; "
             "frozen parameters have no state), and an AdamW step count equal to trainer_state.json's "
             "global_step (or the `step` of a torch-resume file; an fp16 scaler may have skipped a few). A "
             "mismatch means files from different runs or different moments were mixed. Multi-process "
             "outputs must also agree on the world size: the run's params `world_size`, DeepSpeed's "
             "dp_world_size and the per-rank files; DeepSpeed's fp32 partitions must hold exactly the model's "
             "parameters, and a sharded (DCP) state must fit the model of reload.json's `config`. The Trainer "
             "names checkpoint-N/ after its global_step: a trainer_state.json with another step belongs to "
             "another checkpoint (seen without loading)."),
         bad='trainer_state.json "global_step": 400, optimizer.pt state step 200',
         good='trainer_state.json "global_step": 400, optimizer.pt state step 400'),
    Rule("IV509", Severity.ERROR, "accepted run has no artifact that reloaded",
         explain=(
             "A run accepted as a deliverable must leave at least one artifact that reloads: otherwise nothing "
             "delivered backs its numbers. Reported only when the reloads ran (not with --no-reload)."),
         bad='"accepted": ["lora-r16"]   # its only artifact fails to reload',
         good='"accepted": ["lora-r16"]   # artifacts/lora-r16 reloads on its pinned base'),
]

CODE_FOR_FAILURE = {"base-unavailable": "IV505", "missing-library": "IV505", "missing-component": "IV507",
                    "inconsistent": "IV508"}
# What the verifying machine could not do (a base not in its hub cache, a library not installed): said as such,
# never as a defect of the content (the audit's record comparison leaves these codes out, flows/audit.py).
UNVERIFIED_HERE = {"base-unavailable", "missing-library"}
MACHINE_CODES = ("IV505",)
NOT_REPORTED_HERE = {"no-loader", "skipped"}  # IV510 / IV205 already say why nothing ran


def _problems(result: ReloadResult) -> list[dict]:
    listed = result.facts.get("problems") if isinstance(result.facts, dict) else None
    if isinstance(listed, list) and listed:
        return [p for p in listed if isinstance(p, dict)]
    return [{"failure": result.failure, "message": result.error or "failed", "file": None}]


def _message(result: ReloadResult, problem: dict) -> str:
    failure = problem.get("failure") or "load"
    text = problem.get("message") or "failed"
    if failure == "timeout":
        return f"{result.artifact} ({result.loader}) timed out on {result.device}: {text}"
    if failure == "crash":
        return f"{result.artifact} ({result.loader}) crashed on {result.device}: {text}"
    base = result.facts.get("base") if isinstance(result.facts, dict) else None
    if failure == "base-unavailable" and "hub cache" in text and isinstance(base, str) and "@" in base:
        name, _, revision = base.partition("@")
        pinned = f" --revision {revision}" if revision != "default branch" else ""
        text += (f"; fetch {base} into a hub cache (huggingface-cli download {name}{pinned} --cache-dir DIR) and "
                 "give it with --hf-cache DIR")
    return f"{result.artifact} ({result.loader}): {text}"


def missing_library_findings(ctx: RunContext, runs_by_artifact: dict[str, str | None]) -> Iterator[Finding]:
    """One finding per library the verifying machine lacks (its message names the extra), whatever the number of
    artifacts waiting for it: the fix is one install, not one per artifact."""
    waiting: dict[str, list[str]] = {}
    for result in ctx.reloads or []:
        for problem in ([] if result.ok or result.lot_proof is not None else _problems(result)):
            if problem.get("failure") == "missing-library":
                waiting.setdefault(problem.get("message") or "a library is missing", []).append(result.artifact)
    for message, artifacts in waiting.items():
        runs = {runs_by_artifact.get(a) for a in artifacts}
        yield Finding("IV505", None, message=f"not verified: {message} ({len(artifacts)} artifact(s): "
                                             f"{', '.join(artifacts[:5])})",
                      run=runs.pop() if len(runs) == 1 else None,
                      artifact=artifacts[0] if len(artifacts) == 1 else None)


def failure_findings(ctx: RunContext, runs_by_artifact: dict[str, str | None]) -> Iterator[Finding]:
    seen_statically = resume_facts(ctx)
    yield from missing_library_findings(ctx, runs_by_artifact)
    for result in ctx.reloads or []:
        if result.ok or result.failure in NOT_REPORTED_HERE or result.lot_proof is not None:
            continue  # a lot's signed proof stands for it (flows/partproofs.py): the report says so, not a finding
        for problem in _problems(result):
            if problem.get("failure") == "missing-library":
                continue  # said once for every artifact that needs it, above
            code = CODE_FOR_FAILURE.get(problem.get("failure") or "", "IV504")
            if any(fact.same_as(result.artifact, problem) for fact in seen_statically):
                continue  # the static phase reported this requirement already (same id, format/layouts.py)
            yield Finding(code, problem.get("file") or result.path or None, message=_message(result, problem),
                          run=runs_by_artifact.get(result.artifact), artifact=result.artifact)


def accepted_findings(ctx: RunContext, runs_by_artifact: dict[str, str | None]) -> Iterator[Finding]:
    decision = ctx.documents.manifest.get("decision")
    accepted = decision.get("accepted") if isinstance(decision, dict) else None
    if not isinstance(accepted, list):
        return
    known_runs = {r.get("id") for r in ctx.documents.runs()}
    reloaded = {runs_by_artifact.get(r.artifact) for r in ctx.reloads or [] if r.ok or r.lot_proof is not None}
    # A run whose artifacts this machine could not verify (IV505 says so) is unverified here, not empty-handed.
    unverified = {runs_by_artifact.get(r.artifact) for r in ctx.reloads or []
                  if not r.ok and {p.get("failure") for p in _problems(r)} <= UNVERIFIED_HERE}
    reloaded |= unverified
    for index, run in enumerate(accepted):
        if not isinstance(run, str) or run not in known_runs or run in reloaded:
            continue  # an unknown run id is IV305
        tried = [r.artifact for r in ctx.reloads or [] if runs_by_artifact.get(r.artifact) == run]
        why = f"none of its artifacts reloaded ({', '.join(tried)})" if tried else "it has no artifact at all"
        yield Finding("IV509", MANIFEST, pointer=pointer_of(["decision", "accepted", index]), run=run,
                      message=f"accepted run {run!r} has nothing that reloads: {why}")


def static_findings(ctx: RunContext) -> Iterator[Finding]:
    for fact in resume_facts(ctx):
        yield Finding(fact.code, fact.path, message=fact.message, run=fact.run, artifact=fact.artifact)


def check(ctx: RunContext, phase: str = "reload") -> Iterator[Finding]:
    if phase == "static":
        yield from static_findings(ctx)
        return
    if ctx.reloads is None:
        return  # --no-reload: nothing was proved, nothing to judge
    runs_by_artifact = {a.get("id"): a.get("run") if isinstance(a.get("run"), str) else None
                        for a in ctx.documents.artifacts() if isinstance(a.get("id"), str)}
    yield from failure_findings(ctx, runs_by_artifact)
    yield from accepted_findings(ctx, runs_by_artifact)
