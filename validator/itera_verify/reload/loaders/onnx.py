"""Loader `onnx`: an ONNX model (a `.onnx` file, or a folder holding `model.onnx`) and its external data files.

Proves: every external data file the graph names is present, inside the artifact's folder and long enough for
the bytes it should hold; `onnx.checker` passes its full check (shape inference included); every initializer is
finite; one onnxruntime session on the CPU (no custom operator library is ever registered, and the session options
the model's own metadata may carry are never read) runs on inputs of the declared shapes (a symbolic dimension is 1)
and gives finite output.
"""
from __future__ import annotations

import os
from pathlib import Path

from ..common import LOAD, Outcome, Stop, nonfinite_count, require, short

MODEL_FILE = "model.onnx"
# onnxruntime's element types -> numpy's, for the synthetic inputs.
INPUT_TYPES = {"tensor(float)": "float32", "tensor(float16)": "float16", "tensor(double)": "float64",
               "tensor(int64)": "int64", "tensor(int32)": "int32", "tensor(int8)": "int8", "tensor(uint8)": "uint8",
               "tensor(bool)": "bool"}


def model_file(path: Path, outcome: Outcome) -> Path:
    if path.is_dir():
        candidates = [path / MODEL_FILE] if (path / MODEL_FILE).is_file() else sorted(path.glob("*.onnx"))
        if len(candidates) != 1:
            raise Stop(LOAD, f"{outcome.rel(path)} holds {'no' if not candidates else 'several'} .onnx file(s) "
                             f"and no {MODEL_FILE}: name the model file as the artifact path", path)
        return candidates[0]
    if not path.is_file():
        raise Stop(LOAD, f"{outcome.rel(path)} is not a file", path)
    return path


def check_external_data(onnx, file: Path, outcome: Outcome):
    """Every tensor stored outside the graph: its file present, inside the model's folder, long enough.
    Returns the graph without its external data (the checker and the session read the files themselves)."""
    from onnx.external_data_helper import _get_all_tensors, uses_external_data

    try:
        model = onnx.load(str(file), load_external_data=False)
    except Exception as exc:  # protobuf raises DecodeError and others for a damaged file
        raise Stop(LOAD, f"{outcome.rel(file)} does not parse as ONNX: {short(exc)}", file) from exc
    folder = file.parent.resolve()
    external: dict[str, int] = {}
    for tensor in _get_all_tensors(model):
        if not uses_external_data(tensor):
            continue
        info = {entry.key: entry.value for entry in tensor.external_data}
        location = info.get("location", "")
        target = (folder / location).resolve()
        if os.path.isabs(location) or not target.is_relative_to(folder):
            outcome.fail(LOAD, f"initializer {tensor.name}: external data {location!r} lies outside the model's "
                               "folder", file)
            continue
        if not target.is_file():
            outcome.fail(LOAD, f"initializer {tensor.name}: external data file {outcome.rel(target)} is missing",
                         target)
            continue
        end = int(info.get("offset") or 0) + int(info.get("length") or 0)
        if end > target.stat().st_size:
            outcome.fail(LOAD, f"initializer {tensor.name}: {outcome.rel(target)} ends at byte "
                               f"{target.stat().st_size:,}, the tensor at {end:,}: truncated", target)
        external[location] = external.get(location, 0) + 1
    outcome.facts["external_data_files"] = sorted(external)
    if outcome.problems:
        raise Stop.recorded()
    return model


def check_initializers(onnx, file: Path, outcome: Outcome) -> None:
    import torch
    from onnx import numpy_helper

    model = onnx.load(str(file), load_external_data=True)
    bad, count = [], 0
    for tensor in model.graph.initializer:
        values = numpy_helper.to_array(tensor, base_dir=str(file.parent))
        count += values.size
        if values.dtype.kind == "f" and nonfinite_count(torch.from_numpy(values.copy())):
            bad.append(tensor.name)
    outcome.facts["parameters"] = count
    if bad:
        raise Stop(LOAD, f"non-finite weights (NaN or Inf) in initializer(s) {', '.join(bad[:5])}", file)


def run_session(onnxruntime, file: Path, outcome: Outcome) -> str:
    import numpy as np

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = int(outcome.job.get("threads") or 1)
    try:
        # read_config_from_model=0: a model's `ort_config` metadata (session options: profiling to a file of its
        # choice, threads) is never read, whatever ORT_LOAD_CONFIG_FROM_MODEL says; the loader sets the options.
        session = onnxruntime.InferenceSession(str(file), options, providers=["CPUExecutionProvider"],
                                               read_config_from_model=0)
    except Exception as exc:  # onnxruntime's own exception types
        raise Stop(LOAD, f"onnxruntime cannot create a session: {short(exc)}", file) from exc
    rng = np.random.default_rng(0)
    inputs = {}
    for spec in session.get_inputs():
        shape = [d if isinstance(d, int) and d > 0 else 1 for d in spec.shape]
        dtype = INPUT_TYPES.get(spec.type)
        if dtype is None:
            return f"not run: input {spec.name} is {spec.type}"
        if dtype.startswith("float"):
            inputs[spec.name] = rng.standard_normal(shape).astype(dtype)
        else:
            inputs[spec.name] = np.zeros(shape, dtype=dtype)  # token ids, masks: 0 is valid everywhere
    try:
        outputs = session.run(None, inputs)
    except Exception as exc:  # onnxruntime's own exception types
        raise Stop(LOAD, f"the onnxruntime session fails on inputs of the declared shapes: {short(exc)}",
                   file) from exc
    for spec, value in zip(session.get_outputs(), outputs):
        value = np.asarray(value)
        if value.dtype.kind == "f" and not np.isfinite(value).all():
            raise Stop(LOAD, f"the session's output {spec.name} holds "
                             f"{int(value.size - np.isfinite(value).sum())} non-finite value(s)", file)
    shapes = ", ".join(f"{spec.name} {tuple(np.asarray(v).shape)}" for spec, v in zip(session.get_outputs(), outputs))
    return f"finite output {shapes} (onnxruntime, CPU)"


def reload(job: dict, device, outcome: Outcome) -> None:
    onnx, onnxruntime = require(job)
    file = model_file(Path(job["path"]), outcome)
    check_external_data(onnx, file, outcome)
    try:
        onnx.checker.check_model(str(file), full_check=True)
    except Exception as exc:  # ValidationError, InferenceError
        raise Stop(LOAD, f"onnx.checker refuses {outcome.rel(file)}: {short(exc)}", file) from exc
    check_initializers(onnx, file, outcome)
    outcome.forward = run_session(onnxruntime, file, outcome)
