"""The `timm` loader (docs/format.md, loaders): timm's tiny test_vit saved with save_for_hf, reloaded strictly, one forward pass on
the configured input size. Skipped where timm (and the torchvision it imports) is not installed: the `dev` extra
leaves timm out while the only torchvision wheels for the pinned CPU torch are CUDA builds (pyproject.toml)."""
from __future__ import annotations

import json
import shutil

import pytest
import torch

from fixtures.extra_loaders import import_timm, reload_package, rewrite_safetensors, write_package, write_timm

pytestmark = pytest.mark.filterwarnings("ignore")


@pytest.fixture(scope="module")
def reloaded(tmp_path_factory):
    if import_timm() is None:
        pytest.skip("timm is not installed (pip install 'itera-verify[timm]' with a matching torchvision)")
    root = tmp_path_factory.mktemp("loaders-timm") / "package"
    art = root / "artifacts"
    write_timm(art / "vit")
    shutil.copytree(art / "vit", art / "vit-extra-key")
    rewrite_safetensors(art / "vit-extra-key/model.safetensors",
                        lambda tensors: tensors.update({"head.extra.weight": torch.zeros(3)}))
    shutil.copytree(art / "vit", art / "vit-other-head")
    config = json.loads((art / "vit-other-head/config.json").read_text())
    config["num_classes"] = config["model_args"]["num_classes"] = 5  # the weights hold a 3-label head
    (art / "vit-other-head/config.json").write_text(json.dumps(config))
    shutil.copytree(art / "vit", art / "vit-no-weights")
    (art / "vit-no-weights/model.safetensors").unlink()
    write_package(root, [(name, "timm-model", f"artifacts/{name}", {"loader": "timm"})
                         for name in ("vit", "vit-extra-key", "vit-other-head", "vit-no-weights")])
    return reload_package(root)


@pytest.mark.slow
def test_timm_model_loads_strictly_and_runs_on_its_configured_size(reloaded):
    results, findings = reloaded
    assert results["vit"].ok, results["vit"].error
    assert results["vit"].forward == "finite output (1, 3) (input (1, 3, 160, 160))"
    assert not [f for f in findings if f.artifact == "vit"]


def test_timm_weights_with_an_unexpected_key_are_IV504(reloaded):
    _, findings = reloaded
    [finding] = [f for f in findings if f.artifact == "vit-extra-key"]
    assert finding.code == "IV504" and "1 unexpected key(s): head.extra.weight" in finding.message


def test_timm_config_that_does_not_fit_the_weights_is_IV504(reloaded):
    _, findings = reloaded
    [finding] = [f for f in findings if f.artifact == "vit-other-head"]
    assert finding.code == "IV504" and "size mismatch for head.weight" in finding.message


def test_timm_folder_without_weights_is_reported(reloaded):
    _, findings = reloaded
    [finding] = [f for f in findings if f.artifact == "vit-no-weights"]
    assert "holds no model.safetensors or pytorch_model.bin" in finding.message
