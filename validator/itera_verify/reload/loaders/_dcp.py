"""Reading a torch.distributed.checkpoint folder (`.metadata` + `__<rank>_<n>.distcp`) in one process, without a
process group and without torch's own reader.

torch's FileSystemReader reads `.metadata` with plain pickle.load and DefaultLoadPlanner loads every non-tensor
item with torch.load(weights_only=False). Here `.metadata` goes through the restricted unpickler after the static
scan (records.py), every item is read from its (offset, length) slice, scanned, then loaded with
weights_only=True; tensor chunks are assembled into whole tensors, each checked against the shape `.metadata`
lists and for finite values.
"""
from __future__ import annotations

import pickle
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...package.pickles import is_allowed
from ...package.pickles.containers import scan_container
from ...package.pickles.distcp import Window
from ..common import (
    LOAD,
    Outcome,
    Stop,
    nonfinite_count,
    record_globals,
    scan_or_refuse,
    short,
)
from ..records import read_metadata
from . import _ranks

DISTCP = re.compile(r"__(\d+)_\d+\.distcp")


@dataclass
class DcpState:
    folder: Path
    tensors: dict[str, Any] = field(default_factory=dict)  # flattened key -> whole tensor
    values: dict[str, Any] = field(default_factory=dict)  # flattened key -> non-tensor value
    nonfinite: list[str] = field(default_factory=list)


def _metadata(folder: Path, outcome: Outcome):
    path = folder / ".metadata"
    if not path.is_file():
        raise Stop(LOAD, f"{outcome.rel(folder)} has no .metadata: torch.distributed.checkpoint cannot read it", path)
    scan_or_refuse(path, outcome)
    try:
        metadata = read_metadata(path.read_bytes())
    except (pickle.UnpicklingError, EOFError, AttributeError, ImportError, TypeError, ValueError) as exc:
        raise Stop(LOAD, f"{outcome.rel(path)} does not read as DCP metadata: {short(exc)}", path) from exc
    if not isinstance(getattr(metadata, "state_dict_metadata", None), dict) \
            or not isinstance(getattr(metadata, "storage_data", None), dict):
        raise Stop(LOAD, f"{outcome.rel(path)} is not DCP metadata (no state_dict_metadata / storage_data)", path)
    return metadata


def _load_slice(fh, file: Path, start: int, length: int, key: str, outcome: Outcome):
    """One stored item: its slice scanned (every archive of a .distcp is), then torch.load(weights_only=True)."""
    import torch

    names: set[str] = set()
    is_pickle, error = scan_container(Window(fh, start, length), length, f"{file.name}@{start}", names)
    unsafe = sorted(n for n in names if not is_allowed(n))
    if unsafe or error or not is_pickle:
        why = f"names {', '.join(unsafe)} (IV506)" if unsafe else error or "is not a torch.save archive"
        raise Stop(LOAD, f"refused to load {key} from {outcome.rel(file)} at offset {start}: it {why}", file)
    registered = record_globals(names)
    try:
        with torch.serialization.safe_globals(registered):
            return torch.load(Window(fh, start, length), map_location="cpu", weights_only=True)
    except Exception as exc:  # a damaged archive raises many types
        raise Stop(LOAD, f"{key} in {outcome.rel(file)} at offset {start} does not load: {short(exc)}", file) from exc


def read_dcp(folder: Path, outcome: Outcome, world_size: int | None = None) -> DcpState:
    """Every item of the folder, loaded and assembled; missing or short files are recorded, then Stop."""
    import torch

    metadata = _metadata(folder, outcome)
    files = _ranks.rank_files(folder, DISTCP)
    _ranks.check_ranks(files, world_size, ".distcp file", outcome, folder)
    by_file: dict[str, list] = {}
    for index, info in metadata.storage_data.items():
        name = str(getattr(info, "relative_path", ""))
        if getattr(info, "transform_descriptors", None):
            raise Stop(LOAD, f"{outcome.rel(folder)}: {index.fqn} is stored through transforms "
                             f"{info.transform_descriptors}, which this reader does not apply", folder)
        by_file.setdefault(name, []).append((index, info))
    for name in sorted(by_file):
        file = folder / name
        if "/" in name or "\\" in name or not file.is_file():
            outcome.fail(LOAD, f"{outcome.rel(file)} is missing: .metadata stores {len(by_file[name])} item(s) in it",
                         file)
            continue
        size = file.stat().st_size
        beyond = [i.fqn for i, info in by_file[name] if info.offset < 0 or info.offset + info.length > size]
        if beyond:
            outcome.fail(LOAD, f"{outcome.rel(file)} is cut short: {len(beyond)} item(s) .metadata lists lie past its "
                               f"end ({size} bytes), first {beyond[0]}", file)
            continue
        scan_or_refuse(file, outcome)  # every embedded archive, before any is loaded
    if outcome.problems:
        raise Stop.recorded()
    state, chunks = DcpState(folder), {}
    for name, items in sorted(by_file.items()):
        file = folder / name
        with open(file, "rb") as fh:
            for index, info in sorted(items, key=lambda item: item[1].offset):
                value = _load_slice(fh, file, info.offset, info.length, index.fqn, outcome)
                if torch.is_tensor(value):
                    chunks.setdefault(index.fqn, []).append((tuple(index.offset or ()), value))
                else:
                    state.values[index.fqn] = value
    for key, entry in metadata.state_dict_metadata.items():
        if hasattr(entry, "chunks"):
            state.tensors[key] = _assemble(key, entry, chunks.pop(key, []), outcome, folder)
            if nonfinite_count(state.tensors[key]):
                state.nonfinite.append(key)
        elif key not in state.values:
            raise Stop(LOAD, f"{outcome.rel(folder)}: {key} is listed in .metadata but stored nowhere", folder)
    outcome.facts.setdefault("dcp", {})[outcome.rel(folder)] = {"tensors": len(state.tensors),
                                                                "values": len(state.values), "ranks": sorted(files)}
    return state


def _assemble(key: str, entry, pieces: list, outcome: Outcome, folder: Path):
    """The whole tensor from its chunks, each shaped as .metadata lists it, together covering it exactly."""
    import torch

    size = tuple(entry.size)
    dtype = entry.properties.dtype
    listed = {tuple(chunk.offsets): tuple(chunk.sizes) for chunk in entry.chunks}
    whole = torch.zeros(size, dtype=dtype)
    covered = 0
    found = {offsets: tensor for offsets, tensor in pieces}
    for offsets, sizes in listed.items():
        tensor = found.get(offsets)
        if tensor is None:
            raise Stop(LOAD, f"{outcome.rel(folder)}: the chunk of {key} at {list(offsets)} is stored nowhere", folder)
        if tuple(tensor.shape) != sizes or tensor.dtype != dtype:
            raise Stop(LOAD, f"{outcome.rel(folder)}: the chunk of {key} at {list(offsets)} is "
                             f"{list(tensor.shape)} {tensor.dtype}, .metadata lists {list(sizes)} {dtype}", folder)
        region = tuple(slice(o, o + s) for o, s in zip(offsets, sizes))
        whole[region] = tensor if region else tensor.reshape(size)
        covered += tensor.numel()
    if covered != whole.numel():
        raise Stop(LOAD, f"{outcome.rel(folder)}: the chunks of {key} hold {covered} of its {whole.numel()} values",
                   folder)
    return whole
