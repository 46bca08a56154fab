"""DeepSpeed under pipeline parallelism: a real 2-stage checkpoint (fixtures/pipeline_parallel.py) holds one model
states file per stage with `module: None` and the weights layer by layer. It reloads clean (before, both stages
were a false 'module is not a state dict'), and every layer file is proven: present, loading after the scan,
finite, shaped as the stage's param_shapes say; the tied embedding in the file of the layer that owns it."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from fixtures.artifacts import truncate
from fixtures.pipeline_parallel import build
from itera_verify.reload.common import INCONSISTENT, LOAD, MISSING
from tests import zip_forms
from tests.test_deepspeed_tensor_parallel import build_in, private_copy, problems, reload
from tests.test_multigpu_pickles import live, payload

pytestmark = pytest.mark.slow
STEP = "global_step2"


@pytest.fixture(scope="module")
def built_pp(tmp_path_factory) -> Path:
    return build_in(tmp_path_factory, "pipeline-parallel", build)


@pytest.fixture
def checkpoint(built_pp, tmp_path) -> Path:
    return private_copy(built_pp, tmp_path)


def rewrite(path: Path, change) -> None:
    state = torch.load(path, weights_only=True)  # the fixture's own layer file, written by DeepSpeed just now
    change(state)
    torch.save(state, path)


def test_the_real_layout_has_layer_files_and_a_model_states_file_per_stage(built_pp):
    names = sorted(p.name for p in (built_pp / STEP).iterdir())
    assert names == [f"layer_0{i}-model_states.pt" for i in range(4)] + [
        "mp_rank_00_model_states.pt", "mp_rank_01_model_states.pt",
        "zero_pp_rank_0_mp_rank_00_optim_states.pt", "zero_pp_rank_0_mp_rank_01_optim_states.pt"]
    states = torch.load(built_pp / STEP / "mp_rank_01_model_states.pt", weights_only=False)
    assert states["module"] is None and states["checkpoint_parallel_dimensions"]["pp_degree"] == 2


def test_the_clean_checkpoint_reloads_with_every_stage_and_layer_proven(checkpoint):
    outcome = reload(checkpoint)
    assert problems(outcome) == []
    assert outcome.facts["pipeline_stages"] == 2 and outcome.facts["pipeline_layer_files"] == 4
    assert outcome.facts["ranks"]["pipeline-stage model states"] == [0, 1]
    assert outcome.facts["optimizer_step"] == 2


def test_a_recorded_world_size_of_dp_times_stages_agrees_and_another_does_not(checkpoint):
    assert problems(reload(checkpoint, world_size=2)) == []
    found = problems(reload(checkpoint, world_size=4))
    assert any(f == INCONSISTENT and "the world size disagrees" in m for f, m in found)


def test_a_missing_layer_file_is_a_missing_component(checkpoint):
    (checkpoint / STEP / "layer_03-model_states.pt").unlink()
    [(failure, message)] = problems(reload(checkpoint))
    assert failure == MISSING and "layer_03-model_states.pt" in message and "mp_rank_01_model_states.pt" in message


def test_the_tied_embeddings_file_missing_is_named(checkpoint):
    (checkpoint / STEP / "layer_00-model_states.pt").unlink()
    [(failure, message)] = problems(reload(checkpoint))
    assert failure == MISSING and "tied_modules.embed.weight" in message


def test_a_nan_in_a_layer_file_is_found(checkpoint):
    rewrite(checkpoint / STEP / "layer_02-model_states.pt",
            lambda s: s["fc.weight"].view(-1).__setitem__(0, float("nan")))
    [(failure, message)] = problems(reload(checkpoint))
    assert failure == LOAD and "non-finite" in message and "fc.weight" in message and "layer_02" in message


def test_a_nan_in_the_tied_embedding_is_found(checkpoint):
    rewrite(checkpoint / STEP / "layer_00-model_states.pt", lambda s: s["weight"].view(-1).__setitem__(3, float("inf")))
    found = problems(reload(checkpoint))
    assert found and all(f == LOAD and "layer_00" in m and "non-finite" in m for f, m in found)


def test_a_truncated_layer_file_is_said_once_and_hides_nothing_else(checkpoint):
    path = checkpoint / STEP / "layer_01-model_states.pt"
    truncate(path, path.stat().st_size // 2)
    [(failure, message)] = problems(reload(checkpoint))
    assert failure == LOAD and "layer_01-model_states.pt" in message
    rewrite(checkpoint / STEP / "layer_02-model_states.pt", lambda s: s["fc.bias"].__setitem__(0, float("nan")))
    (checkpoint / STEP / "layer_00-model_states.pt").unlink()
    found = problems(reload(checkpoint))
    assert len(found) == 3 and [f for f, m in found if "layer_01" in m] == [LOAD]
    assert any(f == LOAD and "layer_02" in m and "non-finite" in m for f, m in found)
    assert any(f == MISSING and "tied_modules.embed.weight" in m for f, m in found)


def test_a_buffer_the_model_states_list_missing_from_its_layer_is_inconsistent(checkpoint):
    rewrite(checkpoint / STEP / "layer_03-model_states.pt", lambda s: s.pop("scale"))
    [(failure, message)] = problems(reload(checkpoint))
    assert failure == INCONSISTENT and "layer_03" in message and "lacks scale" in message


def test_a_tied_embedding_of_another_shape_is_not_the_tied_module(checkpoint):
    rewrite(checkpoint / STEP / "layer_00-model_states.pt", lambda s: s.update({"weight": torch.zeros(16, 16)}))
    [(failure, message)] = problems(reload(checkpoint))
    assert failure == MISSING and "tied_modules.embed.weight [32, 16]" in message


def test_a_layer_of_another_shape_or_without_a_listed_weight_is_inconsistent(checkpoint):
    rewrite(checkpoint / STEP / "layer_01-model_states.pt", lambda s: s.update({"fc.weight": torch.zeros(16, 8)}))
    rewrite(checkpoint / STEP / "layer_03-model_states.pt", lambda s: s.pop("norm.bias"))
    found = problems(reload(checkpoint))
    assert {f for f, _ in found} == {INCONSISTENT}
    assert any("layer_01" in m and "fc.weight [16, 8]" in m for _, m in found)
    assert any("layer_03" in m and "lacks norm.bias" in m for _, m in found)


def test_a_stages_model_states_missing_is_a_missing_component(checkpoint):
    (checkpoint / STEP / "mp_rank_01_model_states.pt").unlink()
    found = problems(reload(checkpoint))
    assert any(f == MISSING and "pipeline-stage model states for rank(s) 1 of 2" in m for f, m in found)


def test_a_payload_in_a_layer_file_is_refused_and_never_runs(checkpoint, tmp_path):
    marker = tmp_path / "layer-marker"
    path = checkpoint / STEP / "layer_02-model_states.pt"
    path.write_bytes(zip_forms.with_data_pkl(path.read_bytes(), payload(marker)))
    assert live(f"import torch; torch.load({str(path)!r}, weights_only=False)", marker)  # as a hand-written loader
    found = problems(reload(checkpoint))
    assert any(f == LOAD and "IV506" in m and "layer_02-model_states.pt" in m for f, m in found)
    assert not marker.exists()


@pytest.fixture(scope="module")
def built_pp_without_zero(tmp_path_factory) -> Path:
    return build_in(tmp_path_factory, "pipeline-parallel-zero0", build, zero_stage=0)


def test_without_zero_each_stage_holds_its_optimizer_and_the_layers_are_still_proven(built_pp_without_zero,
                                                                                      tmp_path):
    """No ZeRO: no optimizer shards, the optimizer in each stage's model states, and no param_shapes to say which
    layers a stage owns: it reloads clean, and every layer file present is still loaded and proven finite."""
    checkpoint = private_copy(built_pp_without_zero, tmp_path)
    assert not list((checkpoint / STEP).glob("*optim_states.pt"))
    outcome = reload(checkpoint)
    assert problems(outcome) == [] and outcome.facts["zero_stage"] == 0 and outcome.facts["optimizer_step"] == 2
    rewrite(checkpoint / STEP / "layer_02-model_states.pt", lambda s: s["fc.bias"].__setitem__(0, float("nan")))
    [(failure, message)] = problems(reload(checkpoint))
    assert failure == LOAD and "layer_02" in message and "fc.bias" in message


def test_without_the_recorded_dimensions_the_layers_are_still_proven(built_pp_without_zero, tmp_path):
    """Older checkpoints carry no checkpoint_parallel_dimensions (DeepSpeed's own reshape code treats it as
    optional): `module: None` and the layer files still say pipeline."""
    checkpoint = private_copy(built_pp_without_zero, tmp_path)
    for states in (checkpoint / STEP).glob("mp_rank_*_model_states.pt"):
        data = torch.load(states, weights_only=False)  # the fixture's own file, written by DeepSpeed just now
        del data["checkpoint_parallel_dimensions"]
        torch.save(data, states)
    outcome = reload(checkpoint)
    assert problems(outcome) == [] and outcome.facts["ranks"]["pipeline-stage model states"] == [0, 1]
    rewrite(checkpoint / STEP / "layer_02-model_states.pt", lambda s: s["fc.bias"].__setitem__(0, float("nan")))
    [(failure, message)] = problems(reload(checkpoint))
    assert failure == LOAD and "layer_02" in message


@pytest.mark.parametrize("zero_stage, precision", [(1, "bf16-fp32-accumulation"), (0, "bf16")])
def test_bf16_optimizer_shards(zero_stage, precision, tmp_path_factory):
    """bf16 with fp32 gradient accumulation (ZeRO-1) and a bf16 pipeline without ZeRO use DeepSpeed's
    BF16_Optimizer, whose bf16_zero_pp_rank_* shards hold no zero_stage (before: a false 'not a ZeRO optimizer
    shard' on each). With ZeRO-1 they are proven as ZeRO-1 partitions and pass (DeepSpeed's load_checkpoint
    resumes them); without ZeRO, DeepSpeed 0.19.8 cannot resume what it wrote (KeyError 0): said once, by cause."""
    checkpoint = build_in(tmp_path_factory, f"pipeline-{precision}", build, zero_stage=zero_stage, precision=precision)
    assert sorted(p.name for p in (checkpoint / STEP).glob("bf16_*")) == [
        "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt", "bf16_zero_pp_rank_0_mp_rank_01_optim_states.pt"]
    outcome = reload(checkpoint)
    assert outcome.facts["optimizer"] == "BF16_Optimizer"
    if zero_stage == 1:
        assert problems(outcome) == [] and outcome.facts["fp32_partition_numel"]
    else:
        [(failure, message)] = problems(outcome)
        assert failure == LOAD and "BF16_Optimizer" in message and "zero_optimization.stage 0" in message


@pytest.fixture(scope="module")
def built_pp_sliced(tmp_path_factory) -> Path:
    return build_in(tmp_path_factory, "pipeline-parallel-sliced", build, tensor_slices=2)


def test_tensor_slices_inside_stages_each_proven_by_its_own_rank(built_pp_sliced, tmp_path):
    """2 stages × 2 tensor slices (4 processes): 4 model-parallel ranks, layer_<NN>-model_<MM> files. Clean, it
    passes; a missing last slice (DeepSpeed's load silently gives that rank another slice), a missing slice of
    the tied module and a slice of another shape are each found, once."""
    checkpoint = private_copy(built_pp_sliced, tmp_path)
    assert (checkpoint / STEP / "layer_03-model_01-model_states.pt").is_file()
    outcome = reload(checkpoint)
    assert problems(outcome) == [] and outcome.facts["pipeline_tensor_slices"] == 2
    assert outcome.facts["ranks"]["pipeline-stage model states"] == [0, 1, 2, 3]
    (checkpoint / STEP / "layer_03-model_01-model_states.pt").unlink()
    [(failure, message)] = problems(reload(checkpoint))
    assert failure == MISSING and "layer_03-model_01-model_states.pt" in message
    rewrite(checkpoint / STEP / "layer_02-model_01-model_states.pt",
            lambda s: s.update({"fc.weight": torch.zeros(3, 3)}))
    (checkpoint / STEP / "layer_00-model_01-model_states.pt").unlink()
    found = problems(reload(checkpoint))
    assert len(found) == 4, found  # the last slice, the tied file's slice, the tied weight in it, the shape
    assert any(f == INCONSISTENT and "layer_02-model_01" in m and "fc.weight [3, 3]" in m for f, m in found)
    assert any(f == MISSING and "layer_00-model_01-model_states.pt" in m for f, m in found)
    assert any(f == MISSING and "tied_modules.embed.weight" in m and "tensor slice 1" in m for f, m in found)


def with_pipeline_checkpoint(package_dir: Path, built_pp: Path) -> Path:
    """The example package with the checkpoint listed as a resume checkpoint of the control run (whose params, as
    in the multi-GPU package, record no world size: its other checkpoint is from 1 process)."""
    from fixtures.edit import edit_json, refresh_hashes

    shutil.copytree(built_pp, package_dir / "checkpoints/pipeline")
    edit_json(package_dir, "manifest.json", lambda m: m["artifacts"].append(
        {"id": "pipeline-checkpoint", "run": "control", "kind": "resume-checkpoint", "path": "checkpoints/pipeline"}))
    edit_json(package_dir, "reload.json", lambda r: r["artifacts"].update(
        {"pipeline-checkpoint": {"loader": "deepspeed-checkpoint"}}))
    edit_json(package_dir, "params/control.json", lambda p: p.pop("world_size", None))
    refresh_hashes(package_dir)
    return package_dir / "checkpoints/pipeline"


def test_a_package_delivering_the_pipeline_checkpoint_passes_the_command_line(built_pp, package_dir, hf_cache):
    """The static checks (every layer file scanned) and the reload both pass; the report carries the stages."""
    import json

    from tests.helpers import run_cli

    with_pipeline_checkpoint(package_dir, built_pp)
    result = run_cli(package_dir, "--device", "cpu", "--hf-cache", hf_cache, "--no-seal", "--format", "json")
    report = json.loads(result.stdout)
    assert report["findings"] == [] and result.returncode == 0, report["findings"]
    [reloaded] = [r for r in report["reloads"] if r["artifact"] == "pipeline-checkpoint"]
    assert reloaded["ok"] and reloaded["facts"]["pipeline_stages"] == 2


def test_a_payload_in_a_delivered_layer_file_is_IV506_before_any_reload(built_pp, package_dir, tmp_path):
    from tests.helpers import static_findings

    folder = with_pipeline_checkpoint(package_dir, built_pp)
    path = folder / STEP / "layer_01-model_states.pt"
    path.write_bytes(zip_forms.with_data_pkl(path.read_bytes(), payload(tmp_path / "never")))
    found = [f for f in static_findings(package_dir) if f.code == "IV506"]
    assert [f.path for f in found] == [f"checkpoints/pipeline/{STEP}/layer_01-model_states.pt"]
    assert not (tmp_path / "never").exists()
