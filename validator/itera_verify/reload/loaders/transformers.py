"""Loader `transformers`: from_pretrained on the local folder (no hub, no remote code), every weight loaded and
finite, one forward pass with finite logits. Before from_pretrained allocates anything, the model config.json
declares is built on the meta device and must fit the weight files (check_declared_size)."""
from __future__ import annotations

import re
from pathlib import Path

from ..common import (LOAD, MISSING, Outcome, Stop, check_parameters, forward_pass, nonfinite_count,
                      read_json_document, scan_folder, short, torch_dtype)
from ._hf_config import admit_config, check_quantized, quantization, refuse_adapter

CLASS_NAME = re.compile(r"[A-Z][A-Za-z0-9]*")
# Values a config may declare beyond those its weight files hold: a new task head, buffers, a head the adapter
# brings (peft). Far more means the config does not describe these files: one number in it (`n_inner`,
# `intermediate_size`, `vocab_size`) asks from_pretrained for gigabytes before it reports the mismatch.
UNSTORED_VALUES = 1 << 24  # or a quarter of the stored values, whichever is more
# A quantized checkpoint (`quantization_config`) packs down to 4 bits a parameter: two per stored byte.
PACKED_PER_BYTE = 2


def model_class(requested: str | None, config: dict | None, default: str = "AutoModel"):
    """reload.json's `class`, else the config's first architecture, else `default`; transformers' own only."""
    import transformers

    candidates = [requested] if requested else []
    if not requested and isinstance(config, dict) and isinstance(config.get("architectures"), list):
        candidates += [a for a in config["architectures"][:1] if isinstance(a, str)]
    candidates.append(default)
    for name in candidates:
        if not isinstance(name, str) or not CLASS_NAME.fullmatch(name):
            raise Stop(LOAD, f"class {name!r} is not a transformers class name")
        try:
            cls = getattr(transformers, name)
        except (AttributeError, ImportError, RuntimeError):
            if name == requested:
                raise Stop(LOAD, f"transformers has no class {name!r} (reload.json `class`)") from None
            continue
        if hasattr(cls, "from_pretrained"):
            return cls
        if name == requested:
            raise Stop(LOAD, f"{name!r} cannot load a model (reload.json `class`)")
    raise Stop(LOAD, "no transformers class can load this model")


def dtype_keyword() -> str:
    """`dtype` since transformers 4.56, `torch_dtype` before."""
    import transformers

    major, minor = (int(x) for x in re.findall(r"\d+", transformers.__version__)[:2])
    return "dtype" if (major, minor) >= (4, 56) else "torch_dtype"


def read_config(folder: Path, outcome: Outcome) -> dict:
    path = folder / "config.json"
    if not path.is_file():
        raise Stop(MISSING if outcome.job.get("loader") == "hf-trainer-checkpoint" else LOAD,
                   f"{outcome.rel(path)} is missing: transformers cannot build the model", path)
    value = read_json_document(path, outcome)
    if not isinstance(value, dict):
        raise Stop(LOAD, f"{outcome.rel(path)} is not a JSON object", path)
    admit_config(value, path, outcome)  # the keys that would choose code, files or kernels: before any library reads it
    return value


def check_weight_files(folder: Path, outcome: Outcome) -> None:
    """Name the broken file ourselves: from_pretrained reports a truncated header or a missing shard without it."""
    from safetensors import SafetensorError, safe_open

    from .safetensors import INDEX_SUFFIX, shard_plan

    if any(folder.glob(f"*{INDEX_SUFFIX}")):
        shard_plan(folder, outcome)  # records every missing shard
    for file in sorted(folder.glob("*.safetensors")):
        try:
            with safe_open(str(file), framework="pt") as handle:
                handle.keys()
        except (SafetensorError, OSError) as exc:
            outcome.fail(LOAD, f"{outcome.rel(file)} is not a valid safetensors file: {short(exc)}", file)
    if outcome.problems:
        raise Stop.recorded()


def _tied(model, key: str, missing: set[str]) -> bool:
    """A key absent from the files because it shares storage with one that was loaded (GPT-2's lm_head)."""
    try:
        tensor = model.get_parameter(key)
    except AttributeError:
        return False
    return any(other is tensor or (other.data_ptr() == tensor.data_ptr() and other.shape == tensor.shape)
               for name, other in model.named_parameters(remove_duplicate=False)
               if name != key and name not in missing)


def check_loading_info(model, info: dict, label: str, provided: frozenset[str] = frozenset(),
                       provider: str = "") -> list[str]:
    """Missing, unexpected or resized keys are failures: a model with random weights still 'loads'.

    `provided`: keys that `provider` (an adapter's modules_to_save) loads over the model right after, so their
    absence here is by design (a new task head on a plain base). Returns those keys, sorted."""
    missing = {str(k) for k in info.get("missing_keys") or ()}
    missing = {k for k in missing if not _tied(model, k, missing)}
    covered = sorted(missing & provided)
    missing -= provided
    problems = []
    if missing:
        problems.append(f"{len(missing)} missing key(s): {', '.join(sorted(missing)[:5])}"
                        + (f" (in neither the checkpoint nor {provider})" if provider else ""))
    unexpected = sorted(str(k) for k in info.get("unexpected_keys") or ())
    if unexpected:
        problems.append(f"{len(unexpected)} unexpected key(s): {', '.join(unexpected[:5])}")
    mismatched = list(info.get("mismatched_keys") or ())
    if mismatched:
        problems.append(f"{len(mismatched)} key(s) with the wrong shape: {', '.join(map(str, mismatched[:3]))}")
    errors = [str(e) for e in info.get("error_msgs") or ()]
    if errors:
        problems.append("; ".join(errors[:2]))
    if problems:
        raise Stop(LOAD, f"{label}: " + "; ".join(problems))
    return covered


def device_map(folder: Path, cls, job: dict, device, outcome: Outcome, extra: dict | None = None) -> dict:
    """from_pretrained's placement: straight onto `device` (no copy in host memory first), or, on a GPU, the
    device map over the job's GPUs when one GPU's free memory is too small (placement.py); refused (IV504)
    when any part would be offloaded to the CPU or disk."""
    if device.type != "cuda":
        return {"device_map": {"": str(device)}}
    import torch

    from .. import placement

    gpus = [int(g) for g in job.get("gpus") or [device.index or 0]]
    free = {gpu: torch.cuda.mem_get_info(gpu)[0] for gpu in gpus}

    try:
        plan = placement.plan(placement.weight_bytes(folder), free, cap=job.get("gpu_memory_cap"),
                              meta_model=lambda: empty_model(folder, cls, extra))
    except placement.Offload as exc:
        raise Stop(LOAD, str(exc)) from None
    outcome.facts["devices"] = plan.devices
    if plan.device_map is None:
        return {"device_map": {"": f"cuda:{plan.gpus[0]}"}}
    return {"device_map": plan.device_map, "max_memory": plan.max_memory}


def empty_model(folder: Path, cls, extra: dict | None = None):
    """The model of `folder`'s config.json on the meta device: every shape, not one byte allocated (buffers
    included, which accelerate's init_empty_weights would still allocate). `extra`: from_pretrained's dtype and
    config overrides (num_labels of a task head)."""
    import torch
    from transformers import AutoConfig

    dtypes = {k: v for k, v in (extra or {}).items() if k in ("dtype", "torch_dtype")}
    overrides = {k: v for k, v in (extra or {}).items() if k not in dtypes}
    config = AutoConfig.from_pretrained(str(folder), local_files_only=True, trust_remote_code=False, **overrides)
    with torch.device("meta"):
        if hasattr(cls, "from_config"):  # the Auto classes
            return cls.from_config(config, trust_remote_code=False, **dtypes)
        return cls._from_config(config, **dtypes)  # a model class (reload.json `class`: GPT2LMHeadModel)


def stored_values(folder: Path) -> tuple[int, int, set[int]]:
    """(values, bytes, every dimension) of the weight files from_pretrained reads in `folder`: the safetensors
    files (their headers, already validated by check_weight_files), else pytorch_model*.bin (its bytes: no
    value takes less than one)."""
    from math import prod

    from ...package.files import read_safetensors_header

    values, size, dims = 0, 0, set()
    files = sorted(folder.glob("*.safetensors"))
    for file in files:
        header = read_safetensors_header(file)
        for entry in header.entries.values() if header else ():
            values += prod(entry.shape)
            size += entry.nbytes
            dims.update(entry.shape)
    if not files:
        for file in sorted(folder.glob("pytorch_model*.bin")):
            values += file.stat().st_size
            size += file.stat().st_size
    return values, size, dims


def _flat_numbers(config, prefix: str = "") -> dict[str, int]:
    """config.json's integer fields, nested ones (text_config.intermediate_size) by their dotted name."""
    found = {}
    for key, value in config.items() if isinstance(config, dict) else ():
        if isinstance(value, dict):
            found.update(_flat_numbers(value, f"{prefix}{key}."))
        elif isinstance(value, int) and not isinstance(value, bool) and value > 1:
            found[f"{prefix}{key}"] = value
    return found


def _culprit(config: dict, model, dims: set[int]) -> str:
    """The config field behind the largest tensor whose shape no stored tensor has, as `field=value makes
    NAME [shape]`; the largest declared tensor when no field matches."""
    numbers = _flat_numbers(config)
    named = sorted(model.named_parameters(), key=lambda item: -item[1].numel())
    for name, tensor in named:
        for dim in tensor.shape:
            if dim in dims:
                continue
            fields = [key for key, value in numbers.items() if value == dim]
            if fields:
                return f"{fields[0]}={dim} makes {name} {list(tensor.shape)}"
    if named:
        name, tensor = named[0]
        return f"its largest tensor is {name} {list(tensor.shape)}"
    return "it declares no parameter"


def check_declared_size(folder: Path, cls, extra: dict | None, config: dict, outcome: Outcome,
                        label: str | None = None, stored: tuple[int, int, set[int]] | None = None) -> None:
    """Before from_pretrained allocates the model: the model config.json declares, built on the meta device,
    holds no more values than the weight files (within UNSTORED_VALUES); otherwise IV504 naming the config
    field and the numbers, before a byte is allocated. `stored`: (values, bytes, dimensions) held elsewhere
    than in `folder`'s weight files (a sharded state the model is built for); default stored_values(folder)."""
    from collections import Counter

    from ..placement import human

    label = label or outcome.rel(folder / "config.json")
    try:
        model = empty_model(folder, cls, extra)
    except Exception as exc:
        raise Stop(LOAD, f"{label} does not build a model: {short(exc)}", folder / "config.json") from exc
    by_dtype: Counter = Counter()
    declared = 0
    for tensor in list(model.parameters()) + list(model.buffers()):  # tied weights once
        declared += tensor.numel()
        by_dtype[str(tensor.dtype).removeprefix("torch.")] += tensor.numel() * tensor.element_size()
    values, size, dims = stored if stored is not None else stored_values(folder)
    capacity = size * PACKED_PER_BYTE if config.get("quantization_config") else values
    outcome.facts["declared_parameters"] = declared
    if declared <= capacity + max(capacity // 4, UNSTORED_VALUES):
        return
    sizes = ", ".join(f"{human(amount)} {dtype}" for dtype, amount in by_dtype.most_common())
    raise Stop(LOAD, f"{label} declares a model of {declared:,} values ({sizes}) but its weight files hold "
                     f"{values:,} ({human(size)}): {_culprit(config, model, dims)}; refused before building it",
               folder / "config.json")


def check_on_gpu(model, device, label: str) -> None:
    """After a GPU load, every tensor on a GPU: an offloaded part is not a GPU reload (IV504, never a pass)."""
    if device.type != "cuda":
        return
    from ..placement import off_gpu_tensors

    off = off_gpu_tensors(model)
    if off:
        raise Stop(LOAD, f"{label}: not reloaded on the GPU: {len(off)} tensor(s) or module(s) offloaded: "
                         f"{', '.join(off[:4])}")


def spread(model) -> bool:
    """Placed over several GPUs by a device map: moving it to one device would undo the placement."""
    return len({str(where) for where in (getattr(model, "hf_device_map", None) or {}).values()}) > 1


def load_model(folder: Path, job: dict, device, outcome: Outcome, *, default_class: str = "AutoModel"):
    """from_pretrained of a local model folder, checked; returns the model on `device` (or over the job's
    GPUs), in eval mode."""
    config = read_config(folder, outcome)
    refuse_adapter(folder, outcome)
    if config.get("auto_map"):
        outcome.facts["remote_code_ignored"] = True  # admitted for transformers' own model_type only: never run
    scan_folder(folder, outcome)
    check_weight_files(folder, outcome)
    method = quantization(config, job)
    cls = model_class(job.get("class"), config, default_class)
    dtype = torch_dtype(job)
    kwargs = {dtype_keyword(): dtype} if dtype is not None else {}
    check_declared_size(folder, cls, kwargs, config, outcome)
    try:
        placed = device_map(folder, cls, job, device, outcome, kwargs)
        model, info = cls.from_pretrained(str(folder), local_files_only=True, trust_remote_code=False,
                                          output_loading_info=True, **kwargs, **placed)
    except Stop:
        raise
    except Exception as exc:
        raise Stop(LOAD, f"from_pretrained failed: {short(exc)}") from exc
    check_loading_info(model, info, "weights")
    check_on_gpu(model, device, "weights")
    if not spread(model):
        model.to(device)  # a no-op when the device map put it there; kept for models that ignore the map
    model.eval()
    outcome.facts["class"] = type(model).__name__
    outcome.facts["parameters"] = sum(p.numel() for p in model.parameters())
    outcome.facts["dtype"] = str(next(model.parameters()).dtype).removeprefix("torch.")
    check_parameters(model, outcome, "model")
    if method:
        check_quantized(model, method, outcome)
    return model


# Audio models without a declared input length: one second at 16 kHz (wav2vec2's input_values).
AUDIO_SAMPLES = 16_000


def _sizes(config, name: str, default):
    """A size the config declares, also under its vision or audio sub-config (CLIP, LLaVA)."""
    for part in (config, getattr(config, "vision_config", None), getattr(config, "audio_config", None)):
        value = getattr(part, name, None) if part is not None else None
        if value is not None:
            return value
    return default


def synthetic_inputs(model, device) -> dict | None:
    """An input of the shape the config declares for a model that takes no token ids: images (pixel_values:
    num_channels x image_size), spectrograms (input_features: num_mel_bins x twice max_source_positions, Whisper's
    3000 frames), waveforms (input_values). None when the forward takes none of these."""
    import inspect

    import torch

    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return None
    config = model.config
    dtype = next(model.parameters()).dtype
    generator = torch.Generator().manual_seed(0)
    if "pixel_values" in params:
        size = _sizes(config, "image_size", 224)
        height, width = (size, size) if isinstance(size, int) else tuple(size)[-2:]
        shape = (1, _sizes(config, "num_channels", 3), height, width)
        inputs = {"pixel_values": torch.randn(shape, generator=generator)}
    elif "input_features" in params:
        frames = 2 * _sizes(config, "max_source_positions", 50)
        inputs = {"input_features": torch.randn((1, _sizes(config, "num_mel_bins", 80), frames), generator=generator)}
    elif "input_values" in params:
        inputs = {"input_values": torch.randn((1, AUDIO_SAMPLES), generator=generator)}
    else:
        return None
    inputs = {name: value.to(device=device, dtype=dtype) for name, value in inputs.items()}
    if getattr(config, "is_encoder_decoder", False) and "decoder_input_ids" in params:
        start = getattr(config, "decoder_start_token_id", None)
        inputs["decoder_input_ids"] = torch.tensor([[start if isinstance(start, int) else 0]], device=device)
    return inputs


def other_forward(model, device) -> str | None:
    """The forward pass of an image or audio model on synthetic_inputs; None when it takes none of them."""
    import torch

    inputs = synthetic_inputs(model, device)
    if inputs is None:
        return None
    try:
        with torch.no_grad():
            output = model(**inputs)
    except Exception as exc:  # noqa: BLE001 - any failure of the forward is a model that does not run
        raise Stop(LOAD, f"forward pass on a synthetic {'/'.join(inputs)} failed: {short(exc)}") from exc
    values = next((getattr(output, name) for name in ("logits", "last_hidden_state", "pooler_output")
                   if torch.is_tensor(getattr(output, name, None))), None)
    if values is None:
        return f"ran on a synthetic {', '.join(inputs)}, no tensor output to check"
    bad = nonfinite_count(values)
    if bad:
        raise Stop(LOAD, f"forward pass on a synthetic {', '.join(inputs)} gave {bad} non-finite value(s) out of "
                         f"{values.numel()}")
    given = ", ".join(f"{name} {tuple(value.shape)}" for name, value in inputs.items())
    return f"finite output {tuple(values.shape)} {str(values.dtype).removeprefix('torch.')} (synthetic {given})"


def reload(job: dict, device, outcome: Outcome) -> None:
    model = load_model(Path(job["path"]), job, device, outcome)
    forward = forward_pass(model, device)
    if forward.startswith("not run"):  # takes no token ids: an image or audio model
        forward = other_forward(model, device) or forward
    outcome.forward = forward
