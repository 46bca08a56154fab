"""The `diffusers-lora` loader (docs/format.md, loaders): LoRAs saved by StableDiffusionPipeline.save_lora_weights (and one
converted to kohya's layout) for a tiny base pipeline held in a hub cache of their own, attached with
load_lora_weights and run one denoising step; the IV512 checks of diffusers LoRAs and pipelines."""
from __future__ import annotations

from pathlib import Path

import pytest

from fixtures.extra_loaders import STRAY_KEY, build_diffusers_lora_package, reload_package
from tests.conftest import built_once
from tests.helpers import context

pytestmark = pytest.mark.filterwarnings("ignore")


@pytest.fixture(scope="module")
def built_lora(tmp_path_factory) -> dict:
    shared, info = built_once(tmp_path_factory, "itera-diffusers-lora-fixture", build_diffusers_lora_package,
                              version="2")
    return dict(info, package=shared / "package")


@pytest.fixture(scope="module")
def reloaded(built_lora):
    return reload_package(built_lora["package"], hf_cache=Path(built_lora["hf_cache"]))


def messages(findings, artifact) -> list[str]:
    return [f"{f.code} {f.message}" for f in findings if f.artifact == artifact]


@pytest.mark.slow
def test_lora_saved_by_save_lora_weights_attaches_to_its_base_and_denoises(reloaded):
    results, findings = reloaded
    result = results["lora"]
    assert result.ok, result.error
    assert not messages(findings, "lora")
    assert result.facts["attached_tensors"] == result.facts["lora_tensors"] == 64
    assert result.facts["layout"] == "diffusers"
    assert result.forward.startswith("1 denoising step, finite output (1, 3, ")
    assert result.forward.endswith("with the LoRA (64 tensors)")


def test_kohya_lora_attaches_with_its_alphas(reloaded):
    results, findings = reloaded
    result = results["lora-kohya"]
    assert result.ok, result.error
    assert not messages(findings, "lora-kohya")
    assert result.facts["layout"] == "kohya" and result.facts["attached_tensors"] == 64


def test_lora_trained_for_another_base_is_IV504_size_mismatch(reloaded):
    _, findings = reloaded
    [message] = messages(findings, "lora-other-base")
    assert message.startswith("IV504") and "does not attach to its base" in message and "size mismatch" in message


def test_lora_whose_keys_match_only_part_of_the_unet_is_IV504(reloaded):
    _, findings = reloaded
    [message] = messages(findings, "lora-partial")
    assert message.startswith("IV504") and "unexpected keys" in message and "attentions.1" in message


def test_lora_with_a_nan_weight_is_IV504_before_attaching(reloaded):
    _, findings = reloaded
    [message] = messages(findings, "lora-nan")
    assert message.startswith("IV504") and "non-finite" in message and "lora.up.weight" in message


def test_lora_without_a_base_in_the_manifest_is_IV505(reloaded):
    _, findings = reloaded
    [message] = messages(findings, "lora-no-base")
    assert message.startswith("IV505") and "names no base pipeline" in message


def test_lora_keys_no_component_claims_are_IV504(reloaded):
    """diffusers drops a key of neither the UNet nor the text encoder without a word."""
    _, findings = reloaded
    [message] = messages(findings, "lora-stray-key")
    assert "only 64 of the file's 65 LoRA tensors attached" in message and STRAY_KEY in message


def static_findings(package_root: Path, hf_cache: str, code: str):
    from itera_verify.rules import untrained

    package = context(package_root, hf_cache=Path(hf_cache))
    return [f for f in untrained.check(package) if f.code == code]


def test_lora_saved_before_training_is_IV512_and_trained_ones_are_not(built_lora):
    found = static_findings(built_lora["package"], built_lora["hf_cache"], "IV512")
    untrained = [f for f in found if f.artifact and f.artifact.startswith("lora")]
    assert [f.artifact for f in untrained] == ["lora-untrained"]
    assert "every LoRA up matrix" in untrained[0].message


def test_pipeline_whose_unet_is_the_base_s_is_IV512(built_lora):
    found = static_findings(built_lora["package"], built_lora["hf_cache"], "IV512")
    pipelines = [f for f in found if f.artifact and f.artifact.startswith("sd")]
    assert [f.artifact for f in pipelines] == ["sd-as-base"]
    assert "unet" in pipelines[0].message and "itera-fixtures/tiny-sd" in pipelines[0].message


def test_name_or_path_of_the_pinned_base_snapshot_is_IV202_saying_what_it_is(built_lora, tmp_path):
    """diffusers records where each component was loaded from: the base's snapshot in root's hub cache."""
    import json
    import shutil

    from itera_verify.rules import paths

    root = Path(shutil.copytree(built_lora["package"], tmp_path / "pkg"))
    snapshot = "/root/.cache/huggingface/hub/models--itera-fixtures--tiny-sd/snapshots"
    for component, revision in (("unet", built_lora["revision"]), ("vae", "9" * 40)):
        config = root / f"artifacts/sd-trained/{component}/config.json"
        value = json.loads(config.read_text())
        value["_name_or_path"] = f"{snapshot}/{revision}/{component}"
        config.write_text(json.dumps(value))
    found = {f.path.split("/")[-2]: f.message for f in paths.check(context(root)) if f.code == "IV202"}
    assert set(found) == {"unet", "vae"}
    assert found["unet"].startswith(f"the base's hub-cache snapshot on the training machine, itera-fixtures/tiny-sd "
                                    f"at {built_lora['revision']} (unet), recorded by diffusers/transformers as "
                                    "`_name_or_path`: the manifest's pinned base")
    assert f"but the manifest pins itera-fixtures/tiny-sd at {built_lora['revision']}" in found["vae"]


def test_diffusers_lora_saved_as_a_pickle_is_IV511(built_lora, tmp_path):
    import shutil

    import torch
    from safetensors.torch import load_file

    from itera_verify.rules import artifacts

    root = Path(shutil.copytree(built_lora["package"], tmp_path / "pkg"))
    lora = root / "artifacts/lora"
    torch.save(load_file(str(lora / "pytorch_lora_weights.safetensors")), lora / "pytorch_lora_weights.bin")
    (lora / "pytorch_lora_weights.safetensors").unlink()
    found = [f for f in artifacts.check(context(root)) if f.code == "IV511"]
    assert sorted({f.path for f in found}) == ["artifacts/lora/pytorch_lora_weights.bin"]


def test_the_reload_memory_limit_counts_the_base_pipeline_the_lora_loads(built_lora):
    # A LoRA is a few MiB; its child loads the whole base pipeline beside it: the limit counts both, or a real
    # SD-1.5 LoRA would be stopped at the library allowance.
    from itera_verify.reload.jobs import plan
    from itera_verify.reload.limits import disk_bytes, pinned_base_folder

    package = context(built_lora["package"], hf_cache=Path(built_lora["hf_cache"]))
    loras = [a for a in package.documents.artifacts() if a.get("kind") == "diffusers-lora"]
    assert loras
    job = plan(package, loras[0], "cpu", 1)
    base = pinned_base_folder(loras[0]["base"], str(package.options.hf_cache))
    assert base is not None and disk_bytes(base) > 0
    assert "with its base" in job["memory_limit_source"], job["memory_limit_source"]
