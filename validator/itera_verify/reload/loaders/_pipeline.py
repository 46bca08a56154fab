"""DeepSpeed pipeline parallelism (a PipelineModule under the PipelineEngine): the model states of each stage
hold `module: None`; the weights are saved layer by layer, `layer_<NN>-model_states.pt` (with tensor slicing
inside a stage, `layer_<NN>-model_<MM>-model_states.pt`), by data-parallel rank 0 of each stage. Each stage is a
model-parallel rank of its own (`mp_rank_<stage>_model_states.pt`), so the rest of the ZeRO proofs run per stage.

What each stage's param_shapes lists must be in the layer files: `<N>.<name>` in `layer_<N>`'s state dict with
that shape; a tied module (`tied_modules.<key>.<name>`, saved once, by the layer that owns it) in a layer file
no numbered parameter claims. Without ZeRO no param_shapes are saved: every layer file present is still loaded
and proven finite (check_tied_modules reads each file no stage claims), but a missing one cannot be told.
DeepSpeed's own load_state_dir globs the layer files and fails only on the first
layer it cannot find, after it has built the whole model.
"""
from __future__ import annotations

import re
from pathlib import Path

from ..common import INCONSISTENT, LOAD, MISSING, Outcome, nonfinite_count, safe_torch_load

LAYER_FILE = re.compile(r"layer_(\d+)(?:-model_(\d+))?-model_states\.pt")
TIED = "tied_modules."


def layer_files(step_dir: Path) -> dict[int, dict[int, Path]]:
    """layer index -> tensor slice (0 without slicing) -> file."""
    found: dict[int, dict[int, Path]] = {}
    for path in sorted(step_dir.iterdir()):
        match = LAYER_FILE.fullmatch(path.name)
        if match:
            found.setdefault(int(match.group(1)), {})[int(match.group(2) or 0)] = path
    return found


def is_pipeline(states: dict, step_dir: Path) -> bool:
    """Model states whose module lives in layer files: `module` None and layer files beside them."""
    return states.get("module") is None and bool(layer_files(step_dir))


def _claimed(param_shapes: list[dict]) -> tuple[dict[int, dict[str, tuple]], dict[str, tuple]]:
    """(layer index -> {name inside the layer: shape}, {tied parameter: shape}) from one stage's param_shapes."""
    layers: dict[int, dict[str, tuple]] = {}
    tied: dict[str, tuple] = {}
    for group in param_shapes:
        for name, shape in group.items():
            head, _, rest = name.partition(".")
            if name.startswith(TIED):
                tied[name] = tuple(shape)
            elif head.isdigit() and rest:
                layers.setdefault(int(head), {})[rest] = tuple(shape)
    return layers, tied


def _read_layer(path: Path, device, outcome: Outcome) -> dict | None:
    state = safe_torch_load(path, outcome, device)
    if not isinstance(state, dict):
        outcome.fail(LOAD, f"{outcome.rel(path)} is not a layer's state dict", path)
        return None
    bad = [name for name, tensor in state.items() if hasattr(tensor, "numel") and tensor.numel()
           and nonfinite_count(tensor)]
    if bad:
        outcome.fail(LOAD, f"{outcome.rel(path)}: non-finite weights in {', '.join(map(str, bad[:5]))}", path)
    return state


def check_stage_layers(step_dir: Path, param_shapes: list[dict], device, outcome: Outcome,
                       states_file: Path) -> tuple[set[int], dict[str, tuple]]:
    """Every numbered parameter a stage's model states list is in its layer file, which loads, finite, with the
    listed shape. Returns (the layer indexes it claims, its tied parameters), for check_tied_modules once every
    stage is read."""
    files = layer_files(step_dir)
    layers, tied = _claimed(param_shapes)
    outcome.facts["pipeline_layer_files"] = sum(len(per_layer) for per_layer in files.values())
    for index, wanted in sorted(layers.items()):
        per_slice = files.get(index)
        if not per_slice:
            outcome.fail(MISSING, f"no layer_{index:02d}-model_states.pt in {outcome.rel(step_dir)}: pipeline layer "
                                  f"{index} ({', '.join(sorted(wanted)[:3])}) of {outcome.rel(states_file)} has no "
                                  "weights", step_dir)
            continue
        gaps = sorted(set(range(max(per_slice) + 1)) - set(per_slice))
        if gaps:
            outcome.fail(MISSING, f"{outcome.rel(step_dir)}: layer {index} has no tensor slice "
                                  f"{', '.join(map(str, gaps))}", step_dir)
        for path in per_slice.values():
            state = _read_layer(path, device, outcome)
            if state is None:
                continue
            missing = sorted(set(wanted) - set(state))
            if missing:
                outcome.fail(INCONSISTENT, f"{outcome.rel(path)} lacks {', '.join(missing[:3])}, which "
                                           f"{outcome.rel(states_file)} lists for layer {index}", path)
            if len(per_slice) == 1:  # a sliced layer holds a part of each shape
                wrong = [f"{name} {list(state[name].shape)} (param_shapes: {list(shape)})"
                         for name, shape in wanted.items() if name in state and hasattr(state[name], "shape")
                         and tuple(state[name].shape) != shape]
                if wrong:
                    outcome.fail(INCONSISTENT, f"{outcome.rel(path)}: weights shaped unlike param_shapes: "
                                               f"{', '.join(wrong[:3])}", path)
    return set(layers), tied


def check_tied_modules(step_dir: Path, claimed: set[int], tied: dict[str, tuple], device, outcome: Outcome) -> None:
    """A tied module is saved once, by the layer that owns it, whose index no stage's numbered parameters claim:
    each tied parameter of every stage must be in one of those files (its shape too, without tensor slicing)."""
    files = layer_files(step_dir)
    sliced = any(len(per_slice) > 1 for per_slice in files.values())
    held: dict[str, set[tuple]] = {}
    for index, per_slice in sorted(files.items()):
        if index in claimed:
            continue
        for path in per_slice.values():
            for name, tensor in (_read_layer(path, device, outcome) or {}).items():
                if hasattr(tensor, "shape"):
                    held.setdefault(name, set()).add(tuple(tensor.shape))
    for name, shape in sorted(tied.items()):
        inner = name[len(TIED):].partition(".")[2]
        if inner not in held or not (sliced or shape in held[inner]):
            outcome.fail(MISSING, f"{outcome.rel(step_dir)}: the tied parameter {name} {list(shape)} is in no layer "
                                  "file (a tied module is saved by the layer that owns it)", step_dir)
