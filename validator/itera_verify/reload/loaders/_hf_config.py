"""What a transformers model folder may say that reaches from_pretrained, and the quantized weights it declares.

transformers reads most of config.json as the model's shape (sizes, layer counts, labels), which the weight check
then holds to the files. A few keys choose code, files, attention kernels, quantization or placement instead: those
are admitted only with the values of STEERING, at any depth (transformers reads a text_config's
quantization_config too); any other value is IV504 before from_pretrained runs. An adapter_config.json beside the
model makes from_pretrained attach the adapter it describes (and, without a config.json, load the base it names):
a model folder may not carry one (a PEFT adapter is a `peft` artifact).
"""
from __future__ import annotations

from pathlib import Path

from ...format.loaders import QUANTIZATION_LIBRARIES
from ..common import LOAD, Outcome, Stop, nonfinite_count, require
from ._admit import BOOLEAN, MODULE, NUMBER, Admit, admit, list_of, one_of, optional, refuse, stop_if_refused, walk

ADAPTER_CONFIG = "adapter_config.json"

# quantization_config of each admitted quant_method, key by key: what that library's save writes, with values that
# change nothing about which tensors load or where. Tried and tested: tests/test_loaders_quantized.py. Each
# method also has its library in format/loaders.py QUANTIZATION_LIBRARIES (a test holds the two equal).
QUANTIZATION: dict[str, dict[str, Admit]] = {
    "bitsandbytes": {
        "quant_method": one_of("bitsandbytes"),
        "load_in_4bit": BOOLEAN, "load_in_8bit": BOOLEAN, "_load_in_4bit": BOOLEAN, "_load_in_8bit": BOOLEAN,
        "llm_int8_threshold": NUMBER,
        # Plain module names: transformers reads each entry as a regular expression over every module's name.
        "llm_int8_skip_modules": optional(list_of(MODULE)),
        "llm_int8_enable_fp32_cpu_offload": one_of(False),  # weights offloaded to the CPU are not a GPU reload
        "llm_int8_has_fp16_weight": BOOLEAN,
        "bnb_4bit_compute_dtype": optional(one_of("float32", "float16", "bfloat16")),
        "bnb_4bit_quant_type": one_of("fp4", "nf4"),
        "bnb_4bit_use_double_quant": BOOLEAN,
        "bnb_4bit_quant_storage": optional(one_of("uint8", "float16", "bfloat16", "float32")),
    },
}

# Attention and experts kernels transformers implements itself; any other name is a kernel to fetch or import.
ATTENTION = optional(one_of("eager", "sdpa"))
EXPERTS = optional(one_of("eager"))
# config.json keys that choose code, files or kernels rather than the model's shape -> what each may be.
STEERING: dict[str, Admit] = {
    "attn_implementation": ATTENTION, "_attn_implementation": ATTENTION,
    "experts_implementation": EXPERTS, "_experts_implementation": EXPERTS,
    # save_pretrained never writes it: a config naming its own weight file chooses what loads.
    "transformers_weights": one_of(None),
    "fusion_config": one_of(None),  # patches the model's modules while it is built
    "custom_pipelines": optional(one_of({})),  # code for pipeline(): custom code is never imported
}


def admit_config(config: dict, path: Path, outcome: Outcome) -> None:
    """config.json's steering keys, at any depth, each with an admitted value; else IV504 before loading."""
    for name, key, value, holder in walk(config):
        if key in STEERING and not STEERING[key](value):
            refuse(outcome, path, name, value, f"expected {STEERING[key].what}")
        elif key == "quantization_config" and value is not None:
            _admit_quantization(value, name, path, outcome)
        elif key == "auto_map" and value:
            _admit_auto_map(holder, name, path, outcome)
    stop_if_refused(outcome)


def _admit_quantization(declared, name: str, path: Path, outcome: Outcome) -> None:
    method = declared.get("quant_method") if isinstance(declared, dict) else None
    if method not in QUANTIZATION:
        refuse(outcome, path, f"{name}.quant_method", method,
               f"admitted quant_method: {', '.join(QUANTIZATION)} (the methods tried and tested here)")
        return
    admit(declared, QUANTIZATION[method], path, outcome, prefix=f"{name}.")


def _admit_auto_map(holder: dict, name: str, path: Path, outcome: Outcome) -> None:
    """auto_map names remote code, which is never run: admitted (ignored) only where transformers has its own
    class for the model_type beside it; otherwise the model exists only as that code."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    model_type = holder.get("model_type")
    if not (isinstance(model_type, str) and model_type in CONFIG_MAPPING_NAMES):
        refuse(outcome, path, name, holder.get("auto_map"), f"model_type {model_type!r} is not one of transformers' "
                                                          "own: the model exists only as custom code, never imported")


def refuse_adapter(folder: Path, outcome: Outcome) -> None:
    """A model folder with an adapter_config.json: from_pretrained would attach that adapter to the model."""
    if (folder / ADAPTER_CONFIG).is_file():
        raise Stop(LOAD, f"{outcome.rel(folder / ADAPTER_CONFIG)} beside a model: from_pretrained would attach the "
                         "adapter it describes (a PEFT adapter is reloaded by the `peft` loader, on its pinned base); "
                         "refused before loading", folder / ADAPTER_CONFIG)


def quantization(config: dict, job: dict) -> str | None:
    """The config's quantization method; the library that loads it imported first, so that its absence is one
    clear IV505 naming the extra rather than from_pretrained's error about the artifact."""
    declared = config.get("quantization_config")
    method = declared.get("quant_method") if isinstance(declared, dict) else None
    if not isinstance(method, str):
        return None
    if method in QUANTIZATION_LIBRARIES:
        module, extra = QUANTIZATION_LIBRARIES[method]
        require(job, module, extra=extra)
    return method


def check_quantized(model, method: str, outcome: Outcome) -> None:
    """The quantized weights, which check_parameters sees as integers, proven finite once dequantized: bitsandbytes
    4-bit weights through dequantize_4bit (their absmax scales), 8-bit ones by their row scales (SCB)."""
    bad, count = [], 0
    for name, parameter in model.named_parameters():
        state, scales = getattr(parameter, "quant_state", None), getattr(parameter, "SCB", None)
        if state is not None:
            from bitsandbytes.functional import dequantize_4bit

            values = dequantize_4bit(parameter.data, state)
        elif scales is not None:
            values = scales
        else:
            continue
        count += 1
        found = nonfinite_count(values)
        if found:
            bad.append(f"{name} ({found} non-finite)")
    outcome.facts["quantization"] = method
    outcome.facts["dequantized_tensors"] = count
    if bad:
        raise Stop(LOAD, f"quantized weights ({method}) non-finite once dequantized: {', '.join(bad[:5])}"
                   + (f" and {len(bad) - 5} more" if len(bad) > 5 else ""))
