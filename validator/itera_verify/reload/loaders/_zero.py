"""DeepSpeed ZeRO checkpoints (stages 1, 2, 3): `latest` names `global_step<N>/`, which holds the model states
and one optimizer shard per data-parallel rank. Shared by `deepspeed-checkpoint` and by a Trainer checkpoint
written under DeepSpeed.

What DeepSpeed's load_checkpoint reads before loading (`latest`, the folder its tag names, the model states
there; the Trainer's global_step* glob) is format/layouts.py's, shared with the static checks; without `latest` it
only warns and loads nothing, and its zero_to_fp32.py finds a missing shard only by counting files: here each
proof is made, file by file, and each failure named. The flat
fp32 partitions must hold exactly the parameters param_shapes lists (the arithmetic of zero_to_fp32.py:
stage 1-2 partitions aligned to 2 × dp_world_size, stage 3 each parameter padded to a multiple of it).
Under tensor parallelism (AutoTP: `mp_rank_01_model_states.pt`, ...) each model-parallel rank holds its own model
states and optimizer shards: every rank 0 … mp_world_size-1 is proven the same way, and the run's world size is
dp_world_size × mp_world_size. Under pipeline parallelism each stage is such a rank, and its weights are in
layer files (_pipeline.py).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..common import (
    INCONSISTENT,
    LOAD,
    MISSING,
    Outcome,
    Stop,
    nonfinite_count,
    safe_torch_load,
)
from ...format import layouts
from . import _pipeline, _ranks, _resume

MODEL_STATES = layouts.DS_MODEL_STATES
BF16_OPTIMIZER = {"base_optimizer_state", "single_partition_of_fp32_groups", "group_paddings", "partition_count"}
OPTIMIZER_SHARD = re.compile(r"(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt")


@dataclass
class ZeroFacts:
    folder: Path
    dp_world_size: int | None = None
    mp_world_size: int | None = None
    global_steps: int | None = None
    skipped_steps: int = 0
    param_shapes: list = field(default_factory=list)  # one {name: shape} per parameter group
    stage: int | None = None
    flat_numel: list = field(default_factory=list)  # per rank, per group: numel of its fp32 partition
    alignment_paddings: list | None = None
    optimizer_steps: list[float] = field(default_factory=list)
    engine_optimizer: object = None  # without ZeRO (stage 0) the optimizer state is in the model states
    warmup_steps: int = 0  # DeepSpeed's fp16/bf16 wrappers step the optimizer once at start-up
    configured_stage: int | None = None  # zero_optimization.stage of the ds_config the model states carry
    bf16_optimizer: bool = False  # shards of DeepSpeed's BF16_Optimizer (no zero_stage; partitioned like ZeRO-1)
    pipeline: bool = False  # pipeline parallelism: the weights are in layer files (_pipeline.py)
    pipeline_slices: int = 1  # tensor slices per layer
    pipeline_layers: set[int] = field(default_factory=set)  # the layer indexes this rank's parameters claim
    pipeline_tied: dict = field(default_factory=dict)  # its tied parameters: name -> (shape, its slice)


def step_folder(folder: Path, outcome: Outcome, trainer: bool = False) -> Path | None:
    """The folder `latest` names, when DeepSpeed's own resume would find it (format/layouts.py, the reading the
    static checks share: each unmet requirement is reported under its id); None otherwise."""
    files = {p.name for p in folder.iterdir() if p.is_file()}
    dirs = {p.name for p in folder.iterdir() if p.is_dir()}
    latest = None
    if layouts.LATEST in files:
        with open(folder / layouts.LATEST, "rb") as stream:
            latest = stream.read(layouts.LATEST_READ)
    tag = layouts.deepspeed_tag(latest) if latest is not None else ""
    step_files = [p.name for p in (folder / tag).iterdir()] if tag and tag in dirs else []
    unmet = layouts.deepspeed_requirements(outcome.rel(folder), files, dirs, latest, step_files, trainer=trainer)
    for need in unmet:
        outcome.unmet(need, folder)
    if unmet:
        return None
    outcome.facts["latest"] = tag
    return folder / tag


def _int(value) -> int | None:
    value = value.item() if hasattr(value, "item") and getattr(value, "numel", lambda: 0)() == 1 else value
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def model_parallel_ranks(step_dir: Path) -> dict[int, Path]:
    """mp rank -> its first model states file (rank 0 of its data-parallel group)."""
    found: dict[int, Path] = {}
    for path in sorted(step_dir.iterdir()):
        match = MODEL_STATES.fullmatch(path.name)
        if match and (int(match.group(1) or 0) == 0):
            found.setdefault(int(match.group(2)), path)
    return found


def read_model_states(step_dir: Path, device, outcome: Outcome, facts: ZeroFacts, mp: int = 0,
                      layers: _pipeline.LayerFiles | None = None) -> None:
    """Model-parallel rank `mp`'s model states; `layers`: the step folder's pipeline layer files, if any."""
    files = {}
    for path in sorted(step_dir.iterdir()):
        match = MODEL_STATES.fullmatch(path.name)
        if match and int(match.group(2)) == mp:
            files[(int(match.group(1) or 0), mp)] = path
    if not files:
        raise Stop(MISSING, f"no mp_rank_{mp:02d}_model_states.pt (or zero_pp_rank_<r>_mp_rank_{mp:02d}_model_"
                            f"states.pt) in {outcome.rel(step_dir)}", step_dir)
    first = files[min(files)]
    states = safe_torch_load(first, outcome, device)
    if not isinstance(states, dict) or "module" not in states:
        raise Stop(LOAD, f"{outcome.rel(first)} is not DeepSpeed model states (no `module`)", first)
    facts.dp_world_size, facts.global_steps = _int(states.get("dp_world_size")), _int(states.get("global_steps"))
    facts.mp_world_size = _int(states.get("mp_world_size"))
    facts.skipped_steps = _int(states.get("skipped_steps")) or 0
    shapes = states.get("param_shapes")
    facts.param_shapes = [dict(g) for g in shapes] if isinstance(shapes, list) else [dict(shapes or {})]
    outcome.facts.update(dp_world_size=facts.dp_world_size, global_steps=facts.global_steps,
                         parameters=sum(math.prod(s) for g in facts.param_shapes for s in g.values()))
    facts.engine_optimizer = states.get("optimizer")
    config = states.get("ds_config")
    zero = config.get("zero_optimization") if isinstance(config, dict) else None
    facts.configured_stage = _int(zero.get("stage")) if isinstance(zero, dict) else None
    dimensions = states.get("checkpoint_parallel_dimensions")
    dimensions = dimensions if isinstance(dimensions, dict) else {}
    layers, stages = layers or {}, _int(dimensions.get("pp_degree"))
    if _pipeline.is_pipeline(states["module"], layers, stages):
        facts.pipeline = True
        facts.pipeline_slices = _pipeline.slice_count(_int(dimensions.get("tp_degree")), layers)
        outcome.facts["pipeline_stages"] = stages
        facts.pipeline_layers, facts.pipeline_tied = _pipeline.check_stage_layers(
            step_dir, layers, facts.pipeline_slices, facts.param_shapes, states.get("buffer_names"), mp, device,
            outcome, first)
    else:
        check_module(states["module"], facts, outcome, first)
    check_lr_scheduler(states.get("lr_scheduler"), facts, outcome, first)
    zero3_ranks = {dp: path for (dp, _mp), path in files.items() if MODEL_STATES.fullmatch(path.name).group(1)}
    if zero3_ranks:  # ZeRO-3: one model states file per data-parallel rank
        _ranks.check_ranks(zero3_ranks, facts.dp_world_size, "model states", outcome, step_dir,
                           "the model states' dp_world_size")
        for _, path in sorted(zero3_ranks.items()):
            if path != first:
                other = safe_torch_load(path, outcome, device)
                if isinstance(other, dict) and _int(other.get("global_steps")) != facts.global_steps:
                    outcome.fail(INCONSISTENT, f"{outcome.rel(path)} is at global step {other.get('global_steps')}, "
                                               f"rank 0 at {facts.global_steps}", path)


def check_module(module, facts: ZeroFacts, outcome: Outcome, file: Path) -> None:
    """Module weights finite; under ZeRO-3 they are empty by design (the values live in the fp32 partitions)."""
    import torch

    if not isinstance(module, dict):
        raise Stop(LOAD, f"{outcome.rel(file)}: `module` is not a state dict", file)
    shapes = {name: tuple(shape) for group in facts.param_shapes for name, shape in group.items()}
    bad, wrong = [], []
    for name, tensor in module.items():
        if not torch.is_tensor(tensor) or tensor.numel() == 0:
            continue
        if nonfinite_count(tensor):
            bad.append(name)
        elif name in shapes and tuple(tensor.shape) != shapes[name]:
            wrong.append(f"{name} {list(tensor.shape)} (param_shapes: {list(shapes[name])})")
    if bad:
        outcome.fail(LOAD, f"{outcome.rel(file)}: non-finite weights in {', '.join(bad[:5])}", file)
    if wrong:
        outcome.fail(INCONSISTENT, f"{outcome.rel(file)}: weights shaped unlike param_shapes: {', '.join(wrong[:3])}",
                     file)


def check_lr_scheduler(state, facts: ZeroFacts, outcome: Outcome, file: Path) -> None:
    """DeepSpeed's own schedulers count last_batch_iteration from 0; a torch scheduler's last_epoch from 1."""
    if not isinstance(state, dict) or facts.global_steps is None:
        return
    if isinstance(state.get("last_batch_iteration"), int):
        steps = state["last_batch_iteration"] + 1
    elif isinstance(state.get("last_epoch"), int):
        steps = state["last_epoch"]
    else:
        return
    outcome.facts["scheduler_steps"] = steps
    if steps != facts.global_steps:
        outcome.fail(INCONSISTENT, f"{outcome.rel(file)}: the LR scheduler has stepped {steps} time(s), the engine "
                                   f"{facts.global_steps} (global_steps)", file)


def read_optimizer_shard(path: Path, device, outcome: Outcome, facts: ZeroFacts) -> None:
    import torch

    data = safe_torch_load(path, outcome, device)
    state = data.get("optimizer_state_dict") if isinstance(data, dict) else None
    if (isinstance(state, dict) and "zero_stage" not in state and BF16_OPTIMIZER <= set(state)
            and isinstance(state["group_paddings"], list)):
        facts.bf16_optimizer = True  # bf16 with fp32 gradient accumulation, or a bf16 pipeline: ZeRO-1 partitions
        state = dict(state, zero_stage=1, param_alignment_paddings=[[p] for p in state["group_paddings"]])
    if not isinstance(state, dict) or "zero_stage" not in state:
        raise Stop(LOAD, f"{outcome.rel(path)} is not a ZeRO optimizer shard (no optimizer_state_dict.zero_stage)",
                   path)
    stage = int(state["zero_stage"])
    if facts.stage is not None and stage != facts.stage:
        raise Stop(INCONSISTENT, f"{outcome.rel(path)} is ZeRO stage {stage}, another shard stage {facts.stage}", path)
    facts.stage = stage
    flat = state.get("fp32_flat_groups" if stage == 3 else "single_partition_of_fp32_groups")
    base = state.get("optimizer_state_dict" if stage == 3 else "base_optimizer_state")
    if not isinstance(flat, list) or not all(torch.is_tensor(t) for t in flat) or not isinstance(base, dict):
        raise Stop(LOAD, f"{outcome.rel(path)}: no fp32 partitions or base optimizer state for stage {stage}", path)
    for index, partition in enumerate(flat):
        if nonfinite_count(partition):
            raise Stop(LOAD, f"{outcome.rel(path)}: non-finite values in fp32 partition {index}", path)
    facts.flat_numel.append([t.numel() for t in flat])
    if facts.alignment_paddings is None and isinstance(state.get("param_alignment_paddings"), list):
        facts.alignment_paddings = state["param_alignment_paddings"]
    summary = _resume.summarise_optimizer(base, outcome, path)
    facts.optimizer_steps += summary.steps


def _aligned(numel: int, align: int) -> int:
    """zero_to_fp32.py aligns both sides to 2 × world size before comparing them (ZeRO 1-2 padding)."""
    return align * math.ceil(numel / align)


def check_engine_optimizer(facts: ZeroFacts, outcome: Outcome, step_dir: Path) -> None:
    """Stage 0: the optimizer's own state dict (an fp16/bf16 wrapper keeps it under optimizer_state_dict, with its
    fp32 master copies), saved once in the model states."""
    import torch

    state = facts.engine_optimizer
    base = state.get("optimizer_state_dict", state) if isinstance(state.get("optimizer_state_dict"), dict) else state
    masters = state.get("fp32_groups") or state.get("fp32_groups_flat") or []
    for group in masters if isinstance(masters, list) else []:
        for tensor in group if isinstance(group, list) else [group]:
            if torch.is_tensor(tensor) and nonfinite_count(tensor):
                raise Stop(LOAD, f"{outcome.rel(step_dir)}: non-finite values in the fp32 master weights", step_dir)
    facts.stage = 0
    if base is not state:  # FP16_Optimizer / FP16_UnfusedOptimizer.initialize_optimizer_states: one zero step
        facts.warmup_steps = 1
    facts.optimizer_steps += _resume.summarise_optimizer(base, outcome, step_dir).steps


def check_partitions(facts: ZeroFacts, outcome: Outcome, step_dir: Path) -> None:
    """The fp32 partitions of all ranks together hold exactly the parameters param_shapes lists."""
    world, groups = len(facts.flat_numel), facts.param_shapes
    if not world or facts.stage is None or not groups:
        return  # no partitions, or model states that did not load (already a failure): nothing to compare
    if any(len(per_rank) != len(groups) for per_rank in facts.flat_numel):
        raise Stop(INCONSISTENT, f"{outcome.rel(step_dir)}: {len(groups)} parameter group(s) in param_shapes, "
                                 f"{sorted({len(p) for p in facts.flat_numel})} fp32 partition(s) per shard", step_dir)
    for index, shapes in enumerate(groups):
        numels = [math.prod(shape) for shape in shapes.values()]
        held = sum(per_rank[index] for per_rank in facts.flat_numel)
        if facts.stage == 3:
            wanted = world * sum(math.ceil(n / world) for n in numels)  # each parameter padded to the world
            fits = wanted == held and len({p[index] for p in facts.flat_numel}) == 1
        else:
            paddings = facts.alignment_paddings[index] if facts.alignment_paddings else []
            wanted = sum(numels) + sum(p for p in paddings if isinstance(p, int))
            fits = _aligned(wanted, 2 * world) == _aligned(held, 2 * world)
        outcome.facts.setdefault("fp32_partition_numel", []).append(held)
        if not fits:
            raise Stop(INCONSISTENT, f"{outcome.rel(step_dir)}: the fp32 partitions of group {index} hold {held} "
                                     f"values over {world} rank(s), the model's {len(numels)} parameters need "
                                     f"{wanted}: a shard belongs to another model or another world size", step_dir)


def check_zero_checkpoint(folder: Path, job: dict, device, outcome: Outcome, expected_step: int | None = None,
                          against: str = "", trainer: bool = False) -> ZeroFacts | None:
    """Every proof of a DeepSpeed folder, for every model-parallel rank; problems are recorded, the facts of mp
    rank 0 returned (None without a step folder). `trainer`: a Trainer checkpoint-N/ (its resume also globs
    global_step*)."""
    step_dir = step_folder(folder, outcome, trainer)
    if step_dir is None:
        return None
    layers = _pipeline.layer_files(step_dir)
    facts = _check_model_parallel_rank(step_dir, 0, job, device, outcome, expected_step, against, layers)
    present, stages = model_parallel_ranks(step_dir), [facts]
    if (facts.mp_world_size or 1) > 1 or len(present) > 1:
        outcome.facts["mp_world_size"] = facts.mp_world_size
        what = "pipeline-stage model states" if facts.pipeline else "tensor-parallel model states"
        _ranks.check_ranks(present, facts.mp_world_size, what, outcome, step_dir, "the model states' mp_world_size")
        for mp in sorted(present)[1:]:
            # Its own outcome: its facts would overwrite rank 0's; its problems name its own files.
            own = Outcome(outcome.job)
            other = _check_model_parallel_rank(step_dir, mp, job, device, own, expected_step, against, layers)
            stages.append(other)
            outcome.problems += [p for p in own.problems if p not in outcome.problems]  # a world size said once
            if not own.problems and other.global_steps != facts.global_steps:
                outcome.fail(INCONSISTENT, f"{outcome.rel(present[mp])} is at global step {other.global_steps}, "
                                           f"model-parallel rank 0 at {facts.global_steps}", present[mp])
    if any(stage.pipeline for stage in stages):
        claimed = set().union(*(stage.pipeline_layers for stage in stages))
        tied: dict[str, set] = {}
        for stage in stages:
            for name, wanted in stage.pipeline_tied.items():
                tied.setdefault(name, set()).add(wanted)
        slices = max(stage.pipeline_slices for stage in stages if stage.pipeline)
        _resume.attempt(outcome, _pipeline.check_tied_modules, step_dir, layers, claimed, tied, slices, device,
                        outcome)
    return facts


def _check_model_parallel_rank(step_dir: Path, mp: int, job: dict, device, outcome: Outcome,
                               expected_step: int | None, against: str, layers: _pipeline.LayerFiles) -> ZeroFacts:
    facts = ZeroFacts(step_dir)
    _resume.attempt(outcome, read_model_states, step_dir, device, outcome, facts, mp, layers)
    shards = {}
    for path in sorted(step_dir.iterdir()):
        match = OPTIMIZER_SHARD.fullmatch(path.name)
        if match and int(match.group(2)) == mp:
            shards[int(match.group(1))] = path
    if not shards and isinstance(facts.engine_optimizer, dict):
        _resume.attempt(outcome, check_engine_optimizer, facts, outcome, step_dir)
    elif not shards:
        outcome.fail(MISSING, f"no zero_pp_rank_<r>_mp_rank_{mp:02d}_optim_states.pt in {outcome.rel(step_dir)}: "
                              "the optimizer cannot resume", step_dir)
    model_parallel = facts.mp_world_size or 1
    recorded = {"the run's params record world_size": job.get("world_size")}
    if model_parallel == 1:
        recorded["the model states record dp_world_size"] = facts.dp_world_size
    else:
        recorded[f"the model states record dp_world_size × mp_world_size ({facts.dp_world_size} × "
                 f"{model_parallel})"] = None if facts.dp_world_size is None else facts.dp_world_size * model_parallel
    world = _ranks.settle_world_size(recorded, outcome, step_dir)
    data_parallel = facts.dp_world_size if world is None or world % model_parallel else world // model_parallel
    _ranks.check_ranks(shards, data_parallel, "optimizer shard", outcome, step_dir, "the recorded world size")
    for path in shards.values():
        _resume.attempt(outcome, read_optimizer_shard, path, device, outcome, facts)
    outcome.facts["zero_stage"] = facts.stage
    unresumable = facts.bf16_optimizer and facts.configured_stage == 0
    if facts.bf16_optimizer:
        outcome.facts["optimizer"] = "BF16_Optimizer"
        if unresumable:  # said once, by cause: its shards have no param_shapes to be compared with either
            outcome.fail(LOAD, f"{outcome.rel(step_dir)}: DeepSpeed's BF16_Optimizer wrote these optimizer shards "
                               "without ZeRO (zero_optimization.stage 0), and DeepSpeed's load_checkpoint cannot "
                               "resume from them (0.19.8: KeyError 0 in BF16_Optimizer._load_legacy_checkpoint): "
                               "train bf16 with zero_optimization.stage 1", step_dir)
    if len(facts.flat_numel) == len(shards) and (data_parallel is None or len(shards) == data_parallel) \
            and not unresumable:
        _resume.attempt(outcome, check_partitions, facts, outcome, step_dir)
    if facts.optimizer_steps and facts.global_steps is not None:
        step = int(max(facts.optimizer_steps))
        outcome.facts["optimizer_step"] = step
        if step != facts.global_steps - facts.skipped_steps + facts.warmup_steps:
            outcome.fail(INCONSISTENT, f"{outcome.rel(step_dir)}: the optimizer has taken {step} step(s), the engine "
                                       f"{facts.global_steps} (global_steps, {facts.skipped_steps} skipped)", step_dir)
    if expected_step is not None and facts.global_steps is not None and facts.global_steps != expected_step:
        outcome.fail(INCONSISTENT, f"{outcome.rel(step_dir)}: DeepSpeed's global_steps is {facts.global_steps} "
                                   f"but {against} is {expected_step}", step_dir)
    return facts
