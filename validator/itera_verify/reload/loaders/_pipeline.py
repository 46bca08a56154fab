"""DeepSpeed pipeline parallelism (a PipelineModule under the PipelineEngine): the model states of each stage
hold `module: None`; the weights are saved layer by layer, `layer_<NN>-model_states.pt` (with tensor slicing
inside a stage, `layer_<NN>-model_<MM>-model_states.pt`, one per slice), by data-parallel rank 0 of each stage.
Each (stage, slice) is a model-parallel rank of its own (`mp_rank_<r>_model_states.pt`, r = stage × tp + slice),
so the rest of the ZeRO proofs run per rank.

What each rank's param_shapes and buffer_names list must be in its own slice of the layer files: `<N>.<name>` in
`layer_<N>`'s state dict (a parameter with the listed shape); a tied module (`tied_modules.<key>.<name>`, saved
once, by the layer that owns it) in a layer file no numbered parameter claims, every slice of it present. Without
ZeRO no param_shapes are saved: every layer file present is still loaded and proven finite (check_tied_modules
reads each file no rank claims), but a missing one cannot be told; nor can a frozen layer's, which param_shapes
leaves out. DeepSpeed's own load_state_dir globs the layer files and fails only on the first layer it cannot
find, after it has built the whole model; a missing last slice it silently replaces with another.
"""
from __future__ import annotations

import re
from pathlib import Path

from ..common import INCONSISTENT, LOAD, MISSING, Outcome, nonfinite_count, safe_torch_load
from . import _resume

LAYER_FILE = re.compile(r"layer_(\d+)(?:-model_(\d+))?-model_states\.pt")
TIED = "tied_modules."


LayerFiles = dict[int, dict[int, Path]]


def layer_files(step_dir: Path) -> LayerFiles:
    """layer index -> tensor slice (0 without slicing) -> file; listed once per checkpoint (_zero.py)."""
    found: dict[int, dict[int, Path]] = {}
    for path in sorted(step_dir.iterdir()):
        match = LAYER_FILE.fullmatch(path.name)
        if match:
            found.setdefault(int(match.group(1)), {})[int(match.group(2) or 0)] = path
    return found


def is_pipeline(module, files: LayerFiles, stages: int | None) -> bool:
    """Model states whose module lives in layer files: `module` None, and layer files beside them or a pipeline
    degree (checkpoint_parallel_dimensions.pp_degree) above 1 recorded."""
    return module is None and (bool(files) or (stages or 0) > 1)


def slice_count(recorded: int | None, files: LayerFiles) -> int:
    """Tensor slices per layer: the recorded tp_degree, else as many as the layer files show."""
    if recorded is not None and recorded >= 1:
        return recorded
    return max((max(per_slice) + 1 for per_slice in files.values()), default=1)


def file_name(index: int, part: int, slices: int) -> str:
    return f"layer_{index:02d}-model_{part:02d}-model_states.pt" if slices > 1 else f"layer_{index:02d}-model_states.pt"


def _claimed(param_shapes: list[dict], buffer_names) -> tuple[dict[int, dict[str, tuple | None]], dict[str, tuple]]:
    """(layer index -> {name inside the layer: shape, None for a buffer}, {tied parameter: shape}) from one rank's
    param_shapes and buffer_names."""
    layers: dict[int, dict[str, tuple | None]] = {}
    tied: dict[str, tuple] = {}
    named = [(name, tuple(shape)) for group in param_shapes for name, shape in group.items()]
    named += [(name, None) for name in buffer_names or [] if isinstance(name, str)]
    for name, shape in named:
        head, _, rest = name.partition(".")
        if name.startswith(TIED):
            if shape is not None:
                tied[name] = shape
        elif head.isdigit() and rest:
            layers.setdefault(int(head), {}).setdefault(rest, shape)
    return layers, tied


def _read_layer(path: Path, device, outcome: Outcome) -> dict | None:
    """The layer's state dict, proven finite; None (the problem recorded) when it does not load: one unreadable
    layer must not hide the others."""
    state = _resume.attempt(outcome, safe_torch_load, path, outcome, device)
    if state is None:
        return None
    if not isinstance(state, dict):
        outcome.fail(LOAD, f"{outcome.rel(path)} is not a layer's state dict", path)
        return None
    bad = [name for name, tensor in state.items() if hasattr(tensor, "numel") and tensor.numel()
           and nonfinite_count(tensor)]
    if bad:
        outcome.fail(LOAD, f"{outcome.rel(path)}: non-finite weights in {', '.join(map(str, bad[:5]))}", path)
    return state


def check_stage_layers(step_dir: Path, files: LayerFiles, slices: int, param_shapes: list[dict], buffer_names,
                       mp: int, device, outcome: Outcome, states_file: Path) -> tuple[set[int], dict[str, tuple]]:
    """Every numbered parameter and buffer model-parallel rank `mp` lists is in its own slice of its layer file,
    which loads, finite, with the listed shape (the other slices are their own ranks' to prove). Returns (the
    layer indexes it claims, its tied parameters), for check_tied_modules once every rank is read."""
    own = mp % slices
    layers, tied = _claimed(param_shapes, buffer_names)
    outcome.facts["pipeline_layer_files"] = sum(len(per_layer) for per_layer in files.values())
    if slices > 1:
        outcome.facts["pipeline_tensor_slices"] = slices
    for index, wanted in sorted(layers.items()):
        per_slice = files.get(index, {})
        if own not in per_slice:  # each slice is this rank's to prove: every missing one is said once, by its rank
            outcome.fail(MISSING, f"no {file_name(index, own, slices)} in {outcome.rel(step_dir)}: pipeline layer "
                                  f"{index} ({', '.join(sorted(wanted)[:3])}) of {outcome.rel(states_file)} lacks its "
                                  "weights", step_dir)
            continue
        path = per_slice[own]
        state = _read_layer(path, device, outcome)
        if state is None:
            continue
        missing = sorted(set(wanted) - set(state))
        if missing:
            outcome.fail(INCONSISTENT, f"{outcome.rel(path)} lacks {', '.join(missing[:3])}, which "
                                       f"{outcome.rel(states_file)} lists for layer {index}", path)
        wrong = [f"{name} {list(state[name].shape)} (param_shapes: {list(shape)})" for name, shape in wanted.items()
                 if shape is not None and hasattr(state.get(name), "shape") and tuple(state[name].shape) != shape]
        if wrong:
            outcome.fail(INCONSISTENT, f"{outcome.rel(path)}: weights shaped unlike param_shapes: "
                                       f"{', '.join(wrong[:3])}", path)
    return set(layers), {name: (shape, own) for name, shape in tied.items()}


def check_tied_modules(step_dir: Path, files: LayerFiles, claimed: set[int], tied: dict[str, set], slices: int,
                       device, outcome: Outcome) -> None:
    """A tied module is saved once, by the layer that owns it, whose index no rank's numbered parameters claim:
    each tied parameter of every rank must be in its own slice of one of those files, with its shape. Every file
    no rank claims is read (and proven finite) once."""
    held: dict[tuple[str, int], set[tuple]] = {}
    for index, per_slice in sorted(files.items()):
        if index in claimed:
            continue
        absent = [part for part in range(slices) if part not in per_slice]
        if absent:
            outcome.fail(MISSING, f"no {', '.join(file_name(index, part, slices) for part in absent)} in "
                                  f"{outcome.rel(step_dir)}: layer {index} lacks a tensor slice", step_dir)
        for part, path in per_slice.items():
            for name, tensor in (_read_layer(path, device, outcome) or {}).items():
                if hasattr(tensor, "shape"):
                    held.setdefault((name, part), set()).add(tuple(tensor.shape))
    for name, wanted in sorted(tied.items()):
        inner = name[len(TIED):].partition(".")[2]
        for shape, part in sorted(wanted):
            if shape not in held.get((inner, part), set()):
                where = f" (tensor slice {part})" if slices > 1 else ""
                outcome.fail(MISSING, f"{outcome.rel(step_dir)}: the tied parameter {name} {list(shape)}{where} is in "
                                      "no layer file (a tied module is saved by the layer that owns it)", step_dir)
