"""The `transformers` loader on a bitsandbytes 4-bit model (docs/format.md, loaders): quantized and saved on the CPU by
from_pretrained(quantization_config=BitsAndBytesConfig(load_in_4bit=True)), reloaded with its weights proven finite
once dequantized; a verifying machine without bitsandbytes is IV505 naming the extra, never IV504."""
from __future__ import annotations

import shutil

import pytest

from fixtures.extra_loaders import reload_package, rewrite_safetensors, write_bnb_4bit, write_package
from tests.test_loaders_missing_library import hide

pytestmark = pytest.mark.filterwarnings("ignore")
ENTRY = ("transformers-model", {"loader": "transformers"})


def absmax_nan(tensors):
    name = next(n for n in sorted(tensors) if n.endswith("c_attn.weight.absmax"))
    tensors[name].view(-1)[0] = float("nan")


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    work = tmp_path_factory.mktemp("quantized")
    root = work / "package"
    clean = write_bnb_4bit(root / "artifacts/bnb4", work)
    shutil.copytree(clean, root / "artifacts/bnb4-nan-scale")
    rewrite_safetensors(root / "artifacts/bnb4-nan-scale/model.safetensors", absmax_nan)
    write_package(root, [
        ("bnb4", ENTRY[0], "artifacts/bnb4", ENTRY[1]), ("bnb4-nan-scale", ENTRY[0], "artifacts/bnb4-nan-scale",
                                                          ENTRY[1])])
    return root


@pytest.fixture(scope="module")
def reloaded(package):
    return reload_package(package)


@pytest.mark.slow
def test_4bit_model_reloads_with_its_weights_dequantized_and_finite(reloaded):
    results, findings = reloaded
    result = results["bnb4"]
    assert result.ok, result.error
    assert not [f for f in findings if f.artifact == "bnb4"]
    assert result.facts["quantization"] == "bitsandbytes" and result.facts["dequantized_tensors"] == 4
    assert result.forward.startswith("finite output (1, 8, ")


def test_4bit_model_whose_scale_is_nan_is_IV504_once_dequantized(reloaded):
    _, findings = reloaded
    [finding] = [f for f in findings if f.artifact == "bnb4-nan-scale"]
    assert finding.code == "IV504" and "non-finite once dequantized" in finding.message
    assert "c_attn.weight" in finding.message


@pytest.mark.slow
def test_4bit_model_without_bitsandbytes_is_IV505_naming_the_extra(package, tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", hide(tmp_path / "hidden", "bitsandbytes"))
    results, findings = reload_package(package)
    assert {r.failure for r in results.values()} == {"missing-library"}, [r.error for r in results.values()]
    [finding] = findings
    assert finding.code == "IV505" and "pip install 'itera-verify[bitsandbytes]'" in finding.message
    assert "(2 artifact(s): bnb4, bnb4-nan-scale)" in finding.message
