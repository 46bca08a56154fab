"""What a resume checkpoint lacks, or contradicts, that can be seen without loading anything (IV507, IV508).

The static half of the resume proofs, so that `--no-reload` (pre-commit, CI) sees a Trainer `checkpoint-N/` with
no optimizer.pt: the files a resume needs, trainer_state.json's global_step against the folder's N, the shards an
index names; a torch-resume file's missing components, from the keys its pickle's opcodes build. Facts only;
rules/reload.py turns them into findings and drops the reload's report of the same requirement (by its id).
Which files a layout needs (single-process, DeepSpeed, FSDP; one RNG file per rank of the recorded world size) is
format/layouts.py's, read by the loaders alike; what only the contents tell (DeepSpeed's partitions) is the reload's.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

from ..package import RunContext
from ..format import layouts
from ..format.layouts import GLOBAL_STEP
from ..package.campaign import fp16_run, recorded_world_size, run_params
from ..package.pickle_state import top_level_keys

TRAINER_LOADER = "hf-trainer-checkpoint"
TORCH_RESUME_LOADER = "torch-resume"
DEEPSPEED_LOADER = "deepspeed-checkpoint"


@dataclass(frozen=True)
class ResumeFact:
    code: str  # IV507 (missing) or IV508 (inconsistent)
    path: str  # what the finding points at
    message: str
    artifact: str
    run: str | None
    # The requirement's id (format/layouts.py) when the reload reports the same fact under it: the dedupe key.
    requirement: str | None = None
    # A reload that names no requirement id reports the same fact at this file (a pipeline's missing component).
    reported_at: str | None = None

    def same_as(self, artifact: str, problem: dict) -> bool:
        """The reload's `problem` of `artifact` is this fact again."""
        if artifact != self.artifact:
            return False
        if self.reported_at is not None and problem.get("file") == self.reported_at:
            return problem.get("failure") == "missing-component"
        return self.requirement is not None and problem.get("requirement") == self.requirement


def _text(value) -> str | None:
    return value if isinstance(value, str) else None


def _children(ctx: RunContext, folder: str) -> tuple[set[str], set[str]]:
    """(file names, folder names) directly inside `folder` (links to files inside the package count as files)."""
    prefix = folder + "/"
    files = {rel[len(prefix):] for rel in ctx.inventory.files
             if rel.startswith(prefix) and "/" not in rel[len(prefix):]}
    files |= {rel[len(prefix):] for rel in ctx.inventory.links if rel.startswith(prefix)
              and "/" not in rel[len(prefix):] and ctx.inventory.is_file(rel)}
    dirs = {rel[len(prefix):] for rel in ctx.inventory.dirs if rel.startswith(prefix) and "/" not in rel[len(prefix):]}
    return files, dirs


def trainer_checkpoint_facts(ctx: RunContext, folder: str, artifact: str, run: str | None) -> Iterator[ResumeFact]:
    files, dirs = _children(ctx, folder)
    fact = dict(artifact=artifact, run=run)
    for need in layouts.trainer_requirements(folder, files, dirs, fp16=fp16_run(ctx, run),
                                             world_size=recorded_world_size(ctx, run)):
        yield ResumeFact(need.code, f"{folder}/{need.file}" if need.file else folder, need.message, **fact,
                         requirement=need.id)
    layout = layouts.detect(files, dirs)
    if layout == layouts.SINGLE:
        yield from _index_shards(ctx, folder, files, fact)
    elif layout == layouts.DEEPSPEED:
        yield from deepspeed_facts(ctx, folder, artifact, run, trainer=True)
    if layouts.TRAINER_STATE in files:
        yield from _progress(ctx, folder, fact)


def deepspeed_facts(ctx: RunContext, folder: str, artifact: str, run: str | None, *,
                    trainer: bool) -> Iterator[ResumeFact]:
    """What DeepSpeed's own resume needs before loading (format/layouts.py): `latest`, the folder it names, the
    model states there, and under the Trainer a global_step* entry."""
    files, dirs = _children(ctx, folder)
    latest = None
    if layouts.LATEST in files:
        try:
            with ctx.documents.open(f"{folder}/{layouts.LATEST}") as stream:
                latest = stream.read(layouts.LATEST_READ)
        except OSError:
            return  # unreadable: the reload reports what it cannot read
    tag = layouts.deepspeed_tag(latest) if latest is not None else ""
    step_files = _children(ctx, f"{folder}/{tag}")[0] if tag and tag in dirs else set()
    for need in layouts.deepspeed_requirements(folder, files, dirs, latest, step_files, trainer=trainer):
        yield ResumeFact(need.code, f"{folder}/{need.file}" if need.file else folder, need.message,
                         artifact=artifact, run=run, requirement=need.id)


def _index_shards(ctx: RunContext, folder: str, files: set[str], fact: dict) -> Iterator[ResumeFact]:
    for index in layouts.WEIGHT_INDEXES:
        if index not in files:
            continue
        value = ctx.documents.json_value(f"{folder}/{index}")
        weight_map = value.get("weight_map") if isinstance(value, dict) else None
        need = layouts.index_shard_requirement(folder, index, weight_map, lambda shard: ctx.inventory.is_file(
            f"{folder}/{shard}")) if isinstance(weight_map, dict) else None
        if need is not None:
            yield ResumeFact(need.code, f"{folder}/{index}", need.message, **fact, requirement=need.id)


def _progress(ctx: RunContext, folder: str, fact: dict) -> Iterator[ResumeFact]:
    """trainer_state.json's global_step, which the Trainer also wrote into the folder's name."""
    state_rel = f"{folder}/{layouts.TRAINER_STATE}"
    document = ctx.documents.document(state_rel)
    if document is None or not document.ok:
        return  # a document that does not parse is IV104, and the reload's IV504
    state = document.value
    step = state.get("global_step") if isinstance(state, dict) else None
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        yield ResumeFact("IV507", state_rel, f"{state_rel} has no global_step", **fact,
                         requirement=GLOBAL_STEP)
        return
    named = layouts.CHECKPOINT_FOLDER.fullmatch(folder.rsplit("/", 1)[-1])
    if named and int(named.group(1)) != step:
        yield ResumeFact("IV508", state_rel, f"{state_rel} says global_step {step}, but the Trainer named the "
                                             f"folder {named.group(0)} after its step: files from different "
                                             "checkpoints were mixed", **fact)


def torch_resume_facts(ctx: RunContext, rel: str, artifact: str, run: str | None) -> Iterator[ResumeFact]:
    """The components a torch-resume file lacks, from the keys of its dict (read, never unpickled)."""
    try:
        with ctx.documents.open(rel) as stream:
            keys = top_level_keys(stream)
    except OSError:
        keys = None  # unreadable: the reload reports what it cannot read
    if keys is None:
        return  # not a zip-format dict the opcodes show: the reload loads it and decides
    for need in layouts.resume_key_requirements(rel, keys, fp16=fp16_run(ctx, run)):
        yield ResumeFact(need.code, rel, need.message, artifact=artifact, run=run, requirement=need.id)


def pipeline_facts(ctx: RunContext, folder: str, artifact: str, run: str | None) -> Iterator[ResumeFact]:
    """The components a diffusers pipeline's model_index.json names and the folder lacks (format/layouts.py)."""
    files, dirs = _children(ctx, folder)
    if layouts.PIPELINE_INDEX not in files:
        return  # the loader says it is no pipeline
    index = ctx.documents.json_value(f"{folder}/{layouts.PIPELINE_INDEX}")
    for need in layouts.pipeline_requirements(folder, index, dirs):
        yield ResumeFact(need.code, f"{folder}/{layouts.PIPELINE_INDEX}", need.message, artifact=artifact, run=run,
                         requirement=need.id, reported_at=f"{folder}/{need.file}")


def ema_facts(ctx: RunContext, rel: str, artifact: str, run: str | None) -> Iterator[ResumeFact]:
    """A run trained with EMA (its params) whose resume checkpoint holds no EMA state."""
    if not layouts.ema_run(run_params(ctx, run)):
        return
    if rel in ctx.inventory.dirs:
        names = [path[len(rel) + 1:] for path in ctx.inventory.files_under(rel) if path.startswith(rel + "/")]
    else:
        try:
            with ctx.documents.open(rel) as stream:
                names = top_level_keys(stream)
        except OSError:
            names = None
        if names is None:
            return  # not a dict the opcodes show: nothing to tell from here
    need = layouts.ema_requirement(rel, names)
    if need is not None:
        yield ResumeFact(need.code, rel, need.message, artifact=artifact, run=run, requirement=need.id)


def resume_facts(ctx: RunContext) -> list[ResumeFact]:
    """Every static resume fact of the package, in manifest order (and a diffusers pipeline's missing
    components, which the names show as they show a checkpoint's)."""
    entries = ctx.documents.reload_spec.get("artifacts")
    facts: list[ResumeFact] = []
    for artifact in ctx.documents.artifacts():
        artifact_id, path = _text(artifact.get("id")), _text(artifact.get("path"))
        entry = entries.get(artifact_id) if isinstance(entries, dict) and artifact_id else None
        rel = ctx.inventory.normalise_ref(path) if path is not None else None
        run = _text(artifact.get("run"))
        if isinstance(entry, dict) and entry.get("loader") == "diffusers" and rel in ctx.inventory.dirs:
            facts.extend(pipeline_facts(ctx, rel, artifact_id, run))
        if not isinstance(entry, dict) or artifact.get("kind") != "resume-checkpoint" or rel is None:
            continue  # (a path leaving the package is IV205)
        if ctx.inventory.exists(rel):
            facts.extend(ema_facts(ctx, rel, artifact_id, run))
        if entry.get("loader") == TRAINER_LOADER and rel in ctx.inventory.dirs:
            facts.extend(trainer_checkpoint_facts(ctx, rel, artifact_id, run))
        elif entry.get("loader") == TORCH_RESUME_LOADER and ctx.inventory.is_file(rel):
            facts.extend(torch_resume_facts(ctx, rel, artifact_id, run))
        elif entry.get("loader") == DEEPSPEED_LOADER and rel in ctx.inventory.dirs:
            facts.extend(deepspeed_facts(ctx, rel, artifact_id, run, trainer=False))
    return facts
