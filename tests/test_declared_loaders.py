"""Renters who declared their artifacts with the loaders the docs offered before the new loaders existed (issue
39 item 1): the tool says what each artifact is and which loader proves it (IV510 naming the reload.json entry
to write), never an IV504 that blames the artifact, never a pass on a weaker proof; and nothing is reloaded
under the wrong loader. Real tiny artifacts, each written by its library's own save call (fixtures/image_renter.py).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from fixtures.extra_loaders import reload_package, write_package
from fixtures.image_renter import build_renter_artifacts
from tests.conftest import built_once
from tests.helpers import static_findings

pytestmark = pytest.mark.filterwarnings("ignore")


@pytest.fixture(scope="module")
def renter(tmp_path_factory) -> dict:
    shared, info = built_once(tmp_path_factory, "itera-image-renter-fixture", build_renter_artifacts, version="1")
    return dict(info, artifacts=shared / "artifacts", hf_cache=shared / "hf-cache")


def package(renter: dict, root: Path, declared: list[tuple]) -> Path:
    """A package holding copies of the named artifacts, declared as given: (id, kind, path under artifacts/,
    reload.json entry[, manifest base])."""
    for artifact in declared:
        name = artifact[2].split("/")[0]
        source, target = renter["artifacts"] / name, root / "artifacts" / name
        if not target.exists():
            if source.is_dir():
                shutil.copytree(source, target)
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, target)
    return write_package(root, [(a[0], a[1], f"artifacts/{a[2]}", *a[3:]) for a in declared])


def iv510(root: Path, artifact: str) -> list:
    return [f for f in static_findings(root) if f.code == "IV510" and f.artifact == artifact]


def pipeline_base(renter) -> dict:
    return {"name": renter["pipeline_base"], "revision": renter["pipeline_revision"]}


OLD_DECLARATIONS = [
    # (id, kind, path, entry, what IV510 must name)
    ("sd", "safetensors", "sd-pipeline", {"loader": "safetensors"}, ('"loader": "diffusers"', "model_index.json",
                                                                      'kind "diffusers-pipeline"')),
    ("lora", "safetensors", "sd-lora", {"loader": "safetensors"}, ('"loader": "diffusers-lora"',
                                                                   'kind "diffusers-lora"', "base")),
    ("kohya", "safetensors", "sd-lora-kohya.safetensors", {"loader": "safetensors"},
     ('"loader": "diffusers-lora"', "kohya layout")),
    ("lora-peft", "peft-adapter", "sd-lora", {"loader": "peft"}, ('"loader": "diffusers-lora"',
                                                                  "adapter_config.json and a PEFT base")),
    ("st", "transformers-model", "sentence-encoder", {"loader": "transformers"},
     ('"loader": "sentence-transformers"', "modules.json")),
    ("onnx", "transformers-model", "onnx-export", {"loader": "transformers"}, ('"loader": "onnx"', "model.onnx")),
]


@pytest.fixture(scope="module")
def old_package(renter, tmp_path_factory) -> Path:
    declared = [d[:4] for d in OLD_DECLARATIONS]
    if renter["timm"]:
        declared.append(("timm", "transformers-model", "timm-classifier", {"loader": "transformers"}))
    return package(renter, tmp_path_factory.mktemp("old") / "pkg", declared)


@pytest.mark.parametrize("artifact, words", [(d[0], d[4]) for d in OLD_DECLARATIONS], ids=[d[0] for d in
                                                                                              OLD_DECLARATIONS])
def test_an_artifact_declared_with_the_old_loader_is_IV510_naming_the_loader_that_proves_it(old_package, artifact,
                                                                                            words):
    [finding] = iv510(old_package, artifact)
    assert finding.path == "reload.json" and finding.pointer == f"/artifacts/{artifact}/loader"
    for word in words:
        assert word in finding.message, finding.message
    assert "nothing was reloaded" in finding.message


def test_a_timm_folder_declared_transformers_is_IV510_naming_timm(renter, old_package):
    if not renter["timm"]:
        pytest.skip("timm is not installed")
    [finding] = iv510(old_package, "timm")
    assert '"loader": "timm"' in finding.message and 'kind "timm-model"' in finding.message
    assert "config.json with `architecture`" in finding.message


def test_each_artifact_declared_as_the_docs_say_has_no_IV510(renter, tmp_path):
    declared = [("sd", "diffusers-pipeline", "sd-pipeline", {"loader": "diffusers"}),
                ("lora", "diffusers-lora", "sd-lora", {"loader": "diffusers-lora"}, pipeline_base(renter)),
                ("kohya", "diffusers-lora", "sd-lora-kohya.safetensors", {"loader": "diffusers-lora"},
                 pipeline_base(renter)),
                ("st", "sentence-transformers-model", "sentence-encoder", {"loader": "sentence-transformers"}),
                ("onnx", "onnx", "onnx-export", {"loader": "onnx"}),
                ("gguf", "gguf", "llama-q8_0.gguf", {"loader": "gguf"}),
                ("vit-lora", "peft-adapter", "vit-lora", {"loader": "peft"},
                 {"name": renter["vit_base"], "revision": renter["vit_revision"]})]
    if renter["timm"]:
        declared.append(("timm", "timm-model", "timm-classifier", {"loader": "timm"}))
    root = package(renter, tmp_path / "pkg", declared)
    assert [f.message for f in static_findings(root) if f.code == "IV510"] == []


def test_a_gguf_file_left_inside_a_model_folder_needs_its_own_artifact(renter, tmp_path):
    root = package(renter, tmp_path / "pkg", [("llama", "transformers-model", "llama-with-gguf",
                                               {"loader": "transformers"})])
    [finding] = iv510(root, "llama")
    assert finding.path == "artifacts/llama-with-gguf/model-q8_0.gguf"
    assert 'kind "gguf"' in finding.message and '{"loader": "gguf"}' in finding.message
    # Declared as its own artifact, the export is proven by its own loader: nothing left unread.
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["artifacts"].append({"id": "llama-gguf", "run": "base", "kind": "gguf",
                                  "path": "artifacts/llama-with-gguf/model-q8_0.gguf"})
    (root / "manifest.json").write_text(json.dumps(manifest))
    spec = json.loads((root / "reload.json").read_text())
    spec["artifacts"]["llama-gguf"] = {"loader": "gguf"}
    (root / "reload.json").write_text(json.dumps(spec))
    assert [f.message for f in static_findings(root) if f.code == "IV510"] == []


def test_a_folder_holding_one_gguf_file_declared_gguf_names_the_file_to_point_at(renter, tmp_path):
    root = tmp_path / "pkg"
    (root / "artifacts/gguf-folder").mkdir(parents=True)
    shutil.copy2(renter["artifacts"] / "llama-q8_0.gguf", root / "artifacts/gguf-folder/llama-q8_0.gguf")
    write_package(root, [("q", "transformers-model", "artifacts/gguf-folder", {"loader": "transformers"})])
    [finding] = iv510(root, "q")
    assert '"loader": "gguf"' in finding.message and 'path "artifacts/gguf-folder/llama-q8_0.gguf"' in \
        finding.message


def test_a_manifest_kind_that_does_not_fit_the_right_loader_names_the_kind(renter, tmp_path):
    root = package(renter, tmp_path / "pkg", [("sd", "safetensors", "sd-pipeline", {"loader": "diffusers"})])
    [finding] = iv510(root, "sd")
    assert "which loader 'diffusers' reloads" in finding.message and "declare kind 'diffusers-pipeline'" in \
        finding.message


@pytest.mark.slow
def test_a_wrong_declaration_is_never_reloaded_so_no_IV504_blames_the_artifact(old_package, renter):
    results, findings = reload_package(old_package, hf_cache=renter["hf_cache"])
    for artifact, *_ in OLD_DECLARATIONS:
        result = results[artifact]
        assert result.failure == "no-loader" and not result.ok, (artifact, result.failure, result.error)
        assert "(IV510)" in result.error
    assert [f"{f.code} {f.artifact}: {f.message}" for f in findings] == []
