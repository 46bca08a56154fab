"""The globals a pickle may name (docs/format.md): an allowlist of exact names, never a blocklist."""
from __future__ import annotations

import re

_TORCH_DTYPES = {
    "float16", "float32", "float64", "bfloat16", "half", "float", "double", "complex32", "complex64",
    "complex128", "cfloat", "cdouble", "uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64",
    "short", "int", "long", "bool", "qint8", "quint8", "qint32", "quint4x2", "quint2x4", "float8_e4m3fn",
    "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu", "float4_e2m1fn_x2",
    "bits1x8", "bits2x4", "bits4x2", "bits8", "bits16",
    *(f"uint{n}" for n in range(1, 8)), *(f"int{n}" for n in range(1, 8)),
}
# Layouts and quantisation schemes are arguments of the sparse / quantised tensor rebuilds.
_TORCH_TENSOR_ARGS = {"strided", "sparse_coo", "sparse_csr", "sparse_csc", "sparse_bsr", "sparse_bsc",
                      "per_tensor_affine", "per_channel_affine", "per_tensor_symmetric", "per_channel_symmetric",
                      "per_channel_affine_float_qparams"}
_TORCH_REBUILDS = {"_rebuild_tensor", "_rebuild_tensor_v2", "_rebuild_tensor_v3", "_rebuild_parameter",
                   "_rebuild_parameter_with_state", "_rebuild_sparse_tensor", "_rebuild_nested_tensor",
                   "_rebuild_qtensor", "_rebuild_wrapper_subclass", "_rebuild_meta_tensor_no_storage",
                   "_rebuild_device_tensor_from_cpu_tensor", "_rebuild_device_tensor_from_numpy"}
# Multi-GPU outputs (docs/format.md, multi-GPU readings): the plain data records DeepSpeed pickles into its optimizer
# shards, and the records torch.distributed.checkpoint pickles into `.metadata`. The reload registers exactly
# these (DeepSpeed's as inert stand-ins: reload/records.py), so they are loadable like tensors.
DEEPSPEED_RECORDS = frozenset({
    "deepspeed.runtime.fp16.loss_scaler.LossScaler",
    "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler",
    "deepspeed.runtime.zero.config.ZeroStageEnum",
    "deepspeed.utils.tensor_fragment.fragment_address",
})
DCP_RECORDS = frozenset({
    *(f"torch.distributed.checkpoint.metadata.{name}" for name in (
        "Metadata", "MetadataIndex", "StorageMeta", "TensorStorageMetadata", "BytesStorageMetadata",
        "ChunkStorageMetadata", "TensorProperties", "_MEM_FORMAT_ENCODING")),
    "torch.distributed.checkpoint.filesystem._StorageInfo",
    # StorageMeta.checkpoint_id is the save folder as a path; Python 3.13 defines the classes in pathlib._local.
    "pathlib.PosixPath", "pathlib.PurePosixPath", "pathlib._local.PosixPath", "pathlib._local.PurePosixPath",
})
ALLOWED_GLOBALS = frozenset({
    *DEEPSPEED_RECORDS, *DCP_RECORDS,
    "collections.OrderedDict", "_codecs.encode",
    "torch.Size", "torch.device", "torch.Tensor", "torch.nn.Parameter", "torch.nn.parameter.Parameter",
    "torch._tensor._rebuild_from_type_v2", "torch.serialization._get_layout",
    "torch.storage.TypedStorage", "torch.storage.UntypedStorage",
    "numpy._core.multiarray._reconstruct", "numpy.core.multiarray._reconstruct", "numpy.ndarray", "numpy.dtype",
    *(f"torch.{name}" for name in _TORCH_DTYPES | _TORCH_TENSOR_ARGS),
    *(f"torch._utils.{name}" for name in _TORCH_REBUILDS),
})
_ALLOWED_PATTERNS = (
    re.compile(r"torch\.(cuda\.)?[A-Za-z0-9]+Storage"),  # legacy typed storages (torch.FloatStorage, ...)
    re.compile(r"numpy\.dtypes\.[A-Za-z0-9]+DType"),  # numpy 2 dtype classes in RNG states
)

# training_args.bin (scanned, never loaded): exactly the classes, enums and dataclasses that real
# TrainingArguments pickles of transformers 5.x / accelerate 1.x name, each at the module that defines it (a
# re-export such as transformers.modeling_utils.Thread is another name, and not on the list). Collected from
# the fixture Trainer's checkpoint and from TrainingArguments pickled with other strategies, schedulers,
# optimisers, report_to, accelerator_config, debug and parallelism options (tests/test_scanner_allowlist.py).
INERT_CONFIG_FILES = ("training_args.bin",)
INERT_CONFIG = frozenset({
    "transformers.training_args.TrainingArguments",
    "transformers.training_args_seq2seq.Seq2SeqTrainingArguments",
    "transformers.training_args.OptimizerNames",
    "transformers.trainer_utils.IntervalStrategy",
    "transformers.trainer_utils.SaveStrategy",
    "transformers.trainer_utils.HubStrategy",
    "transformers.trainer_utils.SchedulerType",
    "transformers.trainer_utils.FSDPOption",
    "transformers.debug_utils.DebugOption",
    "transformers.trainer_pt_utils.AcceleratorConfig",
    "transformers.generation.configuration_utils.GenerationConfig",
    "accelerate.state.PartialState",
    "accelerate.utils.dataclasses.DistributedType",
    "accelerate.parallelism_config.ParallelismConfig",
    "accelerate.utils.dataclasses.TorchTensorParallelConfig",
    "accelerate.utils.dataclasses.TorchContextParallelConfig",
    "accelerate.utils.dataclasses.DeepSpeedSequenceParallelConfig",
    # Under DeepSpeed (docs/format.md, multi-GPU readings): the configuration objects TrainingArguments keeps.
    "transformers.integrations.deepspeed.HfTrainerDeepSpeedConfig",
    "transformers.integrations.deepspeed.HfDeepSpeedConfig",
    "accelerate.utils.deepspeed.HfDeepSpeedConfig",
    "accelerate.utils.dataclasses.DeepSpeedPlugin",
})


def is_allowed(name: str, category: str = "weights") -> bool:
    if name in ALLOWED_GLOBALS or any(p.fullmatch(name) for p in _ALLOWED_PATTERNS):
        return True
    return category == "inert-config" and name in INERT_CONFIG

# What a DCP `.metadata` (a bare pickle) may name: its records and the torch values they hold. The reload's
# restricted unpickler admits exactly these (reload/records.py); no tensor rebuild, no storage.
DCP_METADATA_GLOBALS = frozenset({
    *DCP_RECORDS, "torch.Size", "torch.serialization._get_layout", "collections.OrderedDict",
    *(f"torch.{name}" for name in _TORCH_DTYPES | _TORCH_TENSOR_ARGS),
})
