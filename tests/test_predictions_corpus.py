"""Predictions agree with the frozen corpus (issue 41): one gold label per eval id in every run (IV313), and a
stopped run delivers no predictions (IV314). The recorded campaign of fixtures/truth.py, one file changed."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from tests.helpers import static_findings

CODES = ("IV313", "IV314")


def found(package: Path) -> list:
    return [f for f in static_findings(package, select=CODES) if f.code in CODES]


def relabel(package: Path, run: str, ids: dict[str, str]) -> None:
    path = package / f"predictions/{run}.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()]
    for record in records:
        record["label"] = ids.get(record["id"], record["label"])
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_every_run_gives_each_eval_id_the_same_gold_label(built_truth):
    assert found(Path(built_truth["clean"])) == []


def test_a_run_scored_against_other_gold_labels_is_IV313(truth_dir):
    relabel(truth_dir, "lora", {"ex-1": "pos", "ex-3": "pos"})
    [finding] = found(truth_dir)
    assert (finding.code, finding.path, finding.run, finding.line) == ("IV313", "predictions/lora.jsonl", "lora", 2)
    assert "ex-1" in finding.message and '"pos"' in finding.message and '"neg"' in finding.message
    assert "2 eval ids in all" in finding.message and "run control" in finding.message


def test_a_stopped_run_that_delivers_predictions_is_IV314(truth_dir):
    shutil.copy(truth_dir / "predictions/control.jsonl", truth_dir / "predictions/diverged.jsonl")
    [finding] = found(truth_dir)
    assert (finding.code, finding.path, finding.run) == ("IV314", "predictions/diverged.jsonl", "diverged")
    assert "stopped at step 2 by rule nonfinite-loss" in finding.message
