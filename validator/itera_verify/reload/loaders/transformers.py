"""Loader `transformers`: from_pretrained on the local folder (no hub, no remote code), every weight loaded and
finite, one forward pass with finite logits."""
from __future__ import annotations

import json
import re
from pathlib import Path

from ..common import LOAD, MISSING, Outcome, Stop, check_parameters, forward_pass, scan_folder, short, torch_dtype

CLASS_NAME = re.compile(r"[A-Z][A-Za-z0-9]*")


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
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise Stop(LOAD, f"{outcome.rel(path)} does not parse: {short(exc)}", path) from exc
    if not isinstance(value, dict):
        raise Stop(LOAD, f"{outcome.rel(path)} is not a JSON object", path)
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

    def meta_model():
        from accelerate import init_empty_weights
        from transformers import AutoConfig

        dtypes = {k: v for k, v in (extra or {}).items() if k in ("dtype", "torch_dtype")}
        overrides = {k: v for k, v in (extra or {}).items() if k not in dtypes}  # num_labels of a task head
        config = AutoConfig.from_pretrained(str(folder), local_files_only=True, trust_remote_code=False, **overrides)
        with init_empty_weights():
            return cls.from_config(config, trust_remote_code=False, **dtypes)

    try:
        plan = placement.plan(placement.weight_bytes(folder), free, cap=placement.cap_from_environment(),
                              meta_model=meta_model)
    except placement.Offload as exc:
        raise Stop(LOAD, str(exc)) from None
    outcome.facts["devices"] = plan.devices
    if plan.device_map is None:
        return {"device_map": {"": f"cuda:{plan.gpus[0]}"}}
    return {"device_map": plan.device_map, "max_memory": plan.max_memory}


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
    if config.get("auto_map"):
        outcome.facts["remote_code_refused"] = True  # from_pretrained fails below: trust_remote_code is False
    scan_folder(folder, outcome)
    check_weight_files(folder, outcome)
    cls = model_class(job.get("class"), config, default_class)
    dtype = torch_dtype(job)
    kwargs = {dtype_keyword(): dtype} if dtype is not None else {}
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
    return model


def reload(job: dict, device, outcome: Outcome) -> None:
    model = load_model(Path(job["path"]), job, device, outcome)
    outcome.forward = forward_pass(model, device)
