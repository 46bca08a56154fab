"""No file of a package chooses a loader's arguments (docs/survival.md, "What each loader admits"): real artifacts
saved by each library, one dangerous option planted in each, reloaded in one run as `verify` reloads them. Each is
IV504 naming the file, the key and the value, refused before the library is called: nothing is written outside the
package. The library's own save beside them reloads (the clean cases of tests/test_loaders_*.py prove the rest)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from fixtures.extra_loaders import (import_timm, reload_package, rewrite_safetensors, write_diffusers_pipeline,
                                    write_package, write_sentence_transformer, write_timm)

pytestmark = [pytest.mark.filterwarnings("ignore"), pytest.mark.slow]
ST = ("sentence-transformers-model", {"loader": "sentence-transformers"})
SD = ("diffusers-pipeline", {"loader": "diffusers"})
HF = ("transformers-model", {"loader": "transformers"})


def edit_json(path: Path, change) -> None:
    value = json.loads(path.read_text())
    change(value)
    path.write_text(json.dumps(value, indent=2))


def tiny_gpt2(folder: Path) -> Path:
    from transformers import GPT2Config, GPT2LMHeadModel

    GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2)).save_pretrained(folder)
    return folder


def save_lora(base_folder: Path, dest: Path, **config) -> Path:
    """PEFT's own save of a LoRA on the tiny GPT-2: adapter_config.json and adapter_model.safetensors."""
    from peft import LoraConfig, get_peft_model
    from transformers import GPT2LMHeadModel

    get_peft_model(GPT2LMHeadModel.from_pretrained(base_folder), LoraConfig(r=2, target_modules=["c_attn"], **config)
                   ).save_pretrained(dest)
    return dest


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    work = tmp_path_factory.mktemp("package-options")
    root, art = work / "package", work / "package/artifacts"
    offload = work / "offload-here"  # outside the package, outside the child's scratch: must never appear
    st = write_sentence_transformer(art / "st", work)

    shutil.copytree(st, art / "st-offload")
    edit_json(art / "st-offload/sentence_bert_config.json", lambda c: c.update(model_args={
        "device_map": "auto", "max_memory": {"cpu": 1000}, "offload_folder": str(offload)}))

    shutil.copytree(st, art / "st-legacy-name")  # the first of the legacy names the library finds is read
    (art / "st-legacy-name/sentence_bert_config.json").rename(art / "st-legacy-name/sentence_xlnet_config.json")
    edit_json(art / "st-legacy-name/sentence_xlnet_config.json",
              lambda c: c.update(tokenizer_args={"tokenizer_file": "/etc/hostname"}))

    sd = write_diffusers_pipeline(art / "sd", work / "tokenizer")
    shutil.copytree(sd, art / "sd-nested-pipeline")  # a component that is itself a pipeline, with a NaN UNet
    shutil.copytree(sd, art / "sd-nested-pipeline/feature_extractor")
    rewrite_safetensors(art / "sd-nested-pipeline/feature_extractor/unet/diffusion_pytorch_model.safetensors",
                        lambda tensors: tensors["conv_in.weight"].fill_(float("nan")))
    edit_json(art / "sd-nested-pipeline/model_index.json",
              lambda index: index.update(feature_extractor=["diffusers", "DiffusionPipeline"]))

    gpt2 = tiny_gpt2(art / "gpt2-offload-quantized")
    edit_json(gpt2 / "config.json", lambda c: c.update(quantization_config={
        "quant_method": "bitsandbytes", "load_in_8bit": True, "llm_int8_enable_fp32_cpu_offload": True}))
    base = tiny_gpt2(work / "gpt2-base")
    save_lora(base, tiny_gpt2(art / "gpt2-with-adapter"))  # from_pretrained would attach it to the model
    lora = save_lora(base, art / "lora-loftq", task_type="CAUSAL_LM", revision="0" * 40)
    edit_json(lora / "adapter_config.json", lambda c: c.update(init_lora_weights="loftq", base_model_name_or_path="org/base"))

    artifacts = [(name, ST[0], f"artifacts/{name}", ST[1]) for name in ("st", "st-offload", "st-legacy-name")]
    artifacts += [("sd-nested-pipeline", SD[0], "artifacts/sd-nested-pipeline", SD[1])]
    artifacts += [(name, HF[0], f"artifacts/{name}", HF[1]) for name in ("gpt2-offload-quantized", "gpt2-with-adapter")]
    artifacts += [("lora-loftq", "peft-adapter", "artifacts/lora-loftq", {"loader": "peft"})]
    if import_timm() is not None:
        timm_model = write_timm(art / "timm-weights-elsewhere")
        edit_json(timm_model / "config.json", lambda c: c["pretrained_cfg"].update(file="/elsewhere/weights.pth"))
        artifacts += [("timm-weights-elsewhere", "timm-model", "artifacts/timm-weights-elsewhere", {"loader": "timm"})]
    write_package(root, artifacts)
    return root, offload


@pytest.fixture(scope="module")
def reloaded(package):
    root, offload = package
    return (*reload_package(root), offload)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


def found(findings, artifact) -> list[str]:
    return [f"{f.code} {f.path} {f.message}" for f in findings if f.artifact == artifact]


def test_the_library_save_beside_them_reloads(reloaded):
    results, findings, _ = reloaded
    assert results["st"].ok, results["st"].error
    assert not found(findings, "st")


def test_a_sentence_bert_config_offload_folder_is_refused_before_loading_and_nothing_is_written(reloaded):
    from itera_verify.reload.loaders._admit import SHOWN

    _, findings, offload = reloaded
    messages = found(findings, "st-offload")
    assert len(messages) == 3, messages
    for key, value in (("device_map", '"auto"'), ("max_memory", '{"cpu": 1000}'),
                       ("offload_folder", _cut(json.dumps(str(offload)), SHOWN))):  # a deep folder's path: cut
        assert any(m.startswith("IV504 artifacts/st-offload/sentence_bert_config.json ")
                   and f"model_args.{key} = {value} is not admitted" in m for m in messages), (key, messages)
    assert not offload.exists()


def test_a_legacy_named_module_config_naming_a_tokenizer_file_is_refused(reloaded):
    _, findings, _ = reloaded
    [message] = found(findings, "st-legacy-name")
    assert "sentence_xlnet_config.json: tokenizer_args.tokenizer_file = \"/etc/hostname\" is not admitted" in message


def test_a_pipeline_component_that_is_itself_a_pipeline_is_refused(reloaded):
    results, findings, _ = reloaded
    assert not results["sd-nested-pipeline"].ok
    [message] = found(findings, "sd-nested-pipeline")
    assert message.startswith("IV504 artifacts/sd-nested-pipeline/model_index.json ")
    assert 'feature_extractor = ["diffusers", "DiffusionPipeline"] is not admitted' in message
    assert "never a pipeline" in message


def test_a_config_quantization_offloading_to_the_cpu_is_refused(reloaded):
    _, findings, _ = reloaded
    [message] = found(findings, "gpt2-offload-quantized")
    assert "config.json: quantization_config.llm_int8_enable_fp32_cpu_offload = true is not admitted" in message


def test_an_adapter_config_beside_a_model_is_refused(reloaded):
    """The folder is an adapter folder (format/artifact_kinds.py): the transformers loader is never started on it,
    so from_pretrained never attaches the adapter; IV510 at the checks names the loader that proves it."""
    results, _, _ = reloaded
    result = results["gpt2-with-adapter"]
    assert not result.ok and result.failure == "no-loader", result
    assert "cannot prove a PEFT adapter folder (adapter_config.json): use 'peft' (IV510)" in result.error


def test_an_adapter_initialised_from_its_base_by_loftq_is_refused(reloaded):
    _, findings, _ = reloaded
    [message] = found(findings, "lora-loftq")
    assert 'adapter_config.json: init_lora_weights = "loftq" is not admitted' in message


def test_a_timm_pretrained_cfg_naming_a_weights_file_is_refused(reloaded):
    if import_timm() is None:
        pytest.skip("timm is not installed")
    _, findings, _ = reloaded
    [message] = found(findings, "timm-weights-elsewhere")
    assert 'config.json: pretrained_cfg.file = "/elsewhere/weights.pth" is not admitted' in message
