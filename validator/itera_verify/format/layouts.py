"""Checkpoint layouts as data: from the names in a checkpoint folder, which layout it is and which of its
requirements the names do not meet (docs/format.md: multi-GPU training outputs, the resume readings).

One reading for the two halves of IV507/IV508: the static checks (`--no-reload`, the CI gate) call
`trainer_requirements` on the names discovery saw, the reload calls it on the names in the folder it is about to
load, and both report each unmet requirement under its `id`. The reload's report of a requirement the static
phase already reported is recognised by that id (never by message text), so a missing file is said once, and
`--no-reload` sees every missing file the reload sees from names alone. What only the files' contents can tell
(a world size recorded inside DeepSpeed's shards, a step inside an optimizer) stays the reload's.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

MISSING_CODE, INCONSISTENT_CODE = "IV507", "IV508"

CHECKPOINT_FOLDER = re.compile(r"checkpoint-(\d+)")
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json", "adapter_model.safetensors", "adapter_model.bin")
WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
TRAINER_STATE = "trainer_state.json"
GLOBAL_STEP = "progress:global-step"  # trainer_state.json without a usable global_step (read from its content)
RNG_FILE = re.compile(r"rng_state(?:_(\d+))?\.pth")
SINGLE_RNG = "rng_state.pth"
FSDP_MODEL = re.compile(r"pytorch_model_fsdp(?:_(\d+))?")
FSDP_OPTIMIZER = re.compile(r"optimizer(?:_(\d+))?")
SINGLE, DEEPSPEED, FSDP = "single-process", "deepspeed", "fsdp"
CANNOT = "the run cannot resume exactly"

# DeepSpeed's own resume (engine.load_checkpoint, 0.19.8): the tag is `latest`'s text, stripped; the model states
# are globbed in <folder>/<tag>/. The Trainer's deepspeed_load_checkpoint first globs <checkpoint>/global_step*.
LATEST = "latest"
STEP_PREFIX = "global_step"
DS_MODEL_STATES = re.compile(r"(?:zero_pp_rank_(\d+)_)?mp_rank_(\d+)_model_states\.pt")
LATEST_READ = 4096  # bytes of `latest` either side reads: a longer tag cannot name a folder (NAME_MAX is 255)

# A torch-resume file's components (reload/loaders/torch_resume.py proves them) and what each is, in words.
RESUME_KEYS = {"model": "the weights", "optimizer": "the optimizer state", "scheduler": "the LR scheduler state",
               "rng": "the RNG states", "step": "the step reached", "data_state": "the position in the data"}
SCALER_KEY = ("scaler", "the gradient-scaler state (the run used fp16)")


@dataclass(frozen=True)
class Requirement:
    """One unmet requirement: `id` is what both halves report it under; `file` is relative to the folder."""

    id: str
    code: str  # IV507 (missing) or IV508 (inconsistent)
    file: str
    message: str


def detect(files: Iterable[str], dirs: Iterable[str]) -> str:
    """The layout of a Trainer checkpoint folder from the names directly inside it."""
    files, dirs = set(files), set(dirs)
    if "latest" in files or any(d.startswith("global_step") for d in dirs):
        return DEEPSPEED
    if any(FSDP_MODEL.fullmatch(d) for d in dirs):
        return FSDP
    return SINGLE


def ranked(names: Iterable[str], pattern: re.Pattern) -> dict[int, str]:
    """rank -> name for every name matching `pattern` (group 1: the rank; no group: rank 0)."""
    found = {}
    for name in sorted(names):
        match = pattern.fullmatch(name)
        if match:
            found[int(match.group(1) or 0)] = name
    return found


def rank_gaps(ranks: Iterable[int], world_size: int | None) -> tuple[int, list[int], list[int]]:
    """(expected count, missing ranks, extra ranks): ranks must be exactly 0 … world_size-1; without a recorded
    size, contiguous from 0."""
    ranks = set(ranks)
    expected = world_size if world_size is not None else (max(ranks) + 1 if ranks else 0)
    return expected, [r for r in range(expected) if r not in ranks], sorted(r for r in ranks if r >= expected)


def rank_requirements(folder: str, ranks: Iterable[int], world_size: int | None, what: str, id_: str,
                      first_extra: dict[int, str] | None = None,
                      source: str = "the recorded world size") -> list[Requirement]:
    """Missing ranks (IV507) and ranks beyond the world size (IV508) of one kind of per-rank file."""
    ranks = set(ranks)
    if not ranks:
        return []  # the caller reports a component missing whole
    expected, missing, extra = rank_gaps(ranks, world_size)
    out = []
    if missing:
        out.append(Requirement(f"{id_}:missing", MISSING_CODE, "",
                               f"{folder}: no {what} for rank(s) {', '.join(map(str, missing))} of {expected}: "
                               "those processes cannot resume"))
    if extra:
        out.append(Requirement(f"{id_}:extra", INCONSISTENT_CODE, (first_extra or {}).get(extra[0], ""),
                               f"{folder}: {what} for rank(s) {', '.join(map(str, extra))}, but {source} is "
                               f"{world_size}: the world size disagrees"))
    return out


def rng_by_rank(files: Iterable[str]) -> dict[int, str]:
    """rank -> RNG file: the rng_state_<rank>.pth files, else rng_state.pth alone as rank 0, else nothing."""
    files = set(files)
    by_rank = ranked(files - {SINGLE_RNG}, RNG_FILE)
    return by_rank or ({0: SINGLE_RNG} if SINGLE_RNG in files else {})


def rng_requirements(folder: str, files: Iterable[str], world_size: int | None) -> list[Requirement]:
    """rng_state.pth (one process) or rng_state_<rank>.pth for exactly ranks 0 … world_size-1."""
    files = set(files)
    by_rank = ranked(files - {SINGLE_RNG}, RNG_FILE)
    if not by_rank:
        if SINGLE_RNG not in files:
            return [Requirement("rng", MISSING_CODE, SINGLE_RNG,
                                f"no rng_state.pth (or rng_state_<rank>.pth) in {folder}: {CANNOT}")]
        if world_size is not None and world_size > 1:
            return [Requirement("rng:single", MISSING_CODE, SINGLE_RNG,
                                f"{folder} has one rng_state.pth for {world_size} processes: the other ranks' RNG "
                                "states are missing")]
        return []
    return rank_requirements(folder, by_rank, world_size, "RNG state (rng_state_<rank>.pth)", "rng", by_rank)


def fsdp_requirements(folder: str, dirs: Iterable[str]) -> list[Requirement]:
    """Under sharded FSDP every `pytorch_model_fsdp_<i>/` has its `optimizer_<i>/` beside it."""
    dirs = set(dirs)
    models, optimizers = ranked(dirs, FSDP_MODEL), ranked(dirs, FSDP_OPTIMIZER)
    return [Requirement(f"fsdp-optimizer:{index}", MISSING_CODE, f"optimizer_{index}",
                        f"no optimizer_{index}/ beside {models[index]}/ in {folder}: the optimizer cannot resume")
            for index in sorted(set(models) - set(optimizers))]


def trainer_requirements(folder: str, files: Iterable[str], dirs: Iterable[str], *, fp16: bool,
                         world_size: int | None) -> list[Requirement]:
    """Every requirement of a Trainer `checkpoint-N/` that the names inside it do not meet. Under DeepSpeed the
    weights, optimizer and scheduler live in `global_step<N>/`; under sharded FSDP the weights and optimizer in
    `pytorch_model_fsdp_<i>/` and `optimizer_<i>/` (their own loaders prove them)."""
    files, dirs = set(files), set(dirs)
    layout = detect(files, dirs)
    elsewhere = {DEEPSPEED: {"weights", "optimizer", "scheduler"}, FSDP: {"weights", "optimizer"}}.get(layout, set())
    out = []
    if "weights" not in elsewhere and not files & set(WEIGHT_FILES):
        out.append(Requirement("weights", MISSING_CODE, "",
                               f"no model weights (model.safetensors, pytorch_model.bin or adapter_model.safetensors) "
                               f"in {folder}: {CANNOT}"))
    # FSDP with a full state dict saves the optimizer as optimizer.bin (accelerate's save_fsdp_optimizer).
    if "optimizer" not in elsewhere and not files & {"optimizer.pt", "optimizer.bin"}:
        out.append(Requirement("optimizer", MISSING_CODE, "optimizer.pt",
                               f"no optimizer.pt (optimizer.bin under FSDP; the Trainer restarts the optimizer from "
                               f"scratch without it) in {folder}: {CANNOT}"))
    if "scheduler" not in elsewhere and "scheduler.pt" not in files:
        out.append(Requirement("scheduler", MISSING_CODE, "scheduler.pt",
                               f"no scheduler.pt (the Trainer restarts the LR schedule without it) in {folder}: "
                               f"{CANNOT}"))
    if fp16 and "scaler.pt" not in files:
        out.append(Requirement("scaler", MISSING_CODE, "scaler.pt",
                               f"no scaler.pt (the run used fp16 mixed precision) in {folder}: {CANNOT}"))
    if layout == FSDP:
        out.extend(fsdp_requirements(folder, dirs))
    out.extend(rng_requirements(folder, files, world_size))
    if TRAINER_STATE not in files:
        out.append(Requirement("progress", MISSING_CODE, TRAINER_STATE,
                               f"{folder}/{TRAINER_STATE} is missing: no record of progress (global_step)"))
    return out


def index_shard_requirement(folder: str, index: str, weight_map: dict,
                            present: Callable[[str], bool]) -> Requirement | None:
    """The shards a weight index (`model.safetensors.index.json`) names that are not in its folder, as one
    requirement of the index: the static checks of a checkpoint and every loader of a sharded folder report it
    under this id, so a lost shard is said once. Its `file` is the first missing shard."""
    tensors: dict[str, int] = {}
    for shard in weight_map.values():
        if isinstance(shard, str):
            tensors[shard] = tensors.get(shard, 0) + 1
    missing = [shard for shard in sorted(tensors) if not present(shard)]
    if not missing:
        return None
    shown = ", ".join(f"{shard} ({tensors[shard]} tensors)" for shard in missing[:3]) + (
        f" and {len(missing) - 3} more" if len(missing) > 3 else "")
    return Requirement(f"index-shards:{index}", MISSING_CODE, missing[0],
                       f"{index} names {len(missing)} shard(s) that are not in {folder}: {shown}")


def resume_key_requirements(rel: str, keys: Iterable[str], *, fp16: bool) -> list[Requirement]:
    """The components a torch-resume file's top-level dict lacks."""
    keys = set(keys)
    wanted = dict(RESUME_KEYS, **(dict([SCALER_KEY]) if fp16 else {}))
    return [Requirement(f"component:{key}", MISSING_CODE, "",
                        f"{rel} has no `{key}` ({meaning}): {CANNOT}")
            for key, meaning in wanted.items() if key not in keys]


def deepspeed_tag(latest: bytes) -> str:
    """The tag `latest` names, read as engine.load_checkpoint reads it: the text, stripped (a trailing newline is
    fine)."""
    return latest.decode("utf-8", errors="replace").strip()


def deepspeed_requirements(folder: str, files: Iterable[str], dirs: Iterable[str], latest: bytes | None,
                           step_files: Iterable[str], *, trainer: bool) -> list[Requirement]:
    """What DeepSpeed's resume needs before it loads anything, from the names in a DeepSpeed checkpoint folder,
    `latest`'s first LATEST_READ bytes (None: no `latest`) and the names in the folder it names. `trainer`: a Trainer
    checkpoint-N/, which the Trainer's deepspeed_load_checkpoint refuses without a global_step* entry. Each of these
    stops DeepSpeed's own resume (or, for a missing `latest`, makes it load nothing), so the first one is all."""
    files, dirs = set(files), set(dirs)
    if trainer and not any(name.startswith(STEP_PREFIX) for name in files | dirs):
        named = f" (latest names {deepspeed_tag(latest)!r})" if latest is not None else ""
        return [Requirement("deepspeed:global-step", MISSING_CODE, "",
                            f"no {STEP_PREFIX}<N>/ folder in {folder}{named}: the Trainer's deepspeed_load_checkpoint "
                            "finds no DeepSpeed checkpoint there and stops (Can't find a valid checkpoint)")]
    if LATEST not in files or latest is None:
        return [Requirement("deepspeed:latest", MISSING_CODE, LATEST,
                            f"no `latest` in {folder}: DeepSpeed's load_checkpoint has no tag to resume from (it "
                            "warns and loads nothing; the Trainer then stops: failed to resume from checkpoint)")]
    tag = deepspeed_tag(latest)
    if not tag or "/" in tag or "\\" in tag or tag in (".", ".."):
        return [Requirement("deepspeed:tag", MISSING_CODE, LATEST,
                            f"{folder}/{LATEST} holds {tag[:80]!r}, not a checkpoint folder name: DeepSpeed's "
                            "load_checkpoint finds no model states to resume from (AssertionError)")]
    if tag not in dirs:
        return [Requirement("deepspeed:tag", MISSING_CODE, LATEST,
                            f"{folder}/{LATEST} names {tag[:80]}/, which is not in {folder}: DeepSpeed's "
                            "load_checkpoint finds no model states to resume from (AssertionError)")]
    if not any(DS_MODEL_STATES.fullmatch(name) for name in step_files):
        return [Requirement("deepspeed:model-states", MISSING_CODE, tag,
                            f"no mp_rank_00_model_states.pt (zero_pp_rank_<r>_mp_rank_00_model_states.pt under "
                            f"ZeRO-3) in {folder}/{tag}: DeepSpeed's load_checkpoint finds no model states to resume "
                            "from (AssertionError)")]
    return []


# ---- a diffusers pipeline's components (model_index.json) ------------------------------------------------
PIPELINE_INDEX = "model_index.json"


def pipeline_requirements(folder: str, index, dirs: Iterable[str]) -> list[Requirement]:
    """The components `model_index.json` names (`"vae": ["diffusers", "AutoencoderKL"]`) whose folder is not in
    `folder` (`dirs`: the folder names directly inside it). A component saved as `[null, null]` is left out on
    purpose (no safety checker). The diffusers loader reports the same missing folder at its reload."""
    if not isinstance(index, dict):
        return []
    dirs = set(dirs)
    out = []
    for name, value in index.items():
        if name.startswith("_") or not isinstance(value, list) or len(value) != 2 or value == [None, None]:
            continue  # configuration values (requires_safety_checker, ...), optional parts left out
        if "/" in name or name in (".", "..") or name in dirs:
            continue
        out.append(Requirement(f"component:{name}", MISSING_CODE, name,
                               f"component {name} ({value[1]}) named by {PIPELINE_INDEX} is missing: no folder "
                               f"{folder}/{name}"))
    return out


# ---- EMA: a run that averaged its weights resumes the average too ------------------------------------------
# The params a run records when it keeps an exponential moving average of its weights: diffusers' training scripts
# (--use_ema), timm's train.py (--model-ema), a hand-written loop's own name for it.
EMA_PARAMS = ("use_ema", "model_ema", "ema")
# What holds the average in a checkpoint: diffusers' `unet_ema/` (EMAModel.save_pretrained beside the state),
# timm's `state_dict_ema` key, a loop's `ema` / `model_ema` / `ema_state` key or file.
EMA_NAME = re.compile(r"(?:^|[_./-])ema(?:[_./-]|$)|state_dict_ema", re.I)


def ema_run(params) -> bool:
    """The run's params say it trained with EMA."""
    return isinstance(params, dict) and any(params.get(name) is True or isinstance(params.get(name), dict)
                                            for name in EMA_PARAMS)


def ema_requirement(where: str, names: Iterable[str]) -> Requirement | None:
    """IV507 when nothing among `names` (a checkpoint folder's files and folders, or a resume file's top-level
    keys) holds the EMA state."""
    if any(EMA_NAME.search(name) for name in names):
        return None
    return Requirement("ema", MISSING_CODE, "",
                       f"{where} holds no EMA state (unet_ema/, state_dict_ema, ema), but the run trained with EMA "
                       "(params use_ema): a resume would restart the average from the current weights; save the "
                       "EMA model with the checkpoint (EMAModel.save_pretrained, the `ema` key)")
