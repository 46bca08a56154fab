"""The host memory limit of every reload child: how large it is, how it is enforced, how its breach is told.

A config.json is the sender's: one number in it (GPT-2's `n_inner`, `intermediate_size`, `vocab_size`) makes a
model gigabytes larger than its files, and from_pretrained allocates all of it before it reports the mismatch.
The loaders refuse such a config before anything is built (loaders/transformers.py, on the meta device); this
limit bounds whatever else a reload allocates.

Size: what the artifact occupies on disk (the base model's snapshot too, for an adapter) times WEIGHT_FACTOR,
plus an allowance for the libraries; or ITERA_RELOAD_HOST_MEMORY (bytes, K/M/G/T suffixes), which sets the
limit of every child in place of that (a machine with less memory, or a model that needs more).

Enforcement, measured on torch 2.13 (CPU) under Linux 6.x:
- RLIMIT_AS cannot be used: it counts address space, and torch and the CUDA driver reserve far more than they
  ever touch (a CPU child already maps 0.7 GiB with ~0.3 GiB resident; a CUDA context reserves tens of GiB).
- RLIMIT_DATA counts private writable mappings: every tensor, every malloc, never a mapped weight file or a
  library's code. Past it the allocation fails inside the child (torch: "DefaultCPUAllocator: can't allocate
  memory", Python: MemoryError), so the child reports the breach itself; it can never grow past the limit.
  Set by the child on itself (child.py) before it opens anything, forked and spawned alike. CPU reloads only:
  the CUDA driver's own host mappings have not been measured under it, and a GPU reload refused for them
  would be a false IV504.
- A watcher in the parent (runtime/launcher.py) reads the child's resident memory (VmRSS: what the report's host peak
  measures, mapped files included) at every poll (50 ms at most) and kills the child past the limit: the
  bound of GPU reloads, and of what RLIMIT_DATA does not count (a weight file mapped read-only) on the CPU.
  No cgroup: rarely writable where the tool runs (containers, CI), and the two above need none.
"""
from __future__ import annotations

import os
import re
import resource
from pathlib import Path

from ..package.jsonread import read_json_file
from ..runtime.environment import RELOAD_HOST_MEMORY as LIMIT_VARIABLE, Environment
from ..runtime.launcher import resident_bytes, status_bytes  # noqa: F401 - the child and the tests read them here
from .placement import human, parse_bytes

WEIGHT_FACTOR = 4  # a bf16 file loaded as float32 (2x) with a tensor's conversion copy beside it
# The libraries' own memory: a forked CPU child starts at ~0.3 GiB anonymous (torch, transformers, peft) and a
# tiny model's from_pretrained and forward pass peak under 0.6 GiB. CUDA adds its runtime's host memory
# (handles, pinned staging buffers, module images): not measured here, so counted generously.
LIBRARY_ALLOWANCE = {"cpu": 2 << 30, "cuda": 6 << 30}
# What the C runtimes print when an allocation, a map or a thread stack is refused (the child's log).
STARVED_WORDS = ("Thread creation failed", "Resource temporarily unavailable", "Cannot allocate memory",
                 "can't allocate memory", "std::bad_alloc", "MemoryError")


# What a reload that failed for want of memory says, and nothing else does (over_limit below; child.py's device
# and MemoryError words; runner.py's for a child killed or starved): an assembled campaign's verify lets a lot's
# signed reload proof stand for such an artifact only (flows/partproofs.py), never for another failure.
MEMORY_FAILURES = ("of host memory, its limit", "out of device memory on", "out of memory (MemoryError)",
                   "(the system may have run out of memory)", "(the process could not get memory")


def lacked_memory(message: str | None) -> bool:
    return isinstance(message, str) and any(words in message for words in MEMORY_FAILURES)


def configured_limit(environment: Environment) -> int | None:
    """ITERA_RELOAD_HOST_MEMORY, from the run's environment (read once, at the entry point)."""
    return parse_bytes(environment.reload_host_memory)


def disk_bytes(path: Path) -> int:
    """Bytes of the regular files at or under `path` (links followed: the loaders read through them)."""
    path = Path(path)
    if path.is_file():
        return path.stat().st_size
    total = 0
    for folder, _, names in os.walk(path):
        for name in names:
            try:
                total += os.stat(os.path.join(folder, name)).st_size
            except OSError:
                continue  # a broken link: the loader reports it
    return total


def base_folder(folder: Path, hf_cache: str | None) -> Path | None:
    """The hub-cache snapshot of an adapter's base (adapter_config.json), as loaders/peft.py finds it; None
    when the folder holds no adapter or its base is not in the cache (that reload fails as IV505 anyway)."""

    config = Path(folder) / "adapter_config.json"
    if not hf_cache or not config.is_file():
        return None
    try:
        value = read_json_file(config)
        name, revision = value.get("base_model_name_or_path"), value.get("revision")
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(name, "config.json", cache_dir=hf_cache,
                                       revision=revision if isinstance(revision, str) else None)
    except Exception:  # noqa: BLE001 - any unusable adapter config: the child says what is wrong with it
        return None
    return Path(found).parent if isinstance(found, str) else None


def pinned_base_folder(base: dict | None, hf_cache: str | None) -> Path | None:
    """The hub-cache snapshot of the manifest's pinned base (an artifact's `base`: name, revision), as the
    diffusers-lora loader finds it (a pipeline's model_index.json or a model's config.json); None otherwise."""
    name = base.get("name") if isinstance(base, dict) else None
    revision = base.get("revision") if isinstance(base, dict) else None
    if not hf_cache or not isinstance(name, str) or not name:
        return None
    try:
        from huggingface_hub import try_to_load_from_cache

        for marker in ("model_index.json", "config.json"):
            found = try_to_load_from_cache(name, marker, cache_dir=hf_cache,
                                           revision=revision if isinstance(revision, str) else None)
            if isinstance(found, str):
                return Path(found).parent
    except Exception:  # noqa: BLE001 - any unusable base: the child says what is wrong with it
        return None
    return None


def memory_limit(path: Path, device: str, hf_cache: str | None, configured: int | None,
                 pinned_base: dict | None = None) -> tuple[int, str]:
    """(bytes, how they were set) for the child that reloads `path` on `device` ("cpu" or "cuda"). The base the
    child loads beside the artifact counts too: an adapter's (adapter_config.json), else the manifest's pinned
    base (a diffusers LoRA loads its whole pipeline)."""
    if configured:
        return configured, "configured"
    weights = disk_bytes(path)
    base = base_folder(path, hf_cache) if Path(path).is_dir() else None
    base = base or pinned_base_folder(pinned_base, hf_cache)
    based = ""
    if base is not None:
        weights += disk_bytes(base)
        based = " with its base"
    allowance = LIBRARY_ALLOWANCE["cpu" if device == "cpu" else "cuda"]
    return allowance + WEIGHT_FACTOR * weights, (f"{WEIGHT_FACTOR} x the {human(weights)} of the artifact{based} "
                                                 f"on disk + {human(allowance)} for the libraries")


def apply_in_child(job: dict) -> None:
    """Set the job's limit on this process (the reload child), before it opens anything: RLIMIT_DATA, soft and
    hard, so that nothing in the child can raise it again. CPU reloads only (see the module's docstring)."""
    limit = job.get("memory_limit")
    if not isinstance(limit, int) or limit <= 0 or not str(job.get("device", "")).startswith("cpu"):
        return
    try:
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    except (ValueError, OSError):
        pass  # an administrator's lower hard limit already binds harder; the parent's watcher still applies


def starved(text: str) -> bool:
    """An error or a log that says an allocation was refused."""
    return any(words in text for words in STARVED_WORDS)


def refused_by_limit(text: str, limit: int) -> bool:
    """In the child: an allocation error (`text`) that this reload's own limit caused, not an address-space
    limit set from outside, nor a machine out of memory: RLIMIT_DATA is ours and the request did not fit
    under it (when the library says how much it asked for)."""
    if not starved(text) or resource.getrlimit(resource.RLIMIT_DATA)[0] != limit:
        return False
    outside = resource.getrlimit(resource.RLIMIT_AS)[0]
    if outside != resource.RLIM_INFINITY and outside < limit:
        return False
    asked, used = re.search(r"(\d+) bytes", text), status_bytes("VmData")
    return asked is None or used is None or used + int(asked.group(1)) > limit


def over_limit(limit: int, source: str) -> str:
    """The message of a reload stopped at its limit (IV504)."""
    return (f"the reload needed more than {human(limit)} of host memory, its limit ({source}), and was stopped; "
            f"if the artifact really needs more, set {LIMIT_VARIABLE} (bytes, or with a K/M/G suffix) higher")
