"""Where a reload puts a model's weights (docs/integration.md, How reloads run): one GPU when they fit in its free
memory, otherwise spread over every visible GPU with accelerate's device map and an explicit max_memory per GPU, never
the CPU or disk. accelerate itself sends what does not fit to "disk" without a word (infer_auto_device_map adds
a disk entry to any max_memory it is given), and from_pretrained would then "load" a model whose layers live in
files: here any such entry is refused (IV504, "not reloaded on the GPU"), before and after the load.

Pure planning over numbers and meta-device models; nothing here touches a GPU, so the CPU tests cover it all.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..package.files import read_safetensors_header
from ..runtime.environment import RELOAD_GPU_MEMORY, Environment

# Share of a GPU's free memory that weights may take: the rest is for the CUDA context, the forward pass and
# the allocator's fragments.
HEADROOM = 0.9
# A cap on the free memory per GPU (bytes, or with a K/M/G/T suffix, powers of 1024): leave room for other work
# on the machine, or force the spread over GPUs (scripts/gpu-check.sh does).
CAP_VARIABLE = RELOAD_GPU_MEMORY
OFF_GPU = ("cpu", "disk", "meta")
SAFETENSORS_DTYPE_BYTES = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2,
                           "I16": 2, "U16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "I8": 1, "U8": 1, "BOOL": 1,
                           "F4": 1}
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt")


class Offload(Exception):
    """The weights would not all be on the GPU: the reload is refused (IV504), never passed."""


@dataclass
class Placement:
    gpus: list[int]  # the GPUs this reload uses, in order
    max_memory: dict[int, int] = field(default_factory=dict)  # bytes per GPU, no "cpu" or "disk" key
    device_map: dict[str, int] | None = None  # module name -> GPU, when spread over several

    @property
    def devices(self) -> list[str]:
        used = sorted(set(self.device_map.values())) if self.device_map else self.gpus
        return [f"cuda:{gpu}" for gpu in used]


def human(size: int) -> str:
    return f"{size / 2**30:.2f} GiB" if size >= 1 << 30 else f"{size / 2**20:.1f} MiB"


def parse_bytes(text: str | None) -> int | None:
    if not text:
        return None
    value = text.strip().upper().removesuffix("B").removesuffix("I")
    scale = 1
    if value and value[-1] in "KMGT":
        scale, value = 1024 ** ("KMGT".index(value[-1]) + 1), value[:-1]
    try:
        number = float(value)
    except ValueError:
        return None
    return int(number * scale) if number > 0 else None


def capped(free: dict[int, int], cap: int | None) -> dict[int, int]:
    return {gpu: min(amount, cap) if cap else amount for gpu, amount in free.items()}


def safetensors_bytes(path: Path) -> int | None:
    """Tensor bytes a safetensors file holds, read from its header alone (no data read); None when unreadable."""
    header = read_safetensors_header(path)
    return sum(e.nbytes for e in header.entries.values()) if header else None


def weight_bytes(path: Path) -> int:
    """What loading an artifact puts on a device, about: its tensor bytes (safetensors headers), else the size of
    its weight files. Ranks artifacts (largest first) and tells whether one GPU can hold them."""
    path = Path(path)
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file() and p.suffix in WEIGHT_SUFFIXES]
    total = 0
    for file in files:
        try:
            tensors = safetensors_bytes(file) if file.suffix == ".safetensors" else None
            total += file.stat().st_size if tensors is None else tensors
        except OSError:
            pass  # vanished: nothing to place
    return total


def budgets(free: dict[int, int], headroom: float = HEADROOM) -> dict[int, int]:
    """max_memory for accelerate: a share of each GPU's free memory, GPUs only (no "cpu", no "disk")."""
    return {gpu: int(amount * headroom) for gpu, amount in sorted(free.items())}


def gpus_needed(needed: int, free: dict[int, int], headroom: float = HEADROOM) -> list[int]:
    """The GPU with the most free memory when `needed` bytes fit there; every GPU otherwise (the device map then
    spreads the model, or refuses it when even all of them are too small)."""
    if not free:
        return []
    roomiest = max(sorted(free), key=lambda gpu: free[gpu])
    if needed <= free[roomiest] * headroom or len(free) == 1:
        return [roomiest]
    return sorted(free)


def refuse_offload(device_map: dict, sizes: dict[str, int] | None = None) -> None:
    """Raise Offload naming the modules a device map leaves off the GPUs (accelerate's "cpu" and "disk")."""
    off = {name: str(where) for name, where in device_map.items()
           if not isinstance(where, int) and not str(where).startswith("cuda")}
    if not off:
        return
    places = sorted(set(off.values()))
    size = sum((sizes or {}).get(name, 0) for name in off)
    names = ", ".join(list(off)[:4]) + (f" and {len(off) - 4} more" if len(off) > 4 else "")
    raise Offload(f"not reloaded on the GPU: {len(off)} module(s){f' ({human(size)})' if size else ''} "
                  f"would be offloaded to {' and '.join(places)} ({names}); the GPUs' memory is too small for the "
                  "model, and weights in host memory or on disk prove nothing about a GPU reload")


def module_sizes(model) -> dict[str, int]:
    from accelerate.utils import compute_module_sizes

    return dict(compute_module_sizes(model))


def spread(model, max_memory: dict[int, int], dtype=None) -> dict[str, int]:
    """accelerate's device map of a meta-device model over the GPUs of `max_memory`, whole blocks kept on one
    GPU (the model's _no_split_modules); Offload when any module would land on the CPU or disk."""
    from accelerate import infer_auto_device_map

    if any(not isinstance(gpu, int) for gpu in max_memory):
        raise ValueError("max_memory names GPUs only")
    if hasattr(model, "tie_weights"):
        model.tie_weights()  # tied weights counted once, as from_pretrained will place them
    device_map = infer_auto_device_map(model, max_memory=dict(max_memory),
                                       no_split_module_classes=list(getattr(model, "_no_split_modules", None) or ()),
                                       dtype=dtype)
    refuse_offload(device_map, module_sizes(model))
    return dict(device_map)


def plan(needed: int, free: dict[int, int], *, cap: int | None = None, headroom: float = HEADROOM,
         meta_model=None, dtype=None) -> Placement:
    """Placement of a model of `needed` bytes given each GPU's free memory. Several GPUs need `meta_model` (the
    model built on the meta device) for the device map."""
    free = capped(free, cap)
    gpus = gpus_needed(needed, free, headroom)
    limits = budgets({gpu: free[gpu] for gpu in gpus}, headroom)
    if len(gpus) == 1 and needed <= limits[gpus[0]]:
        return Placement(gpus, limits)
    if meta_model is None:
        raise Offload(f"not reloaded on the GPU: {human(needed)} of weights exceed the "
                      f"{human(sum(limits.values()))} the GPUs have free")
    return Placement(gpus, limits, spread(meta_model, limits, dtype))


def off_gpu_tensors(model) -> list[str]:
    """After a load: every weight (parameter) not on a GPU ("name (device)"), and every module accelerate's
    hooks keep offloaded (hf_device_map entries "cpu" or "disk"). Buffers are left out: a model may keep a
    small non-persistent one (a mask, rotary frequencies) wherever it builds it, and it is no weight."""
    found = [f"{name} ({tensor.device.type})" for name, tensor in model.named_parameters()
             if tensor.device.type != "cuda"]
    for name, where in (getattr(model, "hf_device_map", None) or {}).items():
        if str(where) in OFF_GPU:
            found.append(f"{name or 'the model'} ({where}, by the device map)")
    return found


def cap_from_environment(environment: Environment) -> int | None:
    """ITERA_RELOAD_GPU_MEMORY, of the run's environment (the runner hands it to each job: `gpu_memory_cap`)."""
    return parse_bytes(environment.reload_gpu_memory)
