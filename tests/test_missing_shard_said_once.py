"""A shard a weight index names, lost from a Trainer checkpoint, is one finding: the static checks (IV507, what
--no-reload sees) and the reload's loader report it under one requirement id (format/layouts.py
index_shard_requirement), and the rules do not say it again (before: static IV507 and reload IV504). A delivered
model folder, which the static checks do not judge, still gets the reload's IV504, all its missing shards in one."""
from __future__ import annotations
from dataclasses import replace

import pytest
import json
from pathlib import Path

from itera_verify.reload import run_reloads
from itera_verify.rules import reload as reload_rules
from itera_verify.runtime.progress import NULL_PROGRESS
from tests.helpers import context

CHECKPOINT = "checkpoints/control/checkpoint-4"
MODEL = "artifacts/control-model"


def lose_a_shard(folder: Path) -> None:
    """Split model.safetensors's names over two shards in an index, the second never written."""
    from safetensors import safe_open

    (folder / "model.safetensors").rename(folder / "model-00001-of-00002.safetensors")
    with safe_open(folder / "model-00001-of-00002.safetensors", "pt") as weights:
        names = list(weights.keys())
    weight_map = {name: "model-00001-of-00002.safetensors" for name in names[1:]}
    weight_map[names[0]] = "model-00002-of-00002.safetensors"  # the shard an interrupted upload lost
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def findings_for(package_dir: Path, hf_cache, artifact: str):
    package = context(package_dir, hf_cache=Path(hf_cache))
    static = [f for f in reload_rules.check(package, phase="static") if f.artifact == artifact]
    package = replace(package, reloads=run_reloads(package, device="cpu", timeout=300, jobs=1,
                                                   progress=NULL_PROGRESS, only={artifact}))
    reloaded = [f for f in reload_rules.check(package) if f.artifact == artifact]
    return static, reloaded, package.reloads[0]


@pytest.mark.slow
def test_a_checkpoint_missing_a_shard_is_one_IV507_said_by_the_static_phase(package_dir, hf_cache):
    lose_a_shard(package_dir / CHECKPOINT)
    static, reloaded, result = findings_for(package_dir, hf_cache, "control-resume")
    [finding] = static
    assert (finding.code, finding.path) == ("IV507", f"{CHECKPOINT}/model.safetensors.index.json")
    assert "names 1 shard(s) that are not in" in finding.message and "model-00002-of-00002" in finding.message
    assert "index-shards:model.safetensors.index.json" in [p.get("requirement") for p in result.facts["problems"]]
    assert reloaded == [], [(f.code, f.message) for f in reloaded]


@pytest.mark.slow
def test_a_delivered_model_missing_a_shard_is_one_IV504_from_the_reload(package_dir, hf_cache):
    lose_a_shard(package_dir / MODEL)
    static, reloaded, _ = findings_for(package_dir, hf_cache, "control-model")
    assert static == []
    [finding] = reloaded
    assert finding.code == "IV504" and "model-00002-of-00002.safetensors (1 tensors)" in finding.message
