"""Callbacks that record a run while a training library drives it (docs/record.md).

    from itera_verify.integrations import RecordCallback        # transformers.Trainer
    from itera_verify.integrations import LightningRecorder     # lightning.pytorch.Trainer

Each is imported on first use, so `import itera_verify.integrations` imports neither transformers nor lightning."""
from __future__ import annotations

from .inputs import count_truncated

__all__ = ["LightningRecorder", "RecordCallback", "count_truncated"]


def __getattr__(name: str):
    if name == "RecordCallback":
        from .trainer import RecordCallback

        return RecordCallback
    if name == "LightningRecorder":
        from .lightning import LightningRecorder

        return LightningRecorder
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
