"""Issue 18 item 3, ready for fixtures/build.py: the demo campaign recorded through the recorder and the Trainer
callback (fixtures/record_demo.py) verifies clean with every artifact reloaded, and holds the same campaign as
the hand-assembled demo: runs, artifacts, loaders, stops, corpus, decision and cost."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.test_record_trainer import errors, verify


@pytest.fixture(scope="module")
def recorded_demo(hf_cache, tmp_path_factory) -> Path:
    from fixtures.record_demo import build_recorded_package

    package = tmp_path_factory.mktemp("record-demo") / "package"
    build_recorded_package(package, hf_cache)
    return package


def load(package, name):
    return json.loads((Path(package) / name).read_text())


@pytest.mark.slow
def test_the_recorded_demo_verifies_clean_with_every_artifact_reloaded(recorded_demo, hf_cache):
    report = verify(recorded_demo, hf_cache)
    assert errors(report) == []
    assert [f["code"] for f in report["findings"] if f["severity"] == "warning"] == []
    assert sorted(r["artifact"] for r in report["reloads"] if r["ok"]) == [
        "control-model", "control-resume", "lora-r16-adapter", "lora-r16-resume"]


@pytest.mark.slow
def test_the_recorded_demo_is_the_hand_built_campaign(recorded_demo, built):
    ours, theirs = load(recorded_demo, "manifest.json"), load(built["package"], "manifest.json")
    for key in ("format", "campaign_id", "question", "created_at", "corpus", "plan", "stop_rules"):
        assert ours[key] == theirs[key], key
    fields = ("id", "role", "category", "status", "started_at", "params", "metrics", "predictions")
    assert sorted([r[k] for k in fields] for r in ours["runs"]) == sorted([r[k] for k in fields]
                                                                          for r in theirs["runs"])
    assert sorted(map(sorted, (a.items() for a in ours["artifacts"]))) == sorted(
        map(sorted, (a.items() for a in theirs["artifacts"])))
    assert load(recorded_demo, "reload.json") == load(built["package"], "reload.json")
    stop = ("run", "rule", "at", "step")
    assert [[s[k] for k in stop] for s in load(recorded_demo, "stops.json")["stops"]] == [
        [s[k] for k in stop] for s in load(built["package"], "stops.json")["stops"]]
    assert ours["decision"] == theirs["decision"]
    assert ours["timeline"] == theirs["timeline"]
    for run in ("control", "lora-r16"):
        assert (recorded_demo / f"predictions/{run}.jsonl").read_bytes() == (
            Path(built["package"]) / f"predictions/{run}.jsonl").read_bytes()
