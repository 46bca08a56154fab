"""Multi-GPU training outputs (issue 16): real DDP, DeepSpeed ZeRO-2/3, FSDP (DCP), accelerate and Lightning
outputs written on the CPU by 2 gloo processes (fixtures/multigpu.py). Each clean layout reloads with zero
findings; each test plants one defect in a private copy and reloads only the artifact it broke."""
from __future__ import annotations
from dataclasses import replace

import json
import shutil
from pathlib import Path

import pytest
import torch
from itera_verify.runtime.progress import NULL_PROGRESS
from itera_verify.reload import run_reloads
from itera_verify.rules import reload as reload_rules

from fixtures.artifacts import truncate
from fixtures.edit import edit_json, refresh_hashes
from fixtures.multigpu import ARTIFACTS
from tests.helpers import codes, static_findings, context

DDP, DS_TRAINER, FSDP = (ARTIFACTS[a][1] for a in ("ddp-checkpoint", "ds-trainer-checkpoint", "fsdp-checkpoint"))
ZERO0, ZERO1 = ARTIFACTS["zero0-checkpoint"][1], ARTIFACTS["zero1-checkpoint"][1]
ZERO2, ZERO3, DCP = (ARTIFACTS[a][1] for a in ("zero2-checkpoint", "zero3-checkpoint", "dcp-model"))
ACCELERATE, LIGHTNING = ARTIFACTS["accelerate-state"][1], ARTIFACTS["lightning-checkpoint"][1]


def reload(package_dir: Path, hf_cache, *only: str):
    """Reload the named artifacts as the workflow does; (results by artifact, their reload findings)."""
    package = context(package_dir, hf_cache=Path(hf_cache))
    package = replace(package, reloads=run_reloads(package, device="cpu", timeout=300, jobs=2, progress=NULL_PROGRESS,
                                  only=set(only)))
    return {r.artifact: r for r in package.reloads}, [f for f in reload_rules.check(package) if f.code != "IV509"]


def reload_codes(package_dir: Path, hf_cache, artifact: str) -> list[str]:
    """The codes a user sees for `artifact`: the static phase's resume facts (what --no-reload sees from names)
    and the reload's findings, which never repeat a requirement the static phase reported."""
    _, findings = reload(package_dir, hf_cache, artifact)
    static = [f for f in reload_rules.check(context(package_dir), phase="static")
              if f.artifact == artifact]
    return sorted(f.code for f in static + findings)


def record_world_size(package_dir: Path, size: int) -> None:
    """The control run's params record `world_size` (its config_sha256 refreshed, so only the rule under test
    trips)."""
    edit_json(package_dir, "params/control.json", lambda p: p.update(world_size=size))
    refresh_hashes(package_dir)


def rewrite(path: Path, change) -> None:
    """Load a real (plain-data) torch file, change it, save it back as torch.save would."""
    data = torch.load(path, weights_only=False)  # the fixture's own file, written by the libraries just now
    change(data)
    torch.save(data, path)


# --- clean layouts ------------------------------------------------------------------------------------

def test_every_clean_layout_reloads_with_zero_findings(multigpu_dir, built_multigpu):
    results, findings = reload(multigpu_dir, built_multigpu["hf_cache"], *ARTIFACTS)
    assert {a: r.ok for a, r in results.items()} == {a: True for a in ARTIFACTS}, \
        {a: r.error for a, r in results.items() if not r.ok}
    assert findings == []
    static = [f for f in static_findings(multigpu_dir) if f.severity is None or f.severity.value != "info"]
    assert not [f for f in static if f.code.startswith(("IV5", "IV2"))], [(f.code, f.message) for f in static]
    facts = {a: r.facts for a, r in results.items()}
    assert [facts[f"zero{stage}-checkpoint"]["zero_stage"] for stage in range(4)] == [0, 1, 2, 3]
    assert facts["zero0-checkpoint"]["optimizer_step"] == 3  # 2 steps after the bf16 wrapper's start-up step
    for artifact in ("zero1-checkpoint", "zero2-checkpoint", "zero3-checkpoint", "ds-trainer-checkpoint",
                     "ds3-trainer-checkpoint"):
        assert facts[artifact]["dp_world_size"] == 2 and facts[artifact]["optimizer_step"] == 2
        assert sum(facts[artifact]["fp32_partition_numel"]) == facts[artifact]["parameters"]
    # the Trainer's own optimizer under ZeRO-3: a decay and a no-decay group, each partitioned on its own
    assert len(facts["ds3-trainer-checkpoint"]["fp32_partition_numel"]) == 2
    assert facts["ddp-checkpoint"]["layout"] == facts["fsdp-full-checkpoint"]["layout"] == "single-process"
    assert facts["fsdp-full-checkpoint"]["optimizer_covers"] == "28 of 28 trainable parameters"
    assert facts["ds-trainer-checkpoint"]["layout"] == "deepspeed" and facts["fsdp-checkpoint"]["layout"] == "fsdp"
    for artifact in ("ddp-checkpoint", "ds-trainer-checkpoint", "fsdp-checkpoint"):
        assert facts[artifact]["ranks"]["RNG state (rng_state_<rank>.pth)"] == [0, 1]
    assert results["fsdp-checkpoint"].forward.startswith("finite output")
    assert facts["ds3-trainer-checkpoint"]["zero_stage"] == 3 and "partitions" in results["ds3-trainer-checkpoint"].forward
    assert results["dcp-model"].forward.startswith("finite output")
    assert facts["accelerate-state"]["scheduler_last_epoch"] == 4 and facts["accelerate-state"]["optimizer_step"] == 2
    assert facts["lightning-checkpoint"]["optimizer_step"] == facts["lightning-checkpoint"]["global_step"] == 3


def test_the_fixture_layouts_are_what_the_libraries_write(built_multigpu):
    package = Path(built_multigpu["package"])
    assert sorted(p.name for p in (package / DDP).glob("rng_state*")) == ["rng_state_0.pth", "rng_state_1.pth"]
    assert not (package / DS_TRAINER / "optimizer.pt").exists()
    assert (package / DS_TRAINER / "latest").read_text().strip() == "global_step2"
    assert sorted(p.name for p in (package / ZERO3 / "global_step2").iterdir()) == [
        "zero_pp_rank_0_mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt",
        "zero_pp_rank_1_mp_rank_00_model_states.pt", "zero_pp_rank_1_mp_rank_00_optim_states.pt"]
    assert sorted(p.name for p in (package / FSDP / "optimizer_0").iterdir()) == [
        ".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert not (package / FSDP / "config.json").exists()
    assert sorted(p.name for p in (package / ACCELERATE).iterdir()) == [
        "model.safetensors", "optimizer.bin", "random_states_0.pkl", "random_states_1.pkl", "scheduler.bin"]


# --- missing rank files (IV507) ----------------------------------------------------------------------

def test_ddp_checkpoint_missing_rank_0_rng_file_is_IV507(multigpu_dir, built_multigpu):
    (multigpu_dir / DDP / "rng_state_0.pth").unlink()
    assert reload_codes(multigpu_dir, built_multigpu["hf_cache"], "ddp-checkpoint") == ["IV507"]


def test_ddp_checkpoint_missing_last_rank_with_recorded_world_size_is_IV507(multigpu_dir, built_multigpu):
    record_world_size(multigpu_dir, 2)
    (multigpu_dir / DDP / "rng_state_1.pth").unlink()
    assert reload_codes(multigpu_dir, built_multigpu["hf_cache"], "ddp-checkpoint") == ["IV507"]


def test_deepspeed_zero3_trainer_checkpoint_missing_a_rank_model_states_is_IV507(multigpu_dir, built_multigpu):
    folder = ARTIFACTS["ds3-trainer-checkpoint"][1]
    (multigpu_dir / folder / "global_step2/zero_pp_rank_1_mp_rank_00_model_states.pt").unlink()
    assert reload_codes(multigpu_dir, built_multigpu["hf_cache"], "ds3-trainer-checkpoint") == ["IV507"]


def test_deepspeed_trainer_checkpoint_missing_a_rank_rng_file_is_IV507(multigpu_dir, built_multigpu):
    (multigpu_dir / DS_TRAINER / "rng_state_1.pth").unlink()  # dp_world_size 2 says rank 1 must be there
    assert reload_codes(multigpu_dir, built_multigpu["hf_cache"], "ds-trainer-checkpoint") == ["IV507"]


def test_accelerate_state_missing_a_random_states_file_is_IV507(multigpu_dir, built_multigpu):
    record_world_size(multigpu_dir, 2)
    (multigpu_dir / ACCELERATE / "random_states_1.pkl").unlink()
    assert reload_codes(multigpu_dir, built_multigpu["hf_cache"], "accelerate-state") == ["IV507"]


# --- missing optimizer state (IV507) -----------------------------------------------------------------

@pytest.mark.parametrize("artifact, shard", [
    ("zero1-checkpoint", f"{ZERO1}/global_step2/bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"),
    ("zero2-checkpoint", f"{ZERO2}/global_step2/zero_pp_rank_1_mp_rank_00_optim_states.pt"),
    ("zero3-checkpoint", f"{ZERO3}/global_step2/zero_pp_rank_1_mp_rank_00_optim_states.pt"),
    ("ds-trainer-checkpoint", f"{DS_TRAINER}/global_step2/zero_pp_rank_1_mp_rank_00_optim_states.pt")])
def test_deepspeed_missing_optimizer_shard_is_IV507(multigpu_dir, built_multigpu, artifact, shard):
    (multigpu_dir / shard).unlink()
    assert reload_codes(multigpu_dir, built_multigpu["hf_cache"], artifact) == ["IV507"]


def test_fsdp_checkpoint_without_its_optimizer_folder_is_IV507(multigpu_dir, built_multigpu):
    shutil.rmtree(multigpu_dir / FSDP / "optimizer_0")
    assert reload_codes(multigpu_dir, built_multigpu["hf_cache"], "fsdp-checkpoint") == ["IV507"]


def test_fsdp_full_state_checkpoint_without_optimizer_bin_is_IV507(multigpu_dir, built_multigpu):
    """Reported once: by the static phase (rules/_resume_files.py), the reload does not repeat it."""
    (multigpu_dir / ARTIFACTS["fsdp-full-checkpoint"][1] / "optimizer.bin").unlink()
    results, findings = reload(multigpu_dir, built_multigpu["hf_cache"], "fsdp-full-checkpoint")
    static = [f for f in static_findings(multigpu_dir) if f.artifact == "fsdp-full-checkpoint"]
    assert codes(static + findings) == {"IV507"} and len(static + findings) == 1
    assert "optimizer.bin" in results["fsdp-full-checkpoint"].error


def test_accelerate_state_without_optimizer_is_IV507(multigpu_dir, built_multigpu):
    (multigpu_dir / ACCELERATE / "optimizer.bin").unlink()
    assert reload_codes(multigpu_dir, built_multigpu["hf_cache"], "accelerate-state") == ["IV507"]


@pytest.mark.parametrize("artifact, folder", [("zero3-checkpoint", ZERO3), ("ds-trainer-checkpoint", DS_TRAINER)])
def test_latest_naming_a_folder_that_is_not_there_is_IV507(multigpu_dir, built_multigpu, artifact, folder):
    (multigpu_dir / folder / "latest").write_text("global_step9")
    assert reload_codes(multigpu_dir, built_multigpu["hf_cache"], artifact) == ["IV507"]


def test_weights_only_lightning_checkpoint_is_IV507(multigpu_dir, built_multigpu):
    shutil.copy2(Path(built_multigpu["extras"]) / "weights-only.ckpt", multigpu_dir / LIGHTNING)
    _, findings = reload(multigpu_dir, built_multigpu["hf_cache"], "lightning-checkpoint")
    assert codes(findings) == {"IV507"} and "save_weights_only=True" in findings[0].message


# --- steps and world sizes that disagree (IV508) -----------------------------------------------------

def test_deepspeed_trainer_global_step_disagreeing_with_the_engine_is_IV508(multigpu_dir, built_multigpu):
    # Two comparisons fail, each said once: the folder's name against trainer_state.json (static, --no-reload
    # sees it) and DeepSpeed's own global_steps against it (the reload).
    edit_json(multigpu_dir, f"{DS_TRAINER}/trainer_state.json", lambda s: s.update(global_step=3))
    assert reload_codes(multigpu_dir, built_multigpu["hf_cache"], "ds-trainer-checkpoint") == ["IV508", "IV508"]
    _, findings = reload(multigpu_dir, built_multigpu["hf_cache"], "ds-trainer-checkpoint")
    assert [f.code for f in findings] == ["IV508"] and "DeepSpeed's global_steps is 2" in findings[0].message


def test_deepspeed_global_steps_disagreeing_with_the_optimizer_is_IV508(multigpu_dir, built_multigpu):
    states = multigpu_dir / ZERO2 / "global_step2/mp_rank_00_model_states.pt"
    rewrite(states, lambda d: d.update(global_steps=5, lr_scheduler={"last_batch_iteration": 4}))
    assert reload_codes(multigpu_dir, built_multigpu["hf_cache"], "zero2-checkpoint") == ["IV508"]


def test_fsdp_checkpoint_global_step_disagreeing_with_the_optimizer_is_IV508(multigpu_dir, built_multigpu):
    # The folder's name (static) and the optimizer's step (the reload) each disagree with it, each said once.
    edit_json(multigpu_dir, f"{FSDP}/trainer_state.json", lambda s: s.update(global_step=7))
    assert reload_codes(multigpu_dir, built_multigpu["hf_cache"], "fsdp-checkpoint") == ["IV508", "IV508"]
    _, findings = reload(multigpu_dir, built_multigpu["hf_cache"], "fsdp-checkpoint")
    assert [f.code for f in findings] == ["IV508"] and "the optimizer has taken 2 step(s)" in findings[0].message


def test_accelerate_scheduler_disagreeing_with_the_optimizer_is_IV508(multigpu_dir, built_multigpu):
    rewrite(multigpu_dir / ACCELERATE / "scheduler.bin", lambda s: s.update(last_epoch=9))
    assert reload_codes(multigpu_dir, built_multigpu["hf_cache"], "accelerate-state") == ["IV508"]


def test_lightning_global_step_disagreeing_with_the_optimizer_is_IV508(multigpu_dir, built_multigpu):
    rewrite(multigpu_dir / LIGHTNING, lambda c: c.update(global_step=30))
    assert reload_codes(multigpu_dir, built_multigpu["hf_cache"], "lightning-checkpoint") == ["IV508"]


def test_deepspeed_world_size_disagreeing_with_the_params_is_IV508(multigpu_dir, built_multigpu):
    record_world_size(multigpu_dir, 4)  # the model states say dp_world_size 2
    assert "IV508" in reload_codes(multigpu_dir, built_multigpu["hf_cache"], "zero2-checkpoint")


def test_rng_files_for_more_ranks_than_the_world_size_is_IV508(multigpu_dir, built_multigpu):
    shutil.copy2(multigpu_dir / DS_TRAINER / "rng_state_1.pth", multigpu_dir / DS_TRAINER / "rng_state_2.pth")
    assert reload_codes(multigpu_dir, built_multigpu["hf_cache"], "ds-trainer-checkpoint") == ["IV508"]


def test_zero_partitions_of_another_model_are_IV508(multigpu_dir, built_multigpu):
    states = multigpu_dir / ZERO3 / "global_step2/zero_pp_rank_0_mp_rank_00_model_states.pt"
    rewrite(states, lambda d: d["param_shapes"][0].update({"extra.weight": torch.Size([64, 32])}))
    assert "IV508" in reload_codes(multigpu_dir, built_multigpu["hf_cache"], "zero3-checkpoint")


# --- damaged shards and weights (IV504) --------------------------------------------------------------

def test_dcp_missing_distcp_file_is_IV504(multigpu_dir, built_multigpu):
    (multigpu_dir / DCP / "__1_0.distcp").unlink()
    assert "IV504" in reload_codes(multigpu_dir, built_multigpu["hf_cache"], "dcp-model")


def test_dcp_truncated_distcp_file_is_IV504(multigpu_dir, built_multigpu):
    truncate(multigpu_dir / DCP / "__0_0.distcp", -4000)
    results, findings = reload(multigpu_dir, built_multigpu["hf_cache"], "dcp-model")
    assert "IV504" in codes(findings) and "cut short" in results["dcp-model"].error


def test_dcp_model_with_nan_weights_is_IV504(multigpu_dir, built_multigpu):
    plant_nan_in_distcp(multigpu_dir / DCP)
    results, findings = reload(multigpu_dir, built_multigpu["hf_cache"], "dcp-model")
    assert codes(findings) == {"IV504"} and "non-finite" in results["dcp-model"].error


def test_dcp_model_against_another_architecture_is_IV508(multigpu_dir, built_multigpu):
    edit_json(multigpu_dir, "artifacts/control-model/config.json", lambda c: c.update(n_embd=64))
    assert reload_codes(multigpu_dir, built_multigpu["hf_cache"], "dcp-model") == ["IV508"]


def test_dcp_model_without_config_is_IV504(multigpu_dir, built_multigpu):
    edit_json(multigpu_dir, "reload.json", lambda r: r["artifacts"]["dcp-model"].pop("config"))
    results, findings = reload(multigpu_dir, built_multigpu["hf_cache"], "dcp-model")
    assert codes(findings) == {"IV504"} and "config" in results["dcp-model"].error


def test_zero0_optimizer_state_of_another_point_of_training_is_IV508(multigpu_dir, built_multigpu, monkeypatch):
    """Without ZeRO the optimizer state is saved in the model states, inside DeepSpeed's bf16 wrapper."""
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    rewrite(multigpu_dir / ZERO0 / "global_step2/mp_rank_00_model_states.pt",
            lambda d: [s.__setitem__("step", s["step"] * 0 + 9) for s in d["optimizer"]["optimizer_state_dict"]
                       ["state"].values()])
    assert reload_codes(multigpu_dir, built_multigpu["hf_cache"], "zero0-checkpoint") == ["IV508"]


def test_zero2_nan_module_weights_are_IV504(multigpu_dir, built_multigpu):
    states = multigpu_dir / ZERO2 / "global_step2/mp_rank_00_model_states.pt"
    rewrite(states, lambda d: d["module"]["transformer.h.0.mlp.c_fc.weight"].fill_(float("nan")))
    assert reload_codes(multigpu_dir, built_multigpu["hf_cache"], "zero2-checkpoint") == ["IV504"]


def test_zero3_nan_in_an_fp32_partition_is_IV504(multigpu_dir, built_multigpu, monkeypatch):
    """ZeRO-3 module tensors are empty by design; the values live in the fp32 partitions."""
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")  # rewrite() unpickles DeepSpeed's own classes

    def poison(data):
        with torch.no_grad():
            data["optimizer_state_dict"]["fp32_flat_groups"][0][3] = float("nan")

    rewrite(multigpu_dir / ZERO3 / "global_step2/zero_pp_rank_1_mp_rank_00_optim_states.pt", poison)
    results, findings = reload(multigpu_dir, built_multigpu["hf_cache"], "zero3-checkpoint")
    assert codes(findings) == {"IV504"} and "non-finite values in fp32 partition 0" in results["zero3-checkpoint"].error


def test_lightning_nan_weights_are_IV504(multigpu_dir, built_multigpu):
    rewrite(multigpu_dir / LIGHTNING, lambda c: c["state_dict"]["model.lm_head.weight"].fill_(float("nan")))
    assert reload_codes(multigpu_dir, built_multigpu["hf_cache"], "lightning-checkpoint") == ["IV504"]


def plant_nan_in_distcp(folder: Path) -> None:
    """Overwrite one stored tensor chunk of a real .distcp with the same chunk holding a NaN (a torch.save
    archive of the same tensor shape has the same length, so every offset in .metadata stays right)."""
    import io

    from itera_verify.package.pickles.distcp import Window, split_archives

    path = folder / "__0_0.distcp"
    data = bytearray(path.read_bytes())
    with open(path, "rb") as fh:
        start, length = split_archives(fh, len(data))[0]
        chunk = torch.load(Window(fh, start, length), weights_only=True)
    chunk.view(-1)[0] = float("nan")
    buffer = io.BytesIO()
    torch.save(chunk, buffer)
    assert len(buffer.getvalue()) == length
    data[start:start + length] = buffer.getvalue()
    path.write_bytes(bytes(data))


def test_a_control_recorded_on_two_processes_agrees_with_every_two_rank_layout(multigpu_dir, built_multigpu):
    """The package a real 2-process run leaves: its params record world_size 2 (the fixture's control ran on one
    process, so its one-process Trainer checkpoint and the one-process Lightning file are left out here), and
    every layout the 2 gloo ranks wrote agrees with it: zero findings, statically and after the reloads."""
    single = {"control-resume", "lightning-checkpoint"}
    record_world_size(multigpu_dir, 2)
    # Two processes ran on two GPUs: the lot holds them (IV613 otherwise).
    edit_json(multigpu_dir, "manifest.json", lambda m: [lot.update(gpus=2) for lot in m["plan"]["lots"]])
    edit_json(multigpu_dir, "manifest.json",
              lambda m: m.update(artifacts=[a for a in m["artifacts"] if a["id"] not in single]))
    edit_json(multigpu_dir, "reload.json", lambda r: [r["artifacts"].pop(a) for a in single])
    two_rank = [a for a in ARTIFACTS if a not in single]
    results, findings = reload(multigpu_dir, built_multigpu["hf_cache"], *two_rank)
    assert {a: r.ok for a, r in results.items()} == {a: True for a in two_rank}, \
        {a: r.error for a, r in results.items() if not r.ok}
    assert findings == []
    assert {a: results[a].facts.get("dp_world_size") for a in ("zero2-checkpoint", "zero3-checkpoint")} == \
        {"zero2-checkpoint": 2, "zero3-checkpoint": 2}
    static = [f for f in static_findings(multigpu_dir) if f.code not in ("IV509",)]
    assert [f.code for f in static if f.severity.value == "error"] == []


def test_world_size_in_the_report_json_is_recorded(multigpu_dir, built_multigpu):
    """The facts the report keeps name every rank a layout holds."""
    results, _ = reload(multigpu_dir, built_multigpu["hf_cache"], "zero3-checkpoint")
    facts = json.loads(json.dumps(results["zero3-checkpoint"].facts))
    assert facts["ranks"] == {"model states": [0, 1], "optimizer shard": [0, 1]}


# --- a DCP folder as dcp.save writes it in one process -----------------------------------------------

def add_artifact(package_dir: Path, artifact: str, loader: str, path: str, **entry) -> None:
    edit_json(package_dir, "manifest.json", lambda m: m["artifacts"].append(
        {"id": artifact, "run": "control", "kind": "resume-checkpoint", "path": path}))
    edit_json(package_dir, "reload.json", lambda r: r["artifacts"].update({artifact: {"loader": loader, **entry}}))


def save_model_and_optimizer(folder: Path, fqn_keys: bool, optimizer_hidden: int = 32) -> None:
    """dcp.save of a tiny GPT-2 and its AdamW after one step: {"model", "optimizer"} as optimizer.state_dict()
    gives it (parameters by index), or {"model", "optim"} from get_state_dict (parameters by name). With another
    optimizer_hidden, the optimizer is that of a wider model."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from transformers import GPT2Config, GPT2LMHeadModel

    from fixtures.artifacts import TINY_GPT2

    def trained(hidden: int):
        torch.manual_seed(0)
        model = GPT2LMHeadModel(GPT2Config(**dict(TINY_GPT2, n_embd=hidden)))
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        ids = torch.arange(16).unsqueeze(0)
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        return model, optimizer

    model, optimizer = trained(32)
    if optimizer_hidden != 32:
        optimizer = trained(optimizer_hidden)[1]
    if fqn_keys:
        model_state, optimizer_state = get_state_dict(model, optimizer)
        dcp.save({"model": model_state, "optim": optimizer_state}, checkpoint_id=str(folder))
    else:
        dcp.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, checkpoint_id=str(folder))


@pytest.mark.parametrize("fqn_keys", [False, True])
def test_dcp_save_of_model_and_optimizer_in_one_process_reloads_clean(multigpu_dir, built_multigpu, fqn_keys):
    save_model_and_optimizer(multigpu_dir / "checkpoints/dcp/step-1", fqn_keys)
    add_artifact(multigpu_dir, "dcp-step-1", "dcp", "checkpoints/dcp/step-1", config="artifacts/control-model")
    results, findings = reload(multigpu_dir, built_multigpu["hf_cache"], "dcp-step-1")
    assert findings == [] and results["dcp-step-1"].forward.startswith("finite output")
    assert results["dcp-step-1"].facts["optimizer_covers"] == "28 of 28 trainable parameters"


def test_dcp_optimizer_of_another_model_is_IV508(multigpu_dir, built_multigpu):
    save_model_and_optimizer(multigpu_dir / "checkpoints/dcp/step-1", fqn_keys=False, optimizer_hidden=64)
    add_artifact(multigpu_dir, "dcp-step-1", "dcp", "checkpoints/dcp/step-1", config="artifacts/control-model")
    results, findings = reload(multigpu_dir, built_multigpu["hf_cache"], "dcp-step-1")
    assert codes(findings) == {"IV508"} and "shaped for another model" in results["dcp-step-1"].error


# --- through the command line ------------------------------------------------------------------------

def test_the_package_with_every_layout_is_verified_and_sealed_by_the_command_line(built_multigpu, tmp_path):
    """The whole example package plus every multi-GPU layout, reloaded on the CPU and sealed: exit 0, no finding,
    every artifact reloaded (the package is read in place: nothing is written inside it)."""
    from tests.helpers import run_cli

    archive = tmp_path / "campaign.tar.zst"
    result = run_cli(built_multigpu["package"], "--device", "cpu", "--hf-cache", built_multigpu["hf_cache"],
                     "--format", "json", "-o", archive)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert report["verdict"] == "pass" and report["findings"] == []
    assert {r["artifact"] for r in report["reloads"] if r["ok"]} >= set(ARTIFACTS)
    assert archive.is_file() and archive.stat().st_size > 0


# --- Accelerator.save_state under FSDP and DeepSpeed (GPU-only there: composed from the real CPU files) ---------

def test_accelerate_state_under_sharded_fsdp_reloads_clean(multigpu_dir, built_multigpu):
    """save_state under FSDP writes pytorch_model_fsdp_0/ and optimizer_0/ (save_fsdp_model / save_fsdp_optimizer,
    the calls the CPU fixture made) instead of model.safetensors and optimizer.bin."""
    state = multigpu_dir / ACCELERATE
    (state / "model.safetensors").unlink()
    (state / "optimizer.bin").unlink()
    for name in ("pytorch_model_fsdp_0", "optimizer_0"):
        shutil.copytree(multigpu_dir / FSDP / name, state / name)
    edit_json(multigpu_dir, "reload.json", lambda r: r["artifacts"]["accelerate-state"].update(
        config="artifacts/control-model"))
    results, findings = reload(multigpu_dir, built_multigpu["hf_cache"], "accelerate-state")
    assert findings == [] and results["accelerate-state"].facts["layout"] == "fsdp"
    assert results["accelerate-state"].forward.startswith("finite output")


def test_accelerate_state_under_deepspeed_missing_a_shard_is_IV507(multigpu_dir, built_multigpu):
    """save_state under DeepSpeed: the engine's checkpoint (latest + its tag folder) instead of model and
    optimizer files; clean as it is, and a missing optimizer shard is IV507."""
    state = multigpu_dir / ACCELERATE
    (state / "model.safetensors").unlink()
    (state / "optimizer.bin").unlink()
    (state / "scheduler.bin").unlink()
    shutil.copytree(multigpu_dir / ZERO2 / "global_step2", state / "pytorch_model")
    (state / "latest").write_text("pytorch_model")
    results, findings = reload(multigpu_dir, built_multigpu["hf_cache"], "accelerate-state")
    assert findings == [] and results["accelerate-state"].facts["zero_stage"] == 2
    (state / "pytorch_model/zero_pp_rank_0_mp_rank_00_optim_states.pt").unlink()
    assert reload_codes(multigpu_dir, built_multigpu["hf_cache"], "accelerate-state") == ["IV507"]
