"""What an image renter registers with the recorder alone (issue 39 items 1-3): the kind named by the files,
a diffusers LoRA's base pinned where the checker reads it, `run.adapter` on a LoRA file, a self-built base
pipeline laid out in a hub cache, the `_name_or_path` that save_pretrained points into a hub snapshot; and a PEFT
image-classification LoRA proven on the class it was trained with."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from itera_verify.record import RecordError, open_campaign
from itera_verify.record.hub import add_to_hub_cache

from fixtures.extra_loaders import BASE_PIPELINE, reload_package, write_package
from fixtures.image_renter import build_renter_artifacts
from tests.conftest import built_once
from tests.helpers import static_findings

pytestmark = pytest.mark.filterwarnings("ignore")


@pytest.fixture(scope="module")
def renter(tmp_path_factory) -> dict:
    shared, info = built_once(tmp_path_factory, "itera-image-renter-fixture", build_renter_artifacts, version="1")
    return dict(info, artifacts=shared / "artifacts", hf_cache=shared / "hf-cache")


def started(root: Path):
    campaign = open_campaign(root, "images", "Does a LoRA match the full fine-tune on tiny images?", "tiny-images",
                             "v1", ["img-1", "img-2"])
    campaign.declare_plan(lots=[{"gpu": "RTX 4090", "days": 3, "gpus": 1, "price_usd": 47.14}], reserved_hours=1)
    campaign.declare_stop_rules([{"id": "nan", "kind": "nonfinite_loss", "metric": "loss"}])
    return campaign.run("control", "control", params={"seed": 1}).start()


def copied(renter, root: Path, name: str) -> Path:
    source, target = renter["artifacts"] / name, root / "artifacts" / name
    target.parent.mkdir(parents=True, exist_ok=True)
    if source.is_dir():
        shutil.copytree(source, target)
    else:
        shutil.copy2(source, target)
    return target


def manifest(root: Path) -> dict:
    return json.loads((root / "manifest.json").read_text())


def reload_spec(root: Path) -> dict:
    return json.loads((root / "reload.json").read_text())["artifacts"]


def test_an_artifact_registered_without_a_kind_is_named_by_its_files(renter, tmp_path):
    root = tmp_path / "pkg"
    run = started(root)
    names = {"sd-pipeline": ("diffusers-pipeline", "diffusers"),
             "sentence-encoder": ("sentence-transformers-model", "sentence-transformers"),
             "onnx-export": ("onnx", "onnx"), "llama-q8_0.gguf": ("gguf", "gguf")}
    if renter["timm"]:
        names["timm-classifier"] = ("timm-model", "timm")
    for name in names:
        run.artifact(copied(renter, root, name), id=name.replace(".", "-"))
    listed = {a["id"]: a["kind"] for a in manifest(root)["artifacts"]}
    loaders = {k: v["loader"] for k, v in reload_spec(root).items()}
    for name, (kind, loader) in names.items():
        assert (listed[name.replace(".", "-")], loaders[name.replace(".", "-")]) == (kind, loader)
    assert not [f.message for f in static_findings(root) if f.code == "IV510"]


def test_a_kind_that_cannot_prove_the_files_is_refused_naming_the_right_one(renter, tmp_path):
    root = tmp_path / "pkg"
    run = started(root)
    with pytest.raises(RecordError, match="diffusers pipeline folder .*kind 'diffusers-pipeline'.*'diffusers'"):
        run.artifact(copied(renter, root, "sd-pipeline"), "safetensors")
    assert manifest(root)["artifacts"] == []


def test_a_diffusers_lora_records_its_base_in_the_manifest_where_the_checker_reads_it(renter, tmp_path):
    root = tmp_path / "pkg"
    run = started(root)
    lora = copied(renter, root, "sd-lora")
    with pytest.raises(RecordError, match="base"):
        run.artifact(lora, "diffusers-lora")
    artifact_id = run.artifact(lora, "diffusers-lora", base=BASE_PIPELINE, cache_dir=renter["hf_cache"])
    [entry] = manifest(root)["artifacts"]
    assert entry["base"] == {"name": BASE_PIPELINE, "revision": renter["pipeline_revision"]}
    assert reload_spec(root)[artifact_id] == {"loader": "diffusers-lora"}


def test_run_adapter_on_a_lora_file_registers_a_diffusers_lora_on_its_pipeline(renter, tmp_path):
    root = tmp_path / "pkg"
    run = started(root)
    lora_file = copied(renter, root, "sd-lora-kohya.safetensors")
    artifact_id = run.adapter(lora_file, base=BASE_PIPELINE, cache_dir=renter["hf_cache"])
    [entry] = manifest(root)["artifacts"]
    assert entry["kind"] == "diffusers-lora" and entry["path"] == "artifacts/sd-lora-kohya.safetensors"
    assert entry["base"]["revision"] == renter["pipeline_revision"]
    assert reload_spec(root)[artifact_id]["loader"] == "diffusers-lora"


def test_a_self_built_base_pipeline_goes_into_the_hub_cache_and_pins_its_lora(renter, tmp_path):
    commit = add_to_hub_cache(renter["artifacts"] / "sd-pipeline", "my-lab/sd-base", cache_dir=tmp_path / "hub")
    snapshot = tmp_path / "hub/models--my-lab--sd-base/snapshots" / commit
    assert (snapshot / "model_index.json").is_file() and (snapshot / "unet/config.json").is_file()
    root = tmp_path / "pkg"
    run = started(root)
    run.adapter(copied(renter, root, "sd-lora"), base="my-lab/sd-base", cache_dir=tmp_path / "hub")
    assert manifest(root)["artifacts"][0]["base"] == {"name": "my-lab/sd-base", "revision": commit}


def test_add_to_hub_cache_refuses_a_folder_that_is_no_model(renter, tmp_path):
    with pytest.raises(RecordError, match="not a model or pipeline folder .*LoRA"):
        add_to_hub_cache(renter["artifacts"] / "sd-lora", "my-lab/lora", cache_dir=tmp_path / "hub")


def saved_from_the_cache(renter, folder: Path) -> Path:
    """The base pipeline loaded from the hub cache and saved: diffusers writes the snapshot's path into each
    component's config.json as `_name_or_path`."""
    from diffusers import StableDiffusionPipeline

    pipeline = StableDiffusionPipeline.from_pretrained(BASE_PIPELINE, revision=renter["pipeline_revision"],
                                                       cache_dir=str(renter["hf_cache"]), local_files_only=True,
                                                       safety_checker=None)
    pipeline.save_pretrained(str(folder))
    assert "/snapshots/" in json.loads((folder / "unet/config.json").read_text())["_name_or_path"]
    return folder


def test_the_recorder_writes_the_hub_id_where_save_pretrained_left_a_snapshot_path(renter, tmp_path):
    root = tmp_path / "pkg"
    run = started(root)
    run.artifact(saved_from_the_cache(renter, root / "artifacts/fused"))
    for component in ("unet", "vae"):
        assert json.loads((root / f"artifacts/fused/{component}/config.json").read_text())["_name_or_path"] == \
            BASE_PIPELINE
    assert not [f for f in static_findings(root) if f.code in ("IV201", "IV202") and "fused" in (f.path or "")]


def test_IV201_says_what_wrote_a_snapshot_path_and_how_to_fix_it(renter, tmp_path):
    root = tmp_path / "pkg"
    saved_from_the_cache(renter, root / "artifacts/fused")
    write_package(root, [("fused", "diffusers-pipeline", "artifacts/fused", {"loader": "diffusers"})])
    messages = [f.message for f in static_findings(root) if f.code == "IV201" and "unet" in (f.path or "")]
    assert messages, "the hub cache of the tests lies under /tmp"
    assert "save_pretrained recorded the hub-cache snapshot" in messages[0]
    assert f'write "{BASE_PIPELINE}" there' in messages[0]


@pytest.mark.slow
def test_a_peft_image_classification_lora_is_proven_on_its_recorded_base_class(renter, tmp_path):
    root = tmp_path / "pkg"
    copied(renter, root, "vit-lora")
    write_package(root, [("vit-lora", "peft-adapter", "artifacts/vit-lora", {"loader": "peft"},
                          {"name": renter["vit_base"], "revision": renter["vit_revision"]})])
    results, findings = reload_package(root, hf_cache=renter["hf_cache"])
    result = results["vit-lora"]
    assert result.ok, (result.error, [f.message for f in findings])
    assert result.facts["base_class"] == "ViTForImageClassification" and result.facts["num_labels"] == 3
    assert result.forward.startswith("finite output (1, 3)"), result.forward
    assert findings == []
