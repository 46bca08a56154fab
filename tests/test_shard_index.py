"""The safetensors index describes its shards exactly (issue 41, IV519): real shards written by
`save_pretrained(max_shard_size=...)` (fixtures/truth.py, artifacts/control-sharded), then the index edited as an
export script or a hand leaves it. Headers only, so `--no-reload` sees every one."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from fixtures.edit import edit_json
from tests.helpers import run_cli, static_findings

SHARDED = "artifacts/control-sharded"
INDEX = f"{SHARDED}/model.safetensors.index.json"
FIRST, SECOND = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"


def iv519(package: Path) -> list:
    return [f for f in static_findings(package, select=("IV519",)) if f.code == "IV519"]


def test_real_shards_and_their_index_agree(built_truth):
    assert (Path(built_truth["clean"]) / INDEX).is_file()
    assert iv519(Path(built_truth["clean"])) == []


def test_a_tensor_mapped_to_a_shard_that_does_not_hold_it_is_IV519(truth_dir):
    edit_json(truth_dir, INDEX, lambda index: index["weight_map"].update({"transformer.ln_f.weight": FIRST}))
    [finding] = iv519(truth_dir)
    assert (finding.path, finding.pointer, finding.run, finding.artifact) == (INDEX, "/weight_map", "control",
                                                                              "control-sharded")
    assert f"transformer.ln_f.weight -> {FIRST} (held by {SECOND})" in finding.message


def test_a_tensor_the_index_maps_that_no_shard_holds_is_IV519(truth_dir):
    edit_json(truth_dir, INDEX, lambda index: index["weight_map"].update({"lm_head.weight": SECOND}))
    [finding] = iv519(truth_dir)
    assert "no shard holds" in finding.message and "lm_head.weight" in finding.message


def test_a_tensor_a_shard_holds_that_the_index_does_not_map_is_IV519(truth_dir):
    edit_json(truth_dir, INDEX, lambda index: index["weight_map"].pop("transformer.wpe.weight"))
    findings = iv519(truth_dir)
    assert len(findings) == 1, [f.message for f in findings]
    assert "not in" in findings[0].message and "transformer.wpe.weight (in model-00001" in findings[0].message


def test_a_wrong_total_size_is_IV519(truth_dir):
    edit_json(truth_dir, INDEX, lambda index: index["metadata"].update(total_size=252928))
    [finding] = iv519(truth_dir)
    assert finding.pointer == "/metadata/total_size"
    assert "252,928" in finding.message and "126,464" in finding.message


def test_a_shard_no_index_lists_is_IV519_and_seen_without_reload(truth_dir):
    # A leftover single-file save beside the shards: transformers would load it, not the shards.
    shutil.copy(truth_dir / "artifacts/control-model/model.safetensors", truth_dir / SHARDED / "model.safetensors")
    [finding] = iv519(truth_dir)
    assert finding.path == f"{SHARDED}/model.safetensors" and "does not list" in finding.message
    done = run_cli(truth_dir, "--no-reload", "--no-seal", "--format", "json", "--select", "IV519")
    assert done.returncode == 1
    assert [f["code"] for f in json.loads(done.stdout)["findings"]] == ["IV519"]


def test_a_shard_the_index_names_but_that_is_missing_is_left_to_IV507_and_the_reload(truth_dir):
    (truth_dir / SHARDED / SECOND).unlink()
    assert iv519(truth_dir) == []  # said once, by the reload's shard check, not twice
