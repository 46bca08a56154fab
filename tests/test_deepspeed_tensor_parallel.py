"""DeepSpeed under tensor parallelism (AutoTP): a real 2-process checkpoint (fixtures/tensor_parallel.py) holds
one model states file and one optimizer shard per model-parallel rank. Every rank is proven, not only rank 0:
before, a damaged mp_rank_01 file passed unseen."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from fixtures.artifacts import truncate
from fixtures.tensor_parallel import build
from itera_verify.reload.common import INCONSISTENT, LOAD, MISSING, Outcome
from itera_verify.reload.loaders import loader_module

pytestmark = pytest.mark.slow
STEP = "global_step2"


def build_in(tmp_path_factory, name: str, build_checkpoint, **options) -> Path:
    """A real multi-process checkpoint, built by a fixtures builder into a folder of its own."""
    work = tmp_path_factory.mktemp(name)
    return build_checkpoint(work / "checkpoint", work / "build.log", **options)


def private_copy(built: Path, tmp_path: Path) -> Path:
    """A copy of a built checkpoint, for one test to change."""
    return Path(shutil.copytree(built, tmp_path / "checkpoint"))


@pytest.fixture(scope="module")
def built_tp(tmp_path_factory) -> Path:
    return build_in(tmp_path_factory, "tensor-parallel", build)


@pytest.fixture
def checkpoint(built_tp, tmp_path) -> Path:
    return private_copy(built_tp, tmp_path)


def reload(folder: Path, **job) -> Outcome:
    job = {"loader": "deepspeed-checkpoint", "path": str(folder), "package_root": str(folder.parent), **job}
    outcome = Outcome(job)
    loader_module("deepspeed-checkpoint").reload(job, torch.device("cpu"), outcome)
    return outcome


def problems(outcome: Outcome) -> list[tuple[str, str]]:
    return [(p["failure"], p["message"]) for p in outcome.problems]


def test_the_real_layout_has_a_file_per_model_parallel_rank(built_tp):
    names = sorted(p.name for p in (built_tp / STEP).iterdir())
    assert names == ["mp_rank_00_model_states.pt", "mp_rank_01_model_states.pt",
                     "zero_pp_rank_0_mp_rank_00_optim_states.pt", "zero_pp_rank_0_mp_rank_01_optim_states.pt"]


def test_the_clean_checkpoint_reloads_with_every_rank_proven(checkpoint):
    outcome = reload(checkpoint)
    assert problems(outcome) == []
    assert outcome.facts["mp_world_size"] == 2 and outcome.facts["dp_world_size"] == 1
    assert outcome.facts["ranks"]["tensor-parallel model states"] == [0, 1]


def test_a_recorded_world_size_of_dp_times_mp_agrees_and_another_does_not(checkpoint):
    assert problems(reload(checkpoint, world_size=2)) == []
    found = problems(reload(checkpoint, world_size=4))
    disagreements = [m for f, m in found if f == INCONSISTENT and "the world size disagrees" in m]
    assert len(disagreements) == 1 and "dp_world_size × mp_world_size (1 × 2) 2" in disagreements[0]


def test_the_second_ranks_model_states_missing_is_a_missing_component(checkpoint):
    (checkpoint / STEP / "mp_rank_01_model_states.pt").unlink()
    found = problems(reload(checkpoint))
    assert (MISSING, found[0][1]) in found and "tensor-parallel model states for rank(s) 1 of 2" in found[0][1]


def test_the_second_ranks_model_states_truncated_no_longer_passes(checkpoint):
    path = checkpoint / STEP / "mp_rank_01_model_states.pt"
    truncate(path, path.stat().st_size // 2)
    found = problems(reload(checkpoint))
    assert found and all("mp_rank_01_model_states.pt" in message for _, message in found)
    assert found[0][0] == LOAD


def test_the_second_ranks_optimizer_shard_missing_is_a_missing_component(checkpoint):
    (checkpoint / STEP / "zero_pp_rank_0_mp_rank_01_optim_states.pt").unlink()
    [(failure, message)] = problems(reload(checkpoint))
    assert failure == MISSING and "mp_rank_01_optim_states.pt" in message


def test_a_nan_in_the_second_ranks_weights_is_found(checkpoint):
    path = checkpoint / STEP / "mp_rank_01_model_states.pt"
    states = torch.load(path, weights_only=False)  # the fixture's own file, written by DeepSpeed just now
    name = next(n for n, t in states["module"].items() if t.is_floating_point() and t.numel() > 1)
    states["module"][name].view(-1)[0] = float("nan")
    torch.save(states, path)
    [(failure, message)] = problems(reload(checkpoint))
    assert failure == LOAD and "non-finite" in message and name in message and "mp_rank_01" in message
