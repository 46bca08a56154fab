"""Loader `safetensors`: one file, or a folder of shards with its index. Every tensor onto the device, finite."""
from __future__ import annotations

from pathlib import Path

from ...format import layouts
from ...package.jsonread import read_json_file
from ..common import LOAD, Outcome, Stop, nonfinite_count, short, torch_dtype

INDEX_SUFFIX = ".safetensors.index.json"


def shard_plan(path: Path, outcome: Outcome) -> tuple[list[Path], dict[str, str]]:
    """The files to open and, for an index, which tensor each shard must hold. Missing shards are failures."""
    if path.is_file():
        return [path], {}
    if not path.is_dir():
        raise Stop(LOAD, f"{outcome.rel(path)} does not exist")
    indexes = sorted(path.glob(f"*{INDEX_SUFFIX}"))
    if not indexes:
        files = sorted(path.glob("*.safetensors"))
        if not files:
            raise Stop(LOAD, f"{outcome.rel(path)} holds no .safetensors file")
        return files, {}
    try:
        weight_map = read_json_file(indexes[0])["weight_map"]
        if not isinstance(weight_map, dict):
            raise TypeError("weight_map is not an object")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise Stop(LOAD, f"{outcome.rel(indexes[0])} is not a usable shard index: {short(exc)}", indexes[0]) from exc
    shards = sorted(set(map(str, weight_map.values())))
    outcome.facts["shards"] = len(shards)
    # Every missing shard in one problem, under the id the static checks of a checkpoint report it (said once).
    need = layouts.index_shard_requirement(outcome.rel(path), indexes[0].name, weight_map,
                                           lambda shard: (path / shard).is_file())
    if need is not None:
        outcome.fail(LOAD, need.message, path / need.file, requirement=need.id)
    present = [path / shard for shard in shards if (path / shard).is_file()]
    return present, {str(k): str(v) for k, v in weight_map.items()}


def load_file(path: Path, device, dtype, outcome: Outcome) -> set[str]:
    """Open one file (header checks are safetensors' own), bring each tensor to the device, check it."""
    from safetensors import SafetensorError, safe_open

    if not path.is_file():
        raise Stop(LOAD, f"{outcome.rel(path)} is not a regular file", path)
    names: set[str] = set()
    try:
        with safe_open(str(path), framework="pt", device=str(device)) as handle:
            for name in handle.keys():
                tensor = handle.get_tensor(name)
                names.add(name)
                check_tensor(name, tensor, dtype, path, outcome)
    except SafetensorError as exc:
        raise Stop(LOAD, f"{outcome.rel(path)} is not a valid safetensors file: {short(exc)}", path) from exc
    return names


def check_tensor(name: str, tensor, dtype, path: Path, outcome: Outcome) -> None:
    facts = outcome.facts
    facts["tensors"] = facts.get("tensors", 0) + 1
    facts["parameters"] = facts.get("parameters", 0) + tensor.numel()
    facts.setdefault("dtypes", [])
    stored = str(tensor.dtype).removeprefix("torch.")
    if stored not in facts["dtypes"]:
        facts["dtypes"].append(stored)
    if tensor.numel() == 0:
        facts.setdefault("empty_tensors", []).append(name)
    bad = nonfinite_count(tensor)
    if bad:
        outcome.fail(LOAD, f"{name} holds {bad} non-finite value(s) (NaN or Inf)", path)
        return
    if dtype is not None and tensor.is_floating_point() and tensor.dtype != dtype:
        # Honour reload.json's dtype; a value that overflows it is a real problem for whoever loads it so.
        converted = tensor.to(dtype)
        if nonfinite_count(converted):
            outcome.fail(LOAD, f"{name} overflows {str(dtype).removeprefix('torch.')} (reload.json dtype)", path)


def reload(job: dict, device, outcome: Outcome) -> None:
    path = Path(job["path"])
    dtype = torch_dtype(job)
    files, weight_map = shard_plan(path, outcome)
    found: dict[str, set[str]] = {}
    for file in files:
        found[file.name] = load_file(file, device, dtype, outcome)
    missing = [name for name, shard in weight_map.items() if shard in found and name not in found[shard]]
    if missing:
        outcome.fail(LOAD, f"{len(missing)} tensor(s) named by the index are not in their shard: "
                           f"{', '.join(sorted(missing)[:5])}")
    outcome.forward = "not run: a bare tensor file has no architecture"
