"""The GPUs a run's reloads share: how many are visible, how much memory each has free (nvidia-smi, so that the
tool itself never creates a CUDA context), and a pool that hands each reload child one GPU, or all of them to
an artifact too large for one, largest artifacts first (docs/integration.md, How reloads run)."""
from __future__ import annotations

import subprocess
import threading

from ..runtime.environment import Environment
from . import placement

SMI_TIMEOUT_SECONDS = 20


def visible_gpus() -> list[int]:
    import torch

    return list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []


def _visible_order(rows: list[tuple[str, str, int]], chosen: str | None) -> list[int]:
    """Free bytes in CUDA's numbering: CUDA_VISIBLE_DEVICES (indexes or UUIDs) picks and orders the GPUs."""
    if chosen is None:
        return [free for _, _, free in rows]
    picked = []
    for token in (t.strip() for t in chosen.split(",") if t.strip()):
        match = [free for index, uuid, free in rows if token == index or (token.startswith("GPU-") and
                                                                          uuid.startswith(token))]
        if not match:
            break  # CUDA stops at the first invalid entry too
        picked.append(match[0])
    return picked


def free_memory(count: int, environment: Environment) -> dict[int, int] | None:
    """Free bytes per visible GPU, from nvidia-smi; None when it cannot tell (the children then measure)."""
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=index,uuid,memory.free", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=SMI_TIMEOUT_SECONDS, check=True)
        rows = []
        for line in done.stdout.splitlines():
            index, uuid, free = (part.strip() for part in line.split(","))
            rows.append((index, uuid, int(free) << 20))  # MiB
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    ordered = _visible_order(rows, environment.cuda_visible_devices)
    return dict(enumerate(ordered)) if len(ordered) == count else None


def needs_every_gpu(job: dict, free: dict[int, int] | None, cap: int | None) -> bool:
    if not free or len(free) < 2:
        return False
    return len(placement.gpus_needed(int(job.get("weight_bytes") or 0), placement.capped(free, cap))) > 1


class GpuPool:
    """Hands out GPUs to reload children: one each, or every GPU at once to a job that needs them all."""

    def __init__(self, gpus: list[int], stopping: threading.Event):
        self.gpus, self.idle, self.stopping = list(gpus), set(gpus), stopping
        self._changed = threading.Condition()

    def take(self, every: bool) -> list[int]:
        """GPUs for one job ([] when the run is stopping); waits until they are free."""
        with self._changed:
            while not self.stopping.is_set():
                if every and self.idle == set(self.gpus):
                    self.idle.clear()
                    return list(self.gpus)
                if not every and self.idle:
                    gpu = min(self.idle)
                    self.idle.discard(gpu)
                    return [gpu]
                self._changed.wait(0.2)
        return []

    def give(self, gpus: list[int]) -> None:
        with self._changed:
            self.idle.update(gpus)
            self._changed.notify_all()
