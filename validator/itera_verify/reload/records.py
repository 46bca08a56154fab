"""The data records of multi-GPU outputs, loaded without their libraries and without running their code.

DeepSpeed's optimizer shards name four plain records (allowlist.DEEPSPEED_RECORDS). They load through torch's
weights_only unpickler with exactly those names registered, each bound to an inert stand-in defined here:
importing DeepSpeed would run its accelerator probing and op builders, and verifying a DeepSpeed checkpoint
must not need DeepSpeed. A DCP `.metadata` is a bare pickle that torch's weights_only unpickler cannot read;
torch's own reader uses plain pickle.load. Here a pickle.Unpickler whose find_class admits exactly
allowlist.DCP_METADATA_GLOBALS reads it, after the static scan.
"""
from __future__ import annotations

import enum
import importlib
import io
import pickle
from dataclasses import dataclass

from ..package.pickles.allowlist import DCP_METADATA_GLOBALS, DEEPSPEED_RECORDS


class LossScaler:
    """Stand-in for deepspeed.runtime.fp16.loss_scaler.LossScaler: its attributes (cur_scale, dynamic, ...)."""


class DynamicLossScaler(LossScaler):
    """Stand-in for deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler."""


class ZeroStageEnum(int, enum.Enum):
    """Stand-in for deepspeed.runtime.zero.config.ZeroStageEnum (pickled as the enum called with its value)."""
    disabled = 0
    optimizer_states = 1
    gradients = 2
    weights = 3


@dataclass
class fragment_address:  # DeepSpeed's own name
    """Stand-in for deepspeed.utils.tensor_fragment.fragment_address."""
    numel: int = 0
    start: int = 0


_STAND_INS = {
    "deepspeed.runtime.fp16.loss_scaler.LossScaler": LossScaler,
    "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler": DynamicLossScaler,
    "deepspeed.runtime.zero.config.ZeroStageEnum": ZeroStageEnum,
    "deepspeed.utils.tensor_fragment.fragment_address": fragment_address,
}
assert set(_STAND_INS) == DEEPSPEED_RECORDS


def deepspeed_globals() -> list[tuple[type, str]]:
    """For torch.serialization.safe_globals: each DeepSpeed record name bound to its stand-in."""
    return [(stand_in, name) for name, stand_in in sorted(_STAND_INS.items())]


def _resolve(module: str, name: str):
    target = importlib.import_module(module)
    for part in name.split("."):
        target = getattr(target, part)
    return target


def _refusing_state_on_imports(load, target):
    """`load` of an opcode that sets state on `target(self)`: refused when that is an imported class or function
    (BUILD on pathlib.PurePosixPath would re-point every later path of this process)."""
    def checked(self):
        try:
            value = target(self)
        except IndexError:  # the opcode's own load raises the unpickler's error for a short stack
            value = None
        if isinstance(value, type) or any(value is imported for imported in self.imported):
            raise pickle.UnpicklingError(f"a pickle setting state on {getattr(value, '__name__', value)!r}, "
                                         "an imported object, not on an instance")
        load(self)
    return checked


class MetadataUnpickler(pickle._Unpickler):
    """Reads a DCP `.metadata`: a global outside DCP_METADATA_GLOBALS stops the read before anything runs, and
    so does state set on an imported object itself (pickle.py's unpickler: the C one has no hook for BUILD)."""

    dispatch = dict(pickle._Unpickler.dispatch)
    for _code, _target in ((pickle.BUILD, lambda u: u.stack[-2]), (pickle.SETITEM, lambda u: u.stack[-3]),
                           (pickle.APPEND, lambda u: u.stack[-2]), (pickle.SETITEMS, lambda u: u.metastack[-1][-1]),
                           (pickle.APPENDS, lambda u: u.metastack[-1][-1]),
                           (pickle.ADDITEMS, lambda u: u.metastack[-1][-1])):
        dispatch[_code[0]] = _refusing_state_on_imports(dispatch[_code[0]], _target)
    del _code, _target

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.imported: list = []

    def find_class(self, module: str, name: str):
        if f"{module}.{name}" not in DCP_METADATA_GLOBALS:
            raise pickle.UnpicklingError(f"{module}.{name} is not a torch.distributed.checkpoint record")
        if module.startswith("pathlib"):
            module = "pathlib"  # the same classes under Python 3.13's pathlib._local
        self.imported.append(_resolve(module, name))
        return self.imported[-1]

    def persistent_load(self, pid):
        raise pickle.UnpicklingError("a .metadata file holds no tensor storage")


def read_metadata(data: bytes):
    """The DCP Metadata object of `.metadata` bytes (already scanned)."""
    return MetadataUnpickler(io.BytesIO(data)).load()
