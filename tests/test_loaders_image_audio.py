"""The `transformers` loader runs a forward pass for models that take no token ids (docs/format.md, loaders): a synthetic input of
the shape the config declares, ViT's pixel_values and Whisper's input_features; the output must be finite."""
from __future__ import annotations

import shutil

import pytest

from fixtures.extra_loaders import reload_package, rewrite_safetensors, write_package, write_vit, write_whisper

pytestmark = pytest.mark.filterwarnings("ignore")


@pytest.fixture(scope="module")
def reloaded(tmp_path_factory):
    root = tmp_path_factory.mktemp("loaders-image-audio") / "package"
    art = root / "artifacts"
    write_vit(art / "vit")
    write_whisper(art / "whisper")
    shutil.copytree(art / "vit", art / "vit-overflow")

    def overflow(tensors):  # finite weights whose logits overflow float32: only a forward pass shows it
        tensors["classifier.weight"] = tensors["classifier.weight"].sign() * 3e38 + 1e37

    rewrite_safetensors(art / "vit-overflow/model.safetensors", overflow)
    entry = {"loader": "transformers"}
    write_package(root, [(name, "transformers-model", f"artifacts/{name}", entry)
                         for name in ("vit", "whisper", "vit-overflow")])
    return reload_package(root)


@pytest.mark.slow
def test_vit_runs_a_forward_pass_on_synthetic_pixel_values(reloaded):
    results, findings = reloaded
    assert results["vit"].ok, results["vit"].error
    assert results["vit"].forward == "finite output (1, 3) float32 (synthetic pixel_values (1, 3, 32, 32))"
    assert not [f for f in findings if f.artifact == "vit"]


def test_whisper_runs_a_forward_pass_on_synthetic_input_features(reloaded):
    results, _ = reloaded
    assert results["whisper"].ok, results["whisper"].error
    assert results["whisper"].forward == ("finite output (1, 1, 64) float32 (synthetic input_features (1, 8, 32), "
                                          "decoder_input_ids (1, 1))")


def test_image_model_whose_output_overflows_is_IV504(reloaded):
    _, findings = reloaded
    [finding] = [f for f in findings if f.artifact == "vit-overflow"]
    assert finding.code == "IV504" and "synthetic pixel_values gave" in finding.message
    assert "non-finite value(s)" in finding.message
