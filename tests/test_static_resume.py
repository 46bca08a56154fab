"""Static resume completeness (issue 19): what a Trainer checkpoint-N/ lacks or contradicts is IV507/IV508 without
any reload (--no-reload, the CI gate), and the reload does not report the same missing file a second time."""
from __future__ import annotations

import pytest
import hashlib
import json
import shutil
from pathlib import Path

from tests.helpers import run_cli, static_findings
from itera_verify import settle

CHECKPOINT = "checkpoints/control/checkpoint-4"
RESUME = "checkpoints/lora-r16/resume.pt"


def resume_findings(package_dir: Path) -> list:
    return [f for f in static_findings(package_dir) if f.code in ("IV507", "IV508")]


def set_params(package_dir: Path, run: str, **changes) -> None:
    """Change a run's params and keep config_sha256 true (only the planted defect remains)."""
    params_file = package_dir / f"params/{run}.json"
    params = json.loads(params_file.read_text()) | changes
    params_file.write_text(json.dumps(params, indent=2))
    manifest = json.loads((package_dir / "manifest.json").read_text())
    for entry in manifest["runs"]:
        if entry["id"] == run:
            entry["config_sha256"] = hashlib.sha256(params_file.read_bytes()).hexdigest()
    (package_dir / "manifest.json").write_text(json.dumps(manifest, indent=2))


def test_clean_packages_have_no_static_resume_finding(package_dir, classifier_dir, multigpu_dir, tmp_path):
    # multigpu: DDP rank files, the Trainer under DeepSpeed (latest + global_step2/, no optimizer.pt) and FSDP.
    assert resume_findings(package_dir) == []
    assert resume_findings(classifier_dir) == []
    assert resume_findings(multigpu_dir) == []
    assert run_cli("init", tmp_path / "new").returncode == 0
    assert resume_findings(tmp_path / "new") == []


def test_checkpoint_without_optimizer_is_IV507_without_reload(package_dir):
    (package_dir / CHECKPOINT / "optimizer.pt").unlink()
    [finding] = resume_findings(package_dir)
    assert (finding.code, finding.path, finding.artifact) == ("IV507", f"{CHECKPOINT}/optimizer.pt", "control-resume")
    assert finding.run == "control"


def test_checkpoint_without_optimizer_fails_the_no_reload_command_line(package_dir):
    (package_dir / CHECKPOINT / "optimizer.pt").unlink()
    result = run_cli(package_dir, "--no-reload", "--no-seal", "--format", "json")
    assert result.returncode == 1, result.stderr
    found = [(f["code"], f.get("path")) for f in json.loads(result.stdout)["findings"]]
    assert ("IV507", f"{CHECKPOINT}/optimizer.pt") in found


def test_checkpoint_without_scheduler_is_IV507(package_dir):
    (package_dir / CHECKPOINT / "scheduler.pt").unlink()
    assert [(f.code, f.path) for f in resume_findings(package_dir)] == [("IV507", f"{CHECKPOINT}/scheduler.pt")]


def test_checkpoint_without_rng_state_is_IV507(package_dir):
    (package_dir / CHECKPOINT / "rng_state.pth").unlink()
    assert [(f.code, f.path) for f in resume_findings(package_dir)] == [("IV507", f"{CHECKPOINT}/rng_state.pth")]


def test_checkpoint_without_weights_is_IV507(package_dir):
    (package_dir / CHECKPOINT / "model.safetensors").unlink()
    assert [(f.code, f.path) for f in resume_findings(package_dir)] == [("IV507", CHECKPOINT)]


def test_checkpoint_without_trainer_state_is_IV507(package_dir):
    (package_dir / CHECKPOINT / "trainer_state.json").unlink()
    assert [(f.code, f.path) for f in resume_findings(package_dir)] == [("IV507", f"{CHECKPOINT}/trainer_state.json")]


def test_trainer_state_without_global_step_is_IV507(package_dir):
    state_file = package_dir / CHECKPOINT / "trainer_state.json"
    state = json.loads(state_file.read_text())
    del state["global_step"]
    state_file.write_text(json.dumps(state))
    [finding] = resume_findings(package_dir)
    assert finding.code == "IV507" and "global_step" in finding.message


def test_global_step_disagreeing_with_the_folder_name_is_IV508(package_dir):
    # A checkpoint-4 folder whose trainer_state.json comes from another moment of training.
    state_file = package_dir / CHECKPOINT / "trainer_state.json"
    state = json.loads(state_file.read_text())
    state["global_step"] = 2
    state_file.write_text(json.dumps(state))
    [finding] = resume_findings(package_dir)
    assert (finding.code, finding.path) == ("IV508", f"{CHECKPOINT}/trainer_state.json")
    assert "global_step 2" in finding.message and "checkpoint-4" in finding.message


def test_fp16_run_without_scaler_is_IV507(package_dir):
    set_params(package_dir, "control", fp16=True)
    assert [(f.code, f.path) for f in resume_findings(package_dir)] == [("IV507", f"{CHECKPOINT}/scaler.pt")]


def test_fp16_run_with_scaler_is_clean(package_dir):
    import torch

    set_params(package_dir, "control", fp16=True)
    torch.save(torch.amp.GradScaler("cpu").state_dict(), package_dir / CHECKPOINT / "scaler.pt")
    assert resume_findings(package_dir) == []


def test_index_naming_a_missing_shard_is_IV507(package_dir):
    folder = package_dir / CHECKPOINT
    (folder / "model.safetensors").rename(folder / "model-00001-of-00002.safetensors")
    from safetensors import safe_open

    with safe_open(folder / "model-00001-of-00002.safetensors", "pt") as weights:
        names = list(weights.keys())
    weight_map = {name: "model-00001-of-00002.safetensors" for name in names[1:]}
    weight_map[names[0]] = "model-00002-of-00002.safetensors"  # the shard an interrupted upload lost
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    [finding] = resume_findings(package_dir)
    assert (finding.code, finding.path) == ("IV507", f"{CHECKPOINT}/model.safetensors.index.json")
    assert "model-00002-of-00002.safetensors" in finding.message


def test_deepspeed_like_layout_is_left_to_the_reload(package_dir):
    # Under DeepSpeed the Trainer writes no optimizer.pt or scheduler.pt: they live in global_step4/, named by
    # `latest`. That layout is the reload's to judge, never a static IV507.
    folder = package_dir / CHECKPOINT
    (folder / "global_step4").mkdir()
    shutil.move(folder / "optimizer.pt", folder / "global_step4" / "mp_rank_00_model_states.pt")
    (folder / "scheduler.pt").unlink()
    (folder / "latest").write_text("global_step4")
    assert resume_findings(package_dir) == []


def test_fsdp_full_state_optimizer_bin_serves_as_the_optimizer(package_dir):
    # FSDP with FULL_STATE_DICT: accelerate writes optimizer.bin (and pytorch_model_fsdp.bin), no optimizer.pt.
    folder = package_dir / CHECKPOINT
    (folder / "optimizer.pt").rename(folder / "optimizer.bin")
    assert resume_findings(package_dir) == []


def test_fsdp_like_layout_needs_its_optimizer_folder_beside_each_model_folder(package_dir):
    # Sharded FSDP keeps weights and optimizer in pytorch_model_fsdp_<i>/ and optimizer_<i>/ (no optimizer.pt):
    # the names alone show a model folder without its optimizer folder, so --no-reload says so.
    folder = package_dir / CHECKPOINT
    (folder / "pytorch_model_fsdp_0").mkdir()
    shutil.move(folder / "model.safetensors", folder / "pytorch_model_fsdp_0" / "__0_0.distcp")
    (folder / "optimizer.pt").unlink()
    assert [(f.code, f.path) for f in resume_findings(package_dir)] == [("IV507", f"{CHECKPOINT}/optimizer_0")]
    (folder / "optimizer_0").mkdir()
    shutil.move(folder / "scheduler.pt", folder / "optimizer_0" / "__0_0.distcp")
    assert [(f.code, f.path) for f in resume_findings(package_dir)] == [("IV507", f"{CHECKPOINT}/scheduler.pt")]


# --- the per-rank files of a multi-process run, from names alone (format/layouts.py) -------------------------

def ranked_rng(package_dir: Path, ranks) -> None:
    folder = package_dir / CHECKPOINT
    single = (folder / "rng_state.pth").read_bytes()
    (folder / "rng_state.pth").unlink()
    for rank in ranks:
        (folder / f"rng_state_{rank}.pth").write_bytes(single)


def test_a_ddp_checkpoint_missing_a_ranks_rng_file_is_IV507_without_reload(package_dir):
    ranked_rng(package_dir, [0])
    set_params(package_dir, "control", world_size=2)
    [finding] = resume_findings(package_dir)
    assert (finding.code, finding.path) == ("IV507", CHECKPOINT)
    assert "rank(s) 1 of 2" in finding.message


def test_one_rng_state_for_two_processes_is_IV507_without_reload(package_dir):
    set_params(package_dir, "control", world_size=2)
    [finding] = resume_findings(package_dir)
    assert (finding.code, finding.path) == ("IV507", f"{CHECKPOINT}/rng_state.pth")
    assert "one rng_state.pth for 2 processes" in finding.message


def test_a_recorded_world_size_beyond_the_rank_files_is_found_without_reload(package_dir):
    ranked_rng(package_dir, [0, 1])
    set_params(package_dir, "control", world_size=2)
    assert resume_findings(package_dir) == []
    set_params(package_dir, "control", world_size=4)
    [finding] = resume_findings(package_dir)
    assert finding.code == "IV507" and "rank(s) 2, 3 of 4" in finding.message
    set_params(package_dir, "control", world_size=1)
    [finding] = resume_findings(package_dir)
    assert finding.code == "IV508" and finding.path == f"{CHECKPOINT}/rng_state_1.pth"


@pytest.mark.slow
def test_the_reload_reports_a_missing_rank_file_once_under_the_same_requirement(package_dir, hf_cache):
    from itera_verify.flows.verify import verify
    from itera_verify.rules import Selection

    ranked_rng(package_dir, [0])
    set_params(package_dir, "control", world_size=2)
    static = [(f.code, f.path, f.message) for f in resume_findings(package_dir)]
    report = verify(package_dir, settle(device="cpu", seal=False, hf_cache=hf_cache, selection=Selection()))
    resume = [(f.code, f.path, f.message) for f in report.findings
              if f.artifact == "control-resume" and f.code in ("IV507", "IV508")]
    assert resume == static, resume
    [reloaded] = [r for r in report.reloads if r.artifact == "control-resume"]
    problems = reloaded.facts.get("problems") or []
    assert [p.get("requirement") for p in problems] == ["rng:missing"], problems  # the reload saw it too


@pytest.mark.slow
def test_reload_does_not_report_the_missing_optimizer_a_second_time(package_dir, hf_cache):
    from itera_verify.flows.verify import verify
    from itera_verify.rules import Selection

    (package_dir / CHECKPOINT / "optimizer.pt").unlink()
    (package_dir / CHECKPOINT / "scheduler.pt").write_bytes(b"not a pickle")  # a fact only the reload sees
    report = verify(package_dir, settle(device="cpu", seal=False, hf_cache=hf_cache, selection=Selection()))
    resume = [(f.code, f.path) for f in report.findings if f.artifact == "control-resume"]
    assert resume.count(("IV507", f"{CHECKPOINT}/optimizer.pt")) == 1, resume
    assert any(code == "IV504" and path == f"{CHECKPOINT}/scheduler.pt" for code, path in resume), resume


# --- torch-resume: the keys of its dict, read from the pickle's opcodes (never unpickled) -------------------

def load_resume(path: Path) -> dict:
    import torch
    from itera_verify.reload.common import numpy_rng_globals

    with torch.serialization.safe_globals(numpy_rng_globals()):
        return torch.load(path, weights_only=True)


def rewrite_resume(package_dir: Path, change, **save_options) -> None:
    import torch

    data = load_resume(package_dir / RESUME)
    change(data)
    torch.save(data, package_dir / RESUME, **save_options)


def test_torch_resume_without_rng_is_IV507_without_reload(package_dir):
    rewrite_resume(package_dir, lambda data: data.pop("rng"))
    [finding] = resume_findings(package_dir)
    assert (finding.code, finding.path, finding.artifact) == ("IV507", RESUME, "lora-r16-resume")
    assert "has no `rng`" in finding.message


def test_torch_resume_without_optimizer_and_data_state_is_two_IV507(package_dir):
    rewrite_resume(package_dir, lambda data: [data.pop("optimizer"), data.pop("data_state")])
    assert sorted(f.message.split("`")[1] for f in resume_findings(package_dir)) == ["data_state", "optimizer"]


def test_fp16_torch_resume_without_scaler_is_IV507(package_dir):
    set_params(package_dir, "lora-r16", fp16=True)
    [finding] = resume_findings(package_dir)
    assert "has no `scaler`" in finding.message


def test_legacy_torch_resume_format_is_left_to_the_reload(package_dir):
    # Not a zip: its keys cannot be read without unpickling, so the static phase says nothing.
    rewrite_resume(package_dir, lambda data: data.pop("rng"), _use_new_zipfile_serialization=False)
    assert resume_findings(package_dir) == []


def test_torch_resume_as_an_ordered_dict_is_read(package_dir):
    from collections import OrderedDict

    import torch

    data = load_resume(package_dir / RESUME)
    del data["scheduler"]
    torch.save(OrderedDict(data), package_dir / RESUME)
    [finding] = resume_findings(package_dir)
    assert "has no `scheduler`" in finding.message


@pytest.mark.slow
def test_reload_does_not_repeat_a_missing_key_but_reports_what_only_it_sees(package_dir, hf_cache):
    from itera_verify.flows.verify import verify
    from itera_verify.rules import Selection

    def plant(data):
        del data["rng"]  # seen statically
        data["data_state"] = None  # present, but empty: only the reload sees it

    rewrite_resume(package_dir, plant)
    report = verify(package_dir, settle(device="cpu", seal=False, hf_cache=hf_cache, selection=Selection()))
    messages = [f.message for f in report.findings if f.artifact == "lora-r16-resume" and f.code == "IV507"]
    assert sum("has no `rng`" in m for m in messages) == 1, messages
    assert sum("`data_state` is empty" in m for m in messages) == 1, messages
