"""Each loader's list of what it admits from the artifact's own files (docs/survival.md), key by key: the library's
own save is admitted whole, and every dangerous key planted into it is refused by name, before any library call
(the gates run here in the test process on real saved files; tests/test_loaders_package_options.py reloads the
attacks as `verify` does)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from fixtures.extra_loaders import (import_timm, write_bnb_4bit, write_diffusers_pipeline, write_sentence_transformer,
                                    write_timm)
from itera_verify.format.loaders import QUANTIZATION_LIBRARIES
from itera_verify.reload.common import Outcome, Stop

pytestmark = pytest.mark.filterwarnings("ignore")


def refusals(root: Path, gate, *args) -> list[str]:
    """The messages a gate records (it stops when it refuses anything)."""
    outcome = Outcome({"package_root": str(root)})
    try:
        gate(*args, outcome)
    except Stop as stop:
        return [p["message"] for p in outcome.problems] + ([stop.message] if stop.message else [])
    return [p["message"] for p in outcome.problems]


def plant(document: dict, pointer: str, value) -> dict:
    """`document` with `value` at the dotted `pointer` (made where missing)."""
    document = json.loads(json.dumps(document))
    *outer, last = pointer.split(".")
    holder = document
    for key in outer:
        holder = holder.setdefault(key, {})
    holder[last] = value
    return document


# ----------------------------------------------------------------------------- sentence-transformers

@pytest.fixture(scope="module")
def st_save(tmp_path_factory):
    work = tmp_path_factory.mktemp("st-keys")
    return write_sentence_transformer(work / "st", work)


def st_gate(folder: Path, outcome: Outcome) -> None:
    from itera_verify.reload.loaders import sentence_transformers as loader

    loader.admit_module_files(folder, loader.read_modules(folder, outcome, loader.module_types()), outcome)


def test_a_sentence_transformer_save_is_admitted_whole(st_save):
    assert refusals(st_save, st_gate, st_save) == []


@pytest.mark.parametrize("file, pointer, value", [
    ("sentence_bert_config.json", "model_args.device_map", "auto"),
    ("sentence_bert_config.json", "model_args.offload_folder", "/some/absolute/folder"),
    ("sentence_bert_config.json", "model_kwargs.max_memory", {"cpu": 1000}),
    ("sentence_bert_config.json", "model_kwargs.gguf_file", "model.gguf"),
    ("sentence_bert_config.json", "model_args.use_safetensors", False),
    ("sentence_bert_config.json", "model_args.weights_only", False),
    ("sentence_bert_config.json", "model_args.quantization_config", {"quant_method": "bitsandbytes"}),
    ("sentence_bert_config.json", "model_args.revision", "main"),
    ("sentence_bert_config.json", "model_args.attn_implementation", "kernels-community/flash-attn"),
    ("sentence_bert_config.json", "tokenizer_args.tokenizer_file", "/etc/hostname"),
    ("sentence_bert_config.json", "processor_kwargs.vocab_file", "/etc/hostname"),
    ("sentence_bert_config.json", "config_args.trust_remote_code", True),
    ("sentence_bert_config.json", "config_kwargs.attn_implementation", "flash_attention_2"),
    ("sentence_bert_config.json", "tokenizer_name_or_path", "/elsewhere/tokenizer"),
    ("sentence_bert_config.json", "backend", "onnx"),
    ("sentence_bert_config.json", "modality_config.text.method", "save_pretrained"),
    ("sentence_bert_config.json", "transformer_task", "text-generation"),
    ("sentence_roberta_config.json", "model_args.device_map", "auto"),
    ("sentence_xlnet_config.json", "model_args.offload_folder", "/some/absolute/folder"),
    ("2_Dense/config.json", "activation_function", "torch.utils.cpp_extension.BuildExtension"),
    ("2_Dense/config.json", "init_weight", [[0.0]]),
    ("1_Pooling/config.json", "pooling_mode", "custom"),
    ("3_Normalize/config.json", "module_input_name", "anything_else"),
    ("config_sentence_transformers.json", "model_type", "SparseEncoder"),
    ("config_sentence_transformers.json", "module_classes", {"x": "os.system"}),
])
def test_a_sentence_transformer_file_choosing_a_loader_argument_is_refused(st_save, tmp_path, file, pointer, value):
    folder = shutil.copytree(st_save, tmp_path / "st")
    path = folder / file
    path.write_text(json.dumps(plant(json.loads(path.read_text()) if path.is_file() else {}, pointer, value)))
    [message] = refusals(tmp_path, st_gate, folder)
    assert message.startswith(f"st/{file}: {pointer} = {json.dumps(value)} is not admitted"), message
    assert message.endswith("refused before loading: no file of the package chooses the loader's arguments")


@pytest.mark.parametrize("pointer, value", [("0.type", "sentence_transformers.models.Router"),
                                            ("0.kwargs", ["task"]),
                                            ("1.type", "sentence_transformers.models.StaticEmbedding")])
def test_a_modules_json_entry_outside_the_admitted_modules_is_refused(st_save, tmp_path, pointer, value):
    folder = shutil.copytree(st_save, tmp_path / "st")
    modules = json.loads((folder / "modules.json").read_text())
    index, key = pointer.split(".")
    modules[int(index)][key] = value
    (folder / "modules.json").write_text(json.dumps(modules))
    [message] = refusals(tmp_path, st_gate, folder)
    assert message.startswith(f"st/modules.json: {pointer} = {json.dumps(value)} is not admitted"), message


# ----------------------------------------------------------------------------- transformers config.json

@pytest.fixture(scope="module")
def bnb_config(tmp_path_factory):
    work = tmp_path_factory.mktemp("bnb-keys")
    return json.loads((write_bnb_4bit(work / "bnb4", work) / "config.json").read_text())


def hf_gate(config: dict, path: Path, outcome: Outcome) -> None:
    from itera_verify.reload.loaders._hf_config import admit_config

    admit_config(config, path, outcome)


def test_a_bitsandbytes_save_and_a_native_model_with_auto_map_are_admitted(bnb_config, tmp_path):
    assert refusals(tmp_path, hf_gate, bnb_config, tmp_path / "config.json") == []
    native = plant(bnb_config, "auto_map", {"AutoModel": "modeling_gpt2.GPT2Model"})  # transformers' own gpt2
    assert refusals(tmp_path, hf_gate, native, tmp_path / "config.json") == []


@pytest.mark.parametrize("pointer, value", [
    ("quantization_config.quant_method", "gptq"),
    ("quantization_config.llm_int8_skip_modules", [".*"]),
    ("quantization_config.llm_int8_enable_fp32_cpu_offload", True),
    ("quantization_config.bnb_4bit_quant_storage", "int8"),
    ("quantization_config.device_map", "auto"),
    ("text_config.quantization_config.quant_method", "hqq"),
    ("attn_implementation", "kernels-community/flash-attn"),
    ("text_config._attn_implementation", "flash_attention_2"),
    ("experts_implementation", "kernels-community/moe"),
    ("transformers_weights", "other.safetensors"),
    ("fusion_config", {"mlp": True}),
    ("custom_pipelines", {"text-generation": {"impl": "pipeline.MyPipeline"}}),
])
def test_a_config_json_key_choosing_code_files_or_kernels_is_refused(bnb_config, tmp_path, pointer, value):
    [message] = refusals(tmp_path, hf_gate, plant(bnb_config, pointer, value), tmp_path / "config.json")
    assert message.startswith(f"config.json: {pointer} = {json.dumps(value)} is not admitted"), message


def test_a_config_json_auto_map_of_a_model_only_custom_code_defines_is_refused(bnb_config, tmp_path):
    config = plant(plant(bnb_config, "model_type", "my_own_gpt"), "auto_map", {"AutoModel": "modeling.MyModel"})
    [message] = refusals(tmp_path, hf_gate, config, tmp_path / "config.json")
    assert "auto_map = " in message and "model_type 'my_own_gpt' is not one of transformers' own" in message


def test_every_admitted_quant_method_has_its_library():
    from itera_verify.reload.loaders._hf_config import QUANTIZATION

    assert set(QUANTIZATION) == set(QUANTIZATION_LIBRARIES)


# ----------------------------------------------------------------------------- diffusers

@pytest.fixture(scope="module")
def sd_save(tmp_path_factory):
    work = tmp_path_factory.mktemp("sd-keys")
    return write_diffusers_pipeline(work / "sd", work / "tokenizer")


def sd_gate(folder: Path, outcome: Outcome) -> None:
    from itera_verify.reload.loaders import diffusers as loader

    _, components, _ = loader.read_index(folder, outcome)
    for name, spec in components.items():
        if spec is not None:
            cls = loader.component_class(folder, name, *spec, outcome)
            if loader._derives(cls, loader.MODELS):
                loader.admit_component_config(folder / name, cls, outcome)


def test_a_pipeline_save_is_admitted_whole(sd_save):
    assert refusals(sd_save, sd_gate, sd_save) == []


@pytest.mark.parametrize("entry", [["diffusers", "DiffusionPipeline"], ["diffusers", "StableDiffusionPipeline"],
                                   ["diffusers", "ModularPipeline"], ["diffusers", "AutoPipelineForText2Image"],
                                   ["diffusers", "OnnxRuntimeModel"], ["transformers", "Pipeline"]])
def test_a_component_that_is_not_a_part_of_a_pipeline_is_refused(sd_save, tmp_path, entry):
    folder = shutil.copytree(sd_save, tmp_path / "sd")
    (folder / "feature_extractor").mkdir()
    index = plant(json.loads((folder / "model_index.json").read_text()), "feature_extractor", entry)
    (folder / "model_index.json").write_text(json.dumps(index))
    [message] = refusals(tmp_path, sd_gate, folder)
    assert message.startswith(f"sd/model_index.json: feature_extractor = {json.dumps(entry)} is not admitted")


@pytest.mark.parametrize("file, pointer, value", [
    ("model_index.json", "_class_name", ["pipeline", "MyPipeline"]),
    ("model_index.json", "custom_pipeline", "pipeline"),
    ("model_index.json", "_ignore_files", ["*.bin"]),
    ("unet/config.json", "quantization_config", {"quant_method": "bitsandbytes", "load_in_8bit": True}),
    ("text_encoder/config.json", "attn_implementation", "kernels-community/flash-attn"),
    ("text_encoder/config.json", "quantization_config", {"quant_method": "bitsandbytes", "load_in_4bit": True,
                                                         "llm_int8_enable_fp32_cpu_offload": True}),
])
def test_a_pipeline_file_choosing_a_loader_argument_is_refused(sd_save, tmp_path, file, pointer, value):
    folder = shutil.copytree(sd_save, tmp_path / "sd")
    path = folder / file
    path.write_text(json.dumps(plant(json.loads(path.read_text()), pointer, value)))
    messages = refusals(tmp_path, sd_gate, folder)
    assert any(m.startswith(f"sd/{file}: {pointer}") and " is not admitted" in m for m in messages), messages


def test_an_adapter_beside_a_pipeline_text_encoder_is_refused(sd_save, tmp_path):
    folder = shutil.copytree(sd_save, tmp_path / "sd")
    (folder / "text_encoder/adapter_config.json").write_text(json.dumps({"peft_type": "LORA"}))
    [message] = refusals(tmp_path, sd_gate, folder)
    assert message.startswith("sd/text_encoder/adapter_config.json beside a model")


# ----------------------------------------------------------------------------- timm

@pytest.fixture(scope="module")
def timm_config(tmp_path_factory):
    if import_timm() is None:
        pytest.skip("timm is not installed (pip install 'itera-verify[timm]')")
    folder = write_timm(tmp_path_factory.mktemp("timm-keys") / "vit")
    return json.loads((folder / "config.json").read_text())


def timm_gate(config: dict, path: Path, outcome: Outcome) -> None:
    from itera_verify.reload.loaders import timm as loader

    loader.admit_config(import_timm(), config, path, outcome)


def test_a_timm_save_is_admitted_whole(timm_config, tmp_path):
    assert refusals(tmp_path, timm_gate, timm_config, tmp_path / "config.json") == []


@pytest.mark.parametrize("pointer, value", [
    ("pretrained_cfg.file", "/elsewhere/weights.pth"), ("pretrained_cfg.url", "https://example.org/w.pth"),
    ("pretrained_cfg.hf_hub_id", "org/weights"), ("pretrained_cfg.hf_hub_filename", "w.safetensors"),
    ("pretrained_cfg.state_dict", {"w": 1}), ("pretrained_cfg.source", "local-dir"),
    ("pretrained_cfg.custom_load", True),
    ("model_args.pretrained", True), ("model_args.checkpoint_path", "/elsewhere/w.pth"),
    ("model_args.pretrained_cfg_overlay", {"file": "/elsewhere/w.pth"}), ("model_args.cache_dir", "/elsewhere"),
    ("model_args.device", "meta"), ("model_args.features_only", True), ("model_args.pruned", True),
    ("model_args.backbone", "local-dir:/elsewhere"), ("model_args.act_layer", "torch.nn.GELU"),
    ("architecture", "hf-hub:org/model"), ("cache_dir", "/elsewhere"),
])
def test_a_timm_config_naming_weights_or_a_factory_option_is_refused(timm_config, tmp_path, pointer, value):
    messages = refusals(tmp_path, timm_gate, plant(timm_config, pointer, value), tmp_path / "config.json")
    assert any(m.startswith(f"config.json: {pointer} = {json.dumps(value)} is not admitted") for m in messages), \
        messages


# ----------------------------------------------------------------------------- peft

@pytest.fixture(scope="module")
def lora_config(tmp_path_factory):
    from peft import LoraConfig

    folder = tmp_path_factory.mktemp("lora-keys")
    LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn"], modules_to_save=["score"], task_type="SEQ_CLS",
               base_model_name_or_path="org/base", revision="0" * 40).save_pretrained(folder)
    return json.loads((folder / "adapter_config.json").read_text())


def peft_gate(config: dict, path: Path, outcome: Outcome) -> None:
    from itera_verify.reload.loaders.peft import admit_adapter_config

    admit_adapter_config(config, path, outcome)


def test_a_lora_save_is_admitted_whole(lora_config, tmp_path):
    assert refusals(tmp_path, peft_gate, lora_config, tmp_path / "adapter_config.json") == []
    assert refusals(tmp_path, peft_gate, plant(lora_config, "a_key_of_a_newer_peft", 1),
                    tmp_path / "adapter_config.json") == []  # PEFT drops it unread


@pytest.mark.parametrize("pointer, value", [
    ("init_lora_weights", "pissa"), ("init_lora_weights", "olora"), ("init_lora_weights", "eva"),
    ("init_lora_weights", "corda"), ("corda_config", {"cache_file": "/elsewhere/cache.pt"}),
    ("loftq_config", {"loftq_bits": 4}), ("megatron_config", {"tensor_model_parallel_size": 1}),
    ("megatron_core", "os"), ("layer_replication", [[0, 1]]), ("runtime_config", {"ephemeral_gpu_offload": True}),
    ("target_modules", ".*"), ("modules_to_save", ["(a+)+$"]), ("peft_type", "IA3"), ("use_qalora", True),
])
def test_an_adapter_config_choosing_what_loads_is_refused(lora_config, tmp_path, pointer, value):
    [message] = refusals(tmp_path, peft_gate, plant(lora_config, pointer, value), tmp_path / "adapter_config.json")
    assert message.startswith(f"adapter_config.json: {pointer} = {json.dumps(value)} is not admitted"), message
