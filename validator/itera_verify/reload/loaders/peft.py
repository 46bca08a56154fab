"""Loader `peft`: adapter_config.json holds only what ADMITTED lists (PEFT builds the adapter and its base from
it), the adapter file is sound (no empty ZeRO-3 tensors, finite), the base loads from the local hub cache at
adapter_config.json's revision, the adapter attaches with every key matched, one forward pass."""
from __future__ import annotations

import dataclasses
import enum
from pathlib import Path

from ...format.names import HUB_ID
from ..common import (BASE_UNAVAILABLE, LOAD, Outcome, Stop, check_parameters, forward_pass, safe_torch_load,
                      read_json_document, scan_folder, short, torch_dtype)
from . import safetensors as safetensors_loader
from ._hf_config import refuse_adapter
from ._admit import (ANY, BOOLEAN, MODULE, NUMBER, TEXT, WHOLE, Admit, admit, list_of, mapping_of, one_of, optional,
                     stop_if_refused)
from ...format.facts import PEFT_TASK_HEADS_BY_TASK
from .transformers import (check_declared_size, check_loading_info, check_on_gpu, device_map, dtype_keyword,
                           model_class, other_forward, read_config, spread)

TASK_HEADS = PEFT_TASK_HEADS_BY_TASK
LABELLED_TASKS = ("SEQ_CLS", "TOKEN_CLS")
# A head's output layer, whose rows are the labels (BERT, Llama-style `score`, RoBERTa's classifier.out_proj).
OUTPUT_LAYERS = ("classifier.out_proj.weight", "classifier.weight", "score.weight")
TASK_CLASSES = {"CAUSAL_LM": "AutoModelForCausalLM", "SEQ_CLS": "AutoModelForSequenceClassification",
                "SEQ_2_SEQ_LM": "AutoModelForSeq2SeqLM", "TOKEN_CLS": "AutoModelForTokenClassification",
                "QUESTION_ANS": "AutoModelForQuestionAnswering", "FEATURE_EXTRACTION": "AutoModel"}
# Classes whose head has one output row per label: its size comes from the adapter's saved head.
LABELLED_CLASSES = ("ForSequenceClassification", "ForTokenClassification", "ForImageClassification",
                    "ForAudioClassification")


def base_class_name(config: dict, job: dict) -> str | None:
    """The class the base is rebuilt with, as it was trained: reload.json's `class`, else the task type's, else the
    class PEFT recorded in `auto_mapping` (an image or audio classifier has no task type), transformers' own
    only (model_class refuses any other name)."""
    if job.get("class"):
        return job["class"]
    if config.get("task_type") in TASK_CLASSES:
        return TASK_CLASSES[config["task_type"]]
    mapping = config.get("auto_mapping")
    if isinstance(mapping, dict) and str(mapping.get("parent_library") or "").startswith("transformers."):
        recorded = mapping.get("base_model_class")
        return recorded if isinstance(recorded, str) else None
    return None


# ----------------------------------------------------------------------------- what this loader admits
# adapter_config.json: a LoRA adapter, whose keys PEFT hands to LoraConfig and from there to the model it builds.
# Admitted: the adapter's shape and where it attaches, by plain module names (PEFT reads a string as a regular
# expression over every module's name). Every other LoraConfig field only at the value LoraConfig() itself gives
# it: initialisations computed from the base (pissa, olora, loftq, eva, corda: some read or write files), layer
# replication, offload, megatron's module import. Keys the installed PEFT does not know it drops unread.
TARGETS = Admit(lambda v: MODULE(v) or v == "all-linear" or list_of(MODULE, 1024)(v),
                "plain module names, or \"all-linear\"")
ADMITTED = {
    "peft_type": one_of("LORA"), "task_type": optional(one_of(*TASK_CLASSES)),
    "base_model_name_or_path": optional(TEXT),  # a pinned hub id, or IV501/IV502 and IV505 say why not
    "revision": optional(TEXT), "peft_version": optional(TEXT), "inference_mode": BOOLEAN,
    "r": WHOLE, "lora_alpha": NUMBER, "lora_dropout": NUMBER, "fan_in_fan_out": BOOLEAN,
    "bias": one_of("none", "all", "lora_only"), "use_rslora": BOOLEAN, "use_dora": BOOLEAN, "lora_bias": BOOLEAN,
    "target_modules": optional(TARGETS), "exclude_modules": optional(TARGETS),
    "modules_to_save": optional(list_of(MODULE, 256)), "target_parameters": optional(list_of(MODULE, 1024)),
    "layers_to_transform": optional(Admit(lambda v: WHOLE(v) or list_of(WHOLE, 4096)(v), "layer numbers")),
    "layers_pattern": optional(Admit(lambda v: MODULE(v) or list_of(MODULE, 16)(v), MODULE.what)),
    "rank_pattern": mapping_of(MODULE, WHOLE, 4096), "alpha_pattern": mapping_of(MODULE, NUMBER, 4096),
    # Initialises the LoRA weights the file then replaces; never an initialisation computed from the base.
    "init_lora_weights": one_of(True, False, "gaussian"),
    "trainable_token_indices": optional(Admit(lambda v: list_of(WHOLE, 1 << 20)(v)
                                              or mapping_of(MODULE, list_of(WHOLE, 1 << 20), 16)(v), "token ids")),
    "auto_mapping": optional(mapping_of(TEXT, TEXT, 4)),  # read by AutoPeftModel only, never here
}


def lora_defaults() -> dict:
    """Each LoraConfig field of the installed PEFT -> the value LoraConfig() gives it, as JSON would hold it."""
    from peft import LoraConfig

    defaults = {}
    for field in dataclasses.fields(LoraConfig):
        if field.default is not dataclasses.MISSING:
            value = field.default
        elif field.default_factory is not dataclasses.MISSING:
            value = field.default_factory()
        else:
            continue
        if dataclasses.is_dataclass(value):
            value = dataclasses.asdict(value)
        defaults[field.name] = value.value if isinstance(value, enum.Enum) else value
    return defaults


def admit_adapter_config(config: dict, path: Path, outcome: Outcome) -> None:
    """adapter_config.json: ADMITTED, every other LoraConfig field at its default; else IV504 before loading."""
    defaults = lora_defaults()
    admitted = {name: one_of(value, what=f"LoraConfig's default, {value!r}") for name, value in defaults.items()}
    admitted.update({key: ANY for key in config if key not in defaults and key not in ADMITTED})  # dropped by PEFT
    if config.get("peft_type") != "LORA":
        admitted = {"peft_type": ADMITTED["peft_type"]}  # only LoRA is tried and tested: name the type alone
        config = {"peft_type": config.get("peft_type")}
    admit(config, {**admitted, **ADMITTED}, path, outcome)
    stop_if_refused(outcome)


def read_adapter_config(folder: Path, outcome: Outcome) -> dict:
    path = folder / "adapter_config.json"
    value = read_json_document(path, outcome)
    if not isinstance(value, dict):
        raise Stop(LOAD, f"{outcome.rel(path)} is not a JSON object", path)
    admit_adapter_config(value, path, outcome)
    return value


def check_adapter_weights(folder: Path, device, outcome: Outcome) -> dict[str, tuple[int, ...]]:
    """Every adapter tensor present, non-empty and finite, before PEFT sees the file; returns their shapes."""
    file_outcome = Outcome(outcome.job)
    safetensors_file, pickle_file = folder / "adapter_model.safetensors", folder / "adapter_model.bin"
    shapes: dict[str, tuple[int, ...]] = {}
    if safetensors_file.is_file():
        safetensors_loader.load_file(safetensors_file, device, None, file_outcome)
        from safetensors import safe_open

        with safe_open(str(safetensors_file), framework="pt") as handle:  # the header only: already checked
            names = handle.keys()
            shapes = {name: tuple(handle.get_slice(name).get_shape()) for name in names}
    elif pickle_file.is_file():
        state = safe_torch_load(pickle_file, outcome, device)
        for name, tensor in (state.items() if isinstance(state, dict) else ()):
            if hasattr(tensor, "numel"):
                safetensors_loader.check_tensor(name, tensor, None, pickle_file, file_outcome)
                shapes[str(name)] = tuple(tensor.shape)
    else:
        raise Stop(LOAD, f"{outcome.rel(folder)} holds no adapter_model.safetensors or adapter_model.bin")
    outcome.problems += file_outcome.problems
    outcome.facts["adapter_tensors"] = file_outcome.facts.get("tensors", 0)
    outcome.facts["adapter_parameters"] = file_outcome.facts.get("parameters", 0)
    empty = file_outcome.facts.get("empty_tensors", [])
    if empty:
        # DeepSpeed ZeRO-3 saves partitioned parameters as torch.Size([0]) unless gathered (peft#1443).
        outcome.fail(LOAD, f"{len(empty)} adapter tensor(s) are empty (torch.Size([0]), a ZeRO-3 save without "
                           f"gathering): {', '.join(empty[:4])}", safetensors_file)
    if not file_outcome.facts.get("tensors") and not empty:
        outcome.fail(LOAD, "the adapter file holds no tensor")
    if outcome.problems:
        raise Stop.recorded()  # attaching a broken adapter would only bury these under a size-mismatch error
    return shapes


def model_key(adapter_key: str) -> str:
    """The model's own name for a tensor PEFT saved: `base_model.model.classifier.weight` -> `classifier.weight`
    (older files keep `.modules_to_save.<adapter>` inside the name)."""
    key = adapter_key.removeprefix("base_model.model.")
    parts = key.split(".")
    if "modules_to_save" in parts:
        at = parts.index("modules_to_save")
        parts = parts[:at] + parts[at + 2:] if at + 2 < len(parts) else parts[:at] + parts[at + 1:]
    return ".".join(parts)


def saved_modules(config: dict, shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """Whole modules the adapter carries (modules_to_save, the task head PEFT adds): model key -> shape.

    These are loaded over the base by the adapter, so a base checkpoint that lacks them is not incomplete."""
    names = list(config.get("modules_to_save") or ()) + list(TASK_HEADS.get(config.get("task_type"), ()))
    names = [n for n in names if isinstance(n, str) and n]
    provided = {}
    for adapter_key, shape in shapes.items():
        key = model_key(adapter_key)
        parts = key.split(".")[:-1]
        # PEFT matches a saved module by the end of its name; its own submodules (classifier.dense) come along.
        modules = [".".join(parts[:end]) for end in range(1, len(parts) + 1)]
        if any(module == n or module.endswith("." + n) for module in modules for n in names):
            provided[key] = shape
    return provided


def num_labels(config: dict, job: dict, provided: dict[str, tuple[int, ...]], outcome: Outcome) -> int | None:
    """How many labels the task head has: the rows of the adapter's saved output layer (the base config of a
    plain encoder knows nothing of the head), or reload.json's `num_labels`; both given, they must agree."""
    requested = job.get("num_labels")
    if requested is not None and (not isinstance(requested, int) or isinstance(requested, bool) or requested < 1):
        raise Stop(LOAD, f"reload.json num_labels {requested!r} is not a positive integer")
    saved = None
    if config.get("task_type") in LABELLED_TASKS or str(base_class_name(config, job)).endswith(LABELLED_CLASSES):
        saved = next(((key, shape[0]) for layer in OUTPUT_LAYERS for key, shape in sorted(provided.items())
                      if (key == layer or key.endswith("." + layer)) and len(shape) == 2), None)
    if saved and requested is not None and saved[1] != requested:
        raise Stop(LOAD, f"reload.json num_labels is {requested}, but the adapter's {saved[0]} has {saved[1]} "
                         "rows (one per label)")
    if saved:
        outcome.facts["num_labels"], outcome.facts["num_labels_from"] = saved[1], f"adapter {saved[0]}"
        return saved[1]
    if requested is not None:
        outcome.facts["num_labels"], outcome.facts["num_labels_from"] = requested, "reload.json"
    return requested


def load_base(config: dict, job: dict, device, outcome: Outcome,
              shapes: dict[str, tuple[int, ...]] | None = None):
    """The base model from the local hub cache only, at the revision PEFT itself would use.

    `shapes`: the adapter's tensors. Keys the adapter provides (a new task head) may be absent from the base;
    the head is built with as many labels as the adapter's head has rows."""
    name, revision = config.get("base_model_name_or_path"), config.get("revision")
    outcome.facts["base"] = f"{name}@{revision or 'default branch'}"
    if not isinstance(name, str) or not name:
        raise Stop(BASE_UNAVAILABLE, "adapter_config.json names no base model")
    if not HUB_ID.fullmatch(name):
        raise Stop(BASE_UNAVAILABLE, f"base {name!r} is a local path, not a hub id: it cannot be verified offline")
    cache = job.get("hf_cache")
    from huggingface_hub import try_to_load_from_cache

    config_file = try_to_load_from_cache(name, "config.json", cache_dir=cache,
                                         revision=revision if isinstance(revision, str) else None)
    if not isinstance(config_file, str):
        raise Stop(BASE_UNAVAILABLE, f"base {name}@{revision or 'main'} is not in the local hub cache ({cache}); "
                                     "unverified is not verified")
    scan_folder(Path(config_file).parent, outcome)
    cls = model_class(base_class_name(config, job), None, "AutoModel")
    outcome.facts["base_class"] = cls.__name__
    dtype = torch_dtype(job)
    provided = saved_modules(config, shapes or {})
    labels = num_labels(config, job, provided, outcome)
    kwargs = {dtype_keyword(): dtype} if dtype is not None else {}
    if labels is not None:
        kwargs["num_labels"] = labels
    snapshot = Path(config_file).parent
    refuse_adapter(snapshot, outcome)  # from_pretrained would attach it to the base
    # The base's config.json is the cache's, but a package may ship the cache (--hf-cache): the same check.
    check_declared_size(snapshot, cls, kwargs, read_config(snapshot, outcome), outcome,
                        label=f"base {name}@{revision or 'main'} config.json")
    try:
        placed = device_map(snapshot, cls, job, device, outcome, kwargs)
        model, info = cls.from_pretrained(name, revision=revision, cache_dir=cache, local_files_only=True,
                                          trust_remote_code=False, output_loading_info=True, **kwargs, **placed)
    except Stop:
        raise
    except OSError as exc:  # a snapshot without its weights: still not available offline
        raise Stop(BASE_UNAVAILABLE, f"base {name}@{revision} does not load from the hub cache: {short(exc)}") from exc
    except Exception as exc:
        raise Stop(LOAD, f"base {name}@{revision}: {short(exc)}") from exc
    from_adapter = check_loading_info(model, info, "base model", frozenset(provided), "the adapter")
    if from_adapter:
        outcome.facts["base_keys_from_adapter"] = from_adapter  # a new head, trained and saved by the run
    resize_to_saved_embeddings(model, shapes or {}, outcome)
    return model


def resize_to_saved_embeddings(model, shapes: dict[str, tuple[int, ...]], outcome: Outcome) -> None:
    """An adapter trained with added tokens saves the resized embeddings (save_embedding_layers): the base is
    resized to their rows before they attach, as the run's own script did (IV516 judges whether the tokenizer
    fits them)."""
    embeddings = model.get_input_embeddings()
    weight = getattr(embeddings, "weight", None)
    if weight is None:
        return
    name = next((n for n, p in model.named_parameters() if p is weight), None)
    rows = {shape[0] for key, shape in shapes.items() if model_key(key) == name and shape}
    before = weight.shape[0]
    if len(rows) == 1 and (target := rows.pop()) != before:
        model.resize_token_embeddings(target)  # may resize the same Parameter in place
        outcome.facts["resized_embeddings"] = f"{before} -> {target} rows, as the adapter saved them"


def attach(base, folder: Path, device, outcome: Outcome, *, trainable: bool = False):
    """PeftModel with the adapter loaded; the load result must match every adapter key."""
    from peft import PeftConfig, PeftModel

    try:
        from peft.auto import MODEL_TYPE_TO_PEFT_MODEL_MAPPING
    except ImportError:  # older peft
        from peft.mapping import MODEL_TYPE_TO_PEFT_MODEL_MAPPING
    try:
        config = PeftConfig.from_pretrained(str(folder), local_files_only=True)
        config.inference_mode = not trainable
        cls = MODEL_TYPE_TO_PEFT_MODEL_MAPPING.get(config.task_type, PeftModel)
        model = cls(base, config, "default")
        result = model.load_adapter(str(folder), "default", is_trainable=trainable, torch_device=str(device),
                                    local_files_only=True)
    except Exception as exc:
        raise Stop(LOAD, f"the adapter does not attach to its base: {short(exc)}") from exc
    problems = []
    if result.missing_keys:
        problems.append(f"{len(result.missing_keys)} adapter key(s) missing from the file: "
                        f"{', '.join(sorted(result.missing_keys)[:4])}")
    if result.unexpected_keys:
        problems.append(f"{len(result.unexpected_keys)} key(s) in the file match nothing in the base: "
                        f"{', '.join(sorted(result.unexpected_keys)[:4])}"
                        + (" (the keys carry the DDP wrapper's `module.` prefix: save the unwrapped model, "
                           "model.module)" if all(".module." in f".{k}" for k in result.unexpected_keys) else ""))
    if problems:
        raise Stop(LOAD, "; ".join(problems))
    if not spread(base):
        model.to(device)
    check_on_gpu(model, device, "model")
    if not trainable:
        model.eval()
    check_parameters(model, outcome, "model")
    return model


def load_adapter_model(folder: Path, job: dict, device, outcome: Outcome, *, trainable: bool = False):
    config = read_adapter_config(folder, outcome)
    shapes = check_adapter_weights(folder, device, outcome)
    base = load_base(config, job, device, outcome, shapes)
    return attach(base, folder, device, outcome, trainable=trainable)


def reload(job: dict, device, outcome: Outcome) -> None:
    model = load_adapter_model(Path(job["path"]), job, device, outcome)
    forward = forward_pass(model, device)
    if forward.startswith("not run"):  # a PeftModel without a task takes **kwargs: its base's inputs, LoRA active
        forward = forward_pass(model.get_base_model(), device)
        if forward.startswith("not run"):  # an image or audio classifier
            forward = other_forward(model.get_base_model(), device) or forward
    outcome.forward = forward
