"""IV501–IV503, IV510, IV511: what can be judged about artifacts without loading them."""
from __future__ import annotations

import shutil

import torch
from safetensors.torch import load_file

from fixtures.edit import edit_json, edit_manifest
from tests.helpers import codes, static_findings

ADAPTER = "artifacts/lora-r16"
ADAPTER_CONFIG = f"{ADAPTER}/adapter_config.json"
ARTIFACT_CODES = ("IV501", "IV502", "IV503", "IV510", "IV511")


def _adapter_entry(manifest: dict) -> dict:
    return next(a for a in manifest["artifacts"] if a["id"] == "lora-r16-adapter")


def _findings(package_dir, code):
    return [f for f in static_findings(package_dir) if f.code == code]


def test_clean_package_has_no_artifact_findings(package_dir):
    assert not codes(static_findings(package_dir)) & set(ARTIFACT_CODES)


def test_adapter_pinned_to_branch_main_is_IV501(package_dir):
    edit_manifest(package_dir, lambda m: _adapter_entry(m)["base"].update(revision="main"))
    edit_json(package_dir, ADAPTER_CONFIG, lambda c: c.update(revision="main"))
    findings = _findings(package_dir, "IV501")
    assert {f.path for f in findings} == {"manifest.json", ADAPTER_CONFIG}
    manifest_finding = next(f for f in findings if f.path == "manifest.json")
    assert manifest_finding.pointer == "/artifacts/2/base/revision"
    assert (manifest_finding.run, manifest_finding.artifact) == ("lora-r16", "lora-r16-adapter")


def test_adapter_without_base_revision_is_IV501(package_dir):
    edit_manifest(package_dir, lambda m: _adapter_entry(m)["base"].pop("revision"))
    assert [f.path for f in _findings(package_dir, "IV501")] == ["manifest.json"]


def test_adapter_config_without_revision_is_IV501(package_dir):
    edit_json(package_dir, ADAPTER_CONFIG, lambda c: c.pop("revision"))
    assert [f.path for f in _findings(package_dir, "IV501")] == [ADAPTER_CONFIG]


def test_short_sha_is_not_a_pin(package_dir, built):
    short = built["base_revision"][:12]
    edit_manifest(package_dir, lambda m: _adapter_entry(m)["base"].update(revision=short))
    assert "IV501" in codes(static_findings(package_dir))


def test_adapter_base_as_local_path_is_IV502(package_dir):
    edit_manifest(package_dir, lambda m: _adapter_entry(m)["base"].update(name="/workspace/models/tiny-gpt2"))
    edit_json(package_dir, ADAPTER_CONFIG, lambda c: c.update(base_model_name_or_path="./models/tiny-gpt2"))
    assert {f.path for f in _findings(package_dir, "IV502")} == {"manifest.json", ADAPTER_CONFIG}


def test_manifest_and_adapter_config_revisions_disagree_is_IV503(package_dir):
    other = "0123456789abcdef0123456789abcdef01234567"
    edit_json(package_dir, ADAPTER_CONFIG, lambda c: c.update(revision=other))
    (finding,) = _findings(package_dir, "IV503")
    assert finding.path == ADAPTER_CONFIG and other in finding.message and finding.pointer == "/revision"


def test_manifest_and_adapter_config_base_names_disagree_is_IV503(package_dir):
    edit_json(package_dir, ADAPTER_CONFIG, lambda c: c.update(base_model_name_or_path="other-org/other-base"))
    assert [f.pointer for f in _findings(package_dir, "IV503")] == ["/base_model_name_or_path"]


def test_artifact_without_reload_entry_is_IV510(package_dir):
    edit_json(package_dir, "reload.json", lambda r: r["artifacts"].pop("control-model"))
    (finding,) = _findings(package_dir, "IV510")
    assert finding.artifact == "control-model" and finding.path == "reload.json"


def test_loader_that_does_not_fit_the_kind_is_IV510(package_dir):
    edit_json(package_dir, "reload.json", lambda r: r["artifacts"]["control-model"].update(loader="peft"))
    (finding,) = _findings(package_dir, "IV510")
    assert "transformers" in finding.message and finding.pointer == "/artifacts/control-model/loader"


def test_torch_resume_loader_on_a_folder_is_IV510(package_dir):
    edit_json(package_dir, "reload.json", lambda r: r["artifacts"]["control-resume"].update(loader="torch-resume"))
    assert [f.artifact for f in _findings(package_dir, "IV510")] == ["control-resume"]


def test_pytorch_model_bin_weights_are_IV511(package_dir):
    model_dir = package_dir / "artifacts/control-model"
    torch.save(load_file(str(model_dir / "model.safetensors")), model_dir / "pytorch_model.bin")
    (model_dir / "model.safetensors").unlink()
    (finding,) = _findings(package_dir, "IV511")
    assert finding.path == "artifacts/control-model/pytorch_model.bin" and finding.artifact == "control-model"


def test_optimizer_and_rng_pickles_are_not_IV511(package_dir):
    # The clean package has optimizer.pt, scheduler.pt, rng_state.pth, training_args.bin and resume.pt.
    assert not _findings(package_dir, "IV511")


def test_pytorch_model_bin_inside_a_trainer_checkpoint_is_IV511(package_dir):
    checkpoint = package_dir / "checkpoints/control/checkpoint-4"
    shutil.copy(checkpoint / "optimizer.pt", checkpoint / "pytorch_model.bin")
    assert [f.path for f in _findings(package_dir, "IV511")] == ["checkpoints/control/checkpoint-4/pytorch_model.bin"]


def test_malformed_artifacts_never_crash_the_checks(package_dir):
    edit_manifest(package_dir, lambda m: m.update(artifacts=[None, {"id": 3, "base": "x", "path": 7}, {}]))
    edit_json(package_dir, "reload.json", lambda r: r.update(artifacts=["not", "a", "map"]))
    static_findings(package_dir)  # no exception
