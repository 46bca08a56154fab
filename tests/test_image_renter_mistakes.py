"""Mistakes an image renter makes that used to pass (issue 39 items 6-8): a pipeline missing a component seen
without reloading (IV507), runs whose classifiers number the labels differently (IV310), an EMA run whose resume
checkpoint lacks the EMA state (IV507); and what the tool says around them: IV605 names the recorder's call, a
table written to a file is never cut, `init` lists the artifacts it finds. Real tiny artifacts throughout."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from fixtures.extra_loaders import reload_package, resume_state, write_package, write_diffusers_pipeline
from tests.handmade import write_tiny_package
from tests.helpers import run_cli, static_findings

pytestmark = pytest.mark.filterwarnings("ignore")


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("pipeline")
    return write_diffusers_pipeline(work / "sd", work / "tokenizer")


def test_a_pipeline_missing_a_component_is_IV507_without_reloading(pipeline, tmp_path):
    root = tmp_path / "pkg"
    shutil.copytree(pipeline, root / "artifacts/sd")
    shutil.rmtree(root / "artifacts/sd/vae")
    write_package(root, [("sd", "diffusers-pipeline", "artifacts/sd", {"loader": "diffusers"})])
    [finding] = [f for f in static_findings(root) if f.code == "IV507"]
    assert finding.artifact == "sd" and finding.path == "artifacts/sd/model_index.json"
    assert "component vae (AutoencoderKL) named by model_index.json is missing" in finding.message


def test_a_complete_pipeline_has_no_static_IV507(pipeline, tmp_path):
    root = tmp_path / "pkg"
    shutil.copytree(pipeline, root / "artifacts/sd")
    write_package(root, [("sd", "diffusers-pipeline", "artifacts/sd", {"loader": "diffusers"})])
    assert not [f for f in static_findings(root) if f.code == "IV507"]


@pytest.mark.slow
def test_the_reload_does_not_say_the_missing_component_a_second_time(pipeline, tmp_path):
    root = tmp_path / "pkg"
    shutil.copytree(pipeline, root / "artifacts/sd")
    shutil.rmtree(root / "artifacts/sd/vae")
    write_package(root, [("sd", "diffusers-pipeline", "artifacts/sd", {"loader": "diffusers"})])
    results, findings = reload_package(root)  # both phases of the reload family
    assert not results["sd"].ok and "vae" in results["sd"].error
    [finding] = [f for f in findings if "vae" in f.message]  # the static phase said it; the reload does not again
    assert finding.code == "IV507" and finding.path == "artifacts/sd/model_index.json"


# ---- IV310 ----------------------------------------------------------------------------------------------
def vit(folder: Path, labels: list[str]) -> Path:
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(0)
    config = ViTConfig(image_size=32, patch_size=8, num_channels=3, hidden_size=16, num_hidden_layers=1,
                       num_attention_heads=2, intermediate_size=32, num_labels=len(labels),
                       id2label=dict(enumerate(labels)), label2id={label: i for i, label in enumerate(labels)})
    ViTForImageClassification(config).save_pretrained(str(folder))
    return folder


def two_runs(root: Path, control_labels, variant_labels) -> Path:
    vit(root / "artifacts/control", control_labels)
    vit(root / "artifacts/variant", variant_labels)
    write_package(root, [("control-model", "transformers-model", "artifacts/control", None),
                         ("variant-model", "transformers-model", "artifacts/variant", None)])
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["artifacts"][1]["run"] = "small"
    (root / "manifest.json").write_text(json.dumps(manifest))
    return root


def test_runs_whose_classifiers_number_the_labels_differently_are_IV310(tmp_path):
    root = two_runs(tmp_path / "pkg", ["cat", "dog", "bird"], ["bird", "cat", "dog"])
    [finding] = [f for f in static_findings(root) if f.code == "IV310"]
    assert finding.run == "small" and finding.path == "artifacts/variant/config.json"
    assert "0: 'bird' here, 'cat' there" in finding.message and "run 'base'" in finding.message


def test_runs_with_the_same_label_map_have_no_IV310(tmp_path):
    root = two_runs(tmp_path / "pkg", ["cat", "dog", "bird"], ["cat", "dog", "bird"])
    assert not [f for f in static_findings(root) if f.code == "IV310"]


def test_unnamed_labels_are_not_compared(tmp_path):
    root = two_runs(tmp_path / "pkg", ["LABEL_0", "LABEL_1"], ["cat", "dog"])
    assert not [f for f in static_findings(root) if f.code == "IV310"]


def test_a_classes_file_beside_a_timm_model_is_read_too(tmp_path):
    root = two_runs(tmp_path / "pkg", ["cat", "dog"], ["cat", "dog"])
    (root / "artifacts/variant/config.json").unlink()  # a folder whose only map is its classes file
    (root / "artifacts/variant/classes.json").write_text(json.dumps(["dog", "cat"]))
    [finding] = [f for f in static_findings(root) if f.code == "IV310"]
    assert finding.path == "artifacts/variant/classes.json"


# ---- EMA -------------------------------------------------------------------------------------------------
def ema_package(root: Path, state: dict) -> Path:
    """The tiny package whose control trained with EMA (`use_ema` in its params) and its torch-resume file."""
    (root / "checkpoints").mkdir(parents=True)
    torch.save(state, root / "checkpoints/base.pt")
    write_package(root, [("base-resume", "resume-checkpoint", "checkpoints/base.pt", {"loader": "torch-resume"})])
    params = json.loads((root / "params/base.json").read_text())
    (root / "params/base.json").write_text(json.dumps({**params, "use_ema": True}))
    return root


def test_an_ema_run_whose_checkpoint_lacks_the_ema_state_is_IV507(tmp_path):
    root = ema_package(tmp_path / "pkg", resume_state())
    [finding] = [f for f in static_findings(root) if f.code == "IV507"]
    assert finding.artifact == "base-resume" and "no EMA state" in finding.message and "use_ema" in finding.message


def test_an_ema_run_whose_checkpoint_holds_the_ema_state_passes(tmp_path):
    root = ema_package(tmp_path / "pkg", resume_state(ema={"decay": 0.999, "shadow": torch.zeros(2, 4)}))
    assert not [f for f in static_findings(root) if f.code == "IV507"]


# ---- smaller ---------------------------------------------------------------------------------------------
def test_IV605_names_the_recorders_call(tmp_path):
    root = write_tiny_package(tmp_path / "pkg", lambda m: m["timeline"].update(observed_hours=14))
    [finding] = [f for f in static_findings(root) if f.code == "IV605"]
    assert "campaign.deviation(2, " in finding.message


def test_a_runs_table_written_to_a_file_is_never_cut(tmp_path):
    long_id = "control-vit-base-patch16-224-full-fine-tune-with-a-name-long-enough-to-fill-a-line-" + "x" * 40
    root = write_tiny_package(tmp_path / "pkg")
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["runs"][0]["id"] = long_id
    manifest["decision"]["accepted"] = [long_id, "small"]
    (root / "manifest.json").write_text(json.dumps(manifest))
    out = tmp_path / "report.txt"
    run_cli(root, "--no-reload", "--no-seal", "--report", f"text={out}")
    table = out.read_text().split("\nRuns\n", 1)[1].split("\n\n", 1)[0].splitlines()
    header, _, *rows = table
    assert "stop rule: reason" in header and "…" not in header
    assert rows[0].startswith(long_id + " ") and rows[1].startswith("small ")  # whole, on one line each
    # A stop reason too long for its cell is cut there, and printed whole below the table (as on a terminal).
    assert "big stopped by nan: loss became NaN at step 2" in out.read_text()


def test_init_lists_the_artifacts_a_renter_copied_in_first(pipeline, tmp_path):
    from itera_verify.package.template import write_template

    root = tmp_path / "campaign"
    shutil.copytree(pipeline, root / "artifacts/sd")
    (root / "artifacts/model.onnx").write_bytes(b"")  # a name alone says what it is
    write_template(root, campaign_id="images")
    manifest = json.loads((root / "manifest.json").read_text())
    kinds = {a["path"]: a["kind"] for a in manifest["artifacts"]}
    assert kinds == {"artifacts/sd": "diffusers-pipeline", "artifacts/model.onnx": "onnx"}
    loaders = {k: v["loader"] for k, v in json.loads((root / "reload.json").read_text())["artifacts"].items()}
    assert loaders == {"sd": "diffusers", "model": "onnx"}
