"""What a resume checkpoint lacks, or contradicts, that can be seen without loading anything (IV507, IV508).

The static half of the resume proofs, so that `--no-reload` (pre-commit, CI) sees a Trainer `checkpoint-N/` with
no optimizer.pt: the files a resume needs, trainer_state.json's global_step against the folder's N, the shards an
index names; a torch-resume file's missing components, from the keys its pickle's opcodes build. Facts only;
rules/reload.py turns them into findings and drops the reload's report of the same fact.
Multi-process layouts (DeepSpeed `latest` / `global_step<N>/`, FSDP `pytorch_model_fsdp_<i>/`) are the reload's:
what they need is decided by the layout, which the loaders recognise (reload/loaders/_trainer_layouts.py).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterator

from ..package import Package
from ..package.campaign import fp16_run
from ._pickle_keys import top_level_keys

TRAINER_LOADER = "hf-trainer-checkpoint"
TORCH_RESUME_LOADER = "torch-resume"
# What the torch-resume loader requires (reload/loaders/torch_resume.py), in its words.
RESUME_KEYS = {"model": "the weights", "optimizer": "the optimizer state", "scheduler": "the LR scheduler state",
               "rng": "the RNG states", "step": "the step reached", "data_state": "the position in the data"}
CHECKPOINT_FOLDER = re.compile(r"checkpoint-(\d+)")
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json", "adapter_model.safetensors", "adapter_model.bin")
WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
RNG_FILE = re.compile(r"rng_state(?:_\d+)?\.pth")
FSDP_MODEL = re.compile(r"pytorch_model_fsdp(?:_\d+)?")


@dataclass(frozen=True)
class ResumeFact:
    code: str  # IV507 (missing) or IV508 (inconsistent)
    path: str  # what the finding points at
    message: str
    artifact: str
    run: str | None
    # The file the reload names when it reports this same fact (None: the reload does not), and a part of its
    # message where one file holds several components (a torch-resume file): the dedupe key.
    reload_file: str | None = None
    reload_detail: str | None = None

    def same_as(self, artifact: str, code: str, problem: dict) -> bool:
        """The reload's `problem` (of `artifact`, reported as `code`) is this fact again."""
        return (self.reload_file is not None and (artifact, code, problem.get("file")) == (
            self.artifact, self.code, self.reload_file)
            and (self.reload_detail is None or self.reload_detail in (problem.get("message") or "")))


def _text(value) -> str | None:
    return value if isinstance(value, str) else None


def _children(package: Package, folder: str) -> tuple[set[str], set[str]]:
    """(file names, folder names) directly inside `folder` (links to files inside the package count as files)."""
    prefix = folder + "/"
    files = {rel[len(prefix):] for rel in package.files if rel.startswith(prefix) and "/" not in rel[len(prefix):]}
    files |= {rel[len(prefix):] for rel in package.links if rel.startswith(prefix)
              and "/" not in rel[len(prefix):] and package.is_file(rel)}
    dirs = {rel[len(prefix):] for rel in package.dirs if rel.startswith(prefix) and "/" not in rel[len(prefix):]}
    return files, dirs


def is_multi_process_layout(files: set[str], dirs: set[str]) -> bool:
    return "latest" in files or any(d.startswith("global_step") for d in dirs) \
        or any(FSDP_MODEL.fullmatch(d) for d in dirs)


def trainer_checkpoint_facts(package: Package, folder: str, artifact: str, run: str | None) -> Iterator[ResumeFact]:
    files, dirs = _children(package, folder)
    if is_multi_process_layout(files, dirs):
        return  # DeepSpeed and FSDP keep weights and optimizer elsewhere: the reload knows the layout
    fact = dict(artifact=artifact, run=run)
    cannot = "the run cannot resume exactly"
    if not any(name in files for name in WEIGHT_FILES):
        yield ResumeFact("IV507", folder, f"no model weights (model.safetensors, pytorch_model.bin or "
                                         f"adapter_model.safetensors) in {folder}: {cannot}", **fact,
                         reload_file=f"{folder}/model")
    yield from _index_shards(package, folder, files, fact)
    # (file, what else serves, meaning): FSDP with a full state dict saves the optimizer as optimizer.bin.
    wanted = [("optimizer.pt", "optimizer.bin", "optimizer.pt (optimizer.bin under FSDP; the Trainer restarts the "
                                                "optimizer from scratch without it)"),
              ("scheduler.pt", None, "scheduler.pt (the Trainer restarts the LR schedule without it)")]
    if fp16_run(package, run):
        wanted.append(("scaler.pt", None, "scaler.pt (the run used fp16 mixed precision)"))
    for name, alternative, meaning in wanted:
        if name not in files and alternative not in files:
            yield ResumeFact("IV507", f"{folder}/{name}", f"no {meaning} in {folder}: {cannot}", **fact,
                             reload_file=f"{folder}/{name}")
    if not any(RNG_FILE.fullmatch(name) for name in files):
        yield ResumeFact("IV507", f"{folder}/rng_state.pth", f"no rng_state.pth (or rng_state_<rank>.pth) in "
                                                             f"{folder}: {cannot}", **fact,
                         reload_file=f"{folder}/rng_state.pth")
    yield from _progress(package, folder, files, fact)


def _index_shards(package: Package, folder: str, files: set[str], fact: dict) -> Iterator[ResumeFact]:
    for index in WEIGHT_INDEXES:
        if index not in files:
            continue
        value = package.json_value(f"{folder}/{index}")
        weight_map = value.get("weight_map") if isinstance(value, dict) else None
        shards = sorted({s for s in weight_map.values() if isinstance(s, str)}) if isinstance(weight_map, dict) else []
        missing = [shard for shard in shards if not package.is_file(f"{folder}/{shard}")]
        if missing:
            shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
            yield ResumeFact("IV507", f"{folder}/{index}", f"{index} names {len(missing)} shard(s) that are not in "
                                                           f"{folder}: {shown}", **fact)


def _progress(package: Package, folder: str, files: set[str], fact: dict) -> Iterator[ResumeFact]:
    """trainer_state.json and its global_step, which the Trainer also wrote into the folder's name."""
    state_rel = f"{folder}/trainer_state.json"
    if "trainer_state.json" not in files:
        yield ResumeFact("IV507", state_rel, f"{state_rel} is missing: no record of progress (global_step)",
                         **fact, reload_file=state_rel)
        return
    document = package.document(state_rel)
    if document is None or not document.ok:
        return  # a document that does not parse is IV104, and the reload's IV504
    state = document.value
    step = state.get("global_step") if isinstance(state, dict) else None
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        yield ResumeFact("IV507", state_rel, f"{state_rel} has no global_step", **fact, reload_file=state_rel)
        return
    named = CHECKPOINT_FOLDER.fullmatch(folder.rsplit("/", 1)[-1])
    if named and int(named.group(1)) != step:
        yield ResumeFact("IV508", state_rel, f"{state_rel} says global_step {step}, but the Trainer named the "
                                             f"folder {named.group(0)} after its step: files from different "
                                             "checkpoints were mixed", **fact)


def torch_resume_facts(package: Package, rel: str, artifact: str, run: str | None) -> Iterator[ResumeFact]:
    """The components a torch-resume file lacks, from the keys of its dict (read, never unpickled)."""
    keys = top_level_keys(package.os_path(rel))
    if keys is None:
        return  # not a zip-format dict the opcodes show: the reload loads it and decides
    wanted = dict(RESUME_KEYS)
    if fp16_run(package, run):
        wanted["scaler"] = "the gradient-scaler state (the run used fp16)"
    for key, meaning in wanted.items():
        if key not in keys:
            yield ResumeFact("IV507", rel, f"{rel} has no `{key}` ({meaning}): the run cannot resume exactly",
                             artifact=artifact, run=run, reload_file=rel, reload_detail=f"has no `{key}`")


def resume_facts(package: Package) -> list[ResumeFact]:
    """Every static resume fact of the package, in manifest order."""
    entries = package.reload_spec.get("artifacts")
    facts: list[ResumeFact] = []
    for artifact in package.artifacts():
        artifact_id, path = _text(artifact.get("id")), _text(artifact.get("path"))
        entry = entries.get(artifact_id) if isinstance(entries, dict) and artifact_id else None
        if not isinstance(entry, dict) or artifact.get("kind") != "resume-checkpoint" or path is None:
            continue
        rel = package.normalise_ref(path)
        if rel is None:
            continue  # IV205
        run = _text(artifact.get("run"))
        if entry.get("loader") == TRAINER_LOADER and rel in package.dirs:
            facts.extend(trainer_checkpoint_facts(package, rel, artifact_id, run))
        elif entry.get("loader") == TORCH_RESUME_LOADER and package.is_file(rel):
            facts.extend(torch_resume_facts(package, rel, artifact_id, run))
    return facts
