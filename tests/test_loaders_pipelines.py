"""The `diffusers` and `sentence-transformers` loaders (docs/format.md, loaders): a tiny StableDiffusionPipeline.save_pretrained and
a tiny SentenceTransformer.save, reloaded in one run; each planted defect is its own artifact of the package."""
from __future__ import annotations

import json
import shutil

import pytest
import torch

from fixtures.extra_loaders import (reload_package, rewrite_safetensors, write_diffusers_pipeline, write_package,
                                    write_sentence_transformer)

pytestmark = pytest.mark.filterwarnings("ignore")
UNET_WEIGHTS = "unet/diffusion_pytorch_model.safetensors"


def messages(findings, artifact) -> list[str]:
    return [f"{f.code} {f.message}" for f in findings if f.artifact == artifact]


def nan_at(name):
    def change(tensors):
        tensors[name] = tensors[name].clone()
        tensors[name].view(-1)[0] = float("nan")
    return change


@pytest.fixture(scope="module")
def reloaded(tmp_path_factory):
    work = tmp_path_factory.mktemp("loaders-pipelines")
    root, art = work / "package", work / "package/artifacts"
    art.mkdir(parents=True)
    clean = write_diffusers_pipeline(art / "sd", work / "tokenizer")
    shutil.copytree(clean, art / "sd-no-vae")
    shutil.rmtree(art / "sd-no-vae/vae")
    shutil.copytree(clean, art / "sd-nan-unet")
    rewrite_safetensors(art / "sd-nan-unet" / UNET_WEIGHTS, nan_at("conv_in.weight"))
    shutil.copytree(clean, art / "sd-extra-key")
    rewrite_safetensors(art / "sd-extra-key" / UNET_WEIGHTS,
                        lambda tensors: tensors.update({"conv_in.lora_down.weight": torch.zeros(4, 4)}))
    shutil.copytree(clean, art / "sd-custom")
    index = json.loads((art / "sd-custom/model_index.json").read_text())
    index["scheduler"] = ["my_pipelines", "FastScheduler"]
    (art / "sd-custom/model_index.json").write_text(json.dumps(index))

    st = write_sentence_transformer(art / "st", work)
    shutil.copytree(st, art / "st-nan-dense")
    rewrite_safetensors(art / "st-nan-dense/2_Dense/model.safetensors", nan_at("linear.weight"))
    shutil.copytree(st, art / "st-no-tokenizer")
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (art / "st-no-tokenizer" / name).unlink(missing_ok=True)
    shutil.copytree(st, art / "st-no-pooling")
    shutil.rmtree(art / "st-no-pooling/1_Pooling")
    shutil.copytree(st, art / "st-missing-key")
    rewrite_safetensors(art / "st-missing-key/model.safetensors",
                        lambda tensors: tensors.pop("encoder.layer.1.output.dense.weight"))

    pipe, sentence = ("diffusers-pipeline", {"loader": "diffusers"}), ("sentence-transformers-model",
                                                                         {"loader": "sentence-transformers"})
    artifacts = [(name, pipe[0], f"artifacts/{name}", pipe[1])
                 for name in ("sd", "sd-no-vae", "sd-nan-unet", "sd-extra-key", "sd-custom")]
    artifacts += [(name, sentence[0], f"artifacts/{name}", sentence[1])
                  for name in ("st", "st-nan-dense", "st-no-tokenizer", "st-no-pooling", "st-missing-key")]
    write_package(root, artifacts)
    return reload_package(root)


@pytest.mark.slow
def test_clean_stable_diffusion_pipeline_runs_one_denoising_step(reloaded):
    results, findings = reloaded
    result = results["sd"]
    assert result.ok, result.error
    assert not messages(findings, "sd")
    assert result.facts["components"] == ["scheduler", "text_encoder", "tokenizer", "unet", "vae"]
    assert result.forward.startswith("1 denoising step, finite output (1, 3, ")


def test_pipeline_without_its_vae_is_named_missing(reloaded):
    _, findings = reloaded
    [message] = messages(findings, "sd-no-vae")
    assert "component vae (AutoencoderKL) named by model_index.json is missing" in message


def test_pipeline_with_a_nan_unet_weight_is_IV504_naming_the_weight(reloaded):
    _, findings = reloaded
    [message] = messages(findings, "sd-nan-unet")
    assert message.startswith("IV504") and "component unet" in message and "conv_in.weight" in message


def test_pipeline_with_an_unexpected_unet_key_is_IV504(reloaded):
    _, findings = reloaded
    [message] = messages(findings, "sd-extra-key")
    assert "1 unexpected key(s): conv_in.lora_down.weight" in message


def test_pipeline_naming_custom_code_is_refused_without_importing_it(reloaded):
    _, findings = reloaded
    [message] = messages(findings, "sd-custom")
    assert "component scheduler comes from 'my_pipelines': custom code is never imported" in message


def test_clean_sentence_transformer_encodes_finite_embeddings(reloaded):
    results, findings = reloaded
    result = results["st"]
    assert result.ok, result.error
    assert not messages(findings, "st")
    assert result.facts["modules"] == ["Transformer", "Pooling", "Dense", "Normalize"]
    assert result.forward == "finite embeddings (1, 16) (encode of a fixed text)"


def test_sentence_transformer_with_a_nan_dense_weight_is_IV504(reloaded):
    _, findings = reloaded
    [message] = messages(findings, "st-nan-dense")
    assert "non-finite weights" in message and "linear.weight" in message


def test_sentence_transformer_without_its_tokenizer_is_reported(reloaded):
    _, findings = reloaded
    found = messages(findings, "st-no-tokenizer")
    assert any("no tokenizer file" in m for m in found) and any("the tokenizer is empty" in m for m in found)


def test_sentence_transformer_missing_a_listed_module_is_reported(reloaded):
    _, findings = reloaded
    [message] = messages(findings, "st-no-pooling")
    assert "module '1' (Pooling): its folder '1_Pooling' is missing" in message


def test_sentence_transformer_whose_bert_lost_a_weight_is_IV504(reloaded):
    _, findings = reloaded
    [message] = messages(findings, "st-missing-key")
    assert "1 missing key(s): encoder.layer.1.output.dense.weight" in message
